"""Our atmosphere proxy: forced-dissipative equivalent-barotropic quasi-geostrophic (QG) flow on a
doubly periodic 32 x 64 beta-plane, pseudo-spectral.

Potential vorticity q and streamfunction psi (x eastward, length Lx; y northward, length Ly):

    q = Lap psi - psi / Ld^2
    d_t q + J(psi, q) + beta d_x psi = F(x, y) - mu Lap psi - nu Lap^4 q

with J(a, b) = a_x b_y - a_y b_x. Inviscid and unforced (F = mu = nu = 0) the dealiased system
conserves, exactly in the semi-discrete spectral truncation,

    energy     E = 1/2 < |grad psi|^2 + psi^2 / Ld^2 >
    enstrophy  Z = 1/2 < q^2 >

(<.> the domain mean; the beta term conserves both as well), which tests/test_emformer.py checks
along RK4 trajectories. The steady forcing F (a tilted wave pattern) and linear Ekman drag mu hold a
chaotic, statistically steady state with Rossby waves drifting westward: a deterministic system
whose forecast skill decays with lead time, as the atmosphere's does.

Time stepping: RK4 in the integrating factor of the (linear) beta, drag and hyperviscosity terms
(Lawson RK4), the same scheme as the project's Kolmogorov solver; nonlinear products dealiased by the
2/3 rule (``data.pde.common.dealias_mask`` along each axis). The save loop is
``data.pde.common.march``.
"""
from __future__ import annotations

import numpy as np

from ...data.pde.common import dealias_mask, lawson_rk4, march, wavenumbers


