"""Plots every method gets for free: each curve metric per variant (mean +- std over seeds)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from reprozoo.figures import save_figure


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def curve_plot(table: pd.DataFrame, metric: str, path: Path, logx: bool = False, logy: bool = False,
               xlabel: str = "x", ylabel: str | None = None, title: str | None = None, variants=None) -> Path:
    p = plt()
    fig, ax = p.subplots(figsize=(5.5, 4))
    sub = table[table.metric == metric]
    for v in variants or sorted(sub.variant.unique()):
        g = sub[sub.variant == v].groupby("x").value
        mean, std = g.mean(), g.std().fillna(0.0)
        if mean.empty:
            continue
        ax.plot(mean.index, mean.values, marker="o", ms=3, label=v)
        if (std > 0).any():
            lo = np.maximum(mean - std, mean * 1e-3) if logy else mean - std
            ax.fill_between(mean.index, lo, mean + std, alpha=0.15)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel or metric)
    ax.set_title(title or metric)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110)
    return path


def generic_plots(table: pd.DataFrame, plots_dir: Path, spec, only=None) -> None:
    """One figure per curve metric (unless the method drew it) and a bar chart of scalars.

    ``only``: a method's ``GENERIC_CURVES``, the curve metrics to draw (default: all), for methods
    that record raw arrays as curves that no reader wants as a figure. As a dict it also names the
    axes, ``{"val_loss": ("training step", "validation MSE")}``, so that the figure has units; a
    list (or no declaration) leaves the x axis labelled by the metric's name only."""
    curves = table[table.x.notna() & ~table.metric.str.endswith("#unit")]
    axes = dict(only) if isinstance(only, dict) else {}
    for metric in sorted(curves.metric.unique()):
        if only is not None and metric not in set(only):
            continue
        out = plots_dir / f"curve_{metric}.png"
        if out.exists():
            continue
        vals = curves[curves.metric == metric].value
        logy = bool((vals > 0).all() and vals.max() / max(vals.min(), 1e-300) > 100)
        xlabel, ylabel = axes.get(metric, (f"x of {metric}", metric))
        curve_plot(curves, metric, out, logy=logy, xlabel=xlabel, ylabel=ylabel)
    scalars = table[table.x.isna() & (table.metric != "wall_seconds")]
    if scalars.empty:
        return
    metrics = sorted(scalars.metric.unique())[:12]
    p = plt()
    fig, axes = p.subplots(len(metrics), 1, figsize=(6, 1.6 * len(metrics) + 0.5), squeeze=False)
    for ax, m in zip(axes[:, 0], metrics):
        g = scalars[scalars.metric == m].groupby("variant").value
        mean, std = g.mean(), g.std().fillna(0.0)
        ax.barh(mean.index, mean.values, xerr=std.values, color="tab:blue", alpha=0.7)
        ax.set_title(m, fontsize=8)
        ax.tick_params(labelsize=7)
    save_figure(fig, plots_dir / "scalars.png", dpi=100)
