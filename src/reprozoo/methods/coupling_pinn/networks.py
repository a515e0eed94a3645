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

Two things make the miniature cheap enough to tune every trunk's learning rate on 2 cores:

- **Members.** A trunk holds K independent copies ("members") of its weights, stacked on a leading
  axis, all initialised to the same weights: the K learning rates of the grid train side by side in
  one batched graph (method.MemberAdam gives each member its own rate). Members never interact: the
  loss is a sum of per-member losses, so each member's gradient is its own.
- **Taylor-mode derivatives.** ``jet`` propagates, with every hidden state h, its exact derivatives
  along the input directions (dh/dx, dh/dt, ...) and the second derivative d2h/dx2, layer by layer
  (chain rule for tanh: (tanh z)'' = s z'' - 2 tanh(z) s z'^2 with s = 1 - tanh(z)^2). The PDE
  residual is then one forward pass and one backward pass, instead of two nested
  ``autograd.grad(create_graph=True)`` calls; the tests check it against autograd and finite
  differences. The same per-layer derivatives give the differential profile (differential_profile.py).

A jet is a tensor (J, K, N, w): component 0 the value, components 1..D the first derivatives along
the D input directions, and (when present) component D + 1 the second derivative along direction 0.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable

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


def _glorot(*shape: int) -> torch.Tensor:
    """Glorot-normal (out, in) matrices stacked on the leading axes of ``shape``."""
    w = torch.empty(*shape)
    flat = w.view(-1, shape[-2], shape[-1])
    for i in range(flat.shape[0]):
        nn.init.xavier_normal_(flat[i])
    return w


def _members(t: torch.Tensor, k: int) -> torch.Tensor:
    """K identical copies of t on a new leading axis (the members start from the same weights)."""
    return t.unsqueeze(0).repeat(k, *([1] * t.dim())).contiguous()


class StackedSpectralWeights(nn.Module):
    """A stack of weight matrices W (*lead, m, k), each returned divided by its spectral norm.

    sigma = u^T W v with (u, v) from power iteration on persistent vectors: one step per training
    forward for all matrices at once (no gradient through u, v), ``n_init`` steps at construction so
    sigma is accurate from the first step; gradients flow through sigma (Miyato et al. 2018, as
    torch's spectral_norm, batched over members and depth). ``weight`` may be given (then ``lead``
    is its leading shape); otherwise Glorot normal.
    """

    def __init__(self, lead: tuple, n_out: int, n_in: int, n_power: int = 1, n_init: int = 30,
                 weight: torch.Tensor | None = None):
        super().__init__()
        w = _glorot(*lead, n_out, n_in) if weight is None else weight
        self.weight = nn.Parameter(w)
        self.n_power = int(n_power)
        u = torch.randn(*w.shape[:-1])
        self.register_buffer("u", u / u.norm(dim=-1, keepdim=True))
        self.register_buffer("v", torch.zeros(*w.shape[:-2], w.shape[-1]))
        self.refresh(n_init)

    @torch.no_grad()
    def refresh(self, n: int) -> None:
        u, v = _power_iteration(self.weight, self.u, n)
        self.u.copy_(u), self.v.copy_(v)

    def sigma(self) -> torch.Tensor:
        return torch.einsum("...m,...mk,...k->...", self.u, self.weight, self.v)

    def forward(self) -> torch.Tensor:
        if self.training and self.n_power:
            self.refresh(self.n_power)
        return self.weight / self.sigma()[..., None, None]


# --- jets ---------------------------------------------------------------------------------------
# A jet is stored as (K, J * N, w): member k, then its J components stacked along the points (rows
# c N .. (c + 1) N - 1 hold component c), so every linear layer is one plain batched matmul
# (K, J N, w) @ (K, w, w') over the members.

def as_components(h: torch.Tensor, n_comp: int) -> torch.Tensor:
    """(K, J N, w) -> (J, K, N, w): the jet's components (a view, no copy)."""
    k, jn, w = h.shape
    return h.view(k, n_comp, jn // n_comp, w).transpose(0, 1)


def tanh_jet(z: torch.Tensor, n_comp: int, n_dirs: int, second: bool, bias: torch.Tensor) -> torch.Tensor:
    """tanh applied to the jet z (K, J N, w) after adding ``bias`` (K, 1, w) to the value: value
    a = tanh(z_0 + b), first derivatives s z_i (s = 1 - a^2), second s (z_xx - 2 a z_x^2). One autograd
    node with a hand-written backward (``_TanhJet``; the tests run gradcheck on it)."""
    if n_comp == 1:  # values only: plain autograd (differentiable to any order, for the tests' autograd route)
        return torch.tanh(z + bias)
    return _TanhJet.apply(z, bias, int(n_comp), int(n_dirs), bool(second))


class _TanhJet(torch.autograd.Function):
    """Forward and backward of the tanh jet written out: one autograd node per layer instead of ~12.

    With a = tanh(z_0 + b), s = 1 - a^2, d_i = s z_i, d_2 = s z_xx - 2 a s z_x^2:
        dL/dz_i  = g_i s                (+ g_2 (-4 a s z_x) for i = x)
        dL/dz_xx = g_2 s
        dL/dz_0  = g_0 s - 2 a s sum_i g_i z_i + g_2 (-2 a s z_xx - 2 s (1 - 3 a^2) z_x^2)
    (ds/dz_0 = -2 a s, d(a s)/dz_0 = s (1 - 3 a^2)); dL/db = dL/dz_0 summed over the points.
    """

    @staticmethod
    def forward(ctx, z, bias, n_comp, n_dirs, second):
        out, a = _TanhJet._values(z, bias, n_comp, n_dirs, second)
        ctx.n_comp, ctx.n_dirs, ctx.second = n_comp, n_dirs, second
        ctx.save_for_backward(z, a)
        return out

    @staticmethod
    def _values(z, bias, n_comp, n_dirs, second):
        k, jn, w = z.shape
        zc = z.view(k, n_comp, jn // n_comp, w)
        a = torch.tanh(zc[:, 0] + bias)
        s = 1.0 - a * a
        parts = [a.unsqueeze(1), s.unsqueeze(1) * zc[:, 1:1 + n_dirs]]
        if second:
            z1 = zc[:, 1]
            parts.append((s * (zc[:, -1] - 2.0 * a * z1 * z1)).unsqueeze(1))
        return torch.cat(parts, 1).view(k, jn, w), a

    @staticmethod
    @once_differentiable  # training needs first derivatives of the loss only; a second pass raises
    def backward(ctx, g):
        z, a = ctx.saved_tensors
        gz, gb = _TanhJet._grads(z, a, g, ctx.n_comp, ctx.n_dirs, ctx.second)
        return gz, gb, None, None, None

    @staticmethod
    def _grads(z, a, g, n_comp, n_dirs, second):
        k, jn, w = z.shape
        zc, gc = z.view(k, n_comp, jn // n_comp, w), g.reshape(k, n_comp, jn // n_comp, w)
        s = 1.0 - a * a
        gz = torch.empty_like(zc)
        zd, gd = zc[:, 1:1 + n_dirs], gc[:, 1:1 + n_dirs]
        gz[:, 1:1 + n_dirs] = gd * s.unsqueeze(1)
        g0 = gc[:, 0] - 2.0 * a * (gd * zd).sum(1)
        if second:
            z1, z2, g2 = zc[:, 1], zc[:, -1], gc[:, -1]
            g2s = g2 * s
            gz[:, 1] -= 4.0 * g2s * a * z1
            gz[:, -1] = g2s
            g0 = g0 - 2.0 * g2 * (a * z2 + (1.0 - 3.0 * a * a) * z1 * z1)
        g0 = g0 * s
        gz[:, 0] = g0
        return gz.view(k, jn, w), g0.sum(1, keepdim=True)


def dense_tanh_jet(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, n_comp: int, n_dirs: int,
                   second: bool) -> torch.Tensor:
    """tanh_jet(h @ w, bias) for a jet h (K, J N, w_in) and per-member weights w (K, w_in, w_out), as one
    autograd node (the matmul's backward written into ``_DenseTanhJet``)."""
    if n_comp == 1:
        return torch.tanh(torch.matmul(h, w) + bias)
    return _DenseTanhJet.apply(h, w, bias, int(n_comp), int(n_dirs), bool(second))


class _DenseTanhJet(torch.autograd.Function):
    """z = h @ w (a linear map acts on every jet component alike), then the tanh jet; backward:
    dL/dh = dL/dz w^T, dL/dw = h^T dL/dz, and the tanh jet's own backward for dL/dz, dL/db."""

    @staticmethod
    def forward(ctx, h, w, bias, n_comp, n_dirs, second):
        z = torch.bmm(h, w)
        out, a = _TanhJet._values(z, bias, n_comp, n_dirs, second)
        ctx.n_comp, ctx.n_dirs, ctx.second = n_comp, n_dirs, second
        ctx.save_for_backward(z, a, h, w)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        z, a, h, w = ctx.saved_tensors
        gz, gb = _TanhJet._grads(z, a, g, ctx.n_comp, ctx.n_dirs, ctx.second)
        return torch.bmm(gz, w.transpose(1, 2)), torch.bmm(h.transpose(1, 2), gz), gb, None, None, None


class CouplingStack(nn.Module):
    """L additive coupling blocks b' = b + c V_hat tanh(U_hat a + beta), each followed by the half swap.

    The weights of all members and blocks are stacked so the spectral normalisation is one batched
    power iteration per step (see module docstring for the Jacobian bound).
    """

    def __init__(self, width: int, depth: int, c: float, n_power: int = 1, members: int = 1):
        super().__init__()
        if width % 2:
            raise ValueError(f"coupling blocks split the width in halves; width={width} is odd")
        half = width // 2
        self.c, self.depth = float(c), int(depth)
        self.U = StackedSpectralWeights((members, depth), width, half, n_power,
                                        weight=_members(_glorot(depth, width, half), members))
        self.V = StackedSpectralWeights((members, depth), half, width, n_power,
                                        weight=_members(_glorot(depth, half, width), members))
        self.beta = nn.Parameter(torch.zeros(members, depth, 1, width))

    def forward(self, h: torch.Tensor, n_comp: int, n_dirs: int, second: bool,
                hidden: list | None = None) -> torch.Tensor:
        """h: a jet (K, J N, w)."""
        # per-block views by unbind (one backward node for all blocks, not one zero-filled copy each)
        U = self.U().transpose(-1, -2).unbind(1)              # L x (K, half, w): a @ U
        cV = (self.c * self.V()).transpose(-1, -2).unbind(1)  # L x (K, w, half)
        beta = self.beta.unbind(1)                            # L x (K, 1, w)
        a, b = h.chunk(2, dim=-1)
        for l in range(self.depth):
            t = torch.bmm(dense_tanh_jet(a, U[l], beta[l], n_comp, n_dirs, second), cV[l])
            # (a, b) -> (b + t(a), a): the swap is a renaming, no copy
            a, b = b + t, a
            if hidden is not None:
                hidden.append(torch.cat([a, b], dim=-1))
        return torch.cat([a, b], dim=-1)


class PINNTrunk(nn.Module):
    """N(phi) for K members at once: ``jet`` (value and input derivatives) or ``forward`` (value)."""

    def __init__(self, arch: str, n_in: int, width: int, depth: int, coupling_c: float = 0.5,
                 n_power: int = 1, n_out: int = 1, members: int = 1):
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(f"unknown architecture '{arch}'; choose one of {ARCHS}")
        self.arch, self.depth, self.width, self.members = arch, int(depth), int(width), int(members)
        k = self.members
        self.w_in = nn.Parameter(_members(_glorot(width, n_in).t(), k))   # (K, n_in, w): phi @ W_in
        self.b_in = nn.Parameter(torch.zeros(k, 1, width))
        if arch == "coupling":
            self.blocks = CouplingStack(width, depth, coupling_c, n_power, k)
        else:
            self.W = nn.Parameter(_members(_glorot(depth, width, width).transpose(-1, -2), k))  # (K, L, w, w)
            self.b = nn.Parameter(torch.zeros(k, depth, 1, width))
        self.w_out = nn.Parameter(_members(_glorot(n_out, width).t(), k))  # (K, w, n_out)
        self.b_out = nn.Parameter(torch.zeros(k, 1, n_out))

    def jet(self, feats: torch.Tensor, n_dirs: int, second: bool, return_hidden: bool = False):
        """feats: the features' jet (J, N, n_in), shared by the members, or (K, J, N, n_in), one per
        member, with J = 1 + n_dirs + second (constants: the features are fixed functions of the
        coordinates). Returns the output jet (J, K, N, n_out), and with ``return_hidden`` the hidden
        jets [h_0, ..., h_L], each (J, K, N, w)."""
        n_comp = feats.shape[-3]
        if n_comp != 1 + n_dirs + int(second):
            raise ValueError(f"feature jet has {n_comp} components, expected 1 + {n_dirs} + {int(second)}")
        f = feats.reshape(-1, n_comp * feats.shape[-2], feats.shape[-1])  # (1 or K, J N, n_in)
        h = tanh_jet(torch.matmul(f, self.w_in), n_comp, n_dirs, second, self.b_in)
        hidden = [h] if return_hidden else None
        if self.arch == "coupling":
            h = self.blocks(h, n_comp, n_dirs, second, hidden)
        else:
            for W, b in zip(self.W.unbind(1), self.b.unbind(1)):
                z = dense_tanh_jet(h, W, b, n_comp, n_dirs, second)
                h = h + z if self.arch == "resnet" else z
                if return_hidden:
                    hidden.append(h)
        out = torch.matmul(h, self.w_out)
        out = as_components(out, n_comp)
        out = torch.cat([(out[0] + self.b_out).unsqueeze(0), out[1:]], 0)  # the bias moves the value only
        if return_hidden:
            return out, [as_components(x, n_comp) for x in hidden]
        return out

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """Values only: feats (N, n_in) -> (K, N, n_out)."""
        return self.jet(feats.unsqueeze(0), 0, False)[0]
