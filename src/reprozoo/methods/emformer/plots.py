"""Figures of the emformer page, from the long table only: skill vs lead time (seed bands) and
forecast-vs-truth streamfunction maps."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .method import VARIABLES, snapshot_leads
from reprozoo.figures import save_figure

LABELS = {"psi": "streamfunction ψ", "zeta": "vorticity ζ"}
COLORS = {"emformer": "C0", "rollout_ft": "C1", "placebo_ft": "C2", "pretrained": "C7", "persistence": "k"}
# context_ar2 (the positive control) forecasts another field: not drawn with the QG variants


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_skill(table, plots_dir: Path, metric: str, ylabel: str, question: str, window=None) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(VARIABLES), figsize=(10, 3.8))
    for ax, var in zip(axes, VARIABLES):
        sub = table[table.metric == f"{metric}_{var}"]
        for v in COLORS:
            d = sub[sub.variant == v]
            if d.empty:
                continue
            g = d.pivot_table(index="x", columns="seed", values="value")
            m, lo, hi = g.mean(axis=1), g.min(axis=1), g.max(axis=1)
            ax.plot(g.index, m, color=COLORS[v], label=f"{v} (n={g.shape[1]})")
            ax.fill_between(g.index, lo, hi, color=COLORS[v], alpha=0.2)
        if metric == "activity":  # the truth's anomaly activity at the same verifying times
            d = table[(table.metric == f"activity_{var}_truth") & (table.variant == "persistence")]
            if not d.empty:
                g = d.pivot_table(index="x", columns="seed", values="value")
                ax.plot(g.index, g.mean(axis=1), color="k", ls="--", label="truth")
        if window is not None:
            ax.axvspan(window[0] - 0.5, window[1] + 0.5, color="0.9", zorder=0, label="claim window")
        ax.set_xlabel("lead (steps of 0.5 model time units)")
        ax.set_ylabel(ylabel)
        ax.set_title(LABELS[var])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(question + " (line: seed mean, band: min-max over seeds)")
    save_figure(fig, plots_dir / f"skill_{metric}.png", dpi=110)


def plot_snapshots(table, plots_dir: Path, params: dict) -> None:
    plt = _plt()
    ny, nx = params["sim"]["ny"], params["sim"]["nx"]
    leads = snapshot_leads(params["eval"]["leads"])
    seed = table.seed.min()
    rows = [v for v in ("emformer", "rollout_ft") if not table[(table.variant == v)
                                                                & (table.metric == f"snap_psi_lead{leads[0]}_forecast")].empty]
    if not rows:
        return
    fig, axes = plt.subplots(len(rows) + 1, len(leads), figsize=(3.4 * len(leads), 1.9 * (len(rows) + 1)),
                             squeeze=False)
    dt = params["sim"]["dt_save"]

    def field(v, k, which):
        d = table[(table.variant == v) & (table.seed == seed) & (table.metric == f"snap_psi_lead{k}_{which}")]
        return d.sort_values("x").value.to_numpy().reshape(ny, nx)

    for j, k in enumerate(leads):
        truth = field(rows[0], k, "truth")
        lim = np.abs(truth).max()
        panels = [("truth", truth)] + [(v, field(v, k, "forecast")) for v in rows]
        for i, (name, f) in enumerate(panels):
            ax = axes[i, j]
            im = ax.imshow(f, origin="lower", cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="equal")
            ax.set_title(f"{name}, lead {k} ({k * dt:g} time units)", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.colorbar(im, ax=axes[:, j].tolist(), shrink=0.8, label="ψ (std units)")
    fig.suptitle(f"Does the forecast keep the truth's structures as lead grows? (ψ, first test state, seed {seed})")
    fig.savefig(plots_dir / "forecast_vs_truth.png", dpi=110)
    plt.close(fig)


def plot_all(table, plots_dir, params) -> None:
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    window = params["eval"]["window"]
    plot_skill(table, plots_dir, "rmse", "latitude-weighted RMSE (std units)",
               "Does accumulative context lower RMSE?", window)
    plot_skill(table, plots_dir, "acc", "latitude-weighted ACC (1)",
               "Does accumulative context keep anomaly correlation in the skill window?", window)
    plot_skill(table, plots_dir, "activity", "forecast anomaly activity (std units)",
               "Is a forecast damped towards climatology? (truth dashed)", window)
    plot_snapshots(table, plots_dir, params)
