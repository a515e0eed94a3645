"""Lorenz-96 simulator: N coupled variables on a ring,

    dx_i/dt = (x_{i+1} - x_{i-2}) x_{i-1} - d x_i + F        (indices mod N; d = 1, F = 8 by default)

integrated with classical RK4 (step ``dt``) in float64, batched over trajectories, sampled every
``dt_obs`` after a spin-up ``t_burn`` from x = F + small random perturbations.

The quadratic term conserves E = 1/2 sum x_i^2, so with d = 0 and F = 0 (the unforced inviscid
limit) E is an invariant; with F = 8 the flow is chaotic (largest Lyapunov exponent ~1.7 for N = 40,
time mean of x_i ~2.3).

Files:
  clean.parquet     traj, step, t, x00..x{N-1}   the simulated state (float64)
  observed.parquet  traj, step, t, x00..          state + N(0, noise_std^2) noise, NaN where missing
  mask.parquet      traj, step, t, x00..          True where observed (missing completely at random,
                                                  probability ``missing_rate``)
  graph.json        the coupling graph: edge j -> i when x_j appears in dx_i/dt (i-2, i-1, i+1), with
                    roles, and the adjacency matrix A[i][j]
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...io import write_json
from .common import plt_agg, read_parquet, write_parquet
from reprozoo.figures import save_figure


def tendency(x: np.ndarray, forcing: float = 8.0, damping: float = 1.0) -> np.ndarray:
    """dx/dt for states (..., N)."""
    return (np.roll(x, -1, -1) - np.roll(x, 2, -1)) * np.roll(x, 1, -1) - damping * x + forcing


def rk4_step(x: np.ndarray, dt: float, forcing: float = 8.0, damping: float = 1.0) -> np.ndarray:
    k1 = tendency(x, forcing, damping)
    k2 = tendency(x + dt / 2 * k1, forcing, damping)
    k3 = tendency(x + dt / 2 * k2, forcing, damping)
    k4 = tendency(x + dt * k3, forcing, damping)
    return x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def integrate(x0: np.ndarray, n_obs: int, dt: float, every: int, forcing: float = 8.0,
              damping: float = 1.0) -> np.ndarray:
    """States at n_obs sampling times (every ``every`` RK4 steps), starting with x0: (batch, n_obs, N)."""
    x = np.array(x0, dtype=np.float64)
    out = np.empty(x.shape[:-1] + (n_obs, x.shape[-1]))
    out[..., 0, :] = x
    for k in range(1, n_obs):
        for _ in range(every):
            x = rk4_step(x, dt, forcing, damping)
        out[..., k, :] = x
    return out


def coupling_graph(n: int) -> dict:
    """Edges j -> i for the variables entering dx_i/dt (excluding the self term -d x_i)."""
    edges, adj = [], np.zeros((n, n), dtype=int)
    for i in range(n):
        for off, role in ((-2, "x_{i-2}: -x_{i-2} x_{i-1}"), (-1, "x_{i-1}: (x_{i+1} - x_{i-2}) x_{i-1}"),
                          (1, "x_{i+1}: x_{i+1} x_{i-1}")):
            j = (i + off) % n
            edges.append({"source": j, "target": i, "offset": off, "role": role})
            adj[i, j] = 1
    return {"n": n, "edges": edges, "adjacency": adj.tolist(), "self_loops": "every x_i has -d x_i (not listed)",
            "convention": "adjacency[i][j] = 1 if x_j appears in dx_i/dt"}


def simulate(params: dict, seed: int) -> dict:
    n, forcing = int(params.get("n_vars", 40)), float(params.get("forcing", 8.0))
    damping = float(params.get("damping", 1.0))
    dt, dt_obs = float(params.get("dt", 0.01)), float(params.get("dt_obs", 0.05))
    every = int(round(dt_obs / dt))
    if abs(every * dt - dt_obs) > 1e-9:
        raise ValueError(f"dt_obs={dt_obs} must be a multiple of dt={dt}")
    rng = np.random.default_rng(seed)
    n_traj, n_obs = int(params.get("n_traj", 1)), int(params["n_obs"])
    x0 = forcing + 0.01 * rng.standard_normal((n_traj, n))
    if forcing == 0.0:
        x0 = rng.standard_normal((n_traj, n))
    burn = int(round(float(params.get("t_burn", 10.0)) / dt_obs))
    if burn > 0:
        x0 = integrate(x0, burn + 1, dt, every, forcing, damping)[:, -1]
    clean = integrate(x0, n_obs, dt, every, forcing, damping)
    noise = float(params.get("noise_std", 0.0)) * rng.standard_normal(clean.shape)
    mask = rng.random(clean.shape) >= float(params.get("missing_rate", 0.0))
    observed = np.where(mask, clean + noise, np.nan)
    return {"clean": clean, "observed": observed, "mask": mask, "t": np.arange(n_obs) * dt_obs,
            "graph": coupling_graph(n), "every": every}


def _frame(arr: np.ndarray, t: np.ndarray):
    import pandas as pd

    n_traj, n_obs, n = arr.shape
    df = pd.DataFrame(arr.reshape(n_traj * n_obs, n), columns=[f"x{i:02d}" for i in range(n)])
    df.insert(0, "t", np.tile(t, n_traj))
    df.insert(0, "step", np.tile(np.arange(n_obs), n_traj))
    df.insert(0, "traj", np.repeat(np.arange(n_traj), n_obs))
    return df


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    sim = simulate(params, seed)
    raw_dir = Path(raw_dir)
    write_parquet(_frame(sim["clean"], sim["t"]), raw_dir / "clean.parquet")
    write_parquet(_frame(sim["observed"], sim["t"]), raw_dir / "observed.parquet")
    write_parquet(_frame(sim["mask"], sim["t"]), raw_dir / "mask.parquet")
    write_json(raw_dir / "graph.json", sim["graph"])
    return {"version": "simulator-1", "generator": "reprozoo.data.timeseries.lorenz96.simulate",
            "integrator": f"RK4, dt={params.get('dt', 0.01)}, sampled every {sim['every']} steps"}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    import shutil

    files = ["clean.parquet", "observed.parquet", "mask.parquet", "graph.json"]
    for f in files:
        shutil.copyfile(Path(raw_dir) / f, Path(out_dir) / f".{f}.tmp")
        (Path(out_dir) / f".{f}.tmp").replace(Path(out_dir) / f)
    clean = read_parquet(Path(out_dir) / "clean.parquet")
    mask = read_parquet(Path(out_dir) / "mask.parquet")
    xcols = [c for c in clean.columns if c.startswith("x")]
    n_traj = int(clean["traj"].nunique())
    return {"files": files,
            "sizes": {"n_traj": n_traj, "n_obs": len(clean) // n_traj, "n_vars": len(xcols), "rows": len(clean)},
            "frequency": f"dt_obs = {params.get('dt_obs', 0.05)} model time units (0.05 ~ 6 h in Lorenz's scaling)",
            "model": {"forcing": params.get("forcing", 8.0), "damping": params.get("damping", 1.0),
                      "dt": params.get("dt", 0.01), "t_burn": params.get("t_burn", 10.0)},
            "observation": {"noise_std": params.get("noise_std", 0.0), "missing_rate": params.get("missing_rate", 0.0),
                            "observed_fraction": float(mask[xcols].to_numpy().mean())},
            "statistics": {"mean": float(clean[xcols].to_numpy().mean()), "std": float(clean[xcols].to_numpy().std())}}


def preview(out_dir: Path, png: Path) -> None:
    plt = plt_agg()
    d = load(out_dir)
    clean, obs = d["clean"], d["observed"]
    xcols = [c for c in clean.columns if c.startswith("x")]
    c0 = clean[clean["traj"] == 0]
    o0 = obs[obs["traj"] == 0]
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    im = axes[0].imshow(c0[xcols].to_numpy().T, aspect="auto", origin="lower", cmap="RdBu_r",
                        extent=[c0["t"].iloc[0], c0["t"].iloc[-1], 0, len(xcols)])
    axes[0].set_xlabel("t"), axes[0].set_ylabel("variable"), axes[0].set_title("traj 0, clean state")
    fig.colorbar(im, ax=axes[0])
    k = min(200, len(c0))
    axes[1].plot(c0["t"].iloc[:k], c0["x00"].iloc[:k], lw=1, label="x00 clean")
    axes[1].plot(o0["t"].iloc[:k], o0["x00"].iloc[:k], ".", ms=3, label="x00 observed")
    axes[1].legend(fontsize=7), axes[1].set_xlabel("t")
    fig.suptitle(f"Lorenz-96, N={len(xcols)}; coupling edges i-2, i-1, i+1 -> i")
    save_figure(fig, png, dpi=85)


def load(out_dir: Path) -> dict:
    """{"clean", "observed", "mask": DataFrames (traj, step, t, x00..), "graph": dict, "adjacency": array}."""
    out_dir = Path(out_dir)
    graph = json.loads((out_dir / "graph.json").read_text())
    return {"clean": read_parquet(out_dir / "clean.parquet"), "observed": read_parquet(out_dir / "observed.parquet"),
            "mask": read_parquet(out_dir / "mask.parquet"), "graph": graph,
            "adjacency": np.array(graph["adjacency"])}
