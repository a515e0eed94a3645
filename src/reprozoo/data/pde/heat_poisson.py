"""Heat-equation trajectories and Poisson problems with exact spectral solutions.

heat.h5     u_t = kappa Lap u on the periodic square [0, L)^2. The initial condition is a random
            band-limited field, so the Fourier solution u_hat(k, t) = u_hat(k, 0) exp(-kappa |k|^2 t)
            is exact at the grid points (no time stepping).
poisson.h5  -Lap u = f on the unit square with u = 0 on the boundary (Dirichlet). The source is a
            random finite sine series f = sum c_mn sin(m pi x) sin(n pi y), m, n = 1..n_grid, so
            u = sum c_mn / (pi^2 (m^2 + n^2)) sin(m pi x) sin(n pi y) is the exact solution. Fields are
            stored on the interior nodes x_i = i h, h = 1 / (n_grid + 1), i = 1..n_grid (the boundary
            nodes are zero and not stored); the sine coefficients are stored too.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .common import file_sizes, grf_periodic, make_split, plt_agg, read_h5, wavenumbers, write_h5
from reprozoo.figures import save_figure


def heat_exact(u0: np.ndarray, t: np.ndarray, kappa: float, length: float = 2 * np.pi) -> np.ndarray:
    """Exact solution of the periodic heat equation at times t for grid data u0 (batch, x, y)."""
    n = u0.shape[-1]
    kx = wavenumbers(n, length)
    ky = wavenumbers(n, length, real=True)
    k2 = kx[:, None] ** 2 + ky[None, :] ** 2
    u0_hat = np.fft.rfft2(u0, axes=(-2, -1))
    decay = np.exp(-kappa * k2[None] * np.asarray(t)[:, None, None])  # (time, kx, ky)
    return np.fft.irfft2(u0_hat[:, None] * decay[None], s=(n, n), axes=(-2, -1))


def sine_basis(n: int) -> np.ndarray:
    """S[i, m] = sin(m pi x_i), x_i = i / (n + 1), i, m = 1..n."""
    i = np.arange(1, n + 1)
    return np.sin(np.pi * np.outer(i, i) / (n + 1))


def poisson_dirichlet(coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f, u) on the interior grid for sine coefficients coef (batch, n, n) of the source."""
    n = coef.shape[-1]
    s = sine_basis(n)
    m = np.arange(1, n + 1)
    lam = np.pi**2 * (m[:, None] ** 2 + m[None, :] ** 2)
    f = s @ coef @ s.T
    u = s @ (coef / lam) @ s.T
    return f, u


