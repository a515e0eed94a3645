"""Boltzmann targets with exact energies, and MALA for their reference samples.

A Boltzmann generator is judged against a density p(x) ∝ exp(-E(x)/T) whose energy E we can
evaluate exactly but whose normaliser we usually cannot. The three standard toy targets of the
Boltzmann-generator literature (Köhler et al. 2020 "Equivariant flows"; Midgley et al. 2023 "FAB")
are built here once, in torch, batched over the leading axis, differentiable (forces = -∇E by
autograd) and in whatever dtype the input has (float64 for reference numerics):

* ``GaussianMixtureTarget`` - a 2-D mixture of Gaussians; its energy is the exact NEGATIVE LOG
  DENSITY (normalised, log Z = 0 at T = 1), and it samples exactly. Parameters come either from
  the project's dataset generator ``reprozoo.data.synthetic.gmm`` (same mixture as the ``gmm``
  dataset) or from the FAB recipe (40 modes, means uniform in [-40, 40]^2).
* ``DoubleWell4`` (DW4) - 4 particles in 2-D, pair potential a(d-d0)^4 + b(d-d0)^2 + c with
  a = 0.9, b = -4, c = 0, d0 = 4 (FAB/bgflow convention: ``a`` multiplies the quartic term),
  summed over the 6 unordered pairs.
* ``LennardJones13`` (LJ13) - 13 particles in 3-D, eps Σ_{i<j} [(rm/d)^12 - 2 (rm/d)^6] plus a
  harmonic restraint (k/2) Σ_i |x_i - x̄|^2 to the centre of mass (bgflow's ``oscillator``), eps =
  rm = k = 1. An optional SOFT CLIP of the energy (``e_max``) replaces E by
  e_max + log(1 + E - e_max) above e_max: continuous with slope 1 at e_max, so gradients of
  overlapping configurations stay finite during training. It is off by default (exact energy).

The particle energies depend on inter-particle distances only (plus, for LJ13, distances to the
centre of mass): they are invariant to permutations, rotations, reflections and translations. A
translation-invariant density cannot be normalised on R^{n d}, so particle configurations live on
the zero-centre-of-mass subspace: ``remove_com`` projects onto it and the reference sampler moves
only within it (MALA with projected noise).

MALA (Metropolis-adjusted Langevin, Roberts & Tweedie 1996) proposes y = x + h ∇log p(x) +
sqrt(2h) ξ and accepts with the Metropolis-Hastings ratio that makes p exactly stationary for any
fixed h. During burn-in h is adapted per chain by a Robbins-Monro step on log h towards a target
acceptance (0.574 is optimal for smooth targets in high dimension); after burn-in h is frozen so
the kept samples come from a valid fixed kernel.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

Tensor = torch.Tensor


def remove_com(x: Tensor, n_particles: int, spatial_dim: int) -> Tensor:
    """Project flat configurations (..., n*d) onto the zero-centre-of-mass subspace."""
    xs = x.reshape(*x.shape[:-1], n_particles, spatial_dim)
    return (xs - xs.mean(dim=-2, keepdim=True)).reshape(x.shape)


def pair_distances(x: Tensor, n_particles: int, spatial_dim: int) -> Tensor:
    """Distances of the n(n-1)/2 unordered pairs i<j, shape (..., n(n-1)/2)."""
    xs = x.reshape(*x.shape[:-1], n_particles, spatial_dim)
    i, j = torch.triu_indices(n_particles, n_particles, offset=1, device=x.device)
    return (xs[..., i, :] - xs[..., j, :]).norm(dim=-1)


class BoltzmannTarget:
    """p(x) ∝ exp(-E(x)/T) on R^dim; subclasses provide ``energy`` and ``sample_reference``."""

    dim: int
    n_particles: int
    spatial_dim: int
    temperature: float = 1.0

    def energy(self, x: Tensor) -> Tensor:  # (..., dim) -> (...)
        raise NotImplementedError

    def log_prob(self, x: Tensor) -> Tensor:
        """Unnormalised log density -E(x)/T (normalised for the Gaussian mixture at T = 1)."""
        return -self.energy(x) / self.temperature

    def force(self, x: Tensor) -> Tensor:
        """-∇E(x) by autograd (no graph kept)."""
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(self.energy(x).sum(), x)
        return -g

    def project(self, x: Tensor) -> Tensor:
        """Map onto the support the sampler moves in (identity, or zero centre of mass)."""
        return x

    def sample_reference(self, n: int, generator: torch.Generator | None = None, **kw) -> Tensor:
        raise NotImplementedError


class GaussianMixtureTarget(BoltzmannTarget):
    """Mixture Σ_k w_k N(μ_k, Σ_k); energy = -log p exactly (log Z = 0 at T = 1)."""

    n_particles = 1

    def __init__(self, weights, means, covs, temperature: float = 1.0):
        self.weights = torch.as_tensor(weights, dtype=torch.float64)
        self.means = torch.as_tensor(means, dtype=torch.float64)
        self.covs = torch.as_tensor(covs, dtype=torch.float64)
        self.weights = self.weights / self.weights.sum()
        self.dim = self.spatial_dim = int(self.means.shape[1])
        self.temperature = float(temperature)
        self._chol = torch.linalg.cholesky(self.covs)

    @classmethod
    def from_dataset(cls, gm) -> "GaussianMixtureTarget":
        """From a ``reprozoo.data.synthetic.gmm.GaussianMixture`` (the ``gmm`` dataset's mixture)."""
        return cls(gm.weights, gm.means, gm.covs)

    @classmethod
    def ring(cls, components: int = 8, radius: float = 3.0, dim: int = 2, seed: int = 0):
        """The project's dataset recipe (``gmm.make``): means on a circle, small random covariances."""
        import numpy as np

        from ..data.synthetic.gmm import make

        return cls.from_dataset(make(components, radius, dim, np.random.default_rng(seed)))

    @classmethod
    def fab(cls, n_modes: int = 40, loc_scaling: float = 40.0, log_var_scaling: float = 1.0,
            seed: int = 0):
        """FAB's 2-D benchmark: uniform weights, means U[-s, s]^2, std softplus(log_var_scaling)."""
        g = torch.Generator().manual_seed(seed)
        means = (torch.rand((n_modes, 2), generator=g, dtype=torch.float32) - 0.5) * 2 * loc_scaling
        std = torch.nn.functional.softplus(torch.tensor(log_var_scaling, dtype=torch.float64))
        covs = torch.eye(2, dtype=torch.float64).expand(n_modes, 2, 2) * std**2
        return cls(torch.ones(n_modes), means.double(), covs)

    def _params(self, x: Tensor):
        return (self.weights.to(x), self.means.to(x), self._chol.to(x))

    def energy(self, x: Tensor) -> Tensor:
        w, mu, chol = self._params(x)
        diff = (x[..., None, :] - mu).unsqueeze(-1)  # (..., K, D, 1)
        sol = torch.linalg.solve_triangular(chol.expand(*diff.shape[:-2], *chol.shape[-2:]), diff,
                                            upper=False).squeeze(-1)
        logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
        logn = -0.5 * (sol.pow(2).sum(-1) + logdet + self.dim * math.log(2 * math.pi))
        return -torch.logsumexp(torch.log(w) + logn, dim=-1)

    def sample_reference(self, n: int, generator: torch.Generator | None = None, **kw) -> Tensor:
        """Exact ancestral samples (float64) of the T = 1 mixture."""
        if self.temperature != 1.0:
            raise ValueError("exact sampling only at T = 1; use mala() for other temperatures")
        k = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        z = torch.randn(n, self.dim, generator=generator, dtype=torch.float64)
        return self.means[k] + (self._chol[k] @ z.unsqueeze(-1)).squeeze(-1)


class _ParticleTarget(BoltzmannTarget):
    """Shared parts of the particle systems: zero-COM support and a MALA reference sampler."""

    def project(self, x: Tensor) -> Tensor:
        return remove_com(x, self.n_particles, self.spatial_dim)

    def _init(self, n: int, generator, dtype) -> Tensor:
        raise NotImplementedError

    def sample_reference(self, n: int, generator: torch.Generator | None = None, *,
                         n_chains: int = 256, burn_in: int = 2000, thin: int = 10,
                         step: float = 1e-3, dtype=torch.float64, return_accept: bool = False):
        """n samples from ``n_chains`` MALA chains after ``burn_in`` adaptive steps, every ``thin``-th.

        Chains start from a spread-out random configuration; metastable states are only as well
        balanced as the chains' mixing allows (the literature runs far longer chains).
        """
        per_chain = -(-n // n_chains)
        x0 = self.project(self._init(n_chains, generator, dtype))
        res = mala(self.log_prob, x0, step, per_chain * thin, burn_in=burn_in, thin=thin,
                   project=self.project, generator=generator)
        out = res.samples.reshape(-1, self.dim)[:n]
        return (out, res.accept_rate) if return_accept else out


class DoubleWell4(_ParticleTarget):
    """DW4: Σ_{i<j} a(d_ij-d0)^4 + b(d_ij-d0)^2 + c, a = 0.9, b = -4, c = 0, d0 = 4 (FAB / bgflow)."""

    def __init__(self, a: float = 0.9, b: float = -4.0, c: float = 0.0, d0: float = 4.0,
                 n_particles: int = 4, spatial_dim: int = 2, temperature: float = 1.0):
        self.a, self.b, self.c, self.d0 = a, b, c, d0
        self.n_particles, self.spatial_dim = n_particles, spatial_dim
        self.dim = n_particles * spatial_dim
        self.temperature = float(temperature)

    def energy(self, x: Tensor) -> Tensor:
        r = pair_distances(x, self.n_particles, self.spatial_dim) - self.d0
        return (self.a * r**4 + self.b * r**2 + self.c).sum(-1)

    def _init(self, n, generator, dtype):
        return 2.0 * torch.randn(n, self.dim, generator=generator, dtype=dtype)


class LennardJones13(_ParticleTarget):
    """LJ13: eps Σ_{i<j}[(rm/d)^12 - 2(rm/d)^6] + (k/2) Σ_i |x_i - x̄|^2, optional soft clip e_max."""

    def __init__(self, eps: float = 1.0, rm: float = 1.0, k_harmonic: float = 1.0,
                 n_particles: int = 13, spatial_dim: int = 3, temperature: float = 1.0,
                 e_max: float | None = None):
        self.eps, self.rm, self.k_harmonic, self.e_max = eps, rm, k_harmonic, e_max
        self.n_particles, self.spatial_dim = n_particles, spatial_dim
        self.dim = n_particles * spatial_dim
        self.temperature = float(temperature)

    def lj_energy(self, x: Tensor) -> Tensor:
        s6 = (self.rm / pair_distances(x, self.n_particles, self.spatial_dim)) ** 6
        return self.eps * (s6**2 - 2 * s6).sum(-1)

    def harmonic_energy(self, x: Tensor) -> Tensor:
        return 0.5 * self.k_harmonic * remove_com(x, self.n_particles, self.spatial_dim).pow(2).sum(-1)

    def energy(self, x: Tensor) -> Tensor:
        e = self.lj_energy(x) + self.harmonic_energy(x)
        if self.e_max is None:
            return e
        over = torch.clamp(e - self.e_max, min=0.0)
        return torch.where(e > self.e_max, self.e_max + torch.log1p(over), e)

    def _init(self, n, generator, dtype):
        # a jittered cubic lattice at near-equilibrium spacing: no overlapping pairs to start from
        g = torch.arange(3, dtype=dtype)
        grid = torch.stack(torch.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
        out = []
        for _ in range(n):
            idx = torch.randperm(len(grid), generator=generator)[: self.n_particles]
            out.append(grid[idx] * self.rm * 1.1)
        x = torch.stack(out).reshape(n, -1)
        return x + 0.05 * torch.randn(x.shape, generator=generator, dtype=dtype)


def make_target(name: str, **kw) -> BoltzmannTarget:
    """By name: 'gmm' (dataset ring recipe), 'gmm_fab', 'dw4', 'lj13'."""
    table = {"gmm": GaussianMixtureTarget.ring, "gmm_fab": GaussianMixtureTarget.fab,
             "dw4": DoubleWell4, "lj13": LennardJones13}
    return table[name](**kw)


class MALAResult(NamedTuple):
    samples: Tensor  # (n_kept, n_chains, dim)
    accept_rate: float  # mean acceptance probability over the kept (post-burn-in) steps
    step: Tensor  # (n_chains,) final per-chain step sizes


def _logp_and_grad(log_prob, x):
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        lp = log_prob(x)
        (g,) = torch.autograd.grad(lp.sum(), x)
    return lp.detach(), g


def mala(log_prob: Callable[[Tensor], Tensor], x0: Tensor, step: float, n_steps: int, *,
         burn_in: int = 0, thin: int = 1, target_accept: float = 0.574, adapt_rate: float = 0.05,
         project: Callable[[Tensor], Tensor] | None = None,
         generator: torch.Generator | None = None) -> MALAResult:
    """Metropolis-adjusted Langevin on independent chains x0 (n_chains, dim).

    ``burn_in`` adaptive steps (per-chain log h moved by adapt_rate * (alpha - target_accept),
    discarded), then ``n_steps`` steps at frozen h keeping every ``thin``-th state. ``project``
    (e.g. zero centre of mass) is applied to x0 and to the proposal noise; the target must then be
    invariant along the removed directions so its gradient already lies in the subspace.
    Non-finite log densities (overlapping particles) are rejected.
    """
    proj = project or (lambda v: v)
    x = proj(x0.detach().clone())
    h = torch.full((x.shape[0],), float(step), dtype=x.dtype, device=x.device)
    lp, g = _logp_and_grad(log_prob, x)
    kept, acc_sum, acc_n = [], 0.0, 0
    for t in range(burn_in + n_steps):
        hh = h[:, None]
        noise = proj(torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device))
        y = x + hh * g + torch.sqrt(2 * hh) * noise
        lp_y, g_y = _logp_and_grad(log_prob, y)
        # log q(x | y) - log q(y | x) for q(y | x) = N(x + h g(x), 2h I)
        fwd = (y - x - hh * g).pow(2).sum(-1)
        bwd = (x - y - hh * g_y).pow(2).sum(-1)
        log_alpha = lp_y - lp + (fwd - bwd) / (4 * h)
        log_alpha = torch.where(torch.isfinite(log_alpha), log_alpha, torch.full_like(log_alpha, -math.inf))
        alpha = torch.exp(torch.clamp(log_alpha, max=0.0))
        u = torch.rand(alpha.shape, generator=generator, dtype=x.dtype, device=x.device)
        acc = u < alpha
        x = torch.where(acc[:, None], y, x)
        lp = torch.where(acc, lp_y, lp)
        g = torch.where(acc[:, None], g_y, g)
        if t < burn_in:
            h = h * torch.exp(adapt_rate * (alpha - target_accept))
        else:
            acc_sum += float(alpha.mean())
            acc_n += 1
            if (t - burn_in + 1) % thin == 0:
                kept.append(x.clone())
    samples = torch.stack(kept) if kept else x.new_zeros((0, *x.shape))
    return MALAResult(samples, acc_sum / max(acc_n, 1), h)
