"""Trapped sine-Gordon kink chain: the high-dimensional Hamiltonian system every variant learns.

N sites x_i = (i - (N - 1)/2) a on a line, angles q_i, free ends. Dimensionless units (the
continuum kink has width 1 and the speed of light is 1):

    H(q, p) = sum_i p_i^2 / 2 + sum_{i=1}^{N-1} (q_{i+1} - q_i)^2 / (2 a^2)
              + sum_i (1 + eps(x_i)) (1 - cos q_i),   eps(x) = min((|x| / ell)^power, eps_max).

Without the trap (eps = 0) and for a -> 0 this is the discretised sine-Gordon equation
q_tt = q_xx - sin q, whose kink q = 4 arctan exp(gamma (x - X - v t)) travels at any speed |v| < 1.
The trap raises the on-site term near the ends, so the kink's rest energy 8 sqrt(1 + eps(X)) / a
grows there: it acts as a soft box from whose walls the kink bounces back. The cap eps_max only
bounds the chain's highest linear frequency sqrt(4 / a^2 + 1 + eps_max) (and so the leapfrog step
a full-dimensional model needs); the kink turns long before it reaches the capped region. A kink at position X
with velocity v is (up to radiation, which the slow adiabatic motion keeps tiny, and Lorentz
contraction, a few per cent at |v| <= 0.3) the state

    q_i = 4 arctan exp(w (x_i - X)),  p_i = -v dq_i/dx,   w = gamma sqrt(1 + eps(X)):

every trajectory lies on one curved two-dimensional submanifold of the 2N-dimensional phase space
parametrised by (X, v). The curve X -> q(X) sweeps a sharp front across the chain, so a linear basis
needs many modes to follow it (a translating front has a slowly decaying Kolmogorov n-width), while a
nonlinear decoder with one degree of freedom can. The reference is integrated with leapfrog
(``blocks.symplectic``): energy error O(dt^2) and bounded.
"""
from __future__ import annotations

import numpy as np

from ...blocks.symplectic import leapfrog


class KinkChain:
    """The chain of one system configuration ``{n, a, ell, power}`` (see the module docstring)."""

    def __init__(self, n: int, a: float, ell: float, power: int, eps_max: float = np.inf):
        self.n, self.a = int(n), float(a)
        self.ell, self.power, self.eps_max = float(ell), int(power), float(eps_max)
        self.x = (np.arange(self.n) - (self.n - 1) / 2) * self.a
        self.eps = self.trap(self.x)

    @classmethod
    def from_config(cls, cfg: dict) -> "KinkChain":
        return cls(cfg["n"], cfg["a"], cfg["ell"], cfg["power"], cfg.get("eps_max", np.inf))

    def trap(self, x):
        return np.minimum((np.abs(x) / self.ell) ** self.power, self.eps_max)

    # --- the Hamiltonian --------------------------------------------------------------------
    def potential(self, q):
        r = np.diff(q, axis=-1)
        return 0.5 * np.sum(r**2, axis=-1) / self.a**2 + np.sum((1 + self.eps) * (1 - np.cos(q)), axis=-1)

    def grad_potential(self, q):
        """dV/dq_i = (F_{i-1} - F_i) + (1 + eps_i) sin q_i, bond force F_i = (q_{i+1} - q_i) / a^2, F_0 = F_N = 0."""
        f = np.diff(q, axis=-1) / self.a**2
        zero = np.zeros(q.shape[:-1] + (1,))
        return np.concatenate([zero, f], -1) - np.concatenate([f, zero], -1) + (1 + self.eps) * np.sin(q)

    def energy(self, q, p):
        return 0.5 * np.sum(p**2, axis=-1) + self.potential(q)

    def max_frequency(self) -> float:
        """Upper bound of the linearised frequencies (Gershgorin): leapfrog is stable for dt < 2 / this."""
        return float(np.sqrt(4 / self.a**2 + 1 + self.eps.max()))

    # --- the kink manifold ------------------------------------------------------------------
    def kink(self, X, v):
        """Kink state(s) at positions X with velocities v (arrays of equal shape): q, p [..., N]."""
        X, v = np.asarray(X, float)[..., None], np.asarray(v, float)[..., None]
        w = np.sqrt(1 + self.trap(X)) / np.sqrt(1 - v**2)
        z = w * (self.x - X)
        q = 4 * np.arctan(np.exp(z))
        dq = 2 * w / np.cosh(z)  # d/dx of 4 arctan(e^z)
        return q, -v * dq

    def position(self, q):
        """Kink position from the state: X = x_R - a sum_i q_i / (2 pi), x_R = x_N + a/2.

        Exact for a kink far from the ends (q - 2 pi theta(x - X) is odd about X): the integral of
        q over the chain is 2 pi (x_R - X). A linear functional of q."""
        return self.x[-1] + self.a / 2 - self.a * np.sum(q, axis=-1) / (2 * np.pi)

    def velocity(self, q, p):
        """Kink velocity from the state: v = -<p, dq/dx> / |dq/dx|^2 (field momentum / kink mass)."""
        dq = np.gradient(q, self.a, axis=-1)
        return -np.sum(p * dq, axis=-1) / np.sum(dq**2, axis=-1)

    def charge(self, q):
        """Topological charge (q_N - q_1) / (2 pi): 1 for one kink; it cannot change while the ends stay in vacua."""
        return (q[..., -1] - q[..., 0]) / (2 * np.pi)

    def manifold_r2(self, q, p) -> float:
        """Share of the state variance that the two-parameter kink manifold explains.

        Per snapshot X and v are read off the state (``position``, ``velocity``) and the kink of
        those (X, v) is subtracted; r2 = 1 - residual / total sum of squares, averaged over the q
        and p halves. 1: the states lie on the curved 2-dim submanifold (slaved to X, v); about 0:
        they do not."""
        q, p = q.reshape(-1, self.n), p.reshape(-1, self.n)
        X, v = self.position(q), np.clip(self.velocity(q, p), -0.95, 0.95)
        qk, pk = self.kink(X, v)
        r2 = [1 - np.sum((u - uk) ** 2) / np.sum((u - u.mean(0)) ** 2) for u, uk in ((q, qk), (p, pk))]
        return float(np.mean(r2))

    # --- data -------------------------------------------------------------------------------
    def initial_states(self, count: int, x0: float, speed: tuple[float, float], rng: np.random.Generator):
        """Kinks at X uniform in [-x0, x0] with |v| uniform in ``speed`` and a random direction."""
        X = rng.uniform(-x0, x0, size=count)
        v = rng.uniform(*speed, size=count) * rng.choice([-1.0, 1.0], size=count)
        return self.kink(X, v)

    def simulate(self, q0, p0, dt: float, save_every: int, n_saved: int):
        """Leapfrog reference; q, p of shape [batch, n_saved + 1, N] at times k dt save_every."""
        qs, ps = leapfrog(q0, p0, self.grad_potential, dt, save_every * n_saved, every=save_every)
        return np.moveaxis(qs, 0, 1), np.moveaxis(ps, 0, 1)
