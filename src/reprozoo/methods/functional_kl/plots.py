"""Figures of the functional-KL miniature, read from the long metrics table only.

* trajectories.png - do the inferred paths look like the SDE's? One panel per TI method: sample
  paths of the branch coordinate X against time, the held-out snapshot (true particles at the
  held-out time, grey) and the method's particles at that time (red), side by side.
* kl_benchmark.png - does the estimated path KL match the reference? Estimate vs closed-form
  Girsanov KL (linear suite) and vs the known KL of the bifurcating chains (non-Gaussian suite), per
  case and seed, both estimators, with the +-10 % band.
* rankings.png - do held-out W1 and path KL rank the TI methods alike? Mean and seed range of
  each metric per method, with the rank written on each bar.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

TI_ORDER = ("true_sde", "linear_interp", "ot_linear", "ot_bridge", "flow_matching")
COLORS = {"true_sde": "k", "linear_interp": "tab:orange", "ot_linear": "tab:blue", "ot_bridge": "tab:green",
          "flow_matching": "tab:purple", "fkl_plain": "tab:red", "fkl_crossfit": "tab:blue"}


def _curve(table, metric, variant, seed):
    rows = table[(table.metric == metric) & (table.variant == variant) & (table.seed == seed)].sort_values("x")
    return rows.x.to_numpy(float), rows.value.to_numpy(float)


def _scalar(table, metric, variant):
    rows = table[(table.metric == metric) & (table.variant == variant) & table.x.isna()]
    return rows.sort_values("seed").value.to_numpy(float)


def plot_trajectories(table, plots_dir: Path, params: dict) -> None:
    import matplotlib.pyplot as plt

    variants = [v for v in TI_ORDER if v in set(table.variant)]
    if not variants:
        return
    seed = int(table.seed.min())
    held = float(params.get("ti", {}).get("heldout", 0.5))
    fig, axes = plt.subplots(1, len(variants), figsize=(3.2 * len(variants), 3.4), sharex=True, sharey=True)
    axes = np.atleast_1d(axes)
    _, snap = _curve(table, "heldout_snap_x", "true_sde", seed)
    rng = np.random.default_rng(0)
    for ax, v in zip(axes, variants):
        xs, px = _curve(table, "traj_x", v, seed)
        path_id = np.floor(xs / 2 + 1e-9).astype(int)
        for i in np.unique(path_id):
            m = path_id == i
            ax.plot(xs[m] - 2 * i, px[m], color=COLORS.get(v, "C0"), lw=0.6, alpha=0.6)
        if len(snap):
            ax.scatter(held - 0.03 + 0.02 * rng.random(len(snap)), snap, s=2, color="0.5",
                       label=f"true snapshot t={held:g} (held out)", zorder=3)
        _, hx = _curve(table, "heldout_pred_x", v, seed)
        ax.scatter(held + 0.01 + 0.02 * rng.random(len(hx)), hx, s=2, color="tab:red",
                   label=f"method at t={held:g}", zorder=3)
        ax.axvline(held, color="tab:red", ls=":", lw=0.8)
        ax.set_title(v, fontsize=10)
        ax.set_xlabel("time t")
    axes[0].set_ylabel("branch coordinate X (dimensionless)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Do the inferred trajectories follow the bifurcating SDE? (seed {seed}, held-out time dotted)")
    save_figure(fig, plots_dir / "trajectories.png", dpi=120)


def plot_benchmark(table, plots_dir: Path, params: dict) -> None:
    import matplotlib.pyplot as plt

    b = params.get("benchmark", {})
    suites = [("linear SDEs (Gaussian)", b.get("cases") or [], "kl_closed", "closed-form (Girsanov) path KL [nats]"),
              ("bifurcating chains (non-Gaussian)", (b.get("nonlinear") or {}).get("cases") or [], "kl_known",
               "known KL (discrete Girsanov, Monte Carlo) [nats]")]
    ests = [v for v in ("fkl_plain", "fkl_crossfit") if v in set(table.variant)]
    suites = [s for s in suites if s[1]]
    if not ests or not suites:
        return
    fig, axes = plt.subplots(1, len(suites), figsize=(5.4 * len(suites), 5))
    for ax, (title, cases, ref, xlabel) in zip(np.atleast_1d(axes), suites):
        hi = 0.0
        for v in ests:
            for k, case in enumerate(cases):
                est, truth = _scalar(table, f"kl_est_{case}", v), _scalar(table, f"{ref}_{case}", v)
                if not len(est):
                    continue
                hi = max(hi, est.max(), truth.max())
                ax.scatter(truth, est, color=COLORS[v], marker="osD^v"[k % 5], s=28, label=f"{v}: {case}", alpha=0.8)
        grid = np.linspace(0, hi * 1.1, 50)
        ax.plot(grid, grid, "k-", lw=0.8, label="estimate = reference")
        ax.fill_between(grid, 0.9 * grid, 1.1 * grid, color="0.85", label="+-10 %")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("estimated FKL [nats]")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle("Does the FKL estimate match the reference KL? (one point per case and seed; "
                 "regressor chosen on held-out paths)", fontsize=10)
    save_figure(fig, plots_dir / "kl_benchmark.png", dpi=120)


def plot_rankings(table, plots_dir: Path, params: dict) -> None:
    import matplotlib.pyplot as plt

    variants = [v for v in TI_ORDER if len(_scalar(table, "w1_heldout", v))]
    if not variants:
        return
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    specs = [("w1_heldout", "held-out W1 (position units)", False),
             ("path_kl", "path KL(true || method) [nats]", True),
             ("path_kl_reverse", "path KL(method || true) [nats]", True)]
    for ax, (metric, label, log) in zip(axes, specs):
        vals = [_scalar(table, metric, v) for v in variants]
        means = np.array([np.mean(x) for x in vals])
        order = np.argsort(np.argsort(means)) + 1
        pos = np.arange(len(variants))
        shown = np.maximum(means, 1e-3) if log else means
        ax.bar(pos, shown, color=[COLORS[v] for v in variants])
        for i, x in enumerate(vals):
            ax.plot([i] * len(x), np.maximum(x, 1e-3) if log else x, "k.", ms=4)
            ax.text(i, shown[i], f"#{order[i]}", ha="center", va="bottom", fontsize=9)
        if log:
            ax.set_yscale("log")
        ax.set_xticks(pos, variants, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
    fig.suptitle("Do held-out W1 and path KL rank the trajectory-inference methods alike? "
                 "(bars: mean over seeds, dots: seeds, #: rank; KL below 1e-3 drawn at 1e-3)")
    save_figure(fig, plots_dir / "rankings.png", dpi=120)


def make_plots(table, plots_dir: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    plots_dir.mkdir(parents=True, exist_ok=True)
    plot_trajectories(table, plots_dir, params)
    plot_benchmark(table, plots_dir, params)
    plot_rankings(table, plots_dir, params)
