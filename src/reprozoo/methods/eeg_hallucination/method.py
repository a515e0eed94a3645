"""EEG signatures of humans verifying MLLM hallucinations, in miniature: the ERP pipeline validated
on a simulated 27-participant study with planted effects.

Stages
1. ``train_shared`` (per seed): one mne forward model (sphere head, 19 electrodes of the 10-20
   system, planted dipoles jittered per subject), then two studies drawn with it
   (:mod:`.study`): ``planted`` (detected hallucinations carry a larger N400 at ``n400_ms`` and
   P600 at ``p600_ms``; missed hallucinations are like correct content), ``null`` (no condition
   effect at all) and ``partial`` (as ``planted``, but missed hallucinations carry
   ``missed_partial_fraction`` of each subject's detected effect: the positive control of the
   "missed like correct" claims). Each subject's continuous EEG goes through mne: average reference, FIR
   band-pass ``l_freq``-``h_freq`` Hz, epochs ``tmin``..``tmax`` s with baseline correction and
   peak-to-peak rejection at ``reject_uv`` uV, evoked averages per condition. Saved: evoked
   averages (V), single trials binned to ``bin_s`` for decoding, the truth of the planted effects.
2. ``train`` (per variant): group statistics (:mod:`.erp_stats`) over the post-stimulus window
   0..``tmax`` s and leave-one-subject-out decoding (:mod:`.decoding`); per subject, the a-priori
   window-mean pathway index of missed - correct and detected - correct
   (:func:`.erp_stats.pathway_index`) for the equivalence claim and its TOST.

Variants
* ``erp_pipeline`` (method): planted study; spatio-temporal cluster permutation tests of
  detected - correct (recover N400/P600 latency and electrode), missed - correct and
  detected - missed; xDAWN + logistic regression decoding of detected vs correct.
* ``null_study`` (baseline): the same pipeline on the null study, on ``1 + n_shuffles`` null
  contrasts of detected - correct and as many of detected - missed (true labels and within-subject
  label shuffles): its false-positive rates, one unit per contrast.
* ``uncorrected`` (baseline): pointwise paired t-tests at ``alpha``, no multiple-comparison
  correction, on the same null contrasts: what the cluster correction buys.
* ``raw_lr`` (baseline): decoding without the xDAWN spatial filter (same features, folds, C).
* ``missed_partial`` (baseline, positive control): the ``partial`` study through the same
  missed - correct analysis (cluster test, window-mean index, TOST): what a real but partial
  missed-trial response looks like to the tests that call missed "like correct".

Units: latencies ms, amplitudes uV (evoked stored in V), AUC and balanced accuracy in [0, 1].
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CONTRASTS = {"detected_vs_correct": ("detected", "correct"), "missed_vs_correct": ("missed", "correct"),
             "detected_vs_missed": ("detected", "missed")}
GENERIC_CURVES: list[str] = []  # every figure is drawn by plot()


def _study_params(p: dict) -> dict:
    return {k: p[k] for k in ("sfreq", "n_subjects", "n_trials", "soa_s", "subj_lat_sd_ms", "trial_lat_sd_ms",
                              "n400_ms", "p600_ms", "effect_uv", "effect_sd_uv", "background_uv", "white_uv",
                              "drift_uv", "blink_rate", "l_freq", "h_freq", "tmin", "tmax", "reject_uv")}


def train_shared(ctx) -> None:
    """One forward model per seed; the planted and the null study drawn with it."""
    import mne

    from reprozoo.data.eeg.simulate import TEN_TWENTY, head_model

    from . import decoding, study

    mne.set_log_level("ERROR")
    p = _study_params(ctx.params)
    rng = ctx.rng()
    head = head_model(list(TEN_TWENTY), study.PLANTED, p["n_subjects"], rng)
    n_shuf = int(ctx.params["n_shuffles"])
    studies = [("planted", True, 0, 0.0), ("null", False, n_shuf, 0.0),
               ("partial", True, 0, float(ctx.params["missed_partial_fraction"]))]  # drawn last: the
    for name, effect, n, frac in studies:  # planted and null studies keep their random streams
        ctx.progress(f"simulating the {name} study ({p['n_subjects']} subjects)")
        d = study.simulate_study(p, rng, head=head, effect=effect, n_shuffles=n, missed_fraction=frac,
                                 n_dvm_shuffles=n)
        Xb, tb = decoding.bin_time(d["trials"], d["times"], ctx.params["decode_tmin"], p["tmax"], ctx.params["bin_s"])
        np.savez(Path(ctx.shared_dir) / f"{name}.npz", times=d["times"], trials=Xb.astype(np.float32), bin_times=tb,
                 labels=d["labels"], groups=d["groups"], shuffled=d["shuffled"], dvm_shuffled=d["dvm_shuffled"],
                 **{f"evoked_{c}": v for c, v in d["evoked"].items()})
        meta = {k: d[k] for k in ("ch_names", "sfreq", "truth", "n_rejected", "n_blinks", "n_epochs")}
        (Path(ctx.shared_dir) / f"{name}.json").write_text(json.dumps(meta, indent=1))
    if ctx.params.get("data_path"):  # paper scale: the released recordings, same pipeline
        from . import real_data

        ctx.progress(f"reading the released study from {ctx.params['data_path']}")
        d = real_data.load_study(ctx.params["data_path"], {**p, "event_map": ctx.params.get("event_map")})
        Xb, tb = decoding.bin_time(d["trials"], d["times"], ctx.params["decode_tmin"], p["tmax"], ctx.params["bin_s"])
        np.savez(Path(ctx.shared_dir) / "real.npz", times=d["times"], trials=Xb.astype(np.float32), bin_times=tb,
                 labels=d["labels"], groups=d["groups"], **{f"evoked_{c}": v for c, v in d["evoked"].items()})
        (Path(ctx.shared_dir) / "real.json").write_text(json.dumps(
            {"ch_names": d["ch_names"], "sfreq": d["sfreq"], "subjects": d["subjects"]}, indent=1))


def _load(ctx, name: str):
    d = dict(np.load(Path(ctx.shared_dir) / f"{name}.npz"))
    meta = json.loads((Path(ctx.shared_dir) / f"{name}.json").read_text())
    return d, meta


def _post(d: dict):
    post = d["times"] >= 0.0
    return post, d["times"][post]


def _contrast(d: dict, a: str, b: str, post) -> np.ndarray:
    return (d[f"evoked_{a}"] - d[f"evoked_{b}"])[:, :, post] * 1e6  # (n_subj, n_ch, n_times) uV


def _null_contrasts(d: dict, post, kind: str = "detected_vs_correct") -> list[np.ndarray]:
    """The null study's contrast (detected - correct, or detected - missed), then each within-subject
    label shuffle of the same two conditions."""
    a, b = CONTRASTS[kind]
    key = "shuffled" if kind == "detected_vs_correct" else "dvm_shuffled"
    return [_contrast(d, a, b, post)] + [(s[0] - s[1])[:, :, post] * 1e6 for s in d[key]]


def _record_erp(ctx, d, meta, res: dict, post) -> None:
    """Curves for the figures: grand averages with 95 % t bands at each effect's peak electrode,
    and the grand-average difference topography at its peak latency with the cluster's channels."""
    from scipy import stats

    ch = meta["ch_names"]
    t_ms = d["times"] * 1e3
    n = d["evoked_correct"].shape[0]
    q = stats.t.ppf(0.975, n - 1)
    ga_diff = _contrast(d, "detected", "correct", post).mean(0)
    for k, r in res.items():
        ci = ch.index(r["peak_ch"] or meta["truth"][k]["true_peak_ch"])
        ctx.metrics.scalar(f"{k}_peak_ch_idx", ci)
        for c in ("correct", "detected", "missed"):
            e = d[f"evoked_{c}"][:, ci] * 1e6
            ctx.metrics.curve(f"erp_{k}_{c}", t_ms, e.mean(0))
            ctx.metrics.curve(f"erp_{k}_{c}_ci", t_ms, q * e.std(0, ddof=1) / np.sqrt(n))
        lat = r["latency_ms"] if np.isfinite(r["latency_ms"]) else meta["truth"][k]["true_latency_ms"]
        ti = int(np.argmin(np.abs(d["times"][post] * 1e3 - lat)))
        ctx.metrics.curve(f"topo_{k}", range(len(ch)), ga_diff[:, ti])
        mask = r["mask"][:, ti] if r["significant"] else np.zeros(len(ch), bool)
        ctx.metrics.curve(f"topo_{k}_mask", range(len(ch)), mask.astype(float))
        ctx.metrics.scalar(f"{k}_topo_latency_ms", d["times"][post][ti] * 1e3)


