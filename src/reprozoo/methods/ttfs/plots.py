"""Figures of the TTFS miniature, all read from the long results table.

raster_<ds>.png       one test example's spikes (step vs unit) of the full framework
latency_hist_<ds>.png first-spike latency distribution with and without the temporal decoder
acc_ablation.png      test accuracy per ablation step, both datasets, every seed and mean ± std
count_hist.png        spikes per sending unit per example (the single-spike rule, measured)
curve_val_acc_<ds>.png validation accuracy per evaluation, mean ± std over seeds (training speed, stability)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

ORDER = ["plain", "init", "init_norm", "full"]
LABELS = {"plain": "plain", "init": "+init", "init_norm": "+init\n+norm", "full": "+init+norm\n+decoder"}


def _curve(table, metric, variant, seed=None):
    sub = table[(table.metric == metric) & (table.variant == variant)]
    if seed is not None:
        sub = sub[sub.seed == seed]
    return sub


def draw_all(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    p = plt()
    datasets = list(params.get("datasets", ["digits", "glyphs"]))
    T = int(params.get("T", 8))
    seed0 = int(sorted(table.seed.unique())[0]) if len(table) else 0
    for ds in datasets:
        # raster
        fig, ax = p.subplots(figsize=(5, 4))
        u = _curve(table, f"raster_unit_{ds}", "full", seed0).sort_values("x")
        tt = _curve(table, f"raster_time_{ds}", "full", seed0).sort_values("x")
        if len(u):
            ax.scatter(tt.value.values, u.value.values, s=4, marker="|", color="k")
        ax.set_xlim(-0.5, T - 0.5)
        ax.set_xlabel("time step t")
        ax.set_ylabel("unit index (hidden IF neurons, layer 1 first)")
        ax.set_title(f"When does each neuron fire for one {ds} test example? (full, seed {seed0})", fontsize=9)
        save_figure(fig, plots_dir / f"raster_{ds}.png", dpi=110)
        # latency histogram, decoder vs none
        fig, ax = p.subplots(figsize=(5.5, 4))
        w = 0.4
        for k, (v, lab) in enumerate([("init_norm", "no decoder (init_norm)"), ("full", "temporal decoder (full)")]):
            sub = table[(table.metric == f"latency_hist_{ds}") & (table.variant == v)]
            if sub.empty:
                continue
            g = sub.groupby("x").value
            lat = table[(table.metric == f"latency_all_{ds}") & (table.variant == v)].value
            dec = table[(table.metric == f"decision_{ds}") & (table.variant == v)].value
            ax.bar(g.mean().index + (k - 0.5) * w, g.mean().values, w, yerr=g.std().fillna(0).values,
                   label=f"{lab}: mean latency (silent = T) {lat.mean():.2f}, decision time {dec.mean():.2f} steps",
                   alpha=0.8)
        ax.set_xlabel("first-spike time of hidden neurons (time steps)")
        ax.set_ylabel("fraction of first spikes (test set, mean ± std over seeds)")
        ax.set_title(f"Does the temporal decoder make neurons fire earlier? ({ds})", fontsize=10)
        ax.legend(fontsize=7)
        save_figure(fig, plots_dir / f"latency_hist_{ds}.png", dpi=110)
        curve_plot(table, f"val_acc_{ds}", plots_dir / f"curve_val_acc_{ds}.png", xlabel="training step",
                   ylabel="validation accuracy (fraction)", variants=[v for v in ORDER if v in set(table.variant)],
                   title=f"How fast and how stably does each variant train? ({ds}, mean ± std over seeds)")
    # accuracy per ablation
    fig, axes = p.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        sub = table[table.metric == f"acc_{ds}"]
        vs = [v for v in ORDER if v in set(sub.variant)]
        for i, v in enumerate(vs):
            vals = sub[sub.variant == v].value.values
            ax.bar(i, vals.mean(), yerr=vals.std(ddof=1) if len(vals) > 1 else 0, color="C0" if v != "full" else "C3",
                   alpha=0.6, capsize=3)
            ax.scatter(np.full(len(vals), i), vals, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(vs)))
        ax.set_xticklabels([LABELS[v] for v in vs], fontsize=7)
        if len(sub):
            ax.set_ylim(max(0.0, sub.value.min() - 0.1), min(1.0, sub.value.max() + 0.05))
        ax.set_ylabel("test accuracy (fraction; bars mean ± std, dots seeds)")
        ax.set_title(f"Which ingredient buys accuracy? ({ds})", fontsize=10)
    save_figure(fig, plots_dir / "acc_ablation.png", dpi=110)
    # spikes per sending unit (avg pooling: the IF neurons), measured on the test set
    fig, ax = p.subplots(figsize=(5.5, 4))
    for k, ds in enumerate(datasets):
        sub = table[(table.metric == f"count_hist_{ds}") & (table.variant == "full")]
        if sub.empty:
            continue
        g = sub.groupby("x").value.mean()
        ax.bar(g.index + (k - 0.5) * 0.4, np.maximum(g.values, 1e-5), 0.4, label=f"full, {ds}")
    ax.axvline(1.5, color="r", ls=":", lw=1, label="single-spike limit")
    ax.set_yscale("log")
    ax.set_xlabel("spikes sent by one unit for one example")
    ax.set_ylabel("fraction of (unit, example) pairs (test set, mean over seeds)")
    ax.set_title("Does any sending unit fire more than once? (average pooling)", fontsize=10)
    ax.legend(fontsize=7)
    save_figure(fig, plots_dir / "count_hist.png", dpi=110)
