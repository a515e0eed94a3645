"""Figures: surrogate shapes (with the windows ST-ASG chose), per-variant bars (accuracy, SOPs,
sharpness, gradient consistency, local-gradient CV), firing per step, training curves."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

ORDER = ["a2sg", "st_asg_tri", "asy_random_beta", "asy_fixed", "tri_fixed", "asy_width_best", "tri_width_best",
         "tri_random_beta", "asy_rev_fixed", "rectangular", "arctan"]


def _variants(table):
    present = list(table.variant.unique())
    return [v for v in ORDER if v in present] + sorted(v for v in present if v not in ORDER)


def _bars(table, panels, title: str, path: Path) -> None:
    """One panel per (metric, y label): seed means as bars (± std), seeds as dots."""
    from ...plotting import plt

    p = plt()
    fig, axes = p.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    variants = _variants(table)
    for ax, (metric, ylabel) in zip(axes[0], panels):
        sub = table[(table.metric == metric) & table.x.isna()]
        for i, v in enumerate(variants):
            vals = sub[sub.variant == v].value.to_numpy()
            if len(vals) == 0:
                continue
            ax.bar(i, vals.mean(), yerr=vals.std(ddof=1) if len(vals) > 1 else 0, color=f"C{i}", alpha=0.6, capsize=3)
            ax.plot(np.full(len(vals), i), vals, "k.", ms=5)
        ax.set_xticks(range(len(variants)), variants, rotation=35, ha="right")
        ax.set_ylabel(ylabel)
        if len(sub):
            lo, hi = sub.value.min(), sub.value.max()
            ax.set_ylim(lo - 0.3 * (hi - lo + 1e-9), hi + 0.3 * (hi - lo + 1e-9))
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title + " (bars: mean ± std over seeds, dots: seeds)")
    save_figure(fig, path, dpi=110)


def shape_np(kind: str, x: np.ndarray, **kw) -> np.ndarray:
    """The plotted g(x) in numpy, so the evaluate job does not import torch for one figure (a test
    checks each against the torch surrogate it draws): ``tri`` / ``asy`` (beta, h) of
    ``surrogates``, ``rectangular`` (width) and ``arctan`` (alpha) of ``blocks.spiking``."""
    if kind == "tri":
        return np.clip(1.0 - np.abs(x) / kw["beta"], 0.0, None)
    if kind == "asy":
        return np.clip(x / (2.0 * kw["beta"]) + kw.get("h", 0.5), 0.0, None) * (np.abs(x) <= kw["beta"])
    if kind == "rectangular":
        w = kw.get("width", 1.0)
        return (np.abs(x) < w / 2).astype(float) / w
    if kind == "arctan":
        a = kw.get("alpha", 2.0)
        return (a / 2) / (1 + (np.pi * a * x / 2) ** 2)
    raise ValueError(f"no numpy shape for {kind!r}")


def _shapes(table, params: dict, path: Path) -> None:
    """g(x) of every fixed surrogate, and the ST-ASG windows (seed mean, first and last step)."""
    from functools import partial

    from ...plotting import plt

    p = plt()
    x = np.linspace(-2.0, 2.0, 801)
    sur = params.get("surrogates", {})
    tri, asy = partial(shape_np, "tri"), partial(shape_np, "asy")
    fig, axes = p.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    for name in ("rectangular", "arctan"):
        cfg = dict(sur.get(name, {"kind": name}))
        ax.plot(x, shape_np(cfg.pop("kind"), x, **cfg), lw=1.2, label=f"{name} (fixed)")
    for name, fn in (("tri_fixed", tri), ("asy_fixed", asy)):
        b = float(sur.get(name, {}).get("beta", 0.5))
        ax.plot(x, fn(x, beta=b), lw=1.6, label=f"{name} (β = {b:g})")
    ax.set_title("fixed surrogates")
    for ax, (variant, fn) in zip(axes[1:], (("a2sg", asy), ("st_asg_tri", tri))):
        for layer, color in ((1, "k"), (2, "C3")):
            sub = table[(table.metric == f"window_l{layer}") & (table.variant == variant)]
            if sub.empty:
                continue
            w = sub.groupby("x").value.mean()
            for t in (w.index.min(), w.index.max()):
                ax.plot(x, fn(x, beta=float(w[t])), color=color, lw=1.6 if t == w.index.max() else 0.8,
                        ls="-" if t == w.index.max() else ":",
                        label=f"layer {layer}, t = {int(t)}: β = {w[t]:.2f}")
        ax.set_title(f"{variant}: windows at the end of training (seed mean β)")
    for ax in axes:
        ax.axvline(0, color="gray", lw=0.5)
        ax.set_xlabel("x = v - θ (membrane potential minus threshold, units of θ)")
        ax.set_ylabel("g(x) = surrogate ∂s/∂v")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle("Which pseudo-derivative does each variant use?")
    save_figure(fig, path, dpi=110)


def _firing_per_step(table, path: Path) -> None:
    from ...plotting import plt

    p = plt()
    fig, axes = p.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, layer in zip(axes, (1, 2)):
        sub = table[table.metric == f"fr_l{layer}_t"]
        for i, v in enumerate(_variants(table)):
            g = sub[sub.variant == v].groupby("x").value
            if g.ngroups == 0:
                continue
            m, sd = g.mean(), g.std().fillna(0.0)
            ax.plot(m.index, m.values, marker="o", ms=3, color=f"C{i}", label=v)
            ax.fill_between(m.index, m - sd, m + sd, color=f"C{i}", alpha=0.15)
        ax.set_title(f"conv layer {layer}")
        ax.set_xlabel("time step t")
        ax.set_ylabel("spikes / neuron / step (test set)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("How much does each variant fire at each time step? (mean ± std over seeds)")
    save_figure(fig, path, dpi=110)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot

    plots_dir = Path(plots_dir)
    _shapes(table, params, plots_dir / "surrogate_shapes.png")
    _bars(table, [("acc", "test accuracy (fraction, 2000 samples at smoke)"),
                  ("sops", "synaptic operations per test sample"),
                  ("energy_pj", "energy per test sample (pJ; 4.6 pJ/MAC layer 1, 0.9 pJ/AC)")],
          "Is A2SG more accurate, and does it need fewer synaptic operations?", plots_dir / "bar_accuracy_sops.png")
    _bars(table, [("sharp", "sharpness: loss rise under ρ-relative weight noise (nats)"),
                  ("grad_cos", "mean cosine between per-time-step weight gradients"),
                  ("cv", "CV of the local gradient ∂L/∂v at the final step")],
          "Flatter minima, aligned time steps, lower gradient variation?", plots_dir / "bar_sharp_cos_cv.png")
    _firing_per_step(table, plots_dir / "firing_rate_per_step.png")
    curve_plot(table, "val_model", plots_dir / "curve_val_loss.png", xlabel="training step",
               ylabel="validation cross-entropy (nats; the convergence curve)",
               title="Has every variant converged? (chosen learning rate)")
    curve_plot(table, "val_acc", plots_dir / "curve_val_acc.png", xlabel="training step",
               ylabel="validation accuracy", title="Validation accuracy (chosen learning rate)")
    for layer in (1, 2):
        curve_plot(table, f"window_mean_l{layer}", plots_dir / f"curve_window_mean_l{layer}.png",
                   xlabel="training step", ylabel="mean β over time steps",
                   title=f"ST-ASG's chosen window half-width β, conv layer {layer}")