def _cluster_recovery(ctx, d, meta, adj, post, tp) -> dict:
    """detected - correct: the planted N400 (negative) and P600 (positive) clusters."""
    from . import erp_stats

    p = ctx.params
    diff = _contrast(d, "detected", "correct", post)
    clusters = erp_stats.cluster_test(diff, adj, p["n_permutations"], p["alpha"], ctx.seed)
    ga = diff.mean(0)
    res = {}
    for k, sign in (("n400", -1.0), ("p600", 1.0)):
        win = p[f"{k}_window_ms"]
        r = erp_stats.recover(clusters, ga, tp, meta["ch_names"], sign, p["alpha"], window_ms=win)
        truth = meta["truth"][k]
        ctx.metrics.scalar(f"{k}_p", r["p"])
        ctx.metrics.scalar(f"{k}_latency_ms", r["latency_ms"])
        ctx.metrics.scalar(f"{k}_lat_err_ms", abs(r["latency_ms"] - truth["true_latency_ms"])
                           if np.isfinite(r["latency_ms"]) else 1e3)
        ctx.metrics.scalar(f"{k}_area_latency_ms", r["area_latency_ms"])
        ctx.metrics.scalar(f"{k}_area_lat_err_ms", abs(r["area_latency_ms"] - truth["true_latency_ms"])
                           if np.isfinite(r["area_latency_ms"]) else 1e3)
        ctx.metrics.scalar(f"{k}_ch_hit", float(r["peak_ch"] == truth["true_peak_ch"]))
        ctx.progress(f"{k}: p={r['p']:.3f} peak {r['latency_ms']:.1f} ms, 50% area {r['area_latency_ms']:.1f} ms "
                     f"at {r['peak_ch']} "
                     f"(planted {truth['true_latency_ms']:.0f} ms at {truth['true_peak_ch']})")
        res[k] = r
    return res


