"""RECTOR in miniature: simulated motor-imagery EEG, self-supervised pre-training, few-label fine-tuning.

Variants (same data, same per-seed subject split, same labelled subsets, same fine-tuning budget):
- ``rector``: hierarchical region-channel-temporal attention with adaptive functional partitioning
  (models.py), pre-trained on the unlabelled windows of the training and validation subjects with
  the three objectives (masked predictive modelling, topological structure modelling, cross-view
  consistency), then fine-tuned with k labels per class;
- ``rector_scratch``: ablation, the same network fine-tuned from random initialisation (what the
  pre-training adds);
- ``dense_tf``: a dense transformer of about the same parameter count on the same DE tokens;
- ``eegnet``: an EEGNet-style CNN on the raw (band-passed) epochs;
- ``de_lr``: whole-window differential-entropy features (channels x 5 bands) + logistic regression.

Stages. train_shared (per seed): DE tokens and alpha-band correlations (features.py, mne filters),
a subject-wise split drawn from the seed, standardisation on the training subjects, nested labelled
subsets (k per class), and the channel-drop sets of the robustness test, all shared by the variants.
train (per variant x seed): fit at each label count; record test weighted-F1 ``wf1`` at the main
count and ``f1_vs_labels``; at the main count also ``f1_vs_drop`` (10-50 % of channels removed at
test time, averaged over drop sets) and ``f1_drop`` = F1(0 %) - mean F1(10-50 %).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

DATASET = "eeg_motor_imagery"
CURVE_VARIANTS = ("rector", "rector_scratch", "de_lr")


# --- shared per-seed work ----------------------------------------------------------------------

def subject_split(subjects: list[str], rng: np.random.Generator) -> dict[str, str]:
    """Seeded subject-wise split: ~25 % test, one validation subject (from 4 subjects), rest train."""
    uniq = sorted(set(subjects))
    order = rng.permutation(len(uniq))
    n = len(uniq)
    n_test = max(1, round(0.25 * n)) if n >= 2 else 0
    n_val = 1 if n >= 4 else 0
    out = {}
    for rank, i in enumerate(order):
        out[uniq[i]] = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
    return out


def nested_label_sets(y: np.ndarray, idx: np.ndarray, counts: list[int], rng: np.random.Generator) -> dict[int, np.ndarray]:
    """For each k, k training epochs per class (all of a class if it has fewer); subsets are nested."""
    perm = {c: rng.permutation(idx[y[idx] == c]) for c in np.unique(y[idx])}
    return {k: np.sort(np.concatenate([p[:k] for p in perm.values()])) for k in counts}


def drop_sets(C: int, fracs: list[float], reps: int, rng: np.random.Generator) -> np.ndarray:
    """present[f, r, c]: channel c kept in drop set r at fraction fracs[f]."""
    out = np.ones((len(fracs), reps, C), bool)
    for f, frac in enumerate(fracs):
        for r in range(reps):
            out[f, r, rng.permutation(C)[: int(round(frac * C))]] = False
    return out


def train_shared(ctx) -> None:
    from reprozoo.data.eeg.common import load

    from .features import de_features

    p = ctx.params
    d = load(ctx.data[DATASET])
    t0 = time.process_time()
    tokens, whole, corr = de_features(d.X, d.sfreq, float(p["segment_s"]))
    y = d.labels.astype(np.int64)
    split = subject_split(list(d.epochs["subject"]), ctx.rng(0))
    part = d.epochs["subject"].map(split).to_numpy()
    tr, va, te = (np.flatnonzero(part == s) for s in ("train", "val", "test"))
    if len(va) == 0:
        va = tr
    mu, sd = tokens[tr].mean((0, 2), keepdims=True), tokens[tr].std((0, 2), keepdims=True) + 1e-6
    tokens = (tokens - mu) / sd
    wmu, wsd = whole[tr].mean(0, keepdims=True), whole[tr].std(0, keepdims=True) + 1e-6
    whole = (whole - wmu) / wsd
    raw = d.X / (d.X[tr].std() + 1e-9)
    labels = nested_label_sets(y, tr, [int(k) for k in p["label_counts"]], ctx.rng(1))
    present = drop_sets(len(d.ch_names), [float(f) for f in p["drop_fracs"]], int(p["drop_reps"]), ctx.rng(2))
    regions = sorted(set(d.channels["region"]))
    region_ids = d.channels["region"].map({r: i for i, r in enumerate(regions)}).to_numpy()
    np.savez(ctx.shared_dir / "features.npz", tokens=tokens.astype(np.float32), whole=whole.astype(np.float32),
             corr=corr, raw=raw.astype(np.float32), y=y, train=tr, val=va, test=te, present=present,
             pos=d.channels[["x", "y", "z"]].to_numpy(float) / 0.1, region_ids=region_ids,
             regions=np.array(regions), ch_names=np.array(d.ch_names),
             **{f"labels_{k}": v for k, v in labels.items()})
    ctx.metrics.scalar("feature_cpu_s", time.process_time() - t0)
    ctx.metrics.scalar("n_train_epochs", len(tr))
    ctx.metrics.scalar("n_test_epochs", len(te))


# --- per variant ---------------------------------------------------------------------------------

def weighted_f1(y: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(y, pred, average="weighted"))


def build_net(variant: str, f: dict, p: dict):
    import torch

    from .models import EEGNet, TokenTransformer

    n_classes = int(f["y"].max()) + 1
    if variant == "eegnet":
        return EEGNet(f["raw"].shape[1], f["raw"].shape[2], n_classes, **p["eegnet"])
    kind = "dense" if variant == "dense_tf" else "rector"
    cfg = p["dense"] if kind == "dense" else p["rector"]
    _, C, T, F = f["tokens"].shape
    return TokenTransformer(kind, F, T, torch.as_tensor(f["pos"]), torch.as_tensor(f["region_ids"]),
                            len(f["regions"]), n_classes=n_classes, **cfg)


def pretrain(net, f: dict, p: dict, seed: int, ctx):
    """Masked topology and representation learning on unlabelled train + val windows."""
    import torch

    from .models import PretrainHeads, cosine_lr, pretrain_losses

    q = p["pretrain"]
    idx = np.unique(np.concatenate([f["train"], f["val"]]))
    x = torch.as_tensor(f["tokens"][idx])
    corr = torch.as_tensor(f["corr"][idx])
    heads = PretrainHeads(net.embed.out_features, x.shape[-1])
    params = list(net.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=float(q["lr"]), weight_decay=float(q["weight_decay"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, int(q["steps"])))
    gen = torch.Generator().manual_seed(seed)
    w = q["weights"]
    hist = {k: [] for k in ("total", "mpm", "tsm", "cvc")}
    steps, bs = int(q["steps"]), min(int(q["batch"]), len(idx))
    for s in range(steps):
        b = torch.randperm(len(idx), generator=gen)[:bs]
        L = pretrain_losses(net, heads, x[b], corr[b], gen, float(q["token_frac"]), float(q["channel_frac"]),
                            float(q["tau"]))
        loss = sum(float(w[k]) * L[k] for k in L)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        hist["total"].append(float(loss.detach()))
        for k in L:
            hist[k].append(float(L[k].detach()))
        if s % 50 == 0:
            ctx.progress(f"pretrain {s}/{steps} loss {float(loss):.3f}")
    return hist


def predict(net, X, present_mask, fill: bool = False) -> np.ndarray:
    import torch

    net.eval()
    with torch.no_grad():
        args = (torch.as_tensor(X), torch.as_tensor(present_mask)) + ((True,) if fill else ())
        out = net(*args).argmax(1).numpy()
    net.train()
    return out


def finetune(net, X: np.ndarray, y: np.ndarray, Xv: np.ndarray, yv: np.ndarray, p: dict, seed: int):
    """Supervised training with a fixed budget (steps, AdamW, cosine schedule); every variant the same.
    Returns the (step, train loss, val loss) history."""
    import torch
    import torch.nn.functional as F

    from .models import cosine_lr

    q = p["finetune"]
    steps, bs = int(q["steps"]), min(int(q["batch"]), len(y))
    opt = torch.optim.AdamW(net.parameters(), lr=float(q["lr"]), weight_decay=float(q["weight_decay"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, steps))
    gen = torch.Generator().manual_seed(seed + 7)
    X, y, Xv, yv = (torch.as_tensor(a) for a in (X, y, Xv, yv))
    full, fullv = torch.ones(len(X), X.shape[1], dtype=torch.bool), torch.ones(len(Xv), Xv.shape[1], dtype=torch.bool)
    hist = []
    every = max(1, steps // 20)  # at least 5 validation points in the convergence gate's window (last 30 %)
    for s in range(steps):
        b = torch.randperm(len(y), generator=gen)[:bs]
        loss = F.cross_entropy(net(X[b], full[b]), y[b])
        hist_loss = float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if s % every == 0 or s == steps - 1:
            net.eval()
            with torch.no_grad():
                vl = float(F.cross_entropy(net(Xv, fullv), yv))
            net.train()
            hist.append((s + 1, hist_loss, vl))
    return hist


def robustness(predict_fn, Xte, yte, present: np.ndarray, fracs) -> list[float]:
    """Test weighted-F1 at each drop fraction, averaged over the seed's drop sets."""
    return [float(np.mean([weighted_f1(yte, predict_fn(Xte, np.repeat(m[None], len(yte), 0))) for m in present[i]]))
            for i in range(len(fracs))]


