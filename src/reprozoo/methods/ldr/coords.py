"""Internal coordinates of a Boltzmann target: the zero-centre-of-mass chart of particle systems,
and (planar systems) the chart that also removes the global rotation.

A particle energy E(x_1..x_n) is translation invariant, so exp(-E) cannot be normalised on
R^{n d}; the Boltzmann density lives on the subspace {Σ_i x_i = 0} (dimension (n-1) d). The flow
must model a density there. We use the Helmert basis H ∈ R^{(n-1) x n}: orthonormal rows, all
orthogonal to (1, ..., 1). Applied per spatial axis,

    y = H X  (n-1, d)        X = Hᵀ y  (n, d, zero centre of mass),

is an ISOMETRY between R^{(n-1) d} and the subspace, so a density in y is the density on the
subspace w.r.t. its Lebesgue (Hausdorff) measure, with no Jacobian term: log q(X) = log q_y(H X),
and importance weights p(X)/q(X) = exp(-E(Hᵀ y)/T) / q_y(y) need no correction. For targets
without particles (the 2-D Gaussian mixture) the chart is the identity.

Every chart has ``dim`` (the flow's dimension), ``to_internal(x)``, ``from_flow(u, generator)``
(flow coordinates -> Cartesian) and ``log_det(u)``: log q(x) on the COM-free subspace is
log q_u(u) + log_det(u), the density the importance weights and the NLL are computed with.
"""
from __future__ import annotations

import math

import torch

Tensor = torch.Tensor


def helmert(n: int, dtype=torch.float64) -> Tensor:
    """Rows k = 1..n-1 of the Helmert matrix: (1, .., 1, -k, 0, ..)/sqrt(k (k+1)), shape (n-1, n)."""
    h = torch.zeros(n - 1, n, dtype=dtype)
    for k in range(1, n):
        h[k - 1, :k] = 1.0 / math.sqrt(k * (k + 1))
        h[k - 1, k] = -k / math.sqrt(k * (k + 1))
    return h


class ComFreeChart:
    """Flat Cartesian configurations (..., n d) <-> flat internal coordinates (..., (n-1) d)."""

    def __init__(self, n_particles: int, spatial_dim: int):
        self.n, self.d = n_particles, spatial_dim
        self.identity = n_particles == 1
        self.h = helmert(n_particles) if not self.identity else None
        self.dim = (n_particles - 1) * spatial_dim if not self.identity else spatial_dim

    @classmethod
    def for_target(cls, target) -> "ComFreeChart":
        return cls(target.n_particles, target.spatial_dim)

    def to_internal(self, x: Tensor) -> Tensor:
        if self.identity:
            return x
        xs = x.reshape(*x.shape[:-1], self.n, self.d)
        return torch.einsum("kn,...nd->...kd", self.h.to(x), xs).reshape(*x.shape[:-1], self.dim)

    def to_cartesian(self, y: Tensor) -> Tensor:
        if self.identity:
            return y
        ys = y.reshape(*y.shape[:-1], self.n - 1, self.d)
        return torch.einsum("kn,...kd->...nd", self.h.to(y), ys).reshape(*y.shape[:-1], self.n * self.d)

    def log_det(self, y: Tensor) -> Tensor:
        """log of the density factor from the flow's coordinates to the subspace: 0 (isometry)."""
        return y.new_zeros(y.shape[:-1])

    def from_flow(self, y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Flow coordinates -> Cartesian configurations (deterministic here)."""
        return self.to_cartesian(y)


class RotFreeChart:
    """Planar particle systems: COM-free AND rotation-free coordinates, with their exact Jacobian.

    Start from the Helmert coordinates y = (y_1, .., y_{n-1}), y_k ∈ R^2 (ComFreeChart). Write
    y_1 = r (cos φ, sin φ) and rotate every y_k by -φ: z_k = R(-φ) y_k, so z_1 = (r, 0). The flow
    models u = (log r, z_2, .., z_{n-1}) ∈ R^{2n-3}; the angle φ is uniform and independent,
    because the energy does not depend on it. The map y -> (log r, φ, z_2..) has Jacobian
    dy = r^2 d(log r) dφ dz (polar coordinates give r dr dφ, the rotation of z_k is volume
    preserving, and dr = r d(log r)), so the density on the COM-free subspace is

        log q(y) = log q_u(u) - log(2π) - 2 log r .

    Every density p(y) ∝ exp(-E(y)) of a rotation-invariant energy has exactly this form, so the
    chart restricts the flow to rotation-invariant densities without losing any target, and
    importance weights p/q stay exact. (Reflections and particle permutations remain symmetries
    the flow must learn.)
    """

    def __init__(self, n_particles: int, spatial_dim: int = 2):
        if spatial_dim != 2 or n_particles < 2:
            raise ValueError("the rotation-free chart is for planar systems of at least 2 particles")
        self.com = ComFreeChart(n_particles, spatial_dim)
        self.n, self.d = n_particles, spatial_dim
        self.identity = False
        self.dim = 2 * n_particles - 3

    @classmethod
    def for_target(cls, target) -> "RotFreeChart":
        return cls(target.n_particles, target.spatial_dim)

    def to_internal(self, x: Tensor) -> Tensor:
        y = self.com.to_internal(x).reshape(*x.shape[:-1], self.n - 1, 2)
        r = y[..., 0, :].norm(dim=-1)
        c, s = y[..., 0, 0] / r, y[..., 0, 1] / r
        # z_k = R(-φ) y_k: (c y_x + s y_y, -s y_x + c y_y)
        zx = c[..., None] * y[..., 1:, 0] + s[..., None] * y[..., 1:, 1]
        zy = -s[..., None] * y[..., 1:, 0] + c[..., None] * y[..., 1:, 1]
        z = torch.stack([zx, zy], -1).reshape(*x.shape[:-1], 2 * (self.n - 2))
        return torch.cat([torch.log(r)[..., None], z], -1)

    def to_cartesian(self, u: Tensor, phi: Tensor) -> Tensor:
        r = torch.exp(u[..., 0])
        z = u[..., 1:].reshape(*u.shape[:-1], self.n - 2, 2)
        c, s = torch.cos(phi), torch.sin(phi)
        yx = c[..., None] * z[..., 0] - s[..., None] * z[..., 1]
        yy = s[..., None] * z[..., 0] + c[..., None] * z[..., 1]
        y1 = torch.stack([r * c, r * s], -1)[..., None, :]
        y = torch.cat([y1, torch.stack([yx, yy], -1)], -2).reshape(*u.shape[:-1], 2 * (self.n - 1))
        return self.com.to_cartesian(y)

    def log_det(self, u: Tensor) -> Tensor:
        return -math.log(2 * math.pi) - 2 * u[..., 0]

    def from_flow(self, u: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Flow coordinates -> Cartesian, with the angle drawn uniformly (``generator``)."""
        phi = 2 * math.pi * torch.rand(u.shape[:-1], generator=generator, dtype=u.dtype)
        return self.to_cartesian(u, phi.to(u.device))


CHARTS = {"comfree": ComFreeChart, "rotfree": RotFreeChart}


def make_chart(kind: str, target):
    """'comfree' (COM-free Helmert, any particle target; identity without particles) or
    'rotfree' (COM- and rotation-free, planar particle systems)."""
    if kind not in CHARTS:
        raise ValueError(f"unknown chart {kind!r}; one of {sorted(CHARTS)}")
    return CHARTS[kind].for_target(target)
