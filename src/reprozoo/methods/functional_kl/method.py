"""Functional KL in miniature: validate the path-space KL estimator, then rank trajectory inference.

Variants and what each cell computes:

* ``fkl_plain`` (method, the paper's estimator) and ``fkl_crossfit`` (method, ours: the same fits
  on two halves, inner product instead of square, see fkl.py): on the linear-SDE benchmark suite
  (``benchmark_cases``), draw ``n_paths`` exact paths of P and of Q on a grid of ``grid_points``
  times in [0, 1], estimate KL(P || Q) and compare it with the closed-form Girsanov path KL
  (linear_sde.py). Metrics: ``kl_est_<case>``, ``kl_closed_<case>``, ``kl_grid_<case>`` (exact KL of
  the grid marginals: the best a grid estimator can do), ``rel_err_<case>`` = |est/closed - 1|,
  ``max_rel_err`` over the suite, and ``null_kl`` (estimate between two samples of ONE law: the
  estimator's bias at KL = 0).
* ``true_sde``, ``linear_interp``, ``ot_linear``, ``ot_bridge``, ``flow_matching`` (baselines: the
  trajectory-inference methods being evaluated, trajectory.py): from snapshots of the bifurcating
  SDE (bifurcation.py) at the observed times (held-out time removed) infer n paths on the path
  grid; score them by ``w1_heldout`` (exact W1, POT, between the method's particles at the held-out
  time and the held-out snapshot) and by ``path_kl`` = FKL(true path law || method's path law)
  (``path_kl_reverse`` the other direction), with the crossfit estimator validated above.

Shared per seed (train_shared): the snapshots (independent particles per time) and ``n_ref`` fresh
reference paths of the true SDE, in shared_dir/data.npz.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...io import save_npz
from .bifurcation import BifurcatingSDE
from .fkl import FKL, FKLConfig, Whitener, functional_kl, lambda_nodes
from .linear_sde import LinearSDE, gaussian_kl, girsanov_kl

BENCHMARK_VARIANTS = ("fkl_plain", "fkl_crossfit")
TI_VARIANTS = ("true_sde", "linear_interp", "ot_linear", "ot_bridge", "flow_matching")


# --- the linear-SDE benchmark ------------------------------------------------------------------

def benchmark_suite() -> dict[str, tuple[LinearSDE, LinearSDE]]:
    """Pairs (P, Q) with equal sigma and initial law: Girsanov gives KL(P || Q) in closed form."""
    rot = np.array([[-1.0, -1.0], [1.0, -1.0]])
    start2 = (np.array([2.0, 0.0]), 0.01 * np.eye(2))
    return {
        # Brownian motion with drift 1.5 vs without: KL = a^2 T / (2 sigma^2) = 1.125
        "bm_drift": (LinearSDE.ou(0.0, drift=1.5), LinearSDE.ou(0.0)),
        # OU (rate 2, mean 0) from x0 = 1 vs Brownian motion from x0 = 1
        "ou_vs_bm": (LinearSDE.ou(2.0, 0.0, m0=1.0), LinearSDE.ou(0.0, 0.0, m0=1.0)),
        # OU rates 1 vs 3 around mean 0.5 from x0 = -0.5 (differs in the fluctuations too)
        "ou_rates": (LinearSDE.ou(1.0, 0.5, m0=-0.5), LinearSDE.ou(3.0, 0.5, m0=-0.5)),
        # OU (rate 2) reverting to +1 vs to -0.5
        "ou_means": (LinearSDE.ou(2.0, 1.0), LinearSDE.ou(2.0, -0.5)),
        # 2-D OU with a rotational drift vs the same decay without rotation, from (2, 0)
        "ou2d_rotation": (LinearSDE(rot, np.zeros(2), 1.0, *start2), LinearSDE(-np.eye(2), np.zeros(2), 1.0, *start2)),
    }


def _whitener(ts: np.ndarray, sigma: float, p: dict) -> Whitener:
    """Matern-1/2 reference covariance whose local increments match the SDE's (2 var h / l = sigma^2 h)."""
    length = float(p.get("kernel_length", 1.0))
    return Whitener.from_grid(ts, length, sigma**2 * length / 2.0)