def _fpr(ctx, contrasts, adj, tp, lat_ms, kind: str, prefix: str = "") -> None:
    """False-positive rate over null contrasts: any significant finding, and one at a planted latency.
    Units: the null contrasts (``null_hit_*``: 0/1 per contrast, paired across the cluster and the
    uncorrected variants, which read the same contrasts)."""
    from . import erp_stats

    p = ctx.params
    at_lat, anywhere = [], []
    for i, diff in enumerate(contrasts):
        if kind == "cluster":
            cl = [c for c in erp_stats.cluster_test(diff, adj, p["n_permutations"], p["alpha"], ctx.seed * 100 + i)
                  if c["p"] < p["alpha"]]
            masks = [c["mask"] for c in cl]
        else:
            hits = erp_stats.uncorrected_hits(diff, p["alpha"])
            masks = [hits] if hits.any() else []
        anywhere.append(float(bool(masks)))
        at_lat.append(float(any(erp_stats.covers(m, tp, lat_ms, p["latency_tol_ms"]) for m in masks)))
    ctx.metrics.scalar(f"{prefix}fpr_at_latency", np.mean(at_lat))
    ctx.metrics.scalar(f"{prefix}fpr_any", np.mean(anywhere))
    ctx.metrics.units(f"{prefix}null_hit_at_latency", at_lat)
    ctx.metrics.units(f"{prefix}null_hit_any", anywhere)
    ctx.metrics.scalar(f"{prefix}n_null_contrasts", len(contrasts))
    ctx.progress(f"{kind} {prefix or 'detected_vs_correct_'}: false positives at the planted latencies "
                 f"{np.mean(at_lat):.2f}, anywhere {np.mean(anywhere):.2f} over {len(contrasts)} null contrasts")


