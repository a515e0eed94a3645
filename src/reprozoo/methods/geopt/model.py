"""The neural simulator: query points read the boundary by cross-attention (torch).

    boundary tokens  b_j = MLP([γ(x_j), x_j, n_j])    K vertices with outward normals
                     b  ← SliceAttention(b)          Transolver-style physics attention
    query tokens     q_i = MLP([γ(x_i), d_i, s_i])   γ: Fourier features of the position,
                                                     (d, s): direction and step of the dynamics
                     q  ← PointAttention(q, b) × L   query-to-boundary cross-attention
    output           y_i = head(LayerNorm(q_i))

One backbone for every task; only the linear head depends on the task (2·T outputs for the
lifted targets, 1 for the SDF, 2 for the downstream velocity). Fine-tuning loads the backbone
and draws a fresh head, so the three variants differ only in the backbone's starting weights.
Queries and boundary share one Fourier encoding γ: then γ(x_i)·γ(x_j) = Σ cos(2π B (x_i − x_j))
is a stationary kernel of the relative position, so attention can find "the boundary near me"
from the first step instead of having to learn to compare two unrelated encodings.
Downstream, (d, s) is the free-stream direction and a fixed step: the dynamics the lifting
pre-trained on is conditioned on the physical flow direction.
"""
from __future__ import annotations

import torch
from torch import nn

from ...blocks.neural_field import FourierFeatures, PointAttention, SliceAttention


class GeometrySimulator(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2, heads: int = 4, slices: int = 8,
                 n_features: int = 16, sigma: float = 1.0, out_dim: int = 2, seed: int = 0):
        super().__init__()
        self.ff = FourierFeatures(2, n_features, sigma, seed)
        self.embed_b = nn.Sequential(nn.Linear(self.ff.out_dim + 4, dim), nn.GELU(), nn.Linear(dim, dim))
        self.embed_q = nn.Sequential(nn.Linear(self.ff.out_dim + 2 + 3, dim), nn.GELU(), nn.Linear(dim, dim))
        self.boundary = SliceAttention(dim, slices, heads)
        self.cross = nn.ModuleList([PointAttention(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, out_dim)

    def backbone(self, bnd: torch.Tensor, q: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """bnd (B, K, 4) = [x, n]; q (B, M, 2) positions; cond (B, M, 3) = [d, s]."""
        b = self.boundary(self.embed_b(torch.cat([self.ff(bnd[..., :2]), bnd], -1)))
        h = self.embed_q(torch.cat([self.ff(q), q, cond], -1))
        for blk in self.cross:
            h = blk(h, b)
        return self.norm(h)

    def forward(self, bnd, q, cond):
        return self.head(self.backbone(bnd, q, cond))

    def new_head(self, out_dim: int, seed: int) -> None:
        torch.manual_seed(seed)
        self.head = nn.Linear(self.head.in_features, out_dim)