def run_benchmark(ctx, estimator: str) -> None:
    p = ctx.params
    b = p["benchmark"]
    cfg = FKLConfig.from_params({**p["fkl"], "estimator": estimator})
    ts = np.linspace(0.0, 1.0, int(b["grid_points"]))
    suite = benchmark_suite()
    cases = b.get("cases") or list(suite)
    rels, ests, closed = [], [], []
    for k, name in enumerate(cases):
        P, Q = suite[name]
        rng = ctx.rng(10 + k)  # the same paths for both estimators: a paired comparison
        xp, xq = P.sample_paths(ts, int(b["n_paths"]), rng), Q.sample_paths(ts, int(b["n_paths"]), rng)
        W = _whitener(ts, P.sigma, p)
        t0 = time.perf_counter()
        est = functional_kl(xp, xq, W, cfg, ctx.rng(1000 + k))
        kl_c = girsanov_kl(P, Q)
        kl_g = gaussian_kl(*P.grid_gaussian(ts), *Q.grid_gaussian(ts))
        rel = abs(est / kl_c - 1.0)
        ctx.metrics.scalar(f"kl_est_{name}", est)
        ctx.metrics.scalar(f"kl_closed_{name}", kl_c)
        ctx.metrics.scalar(f"kl_grid_{name}", kl_g)
        ctx.metrics.scalar(f"rel_err_{name}", rel)
        rels.append(rel)
        ests.append(est)
        closed.append(kl_c)
        ctx.progress(f"{name}: closed {kl_c:.3f} grid {kl_g:.3f} est {est:.3f} ({time.perf_counter() - t0:.1f}s)")
    ctx.metrics.scalar("max_rel_err", max(rels))
    ctx.metrics.scalar("mean_rel_err", float(np.mean(rels)))
    ctx.metrics.curve("kl_est", range(len(cases)), ests)
    ctx.metrics.curve("kl_closed", range(len(cases)), closed)
    # bias at KL = 0: two independent samples of the first case's P
    P = suite[cases[0]][0]
    rng = ctx.rng(99)
    xa, xb = P.sample_paths(ts, int(b["n_paths"]), rng), P.sample_paths(ts, int(b["n_paths"]), rng)
    ctx.metrics.scalar("null_kl", functional_kl(xa, xb, _whitener(ts, P.sigma, p), cfg, ctx.rng(98)))


# --- trajectory inference on the bifurcating SDE -------------------------------------------------

def _sde(p: dict) -> BifurcatingSDE:
    return BifurcatingSDE(**p["sde"])


def _grid(p: dict) -> np.ndarray:
    return np.linspace(0.0, 1.0, int(p["ti"]["grid_points"]))


def train_shared(ctx) -> None:
    p = ctx.params
    ti = p["ti"]
    sde, rng = _sde(p), ctx.rng(0)
    times = sorted(set(ti["observed"]) | {ti["heldout"]})
    snaps = sde.snapshots(times, int(ti["n_particles"]), rng)
    ref = sde.simulate(sde.initial(int(ti["n_ref"]), rng), _grid(p), rng)
    save_npz(Path(ctx.shared_dir) / "data.npz", ref=ref, times=np.array(times),
             **{f"snap_{k}": snaps[t] for k, t in enumerate(times)})


def _load(shared_dir: Path) -> tuple[dict[float, np.ndarray], np.ndarray]:
    d = np.load(Path(shared_dir) / "data.npz")
    snaps = {float(t): d[f"snap_{k}"] for k, t in enumerate(d["times"])}
    return snaps, d["ref"]


def w1(x: np.ndarray, y: np.ndarray) -> float:
    """Exact 1-Wasserstein distance between two point clouds (POT network simplex, Euclidean cost)."""
    import ot

    a, b = np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y))
    return float(ot.emd2(a, b, ot.dist(x, y, metric="euclidean"), numItermax=10_000_000))


