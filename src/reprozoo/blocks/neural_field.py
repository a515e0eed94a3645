"""Neural fields (coordinate MLPs with Fourier features) and point-attention blocks, for reuse.

Why a block: PINNs, in-situ field compressors and geometry-aware neural simulators all map
coordinates x ∈ R^d to field values, and a plain MLP on raw coordinates is spectrally biased to
low frequencies (Tancik et al. 2020). Random Fourier features

    γ(x) = [cos(2π B x), sin(2π B x)],   B_ij ~ N(0, σ²)   (fixed, not trained)

let the MLP fit detail up to frequencies of order σ; ``sigma = 0`` turns them off (raw
coordinates), which is what a PINN baseline uses. Features are a buffer, so ``state_dict`` and
byte counts include them, and they are deterministic given the seed.

Point attention (``PointAttention``): a set of N points with features attends to itself
(self-attention), or M query points attend to N context points (cross-attention, e.g. field
queries reading a geometry's boundary points). ``SliceAttention`` is the Transolver-style
physics attention: points are softly assigned to S learned slices, attention runs over the S
slice tokens (cost O(N S + S²) instead of O(N²)) and is scattered back.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class FourierFeatures(nn.Module):
    def __init__(self, in_dim: int, n_features: int = 64, sigma: float = 1.0, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("B", torch.randn(n_features, in_dim, generator=g) * sigma)
        self.out_dim = 2 * n_features if sigma > 0 else in_dim
        self.sigma = sigma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sigma <= 0:
            return x
        proj = 2 * math.pi * x @ self.B.T
        return torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1)


class CoordinateMLP(nn.Module):
    """x ↦ f(x): Fourier features, ``depth`` hidden layers of ``width``, linear head."""

    def __init__(self, in_dim: int, out_dim: int, width: int = 64, depth: int = 3,
                 n_features: int = 64, sigma: float = 1.0, activation: type[nn.Module] = nn.GELU,
                 seed: int = 0):
        super().__init__()
        self.features = FourierFeatures(in_dim, n_features, sigma, seed)
        layers, d = [], self.features.out_dim
        for _ in range(depth):
            layers += [nn.Linear(d, width), activation()]
            d = width
        layers.append(nn.Linear(d, out_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.features(x))


def grid_coordinates(*sizes: int, periodic: bool = True) -> torch.Tensor:
    """Coordinates in [0, 1)^d (periodic) or [0, 1]^d of a regular grid, shape (∏ sizes, d)."""
    axes = [torch.arange(n, dtype=torch.float32) / (n if periodic else max(n - 1, 1)) for n in sizes]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))


class PointAttention(nn.Module):
    """Pre-norm (cross-)attention + MLP over point sets: (B, M, dim) queries, (B, N, dim) context."""

    def __init__(self, dim: int, heads: int = 4, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm_q, self.norm_kv, self.norm_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None) -> torch.Tensor:
        q = self.norm_q(x)
        kv = q if context is None else self.norm_kv(context)
        x = x + self.attn(q, kv, kv, key_padding_mask=context_mask, need_weights=False)[0]
        return x + self.mlp(self.norm_mlp(x))


class SliceAttention(nn.Module):
    """Transolver-style physics attention: softly pool N points into S slice tokens, attend, scatter back."""

    def __init__(self, dim: int, slices: int = 16, heads: int = 4, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm, self.norm_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.assign = nn.Linear(dim, slices)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        w = torch.softmax(self.assign(h), dim=-1)                         # (B, N, S)
        tokens = (w.transpose(1, 2) @ h) / (w.sum(dim=1).unsqueeze(-1) + 1e-6)  # (B, S, dim)
        tokens = tokens + self.attn(tokens, tokens, tokens, need_weights=False)[0]
        x = x + w @ tokens
        return x + self.mlp(self.norm_mlp(x))
