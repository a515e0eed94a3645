"""Normalizing flows (zuko) behind one small interface, plus an ODE-sampling adapter.

A normalizing flow is an invertible map T with x = T(z), z ~ N(0, I); its density is exact by the
change of variables, log q(x) = log N(T^{-1}(x); 0, I) + log|det ∂T^{-1}/∂x|. That exactness is what
Boltzmann generators need (importance weights p/q) and what NPE needs (posterior densities). The
flows themselves are zuko's (MAF, neural spline flow, RealNVP coupling); this module only fixes one
calling convention for every method, adds an optional fixed standardisation x -> (x - loc)/scale
(its log-Jacobian -Σ log scale is included, so densities stay exact in the ORIGINAL coordinates;
zuko's splines only act on [-5, 5], so standardised inputs matter), and a maximum-likelihood fit.

Kinds: "maf" (affine autoregressive), "nsf" (autoregressive rational-quadratic splines),
"nsf_coupling" (spline coupling, fast sampling), "realnvp" (affine coupling).

Context (conditional flows, e.g. posteriors q(θ | x)): ``context`` is either one vector (c,) shared
by all samples, or a batch (m, c) aligned with x (m, d) for ``log_prob``; ``sample(n, context)``
with a batch context returns (n, m, d).

ODE sampling for flow matching / CNFs uses the shared Runge-Kutta solvers of ``blocks/ode.py``
(``ode_sample`` below is only an adapter, not another solver).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import nn

Tensor = torch.Tensor

KINDS = ("maf", "nsf", "nsf_coupling", "realnvp")


def _zuko_flow(kind: str, features: int, context: int, hidden: Sequence[int], transforms: int,
               bins: int, **kw):
    import zuko

    common = dict(features=features, context=context, transforms=transforms,
                  hidden_features=tuple(hidden), **kw)
    if kind == "maf":
        return zuko.flows.MAF(**common)
    if kind == "nsf":
        return zuko.flows.NSF(bins=bins, **common)
    if kind == "nsf_coupling":
        return zuko.flows.NSF(bins=bins, passes=2, **common)
    if kind == "realnvp":
        return zuko.flows.RealNVP(**common)
    raise ValueError(f"unknown flow kind {kind!r}; one of {KINDS}")


class Flow(nn.Module):
    """Exact-density flow q(x | context) on R^features; a torch Module (parameters, .to, state_dict)."""

    def __init__(self, kind: str, features: int, context: int = 0, hidden: Sequence[int] = (64, 64),
                 transforms: int = 3, bins: int = 8, loc: Tensor | None = None,
                 scale: Tensor | None = None, **zuko_kwargs):
        super().__init__()
        self.kind, self.features, self.context = kind, features, context
        self.net = _zuko_flow(kind, features, context, hidden, transforms, bins, **zuko_kwargs)
        self.register_buffer("loc", torch.zeros(features) if loc is None else torch.as_tensor(loc).float())
        self.register_buffer("scale", torch.ones(features) if scale is None else torch.as_tensor(scale).float())

    @torch.no_grad()
    def set_standardization(self, x: Tensor, min_scale: float = 1e-6) -> "Flow":
        """Fix loc/scale to the data's mean and std (call once, before training)."""
        self.loc.copy_(x.mean(0))
        self.scale.copy_(x.std(0).clamp_min(min_scale))
        return self

    def _dist(self, context: Tensor | None):
        if self.context and context is None:
            raise ValueError("this flow is conditional: pass a context")
        return self.net(context)

    def _log_scale_sum(self) -> Tensor:
        return torch.log(self.scale).sum()

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """log q(x | context), shape x.shape[:-1]."""
        z = (x - self.loc.to(x)) / self.scale.to(x)
        return self._dist(context).log_prob(z) - self._log_scale_sum().to(x)

    def sample(self, n: int, context: Tensor | None = None) -> Tensor:
        """n samples (no gradient); (n, d), or (n, m, d) for a batch of m contexts."""
        with torch.no_grad():
            return self._dist(context).sample((n,)) * self.scale + self.loc

    def rsample_and_log_prob(self, n: int, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Reparameterised samples and their log q in one pass (reverse-KL / variational training)."""
        z, lq = self._dist(context).rsample_and_log_prob((n,))
        return z * self.scale + self.loc, lq - self._log_scale_sum()


def make_flow(kind: str = "nsf", features: int = 2, context: int = 0, hidden: Sequence[int] = (64, 64),
              transforms: int = 3, **kw) -> Flow:
    """Flow of the given kind ('maf', 'nsf', 'nsf_coupling', 'realnvp'); kw: bins, loc, scale, zuko args."""
    return Flow(kind, features, context, hidden, transforms, **kw)


def fit_ml(flow: Flow, x: Tensor, context: Tensor | None = None, *, steps: int = 1000,
           batch_size: int = 256, lr: float = 1e-3, weight_decay: float = 0.0,
           generator: torch.Generator | None = None,
           extra_loss: Callable[[Flow, Tensor, Tensor | None], Tensor] | None = None) -> list[float]:
    """Maximum likelihood (forward KL): Adam on minibatch mean -log q(x | c); returns the loss per step.

    ``extra_loss(flow, x_batch, c_batch)`` is added to the NLL (e.g. a regulariser on the same batch).
    """
    opt = torch.optim.Adam(flow.parameters(), lr=lr, weight_decay=weight_decay)
    n, losses = len(x), []
    for _ in range(steps):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=generator)
        cb = None if context is None else context[idx]
        loss = -flow.log_prob(x[idx], cb).mean()
        if extra_loss is not None:
            loss = loss + extra_loss(flow, x[idx], cb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def ode_sample(velocity: Callable[[Tensor, float], Tensor], x0: Tensor, t0: float = 0.0,
               t1: float = 1.0, n_steps: int = 50, scheme: str = "rk4") -> Tensor:
    """Integrate dx/dt = velocity(x, t) from t0 to t1 with blocks/ode.py's RK scheme (no gradient).

    For flow matching: x0 ~ base noise, velocity = the learned field; ``t`` is passed as a float.
    """
    from .ode import TABLEAUS, rk_solve

    ts = [t0 + (t1 - t0) * k / n_steps for k in range(n_steps + 1)]
    with torch.no_grad():
        return rk_solve(velocity, x0, ts, TABLEAUS[scheme])


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """log N(x; mean, diag std^2) summed over the last axis (reference densities in tests)."""
    return (-0.5 * ((x - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
