"""FPU-beta chain: the high-dimensional Hamiltonian system every variant learns.

N unit masses on a line, neighbours joined by springs with a quartic (beta) term, both ends
fixed (q_0 = q_{N+1} = 0). Dimensionless units: mass, linear spring constant and lattice
spacing are 1, so time is measured in units of sqrt(m/k).

    H(q, p) = sum_i p_i^2 / 2 + sum_{i=0}^{N} [ r_i^2 / 2 + beta r_i^4 / 4 ],   r_i = q_{i+1} - q_i

Linear normal modes s_k(i) = sqrt(2/(N+1)) sin(pi k i/(N+1)), frequencies
omega_k = 2 sin(pi k / (2(N+1))). Initial states excite the lowest modes only (the classic FPU
experiment); the beta term then slaves higher odd modes to them, so trajectories lie close to a
curved low-dimensional submanifold of the 2N-dimensional phase space: the setting in which a
nonlinear (symplectic) reduction can beat a linear one. The reference is integrated with
leapfrog (``blocks.symplectic``), whose energy error stays O(dt^2) and bounded.
"""
from __future__ import annotations

import numpy as np

from ...blocks.symplectic import leapfrog


def _bonds(q):
    """Bond stretches r_0..r_N of the fixed-end chain (works batched on the last axis)."""
    zero = np.zeros(q.shape[:-1] + (1,))
    return np.diff(np.concatenate([zero, q, zero], axis=-1), axis=-1)


def potential(q, beta: float):
    r = _bonds(q)
    return np.sum(0.5 * r**2 + 0.25 * beta * r**4, axis=-1)


def grad_potential(q, beta: float):
    """dV/dq_i = F(r_{i-1}) - F(r_i) with the bond force F(r) = r + beta r^3."""
    r = _bonds(q)
    f = r + beta * r**3
    return f[..., :-1] - f[..., 1:]


def energy(q, p, beta: float):
    return 0.5 * np.sum(p**2, axis=-1) + potential(q, beta)


def normal_modes(n: int):
    """(modes [n, n] with s_k in column k-1, frequencies omega_k)."""
    i = np.arange(1, n + 1)
    k = np.arange(1, n + 1)
    s = np.sqrt(2.0 / (n + 1)) * np.sin(np.pi * np.outer(i, k) / (n + 1))
    return s, 2.0 * np.sin(np.pi * k / (2 * (n + 1)))


def initial_states(count: int, n: int, modes, amp: tuple[float, float], rng: np.random.Generator):
    """Random amplitudes and phases in the listed (1-based) modes: q = sum a_k cos(phi) s_k,
    p = -sum a_k omega_k sin(phi) s_k, a_k uniform in ``amp``."""
    s, w = normal_modes(n)
    q0, p0 = np.zeros((count, n)), np.zeros((count, n))
    for k in modes:
        a = rng.uniform(*amp, size=(count, 1))
        phi = rng.uniform(0, 2 * np.pi, size=(count, 1))
        q0 += a * np.cos(phi) * s[:, k - 1]
        p0 -= a * w[k - 1] * np.sin(phi) * s[:, k - 1]
    return q0, p0


def simulate(q0, p0, beta: float, dt: float, save_every: int, n_saved: int):
    """Leapfrog reference; returns q, p of shape [batch, n_saved + 1, N] at times k*dt*save_every."""
    qs, ps = leapfrog(q0, p0, lambda q: grad_potential(q, beta), dt, save_every * n_saved, every=save_every)
    return np.moveaxis(qs, 0, 1), np.moveaxis(ps, 0, 1)