def _lr_fit(Xtr, ytr, p):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=float(p["de_lr"]["C"]), max_iter=2000).fit(Xtr.reshape(len(Xtr), -1), ytr)


def train(ctx) -> None:
    p = ctx.params
    v = ctx.variant
    f = dict(np.load(ctx.shared_dir / "features.npz"))
    y, tr, va, te = f["y"], f["train"], f["val"], f["test"]
    main = int(p["main_label_count"])
    # the label-count curve is the pre-training ablation's (and the free linear model's); the
    # supervised network baselines are trained at the main count only (CPU budget)
    counts = [int(k) for k in p["label_counts"]] if v in CURVE_VARIANTS else [main]
    fracs = [float(x) for x in p["drop_fracs"]]
    f1s, t0 = {}, time.process_time()
    if v == "de_lr":
        X = f["whole"]
        for k in counts:
            idx = f[f"labels_{k}"]
            clf = _lr_fit(X[idx], y[idx], p)

            def pred(Xs, m, clf=clf):  # a missing channel's features are set to the training mean (0)
                return clf.predict((Xs * m[..., None]).reshape(len(Xs), -1))

            f1s[k] = weighted_f1(y[te], pred(X[te], np.ones((len(te), X.shape[1]), bool)))
            if k == main:
                drop = robustness(pred, X[te], y[te], f["present"], fracs)
    else:
        import torch

        torch.manual_seed(ctx.seed)
        X = f["raw"] if v == "eegnet" else f["tokens"]
        net0 = build_net(v, f, p)
        from .models import n_params

        ctx.metrics.scalar("n_params", n_params(net0))
        if v == "rector":
            hist = pretrain(net0, f, p, ctx.seed, ctx)
            s = np.arange(1, len(hist["total"]) + 1)
            for key, vals in hist.items():
                ctx.metrics.curve(f"pretrain_{key}", s, _smooth(vals))
        state = {k: t.clone() for k, t in net0.state_dict().items()}
        for k in counts:
            net0.load_state_dict(state)
            idx = f[f"labels_{k}"]
            hist = finetune(net0, X[idx], y[idx], X[va], y[va], p, ctx.seed)

            def pred(Xs, m, net=net0):
                return predict(net, Xs, m)

            f1s[k] = weighted_f1(y[te], pred(X[te], np.ones((len(te), X.shape[1]), bool)))
            ctx.progress(f"k={k}/class: test wF1 {f1s[k]:.3f}")
            if k == main:
                steps_, trl, vl = zip(*hist)
                ctx.metrics.curve("train_loss", steps_, trl)
                ctx.metrics.curve("val_loss", steps_, vl)
                n = max(2, len(vl) // 4)  # final slope of the val loss, per 100 steps, over the last quarter
                ctx.metrics.scalar("val_loss_final_slope", 100 * np.polyfit(steps_[-n:], vl[-n:], 1)[0])
                drop = robustness(pred, X[te], y[te], f["present"], fracs)
                if v != "eegnet":  # secondary protocol: missing channels as mask tokens
                    dm = robustness(lambda Xs, m, net=net0: predict(net, Xs, m, fill=True), X[te], y[te],
                                    f["present"], fracs)
                    ctx.metrics.curve("f1_vs_drop_masktoken", fracs, dm)
                    ctx.metrics.scalar("f1_drop_masktoken", dm[0] - float(np.mean(dm[1:])))
                if v == "rector" or v == "rector_scratch":
                    P = net0.partition.detach().numpy()
                    ctx.metrics.curve("partition", np.arange(P.size), P.ravel())
                    ctx.metrics.scalar("n_regions", P.shape[1])
    ctx.metrics.scalar("wf1", f1s[main])
    if v in CURVE_VARIANTS:
        ctx.metrics.curve("f1_vs_labels", counts, [f1s[k] for k in counts])
        ctx.metrics.scalar("wf1_low", float(np.mean([f1s[k] for k in counts if k <= int(p["low_label_max"])])))
    ctx.metrics.curve("f1_vs_drop", fracs, drop)
    ctx.metrics.scalar("f1_drop", drop[0] - float(np.mean([d for fr, d in zip(fracs, drop) if fr > 0])))
    # the same fall relative to the intact F1 (recorded, not claimed: an absolute fall favours weak models)
    ctx.metrics.scalar("f1_drop_rel", ctx.metrics.scalars["f1_drop"] / max(drop[0], 1e-9))
    ctx.metrics.scalar("train_cpu_s", time.process_time() - t0)


def _smooth(vals, w: int = 10) -> np.ndarray:
    v = np.asarray(vals, float)
    c = np.cumsum(np.insert(v, 0, 0.0))
    return np.array([(c[i + 1] - c[max(0, i + 1 - w)]) / (i + 1 - max(0, i + 1 - w)) for i in range(len(v))])


# --- plots -------------------------------------------------------------------------------------

GENERIC_CURVES = ["val_loss", "pretrain_total"]


def _band(ax, sub, label):
    g = sub.groupby("x")["value"]
    m, s = g.mean(), g.std().fillna(0.0)
    ax.plot(m.index, m.values, marker="o", label=label)
    ax.fill_between(m.index, (m - s).values, (m + s).values, alpha=0.2)


def plot(table, plots_dir: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    t = table
    for metric, fname, xlabel, title in [
        ("f1_vs_drop", "robustness.png", "fraction of channels dropped at test time",
         "Does RECTOR's F1 fall less than the baselines' when channels go missing?"),
        ("f1_vs_labels", "label_count.png", "labelled training epochs per class",
         "Does pre-training help when labels are few?")]:
        sub = t[t.metric == metric]
        if sub.empty:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for v in sub.variant.unique():
            _band(ax, sub[sub.variant == v], v)
        if metric == "f1_vs_labels":
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test weighted F1 (mean ± sd over seeds)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        save_figure(fig, plots_dir / fname, dpi=120)
    part = t[(t.metric == "partition") & (t.variant == "rector")]
    if not part.empty:
        P = part.groupby("x")["value"].mean().to_numpy()
        R = int(t[(t.metric == "n_regions") & (t.variant == "rector")]["value"].iloc[0])
        P = P.reshape(-1, R)
        names = params.get("channel_names") or []
        rnames = params.get("region_names") or []
        fig, ax = plt.subplots(figsize=(4, 6))
        im = ax.imshow(P, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ax.set_yticks(range(len(P)), names if len(names) == len(P) else list(range(len(P))), fontsize=7)
        ax.set_xticks(range(R), rnames if len(rnames) == R else list(range(R)), rotation=45, fontsize=7)
        ax.set_xlabel("region (initialised at the anatomical group)")
        ax.set_ylabel("channel")
        ax.set_title("Where did adaptive partitioning move channels?\n(softmax assignment P, mean over seeds)", fontsize=8)
        fig.colorbar(im, ax=ax, label="assignment probability")
        save_figure(fig, plots_dir / "partition.png", dpi=120)
