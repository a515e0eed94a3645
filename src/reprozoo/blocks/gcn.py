"""Dense graph convolution (Kipf & Welling, ICLR 2017) for small fixed graphs (torch).

Why dense: the graphs this block serves (a fixed tree scaffold, a molecule of a few dozen atoms)
have tens of nodes and one topology shared by the whole batch, so one ``(N, N)`` propagation
matrix applied with a batched matmul is faster and simpler than scatter-based message passing.

Propagation rule (Kipf & Welling, Eq. 2)::

    A_hat = D^{-1/2} (A + I) D^{-1/2},   D_ii = sum_j (A + I)_ij
    H^{l+1} = act(A_hat H^l W^l + b^l)

``GCNStack`` adds a residual connection and LayerNorm per layer (``H + act(...)``) so that a
node keeps its own features across layers; with ``residual=False`` it is the plain rule above.
Importing this module imports torch (method code only).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


def normalized_adjacency(adj: np.ndarray, self_loops: bool = True) -> np.ndarray:
    """Symmetric normalisation D^{-1/2} (A + I) D^{-1/2} of an undirected adjacency matrix."""
    a = np.asarray(adj, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"adjacency must be square, got shape {a.shape}")
    if not np.allclose(a, a.T):
        raise ValueError("adjacency must be symmetric (undirected graph)")
    if self_loops:
        a = a + np.eye(len(a))
    deg = a.sum(1)
    inv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-300)), 0.0)
    return inv[:, None] * a * inv[None, :]


class GraphConv(nn.Module):
    """One layer ``A_hat @ (H W) + b`` for node features ``H`` of shape ``(..., N, F_in)``."""

    def __init__(self, a_hat: np.ndarray | torch.Tensor, f_in: int, f_out: int):
        super().__init__()
        self.register_buffer("a_hat", torch.as_tensor(np.asarray(a_hat), dtype=torch.float32))
        self.lin = nn.Linear(f_in, f_out)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.a_hat.to(h.dtype), self.lin(h))


class GCNStack(nn.Module):
    """``layers`` graph convolutions of width ``width`` on a fixed graph, tanh activations."""

    def __init__(self, a_hat, width: int, layers: int, residual: bool = True):
        super().__init__()
        self.convs = nn.ModuleList(GraphConv(a_hat, width, width) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(width) if residual else nn.Identity() for _ in range(layers))
        self.residual = residual

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for conv, norm in zip(self.convs, self.norms):
            out = torch.tanh(conv(h))
            h = norm(h + out) if self.residual else out
        return h
