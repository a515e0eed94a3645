"""The three PINN trunks of the depth sweep: plain tanh MLP, residual MLP, spectrally regulated coupling net.

All three share the same lifting and head, so depth L counts only the hidden blocks:

    h_0 = tanh(W_in phi(x) + b_in)              (phi: the problem's input features, width w)
    h_l = B_l(h_{l-1}),  l = 1..L              (the block that differs, below)
    N(x) = W_out h_L + b_out

Blocks (w = width, ~w^2 weights per block for all three):
- ``mlp``:      h_l = tanh(W_l h_{l-1} + b_l)                      (DeepXDE's FNN, Glorot normal init)
- ``resnet``:   h_l = h_{l-1} + tanh(W_l h_{l-1} + b_l)            (identity skip, same init)
- ``coupling``: split h = (a, b) into halves (w/2 each), additive (NICE/RealNVP-style) coupling

      b' = b + t(a),   t(a) = c * V_hat tanh(U_hat a + beta),   then swap halves: h_l = (b', a)

  with U_hat = U / sigma(U), V_hat = V / sigma(V) spectrally normalised (sigma: largest singular
  value, estimated by power iteration with persistent vectors, Miyato et al. 2018). Since
  |tanh'| <= 1, the coupling function t is c-Lipschitz, ||dt/da|| <= c, and the block Jacobian

      J_l = P [[I, 0], [dt/da, I]]   (P the half swap, orthogonal)

  has all singular values in [1/rho, rho] with rho(c) = (c + sqrt(c^2 + 4)) / 2 (the singular values
  of [[I, 0], [A, I]] with ||A|| = s are (sqrt(s^2 + 4) +- s) / 2), and det J_l = +-1. The input
  derivatives dh_l/dx = J_l dh_{l-1}/dx therefore change by at most a factor rho per block in either
  direction and can never collapse to zero (J_l is invertible): this is the "regulated Jacobian
  spectral norm" that keeps differentials propagating through depth. The inner width is w (so
  U: w/2 -> w, V: w -> w/2) to match the MLP block's w^2 weights.

``forward(x, return_hidden=True)`` also returns [h_0, ..., h_L] for the derivative profiles.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

ARCHS = ("mlp", "resnet", "coupling")


def coupling_rho(c: float) -> float:
    """Largest singular value of [[I, 0], [A, I]] for ||A||_2 = c (the smallest is 1 / rho)."""
    return 0.5 * (c + math.sqrt(c * c + 4.0))


def _power_iteration(w: torch.Tensor, u: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n >= 1 batched power-iteration steps for the top singular vectors of w (..., m, k); u (..., m)."""
    for _ in range(max(1, int(n))):
        v = torch.einsum("...mk,...m->...k", w, u)
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        u = torch.einsum("...mk,...k->...m", w, v)
        u = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return u, v


class StackedSpectralWeights(nn.Module):
    """A stack of L weight matrices W_l (L, m, k), each returned divided by its spectral norm.

    sigma_l = u_l^T W_l v_l with (u_l, v_l) from power iteration on persistent vectors: one step
    per training forward for all L matrices at once (no gradient through u, v), ``n_init`` steps at
    construction so sigma is accurate from the first step; gradients flow through sigma (Miyato
    et al. 2018, as torch's spectral_norm, batched over the depth).
    """

    def __init__(self, depth: int, n_out: int, n_in: int, n_power: int = 1, n_init: int = 30):
        super().__init__()
        w = torch.empty(depth, n_out, n_in)
        for i in range(depth):
            nn.init.xavier_normal_(w[i])
        self.weight = nn.Parameter(w)
        self.n_power = int(n_power)
        u = torch.randn(depth, n_out)
        self.register_buffer("u", u / u.norm(dim=-1, keepdim=True))
        self.register_buffer("v", torch.zeros(depth, n_in))
        self.refresh(n_init)

    @torch.no_grad()
    def refresh(self, n: int) -> None:
        u, v = _power_iteration(self.weight, self.u, n)
        self.u.copy_(u), self.v.copy_(v)

    def sigma(self) -> torch.Tensor:
        return torch.einsum("lm,lmk,lk->l", self.u, self.weight, self.v)

    def forward(self) -> torch.Tensor:
        if self.training and self.n_power:
            self.refresh(self.n_power)
        return self.weight / self.sigma()[:, None, None]


def _glorot_linear(n_in: int, n_out: int) -> nn.Linear:
    lin = nn.Linear(n_in, n_out)
    nn.init.xavier_normal_(lin.weight)
    nn.init.zeros_(lin.bias)
    return lin


class MLPBlock(nn.Module):
    def __init__(self, width: int, residual: bool):
        super().__init__()
        self.lin, self.residual = _glorot_linear(width, width), residual

    def forward(self, h):
        z = torch.tanh(self.lin(h))
        return h + z if self.residual else z


class CouplingStack(nn.Module):
    """L additive coupling blocks b' = b + c V_hat tanh(U_hat a + beta), each followed by the half swap.

    The weights of all blocks are stacked so the spectral normalisation is one batched power
    iteration per step (see module docstring for the Jacobian bound).
    """

    def __init__(self, width: int, depth: int, c: float, n_power: int = 1):
        super().__init__()
        if width % 2:
            raise ValueError(f"coupling blocks split the width in halves; width={width} is odd")
        half = width // 2
        self.c, self.depth = float(c), int(depth)
        self.U = StackedSpectralWeights(depth, width, half, n_power)  # a (half) -> inner (width)
        self.V = StackedSpectralWeights(depth, half, width, n_power)  # inner (width) -> b (half)
        self.beta = nn.Parameter(torch.zeros(depth, width))

    def forward(self, h, hidden: list | None = None):
        U, cV = self.U(), self.c * self.V()
        a, b = h.chunk(2, dim=-1)
        for l in range(self.depth):
            # (a, b) -> (b + t(a), a): the swap is a renaming, no copy
            a, b = b + F.linear(torch.tanh(F.linear(a, U[l], self.beta[l])), cV[l]), a
            if hidden is not None:
                hidden.append(torch.cat([a, b], dim=-1))
        return torch.cat([a, b], dim=-1)


class PINNTrunk(nn.Module):
    def __init__(self, arch: str, n_in: int, width: int, depth: int, coupling_c: float = 0.5,
                 n_power: int = 1, n_out: int = 1):
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(f"unknown architecture '{arch}'; choose one of {ARCHS}")
        self.arch, self.depth, self.width = arch, int(depth), int(width)
        self.lift = _glorot_linear(n_in, width)
        if arch == "coupling":
            self.blocks = CouplingStack(width, depth, coupling_c, n_power)
        else:
            self.blocks = nn.ModuleList([MLPBlock(width, residual=(arch == "resnet")) for _ in range(depth)])
        self.head = _glorot_linear(width, n_out)

    def forward(self, feats: torch.Tensor, return_hidden: bool = False):
        h = torch.tanh(self.lift(feats))
        hidden = [h] if return_hidden else None
        if self.arch == "coupling":
            h = self.blocks(h, hidden)
        else:
            for blk in self.blocks:
                h = blk(h)
                if return_hidden:
                    hidden.append(h)
        out = self.head(h)
        return (out, hidden) if return_hidden else out
