"""1-D viscous Burgers equation on a periodic interval, and its exact Cole-Hopf solution.

    u_t + (u^2 / 2)_x = nu u_xx,   x in [0, L) periodic

Solver: Fourier pseudo-spectral in space (2/3 dealiasing of u^2), integrating-factor (Lawson)
RK4 in time (the viscous term is integrated exactly), batched over trajectories. Initial conditions
are random superpositions of sine waves (as in PDEBench), so every trajectory has zero mean and the
Cole-Hopf transform applies:

    u = -2 nu phi_x / phi,   phi_t = nu phi_xx,   phi(x, 0) = exp(-(1 / 2 nu) int_0^x u0)

``cole_hopf`` evaluates that exact solution spectrally on a fine grid (used by the tests).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .common import copy_processed, lawson_rk4, march, dealias_mask, file_sizes, plt_agg, read_h5, wavenumbers, write_h5
from reprozoo.figures import save_figure


class Burgers1D:
    def __init__(self, n: int, length: float = 2 * np.pi, nu: float = 0.01, dealias: bool = True):
        self.n, self.length, self.nu = n, float(length), float(nu)
        self.k = wavenumbers(n, length, real=True)
        self.mask = dealias_mask(n, real_last=True, ndim=1) if dealias else np.ones_like(self.k, dtype=bool)
        self.lin = -self.nu * self.k**2
        self.x = np.arange(n) * self.length / n
        self.steps = 0

    def to_hat(self, u):
        return self.mask * np.fft.rfft(u, axis=-1)

    def to_grid(self, u_hat):
        return np.fft.irfft(u_hat, n=self.n, axis=-1)

    def rhs(self, u_hat):
        u = self.to_grid(u_hat)
        return -0.5j * self.k * self.mask * np.fft.rfft(u * u, axis=-1)

    def step(self, u_hat, dt):
        return lawson_rk4(u_hat, dt, self.lin, self.rhs)

    def run(self, u0: np.ndarray, t_save: np.ndarray, cfl: float = 0.4, dt_max: float | None = None) -> np.ndarray:
        """Values at ``t_save`` (first may be 0). The step is fixed: CFL on max|u0| (max |u| never grows)."""
        u0 = np.atleast_2d(u0)
        u_hat = self.to_hat(u0)
        umax = max(np.abs(self.to_grid(u_hat)).max(), 1e-12)
        dt = cfl * (self.length / self.n) / umax
        if dt_max is not None:
            dt = min(dt, dt_max)
        out = np.empty((u0.shape[0], len(t_save), self.n))

        def record(i, state):
            out[:, i] = self.to_grid(state)

        _, m = march(u_hat, t_save, self.step, dt, record)
        self.steps += m
        if not np.all(np.isfinite(out)):
            raise FloatingPointError("Burgers solver blew up")
        return out


def cole_hopf(u0: np.ndarray, t: float | np.ndarray, nu: float, length: float = 2 * np.pi) -> np.ndarray:
    """Exact periodic solution at time(s) ``t`` for a zero-mean, well-resolved u0 sampled on a uniform grid.

    Returns an array (len(t), n) (or (n,) for scalar t) on the same grid as u0.
    """
    u0 = np.asarray(u0, dtype=np.float64)
    n = u0.shape[-1]
    k = wavenumbers(n, length)
    u0_hat = np.fft.fft(u0)
    if abs(u0_hat[0].real) > 1e-9 * n * max(1.0, np.abs(u0).max()):
        raise ValueError("Cole-Hopf on a periodic domain needs a zero-mean initial condition")
    ik = np.where(k != 0, 1.0 / np.where(k != 0, 1j * k, 1.0), 0.0)
    big_u = np.real(np.fft.ifft(u0_hat * ik))  # antiderivative (up to a constant, which cancels)
    a = -big_u / (2 * nu)
    phi0 = np.exp(a - a.max())
    phi0_hat = np.fft.fft(phi0)
    ts = np.atleast_1d(np.asarray(t, dtype=np.float64))
    out = np.empty((len(ts), n))
    for i, ti in enumerate(ts):
        ph = phi0_hat * np.exp(-nu * k**2 * ti)
        phi = np.real(np.fft.ifft(ph))
        phix = np.real(np.fft.ifft(1j * k * ph))
        with np.errstate(divide="ignore", invalid="ignore"):
            out[i] = -2 * nu * phix / phi
    if not np.all(np.isfinite(out)):
        raise ValueError(f"Cole-Hopf: exp(-U/2nu) under/overflows for nu={nu}; use a larger nu or smaller u0")
    return out if np.ndim(t) else out[0]


def random_sines(rng: np.random.Generator, batch: int, x: np.ndarray, length: float, n_waves: int = 4,
                 k_max: int = 4, amplitude: float = 1.0) -> np.ndarray:
    """u0 = sum_i A_i sin(2 pi m_i x / L + phi_i), m_i in 1..k_max, A_i ~ U(0, amplitude), phi_i ~ U(0, 2 pi)."""
    m = rng.integers(1, k_max + 1, size=(batch, n_waves))
    amp = rng.uniform(0, amplitude, size=(batch, n_waves))
    phase = rng.uniform(0, 2 * np.pi, size=(batch, n_waves))
    arg = 2 * np.pi * m[..., None] * x[None, None, :] / length + phase[..., None]
    return np.sum(amp[..., None] * np.sin(arg), axis=1)


def simulate(params: dict, seed: int) -> dict:
    n, length, nu = int(params["n"]), float(params.get("length", 2 * np.pi)), float(params["nu"])
    rng = np.random.default_rng(seed)
    solver = Burgers1D(n, length, nu)
    u0 = random_sines(rng, int(params["n_traj"]), solver.x, length, int(params.get("n_waves", 4)),
                      int(params.get("k_max", 4)), float(params.get("amplitude", 1.0)))
    n_t = int(round(float(params["t_end"]) / float(params["dt_save"]))) + 1
    t = np.arange(n_t) * float(params["dt_save"])
    u = solver.run(u0, t, cfl=float(params.get("cfl", 0.4)))
    return {"u": u, "x": solver.x, "t": t, "steps": solver.steps,
            "attrs": {"nu": nu, "length": length, "n": n, "dt_save": float(params["dt_save"])}}


RAW = "burgers1d_raw.h5"
OUT = "burgers1d.h5"


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    sim = simulate(params, seed)
    a = sim["attrs"]
    write_h5(Path(raw_dir) / RAW, {"u": (sim["u"], "traj,time,x")}, {"x": sim["x"], "t": sim["t"]},
             {"equation": "u_t + (u^2/2)_x = nu u_xx", "domain": f"[0, {a['length']:.6g}) periodic",
              "grid": "uniform, x_i = i L / n", "time": "t_k = k dt_save from the initial condition",
              "initial_condition": f"sum of {params.get('n_waves', 4)} sines, integer wavenumbers 1..{params.get('k_max', 4)}",
              "solver": "pseudo-spectral, 2/3 dealiasing, integrating-factor RK4, fixed CFL step",
              "seed": seed, **a, "total_steps": sim["steps"]})
    return {"version": "solver-1", "generator": "reprozoo.data.pde.burgers.simulate", "solver_steps": sim["steps"]}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    d = copy_processed(Path(raw_dir) / RAW, Path(out_dir) / OUT)
    return {"files": [OUT], "sizes": {"n_traj": d.fields["u"].shape[0], **file_sizes(d)},
            "grid": {"n": d.attrs["n"], "length": d.attrs["length"], "dims": "traj,time,x"},
            "time": {"t0": 0.0, "t1": float(d.coords["t"][-1]), "dt_save": d.attrs["dt_save"],
                     "n_t": len(d.coords["t"])}}


def spacetime_preview(u: np.ndarray, x: np.ndarray, t: np.ndarray, png: Path, title: str) -> None:
    plt = plt_agg()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for j, ax in enumerate(axes[:2]):
        j = min(j, u.shape[0] - 1)
        im = ax.imshow(u[j], aspect="auto", origin="lower", cmap="RdBu_r",
                       extent=[x[0], x[-1], t[0], t[-1]])
        ax.set_xlabel("x"), ax.set_ylabel("t"), ax.set_title(f"traj {j}")
        fig.colorbar(im, ax=ax)
    for i in sorted({0, u.shape[1] // 2, u.shape[1] - 1}):
        axes[2].plot(x, u[0, i], label=f"t={t[i]:.2f}")
    axes[2].legend(fontsize=7), axes[2].set_title("traj 0 profiles")
    fig.suptitle(title)
    save_figure(fig, png, dpi=90)


def preview(out_dir: Path, png: Path) -> None:
    d = read_h5(Path(out_dir) / OUT)
    spacetime_preview(d.fields["u"], d.coords["x"], d.coords["t"], png,
                      f"viscous Burgers, n={d.attrs['n']}, nu={d.attrs['nu']}")


def load(out_dir: Path):
    """PDEData with field u (traj, time, x)."""
    return read_h5(Path(out_dir) / OUT)
