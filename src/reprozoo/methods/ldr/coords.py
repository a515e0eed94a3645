"""Internal coordinates of a Boltzmann target: the zero-centre-of-mass chart of particle systems.

A particle energy E(x_1..x_n) is translation invariant, so exp(-E) cannot be normalised on
R^{n d}; the Boltzmann density lives on the subspace {Σ_i x_i = 0} (dimension (n-1) d). The flow
must model a density there. We use the Helmert basis H ∈ R^{(n-1) x n}: orthonormal rows, all
orthogonal to (1, ..., 1). Applied per spatial axis,

    y = H X  (n-1, d)        X = Hᵀ y  (n, d, zero centre of mass),

is an ISOMETRY between R^{(n-1) d} and the subspace, so a density in y is the density on the
subspace w.r.t. its Lebesgue (Hausdorff) measure, with no Jacobian term: log q(X) = log q_y(H X),
and importance weights p(X)/q(X) = exp(-E(Hᵀ y)/T) / q_y(y) need no correction. For targets
without particles (the 2-D Gaussian mixture) the chart is the identity.
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
