"""RECTOR in miniature: simulated EEG with class networks that span anatomical regions (simulate.py),
self-supervised pre-training on separate unlabelled subjects, few-label fine-tuning.

Variants (same data, same per-seed subject split, same labelled subsets, same training rule):
- ``rector``: hierarchical region-channel-temporal attention with adaptive functional partitioning
  (models.py; the partition logits start near the anatomical one-hot, logit 6, and have their own,
  faster learning rate), pre-trained on the unlabelled windows of the pre-training and training
  subjects with the three objectives (masked predictive modelling, topological structure modelling,
  cross-view consistency), then fine-tuned with k labels per class and with every training label;
- ``rector_softfixed``: ablation, the same network pre-trained and fine-tuned the same way with the
  partition frozen at RECTOR's own soft start softmax(logit 6 x anatomical one-hot) (what learning
  the partition adds, at the same sparsity: the afp_helps claim);
- ``rector_randp``: control, the same network pre-trained and fine-tuned the same way with the
  partition frozen at a random partition of the same softness and region sizes (the anatomical labels
  shuffled over the channels, one draw per seed: ``random_regions``): the afp_helps control (does any
  frozen departure from the anatomical grouping do as well?);
- ``rector_oraclep``: oracle (round 9), the same network pre-trained and fine-tuned the same way with
  the partition frozen at the planted class networks (``oracle_regions``) at the same softness: the
  precondition of the partition claims (does the right partition help this network on this data?);
- ``rector_fixedp`` (built here, not in the smoke run since round 7): the same pre-trained network
  with the partition the hard anatomical one-hot (exactly block-sparse attention);
- ``rector_scratch``: ablation, the RECTOR network fine-tuned from random initialisation (what the
  pre-training adds);
- ``dense_tf``: a dense transformer of about the same parameter count on the same DE tokens,
  pre-trained with the same three objectives on the same windows, then fine-tuned;
- ``eegnet``: an EEGNet-style CNN on the raw epochs, fitted on every training label;
- ``de_lr``: whole-window differential-entropy features (channels x 5 bands) + logistic regression,
  C chosen on the validation subjects (``_lr_fit``, round 9).
Which label counts each variant is fitted at is the config's ``counts``.

Training rule: ``reprozoo.blocks.fitting.fit_to_plateau`` for every network and stage. Pre-training
on the validation subject's masked-modelling loss (fixed masks); fine-tuning with two validation
curves (``err`` = 1 - weighted F1 selects the kept checkpoint from ``keep_from`` on, ``ce`` the
cross-entropy is the stopping curve), ``pilot_score: tail`` and ``min_progress`` (config ``fit``);
the training loss of every fine-tune has the config's ``label_smoothing`` (a memorised few-label fit then
has a finite optimum, so its validation cross-entropy can reach a plateau).

Stages. train_shared (per seed): the simulated recordings and their DE tokens and alpha-band
correlations (features.py, mne filters; computed once per process), a subject-wise split by
rotation (smoke: 10 test, 2 validation, 13 unlabelled pre-training, 5 labelled training subjects of
30), per-subject standardisation (each subject's own mean and sd, no labels; transductive for the
test subjects), nested labelled subsets (k per class, and "all"), and the channel-drop sets of the
robustness test (each test epoch its own channels, ``drop_reps`` repetitions), all shared by the
variants. train (per variant x seed): fit at each of the variant's label counts; record per test
subject (units) the weighted-F1 ``wf1`` at the main count, ``wf1_all`` on every label, ``wf1_low``
(mean over the low counts), for the partitioned variants the partition's ``net_recovery``
(network_recovery: within-planted-network minus left-right-pair co-membership), for ``rector`` the
score of the seed's random frozen partition ``net_recovery_rand`` (the afp_finds_networks control),
the learning-rate pilots' scores (``pilot_<fit>``, ``lr_edge_<fit>``) and, for the all-label model, ``f1_drop_rel`` = (F1(0 %) - mean F1(10-50 %
of channels removed at test time)) / F1(0 %), the relative fall.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

DATASET = "eeg_motor_imagery"  # paper scale: real EEG (PhysioNet EEGMMIDB); ci/smoke: the folder's simulator
PRETRAINED = ("rector", "rector_softfixed", "rector_fixedp", "dense_tf", "rector_randp", "rector_oraclep")
PARTITIONED = ("rector", "rector_softfixed", "rector_fixedp", "rector_scratch", "rector_randp", "rector_oraclep")


# --- shared per-seed work ----------------------------------------------------------------------

def subject_split(subjects: list[str], rng: np.random.Generator, n_test: int = 4, n_val: int = 1,
                  seed: int | None = None, n_pretrain: int = 0, step: int | None = None) -> dict[str, str]:
    """Subject-wise split: ``n_test`` test subjects, ``n_val`` validation subjects, ``n_pretrain``
    unlabelled pre-training subjects (never labelled, never tested), the rest labelled training
    subjects; with few subjects the counts shrink so that at least one subject trains. Without
    ``seed`` the order is a permutation drawn from ``rng``. With ``seed``, a rotation: one fixed
    permutation, read from position seed x ``step`` (default n_test - 1), so that consecutive seeds
    test different subjects (smoke: 30 subjects, 10 tested per seed, step 10: three seeds test every
    subject once)."""
    uniq = sorted(set(subjects))
    n = len(uniq)
    if seed is None:
        order = rng.permutation(n)
    else:
        base = np.random.default_rng(12345).permutation(n)
        step = max(1, n_test - 1) if step is None else int(step)
        order = np.roll(base, -(int(seed) * step) % max(n, 1))
    n_val = max(0, min(n_val, n - 2))
    n_test = max(0, min(n_test, n - 1 - n_val))
    n_pretrain = max(0, min(n_pretrain, n - 1 - n_val - n_test))
    cuts = np.cumsum([n_test, n_val, n_pretrain])
    out = {}
    for rank, i in enumerate(order):
        out[uniq[i]] = ("test" if rank < cuts[0] else "val" if rank < cuts[1] else
                        "pretrain" if rank < cuts[2] else "train")
    return out


def per_subject_standardise(a: np.ndarray, subj: np.ndarray, axes: tuple) -> np.ndarray:
    """Each subject's epochs standardised with that subject's own mean and sd over ``axes`` (epochs
    first; e.g. epochs and segments for DE tokens, so each channel x band is standardised). The
    SEED-style per-subject normalisation: it removes the subject's gain and noise level, uses no
    labels, and is the same for every variant."""
    out = np.empty(a.shape, np.float32)
    for s in np.unique(subj):
        m = subj == s
        x = a[m].astype(np.float64)
        out[m] = (x - x.mean(axes, keepdims=True)) / (x.std(axes, keepdims=True) + 1e-6)
    return out


def nested_label_sets(y: np.ndarray, idx: np.ndarray, counts: list[int], rng: np.random.Generator) -> dict[int, np.ndarray]:
    """For each k, k training epochs per class (all of a class if it has fewer); subsets are nested."""
    perm = {c: rng.permutation(idx[y[idx] == c]) for c in np.unique(y[idx])}
    return {k: np.sort(np.concatenate([p[:k] for p in perm.values()])) for k in counts}


def drop_sets(C: int, fracs: list[float], reps: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """present[f, r, e, c]: channel c kept for test epoch e in repetition r at fraction fracs[f].
    Every epoch draws its own channels, so each test subject meets many drop sets and the subject
    bootstrap sees which channels went missing."""
    out = np.ones((len(fracs), reps, n, C), bool)
    for f, frac in enumerate(fracs):
        k = int(round(frac * C))
        if k:
            gone = rng.random((reps, n, C)).argsort(-1)[..., :k]
            np.put_along_axis(out[f], gone, False, axis=-1)
    return out


_DATA_CACHE: dict = {}


def simulated_features(sim: dict, segment_s: float):
    """The folder's simulator (simulate.py) and its DE features, computed once per process: the data
    depend on the dataset seed only, so the three seeds of one batch job share them (about 26 CPU-s for 30 subjects).
    The raw epochs (EEGNet's input) are band-passed 1-40 Hz as the platform's EEG readers do
    (mne FIR): the simulated pink background would otherwise put most of their variance below 1 Hz."""
    from . import simulate
    from .features import bandpass, de_features

    key = (tuple(sorted((k, str(v)) for k, v in sim.items())), float(segment_s))
    if key not in _DATA_CACHE:
        X, y, subj, ch, _ = simulate.simulate(int(sim["subjects"]), int(sim["epochs_per_class"]),
                                              float(sim.get("sfreq", 128.0)), float(sim.get("epoch_s", 4.0)),
                                              int(sim.get("seed", 23)), float(sim.get("node_scale", 1.0)),
                                              float(sim.get("node_indep", 0.0)), float(sim.get("indep_sigma", 0.0)),
                                              float(sim.get("node_jitter", 0.0)))
        tokens, whole, corr = de_features(X, float(sim.get("sfreq", 128.0)), float(segment_s))
        X = bandpass(X, float(sim.get("sfreq", 128.0)), 1.0, 40.0).astype(np.float32)
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = (X, y, subj, ch, tokens, whole, corr)
    return _DATA_CACHE[key]


def train_shared(ctx) -> None:
    from . import simulate

    p = ctx.params
    t0 = time.process_time()
    if p.get("simulation"):
        X, y, subj, ch_names, tokens, whole, corr = simulated_features(p["simulation"], float(p["segment_s"]))
    else:  # a real dataset through the platform's EEG reader (paper scale)
        from reprozoo.data.eeg.common import load

        from .features import de_features

        d = load(ctx.data[DATASET])
        X, y, ch_names = d.X, d.labels.astype(np.int64), list(d.ch_names)
        names = sorted(set(d.epochs["subject"]))
        subj = d.epochs["subject"].map({s: i for i, s in enumerate(names)}).to_numpy().astype(np.int64)
        tokens, whole, corr = de_features(X, d.sfreq, float(p["segment_s"]))
    sp = p.get("split", {})
    subjects = [f"S{s + 1:03d}" for s in subj]
    split = subject_split(subjects, ctx.rng(0), int(sp.get("n_test", 4)), int(sp.get("n_val", 1)),
                          seed=ctx.seed if sp.get("rotate", False) else None,
                          n_pretrain=int(sp.get("n_pretrain", 0)), step=sp.get("step"))
    part = np.array([split[s] for s in subjects])
    tr, va, te, pt = (np.flatnonzero(part == s) for s in ("train", "val", "test", "pretrain"))
    if len(va) == 0:
        va = tr
    tokens, whole, raw = (per_subject_standardise(a, subj, axes) for a, axes in
                          ((tokens, (0, 2)), (whole, (0,)), (X, (0, 2))))
    labels = nested_label_sets(y, tr, [int(k) for k in p["label_counts"]], ctx.rng(1))
    labels["all"] = np.sort(tr)  # every training epoch: the robustness claims' models
    present = drop_sets(len(ch_names), [float(f) for f in p["drop_fracs"]], int(p["drop_reps"]), len(te),
                        ctx.rng(2))
    reg = simulate.regions(ch_names)
    regions = sorted(set(reg))
    region_ids = np.array([regions.index(r) for r in reg])
    np.savez(ctx.shared_dir / "features.npz", tokens=tokens.astype(np.float32), whole=whole.astype(np.float32),
             corr=corr, raw=raw.astype(np.float32), y=y, subj=subj, train=tr, val=va, test=te,
             pretrain=np.sort(np.concatenate([pt, tr])), present=present,
             pos=simulate.positions(ch_names) / 0.1, region_ids=region_ids,
             regions=np.array(regions), ch_names=np.array(ch_names),
             **{f"labels_{k}": v for k, v in labels.items()})
    ctx.metrics.scalar("feature_cpu_s", time.process_time() - t0)
    ctx.metrics.scalar("n_train_epochs", len(tr))
    ctx.metrics.scalar("n_pretrain_epochs", len(pt) + len(tr))
    ctx.metrics.scalar("n_test_epochs", len(te))
    ctx.metrics.scalar("n_test_subjects", len(set(subj[te])))


# --- per variant ---------------------------------------------------------------------------------

def weighted_f1(y: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(y, pred, average="weighted"))


def per_subject_f1(y: np.ndarray, pred: np.ndarray, subj: np.ndarray) -> np.ndarray:
    """Weighted-F1 of each test subject (subjects in increasing id order): the claims' units."""
    return np.array([weighted_f1(y[subj == s], pred[subj == s]) for s in np.unique(subj)])


def relative_drop(f1_by_frac: np.ndarray) -> np.ndarray:
    """(F1(0 %) - mean F1 over the dropped fractions) / F1(0 %), per column (subject); row 0 is the
    intact test. A model that loses nothing scores 0, one that falls to zero scores 1."""
    f = np.asarray(f1_by_frac, float)
    return (f[0] - f[1:].mean(0)) / np.maximum(f[0], 1e-9)


def build_net(variant: str, f: dict, p: dict):
    import torch

    from .models import EEGNet, TokenTransformer

    n_classes = int(f["y"].max()) + 1
    if variant == "eegnet":
        return EEGNet(f["raw"].shape[1], f["raw"].shape[2], n_classes, **p["eegnet"])
    kind = "dense" if variant == "dense_tf" else "rector"
    cfg = dict(p["dense"] if kind == "dense" else p["rector"])
    if variant == "rector_fixedp":
        cfg["fixed_partition"] = True
    if variant in ("rector_softfixed", "rector_randp", "rector_oraclep"):
        cfg["learn_partition"] = False
    ids = f["region_ids"]
    if variant == "rector_randp":  # a random frozen partition of the same softness and region sizes
        ids = random_regions(ids, int(f.get("seed", 0)))
    if variant == "rector_oraclep":  # the planted class networks as regions, frozen (the oracle)
        ids = oracle_regions(ids, [str(c) for c in f["ch_names"]])
    _, C, T, F = f["tokens"].shape
    return TokenTransformer(kind, F, T, torch.as_tensor(f["pos"]), torch.as_tensor(ids),
                            len(f["regions"]), n_classes=n_classes, **cfg)


def random_regions(region_ids: np.ndarray, seed: int) -> np.ndarray:
    """The anatomical region labels shuffled over the channels (a fixed draw per seed): a random
    partition with the anatomical regions' sizes, no anatomy and no learning. Softened with RECTOR's
    start logit and frozen it is the random-partition control (``net_recovery_rand``, variant
    ``rector_randp``)."""
    return np.random.default_rng([int(seed), 7919]).permutation(np.asarray(region_ids))


def oracle_regions(region_ids: np.ndarray, ch_names: list[str]) -> np.ndarray:
    """The oracle partition (variant ``rector_oraclep``, the precondition of the partition claims):
    each planted class network (simulate.NETWORKS) is one region, the other channels keep their
    anatomical labels. With the smoke montage the network channels leave the temporal region
    empty and remove the central and parietal regions' lateral channels; the regions are
    relabelled so that the two networks and the remaining anatomical groups fill the same
    ``n_regions`` slots (left network, right network, frontal rest, occipital, central + parietal
    rest: 5 regions). Softened with RECTOR's start logit and frozen, it asks whether the right
    partition helps this architecture on this data at all. A montage without the network channels
    (real data) has no oracle: ValueError."""
    from . import simulate

    ids = np.asarray(region_ids, int).copy()
    R = int(ids.max()) + 1
    idx = {c: i for i, c in enumerate(ch_names)}
    nets = [[idx.get(c) for c in nodes] for nodes in simulate.NETWORKS.values()]
    if any(i is None for n in nets for i in n):
        raise ValueError("rector_oraclep needs the planted networks' channels (simulator montage only)")
    in_net = np.zeros(len(ids), bool)
    for n in nets:
        in_net[n] = True
    # the anatomical groups that keep channels, merged smallest-first until they fit R - len(nets) slots
    groups = [np.flatnonzero((ids == r) & ~in_net) for r in range(R)]
    groups = sorted((g for g in groups if len(g)), key=len)
    while len(groups) > R - len(nets):
        a, b = groups.pop(0), groups.pop(0)
        groups = sorted(groups + [np.sort(np.concatenate([a, b]))], key=len)
    out = np.empty(len(ids), int)
    for r, n in enumerate(nets):
        out[n] = r
    for r, g in enumerate(sorted(groups, key=lambda g: g[0]), start=len(nets)):
        out[g] = r
    return out


def soft_partition(region_ids: np.ndarray, n_regions: int, logit: float) -> np.ndarray:
    """softmax(logit x one-hot(region_ids)) row-wise: RECTOR's soft start for the anatomical labels."""
    L = float(logit) * np.eye(int(n_regions))[np.asarray(region_ids, int)]
    E = np.exp(L - L.max(1, keepdims=True))
    return E / E.sum(1, keepdims=True)


def fit_bracketed(build, train_loss, val_loss, fit: dict, seed: int, label: str, progress):
    """The shared rule (``reprozoo.blocks.fitting.fit_to_plateau``) with one addition for every fit
    (round 7, cold review item d): when the chosen rate sits at an edge of the grid (``lr_edge``) and
    ``fit["extend_edge"]`` is on, the next rate beyond that edge (the grid's own ratio) is piloted the
    same way (same initial weights, same batches, same pilot length and score); if it scores better the
    fit is redone at that rate, otherwise the first fit stands, now bracketed. A pilot costs
    ``pilot_steps`` steps, so the extension costs little unless it wins. The record's ``pilot_best``
    holds every piloted rate, ``lr_edge`` the edge of the extended grid (or None). The global torch
    generator (dropout) is reseeded before each fit, so a fit does not depend on how many steps the
    fits before it took, and the refit's pilot at the extra rate is the probe's pilot exactly."""
    import torch

    from reprozoo.blocks.fitting import fit_to_plateau

    torch.manual_seed(seed)
    model, rec = fit_to_plateau(build, train_loss, val_loss, fit, seed, label, progress)
    edge = rec.get("lr_edge")
    grid = sorted(float(x) for x in fit["lr_grid"])
    if not edge or not fit.get("extend_edge") or len(grid) < 2:
        return model, rec
    extra = grid[0] ** 2 / grid[1] if edge == "bottom" else grid[-1] ** 2 / grid[-2]
    pilots = dict(rec["pilot_best"])
    # a pilot only: the extra rate for pilot_steps steps, no continuation (min = max = pilot_steps)
    n = int(fit["pilot_steps"])
    torch.manual_seed(seed + 1)
    _, probe = fit_to_plateau(build, train_loss, val_loss, dict(fit, lr_grid=[extra], min_steps=n, max_steps=n),
                              seed, f"{label} (extra rate {extra:g})", progress)
    pilots.update(probe["pilot_best"])
    if pilots[extra] < pilots[float(rec["lr"])]:
        torch.manual_seed(seed + 1)
        model, rec = fit_to_plateau(build, train_loss, val_loss, dict(fit, lr_grid=[extra]), seed, label, progress)
        rec["lr_edge"] = edge  # the extended grid's edge
    else:
        rec["lr_edge"] = None
    rec["pilot_best"] = pilots
    return model, rec


def pretrain(variant: str, f: dict, p: dict, seed: int, ctx):
    """Masked topology and representation learning on the unlabelled windows of the training
    subjects, fitted to the plateau of the validation subject's loss (the same masks at every
    evaluation). Returns the encoder with its best-validation weights."""
    import torch

    from reprozoo.blocks.fitting import log_fit

    from .models import PretrainHeads, PretrainModel, pretrain_losses

    q = p["pretrain"]
    w = {k: float(v) for k, v in q["weights"].items()}
    # the unlabelled windows of the pre-training subjects and of the labelled training subjects (never
    # the validation or test subjects)
    x, corr = torch.as_tensor(f["tokens"][f["pretrain"]]), torch.as_tensor(f["corr"][f["pretrain"]])
    xv, corrv = torch.as_tensor(f["tokens"][f["val"]]), torch.as_tensor(f["corr"][f["val"]])
    bs = min(int(q["batch"]), len(x))
    fr = (float(q["token_frac"]), float(q["channel_frac"]), float(q["tau"]))

    def build(gen):
        torch.manual_seed(seed)
        net = build_net(variant, f, p)
        return PretrainModel(net, PretrainHeads(net.embed.out_features, x.shape[-1]))

    def total(m, xb, cb, gen):
        L = pretrain_losses(m.net, m.heads, xb, cb, gen, *fr)
        return sum(w[k] * L[k] for k in L)

    def train_loss(m, gen):
        b = torch.randperm(len(x), generator=gen)[:bs]
        return total(m, x[b], corr[b], gen)

    def val_loss(m):
        with torch.no_grad():
            return float(total(m, xv, corrv, torch.Generator().manual_seed(1234)))

    model, rec = fit_bracketed(build, train_loss, val_loss, q["fit"], seed, f"{variant} pretrain", ctx.progress)
    log_fit(ctx.metrics, "pt", rec)
    _log_pilots(ctx, "pt", rec)
    return model.net


def predict(net, X, present_mask) -> np.ndarray:
    import torch

    net.eval()
    with torch.no_grad():
        out = net(torch.as_tensor(X), torch.as_tensor(present_mask)).argmax(1).numpy()
    net.train()
    return out


def val_curves(logits, y) -> dict:
    """The fine-tunes' validation curves on the validation subject: ``err`` = 1 - weighted F1 (the
    selection curve: the kept checkpoint is the best F1, a loss so that lower is better) and ``ce``
    the cross-entropy (the stopping curve: the plateau test and the convergence gate read it; F1 on
    60 epochs moves in steps of ~0.017 and is too coarse for a slope test)."""
    import torch.nn.functional as F

    return {"err": 1.0 - weighted_f1(y.numpy(), logits.argmax(1).numpy()), "ce": float(F.cross_entropy(logits, y))}


def finetune(make, X: np.ndarray, y: np.ndarray, Xv: np.ndarray, yv: np.ndarray, p: dict, seed: int,
             label: str, progress):
    """Supervised fit of a fresh copy (``make()``) by the shared rule
    (``reprozoo.blocks.fitting.fit_to_plateau``) with the options the config's ``fit`` names
    (``select: err``, ``stop_on: [ce]``, ``keep_from``, ``min_progress``, ``pilot_score: tail``): the
    same grid, batch and stopping rule for every network. Returns (net, record); ``record["kept"]`` is
    the step of the returned checkpoint."""
    import torch
    import torch.nn.functional as F

    q = p["fit"]
    bs = min(int(q["batch"]), len(y))
    X, y, Xv, yv = (torch.as_tensor(a) for a in (X, y, Xv, yv))
    full, fullv = torch.ones(len(X), X.shape[1], dtype=torch.bool), torch.ones(len(Xv), Xv.shape[1], dtype=torch.bool)

    smooth = float(q.get("label_smoothing", 0.0))

    def train_loss(net, gen):  # the validation curves read the plain cross-entropy (val_curves)
        b = torch.randperm(len(y), generator=gen)[:bs]
        return F.cross_entropy(net(X[b], full[b]), y[b], label_smoothing=smooth)

    def val_loss(net):
        with torch.no_grad():
            return val_curves(net(Xv, fullv), yv)

    net, rec = fit_bracketed(lambda gen: make(), train_loss, val_loss, q, seed, label, progress)
    first = int(q.get("keep_from", 0))
    steps, vals = np.array(rec["steps"]), np.array(rec["vals"])
    ok = steps >= first
    rec["kept"] = int(steps[ok][np.argmin(vals[ok])]) if ok.any() else int(steps[-1])
    return net, rec


def robustness(predict_fn, Xte, yte, subj, present: np.ndarray) -> np.ndarray:
    """Test weighted-F1 per drop fraction (rows) and test subject (columns), averaged over the
    repetitions (each test epoch loses its own channels: present[f, r, e])."""
    rows = []
    for sets in present:
        if sets.all():  # the intact test: one pass
            rows.append(per_subject_f1(yte, predict_fn(Xte, sets[0]), subj))
        else:
            rows.append(np.mean([per_subject_f1(yte, predict_fn(Xte, m), subj) for m in sets], 0))
    return np.array(rows)


def _lr_fit(Xtr, ytr, p, Xva=None, yva=None):
    """DE + logistic regression. Round 9 (cold review item R9): the inverse regularisation C is chosen
    from the config's ``de_lr.C_grid`` on the same validation subjects the networks choose their
    rates on (best validation weighted-F1, ties to the lower validation cross-entropy); the chosen
    fit (on the labelled training epochs only) is returned. Without a grid or validation data, the
    fixed ``de_lr.C``. Returns (clf, C)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    q = p["de_lr"]
    grid = [float(c) for c in q.get("C_grid") or [q["C"]]]
    Xtr = Xtr.reshape(len(Xtr), -1)
    best = None
    for C in grid:
        clf = LogisticRegression(C=C, max_iter=2000).fit(Xtr, ytr)
        if Xva is None or len(grid) == 1:
            return clf, C
        Xv = Xva.reshape(len(Xva), -1)
        score = (-weighted_f1(yva, clf.predict(Xv)), log_loss(yva, clf.predict_proba(Xv), labels=clf.classes_))
        if best is None or score < best[0]:
            best = (score, clf, C)
    return best[1], best[2]


def network_recovery(P: np.ndarray, ch_names: list[str]) -> float | None:
    """How far a channel-to-region assignment P (C x R, rows sum to 1) groups the simulator's planted
    class networks (simulate.NETWORKS: F3-C3-P3-T7 and F4-C4-P4-T8): the mean co-membership
    S_ij = (P P^T)_ij over the 12 within-network pairs minus its mean over the 4 left-right pairs
    (F3-F4, C3-C4, P3-P4, T7-T8: the same anatomical region, different networks). 1 for a partition
    equal to the planted networks, -1 for the anatomical one-hot (each network spans four regions,
    each left-right pair shares one), 0 in expectation for a random partition (every pair alike).
    None when the montage lacks a network's channels (real data)."""
    from . import simulate

    idx = {c: i for i, c in enumerate(ch_names)}
    nets = [[idx.get(c) for c in nodes] for nodes in simulate.NETWORKS.values()]
    if any(i is None for n in nets for i in n):
        return None
    S = np.asarray(P, float) @ np.asarray(P, float).T
    within = [S[a, b] for n in nets for k, a in enumerate(n) for b in n[k + 1:]]
    across = [S[a, b] for a, b in zip(*nets)]
    return float(np.mean(within) - np.mean(across))


def _record_partition(ctx, net, anat: np.ndarray, prefix: str = "", ch_names=None) -> None:
    """The learned channel-to-region assignment, how far it moved from the anatomical start and how
    well it recovers the planted class networks (``net_recovery``, network_recovery)."""
    P = net.partition.detach().numpy()
    own = P[np.arange(len(P)), anat]
    ctx.metrics.scalar(prefix + "p_own", float(own.mean()))
    ctx.metrics.scalar(prefix + "p_moved_channels", float((P.argmax(1) != anat).sum()))
    rec = network_recovery(P, list(ch_names)) if ch_names is not None else None
    if rec is not None:
        ctx.metrics.scalar(prefix + "net_recovery", rec)
    if not prefix:
        ctx.metrics.curve("partition", np.arange(P.size), P.ravel())
        ctx.metrics.scalar("n_regions", P.shape[1])


def _log_pilots(ctx, name: str, rec: dict) -> None:
    """Each pilot rate's score (the tail-mean validation err it was chosen on) as the curve
    ``pilot_<name>`` (x: log10 rate) and where the chosen rate sits: ``lr_edge_<name>`` = +1 at the
    grid's top, -1 at its bottom, 0 inside (a grid that does not bracket the choice is extended)."""
    lrs = sorted(rec.get("pilot_best") or {})
    if lrs:
        ctx.metrics.curve(f"pilot_{name}", [float(np.log10(r)) for r in lrs], [rec["pilot_best"][r] for r in lrs])
    edge = rec.get("lr_edge")
    ctx.metrics.scalar(f"lr_edge_{name}", 1.0 if edge == "top" else -1.0 if edge == "bottom" else 0.0)


def _count_name(k) -> str:
    return "all" if k == "all" else str(int(k))


def train(ctx) -> None:
    p = ctx.params
    v = ctx.variant
    f = dict(np.load(ctx.shared_dir / "features.npz"))
    f["seed"] = int(ctx.seed)
    y, tr, va, te = f["y"], f["train"], f["val"], f["test"]
    subj = f["subj"][te]
    main = int(p["main_label_count"])
    low = int(p["low_label_max"])
    robust = _count_name(p.get("robust_label_count", main))
    # which label counts each variant is fitted at (CPU budget): the label-count curve for the
    # pre-training ablation (and the free linear model), the main count where a claim compares at
    # it, every training label for the robustness claims' models
    counts = [_count_name(k) for k in p["counts"][v]]
    fracs = [float(x) for x in p["drop_fracs"]]
    full_te = np.ones((len(te), f["present"].shape[-1]), bool)
    f1s, drops, t0 = {}, {}, time.process_time()
    if v == "de_lr":
        X = f["whole"]
        for k in counts:
            idx = f[f"labels_{k}"]
            clf, C = _lr_fit(X[idx], y[idx], p, X[va], y[va])
            ctx.metrics.scalar(f"C_{'ft' if k == str(main) else 'ft' + k}", C)

            def pred(Xs, m, clf=clf):  # a missing channel's features are set to the training mean (0)
                return clf.predict((Xs * m[..., None]).reshape(len(Xs), -1))

            f1s[k] = per_subject_f1(y[te], pred(X[te], full_te), subj)
            if k == robust:
                drops[""] = robustness(pred, X[te], y[te], subj, f["present"])
    else:
        import torch

        from reprozoo.blocks.fitting import log_fit

        from .models import n_params

        torch.manual_seed(ctx.seed)
        X = f["raw"] if v == "eegnet" else f["tokens"]
        anat = f["region_ids"].astype(int)
        if v == "rector":
            # the afp_finds_networks control: a randomly initialised partition, frozen (RECTOR's start
            # softness on the anatomical labels shuffled over the channels); its score is 0 in
            # expectation, so the claim must not be passed by a partition that learned nothing
            rand = soft_partition(random_regions(anat, ctx.seed), len(f["regions"]), float(p["rector"]["anat_logit"]))
            score = network_recovery(rand, f["ch_names"].tolist())
            if score is not None:
                ctx.metrics.scalar("net_recovery_rand", score)
        if v in PRETRAINED:
            net0 = pretrain(v, f, p, ctx.seed, ctx)
            if v in ("rector", "rector_softfixed"):
                _record_partition(ctx, net0, anat, prefix="pretrained_", ch_names=f["ch_names"].tolist())
        else:
            torch.manual_seed(ctx.seed)
            net0 = build_net(v, f, p)
        ctx.metrics.scalar("n_params", n_params(net0))
        for k in counts:
            idx = f[f"labels_{k}"]
            net, rec = finetune(lambda: copy.deepcopy(net0), X[idx], y[idx], X[va], y[va], p, ctx.seed,
                                f"{v} k={k}", ctx.progress)
            name = "ft" if k == str(main) else f"ft{k}"
            log_fit(ctx.metrics, name, rec)
            _log_pilots(ctx, name, rec)
            ctx.metrics.scalar(f"kept_step_{name}", float(rec["kept"]))
            # the training cross-entropy at the end (chance: ln 3 = 1.10): a fine-tune that never gets
            # below it learned nothing
            ctx.metrics.scalar(f"train_ce_{name}", float(np.mean(rec["losses"][-10:])))

            def pred(Xs, m, net=net):
                return predict(net, Xs, m)

            f1s[k] = per_subject_f1(y[te], pred(X[te], full_te), subj)
            ctx.progress(f"k={k}/class: test wF1 per subject {np.round(f1s[k], 3).tolist()}")
            if k == robust:
                if v == "eegnet":  # one stem for every drop set (exact: test_eegnet_stem_reuse_is_exact)
                    net.eval()
                    with torch.no_grad():
                        h1 = net.stem(torch.as_tensor(X[te]))

                    def pred(Xs, m, net=net, h1=h1):
                        with torch.no_grad():
                            return net.from_stem(h1, torch.as_tensor(m)).argmax(1).numpy()
                drops[""] = robustness(pred, X[te], y[te], subj, f["present"])
            if v in PARTITIONED and k in (str(main), "all"):
                _record_partition(ctx, net, anat, prefix="" if k == str(main) else "all_",
                                  ch_names=f["ch_names"].tolist())
    if str(main) in f1s:
        ctx.metrics.units("wf1", f1s[str(main)])
    if "all" in f1s:
        ctx.metrics.units("wf1_all", f1s["all"])
    lows = [k for k in f1s if k != "all" and int(k) <= low]
    if lows:
        ks = sorted(int(k) for k in f1s if k != "all")
        ctx.metrics.curve("f1_vs_labels", ks, [float(np.mean(f1s[str(k)])) for k in ks])
        ctx.metrics.units("wf1_low", np.mean([f1s[k] for k in lows], 0))
    for tag, drop in drops.items():
        ctx.metrics.curve("f1_vs_drop" + tag, fracs, drop.mean(1))
        ctx.metrics.units("f1_drop_rel" + tag, relative_drop(drop))
        # the absolute fall in F1 points (recorded, not claimed: it favours weak models)
        ctx.metrics.units("f1_drop" + tag, drop[0] - drop[1:].mean(0))
    ctx.metrics.scalar("train_cpu_s", time.process_time() - t0)


# --- plots -------------------------------------------------------------------------------------

GENERIC_CURVES = {"val_ft": ("fine-tuning step (main label count)", "validation 1 - weighted F1"),
                  "val_ftall": ("fine-tuning step (every training label)", "validation 1 - weighted F1"),
                  "val_ft_ce": ("fine-tuning step (main label count)", "validation cross-entropy (stopping curve)"),
                  "val_ftall_ce": ("fine-tuning step (every training label)", "validation cross-entropy (stopping curve)"),
                  "val_pt": ("pre-training step", "validation pre-training loss (fixed masks)")}


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
