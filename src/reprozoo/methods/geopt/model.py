"""The neural simulator: query points read the boundary through relative-position attention (torch).

    boundary tokens  b_j = MLP([x_j, n_j])                K vertices with outward normals
                     b  ← SliceAttention(b)              Transolver-style physics attention,
                                                         so every token sees the whole shape
    query tokens     h_i = MLP([x_i, d_i, s_i])          (d, s): direction and step of the dynamics
    relative code    r_ij = [δ, |δ|, δ / (|δ|² + ε), log(|δ| + ε)],   δ = x_i − x_j
    cross layer      m_ij = GELU(W_h LN(h_i) + W_b b_j + W_r r_ij)      (pair width P)
                     a_ij = softmax_j(w · m_ij)
                     h_i ← h_i + W_o Σ_j a_ij m_ij,   h_i ← h_i + MLP(LN(h_i))     × L
    output           y_i = head(LayerNorm(h_i))

The cross layer is point-transformer-style attention (the attention weight and the message are
functions of the pair's relative position, not only of the two tokens): a query finds "the
boundary near me, in this direction" directly, at every distance (the relative code carries the
near field and, through δ/|δ|² and log|δ|, the slow far-field decay of a 2-D field), instead of
learning to compare two absolute position encodings. The first linear map of the message is split
over its three inputs, so a pair costs one add and one GELU of width P and the aggregation runs
before W_o.

One backbone for every task; only the linear head depends on the task (2·T outputs for the
lifted targets, 2 for the static nearest-surface vector, 1 for the SDF, 2 for the downstream
velocity). Fine-tuning keeps the backbone and draws a fresh head, so the variants differ only in
the backbone's starting weights. Downstream, (d, s) is the free-stream direction and a fixed step:
the dynamics the lifting pre-trained on is conditioned on the physical flow direction (as the
authors' ``exp/dynamics_config.py`` does for each benchmark).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...blocks.neural_field import SliceAttention

EPS = 1e-3   # length² (box units²) regularising δ/|δ|² and log|δ| at the boundary vertices
REL_DIM = 6


def relative_code(bnd: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(B, M, K, 6) code of δ = q_i − x_j: δ, |δ|, δ/(|δ|² + ε), log(|δ| + ε)."""
    delta = q[:, :, None, :] - bnd[:, None, :, :2]
    r = torch.linalg.vector_norm(delta, dim=-1, keepdim=True)
    return torch.cat([delta, r, delta / (r * r + EPS), torch.log(r + EPS)], -1)


class RelativeCrossAttention(nn.Module):
    """Queries (B, M, dim) read boundary tokens (B, K, dim) with pair messages of width ``pair``."""

    def __init__(self, dim: int, pair: int, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm, self.norm_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.w_h = nn.Linear(dim, pair)
        self.w_b = nn.Linear(dim, pair, bias=False)
        self.w_r = nn.Linear(REL_DIM, pair, bias=False)
        self.score = nn.Linear(pair, 1)
        self.w_o = nn.Linear(pair, dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, h: torch.Tensor, b: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        m = F.gelu(self.w_h(self.norm(h))[:, :, None] + self.w_b(b)[:, None] + self.w_r(rel))  # (B, M, K, P)
        a = torch.softmax(self.score(m), dim=2)                                                # over K
        h = h + self.w_o((a * m).sum(2))
        return h + self.mlp(self.norm_mlp(h))


class GeometrySimulator(nn.Module):
    def __init__(self, dim: int = 32, pair: int = 16, layers: int = 2, heads: int = 4, slices: int = 8,
                 out_dim: int = 2, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed_b = nn.Sequential(nn.Linear(4, dim), nn.GELU(), nn.Linear(dim, dim))
        self.embed_q = nn.Sequential(nn.Linear(2 + 3, dim), nn.GELU(), nn.Linear(dim, dim))
        self.boundary = SliceAttention(dim, slices, heads)
        self.cross = nn.ModuleList([RelativeCrossAttention(dim, pair) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, out_dim)

    def backbone(self, bnd: torch.Tensor, q: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """bnd (B, K, 4) = [x, n]; q (B, M, 2) positions; cond (B, M, 3) = [d, s]."""
        b = self.boundary(self.embed_b(bnd))
        h = self.embed_q(torch.cat([q, cond], -1))
        rel = relative_code(bnd, q)
        for blk in self.cross:
            h = blk(h, b, rel)
        return self.norm(h)

    def forward(self, bnd, q, cond):
        return self.head(self.backbone(bnd, q, cond))

    def new_head(self, out_dim: int, seed: int) -> None:
        torch.manual_seed(seed)
        self.head = nn.Linear(self.head.in_features, out_dim)
