"""Figures for ECG-R1: an example report with its evidence, hallucination rate, missing modality.

All read the long results table (method, variant, seed, metric, x, value); seed bands are the
mean +- one standard deviation over seeds, with each seed drawn as a dot.
"""
from __future__ import annotations

import numpy as np

from . import protocol as P
from reprozoo.figures import save_figure

_COLORS = {"ecg_r1": "C3", "sft_only": "C0", "rl_no_dropout": "C1", "signal_only": "C2", "image_only": "C4"}


def _scalar(t, variant, metric):
    s = t[(t["variant"] == variant) & (t["metric"] == metric) & t["x"].isna()]
    return s.sort_values("seed")["value"].to_numpy()


def _bars(ax, groups, labels, values_of, ylabel, title):
    """Grouped bars: groups along x, one bar per label, seed dots and mean +- sd."""
    width = 0.8 / max(1, len(labels))
    for j, lab in enumerate(labels):
        for i, g in enumerate(groups):
            v = values_of(g, lab)
            if len(v) == 0:
                continue
            x = i + (j - (len(labels) - 1) / 2) * width
            ax.bar(x, v.mean(), width * 0.9, yerr=v.std() if len(v) > 1 else None, capsize=3,
                   color=_COLORS.get(g, f"C{j}") if len(labels) == 1 else f"C{j}", alpha=0.75,
                   label=lab if i == 0 or len(labels) == 1 else None)
            ax.plot(np.full(len(v), x), v, "k.", ms=4)
    ax.set_xticks(range(len(groups)), groups, rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def plot_all(table, plots_dir, variants) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = table[table["method"] == "ecg_r1"] if "method" in table else table
    if t.empty:
        return
    present = [v for v in variants if (t["variant"] == v).any()]

    # 1. example report with its evidence
    seed0 = sorted(t["seed"].unique())[0]
    sig = t[(t["metric"] == "ex_signal") & (t["seed"] == seed0)]
    if not sig.empty:
        v0 = sig["variant"].iloc[0]
        sig = sig[sig["variant"] == v0].sort_values("x")
        shown = [v for v in ("sft_only", "ecg_r1") if v in present] or present[:1]
        fig = plt.figure(figsize=(13, 5.2))
        ax = fig.add_axes([0.06, 0.55, 0.9, 0.37])
        ax.plot(sig["x"], sig["value"], "k", lw=0.8)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("ECG (normalised to R amplitude)")
        sv = lambda v, m: _scalar(t[t["seed"] == seed0], v, m)
        feat = {k: sv(v0, f"ex_feat_{k}") for k in P.FEATURES}
        ax.set_title("Which statements of a generated report does the ground truth support?  "
                     "(test record 0, seed %d) measured: HR %.0f bpm, RR CV %.3f, QRS %.0f ms, PR %.0f ms, QTc %.0f ms"
                     % (seed0, *[float(feat[k][0]) for k in P.FEATURES]), fontsize=9)
        ref = np.array([sv(v0, f"ex_ref_{j}")[0] for j in range(P.N_STATEMENTS)])
        for c, v in enumerate(shown):
            rep = np.array([sv(v, f"ex_report_{j}")[0] for j in range(P.N_STATEMENTS)]).astype(int)
            ok = P.grounded(rep, ref)[0]
            lines = [f"{'OK ' if o else 'X  '}{s}" for o, s in zip(ok, P.report_text(rep))]
            fig.text(0.06 + 0.46 * c, 0.47, f"{v} report ({int((~ok).sum())} contradicted by the grounded check):", weight="bold",
                     color=_COLORS.get(v, "k"), va="top", fontsize=9)
            fig.text(0.06 + 0.46 * c, 0.43, "\n".join(lines), family="monospace", va="top", fontsize=8.5)
        from .data import render_image

        axi = fig.add_axes([0.06, 0.08, 0.9, 0.1])
        axi.imshow(render_image(sig["value"].to_numpy(np.float32)), cmap="gray_r", aspect="auto",
                   extent=(0, sig["x"].max(), 0, 1))
        axi.set_yticks([])
        axi.set_xlabel("time (s): the same acquisition as the model's image input (40 x 200 px)", fontsize=8)
        fig.savefig(plots_dir / "example_report.png", dpi=110)
        plt.close(fig)

    # 2. hallucination rate per variant
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    _bars(axes[0], present, ["grounded check (claimed)", "reward's scorer"],
          lambda g, lab: _scalar(t, g, "halluc_rate" if lab.startswith("grounded") else "halluc_rate_reward"),
          "unsupported statements / statements", "Does evidence-reward RL lower the hallucination rate?")
    axes[0].legend(fontsize=8)
    _bars(axes[1], present, ["dx accuracy", "evidence precision"],
          lambda g, lab: _scalar(t, g, "dx_acc" if lab == "dx accuracy" else "evidence_precision"),
          "fraction of test reports / statements", "Diagnosis accuracy and evidence precision (both modalities)")
    axes[1].legend(fontsize=8)
    save_figure(fig, plots_dir / "hallucination_rate.png", dpi=110)

    # 3. missing-modality accuracy
    fig, ax = plt.subplots(figsize=(8, 4))
    names = {"both given": "dx_acc", "signal only": "dx_acc_sig", "image only": "dx_acc_img"}
    both = [v for v in present if v in ("ecg_r1", "sft_only", "rl_no_dropout")]
    single = {"signal_only": "signal only", "image_only": "image only"}

    def acc(g, lab):
        if g in single:
            return _scalar(t, g, "dx_acc") if single[g] == lab else np.array([])
        return _scalar(t, g, names[lab])
    _bars(ax, both + [v for v in present if v in single], list(names), acc, "diagnosis accuracy",
          "Does modality dropout keep accuracy when a modality is missing?")
    ax.legend(fontsize=8)
    save_figure(fig, plots_dir / "missing_modality_accuracy.png", dpi=110)

    # 4. training curves with seed bands
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, m, lab in ((axes[0], "val_loss", "validation CE (nats / report)"),
                       (axes[1], "val_reward", "validation evidence reward (stage 1: set A, stages 2-3: set B)")):
        for v in present:
            c = t[(t["variant"] == v) & (t["metric"] == m)]
            if c.empty:
                continue
            g = c.groupby("x")["value"]
            mu, sd = g.mean(), g.std().fillna(0)
            ax.plot(mu.index, mu.values, color=_COLORS.get(v), label=v)
            ax.fill_between(mu.index, mu - sd, mu + sd, color=_COLORS.get(v), alpha=0.2)
        ax.set_xlabel("update step (SFT to its plateau, then RL or more SFT; stage 1's length varies per cell)")
        ax.set_ylabel(lab)
    axes[0].set_title("Has SFT converged before the second stage?")
    axes[1].set_title("Does the second stage raise the evidence reward?")
    axes[1].legend(fontsize=8)
    save_figure(fig, plots_dir / "training_curves.png", dpi=110)
