"""AFR-Net in miniature: patients vs controls from SC + FC, and which SC edges the model points at.

Variants (same cohort, same split, same training rule: ``blocks.fitting.fit_to_plateau`` with one
learning-rate grid piloted on validation cross-entropy (at smoke once, on seed 0, the chosen rates kept in the
config's ``lr`` table: ``blocks.rate_table``), a constant rate to the plateau test, the same
batch size, dropout and best-validation weights; only the model differs):
- ``afr_net``: adaptive flow routing as published (models.AFRNet, routing.py; reference code
  v1.0.1): learned conductances g_e = exp(a_e), closed-form routing energy, log-min-max mask,
  masked graph transformer, mean pooling; cross-entropy alone, as in that code (``afr.pooling: mask``,
  nodes weighted by their summed mask, is an option, not a claimed variant: README).
- ``afr_net_fixed``: ablation, the same network with g_e = S_e (routing by structural
  conductance alone, no learned re-routing).
- ``mlp``: MLP on the concatenated upper triangles of SC and FC.
- ``gcn``: GCN on each subject's SC with the FC rows as node features.
- ``linear``: L2 logistic regression on the Fisher-z FC upper triangle, C on validation (a reference
  row; FC alone, above chance since the planted gates also close: data.py).

Stages. train_shared (per seed): draw the cohort (data.py) and the stratified 60/20/20 split.
train (per variant x seed), recorded metrics:
- ``auc`` (test ROC AUC, patient = positive; recorded per test subject as placement values whose
  mean is the AUC, ``auc_units``), ``acc``, ``val_auc``;
- ``prec_at_k`` (units: one hit/miss per planted edge, mean = precision@k): precision at
  k = number of planted edges of the model's own pathway readout,
  among the SC edges (chance = k / E, ``chance_prec``). AFR-Net's readout is the paper's: the
  group difference |mean_patients m_e - mean_controls m_e| of the routing mask on held-out subjects;
  the baselines have no routing, so theirs is gradient x (input - training mean) saliency of the
  logit difference, summed over the edge's SC and FC entries. ``prec_at_k_saliency`` is that same
  saliency readout for every variant (AFR-Net included), the like-for-like comparison;
- ``sc_ttest_prec``, ``fc_ttest_prec`` (units per planted edge, as ``prec_at_k``): model-free references, precision at k of a two-sample
  t-test on the training subjects' log SC and Fisher-z FC on the SC edges (SC at chance: the disease is
  not in its law; FC finds the planted edges that ``closing`` weakens most), ``coupling_ttest_prec`` the same on each edge's SC-FC coupling (how
  hard localisation is in this cohort); ``coupling_ttest_margin`` (weakest planted |t| minus strongest
  unplanted |t|: > 0 exactly at the t-test's ceiling); ``oracle_auc`` (test AUC of a logistic
  regression told the planted edges: the cohort's reachable AUC); ``fusion_headroom`` (per test subject:
  a linear model on every SC edge's FC, log SC and coupling minus the better single-modality linear model,
  with ``linear_fc_auc``, ``linear_sc_auc``, ``linear_fused_auc``: does the cohort reward fusion at all?);
  these cohort references are computed once per seed in ``train_shared`` (``refs.npz``);
- AFR-Net only: ``gate_sd`` (spread over edges of a_e - log S_e, the precondition that learned
  gates differ from fixed ones; 0 for ``afr_net_fixed``), ``gate_effect`` (mean |change of the
  logit difference| when the trained network's gates are replaced by g_e = S_e, over its spread: do the gates
  change the output?), ``mask_effect`` (the same with the whole mask replaced by m_e = 1: does the
  output read the mask at all?; recorded for both AFR-Net variants), ``mask_shift`` (mean |m_learned - m_structural|: do the gates move the
  mask?), ``prec_at_k_gate`` (the same readout
  on the gates instead of the mask), ``mask_mean``, ``gate_mean``; ``gate_learned`` and ``mask_learned``
  (``afr_net`` only: the same network at initialisation against the trained one, :func:`learned_gate_change`:
  what training taught the gates); ``topk_diff_prec``, ``topk_diff_recall``, ``topk_diff_size`` (the reference
  code's own readout, :func:`topk_set_difference`, K = number of planted edges);
- every fitted variant: ``reg_weight_decay``, ``reg_dropout`` (the ``reg`` table's setting), ``best_val``;
- curves ``val_fit`` / ``lr_fit`` (validation cross-entropy and learning rate per evaluation: the
  convergence gate's), ``val_loss`` (the same curve, for the generic plot), ``train_loss`` (per step),
  ``edge_score`` (the readout per SC edge, x = i * N + j), and, in the ``afr_net`` cell only,
  the cohort's ``planted_edge``, ``sc_control_mean`` and ``fc_group_diff`` for the matrix plots.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...blocks.fitting import log_fit
from .data import Cohort, load_cohort_file, make_cohort, split_indices

VARIANTS = ("afr_net", "afr_net_fixed", "mlp", "gcn", "linear")


# --- metrics -------------------------------------------------------------------------------------

def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney probability P(score_pos > score_neg), ties counted half."""
    from scipy.stats import rankdata

    y = np.asarray(y).astype(bool)
    n1, n0 = y.sum(), (~y).sum()
    if n1 == 0 or n0 == 0:
        return float("nan")
    r = rankdata(score)
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def auc_units(y: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Per-subject AUC units whose mean is the ROC AUC (DeLong's placement values): a patient's
    value is the fraction of controls it outranks, a control's the fraction of patients that outrank
    it (ties half), each scaled by n / (2 n_class) so that the two classes weigh equally. Paired
    across variants (same test subjects in the same order), they give the claims their unit-level
    bootstrap interval."""
    y = np.asarray(y).astype(bool)
    s = np.asarray(score, float)
    pos, neg = s[y], s[~y]
    n1, n0 = len(pos), len(neg)
    cmp = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])   # (n1, n0)
    out = np.empty(len(s))
    out[y] = cmp.mean(1) * len(s) / (2 * n1)
    out[~y] = cmp.mean(0) * len(s) / (2 * n0)
    return out


def precision_at_k(score: np.ndarray, truth: np.ndarray, k: int | None = None) -> float:
    """Fraction of planted edges among the k highest scores (k = number of planted edges)."""
    truth = np.asarray(truth).astype(bool)
    k = int(truth.sum()) if k is None else k
    if k == 0:
        return float("nan")                                      # real data: nothing planted
    top = np.argsort(-np.asarray(score), kind="stable")[:k]
    return float(truth[top].mean())


def planted_hits(score: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per planted edge (in edge order): 1 if it is among the k highest scores, k = number of planted
    edges. Their mean is precision@k (k = number planted, so recall@k = precision@k): the per-edge
    units of the pathway claim, paired across variants (the same planted edges in the same order)."""
    truth = np.asarray(truth).astype(bool)
    k = int(truth.sum())
    top = np.zeros(len(truth), bool)
    top[np.argsort(-np.asarray(score), kind="stable")[:k]] = True
    return top[truth].astype(float)


def oracle_auc(fz: np.ndarray, log_sc: np.ndarray, y: np.ndarray, planted: np.ndarray, train: np.ndarray,
               test: np.ndarray) -> float:
    """Test AUC of a model told the planted edges: L2 logistic regression (C = 1, z-scored inputs) on
    the planted edges' Fisher-z FC, log SC and their coupling (z-scored product, :func:`coupling_features`)
    of the training subjects. What a classifier can reach on this cohort without having to find the
    edges (the cohort's reachable AUC, a precondition). The product is needed: the cohort keeps the SC law equal between
    groups and moves their coupling; ``closing`` also moves FC (data.py)."""
    from sklearn.linear_model import LogisticRegression

    if not planted.any():
        return float("nan")
    X = np.concatenate([fz[:, planted], log_sc[:, planted],
                        coupling_features(fz[:, planted], log_sc[:, planted], train)], 1)
    mu, sd = X[train].mean(0), X[train].std(0) + 1e-9
    clf = LogisticRegression(C=1.0, max_iter=2000).fit((X[train] - mu) / sd, y[train])
    return roc_auc(y[test], clf.decision_function((X[test] - mu) / sd))


def fusion_headroom_units(fz: np.ndarray, log_sc: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray,
                          test: np.ndarray, c_grid) -> tuple[np.ndarray, dict]:
    """Does the cohort reward fusing SC with FC? (cold review of stop 50, a data-side precondition of the AUC
    claims.) Three L2 logistic regressions over every SC edge (C on validation cross-entropy,
    :func:`fit_linear`): on Fisher-z FC alone, on log SC alone, and on FC, log SC and their per-edge coupling
    (:func:`coupling_features`) together. Returns the per-test-subject AUC units (DeLong placements,
    :func:`auc_units`) of the fused model minus those of the better single-modality model (the one with the
    higher TEST AUC: the conservative choice, it makes the headroom smaller), whose mean is the fused test AUC
    minus the best single-modality test AUC, and the three AUCs. Where this is near 0 the cohort is linear in
    one modality and an AUC comparison between fusion models tests sample efficiency, not fusion."""
    single = {"fc": fz, "sc": log_sc}
    fused = np.concatenate([fz, log_sc, coupling_features(fz, log_sc, train)], 1)
    units, aucs = {}, {}
    for name, X in {**single, "fused": fused}.items():
        clf, mu, sd, _, _ = fit_linear(X, y, train, val, c_grid)
        s = clf.decision_function((X[test] - mu) / sd)
        units[name], aucs[name] = auc_units(y[test], s), roc_auc(y[test], s)
    best = max(single, key=lambda k: aucs[k])
    return units["fused"] - units[best], aucs


def topk_set_difference(m: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """The reference code's pathway readout (``plot/analyze_group_diff.py``, v1.0.1): the group-mean mask of
    controls and of patients, the top-``k`` edges of each (the reference takes 200 edges of Glasser's 360-region
    matrix), and their symmetric difference (edges "unique to patients" or "unique to controls"). Returns a
    boolean mask over the edges: a SET, not a ranking (its size, 0 to 2k, depends on k)."""
    def top(v):
        out = np.zeros(len(v), bool)
        out[np.argsort(-v, kind="stable")[:k]] = True
        return out

    return top(m[y == 1].mean(0)) ^ top(m[y == 0].mean(0))


def logit_shift(ref: np.ndarray, alt: np.ndarray) -> float:
    """Mean |alt - ref| of a logit difference over subjects, in units of ref's spread over subjects
    (``gate_effect``, ``mask_effect``): 0 when the change leaves the output alone, scale-free."""
    ref, alt = np.asarray(ref, float), np.asarray(alt, float)
    return float(np.abs(alt - ref).mean() / (ref.std() + 1e-12))


def open_mask_logit_diff(model, T: dict, idx, batch: int = 64) -> np.ndarray:
    """AFR-Net's logit difference z1 - z0 on ``idx`` with its routing mask replaced by m_e = 1 on every
    SC edge (the node embeddings unchanged; eval mode, the reference attention path)."""
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(idx), batch):
            b = idx[s:s + batch]
            H, _, m, _, _ = model.route(T["S"][b], T["F"][b])
            z = model.readout(H, torch.ones_like(m))
            out.append((z[:, 1] - z[:, 0]).cpu().numpy())
    return np.concatenate(out)


def learned_gate_change(model, init, T: dict, idx, batch: int = 64) -> tuple[float, float]:
    """What training taught the gates (cold review of stop 50: ``gate_sd`` and ``mask_shift`` already hold in
    an untrained network, whose near-constant gate output leaves a_e - log S_e with the spread of log S).
    Compares the trained AFR-Net with the SAME network at initialisation (``init``: built from the same seed,
    the weights every fit starts from) on the subjects ``idx``:

    - ``gate_learned``: spread over the edges of a_e(trained) - a_e(init), mean over subjects (a shift
      constant over the edges is removed, as the mask's min-max removes it);
    - ``mask_learned``: mean |m_e - m_e'| over edges and subjects, m the trained network's mask and m' the
      trained network's mask with its log-conductances replaced by the initial network's (the same node
      embeddings, threshold and structural cost: only the gates differ).

    Both are exactly 0 for an untrained network (``init`` itself), so a precondition on them says that the
    gates learned something (tests/test_afr_net.py)."""
    import torch

    from . import routing

    model.eval()
    init.eval()
    sds, dm = [], []
    with torch.no_grad():
        for s in range(0, len(idx), batch):
            b = idx[s:s + batch]
            S, F = T["S"][b], T["F"][b]
            _, _, m, a, S_e = model.route(S, F)
            _, _, _, a0, _ = init.route(S, F)
            sds.append((a - a0).std(-1))
            E0 = routing.edge_energy(model.B, torch.exp(a0), F, model.energy_scale)
            m0 = routing.mask_from_energy(E0, S_e, model.tau, model.lambda_cost, model.threshold, model.eps)
            dm.append((m - m0).abs().mean(-1))
    return float(torch.cat(sds).mean()), float(torch.cat(dm).mean())


def ttest_scores(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|Welch t| per column of x (subjects x features) between y == 1 and y == 0."""
    a, b = x[y == 1], x[y == 0]
    se = np.sqrt(a.var(0, ddof=1) / len(a) + b.var(0, ddof=1) / len(b))
    return np.abs(a.mean(0) - b.mean(0)) / np.maximum(se, 1e-12)


def coupling_features(fz: np.ndarray, log_sc: np.ndarray, train: np.ndarray) -> np.ndarray:
    """Per subject and edge: z-scored Fisher-z FC times z-scored log SC (means and spreads of the
    training subjects): the edge's SC-FC coupling, where this cohort puts the disease (data.py)."""
    z = lambda x: (x - x[train].mean(0)) / (x[train].std(0) + 1e-12)
    return z(fz) * z(log_sc)


def fit_linear(X: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray, c_grid) -> tuple:
    """L2 logistic regression on z-scored X (training means and spreads), C chosen on validation
    cross-entropy over ``c_grid``; returns (classifier, mu, sd, chosen C, validation cross-entropy per C)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    mu, sd = X[train].mean(0), X[train].std(0) + 1e-9
    Z = (X - mu) / sd
    best, val_ce = None, {}
    for C in c_grid:
        clf = LogisticRegression(C=float(C), max_iter=5000).fit(Z[train], y[train])
        val_ce[float(C)] = float(log_loss(y[val], clf.predict_proba(Z[val])[:, 1], labels=[0, 1]))
        if best is None or val_ce[float(C)] < val_ce[best[1]]:
            best = (clf, float(C))
    return best[0], mu, sd, best[1], val_ce


# --- shared per-seed work ------------------------------------------------------------------------

def train_shared(ctx) -> None:
    p = ctx.params
    d = p["data"]
    if "source" in p:                                            # paper scale: a real cohort file
        cohort = load_cohort_file(p["source"]["path"], p["source"].get("consensus", 0.5))
    else:
        cohort = make_cohort(ctx.rng(0), **{**d, "severity": tuple(d["severity"])})
    split = split_indices(cohort.y, tuple(p["split"]), ctx.rng(1))
    cohort.save(ctx.outdir / "cohort.npz")
    np.savez(ctx.outdir / "split.npz", **split)
    refs = cohort_reference_values(cohort, split, p.get("linear", {}).get("c_grid", [0.001, 0.01, 0.1, 1.0]))
    np.savez(ctx.outdir / "refs.npz", **{k: np.asarray(v, float) for k, v in refs.items()})
    ctx.metrics.scalar("n_edges", len(cohort.edges))
    ctx.metrics.scalar("n_planted", int(cohort.planted.sum()))


# --- training ------------------------------------------------------------------------------------

def regularisation(p: dict, variant: str) -> dict:
    """The variant's weight decay and dropout: its entry of the config's ``reg`` table where there is one (smoke:
    chosen once on seed 0's validation from the same ``reg_grid`` for every network, :mod:`.pilot_reg`), else
    ``fit.weight_decay`` and ``train.dropout`` (ci, paper)."""
    row = (p.get("reg") or {}).get(variant)
    if row is None:
        return {"weight_decay": float(p["fit"]["weight_decay"]), "dropout": float(p["train"]["dropout"])}
    return {"weight_decay": float(row["weight_decay"]), "dropout": float(row["dropout"])}


def build_model(variant: str, cohort: Cohort, tensors: dict, p: dict):
    import torch

    from .models import AFRNet, GCNBaseline, MLPBaseline

    N = cohort.sc.shape[1]
    drop = regularisation(p, variant)["dropout"]
    S, F = tensors["S"][tensors["train"]], tensors["F"][tensors["train"]]
    if variant in ("afr_net", "afr_net_fixed"):
        a = p["afr"]
        x = AFRNet.node_features(S, F)
        return AFRNet(N, torch.as_tensor(cohort.edges), d=a["d"], heads=a["heads"], dropout=drop, tau=a["tau"],
                      lambda_cost=a["lambda_cost"], energy_scale=a["energy_scale"], learn_gate=variant == "afr_net",
                      graph_layers=a.get("graph_layers", 1), pooling=a.get("pooling", "mean"),
                      feat_mean=x.mean(0), feat_std=x.std(0))
    if variant == "mlp":
        x = MLPBaseline.features(S, F)
        return MLPBaseline(N, x.mean(0), x.std(0), hidden=p["mlp"]["hidden"], dropout=drop)
    if variant == "gcn":
        return GCNBaseline(N, hidden=p["gcn"]["hidden"], dropout=drop, feat_mean=F.mean(0), feat_std=F.std(0))
    raise ValueError(f"unknown variant '{variant}', expected one of {VARIANTS}")


def _predict(model, T: dict, idx, seed: int, batch: int = 64):
    """Logits and aux of ``idx`` in eval mode (deterministic: the routing energy is closed-form)."""
    import torch

    model.eval()
    logits, auxes = [], []
    with torch.no_grad():
        for s in range(0, len(idx), batch):
            b = idx[s:s + batch]
            z, aux = model(T["S"][b], T["F"][b])
            logits.append(z)
            auxes.append(aux)
    aux = {k: torch.cat([a[k] for a in auxes]) for k in auxes[0]} if auxes[0] else {}
    return torch.cat(logits), aux


def fit(variant: str, cohort: Cohort, T: dict, p: dict, seed: int, progress=print):
    """The shared training rule (``blocks.fitting.fit_to_plateau``): the same learning-rate grid for
    every variant, piloted on validation cross-entropy, the best rate continued at a constant rate
    until the validation curve passes the platform's plateau test; best-validation weights kept. Where
    the config has an ``lr`` table (smoke), the grid was piloted once (seed 0, validation only) and every
    seed trains at the variant's tabled rate under the same rule, without pilots
    (``blocks.rate_table``); the record's ``lr_source`` says which, ``lr_edge`` the rate's edge on the grid.
    One step = one minibatch of ``fit.batch`` training subjects; cross-entropy for every model (the
    published AFR-Net code, v1.0.1, trains on the task loss alone)."""
    import torch

    from ...blocks.fitting import fit_to_plateau
    from ...blocks.rate_table import fit_with_table_rate, stamp_source
    # the rate: the config's ``lr`` table where it has this variant's entry (chosen once on validation, one
    # seed: configs/smoke.yaml), else the grid piloted in this fit (ci, paper)
    f, source = fit_with_table_rate(p["fit"], p.get("lr"), variant, required=False)
    f = {**f, "weight_decay": regularisation(p, variant)["weight_decay"]}   # the reg table's, where it has one
    ce = torch.nn.functional.cross_entropy
    train_idx, val_idx = T["train"], T["val"]

    def build(gen):
        torch.manual_seed(seed)                                   # same initial weights for every rate
        return build_model(variant, cohort, T, p).to(T["S"].device)

    def train_loss(model, gen):
        pick = torch.randint(len(train_idx), (f["batch"],), generator=gen)
        b = train_idx[pick.to(train_idx.device)]
        z, _ = model(T["S"][b], T["F"][b])
        return ce(z, T["y"][b])

    def val_loss(model):
        zv, _ = _predict(model, T, val_idx, seed)
        return ce(zv, T["y"][val_idx]).item()

    model, rec = fit_to_plateau(build, train_loss, val_loss, f, seed, label=variant, progress=progress)
    return model, stamp_source(rec, source)


def saliency_edge_scores(model, T: dict, idx, edges: np.ndarray, seed: int) -> np.ndarray:
    """mean over subjects of |d(z1 - z0)/dX * (X - mean_train X)| for X in {SC, FC}, per edge
    (both triangles of each matrix summed): the readout available to any differentiable model."""
    import torch

    model.eval()
    S = T["S"][idx].clone().requires_grad_(True)
    F = T["F"][idx].clone().requires_grad_(True)
    z, _ = model(S, F)
    (z[:, 1] - z[:, 0]).sum().backward()
    mS, mF = T["S"][T["train"]].mean(0), T["F"][T["train"]].mean(0)
    contrib = ((S.grad * (S.detach() - mS)).abs() + (F.grad * (F.detach() - mF)).abs()).mean(0)
    contrib = contrib + contrib.T
    return contrib[edges[:, 0], edges[:, 1]].cpu().numpy()


def load_tensors(shared_dir: Path, p: dict, device: str = "cpu"):
    import torch

    cohort = Cohort.load(shared_dir / "cohort.npz")
    split = np.load(shared_dir / "split.npz")
    S = torch.as_tensor(cohort.sc, dtype=torch.float32, device=device)
    F = torch.as_tensor(cohort.fc, dtype=torch.float32, device=device)
    T = {"S": S, "F": F,
         "y": torch.as_tensor(cohort.y, dtype=torch.long, device=device)}
    for k in ("train", "val", "test"):
        T[k] = torch.as_tensor(split[k], dtype=torch.long, device=device)
    return cohort, T


def cohort_reference_values(cohort: Cohort, split: dict, c_grid) -> dict:
    """Model-free references of this seed's cohort (computed once per seed in ``train_shared`` and recorded in
    every variant's cell by :func:`record_cohort_references`): t-tests on log SC, Fisher-z FC and the SC-FC
    coupling of each edge (per planted edge hits, or NaN on real data); the coupling t-test's ceiling margin;
    oracle_auc; the fusion headroom (per test subject) and the three linear AUCs behind it. Arrays are
    recorded as units, numbers as scalars."""
    y, edges, planted = cohort.y, cohort.edges, cohort.planted
    tr, va, test = split["train"], split["val"], split["test"]
    sc_all = np.log(cohort.sc[:, edges[:, 0], edges[:, 1]] + 1e-12)
    fz_all = np.arctanh(np.clip(cohort.fc[:, edges[:, 0], edges[:, 1]], -0.999, 0.999))
    hits = (lambda sc: planted_hits(sc, planted)) if planted.any() else (lambda sc: float("nan"))
    out = {"sc_ttest_prec": precision_at_k(ttest_scores(sc_all[tr], y[tr]), planted),
           "fc_ttest_prec": hits(ttest_scores(fz_all[tr], y[tr]))}
    t_cp = ttest_scores(coupling_features(fz_all, sc_all, tr)[tr], y[tr])
    out["coupling_ttest_prec"] = hits(t_cp)
    # the ceiling margin of this seed's cohort: |t| of the weakest planted edge minus the largest |t| of
    # an unplanted one; > 0 exactly when the coupling t-test finds every planted edge (precision 1)
    if planted.any():
        out["coupling_ttest_margin"] = float(t_cp[planted].min() - t_cp[~planted].max())
    out["oracle_auc"] = oracle_auc(fz_all, sc_all, y, planted, tr, test)
    # fusion headroom (data-side precondition of the AUC claims): fused linear model on FC + SC + coupling of
    # every SC edge minus the better single-modality linear model, per test subject (mean = AUC difference)
    hr, aucs = fusion_headroom_units(fz_all, sc_all, y, tr, va, test, c_grid)
    out["fusion_headroom"] = hr
    out.update({f"linear_{k}_auc": float(a) for k, a in aucs.items()})
    return out


def record_cohort_references(ctx) -> None:
    """Record the seed's cohort references (``train_shared``'s ``refs.npz``) in this variant's cell."""
    z = np.load(ctx.shared_dir / "refs.npz")
    for k in z.files:
        v = z[k]
        if v.ndim:
            ctx.metrics.units(k, v)
        else:
            ctx.metrics.scalar(k, float(v))


def train_linear(ctx, cohort: Cohort, T: dict) -> None:
    """``linear``: L2 logistic regression on the z-scored Fisher-z FC upper triangle, C on validation
    cross-entropy (an exact convex fit: no learning rate, no convergence curve). Its pathway readout is
    |coefficient| of each SC edge's FC entry."""
    p = ctx.params
    y = T["y"].cpu().numpy()
    tr, va, te = (T[k].cpu().numpy() for k in ("train", "val", "test"))
    N, edges, planted = cohort.sc.shape[1], cohort.edges, cohort.planted
    iu = np.triu_indices(N, 1)
    X = np.arctanh(np.clip(cohort.fc[:, iu[0], iu[1]], -0.999, 0.999))
    t0 = time.perf_counter()
    clf, mu, sd, C, val_ce = fit_linear(X, y, tr, va, p.get("linear", {}).get("c_grid", [0.001, 0.01, 0.1, 1.0]))
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("linear_C", C)
    for c, ce in val_ce.items():
        ctx.progress(f"C {c:g}: validation cross-entropy {ce:.4f}")
    score = clf.decision_function((X[te] - mu) / sd)
    ctx.metrics.units("auc", auc_units(y[te], score))
    ctx.metrics.scalar("acc", float(((score > 0) == y[te]).mean()))
    ctx.metrics.scalar("val_auc", roc_auc(y[va], clf.decision_function((X[va] - mu) / sd)))
    W = np.zeros((N, N))
    W[iu] = np.abs(clf.coef_[0])
    native = W[edges[:, 0], edges[:, 1]]
    record_prec = (lambda name, sc: ctx.metrics.units(name, planted_hits(sc, planted))) if planted.any() \
        else (lambda name, sc: ctx.metrics.scalar(name, float("nan")))
    record_prec("prec_at_k", native)
    ctx.metrics.scalar("prec_at_k_saliency", precision_at_k(native, planted))
    ctx.metrics.scalar("chance_prec", int(planted.sum()) / len(edges))
    record_cohort_references(ctx)
    ctx.metrics.curve("edge_score", edges[:, 0] * N + edges[:, 1], native)
    ctx.progress(f"auc {ctx.metrics.scalars['auc']:.3f} (C {C:g})")


def train(ctx) -> None:
    import torch

    p, v = ctx.params, ctx.variant
    torch.manual_seed(ctx.seed)
    device = p.get("device", "cpu")
    cohort, T = load_tensors(ctx.shared_dir, p, device)
    N, edges, planted = cohort.sc.shape[1], cohort.edges, cohort.planted
    is_afr = v.startswith("afr_net")
    if v == "linear":
        return train_linear(ctx, cohort, T)
    t0 = time.perf_counter()
    model, rec = fit(v, cohort, T, p, ctx.seed, ctx.progress)
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t0)
    log_fit(ctx.metrics, "fit", rec)                               # val_fit, lr_fit: the convergence gate's curves
    ctx.metrics.curve("val_loss", rec["steps"], rec["vals"])
    ctx.metrics.curve("train_loss", np.arange(1, len(rec["losses"]) + 1), rec["losses"])
    ctx.metrics.scalar("plateau", float(rec["plateau"]))
    ctx.metrics.scalar("lr_from_table", float(rec["lr_source"] == "table"))
    reg = regularisation(p, v)
    ctx.metrics.scalar("reg_weight_decay", reg["weight_decay"])
    ctx.metrics.scalar("reg_dropout", reg["dropout"])
    ctx.metrics.scalar("best_val", float(min(rec["vals"])))
    ctx.metrics.scalar("lr_edge", {"top": 1.0, "bottom": -1.0}.get(rec["lr_edge"], 0.0))
    for lr, best in rec["pilot_best"].items():
        ctx.progress(f"pilot lr {lr:g}: best validation cross-entropy {best:.4f}")

    y = T["y"].cpu().numpy()
    test = T["test"]
    zt, _ = _predict(model, T, test, ctx.seed)
    score = (zt[:, 1] - zt[:, 0]).cpu().numpy()
    ctx.metrics.units("auc", auc_units(y[test], score))          # mean = roc_auc(y[test], score)
    ctx.metrics.scalar("acc", float(((score > 0) == y[test]).mean()))
    zv, _ = _predict(model, T, T["val"], ctx.seed)
    ctx.metrics.scalar("val_auc", roc_auc(y[T["val"]], (zv[:, 1] - zv[:, 0]).cpu().numpy()))

    # pathway readouts on the held-out subjects (validation + test)
    held = torch.cat([T["val"], test])
    sal = saliency_edge_scores(model, T, held, edges, ctx.seed)
    k = int(planted.sum())
    if is_afr:
        _, aux = _predict(model, T, held, ctx.seed)
        m = aux["m"].cpu().numpy()
        gate = aux["a"].cpu().numpy()
        yh = y[held.cpu().numpy()]
        native = np.abs(m[yh == 1].mean(0) - m[yh == 0].mean(0))
        ctx.metrics.scalar("mask_mean", float(m.mean()))
        ctx.metrics.scalar("gate_mean", float(gate.mean()))
        # a log-conductance shift constant over the edges scales every energy alike and leaves the mask
        # unchanged: the spread over the edges of a_e - log S_e is how far the learned routing departs
        # from routing by SC alone (0 for afr_net_fixed)
        s_e = aux["S_e"].cpu().numpy()
        ctx.metrics.scalar("gate_sd", float((gate - np.log(s_e + 1e-6)).std(1).mean()))
        # do the gates change the output? the same trained network with its gates replaced by the
        # structural ones (g_e = S_e, afr_net_fixed's routing) on the same subjects: mean |change of the logit difference| over the
        # held-out subjects, in units of the logit difference's spread (0 when the output ignores them)
        zl, _ = _predict(model, T, held, ctx.seed)
        model.learn_gate = False
        z0, aux0 = _predict(model, T, held, ctx.seed)
        model.learn_gate = True
        # how far the mask itself moves (mean |m_learned - m_structural| over edges and subjects): tells a
        # mask the gates do not move from a moved mask the classifier ignores
        ctx.metrics.scalar("mask_shift", float(np.abs(m - aux0["m"].cpu().numpy()).mean()))
        dl, d0 = (zl[:, 1] - zl[:, 0]).cpu().numpy(), (z0[:, 1] - z0[:, 0]).cpu().numpy()
        ctx.metrics.scalar("gate_effect", logit_shift(dl, d0))
        # does the output read the mask at all? the same network with every SC edge fully open (m_e = 1,
        # attention bias 0 on every SC edge): the most any gate could do through the mask, in the same
        # units (a readout that ignores its mask leaves no room for gate_effect)
        ctx.metrics.scalar("mask_effect", logit_shift(dl, open_mask_logit_diff(model, T, held)))
        if v == "afr_net":
            # what the gates learned: the same network at initialisation (fit builds it from torch.manual_seed(seed))
            torch.manual_seed(ctx.seed)
            init = build_model(v, cohort, T, p).to(T["S"].device)
            gl, ml = learned_gate_change(model, init, T, held)
            ctx.metrics.scalar("gate_learned", gl)
            ctx.metrics.scalar("mask_learned", ml)
        # the reference code's own readout (top-k set difference of the group-mean masks, k = #planted here):
        # its precision (planted share of the set, 0 for an empty set), its size and its recall of the planted edges
        D = topk_set_difference(m, yh, max(k, 1))
        ctx.metrics.scalar("topk_diff_size", float(D.sum()))
        ctx.metrics.scalar("topk_diff_prec", float((D & planted).sum() / max(D.sum(), 1)))
        ctx.metrics.scalar("topk_diff_recall", float((D & planted).sum() / max(k, 1)))
        ctx.metrics.scalar("prec_at_k_gate", precision_at_k(np.abs(gate[yh == 1].mean(0) - gate[yh == 0].mean(0)), planted))
    else:
        native = sal
    # precision@k with k = number of planted edges, recorded per planted edge (hit or miss): the
    # pathway claim's interval resamples edges and seeds (real data, nothing planted: NaN)
    record_prec = (lambda name, sc: ctx.metrics.units(name, planted_hits(sc, planted))) if planted.any() \
        else (lambda name, sc: ctx.metrics.scalar(name, float("nan")))
    record_prec("prec_at_k", native)
    ctx.metrics.scalar("prec_at_k_saliency", precision_at_k(sal, planted))
    ctx.metrics.scalar("chance_prec", k / len(edges))
    record_cohort_references(ctx)
    flat = edges[:, 0] * N + edges[:, 1]
    ctx.metrics.curve("edge_score", flat, native)
    if v == "afr_net":
        ctx.metrics.curve("planted_edge", flat, planted.astype(float))
        ctl = cohort.sc[y == 0].mean(0)
        ctx.metrics.curve("sc_control_mean", flat, ctl[edges[:, 0], edges[:, 1]])
        iu = np.triu_indices(N, 1)
        dfc = cohort.fc[y == 0].mean(0) - cohort.fc[y == 1].mean(0)
        ctx.metrics.curve("fc_group_diff", iu[0] * N + iu[1], dfc[iu])
    ctx.progress(f"auc {ctx.metrics.scalars['auc']:.3f} prec@k {ctx.metrics.scalars['prec_at_k']:.3f} "
                 f"(saliency {ctx.metrics.scalars['prec_at_k_saliency']:.3f}, chance {k / len(edges):.3f})")


# --- plots ---------------------------------------------------------------------------------------

def _matrix(sub, n: int, seed=None) -> np.ndarray:
    """Symmetric N x N matrix from a curve whose x is the flat index i * N + j (mean over seeds
    unless ``seed`` is given)."""
    if seed is not None:
        sub = sub[sub.seed == seed]
    g = sub.groupby("x").value.mean()
    M = np.zeros((n, n))
    idx = g.index.to_numpy().astype(int)
    M[idx // n, idx % n] = g.values
    return M + M.T


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    curve_plot(table, "val_loss", plots_dir / "curve_val_loss.png", xlabel="step",
               ylabel="validation cross-entropy (nats)", title="Have all models trained until validation flattens?")
    curve_plot(table, "train_loss", plots_dir / "curve_train_loss.png", xlabel="step",
               ylabel="training cross-entropy (nats)", title="Training loss per minibatch")
    n = int(params.get("data", {}).get("n_regions", 68))
    pl = plt()
    planted = table[table.metric == "planted_edge"]
    if planted.empty:
        return
    seed = int(sorted(planted.seed.unique())[0])
    P = _matrix(planted, n, seed)
    pi, pj = np.nonzero(np.triu(P > 0.5))

    def mark(ax):
        ax.scatter(pj, pi, s=28, facecolors="none", edgecolors="lime", linewidths=1.0, label="planted")
        ax.scatter(pi, pj, s=28, facecolors="none", edgecolors="lime", linewidths=1.0)

    # the cohort: mean control SC with the planted pathways, and the FC group difference
    sc = _matrix(table[table.metric == "sc_control_mean"], n, seed)
    fc = _matrix(table[table.metric == "fc_group_diff"], n, seed)
    fig, axes = pl.subplots(1, 2, figsize=(10, 4.6))
    im = axes[0].imshow(sc, cmap="viridis")
    fig.colorbar(im, ax=axes[0], label="mean SC weight, controls (a.u.)")
    mark(axes[0])
    axes[0].set_title(f"Control SC, planted pathways circled (seed {seed})", fontsize=9)
    lim = np.abs(fc).max() or 1.0
    im = axes[1].imshow(fc, cmap="RdBu_r", vmin=-lim, vmax=lim)
    fig.colorbar(im, ax=axes[1], label="FC controls - patients (Pearson r)")
    mark(axes[1])
    axes[1].set_title("FC group difference", fontsize=9)
    for ax in axes:
        ax.set_xlabel("region")
        ax.set_ylabel("region")
    axes[0].legend(loc="lower left", fontsize=7)
    fig.suptitle("Where does the patient effect sit in SC and FC?")
    fig.tight_layout()
    for name in ("curve_sc_control_mean.png", "curve_fc_group_diff.png", "curve_planted_edge.png"):
        fig.savefig(plots_dir / name, dpi=110)
    pl.close(fig)

    # each model's pathway readout, its top-k edges marked, planted edges circled
    scores = table[table.metric == "edge_score"]
    variants = [v for v in VARIANTS if v in set(scores.variant)]
    k = len(pi)
    fig, axes = pl.subplots(1, len(variants), figsize=(4.2 * len(variants), 4.4), squeeze=False)
    prec = table[(table.metric == "prec_at_k") & table.x.isna()].groupby("variant").value
    for ax, v in zip(axes[0], variants):
        E = _matrix(scores[scores.variant == v], n, seed)
        im = ax.imshow(E / (E.max() or 1.0), cmap="magma")
        tri = np.triu(E, 1)
        top = np.argsort(-tri.ravel())[:k]
        ax.scatter(top % n, top // n, marker="x", s=22, c="cyan", linewidths=1.0, label=f"top-{k}")
        mark(ax)
        ax.set_title(f"{v}: precision@{k} = {prec.mean().get(v, np.nan):.2f} +- {prec.std().get(v, np.nan):.2f}",
                     fontsize=9)
        ax.set_xlabel("region")
        ax.set_ylabel("region")
    axes[0][0].legend(loc="lower left", fontsize=7)
    fig.colorbar(im, ax=axes[0].tolist(), label="pathway score / max (AFR: |mask diff|, else saliency)")
    fig.suptitle(f"Which SC edges does each model point at? (seed {seed}; precision over seeds)")
    fig.savefig(plots_dir / "curve_edge_score.png", dpi=110)
    pl.close(fig)