class QG2D:
    """Batched QG solver; arrays (batch, ny, nx) on the grid, rfft2 over (y, x) with x the real axis."""

    def __init__(self, ny: int = 32, nx: int = 64, ly: float = 2 * np.pi, lx: float = 4 * np.pi,
                 beta: float = 1.0, ld: float = 1.0, mu: float = 0.02, nu: float = 2e-5,
                 hyper_order: int = 4, forcing_amp: float = 0.0, forcing_k: tuple = (2, 3)):
        self.ny, self.nx, self.ly, self.lx = ny, nx, float(ly), float(lx)
        self.beta, self.ld, self.mu, self.nu = float(beta), float(ld), float(mu), float(nu)
        ky = wavenumbers(ny, ly)
        kx = wavenumbers(nx, lx, real=True)
        self.ky, self.kx = np.meshgrid(ky, kx, indexing="ij")
        self.k2 = self.kx**2 + self.ky**2
        # q_hat = -(k^2 + 1/Ld^2) psi_hat; the mean mode (k = 0) of psi is 0
        self.inv_op = -(self.k2 + (1.0 / self.ld**2 if self.ld > 0 else 0.0))
        self.q2psi = np.where(self.inv_op != 0, 1.0 / np.where(self.inv_op != 0, self.inv_op, 1.0), 0.0)
        self.q2psi[0, 0] = 0.0
        self.mask = dealias_mask(ny, real_last=False, ndim=1)[:, None] & dealias_mask(nx, real_last=True, ndim=1)[None, :]
        # linear operator on q_hat: -beta i kx psi_hat + mu k^2 psi_hat - nu k^(2 order) q_hat
        self.lin = (-1j * self.beta * self.kx + self.mu * self.k2) * self.q2psi - self.nu * self.k2**hyper_order
        self.y = (np.arange(ny) + 0.5) * self.ly / ny
        self.x = np.arange(nx) * self.lx / nx
        yy, xx = np.meshgrid(self.y, self.x, indexing="ij")
        mx, my = forcing_k
        forcing = forcing_amp * np.cos(2 * np.pi * mx * xx / self.lx + 2 * np.pi * my * yy / self.ly)
        self.f_hat = self.mask * np.fft.rfft2(forcing)

    # transforms -------------------------------------------------------------------------------
    def to_hat(self, a: np.ndarray) -> np.ndarray:
        return self.mask * np.fft.rfft2(a, axes=(-2, -1))

    def to_grid(self, a_hat: np.ndarray) -> np.ndarray:
        return np.fft.irfft2(a_hat, s=(self.ny, self.nx), axes=(-2, -1))

    def psi_hat(self, q_hat: np.ndarray) -> np.ndarray:
        return q_hat * self.q2psi

    # dynamics ---------------------------------------------------------------------------------
    def nonlinear(self, q_hat: np.ndarray) -> np.ndarray:
        """-J(psi, q) + F, dealiased."""
        p_hat = self.psi_hat(q_hat)
        px, py = self.to_grid(1j * self.kx * p_hat), self.to_grid(1j * self.ky * p_hat)
        qx, qy = self.to_grid(1j * self.kx * q_hat), self.to_grid(1j * self.ky * q_hat)
        return -self.to_hat(px * qy - py * qx) + self.f_hat

    def step(self, q_hat: np.ndarray, h: float) -> np.ndarray:
        """One Lawson-RK4 step: the linear part exactly through e^{L h}."""
        return lawson_rk4(q_hat, h, self.lin, self.nonlinear)

    # diagnostics ------------------------------------------------------------------------------
    def energy(self, q_hat: np.ndarray) -> np.ndarray:
        psi = self.to_grid(self.psi_hat(q_hat))
        q = self.to_grid(q_hat)
        # <|grad psi|^2 + psi^2/Ld^2> = -<psi (Lap psi - psi/Ld^2)> = -<psi q> (periodic)
        return -0.5 * np.mean(psi * q, axis=(-2, -1))

    def enstrophy(self, q_hat: np.ndarray) -> np.ndarray:
        return 0.5 * np.mean(self.to_grid(q_hat) ** 2, axis=(-2, -1))

    def fields(self, q_hat: np.ndarray) -> np.ndarray:
        """(batch, 2, ny, nx): streamfunction psi (the 'geopotential') and relative vorticity Lap psi."""
        p_hat = self.psi_hat(q_hat)
        return np.stack([self.to_grid(p_hat), self.to_grid(-self.k2 * p_hat)], axis=-3)

    def random_q(self, rng: np.random.Generator, batch: int, amp: float = 1.0, k_peak: float = 3.0) -> np.ndarray:
        """Random band-limited initial PV (spectral), peak wavenumber ``k_peak``, rms ``amp``."""
        k = np.sqrt(self.k2)
        spec = k * np.exp(-((k - k_peak) ** 2) / 2.0)
        white = np.fft.rfft2(rng.standard_normal((batch, self.ny, self.nx)))
        q_hat = self.mask * white * spec
        q = self.to_grid(q_hat)
        q_hat = q_hat * (amp / np.sqrt(np.mean(q**2, axis=(-2, -1), keepdims=True)))
        return q_hat


    def cfl_dt(self, q_hat: np.ndarray, cfl: float, dt_max: float) -> float:
        """Step with max|u| dt / dx = cfl (u = (-psi_y, psi_x)), at most dt_max."""
        p_hat = self.psi_hat(q_hat)
        umax = max(np.abs(self.to_grid(1j * self.ky * p_hat)).max(), np.abs(self.to_grid(1j * self.kx * p_hat)).max())
        dx = min(self.lx / self.nx, self.ly / self.ny)
        return float(min(dt_max, cfl * dx / max(umax, 1e-12)))


def simulate(sim: QG2D, rng: np.random.Generator, n_traj: int, n_frames: int, dt_save: float,
             dt_max: float, spinup: float, cfl: float = 1.0) -> np.ndarray:
    """Trajectories of (psi, zeta) after a spin-up onto the attractor: float32 (traj, time, 2, ny, nx).
    CFL-limited steps, re-chosen every save interval (``march`` lands each interval exactly)."""
    q_hat = sim.random_q(rng, n_traj)
    dt = lambda s: sim.cfl_dt(s, cfl, dt_max)  # noqa: E731
    q_hat, _ = march(q_hat, [spinup], sim.step, dt, lambda i, s: None, recheck=dt_save)
    out = np.empty((n_traj, n_frames, 2, sim.ny, sim.nx), np.float32)

    def record(i, s):
        out[:, i] = sim.fields(s)

    def check(t, s):
        if not np.all(np.isfinite(s)):
            raise FloatingPointError(f"QG simulation blew up at t = {t}")

    march(q_hat, dt_save * np.arange(n_frames), sim.step, dt, record, check=check)
    return out
