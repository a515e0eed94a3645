"""MILCCI in miniature: planted label-driven components, MILCCI against PCA, NMF and CP.

Variants (same data, same rank P = the planted number of components, same number of restarts,
each solver run to its own convergence tolerance):
- ``milcci``: the label-driven decomposition (milcci.py): category-specific sparse non-negative
  maps with one variant per label value tied by label similarity, smooth non-negative per-trial
  traces.
- ``milcci_nosim``: ablation, the label-similarity term off (lam_sim = 0).
- ``milcci_shuffled``: control, MILCCI fitted with the labels permuted across the training trials.
- ``milcci_nolabels``: ablation, the same solver and penalties with the labels withheld (one map
  per component for every trial): what the labels add.
- ``pca``, ``nmf``, ``cp``: the label-blind decompositions of the paper's comparison (baselines.py).
- ``nmf_percond``: label-aware matrix baseline, one rank-P NMF per condition (its own P maps in
  every condition, as MILCCI has, nothing shared between conditions).
- ``*_few`` (``milcci_few``, ``milcci_nosim_few``, ``nmf_percond_few``): the same fits on a second,
  scarce-data set (config ``few``: one training trial per condition, three times the noise), the
  regime where the label-similarity prior should matter.

Stages. train_shared (per seed): draw the data sets (data.py; ``data.npz`` and ``data_few.npz``),
hold out the last trial of each condition, and pick the channels (half) the held-out trials'
traces are fitted on.
train (per variant x seed): fit the training trials, then record
- ``map_corr`` / ``trace_corr``: matched |correlation| with the planted maps (every condition)
  and traces (every training trial), one matching for all conditions, recovery.py;
- ``map_corr_percond``: the map score with a separate matching per condition;
- ``category_acc`` / ``label_effect_corr`` (label-driven MILCCI variants): per-category structure;
- ``heldout_r2``: R^2 on the held-out trials' hidden channels; ``train_r2`` in-sample;
- ``objective`` curve (MILCCI variants: J per outer iteration) and ``final_rel_change``;
- ``recovered_map`` / ``planted_map`` and ``recovered_trace`` / ``planted_trace`` curves: the
  matched components themselves (flattened: x indexes condition/trial, component, channel/time),
  so plot() can draw recovered against planted from the metrics table alone.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .data import MultiTrialData, make_dataset
from reprozoo.figures import save_figure


# --- shared per-seed work ----------------------------------------------------------------------

REGIMES = {"": "data.npz", "_few": "data_few.npz"}


def _regime(variant: str) -> tuple[str, str]:
    """(base variant, regime suffix): ``milcci_nosim_few`` -> (``milcci_nosim``, ``_few``)."""
    return (variant[:-4], "_few") if variant.endswith("_few") else (variant, "")


def _draw(ctx, p: dict, data_kw: dict, stream: int, suffix: str) -> None:
    d = make_dataset(ctx.rng(stream), **data_kw)
    rng = ctx.rng(stream + 1)
    n_test = int(p["heldout"]["trials_per_condition"])
    test = np.concatenate([np.flatnonzero(d.cond == k)[-n_test:] for k in range(len(d.conditions))])
    N = d.Y.shape[1]
    hidden = np.sort(rng.permutation(N)[: int(round(p["heldout"]["hidden_fraction"] * N))])
    d.save(ctx.outdir / f"data{suffix}.npz")
    np.savez(ctx.outdir / f"split{suffix}.npz", test=test, hidden=hidden)
    clean = np.einsum("mnp,mtp->mnt", d.A_true[d.cond], d.Phi_true)
    ctx.metrics.scalar(f"snr_db{suffix}", 10 * np.log10(np.mean(clean**2) / np.mean((d.Y - clean) ** 2)))
    ctx.metrics.scalar(f"n_trials{suffix}", len(d.cond))


def train_shared(ctx) -> None:
    p = ctx.params
    _draw(ctx, p, p["data"], 0, "")
    if p.get("few"):   # the scarce-data regime: the same generator with the overrides of ``few``
        _draw(ctx, p, {**p["data"], **p["few"]}, 2, "_few")


# --- per variant ---------------------------------------------------------------------------------

MILCCI_VARIANTS = ("milcci", "milcci_nosim", "milcci_shuffled", "milcci_nolabels")


def _fit_variant(variant: str, train: MultiTrialData, p: dict, seed: int):
    """(maps_hat (K, N, P), traces (M, T, P), predict(test, observed), milcci fit or None, iterations,
    extra scalars to record)."""
    from . import baselines
    from .milcci import fit_milcci, predict_heldout

    K, P = len(train.conditions), train.A_true.shape[2]
    restarts = int(p["restarts"])
    if variant in MILCCI_VARIANTS:
        use_labels = variant != "milcci_nolabels"
        m = p["milcci"]
        labels = train.labels
        if variant == "milcci_shuffled":   # control: labels permuted across the training trials
            labels = labels[np.random.default_rng(10_000 + seed).permutation(len(labels))]
        fit = fit_milcci(train.Y, labels, train.n_values, p["data"]["comps_per_category"],
                         lam1=m["lam1"], lam_sim=0.0 if variant == "milcci_nosim" else m["lam_sim"],
                         lam_s=m["lam_s"], n_iter=m["n_iter"], inner_iter=m["inner_iter"], n_restarts=restarts,
                         ordinal=m.get("ordinal"), tol=m["tol"], seed=seed, use_labels=use_labels,
                         min_iter=int(m.get("min_iter", 20)))
        maps = fit.trial_maps(train.conditions) if use_labels else np.repeat(fit.maps[0][0][None], K, 0)

        def predict(te, observed):
            return predict_heldout(fit, te.Y, te.labels, observed, use_labels=use_labels)

        return maps, fit.Phi, predict, fit, len(fit.objective), {}
    b = p["baselines"]
    if variant == "nmf_percond":
        pc = baselines.fit_nmf_percond(train.Y, train.cond, K, P, restarts, seed, b["nmf_max_iter"], b["nmf_tol"])
        return pc.maps, pc.traces, (lambda te, observed: pc.predict(te.Y, te.cond, observed)), None, pc.n_iter, \
            {"nmf_fits_at_max_iter": pc.n_capped}
    if variant == "pca":
        bf = baselines.fit_pca(train.Y, P)
    elif variant == "nmf":
        bf = baselines.fit_nmf(train.Y, P, restarts, seed, b["nmf_max_iter"], b["nmf_tol"])
    elif variant == "cp":
        bf = baselines.fit_cp(train.Y, P, restarts, seed, b["cp_n_iter_max"], b["cp_tol"])
    else:
        raise ValueError(f"milcci: unknown variant '{variant}' ({', '.join(MILCCI_VARIANTS)}, pca, nmf, "
                         f"nmf_percond, cp; any of them with the suffix _few)")
    return np.repeat(bf.maps[None], K, 0), bf.traces, (lambda te, observed: bf.predict(te.Y, observed)), \
        None, bf.n_iter, {}


def _aligned(est: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """est scaled (sign included) by least squares onto ref, for drawing recovered over planted."""
    return est * (float(est @ ref) / max(float(est @ est), 1e-300))


def train(ctx) -> None:
    from .recovery import heldout_r2, map_corr_per_condition, match, per_category_structure

    p = ctx.params
    base, suffix = _regime(ctx.variant)
    d = MultiTrialData.load(ctx.shared_dir / f"data{suffix}.npz")
    split = np.load(ctx.shared_dir / f"split{suffix}.npz")
    test, hidden = split["test"], split["hidden"]
    train_idx = np.setdiff1d(np.arange(len(d.cond)), test)
    tr, te = d.subset(train_idx), d.subset(test)
    observed = np.setdiff1d(np.arange(d.Y.shape[1]), hidden)

    t0 = time.process_time()
    maps, traces, predict, fit, n_iter, extra = _fit_variant(base, tr, p, ctx.seed)
    ctx.metrics.scalar("fit_cpu_seconds", time.process_time() - t0)
    ctx.metrics.scalar("n_iter", n_iter)
    for name, value in extra.items():   # per-condition NMF: how many of its kept fits ran into max_iter
        ctx.metrics.scalar(name, value)

    perm, map_corr, trace_corr = match(maps, d.A_true, traces, tr.Phi_true)
    ctx.metrics.scalar("map_corr", map_corr)
    ctx.metrics.scalar("trace_corr", trace_corr)
    ctx.metrics.scalar("map_corr_percond", map_corr_per_condition(maps, d.A_true))
    recon = np.einsum("mnp,mtp->mnt", maps[tr.cond], traces)
    if base == "pca":
        recon = recon + np.mean(tr.Y.transpose(0, 2, 1).reshape(-1, tr.Y.shape[1]), 0)[None, :, None]
    ctx.metrics.scalar("train_r2", 1 - np.sum((tr.Y - recon) ** 2) / np.sum((tr.Y - tr.Y.mean()) ** 2))
    ctx.metrics.scalar("heldout_r2", heldout_r2(te.Y, predict(te, observed), hidden))

    if fit is not None:
        J = np.asarray(fit.objective)
        ctx.metrics.curve("objective", range(1, len(J) + 1), J)
        ctx.metrics.scalar("final_rel_change", abs(J[-1] - J[-2]) / abs(J[-1]) if len(J) > 1 else np.nan)
        if base in ("milcci", "milcci_nosim", "milcci_shuffled"):
            acc, effect = per_category_structure(fit.maps, fit.comp_category, perm, d.A_true, d.conditions,
                                                 d.comp_category)
            ctx.metrics.scalar("category_acc", acc)
            ctx.metrics.scalar("label_effect_corr", effect)

    if p.get("record_components", True):
        K, N, P = d.A_true.shape
        T = d.Y.shape[2]
        rec = np.stack([[_aligned(maps[k][:, perm[q]], d.A_true[k][:, q]) for q in range(P)] for k in range(K)])
        ctx.metrics.curve("recovered_map", range(K * P * N), rec.ravel())
        ctx.metrics.curve("planted_map", range(K * P * N), d.A_true.transpose(0, 2, 1).ravel())
        first = np.array([np.flatnonzero(tr.cond == k)[0] for k in range(K)])  # one training trial per condition
        rt = np.stack([[_aligned(traces[m][:, perm[q]], tr.Phi_true[m][:, q]) for q in range(P)] for m in first])
        ctx.metrics.curve("recovered_trace", range(K * P * T), rt.ravel())
        ctx.metrics.curve("planted_trace", range(K * P * T), tr.Phi_true[first].transpose(0, 2, 1).ravel())


# --- plots ---------------------------------------------------------------------------------------

VARIANT_ORDER = ["milcci", "milcci_nosim", "milcci_shuffled", "milcci_nolabels", "nmf_percond", "nmf", "cp", "pca",
                 "milcci_few", "milcci_nosim_few", "nmf_percond_few"]
COLORS = {"milcci": "tab:red", "milcci_nosim": "tab:pink", "milcci_shuffled": "tab:gray",
          "milcci_nolabels": "tab:orange", "nmf_percond": "tab:olive", "nmf": "tab:green", "cp": "tab:blue",
          "pca": "tab:purple", "milcci_few": "tab:red", "milcci_nosim_few": "tab:pink", "nmf_percond_few": "tab:olive"}


def _curve(table, metric, variant, seed):
    sub = table[(table.metric == metric) & (table.variant == variant) & (table.seed == seed)].sort_values("x")
    return sub.value.to_numpy()


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    plots_dir = Path(plots_dir)
    dp = params["data"]
    N, T = int(dp["n_channels"]), int(dp["n_time"])
    comps = list(dp["comps_per_category"])
    P = int(sum(comps))
    cat = np.repeat(np.arange(len(comps)), comps)
    all_variants = [v for v in VARIANT_ORDER if v in set(table.variant)]
    variants = [v for v in all_variants if not v.endswith("_few")]   # the main data set's variants
    plt_ = plt()

    if "objective" in set(table.metric):
        curve_plot(table, "objective", plots_dir / "curve_objective.png", logy=True,
                   xlabel="outer iteration (A and Phi block updates)", ylabel="objective J (data units^2)",
                   title="Has MILCCI's block coordinate descent converged?",
                   variants=[v for v in all_variants if v.startswith("milcci")])

    # summary: recovery and held-out fit per variant, every seed as a point
    metrics = [m for m in ("map_corr", "trace_corr", "heldout_r2") if m in set(table.metric)]
    if metrics:
        fig, axes = plt_.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.6), squeeze=False)
        for ax, m in zip(axes[0], metrics):
            for i, v in enumerate(all_variants):
                vals = table[(table.metric == m) & (table.variant == v)].value.to_numpy()
                if len(vals):
                    ax.bar(i, vals.mean(), yerr=vals.std(ddof=1) if len(vals) > 1 else 0, color=COLORS[v], alpha=0.6)
                    ax.plot(np.full(len(vals), i), vals, "k.", ms=4)
            ax.set_xticks(range(len(all_variants)), all_variants, rotation=45, fontsize=6, ha="right")
            if any(v.endswith("_few") for v in all_variants):
                ax.axvline(len(variants) - 0.5, color="k", lw=0.8, ls="--")   # right: one trial per condition
            ax.set_ylabel({"map_corr": "matched |corr| with planted maps",
                           "trace_corr": "matched |corr| with planted traces",
                           "heldout_r2": "R^2, held-out trials' hidden channels"}[m], fontsize=8)
            ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.02)
            ax.grid(alpha=0.3, axis="y")
        fig.suptitle("Which decomposition recovers the planted components? (bars: mean +- std over seeds; "
                     "right of the dashed line: one training trial per condition, lower SNR)",
                     fontsize=9)
        save_figure(fig, plots_dir / "recovery.png", dpi=110)

    comp = table[(table.metric == "recovered_map") & table.variant.isin(variants)]
    if comp.empty or not variants:
        return
    seed = int(comp.seed.min())
    planted = _curve(table, "planted_map", variants[0], seed)
    K = len(planted) // (P * N)
    planted = planted.reshape(K, P, N)

    # 1) recovered vs planted maps, condition 0
    fig, axes = plt_.subplots(P, 1, figsize=(8, 1.7 * P + 0.6), squeeze=False, sharex=True)
    for q in range(P):
        ax = axes[q, 0]
        ax.bar(np.arange(N), planted[0, q], color="0.8", label="planted")
        for v in variants:
            rec = _curve(table, "recovered_map", v, seed)
            if len(rec):
                ax.plot(np.arange(N), rec.reshape(K, P, N)[0, q], ".-", color=COLORS[v], lw=1, ms=3, label=v)
        ax.set_ylabel(f"comp {q} (cat {cat[q]})\nweight (a.u.)", fontsize=7)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=6, ncol=6, loc="upper right")
    axes[-1, 0].set_xlabel("channel")
    fig.suptitle(f"Do the recovered spatial maps match the planted ones? (condition 0, seed {seed})", fontsize=9)
    save_figure(fig, plots_dir / "curve_recovered_map.png", dpi=110)

    # 2) per-category structure: each component's map in every condition, planted vs MILCCI
    rec = _curve(table, "recovered_map", "milcci", seed)
    cols = 2 if len(rec) else 1
    fig, axes = plt_.subplots(P, cols, figsize=(4.5 * cols, 1.5 * P + 0.8), squeeze=False)
    for q in range(P):
        panels = [("planted", planted[:, q])] + ([("MILCCI", rec.reshape(K, P, N)[:, q])] if len(rec) else [])
        for j, (name, img) in enumerate(panels):
            ax = axes[q, j]
            ax.imshow(img, aspect="auto", cmap="viridis", interpolation="nearest")
            ax.set_ylabel(f"comp {q} (cat {cat[q]})\ncondition", fontsize=7)
            ax.set_title(f"{name}", fontsize=7)
            ax.tick_params(labelsize=6)
        for ax in axes[-1]:
            ax.set_xlabel("channel", fontsize=7)
    fig.suptitle(f"Does each map change only with its own category's label? (rows: conditions, seed {seed})",
                 fontsize=9)
    save_figure(fig, plots_dir / "curve_planted_map.png", dpi=110)

    # 3) recovered vs planted traces, the first training trial of three conditions
    pt = _curve(table, "planted_trace", variants[0], seed).reshape(K, P, T)
    t = np.arange(T)
    shown = list(range(min(3, K)))
    fig, axes = plt_.subplots(P, len(shown), figsize=(3.6 * len(shown), 1.6 * P + 0.6), squeeze=False, sharex=True)
    for q in range(P):
        for j, k in enumerate(shown):
            ax = axes[q, j]
            ax.plot(t, pt[k, q], color="k", lw=2, alpha=0.5, label="planted")
            for v in variants:
                rt = _curve(table, "recovered_trace", v, seed)
                if len(rt):
                    ax.plot(t, rt.reshape(K, P, T)[k, q], color=COLORS[v], lw=1, label=v)
            ax.tick_params(labelsize=6)
            if j == 0:
                ax.set_ylabel(f"comp {q}\nactivity (a.u.)", fontsize=7)
            if q == 0:
                ax.set_title(f"trial of condition {k}", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("time bin", fontsize=7)
    axes[0, 0].legend(fontsize=5)
    fig.suptitle(f"Do the recovered temporal traces follow the planted ones trial by trial? (seed {seed})",
                 fontsize=9)
    save_figure(fig, plots_dir / "curve_recovered_trace.png", dpi=110)

    # 4) the planted traces: cross-trial variability
    fig, axes = plt_.subplots(1, P, figsize=(3.2 * P, 2.6), squeeze=False)
    for q in range(P):
        for k in range(K):
            axes[0, q].plot(t, pt[k, q], lw=1, label=f"cond {k}")
        axes[0, q].set_title(f"planted comp {q} (cat {cat[q]})", fontsize=8)
        axes[0, q].set_xlabel("time bin", fontsize=7)
    axes[0, 0].set_ylabel("activity (a.u.)", fontsize=7)
    axes[0, 0].legend(fontsize=5)
    fig.suptitle("How much do the planted traces vary across trials? (one trial per condition)", fontsize=9)
    save_figure(fig, plots_dir / "curve_planted_trace.png", dpi=110)
