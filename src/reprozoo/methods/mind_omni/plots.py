"""Mind-Omni figures, all read from the long results table.

* ``reconstructions.png``: a few test digits: the image, its 'fMRI' map, brain -> image from every
  variant, and the brain -> caption each produced (seed 0);
* ``score_per_task.png``: each task's chance-corrected score (what the claims compare), joint, the
  single-task baseline (on the tasks that have one) and the planted-deficit joint control, mean +-
  std over seeds;
* ``curve_val_loss.png``: per-task validation loss (nats per masked token) against steps, every
  variant, mean with a +- std band over seeds; the last panel is the joint model's training loss.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import data as D
from .tasks import TASKS
from reprozoo.figures import save_figure

VARIANTS = ("joint", "single_task_joint_batch", "joint_planted")
COLORS = {"joint": "C0", "single_task_joint_batch": "C1", "joint_planted": "C7"}
SCORE_LABEL = {"img2brain": "image->brain\npattern r", "txt2brain": "caption->brain\npattern r",
               "imgtxt2brain": "image+caption\n->brain pattern r", "brain2img": "brain->image\nident. acc",
               "brain2txt": "brain->caption\nword acc", "brain2imgtxt": "brain->image+caption\nmean",
               "bqa": "brain QA\naccuracy"}


def _curve(table, metric, variant, seed):
    t = table[(table.metric == metric) & (table.variant == variant) & (table.seed == seed)].sort_values("x")
    return t.x.to_numpy(), t.value.to_numpy()


def plot_reconstructions(table, path: Path, pl) -> None:
    seed = table.seed.min()
    ks = sorted({int(m[7:].split("_")[0]) for m in table.metric.unique()
                 if m.startswith("example") and m.endswith("_image")})
    have = [v for v in VARIANTS if (table[(table.variant == v)].metric == "example0_brain2img").any()]
    if not ks or not have:
        return
    cols = 2 + len(have)
    fig, axes = pl.subplots(len(ks), cols, figsize=(2.1 * cols, 2.0 * len(ks)), squeeze=False)
    words = np.array(D.CAPTION_WORDS)
    for r, k in enumerate(ks):
        _, img = _curve(table, f"example{k}_image", "joint", seed)
        _, fm = _curve(table, f"example{k}_fmri", "joint", seed)
        _, cap = _curve(table, f"example{k}_caption", "joint", seed)
        g = int(round(np.sqrt(len(fm))))
        axes[r, 0].imshow(img.reshape(8, 8), cmap="gray_r", vmin=0, vmax=16)
        axes[r, 0].set_title("true: " + " ".join(words[cap.astype(int)]), fontsize=7)
        axes[r, 1].imshow(fm.reshape(g, g), cmap="RdBu_r", vmin=-2.5, vmax=2.5)
        axes[r, 1].set_title(f"'fMRI' ({g}x{g} voxels, z)", fontsize=7)
        for c, v in enumerate(have, start=2):
            _, rec = _curve(table, f"example{k}_brain2img", v, seed)
            _, w = _curve(table, f"example{k}_brain2txt", v, seed)
            axes[r, c].imshow(rec.reshape(8, 8), cmap="gray_r", vmin=0, vmax=16)
            axes[r, c].set_title(f"{v}: " + " ".join(words[w.astype(int)]), fontsize=7)
    for a in axes.ravel():
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle(f"Can one model read digits and captions out of the brain map? (test digits, seed {seed};\n"
                 "columns 3+: fMRI->image reconstruction, title: fMRI->caption)", fontsize=9)
    save_figure(fig, path, dpi=110)


def plot_scores(table, path: Path, pl) -> None:
    fig, ax = pl.subplots(figsize=(10, 4))
    tasks = list(TASKS)
    bars = [(v, "cc_", v) for v in VARIANTS]
    w = 0.8 / len(bars)
    for i, (v, pre, name) in enumerate(bars):
        means, sds, pts = [], [], []
        for t in tasks:
            vals = table[(table.metric == f"{pre}{t}") & (table.variant == v)].value.to_numpy()
            means.append(vals.mean() if len(vals) else np.nan)
            sds.append(vals.std(ddof=1) if len(vals) > 1 else 0.0)
            pts.append(vals)
        x = np.arange(len(tasks)) + (i - (len(bars) - 1) / 2) * w
        label = "joint_planted: joint with a planted 0.1 deficit (control)" if name == "joint_planted" else name
        ax.bar(x, means, w, yerr=sds, color=COLORS[name], alpha=0.8, capsize=2, label=label)
        for xi, p in zip(x, pts):
            ax.plot(np.full(len(p), xi), p, "k.", ms=3)
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xticks(np.arange(len(tasks)))
    ax.set_xticklabels([SCORE_LABEL[t] for t in tasks], fontsize=7)
    ax.set_ylabel("chance-corrected score\n(score - chance) / (1 - chance)")
    ax.set_title("Does joint training on all seven tasks beat one model per task at the same batch size? "
                 "(test split, mean +- std over seeds, dots = seeds)", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def _band(ax, table, metric, variant, **kw):
    t = table[(table.metric == metric) & (table.variant == variant)]
    if t.empty:
        return
    piv = t.pivot_table(index="x", columns="seed", values="value")
    m, s = piv.mean(1), piv.std(1).fillna(0.0)
    ax.plot(piv.index, m, **kw)
    ax.fill_between(piv.index, m - s, m + s, alpha=0.2, color=kw.get("color"))


def plot_losses(table, plots_dir: Path, pl) -> None:
    tasks = list(TASKS)
    fig, axes = pl.subplots(2, 4, figsize=(13, 6), squeeze=False)
    for a, t in zip(axes.ravel(), tasks):
        for v in VARIANTS:
            _band(a, table, f"val_loss_{t}", v, color=COLORS[v], label=v)
        a.set_title(t, fontsize=9)
        a.set_xlabel("training step")
        a.set_ylabel("val CE, all targets masked (nats/token)", fontsize=7)
    last = axes.ravel()[-1]
    _band(last, table, "train_joint", "joint", color=COLORS["joint"], label="joint, training")
    _band(last, table, "val_joint", "joint", color="k", label="joint, validation (gate)")
    last.set_title("joint: task mixture", fontsize=9)
    last.set_xlabel("training step")
    last.legend(fontsize=7)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Have all models finished learning? Validation loss per task (each model at its constant rate "
                 "until the plateau test; mean +- std over seeds)", fontsize=10)
    save_figure(fig, plots_dir / "curve_val_loss.png", dpi=110)


def plot_all(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pl = plt()
    plots_dir = Path(plots_dir)
    plot_reconstructions(table, plots_dir / "reconstructions.png", pl)
    plot_scores(table, plots_dir / "score_per_task.png", pl)
    plot_losses(table, plots_dir, pl)
