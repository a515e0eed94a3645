"""The neural simulator: query points read the boundary through relative-position attention (torch).

    boundary tokens  b_j = MLP([x_j, n_j, panel j])      K vertices with outward normals, and
                                                         panel j = x_j → x_{j+1}: midpoint,
                                                         outward normal, length
                     b  ← SliceAttention(b)              Transolver-style physics attention,
                                                         so every token sees the whole shape
                     b_j ← b_j + W_u [Σ_k A_jk W_d LN(b_k)], + MLP     × 2  (``PanelInteraction``;
                                                         A: the panel method's influence matrix)
    query tokens     h_i = MLP([x_i, d_i, s_i])          (d, s): direction and step of the dynamics
    relative code    r_ij = [δ, |δ|, δ / (|δ|² + ε), log(|δ| + ε)],   δ = x_i − x_j
    cross layer      m_ij = GELU(W_h LN(h_i) + W_b b_j + W_r r_ij)      (pair width P)
                     a_ij = softmax_j(w · m_ij)
                     h_i ← h_i + W_o Σ_j a_ij m_ij,   h_i ← h_i + MLP(LN(h_i))     × L
    source layer     σ_j = W_σ b_j  (S learned source strengths per boundary panel j: x_j → x_{j+1})
                     f_i = Σ_j σ_j ⊗ V_j(x_i)                               (2·S features)
                     V_j: velocity of a unit-strength constant source on panel j (``panel_kernel``)
    output           y_i = head([LayerNorm(h_i), f_i])

The cross layer is point-transformer-style attention (the attention weight and the message are
functions of the pair's relative position, not only of the two tokens): a query finds "the
boundary near me, in this direction" directly, at every distance (the relative code carries the
near field and, through δ/|δ|² and log|δ|, the slow far-field decay of a 2-D field), instead of
learning to compare two absolute position encodings. The first linear map of the message is split
over its three inputs, so a pair costs one add and one GELU of width P and the aggregation runs
before W_o.

The source layer is a learned boundary-integral (single-layer potential) representation: any
2-D potential flow past the body is U∞ + Σ_j σ_j V_j(x) for some panel strengths σ_j that the
whole shape sets (a linear solve, ``panel.solve_source_panels``); the network has to infer them
from the boundary tokens. A nearest-surface vector has no such form; the attention path carries
it. Softmax attention alone averages messages (its weights sum to one) and cannot carry the
unnormalised sum of a field that decays away from the body, which the previous version learned
slowly (test error 0.129 at N = 128 after 2000 steps, README). The layer is the same for every variant:
its strengths are backbone weights that pre-training shapes like any other, and boundary tokens
carry panel features (midpoint, outward panel normal, length) besides the vertex and its normal.

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


def panel_features(bnd: torch.Tensor) -> torch.Tensor:
    """(B, K, 9) boundary token input: vertex x_j, vertex normal n_j, and of panel j (x_j → x_{j+1},
    the polygon's order): midpoint, outward unit normal (CCW polygon), length."""
    a = bnd[..., :2]
    t = torch.roll(a, -1, dims=1) - a
    length = torch.linalg.vector_norm(t, dim=-1, keepdim=True)
    normal = torch.stack([t[..., 1], -t[..., 0]], -1) / length
    return torch.cat([bnd[..., :4], a + 0.5 * t, normal, length], -1)


def panel_kernel(bnd: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(B, M, K, 2): velocity at q induced by a unit-strength constant source on each panel
    x_j → x_{j+1}; in the panel's frame (ξ along it, η along its left normal)
    u_ξ = ln(r₁/r₂)/2π, u_η = (θ₂ − θ₁)/2π. The same closed form as ``panel.source_panel_velocity``."""
    import math

    a = bnd[..., :2]
    tv = torch.roll(a, -1, dims=1) - a
    length = torch.linalg.vector_norm(tv, dim=-1)                       # (B, K)
    t = tv / length[..., None]
    nl = torch.stack([-t[..., 1], t[..., 0]], -1)
    r = q[:, :, None, :] - a[:, None]                                   # (B, M, K, 2)
    xi = (r * t[:, None]).sum(-1)
    eta = (r * nl[:, None]).sum(-1)
    xi2 = xi - length[:, None]
    u_xi = 0.5 * torch.log((xi * xi + eta * eta + 1e-12) / (xi2 * xi2 + eta * eta + 1e-12)) / (2 * math.pi)
    u_eta = (torch.atan2(eta, xi2) - torch.atan2(eta, xi)) / (2 * math.pi)
    return u_xi[..., None] * t[:, None] + u_eta[..., None] * nl[:, None]


def relative_code(bnd: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(B, M, K, 6) code of δ = q_i − x_j: δ, |δ|, δ/(|δ|² + ε), log(|δ| + ε)."""
    delta = q[:, :, None, :] - bnd[:, None, :, :2]
    r = torch.linalg.vector_norm(delta, dim=-1, keepdim=True)
    return torch.cat([delta, r, delta / (r * r + EPS), torch.log(r + EPS)], -1)


def panel_influence(bnd: torch.Tensor) -> torch.Tensor:
    """(B, K, K, 2): normal and tangential velocity at the midpoint of panel j induced by a unit
    source on panel k (the panel method's influence matrix; on the panel itself the fluid-side
    limit, 1/2 normal and 0 tangential)."""
    f = panel_features(bnd)
    mid, n = f[..., 4:6], f[..., 6:8]
    t = torch.stack([-n[..., 1], n[..., 0]], -1)
    v = panel_kernel(bnd, mid)                                          # (B, K(j), K(k), 2)
    a = torch.stack([(v * n[:, :, None]).sum(-1), (v * t[:, :, None]).sum(-1)], -1)
    eye = torch.eye(bnd.shape[1], dtype=a.dtype, device=a.device)
    return a * (1 - eye)[None, :, :, None] + torch.stack([0.5 * eye, 0 * eye], -1)[None]


class PanelInteraction(nn.Module):
    """Boundary tokens exchange messages weighted by the panel influence matrix:
    b_j ← b_j + W_u [Σ_k A^n_jk z_k, Σ_k A^t_jk z_k],  z = W_d LN(b), then an MLP. A Jacobi step of
    the panel system has this form, so a few layers let the tokens infer the source strengths."""

    def __init__(self, dim: int, ch: int = 16, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm, self.norm_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.down = nn.Linear(dim, ch)
        self.up = nn.Linear(2 * ch, dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, b: torch.Tensor, infl: torch.Tensor) -> torch.Tensor:
        z = self.down(self.norm(b))
        m = torch.einsum("bjkc,bkd->bjcd", infl, z).flatten(2)            # (B, K, 2·ch)
        b = b + self.up(m)
        return b + self.mlp(self.norm_mlp(b))


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
                 out_dim: int = 2, seed: int = 0, sources: int = 8, interactions: int = 2):
        super().__init__()
        torch.manual_seed(seed)
        self.embed_b = nn.Sequential(nn.Linear(9, dim), nn.GELU(), nn.Linear(dim, dim))
        self.embed_q = nn.Sequential(nn.Linear(2 + 3, dim), nn.GELU(), nn.Linear(dim, dim))
        self.boundary = SliceAttention(dim, slices, heads)
        self.interact = nn.ModuleList([PanelInteraction(dim) for _ in range(interactions)])
        self.cross = nn.ModuleList([RelativeCrossAttention(dim, pair) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.sources = nn.Linear(dim, sources) if sources else None
        self.head = nn.Linear(dim + 2 * sources, out_dim)

    def backbone(self, bnd: torch.Tensor, q: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """bnd (B, K, 4) = [x, n]; q (B, M, 2) positions; cond (B, M, 3) = [d, s]."""
        b = self.boundary(self.embed_b(panel_features(bnd)))
        if len(self.interact):
            infl = panel_influence(bnd)
            for blk in self.interact:
                b = blk(b, infl)
        h = self.embed_q(torch.cat([q, cond], -1))
        rel = relative_code(bnd, q)
        for blk in self.cross:
            h = blk(h, b, rel)
        h = self.norm(h)
        if self.sources is None:
            return h
        sigma = self.sources(b)                                                   # (B, K, S)
        f = torch.einsum("bks,bmkc->bmsc", sigma, panel_kernel(bnd, q))            # (B, M, S, 2)
        return torch.cat([h, f.flatten(2)], -1)

    def forward(self, bnd, q, cond):
        return self.head(self.backbone(bnd, q, cond))

    def new_head(self, out_dim: int, seed: int) -> None:
        torch.manual_seed(seed)
        self.head = nn.Linear(self.head.in_features, out_dim)