def infer_paths(ctx, variant: str, snaps: dict[float, np.ndarray], grid: np.ndarray) -> np.ndarray:
    from .trajectory import coupled_paths, flow_matching_paths, ot_pairs, train_flow_matching

    p = ctx.params
    observed = sorted(float(t) for t in p["ti"]["observed"])
    sde, rng = _sde(p), ctx.rng(1 + TI_VARIANTS.index(variant))
    x0 = snaps[observed[0]]
    if variant == "true_sde":
        return sde.simulate(x0, grid, rng)
    if variant in ("linear_interp", "ot_linear", "ot_bridge"):
        return coupled_paths(snaps, grid, observed, variant, sde.sigma, rng)
    if variant == "flow_matching":
        import torch

        torch.set_num_threads(max(1, ctx.threads))
        fm = p["flow_matching"]
        t0 = time.perf_counter()
        net, steps, train_curve, val_curve = train_flow_matching(ot_pairs(snaps, observed), fm, ctx.seed, ctx.progress)
        ctx.metrics.scalar("fm_train_seconds", time.perf_counter() - t0)
        ctx.metrics.curve("fm_train_loss", steps, train_curve)
        ctx.metrics.curve("fm_val_loss", steps, val_curve)
        ctx.metrics.scalar("fm_final_val_loss", val_curve[-1])
        # final slope of the validation curve over its last quarter, per 1000 steps
        q = max(2, len(steps) // 4)
        ctx.metrics.scalar("fm_val_slope_per_1k", float(np.polyfit(steps[-q:], val_curve[-q:], 1)[0] * 1000))
        with torch.no_grad():
            return flow_matching_paths(net, x0, grid, int(fm["ode_steps_per_interval"]))
    raise ValueError(f"unknown variant '{variant}'")


def run_trajectory_inference(ctx) -> None:
    p = ctx.params
    ti = p["ti"]
    snaps, ref = _load(ctx.shared_dir)
    grid, held = _grid(p), float(ti["heldout"])
    h = int(np.argmin(np.abs(grid - held)))
    t0 = time.perf_counter()
    paths = infer_paths(ctx, ctx.variant, snaps, grid)
    ctx.metrics.scalar("infer_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("w1_heldout", w1(paths[:, h], snaps[held]))
    last = max(float(t) for t in ti["observed"])
    ctx.metrics.scalar("w1_last_observed", w1(paths[:, -1], snaps[last]))
    # path KL with the estimator validated on the benchmark; one reference fit per seed (same rng)
    cfg = FKLConfig.from_params({**p["fkl"], "estimator": ti.get("estimator", "crossfit")})
    t0 = time.perf_counter()
    fkl = FKL(ref, _whitener(grid, _sde(p).sigma, p), cfg, ctx.rng(500))
    out = fkl.kl(paths)
    ctx.metrics.scalar("fkl_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("path_kl", out["forward"])
    ctx.metrics.scalar("path_kl_reverse", out["reverse"])
    lams, _ = lambda_nodes(cfg)
    ctx.metrics.curve("path_kl_integrand", lams, out["integrand_forward"])
    ctx.progress(f"W1(held-out) {ctx.metrics.scalars['w1_heldout']:.4f}  path KL {out['forward']:.3f} "
                 f"reverse {out['reverse']:.3f}")
    # a few trajectories for the figure: x = 2 i + t (path i, time t), and the held-out snapshot
    n_show = min(int(p.get("plot_paths", 40)), len(paths))
    xs = (2 * np.arange(n_show)[:, None] + grid[None, :]).ravel()
    ctx.metrics.curve("traj_x", xs, paths[:n_show, :, 0].ravel())
    ctx.metrics.curve("traj_y", xs, paths[:n_show, :, 1].ravel())
    n_pts = min(300, len(paths))
    ctx.metrics.curve("heldout_pred_x", range(n_pts), paths[:n_pts, h, 0])
    ctx.metrics.curve("heldout_pred_y", range(n_pts), paths[:n_pts, h, 1])
    if ctx.variant == "true_sde":
        ctx.metrics.curve("heldout_snap_x", range(n_pts), snaps[held][:n_pts, 0])
        ctx.metrics.curve("heldout_snap_y", range(n_pts), snaps[held][:n_pts, 1])


def train(ctx) -> None:
    if ctx.variant in BENCHMARK_VARIANTS:
        return run_benchmark(ctx, ctx.variant.removeprefix("fkl_"))
    if ctx.variant in TI_VARIANTS:
        return run_trajectory_inference(ctx)
    raise ValueError(f"unknown variant '{ctx.variant}': expected one of {BENCHMARK_VARIANTS + TI_VARIANTS}")


def plot(table, plots_dir, params) -> None:
    from .plots import make_plots

    make_plots(table, Path(plots_dir), params)