def _missed_effect(ctx, d, ch_names, post, tp, prefix: str = "") -> None:
    """The equivalence analysis of missed - correct: per subject the a-priori window-mean pathway
    index of missed - correct and of detected - correct (units: subjects), the two-sided t-test
    of the missed index (can the pipeline see a missed-trial response?) and the TOST of the
    missed index against +-``equivalence_margin`` times the study's mean detected index."""
    from scipy import stats

    from . import erp_stats

    p = ctx.params
    if not all(ch in ch_names for ch in p["roi"].values()):
        ctx.progress(f"window-mean index skipped: ROI {p['roi']} not among the channels")
        return
    win = {k: p[f"{k}_window_ms"] for k in ("n400", "p600")}
    idx = {c: erp_stats.pathway_index(_contrast(d, c, "correct", post), tp, ch_names, p["roi"], win)
           for c in ("missed", "detected")}
    ctx.metrics.units(f"{prefix}missed_effect_uv", idx["missed"])
    ctx.metrics.units(f"{prefix}detected_effect_uv", idx["detected"])
    ratio = idx["missed"].mean() / idx["detected"].mean()
    ctx.metrics.scalar(f"{prefix}missed_ratio", ratio)
    p_t = float(stats.ttest_1samp(idx["missed"], 0.0).pvalue)
    ctx.metrics.scalar(f"{prefix}missed_roi_p", p_t)
    bound = p["equivalence_margin"] * abs(idx["detected"].mean())
    p_tost = erp_stats.tost_p(idx["missed"], -bound, bound)
    ctx.metrics.scalar(f"{prefix}missed_tost_p", p_tost)
    ctx.progress(f"window index: missed {idx['missed'].mean():.2f} uV, detected {idx['detected'].mean():.2f} uV "
                 f"(ratio {ratio:.3f}); missed t-test p={p_t:.3g}, TOST (+-{bound:.2f} uV) p={p_tost:.3g}")


def _min_p(ctx, d, cname: str, adj, post, prefix: str = "") -> None:
    from . import erp_stats

    p = ctx.params
    a, b = CONTRASTS[cname]
    cl = erp_stats.cluster_test(_contrast(d, a, b, post), adj, p["n_permutations"], p["alpha"], ctx.seed)
    ctx.metrics.scalar(f"{prefix}{cname}_min_p", min([c["p"] for c in cl], default=1.0))


def _decode(ctx, d, kind: str, prefix: str = "") -> None:
    from . import decoding

    m = np.isin(d["labels"], [1, 2])  # 1 = correct, 2 = detected (study.CONDITIONS order)
    r = decoding.loso(d["trials"][m], (d["labels"][m] == 2).astype(int), d["groups"][m], kind,
                      n_components=ctx.params["xdawn_components"], C=ctx.params["C"])
    ctx.metrics.scalar(f"{prefix}auc", r["auc"].mean())
    ctx.metrics.scalar(f"{prefix}bacc", r["bacc"].mean())
    ctx.metrics.curve(f"{prefix}auc_subject", r["subject"], r["auc"])
    ctx.metrics.curve(f"{prefix}bacc_subject", r["subject"], r["bacc"])
    ctx.progress(f"{kind} LOSO: AUC {r['auc'].mean():.3f}, balanced accuracy {r['bacc'].mean():.3f}")


