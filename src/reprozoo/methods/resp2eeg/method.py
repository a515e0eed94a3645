"""resp2eeg: synthesise sleep-EEG spectrogram tokens from breathing, then use them downstream.

Pipeline per seed (``train_shared``): simulate nights (``data.py``), multitaper spectrograms of
the EEG in 5-s frames, a k-means codebook (the discrete EEG target space), the breathing ->
token transformer (``model.py``) trained on the training subjects, and the synthetic
spectrogram (codebook centroid of each predicted token) of every test subject.

Variants (``train``): the same downstream learners (``features.py``) read
* resp2eeg: models fit on the training subjects' real EEG, applied to the test subjects'
  synthetic EEG (the paper's use: an EEG model on EEG synthesised from breathing);
* real_eeg: the same models on the test subjects' real EEG (the ceiling);
* breathing_features: the same learners fit and tested on multitaper breathing features;
* breathing_transformer: the resp2eeg transformer (same size, steps, optimiser), trained on the
  stage of each patch directly; age and sex from its night-averaged hidden states.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .data import EEG_SFREQ, RESP_SFREQ, simulate
from .features import (FRAME_S, Scale, eeg_epoch_features, evaluate_downstream, fit_codebook, fit_downstream,
                       multitaper_frames, night_summary, resp_epoch_features)
from reprozoo.figures import save_figure

STAGE_NAMES = ["W", "N1", "N2", "N3", "REM"]
VARIANTS = ["resp2eeg", "resp2eeg_mean", "real_eeg", "breathing_features", "breathing_transformer"]
GENERIC_CURVES = ["val_loss"]
SHARED = "resp2eeg_shared.npz"


def _split(p):
    return int(p["n_train"]), int(p["n_test"])


def train_shared(ctx) -> None:
    import torch

    from .model import predict, train_encoder

    torch.set_num_threads(max(1, ctx.threads))
    p = ctx.params
    n_train, n_test = _split(p)
    if p.get("source", "simulator") == "simulator":
        d = simulate(n_train + n_test, int(p["epochs_per_subject"]), ctx.rng())
    else:  # paper scale: real PSG from the project's reader, nights shuffled per seed
        from .real_data import load_nights

        d = load_nights(Path(ctx.data[p["source"]]), p)
        order = ctx.rng().permutation(len(d["eeg"]))[: n_train + n_test]
        d = {k: (v[order] if isinstance(v, np.ndarray) else v) for k, v in d.items()}
    eeg_sfreq = float(d.get("eeg_sfreq", EEG_SFREQ))
    s, e, _ = d["eeg"].shape
    fpe = int(round(30.0 / FRAME_S))  # frames per 30-s epoch
    logp, freqs = multitaper_frames(d["eeg"].reshape(s, -1), eeg_sfreq)  # (S, T, F)
    scale = Scale(logp[:n_train])
    spec = scale(logp)
    ctx.progress(f"simulated {s} nights x {e} epochs; spectrogram {spec.shape}")
    k = int(p["codebook"])
    km = fit_codebook(spec[:n_train].reshape(-1, spec.shape[-1]), k, ctx.seed)
    tokens = km.predict(spec.reshape(-1, spec.shape[-1]).astype(np.float64)).reshape(s, -1)
    centers = km.cluster_centers_.astype(np.float32)
    patch = int(FRAME_S * RESP_SFREQ)
    resp = d["resp"].reshape(s, -1)
    mu, sd = resp[:n_train].mean(), resp[:n_train].std()
    patches = ((resp - mu) / sd).reshape(s, -1, patch).astype(np.float32)
    tp = dict(p["transformer"])
    model, curves = train_encoder(patches[:n_train], tokens[:n_train], k, tp, ctx.seed, log=ctx.progress)
    logits, _ = predict(model, patches[n_train:], int(tp["seq_len"]))
    tok_hat = logits.argmax(-1)
    syn = centers[tok_hat]  # (S_test, T, F) synthetic scaled spectrogram: the most likely token's centroid
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    syn_mean = prob @ centers  # ablation: expected spectrogram under the predicted token distribution
    real = spec[n_train:]
    metrics = {"spec_mae": float(np.abs(syn - real).mean()),
               "spec_mae_mean_decoding": float(np.abs(syn_mean - real).mean()),
               "token_floor_mae": float(np.abs(centers[tokens[n_train:]] - real).mean()),
               "marginal_mae": float(np.abs(spec[:n_train].mean((0, 1)) - real).mean()),
               "token_acc": float((tok_hat == tokens[n_train:]).mean()),
               "token_acc_chance": float(np.bincount(tokens[:n_train].ravel(), minlength=k).max()
                                         / tokens[:n_train].size)}
    ctx.progress(f"spectrogram MAE {metrics['spec_mae']:.4f} (token floor {metrics['token_floor_mae']:.4f}, "
                 f"marginal {metrics['marginal_mae']:.4f})")

    def epochs(x):
        return x.reshape(x.shape[0], e, fpe, x.shape[-1])

    np.savez_compressed(
        Path(ctx.shared_dir) / SHARED,
        eeg_feat=eeg_epoch_features(epochs(spec), freqs).astype(np.float32),
        syn_feat=eeg_epoch_features(epochs(syn), freqs).astype(np.float32),
        syn_mean_feat=eeg_epoch_features(epochs(syn_mean), freqs).astype(np.float32),
        resp_feat=resp_epoch_features(d["resp"].astype(np.float64), RESP_SFREQ).astype(np.float32),
        patches=patches, stage=d["stage"], age=d["age"], sex=d["sex"], freqs=freqs,
        example_real=real[0, : int(p["example_frames"])], example_syn=syn[0, : int(p["example_frames"])])
    (Path(ctx.shared_dir) / "resp2eeg_shared.json").write_text(json.dumps({"metrics": metrics, "curves": curves}))


def _record_hypnogram(ctx, stage_true, stage_pred) -> None:
    x = np.arange(stage_true.shape[1]) * 0.5  # minutes
    ctx.metrics.curve("hypno_true", x, stage_true[0])
    ctx.metrics.curve("hypno_pred", x, stage_pred[0])


def train(ctx) -> None:
    p = ctx.params
    n_train, n_test = _split(p)
    z = np.load(Path(ctx.shared_dir) / SHARED)
    stage, age, sex = z["stage"], z["age"], z["sex"]
    tr, te = slice(0, n_train), slice(n_train, n_train + n_test)
    v = ctx.variant
    if v in ("resp2eeg", "resp2eeg_mean", "real_eeg"):
        models = fit_downstream(z["eeg_feat"][tr], stage[tr], age[tr], sex[tr])
        # syn_*: test subjects only
        f_test = {"resp2eeg": z["syn_feat"], "resp2eeg_mean": z["syn_mean_feat"], "real_eeg": z["eeg_feat"][te]}[v]
        res = evaluate_downstream(models, f_test, stage[te], age[te], sex[te])
    elif v == "breathing_features":
        models = fit_downstream(z["resp_feat"][tr], stage[tr], age[tr], sex[tr])
        res = evaluate_downstream(models, z["resp_feat"][te], stage[te], age[te], sex[te])
    elif v == "breathing_transformer":
        res = _breathing_transformer(ctx, z, tr, te)
    else:
        raise ValueError(f"unknown variant {v}")
    _record_hypnogram(ctx, stage[te], res.pop("stage_pred"))
    for name, val in res.items():
        ctx.metrics.scalar(name, val)
    if v == "resp2eeg":
        shared = json.loads((Path(ctx.shared_dir) / "resp2eeg_shared.json").read_text())
        for name, val in shared["metrics"].items():
            ctx.metrics.scalar(name, val)
        for name, (xs, ys) in shared["curves"].items():
            ctx.metrics.curve(name, xs, ys)
        _record_slope(ctx, *shared["curves"]["val_loss"])
        fr = np.arange(z["example_real"].shape[0])
        nf = z["example_real"].shape[1]
        idx = (fr[:, None] * nf + np.arange(nf)[None]).ravel()
        ctx.metrics.curve("spec_example_real", idx, z["example_real"].ravel())
        ctx.metrics.curve("spec_example_syn", idx, z["example_syn"].ravel())
        ctx.metrics.scalar("spec_example_nfreq", nf)
    ctx.progress(", ".join(f"{k} {val:.3f}" for k, val in res.items()))


def _record_slope(ctx, xs, ys) -> None:
    """Validation-loss slope over the last quarter of training, per 1000 steps (flattening check)."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    q = xs >= xs[-1] * 0.75
    if q.sum() >= 2:
        ctx.metrics.scalar("val_loss_final_slope_per_1k", 1000 * np.polyfit(xs[q], ys[q], 1)[0])