def simulate(params: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    h = params["heat"]
    n, length, kappa = int(h["n"]), float(h.get("length", 2 * np.pi)), float(h["kappa"])
    u0 = grf_periodic(rng, int(h["n_traj"]), n, 2, alpha=float(h.get("ic_alpha", 2.5)),
                      tau=float(h.get("ic_tau", 3.0)), length=length)
    n_t = int(round(float(h["t_end"]) / float(h["dt_save"]))) + 1
    t = np.arange(n_t) * float(h["dt_save"])
    heat = heat_exact(u0, t, kappa, length)
    p = params["poisson"]
    ng, ns = int(p["n"]), int(p["n_samples"])
    m = np.arange(1, ng + 1)
    spec = (np.pi**2 * (m[:, None] ** 2 + m[None, :] ** 2) + float(p.get("tau", 3.0)) ** 2) ** (-float(p.get("alpha", 2.0)) / 2)
    coef = rng.standard_normal((ns, ng, ng)) * spec[None]
    coef *= 1.0 / np.sqrt(np.mean(poisson_dirichlet(coef)[0] ** 2, axis=(1, 2)))[:, None, None]  # unit-rms source
    f, u = poisson_dirichlet(coef)
    return {"heat": heat, "t": t, "x": np.arange(n) * length / n, "kappa": kappa, "length": length, "n": n,
            "f": f, "u": u, "coef": coef, "xp": m / (ng + 1), "n_poisson": ng, "dt_save": float(h["dt_save"])}


HEAT, POISSON = "heat.h5", "poisson.h5"


def _write(sim: dict, folder: Path, seed: int, split: bool) -> None:
    write_h5(folder / HEAT, {"u": (sim["heat"], "traj,time,x,y")}, {"x": sim["x"], "y": sim["x"], "t": sim["t"]},
             {"equation": "u_t = kappa Lap u", "domain": f"[0, {sim['length']:.6g})^2 periodic",
              "grid": "uniform, x_i = i L / n", "time": "t_k = k dt_save", "solution": "exact Fourier solution",
              "kappa": sim["kappa"], "length": sim["length"], "n": sim["n"], "dt_save": sim["dt_save"], "seed": seed},
             split=make_split(sim["heat"].shape[0]) if split else None)
    write_h5(folder / POISSON, {"f": (sim["f"], "sample,x,y"), "u": (sim["u"], "sample,x,y")},
             {"x": sim["xp"], "y": sim["xp"]},
             {"equation": "-Lap u = f, u = 0 on the boundary", "domain": "[0, 1]^2 Dirichlet",
              "grid": "interior nodes x_i = i/(n+1), i = 1..n (boundary values are 0, not stored)",
              "solution": "exact: finite sine series, u_mn = f_mn / (pi^2 (m^2 + n^2))", "n": sim["n_poisson"],
              "seed": seed},
             diagnostics={"source_sine_coefficients": sim["coef"]},
             split=make_split(sim["f"].shape[0]) if split else None)


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    _write(simulate(params, seed), Path(raw_dir), seed, split=False)
    return {"version": "exact-1", "generator": "reprozoo.data.pde.heat_poisson.simulate"}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    out = {}
    for name in (HEAT, POISSON):
        d = read_h5(Path(raw_dir) / name)
        n = next(iter(d.fields.values())).shape[0]
        write_h5(Path(out_dir) / name, {k: (v, ",".join(d.dims[k])) for k, v in d.fields.items()}, d.coords,
                 {k: v for k, v in d.attrs.items() if k != "layout"}, d.diagnostics, make_split(n))
        out[name.removesuffix(".h5")] = d
    h, p = out["heat"], out["poisson"]
    return {"files": [HEAT, POISSON],
            "sizes": {"heat_traj": h.fields["u"].shape[0], "poisson_samples": p.fields["u"].shape[0],
                      **{f"heat_{k}": v for k, v in file_sizes(h).items()},
                      **{f"poisson_{k}": v for k, v in file_sizes(p).items()}},
            "grid": {"heat": {"n": h.attrs["n"], "length": h.attrs["length"], "dims": "traj,time,x,y"},
                     "poisson": {"n": p.attrs["n"], "domain": "[0,1]^2 interior nodes", "dims": "sample,x,y"}},
            "time": {"heat": {"t0": 0.0, "t1": float(h.coords["t"][-1]), "dt_save": h.attrs["dt_save"],
                              "n_t": len(h.coords["t"])}}}


def preview(out_dir: Path, png: Path) -> None:
    plt = plt_agg()
    h = read_h5(Path(out_dir) / HEAT)
    p = read_h5(Path(out_dir) / POISSON)
    u, t = h.fields["u"], h.coords["t"]
    picks = [0, len(t) // 3, len(t) - 1]
    fig, axes = plt.subplots(1, 5, figsize=(16, 3.2))
    vmax = np.abs(u[0, 0]).max()
    for ax, i in zip(axes, picks):
        ax.imshow(u[0, i].T, origin="lower", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_title(f"heat traj 0, t={t[i]:.2f}"), ax.set_xticks([]), ax.set_yticks([])
    for ax, k in zip(axes[3:], ("f", "u")):
        im = ax.imshow(p.fields[k][0].T, origin="lower", cmap="viridis", extent=[0, 1, 0, 1])
        ax.set_title(f"Poisson sample 0: {k}")
        fig.colorbar(im, ax=ax)
    fig.suptitle(f"heat (kappa={h.attrs['kappa']}, n={h.attrs['n']}) and Dirichlet Poisson (n={p.attrs['n']})")
    save_figure(fig, png, dpi=90)


def load(out_dir: Path) -> dict:
    """{"heat": PDEData (u: traj,time,x,y), "poisson": PDEData (f, u: sample,x,y)}."""
    return {"heat": read_h5(Path(out_dir) / HEAT), "poisson": read_h5(Path(out_dir) / POISSON)}
