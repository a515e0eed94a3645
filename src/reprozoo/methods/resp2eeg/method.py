"""resp2eeg: synthesise sleep-EEG spectrogram tokens from breathing, then use them downstream.

Three disjoint sets of simulated nights per seed (``data.py``), in this order:

* the **pool** (``n_pool``): paired breathing + EEG, no labels. It alone fixes the spectrogram
  scaling, the k-means codebook (the discrete EEG target space) and trains the breathing ->
  token translator (``model.py``; its last 15 % of nights are the translator's validation set).
  The paper's translator learns from 28 000 nights, far more than any labelled set, so the pool
  is about ten times the labelled set.
* the **labelled** nights (``n_labelled``): stages, age and sex. Every downstream model and the
  breathing-only baselines are fitted here. The translator never saw them, so their synthetic EEG
  is out of sample (cross-fitted) like the test nights'.
* the **test** nights (``n_test``): every score, per test night (the claims' units).

``train_shared`` (per seed) simulates, scales, tokenises, trains the translator and synthesises the
EEG of the labelled and test nights (the centroid of each frame's most likely token; the
expected spectrogram under the predicted token distribution is scored as a spectrogram only,
``spec_mae_mean_decoding``: no claim reads a downstream job of it).

Variants (``train``): the same downstream learners and tuning (``features.py``) on
* resp2eeg: fitted on the labelled nights' synthetic EEG, applied to the test nights' synthetic EEG;
* real_eeg: fitted and tested on real EEG (the ceiling);
* breathing_features: fitted and tested on multitaper breathing features;
* breathing_transformer: the translator's network and training rule, trained on the labelled
  nights' stages from the breathing waveform; age and sex from its night-averaged hidden states.

Units: spectrogram MAE and token accuracy are means over a test night's frames; stage accuracy
over its epochs; age error in years; the sex AUROC's placement value (its mean over the test
nights is the AUROC). The negative control (``*_shuffled``): the resp2eeg models
applied to the synthetic EEG of another test night (night i scored against night i + 1's EEG).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .data import EEG_SFREQ, RESP_SFREQ, simulate
from .features import (FRAME_S, Scale, eeg_epoch_features, evaluate_downstream, fit_codebook, fit_downstream,
                       fit_subject_models, multitaper_frames, night_summary, resp_epoch_features, score_subjects)
from reprozoo.figures import save_figure

STAGE_NAMES = ["W", "N1", "N2", "N3", "REM"]
VARIANTS = ["resp2eeg", "real_eeg", "breathing_features", "breathing_transformer"]
GENERIC_CURVES = ["val_loss"]
SHARED = "resp2eeg_shared.npz"
UNIT_METRICS = ("stage_acc", "age_mae", "stage_acc_const", "age_mae_const", "sex_auroc")


def _split(p):
    return int(p["n_pool"]), int(p["n_labelled"]), int(p["n_test"])


def _load_nights(ctx, n: int) -> dict:
    p = ctx.params
    if p.get("source", "simulator") == "simulator":
        return simulate(n, int(p["epochs_per_subject"]), ctx.rng())
    from .real_data import load_nights  # paper scale: real PSG from the project's reader, shuffled per seed

    d = load_nights(Path(ctx.data[p["source"]]), p)
    order = ctx.rng().permutation(len(d["eeg"]))[:n]
    return {k: (v[order] if isinstance(v, np.ndarray) else v) for k, v in d.items()}


def train_shared(ctx) -> None:
    import torch

    from .model import predict, train_encoder

    torch.set_num_threads(max(1, ctx.threads))
    p = ctx.params
    n_pool, n_lab, n_test = _split(p)
    d = _load_nights(ctx, n_pool + n_lab + n_test)
    eeg_sfreq = float(d.get("eeg_sfreq", EEG_SFREQ))
    s, e, _ = d["eeg"].shape
    fpe = int(round(30.0 / FRAME_S))  # frames per 30-s epoch
    logp, freqs = multitaper_frames(d["eeg"].reshape(s, -1), eeg_sfreq)  # (S, T, F)
    scale = Scale(logp[:n_pool])
    spec = scale(logp)
    log_range = float(scale.hi - scale.lo)  # log10 units per scaled unit (the spindle criterion)
    ctx.progress(f"{s} nights ({n_pool} pool, {n_lab} labelled, {n_test} test) x {e} epochs; spectrogram {spec.shape}")
    k = int(p["codebook"])
    km = fit_codebook(spec[:n_pool].reshape(-1, spec.shape[-1]), k, ctx.seed)
    tokens = km.predict(spec.reshape(-1, spec.shape[-1]).astype(np.float64)).reshape(s, -1)
    centers = km.cluster_centers_.astype(np.float32)
    patch = int(FRAME_S * RESP_SFREQ)
    resp = d["resp"].reshape(s, -1)
    mu, sd = resp[:n_pool].mean(), resp[:n_pool].std()
    patches = ((resp - mu) / sd).reshape(s, -1, patch).astype(np.float32)
    tp = dict(p["transformer"])
    model, hist = train_encoder(patches[:n_pool], tokens[:n_pool], k, tp, ctx.seed, log=ctx.progress, label="translator")
    logits, _ = predict(model, patches[n_pool:], int(tp["seq_len"]))  # labelled + test nights, unseen
    syn = centers[logits.argmax(-1)]  # (S, T, F): the most likely token's centroid
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    syn_mean = prob @ centers  # expected spectrogram under the predicted token distribution (scored only)
    te = slice(n_lab, n_lab + n_test)  # test nights within the unseen ones
    real, tok_te = spec[n_pool + n_lab:], tokens[n_pool + n_lab:]
    majority = int(np.bincount(tokens[:n_pool].ravel(), minlength=k).argmax())
    mean_frame = spec[:n_pool].mean((0, 1))
    other = np.roll(np.arange(n_test), -1)  # night i against night i + 1's synthetic EEG

    def per_night(x):
        return x.reshape(n_test, -1).mean(1).tolist()

    units = {"spec_mae": per_night(np.abs(syn[te] - real)),
             "spec_mae_mean_decoding": per_night(np.abs(syn_mean[te] - real)),
             "spec_mae_meanframe": per_night(np.abs(mean_frame - real)),
             "spec_mae_shuffled": per_night(np.abs(syn[te][other] - real)),
             "token_floor_mae": per_night(np.abs(centers[tok_te] - real)),
             "token_acc": per_night(logits[te].argmax(-1) == tok_te),
             "token_acc_majority": per_night(tok_te == majority)}
    scalars = {"lr_chosen": hist["lr_chosen"], "stop_step": hist["stop_step"],
               "plateau": float(hist["plateau"])}
    ctx.progress(f"spectrogram MAE {np.mean(units['spec_mae']):.4f} (mean frame {np.mean(units['spec_mae_meanframe']):.4f}, "
                 f"token floor {np.mean(units['token_floor_mae']):.4f}); token accuracy {np.mean(units['token_acc']):.3f} "
                 f"(majority token {np.mean(units['token_acc_majority']):.3f})")

    def epochs(x):
        return x.reshape(x.shape[0], e, fpe, x.shape[-1])

    lab_test = slice(n_pool, s)
    np.savez_compressed(
        Path(ctx.shared_dir) / SHARED,
        eeg_feat=eeg_epoch_features(epochs(spec[lab_test]), freqs, log_range).astype(np.float32),
        syn_feat=eeg_epoch_features(epochs(syn), freqs, log_range).astype(np.float32),
        resp_feat=resp_epoch_features(d["resp"][lab_test].astype(np.float64), RESP_SFREQ).astype(np.float32),
        patches=patches[lab_test], stage=d["stage"][lab_test], age=d["age"][lab_test], sex=d["sex"][lab_test],
        freqs=freqs, example_real=real[0, : int(p["example_frames"])],
        example_syn=syn[te][0, : int(p["example_frames"])])
    (Path(ctx.shared_dir) / "resp2eeg_shared.json").write_text(
        json.dumps({"units": units, "scalars": scalars, "curves": hist["curves"]}))


# metric names of a downstream result, and of the same result in the negative control
NAMES = {k: k for k in UNIT_METRICS}
SHUFFLED_NAMES = {"stage_acc": "stage_acc_shuffled", "age_mae": "age_mae_shuffled",
                  "stage_acc_const": "stage_acc_const_shuffled", "age_mae_const": "age_mae_const_shuffled",
                  "sex_auroc": "sex_auroc_shuffled"}


def _record(ctx, res: dict, names: dict = NAMES) -> None:
    for key in UNIT_METRICS:  # sex_auroc: per-night placement values, whose mean is the AUROC
        ctx.metrics.units(names[key], res[key])


def _record_curves(ctx, curves: dict) -> None:
    for name, (xs, ys) in curves.items():
        ctx.metrics.curve(name, xs, ys)


def train(ctx) -> None:
    p = ctx.params
    _, n_lab, n_test = _split(p)
    z = np.load(Path(ctx.shared_dir) / SHARED)
    stage, age, sex = z["stage"], z["age"], z["sex"]
    lab, te = slice(0, n_lab), slice(n_lab, n_lab + n_test)
    v = ctx.variant
    feats = {"resp2eeg": z["syn_feat"], "real_eeg": z["eeg_feat"],
             "breathing_features": z["resp_feat"]}
    if v in feats:
        f = feats[v]
        models = fit_downstream(f[lab], stage[lab], age[lab], sex[lab])
        res = evaluate_downstream(models, f[te], stage[te], age[te], sex[te])
        if v == "resp2eeg":  # negative control: night i scored on night i + 1's synthetic EEG
            other = np.roll(np.arange(n_test), -1)
            ctl = evaluate_downstream(models, f[te][other], stage[te], age[te], sex[te])
            _record(ctx, ctl, SHUFFLED_NAMES)
    elif v == "breathing_transformer":
        res = _breathing_transformer(ctx, z, lab, te)
    else:
        raise ValueError(f"unknown variant {v}")
    x = np.arange(stage.shape[1]) * 0.5  # minutes
    ctx.metrics.curve("hypno_true", x, stage[te][0])
    ctx.metrics.curve("hypno_pred", x, res.pop("stage_pred")[0])
    _record(ctx, res)
    if v == "resp2eeg":  # the shared translator: its scores, curves and examples
        shared = json.loads((Path(ctx.shared_dir) / "resp2eeg_shared.json").read_text())
        for name, vals in shared["units"].items():
            ctx.metrics.units(name, vals)
        for name, val in shared["scalars"].items():
            ctx.metrics.scalar(name, val)
        _record_curves(ctx, shared["curves"])
        fr = np.arange(z["example_real"].shape[0])
        nf = z["example_real"].shape[1]
        idx = (fr[:, None] * nf + np.arange(nf)[None]).ravel()
        ctx.metrics.curve("spec_example_real", idx, z["example_real"].ravel())
        ctx.metrics.curve("spec_example_syn", idx, z["example_syn"].ravel())
        ctx.metrics.scalar("spec_example_nfreq", nf)
    ctx.progress(f"stage acc {np.mean(res['stage_acc']):.3f}, age MAE {np.mean(res['age_mae']):.2f} y, "
                 f"sex AUROC {np.mean(res['sex_auroc']):.3f}")


def _breathing_transformer(ctx, z, lab, te) -> dict:
    """The translator's network and training rule, trained on the labelled nights' stages;
    age/sex from its night-averaged hidden states, with the downstream learners' tuning."""
    import torch

    from .model import predict, train_encoder

    torch.set_num_threads(max(1, ctx.threads))
    tp = dict(ctx.params["transformer"])
    patches, stage = z["patches"], z["stage"]
    e = stage.shape[1]
    fpe = patches.shape[1] // e
    target = np.repeat(stage, fpe, axis=1)
    model, hist = train_encoder(patches[lab], target[lab], len(STAGE_NAMES), tp, ctx.seed + 7, log=ctx.progress,
                                label="breathing_transformer")
    _record_curves(ctx, hist["curves"])
    ctx.metrics.scalar("lr_chosen", hist["lr_chosen"])
    ctx.metrics.scalar("stop_step", hist["stop_step"])
    logits_te, h_te = predict(model, patches[te], int(tp["seq_len"]))
    _, h_lab = predict(model, patches[lab], int(tp["seq_len"]))
    pred = logits_te.reshape(logits_te.shape[0], e, fpe, -1).mean(2).argmax(-1)
    age, sex = z["age"], z["sex"]
    m = fit_subject_models(night_summary(h_lab), age[lab], sex[lab])
    m["stage_majority"] = int(np.bincount(stage[lab].ravel()).argmax())
    xn = night_summary(h_te)
    return score_subjects(m, pred, stage[te], m["age"].predict(xn), age[te], m["sex"].predict_proba(xn)[:, 1], sex[te])