def _breathing_transformer(ctx, z, tr, te) -> dict:
    """Same network and budget as the translator, trained on stages; age/sex from hidden states."""
    import torch
    from sklearn.linear_model import LogisticRegression, RidgeCV
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from .model import predict, train_encoder

    torch.set_num_threads(max(1, ctx.threads))
    tp = dict(ctx.params["transformer"])
    patches, stage = z["patches"], z["stage"]
    e = stage.shape[1]
    fpe = patches.shape[1] // e
    target = np.repeat(stage, fpe, axis=1)
    model, curves = train_encoder(patches[tr], target[tr], len(STAGE_NAMES), tp, ctx.seed + 7, log=ctx.progress)
    for name, (xs, ys) in curves.items():
        ctx.metrics.curve(name, xs, ys)
    _record_slope(ctx, *curves["val_loss"])
    logits_te, h_te = predict(model, patches[te], int(tp["seq_len"]))
    _, h_tr = predict(model, patches[tr], int(tp["seq_len"]))
    s_te = logits_te.shape[0]
    pred = logits_te.reshape(s_te, e, fpe, -1).mean(2).argmax(-1)
    xn_tr, xn_te = night_summary(h_tr), night_summary(h_te)
    age, sex = z["age"], z["sex"]
    ager = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-2, 3, 12))).fit(xn_tr, age[tr])
    sexer = make_pipeline(StandardScaler(), LogisticRegression(C=0.3, max_iter=1000)).fit(xn_tr, sex[tr])
    return {"stage_acc": float((pred == stage[te]).mean()),
            "age_mae": float(np.abs(ager.predict(xn_te) - age[te]).mean()),
            "sex_auroc": float(roc_auc_score(sex[te], sexer.predict_proba(xn_te)[:, 1])),
            "stage_pred": pred}


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
        styles = {"resp2eeg": ("C0", "-"), "resp2eeg_mean": ("C4", "-"), "real_eeg": ("C2", "--"), "breathing_features": ("C3", ":"),
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
        ax.set_xticks(range(len(VARIANTS)), ["synthetic\nEEG", "synthetic\n(mean dec.)", "real\nEEG", "breathing\nfeatures",
                                             "breathing\ntransformer"], fontsize=8)
        ax.set_ylabel(lab)
    fig.suptitle(f"Is synthetic EEG as useful as real EEG, and more than breathing? (bars: mean, "
                 f"whiskers: s.d. over {len(seeds)} seeds, dots: seeds)")
    save_figure(fig, plots_dir / "downstream.png", dpi=100)
