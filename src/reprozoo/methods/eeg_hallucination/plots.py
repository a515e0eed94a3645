"""Figures of the ERP study, all read from the long metrics table.

* ``erp_peak_electrodes.png``: grand-average ERPs per condition with 95 % t bands over the 27
  subjects at the N400 and P600 peak electrodes (seed 0), planted latencies marked.
* ``topomaps.png``: detected - correct topographies at the recovered cluster peaks
  (``mne.viz.plot_topomap``, cluster channels marked), planted study above, null study below.
* ``decoding_per_subject.png``: LOSO balanced accuracy per held-out subject, xDAWN vs raw vs the null study
  (mean and range over seeds).
* ``null_fpr.png``: false-positive rates over null contrasts (the detection family of claim
  ``null_fwer``, at a planted latency, anywhere), cluster test vs uncorrected.
* ``missed_equivalence.png``: missed - correct as a fraction of detected - correct (window-mean
  index) per seed with the +-margin equivalence band, and the p-values of the tests that call
  missed "like correct" (cluster test, window t-test, TOST), with missed trials carrying nothing
  (planted study) or 40 % of the effect (partial study).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

COND_COLORS = {"correct": "tab:blue", "detected": "tab:red", "missed": "tab:green"}
LABEL = {"correct": "correct content", "detected": "hallucination, detected", "missed": "hallucination, missed"}


def _curve(table, variant, metric, seed=None):
    t = table[(table.variant == variant) & (table.metric == metric)]
    if seed is not None:
        t = t[t.seed == seed]
    return t.sort_values("x")


def _scalar(table, variant, metric, seed):
    t = table[(table.variant == variant) & (table.metric == metric) & (table.seed == seed)]
    return float(t.value.iloc[0]) if len(t) else float("nan")


def _save(fig, ax, path: Path) -> None:
    import matplotlib.pyplot as plt

    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=110)


def plot_erps(table, plots_dir: Path, params) -> None:
    import matplotlib.pyplot as plt

    from reprozoo.data.eeg.simulate import TEN_TWENTY

    seeds = sorted(table[table.variant == "erp_pipeline"].seed.unique())
    if not seeds:
        return
    s = seeds[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, k, lat in zip(axes, ("n400", "p600"), (params["n400_ms"], params["p600_ms"])):
        ch = TEN_TWENTY[int(_scalar(table, "erp_pipeline", f"{k}_peak_ch_idx", s))]
        for c, col in COND_COLORS.items():
            m = _curve(table, "erp_pipeline", f"erp_{k}_{c}", s)
            ci = _curve(table, "erp_pipeline", f"erp_{k}_{c}_ci", s)
            if m.empty:
                continue
            ax.plot(m.x, m.value, color=col, label=LABEL[c])
            ax.fill_between(m.x, m.value - ci.value.values, m.value + ci.value.values, color=col, alpha=0.2)
        ax.axvline(lat, color="k", ls=":", lw=1, label=f"planted {k.upper()} ({lat:.0f} ms)")
        rec = _scalar(table, "erp_pipeline", f"{k}_latency_ms", s)
        if np.isfinite(rec):
            ax.axvline(rec, color="tab:red", ls="--", lw=1, label=f"recovered peak ({rec:.0f} ms)")
        ax.axhline(0, color="0.6", lw=0.5)
        ax.set(title=f"{k.upper()} at its peak electrode {ch}", xlabel="time after word onset (ms)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("amplitude (uV), mean +- 95 % CI over subjects")
    fig.suptitle(f"Do detected hallucinations carry larger N400/P600 while missed ones look like correct content? (seed {s})")
    save_figure(fig, plots_dir / "erp_peak_electrodes.png", dpi=110)


def plot_topomaps(table, plots_dir: Path, params) -> None:
    import matplotlib.pyplot as plt
    import mne

    from reprozoo.data.eeg.simulate import TEN_TWENTY, _info

    rows = [v for v in ("erp_pipeline", "null_study") if not _curve(table, v, "topo_n400").empty]
    if not rows:
        return
    s = sorted(table[table.variant == rows[0]].seed.unique())[0]
    info = _info(tuple(TEN_TWENTY), float(params["sfreq"]))
    fig, axes = plt.subplots(len(rows), 2, figsize=(8.5, 3.6 * len(rows)), squeeze=False)
    vmax = max(np.abs(_curve(table, v, f"topo_{k}", s).value).max() for v in rows for k in ("n400", "p600"))
    for i, v in enumerate(rows):
        for j, k in enumerate(("n400", "p600")):
            val = _curve(table, v, f"topo_{k}", s).value.values
            mask = _curve(table, v, f"topo_{k}_mask", s).value.values > 0.5
            lat = _scalar(table, v, f"{k}_topo_latency_ms", s)
            im, _ = mne.viz.plot_topomap(val, info, axes=axes[i, j], show=False, mask=mask, vlim=(-vmax, vmax),
                                         mask_params=dict(marker="o", markerfacecolor="w", markersize=5))
            axes[i, j].set_title(f"{'planted' if v == 'erp_pipeline' else 'null'} study\n{k.upper()} peak, {lat:.0f} ms",
                                 fontsize=9)
    cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6)
    cb.set_label("detected - correct (uV)")
    fig.suptitle(f"Where do the clusters peak? (white: channels of a significant cluster; seed {s})", fontsize=10)
    fig.savefig(plots_dir / "topomaps.png", dpi=110)
    plt.close(fig)


def plot_decoding(table, plots_dir: Path, params) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    style = {"erp_pipeline": ("xDAWN + LR (planted)", "tab:red", 0.0),
             "raw_lr": ("LR without xDAWN (planted)", "tab:orange", 0.2),
             "null_study": ("xDAWN + LR (null study)", "0.4", -0.2)}
    for v, (lab, col, dx) in style.items():
        t = table[(table.variant == v) & (table.metric == "bacc_subject")]
        if t.empty:
            continue
        auc = table[(table.variant == v) & (table.metric == "auc")].value.mean()
        g = t.groupby("x").value
        m, lo, hi = g.mean(), g.min(), g.max()
        ax.errorbar(m.index + 1 + dx, m.values, yerr=[m.values - lo.values, hi.values - m.values], fmt="o",
                    color=col, ms=4, capsize=2, label=f"{lab}: mean {m.mean():.2f} (AUC {auc:.2f})")
    ax.axhline(0.5, color="k", ls=":", lw=1, label="chance")
    ax.set(xlabel="held-out subject", ylabel="balanced accuracy (mean, range over seeds)",
           title="Can single trials of a held-out subject be told apart (detected hallucination vs correct)?")
    _save(fig, ax, plots_dir / "decoding_per_subject.png")


def plot_fpr(table, plots_dir: Path, params) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = []
    for i, (v, lab) in enumerate((("null_study", "cluster perm."), ("uncorrected", "uncorrected"))):
        for j, (metric, hatch, what) in enumerate((("fwer_detection", "..", "detections"),
                                                   ("fwer_detection_a10", "xx", "detections\nat 0.10"),
                                                   ("fpr_at_latency", "", "at latency"), ("fpr_any", "//", "anywhere"))):
            t = table[(table.variant == v) & (table.metric == metric)]
            if t.empty:
                continue
            ax.bar(i * 5 + j, t.value.mean(), color="tab:blue" if i == 0 else "tab:gray", hatch=hatch,
                   yerr=t.value.std(ddof=1) if len(t) > 1 else 0, capsize=3)
            ax.plot(np.full(len(t), i * 5 + j), t.value, "k.", ms=4)
            labels.append((i * 5 + j, f"{lab}\n{what}"))
    ax.axhline(params["alpha"], color="r", ls=":", label=f"alpha = {params['alpha']}")
    ax.set_xticks([x for x, _ in labels], [s for _, s in labels], fontsize=7)
    ax.set(ylabel="fraction of null contrasts with a finding", ylim=(0, 1.05),
           title="How often does a study with no effect yield one?")
    _save(fig, ax, plots_dir / "null_fpr.png")


def plot_equivalence(table, plots_dir: Path, params) -> None:
    import matplotlib.pyplot as plt

    rows = [(v, lab) for v, lab in (("erp_pipeline", "missed: nothing planted"),
                                    ("missed_partial", f"missed: {100 * params['missed_partial_fraction']:.0f} % planted"))
            if not table[(table.variant == v) & (table.metric == "missed_ratio")].empty]
    if not rows:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    m = params["equivalence_margin"]
    a1.axhspan(-m, m, color="tab:green", alpha=0.15, label=f"equivalence band +-{m:g}")
    for i, (v, lab) in enumerate(rows):
        r = table[(table.variant == v) & (table.metric == "missed_ratio")].value
        a1.plot(np.full(len(r), i), r, "o", color="k", ms=4)
        a1.plot([i - 0.2, i + 0.2], [r.mean()] * 2, color="tab:red", lw=2)
    a1.axhline(params["missed_partial_fraction"], color="tab:orange", ls=":", lw=1, label="planted partial fraction")
    a1.set_xticks(range(len(rows)), [lab for _, lab in rows], fontsize=8)
    a1.set(ylabel="missed - correct / detected - correct\n(window-mean index, per seed)")
    a1.set_title("Is the missed-trial response absent, or only not significant?", fontsize=10)
    a1.legend(fontsize=7)
    tests = (("missed_vs_correct_min_p", "cluster test (min p)", "s"), ("missed_roi_p", "window t-test", "o"),
             ("missed_tost_p", "TOST (equivalence)", "^"))
    for j, (metric, lab, mk) in enumerate(tests):
        for i, (v, _) in enumerate(rows):
            t = table[(table.variant == v) & (table.metric == metric)].value
            a2.semilogy(np.full(len(t), i + 0.15 * (j - 1)), np.clip(t, 1e-6, 1), mk, ms=5,
                        color=f"C{j}", label=lab if i == 0 else None)
    a2.axhline(params["alpha"], color="r", ls=":", label=f"alpha = {params['alpha']}")
    a2.set_xticks(range(len(rows)), [lab for _, lab in rows], fontsize=8)
    a2.set(ylabel="p (per seed)", ylim=(None, 1.5))
    a2.set_title("Which test sees the partial response? Which shows equivalence?", fontsize=10)
    _save(fig, a2, plots_dir / "missed_equivalence.png")


def plot_all(table, plots_dir: Path, params) -> None:
    import matplotlib

    matplotlib.use("Agg")
    plots_dir.mkdir(parents=True, exist_ok=True)
    for f in (plot_erps, plot_topomaps, plot_decoding, plot_fpr, plot_equivalence):
        f(table, plots_dir, params)
