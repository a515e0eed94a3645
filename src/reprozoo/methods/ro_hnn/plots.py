"""Figures: energy over the long horizon, state error on log scale with seed bands, a snapshot.

Every figure reads the long table only (columns method, variant, seed, metric, x, value).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

ORDER = ["ro_hnn", "psd_hnn", "ae_node"]
COLORS = {"ro_hnn": "tab:red", "psd_hnn": "tab:blue", "ae_node": "tab:green"}


def _variants(table):
    present = set(table.variant.unique())
    return [v for v in ORDER if v in present]


def _one(table, metric, variant, seed):
    sub = table[(table.metric == metric) & (table.variant == variant) & (table.seed == seed)].sort_values("x")
    return sub.x.to_numpy(), sub.value.to_numpy()


def _band(ax, table, metric, variant, t_train):
    sub = table[(table.metric == metric) & (table.variant == variant)]
    if sub.empty:
        return
    wide = sub.pivot_table(index="x", columns="seed", values="value")
    x, m = wide.index.to_numpy() / t_train, wide.mean(1).to_numpy()
    ax.plot(x, m, color=COLORS[variant], label=f"{variant} (mean of {wide.shape[1]} seeds)")
    if wide.shape[1] > 1:
        ax.fill_between(x, wide.min(1), wide.max(1), color=COLORS[variant], alpha=0.2, lw=0)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pyplot = plt()
    plots_dir = Path(plots_dir)
    t_train = float(params.get("t_train", 1.0))
    variants = _variants(table)
    if not variants:
        return
    seed = int(table.seed.min())

    fig, axes = pyplot.subplots(1, 2, figsize=(11, 4))
    x, e = _one(table, "energy_ratio_true", variants[0], seed)
    axes[0].plot(x / t_train, e, color="k", lw=2, label="leapfrog reference")
    for v in variants:
        x, e = _one(table, "energy_ratio", v, seed)
        axes[0].plot(x / t_train, e, color=COLORS[v], label=v)
    axes[0].set(xlabel="time / training horizon T", ylabel="H(x(t)) / H(x(0))  (true FPU energy)",
                title=f"one held-out trajectory (seed {seed})")
    for v in variants:
        _band(axes[1], table, "energy_err", v, t_train)
    axes[1].set(xlabel="time / training horizon T", ylabel="|H(x_hat) - H0| / H0", yscale="log",
                title="mean over held-out trajectories (band: seed min-max)")
    for ax in axes:
        ax.axvline(1.0, color="grey", ls=":", lw=1)
        ax.legend(fontsize=8)
    fig.suptitle("Does the decoded prediction keep the chain's energy over 10x the training horizon?")
    fig.savefig(plots_dir / "curve_energy_ratio.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)

    fig, ax = pyplot.subplots(figsize=(6.5, 4.2))
    for v in variants:
        _band(ax, table, "state_err", v, t_train)
    ax.axvline(1.0, color="grey", ls=":", lw=1, label="end of training horizon")
    ax.set(xlabel="time / training horizon T", ylabel="relative state error (RMS-scaled q and p)", yscale="log",
           title="Which reduced model tracks the 100-dim FPU chain longest?")
    ax.legend(fontsize=8)
    fig.savefig(plots_dir / "curve_state_err.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)

    fig, ax = pyplot.subplots(figsize=(7, 4))
    i, q = _one(table, "snapshot_q_true", variants[0], seed)
    ax.plot(i, q, color="k", lw=2.5, label="leapfrog reference")
    for v in variants:
        i, q = _one(table, "snapshot_q", v, seed)
        ax.plot(i, q, color=COLORS[v], marker=".", ms=3, label=v)
    ax.set(xlabel="oscillator index i", ylabel="displacement q_i (lattice units)",
           title=f"Chain displacement at t = 10T: true vs predicted (seed {seed}, trajectory 0)")
    ax.legend(fontsize=8)
    fig.savefig(plots_dir / "curve_snapshot_q.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)