# --- plots -----------------------------------------------------------------------------------

def plot(table, plots_dir, params) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = table[table["method"] == "resp2eeg"] if "method" in table else table
    if t.empty:
        return
    plots_dir = Path(plots_dir)
    seeds = sorted(t["seed"].unique())
    seed0 = seeds[0]

    def curve(variant, metric, seed=seed0):
        c = t[(t["variant"] == variant) & (t["metric"] == metric) & (t["seed"] == seed)].sort_values("x")
        return c["x"].to_numpy(), c["value"].to_numpy()

    # 1. hypnograms: truth vs staged from synthetic EEG (and the other sources)
    present = [v for v in VARIANTS if ((t["variant"] == v) & (t["metric"] == "hypno_pred")).any()]
    if present:
        fig, ax = plt.subplots(figsize=(11, 3.8))
        for v in present[:1] or present:
            x, y = curve(v, "hypno_true")
            ax.step(x, y, where="post", color="k", lw=2.0, label="true (hidden) hypnogram")
            break
        styles = {"resp2eeg": ("C0", "-"), "real_eeg": ("C2", "--"), "breathing_features": ("C3", ":"),
                  "breathing_transformer": ("C1", "-.")}
        for v in present:
            x, y = curve(v, "hypno_pred")
            c, ls = styles[v]
            ax.step(x, y + 0.08 * (present.index(v) + 1), where="post", color=c, ls=ls, lw=1.0,
                    label=f"staged from {v}")
        ax.set_yticks(range(5), STAGE_NAMES)
        ax.invert_yaxis()
        ax.set_xlabel("time in night (min)")
        ax.set_ylabel("sleep stage")
        ax.set_title(f"Does EEG synthesised from breathing recover the hypnogram? (test subject 0, seed {seed0})")
        ax.legend(fontsize=7, loc="lower right")
        save_figure(fig, plots_dir / "hypnogram.png", dpi=100)

    # 2. example spectrograms, real vs synthetic
    _, real = curve("resp2eeg", "spec_example_real")
    _, syn = curve("resp2eeg", "spec_example_syn")
    nf = t[(t["metric"] == "spec_example_nfreq") & (t["variant"] == "resp2eeg")]["value"]
    if len(real) and len(nf):
        nf = int(nf.iloc[0])
        fmin, fmax = 0.5, 25.0
        fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
        ext = [0, len(real) // nf * 5 / 60, fmin, fmax]
        for ax, img, name in zip(axes, (real, syn), ("real (simulated ground-truth) EEG", "synthesised from breathing")):
            im = ax.imshow(img.reshape(-1, nf).T, aspect="auto", origin="lower", extent=ext, vmin=0, vmax=1,
                           cmap="magma")
            ax.set_ylabel("frequency (Hz)")
            ax.set_title(name)
            fig.colorbar(im, ax=ax, label="scaled log10 power")
        axes[-1].set_xlabel("time (min)")
        fig.suptitle(f"Does the synthetic multitaper spectrogram look like the real one? (test subject 0, seed {seed0})")
        save_figure(fig, plots_dir / "spectrograms.png", dpi=100)

    # 3. downstream scores per input source, mean and seed spread
    metrics = [("stage_acc", "sleep staging accuracy"), ("age_mae", "age MAE (years)"), ("sex_auroc", "sex AUROC")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (m, lab) in zip(axes, metrics):
        for i, v in enumerate(VARIANTS):
            vals = t[(t["variant"] == v) & (t["metric"] == m) & t["x"].isna()]["value"].to_numpy()
            if not len(vals):
                continue
            ax.bar(i, vals.mean(), color=f"C{i}", alpha=0.6)
            ax.errorbar(i, vals.mean(), yerr=vals.std(ddof=1) if len(vals) > 1 else 0, color="k", capsize=4)
            ax.scatter(np.full(len(vals), i), vals, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(VARIANTS)), ["synthetic\nEEG", "real\nEEG", "breathing\nfeatures",
                                             "breathing\ntransformer"], fontsize=8)
        ax.set_ylabel(lab)
    fig.suptitle(f"Is synthetic EEG as useful as real EEG, and more than breathing? (bars: mean, "
                 f"whiskers: s.d. over {len(seeds)} seeds, dots: seeds)")
    save_figure(fig, plots_dir / "downstream.png", dpi=100)
