"""Figures: surrogate shapes, accuracy / sharpness / gradient consistency per variant (seed points
and mean +- std), firing rate per layer, training curves."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

DATASETS = (("digits", "sklearn digits 8x8"), ("mnist1d", "procedural MNIST-1D"))
ORDER = ["a2sg", "a2sg_symmetric", "rectangular", "sigmoid", "arctan"]


def _save(p, fig, title: str, path: Path) -> None:
    fig.suptitle(title)
    save_figure(fig, path, dpi=110)


def _variants(table):
    present = list(table.variant.unique())
    return [v for v in ORDER if v in present] + sorted(v for v in present if v not in ORDER)


def _scalar_panels(table, metric: str, ylabel: str, title: str, path: Path) -> None:
    from ...plotting import plt

    p = plt()
    fig, axes = p.subplots(1, 2, figsize=(10, 4))
    variants = _variants(table)
    for ax, (ds, label) in zip(axes, DATASETS):
        sub = table[(table.metric == f"{metric}_{ds}") & table.x.isna()]
        for i, v in enumerate(variants):
            vals = sub[sub.variant == v].value.to_numpy()
            if len(vals) == 0:
                continue
            ax.bar(i, vals.mean(), yerr=vals.std(ddof=1) if len(vals) > 1 else 0, color=f"C{i}", alpha=0.6, capsize=3)
            ax.plot(np.full(len(vals), i), vals, "k.", ms=5)
        ax.set_xticks(range(len(variants)), variants, rotation=30)
        ax.set_ylabel(ylabel)
        ax.set_title(label)
        if len(sub):
            lo, hi = sub.value.min(), sub.value.max()
            ax.set_ylim(lo - 0.3 * (hi - lo + 1e-9), hi + 0.3 * (hi - lo + 1e-9))
        ax.grid(alpha=0.3, axis="y")
    _save(p, fig, title + " (bars: mean +- std over seeds, dots: seeds)", path)


def _shapes(table, params: dict, path: Path) -> None:
    """g(x) of every fixed surrogate and of A2SG's adapted window at the start and end of training."""
    import torch

    from ...blocks.spiking import SURROGATES
    from ...plotting import plt
    from .surrogates import asymmetric_window

    p = plt()
    x = torch.linspace(-2.5, 2.5, 1001)
    fig, axes = p.subplots(1, 2, figsize=(11, 4))
    sur = params.get("surrogates", {})
    for ax, (ds, label) in zip(axes, DATASETS):
        for name in ("rectangular", "sigmoid", "arctan"):
            cfg = dict(sur.get(name, {"kind": name}))
            g = SURROGATES[cfg.pop("kind")](**cfg)
            ax.plot(x, g(x), lw=1.2, label=f"{name} (fixed)")
        ratio = sur.get("a2sg", {}).get("ratio", 2.0)
        for when, ls in (("start", ":"), ("end", "-")):
            for layer, color in ((1, "k"), (2, "C3")):
                sub = table[(table.metric == f"window_{when}_l{layer}_{ds}") & (table.variant == "a2sg")]
                if sub.empty:
                    continue
                w = sub.groupby("x").value.mean()
                for t in (w.index.min(), w.index.max()):
                    ax.plot(x, asymmetric_window(float(w[t]), ratio)(x), color=color, ls=ls,
                            lw=1.6 if t == w.index.max() else 0.8,
                            label=f"A2SG {when}, layer {layer}, t={int(t)} (w={w[t]:.2f})")
        ax.axvline(0, color="gray", lw=0.5)
        ax.set_xlabel("x = v - θ (membrane potential minus threshold, units of θ)")
        ax.set_ylabel("g(x) = surrogate ∂s/∂v (1/θ), area 1")
        ax.set_title(label)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    _save(p, fig, "Which pseudo-derivative does each variant use? (A2SG: seed-mean adapted window)", path)


def _firing(table, path: Path) -> None:
    from ...plotting import plt

    p = plt()
    variants = _variants(table)
    fig, axes = p.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(1, len(variants))
    for ax, (ds, label) in zip(axes, DATASETS):
        for i, v in enumerate(variants):
            for layer in (1, 2):
                vals = table[(table.metric == f"fr_l{layer}_{ds}") & (table.variant == v) & table.x.isna()].value
                if vals.empty:
                    continue
                xpos = layer - 1 + (i - len(variants) / 2 + 0.5) * width
                ax.bar(xpos, vals.mean(), width, yerr=vals.std(ddof=1) if len(vals) > 1 else 0,
                       color=f"C{i}", capsize=2, label=v if layer == 1 else None)
        ax.set_xticks([0, 1], ["conv layer 1", "conv layer 2"])
        ax.set_ylabel("firing rate (spikes / neuron / time step)")
        ax.set_title(label)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    _save(p, fig, "Does the surrogate change how much the network fires (energy proxy)?", path)


def _firing_per_step(table, path: Path) -> None:
    from ...plotting import plt

    p = plt()
    fig, axes = p.subplots(2, 2, figsize=(10, 7), sharex=True)
    for col, (ds, label) in enumerate(DATASETS):
        for row, layer in enumerate((1, 2)):
            ax = axes[row, col]
            sub = table[table.metric == f"fr_l{layer}_t_{ds}"]
            for i, v in enumerate(_variants(table)):
                g = sub[sub.variant == v].groupby("x").value
                if g.ngroups == 0:
                    continue
                m, sd = g.mean(), g.std().fillna(0.0)
                ax.plot(m.index, m.values, marker="o", ms=3, color=f"C{i}", label=v)
                ax.fill_between(m.index, m - sd, m + sd, color=f"C{i}", alpha=0.15)
            ax.set_title(f"{label}, layer {layer}")
            ax.set_ylabel("spikes / neuron / step")
            ax.grid(alpha=0.3)
        axes[1, col].set_xlabel("time step t")
    axes[0, 0].legend(fontsize=7)
    _save(p, fig, "How does firing evolve over the T time steps? (mean +- std over seeds)", path)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot

    plots_dir = Path(plots_dir)
    _shapes(table, params, plots_dir / "surrogate_shapes.png")
    _scalar_panels(table, "acc", "test accuracy (fraction)", "Does A2SG reach the best fixed surrogate's accuracy?",
                   plots_dir / "bar_accuracy.png")
    _scalar_panels(table, "sharp", "sharpness: mean loss rise under ρ-relative weight noise (nats)",
                   "Does A2SG find flatter minima?", plots_dir / "bar_sharpness.png")
    _scalar_panels(table, "grad_cos", "mean cosine between per-time-step gradients",
                   "Are A2SG's per-time-step gradients more aligned?", plots_dir / "bar_grad_cos.png")
    _firing(table, plots_dir / "firing_rate.png")
    _firing_per_step(table, plots_dir / "firing_rate_per_step.png")
    for ds, label in DATASETS:
        curve_plot(table, f"val_loss_{ds}", plots_dir / f"curve_val_loss_{ds}.png", xlabel="training step",
                   ylabel="validation cross-entropy (nats)", title=f"{label}: has every variant converged?")
        curve_plot(table, f"grad_cos_train_{ds}", plots_dir / f"curve_grad_cos_train_{ds}.png", xlabel="training step",
                   ylabel="mean cosine between per-time-step gradients",
                   title=f"{label}: gradient consistency over training")
