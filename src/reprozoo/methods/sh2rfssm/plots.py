"""Figures of the sh2rfssm page; each answers one question (its title)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

ORDER = ["sh2rf", "sh2rf_implicit", "hrf_homog", "lif_ssm", "cdiag_ssm", "transformer"]


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    save_figure(fig, path, dpi=120)


def runtime_vs_length(table, plots_dir: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for metric, label in (("time_fft_s", "FFT path (kernel + convolution)"),
                          ("time_recurrence_s", "sequential IMEX recurrence")):
        d = table[table.metric == metric]
        if d.empty:
            continue
        g = d.groupby("x")["value"]
        ax.plot(g.median().index, g.median().values, "o-", label=label)
        ax.fill_between(g.min().index, g.min().values, g.max().values, alpha=0.2)
    L = np.array(sorted(table[table.metric == "time_fft_s"].x.unique()))
    if len(L):
        ref = table[(table.metric == "time_fft_s") & (table.x == L[0])].value.median()
        ax.plot(L, ref * L * np.log(L) / (L[0] * np.log(L[0])), "k--", lw=0.8, label="∝ L log L")
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("sequence length L (steps)"), ax.set_ylabel("wall time of one layer (s)")
    ax.set_title("How does one layer's runtime grow with L?")
    ax.legend(fontsize=8)
    _save(fig, plots_dir / "runtime_vs_length.png")


def accuracy_per_variant(table, plots_dir: Path) -> None:
    plt = _plt()
    metrics = sorted(m for m in table.metric.unique() if m.startswith(("acc_freq_L", "r2_adding_L", "acc_digits_L")))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        d = table[table.metric == m]
        vs = [v for v in ORDER if v in set(d.variant)]
        for i, v in enumerate(vs):
            vals = d[d.variant == v].value.values
            ax.bar(i, vals.mean(), color="C0" if v == "sh2rf" else "C7", alpha=0.7)
            ax.errorbar(i, vals.mean(), yerr=vals.std(ddof=1) if len(vals) > 1 else 0, color="k", capsize=3)
            ax.plot(np.full(len(vals), i), vals, "k.", ms=4)
        ax.set_xticks(range(len(vs)), vs, rotation=60, fontsize=7)
        ax.set_ylabel("test accuracy" if m.startswith("acc") else "test R² (1 - MSE/Var)")
        ax.set_title(m.replace("_", " "), fontsize=9)
    fig.suptitle("Which model solves which task? (mean ± sd over seeds, dots: seeds)", fontsize=9)
    _save(fig, plots_dir / "accuracy_per_variant.png")


def loss_curves(table, plots_dir: Path) -> None:
    plt = _plt()
    metrics = sorted(m for m in table.metric.unique() if m.startswith(("val_freq_", "val_adding_", "val_digits_")))
    if not metrics:
        return
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.2), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        d = table[table.metric == m]
        for i, v in enumerate(v for v in ORDER if v in set(d.variant)):
            g = d[d.variant == v].groupby("x")["value"]
            ax.plot(g.mean().index, g.mean().values, color=f"C{i}", label=v)
            ax.fill_between(g.min().index, g.min().values, g.max().values, color=f"C{i}", alpha=0.2)
        ax.set_yscale("log")
        ax.set_xlabel("training step"), ax.set_ylabel("val MSE" if "adding" in m else "val cross-entropy (nats)")
        ax.set_title(m.replace("val_", ""), fontsize=9)
    axes[0][0].legend(fontsize=6)
    fig.suptitle("Has every model finished training? (band: min-max over seeds)", fontsize=9)
    _save(fig, plots_dir / "curve_val_loss.png")


def spike_raster(table, plots_dir: Path) -> None:
    plt = _plt()
    d = table[(table.metric == "raster_freq") & (table.seed == table.seed.min())]
    vs = [v for v in ORDER if v in set(d.variant)]
    if not vs:
        return
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.5 * len(vs)))
    for i, v in enumerate(vs):
        t = d[d.variant == v].x.values
        ax.vlines(t, i - 0.4, i + 0.4, lw=0.6)
    ax.set_yticks(range(len(vs)), vs, fontsize=8)
    short = table[table.metric.str.startswith("acc_freq_L")].metric.str.removeprefix("acc_freq_L").astype(int)
    if len(short):
        ax.set_xlim(0, short.min())
    ax.set_xlabel("time step")
    ax.set_title("When does the busiest layer-1 channel fire? (first test sequence, freq task, short L)", fontsize=8)
    _save(fig, plots_dir / "spike_raster.png")


def sops_vs_skill(table, plots_dir: Path) -> None:
    """SOPs per step at matched validation skill (the fewer_sops claim's curve), one panel per task."""
    plt = _plt()
    d = table[table.metric == "sops_at_skill"]
    if d.empty:
        return
    tasks = {1: "freq", 2: "adding", 3: "digits"}
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 3.2), squeeze=False)
    for ax, (k, name) in zip(axes[0], tasks.items()):
        dk = d[(d.x // 100) == k]
        for i, v in enumerate(v for v in ORDER if v in set(dk.variant)):
            g = dk[dk.variant == v].groupby("x")["value"]
            lev = (g.mean().index - 100 * k) / 100
            ax.plot(lev, g.mean().values, "o-", ms=3, color=f"C{i}", label=v)
        ax.set_yscale("log")
        ax.set_xlabel("validation skill reached"), ax.set_ylabel("SOPs per step")
        ax.set_title(name, fontsize=9)
    axes[0][0].legend(fontsize=6)
    fig.suptitle("How many spike operations does each accuracy cost? (mean over seeds)", fontsize=9)
    _save(fig, plots_dir / "sops_vs_skill.png")


def make_all(table, plots_dir, params) -> None:
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    runtime_vs_length(table, plots_dir)
    accuracy_per_variant(table, plots_dir)
    loss_curves(table, plots_dir)
    spike_raster(table, plots_dir)
    sops_vs_skill(table, plots_dir)
