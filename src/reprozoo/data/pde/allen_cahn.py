"""Allen-Cahn equation, 1-D or 2-D, periodic, stabilised semi-implicit Fourier spectral scheme.

    u_t = eps^2 Lap u + u - u^3

is the L2 gradient flow of E(u) = int eps^2/2 |grad u|^2 + (u^2 - 1)^2 / 4 dx. Time stepping
(Shen & Yang 2010, stabilised linearly implicit):

    (1 + dt (S + eps^2 k^2)) u_hat^{n+1} = (1 + dt S) u_hat^n + dt F[u^n - (u^n)^3]

With S >= L/2 (L = max |f'| = 2 while |u| <= 1) the discrete energy decreases at every step for
any dt. The solver records that energy (float64) at every saved frame.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .common import copy_processed, march, file_sizes, grf_periodic, plt_agg, read_h5, wavenumbers, write_h5
from reprozoo.figures import save_figure


class AllenCahn:
    def __init__(self, n: int, ndim: int = 2, length: float = 2 * np.pi, eps: float = 0.1,
                 stabilizer: float = 2.0):
        self.n, self.ndim, self.length, self.eps, self.s = n, ndim, float(length), float(eps), float(stabilizer)
        ks = [wavenumbers(n, length)] * (ndim - 1) + [wavenumbers(n, length, real=True)]
        self.kgrid = np.meshgrid(*ks, indexing="ij")
        self.k2 = sum(g**2 for g in self.kgrid)
        self.axes = tuple(range(-ndim, 0))
        self.x = np.arange(n) * self.length / n
        self.cell = (self.length / n) ** ndim
        self.steps = 0

    def fft(self, u):
        return np.fft.rfftn(u, axes=self.axes)

    def ifft(self, u_hat):
        return np.fft.irfftn(u_hat, s=(self.n,) * self.ndim, axes=self.axes)

    def energy(self, u: np.ndarray) -> np.ndarray:
        """Discrete energy sum_grid (eps^2/2 |grad_N u|^2 + (u^2-1)^2/4) * cell volume, per sample."""
        u = np.asarray(u, dtype=np.float64)
        u_hat = self.fft(u)
        grad2 = sum(self.ifft(1j * g * u_hat) ** 2 for g in self.kgrid)
        dens = 0.5 * self.eps**2 * grad2 + 0.25 * (u**2 - 1) ** 2
        return dens.sum(axis=self.axes) * self.cell

    def step(self, u: np.ndarray, dt: float) -> np.ndarray:
        rhs = (1 + dt * self.s) * self.fft(u) + dt * self.fft(u - u**3)
        return self.ifft(rhs / (1 + dt * (self.s + self.eps**2 * self.k2)))

    def run(self, u0: np.ndarray, t_save: np.ndarray, dt: float):
        u = np.asarray(u0, dtype=np.float64)
        out = np.empty((u.shape[0], len(t_save)) + u.shape[1:])
        energy = np.empty((u.shape[0], len(t_save)))

        def record(i, state):
            out[:, i] = state
            energy[:, i] = self.energy(state)

        _, m = march(u, t_save, self.step, dt, record)
        self.steps += m
        if not np.all(np.isfinite(out)):
            raise FloatingPointError("Allen-Cahn solver blew up")
        return out, energy


def simulate(params: dict, seed: int) -> dict:
    n, ndim = int(params["n"]), int(params.get("ndim", 2))
    length, eps = float(params.get("length", 2 * np.pi)), float(params["eps"])
    rng = np.random.default_rng(seed)
    u0 = float(params.get("ic_amplitude", 0.5)) * grf_periodic(
        rng, int(params["n_traj"]), n, ndim, alpha=float(params.get("ic_alpha", 1.0)),
        tau=float(params.get("ic_tau", 10.0)), length=length)
    u0 = np.clip(u0, -0.99, 0.99)
    solver = AllenCahn(n, ndim, length, eps, float(params.get("stabilizer", 2.0)))
    n_t = int(round(float(params["t_end"]) / float(params["dt_save"]))) + 1
    t = np.arange(n_t) * float(params["dt_save"])
    u, energy = solver.run(u0, t, float(params["dt"]))
    return {"u": u, "energy": energy, "x": solver.x, "t": t, "steps": solver.steps,
            "attrs": {"eps": eps, "length": length, "n": n, "ndim": ndim, "dt": float(params["dt"]),
                      "dt_save": float(params["dt_save"]), "stabilizer": solver.s}}


RAW = "allen_cahn_raw.h5"
OUT = "allen_cahn.h5"


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    sim = simulate(params, seed)
    a = sim["attrs"]
    dims = "traj,time,x" if a["ndim"] == 1 else "traj,time,x,y"
    coords = {"x": sim["x"], "t": sim["t"]}
    if a["ndim"] == 2:
        coords["y"] = sim["x"]
    write_h5(Path(raw_dir) / RAW, {"u": (sim["u"], dims)}, coords,
             {"equation": "u_t = eps^2 Lap u + u - u^3", "domain": f"[0, {a['length']:.6g})^{a['ndim']} periodic",
              "grid": "uniform, x_i = i L / n", "time": "t_k = k dt_save",
              "energy": "sum over grid of (eps^2/2 |grad u|^2 + (u^2-1)^2/4) * cell volume (float64, in diagnostics)",
              "initial_condition": "clipped Gaussian random field, amplitude ic_amplitude",
              "solver": "stabilised semi-implicit Fourier spectral (Shen-Yang), first order",
              "seed": seed, **a, "total_steps": sim["steps"]},
             diagnostics={"energy": sim["energy"]})
    return {"version": "solver-1", "generator": "reprozoo.data.pde.allen_cahn.simulate", "solver_steps": sim["steps"]}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    d = copy_processed(Path(raw_dir) / RAW, Path(out_dir) / OUT)
    return {"files": [OUT], "sizes": {"n_traj": d.fields["u"].shape[0], **file_sizes(d)},
            "grid": {"n": d.attrs["n"], "ndim": d.attrs["ndim"], "length": d.attrs["length"],
                     "dims": ",".join(d.dims["u"])},
            "time": {"t0": 0.0, "t1": float(d.coords["t"][-1]), "dt_save": d.attrs["dt_save"],
                     "dt_solver": d.attrs["dt"], "n_t": len(d.coords["t"])}}


def preview(out_dir: Path, png: Path) -> None:
    plt = plt_agg()
    d = read_h5(Path(out_dir) / OUT)
    u, t = d.fields["u"], d.coords["t"]
    picks = sorted({0, len(t) // 4, len(t) // 2, len(t) - 1})
    fig, axes = plt.subplots(1, len(picks) + 1, figsize=(3.2 * (len(picks) + 1), 3))
    for ax, i in zip(axes, picks):
        if u.ndim == 4:
            ax.imshow(u[0, i].T, origin="lower", cmap="coolwarm", vmin=-1, vmax=1)
            ax.set_xticks([]), ax.set_yticks([])
        else:
            ax.plot(d.coords["x"], u[0, i]), ax.set_ylim(-1.1, 1.1)
        ax.set_title(f"traj 0, t={t[i]:.2f}")
    for j in range(min(4, u.shape[0])):
        axes[-1].plot(t, d.diagnostics["energy"][j], lw=1)
    axes[-1].set_title("energy (decreasing)"), axes[-1].set_xlabel("t")
    fig.suptitle(f"Allen-Cahn, {d.attrs['ndim']}-D, n={d.attrs['n']}, eps={d.attrs['eps']}")
    save_figure(fig, png, dpi=90)


def load(out_dir: Path):
    """PDEData with field u (traj,time,x[,y]) and diagnostics['energy'] (traj,time)."""
    return read_h5(Path(out_dir) / OUT)