def _real_analysis(ctx) -> None:
    """Paper scale: the same contrasts on the released recordings (no ground truth: p-values,
    peak latencies and electrodes are reported, not scored)."""
    from . import erp_stats

    p = ctx.params
    d, meta = _load(ctx, "real")
    post, tp = _post(d)
    adj = erp_stats.adjacency(meta["ch_names"], meta["sfreq"])
    _missed_effect(ctx, d, meta["ch_names"], post, tp, prefix="real_")
    for cname, (a, b) in CONTRASTS.items():
        diff = _contrast(d, a, b, post)
        cl = erp_stats.cluster_test(diff, adj, p["n_permutations"], p["alpha"], ctx.seed)
        ctx.metrics.scalar(f"real_{cname}_min_p", min([c["p"] for c in cl], default=1.0))
        if cname == "detected_vs_correct":
            for k, sign in (("n400", -1.0), ("p600", 1.0)):
                r = erp_stats.recover(cl, diff.mean(0), tp, meta["ch_names"], sign, p["alpha"],
                                      window_ms=p[f"{k}_window_ms"])
                ctx.metrics.scalar(f"real_{k}_p", r["p"])
                ctx.metrics.scalar(f"real_{k}_area_latency_ms", r["area_latency_ms"])
    _decode(ctx, d, "xdawn", prefix="real_")


def train(ctx) -> None:
    import mne

    from . import erp_stats

    mne.set_log_level("ERROR")
    v = ctx.variant
    name = {"null_study": "null", "uncorrected": "null", "missed_partial": "partial"}.get(v, "planted")
    d, meta = _load(ctx, name)
    post, tp = _post(d)
    adj = erp_stats.adjacency(meta["ch_names"], meta["sfreq"])
    lat_ms = [meta["truth"][k]["true_latency_ms"] for k in ("n400", "p600")]
    ctx.metrics.scalar("rejected_frac", meta["n_rejected"] / (meta["n_epochs"] + meta["n_rejected"]))
    if v == "erp_pipeline":
        res = _cluster_recovery(ctx, d, meta, adj, post, tp)
        for cname in ("missed_vs_correct", "detected_vs_missed"):
            _min_p(ctx, d, cname, adj, post)
        _missed_effect(ctx, d, meta["ch_names"], post, tp)
        _record_erp(ctx, d, meta, res, post)
        _decode(ctx, d, "xdawn")
        if (Path(ctx.shared_dir) / "real.npz").exists():
            _real_analysis(ctx)
    elif v == "null_study":
        res = _cluster_recovery(ctx, d, meta, adj, post, tp)  # same analysis, nothing planted
        _record_erp(ctx, d, meta, res, post)
        _min_p(ctx, d, "detected_vs_missed", adj, post)  # the control of detected_vs_missed
        _fpr(ctx, _null_contrasts(d, post), adj, tp, lat_ms, "cluster")
        _fpr(ctx, _null_contrasts(d, post, "detected_vs_missed"), adj, tp, lat_ms, "cluster", prefix="dvm_")
        _decode(ctx, d, "xdawn")
    elif v == "uncorrected":
        _fpr(ctx, _null_contrasts(d, post), adj, tp, lat_ms, "uncorrected")
        _fpr(ctx, _null_contrasts(d, post, "detected_vs_missed"), adj, tp, lat_ms, "uncorrected", prefix="dvm_")
    elif v == "raw_lr":
        _decode(ctx, d, "raw")
    elif v == "missed_partial":  # the positive control: the same missed - correct analysis
        _min_p(ctx, d, "missed_vs_correct", adj, post)
        _missed_effect(ctx, d, meta["ch_names"], post, tp)
    else:
        raise ValueError(f"unknown variant {v!r}: erp_pipeline, null_study, uncorrected, raw_lr, missed_partial")


def plot(table, plots_dir, params) -> None:
    from .plots import plot_all

    plot_all(table, Path(plots_dir), params)
