"""Development probes behind the README's "Why the gates do not reach the output" (not part of the
pipeline; run from the repository root, one core, about a minute each):

    python -m reprozoo.methods.afr_net.probe_gates model "{}" published 150
    python -m reprozoo.methods.afr_net.probe_gates model "{}" nofc 150
    python -m reprozoo.methods.afr_net.probe_gates model "dict(severity=(0.8, 0.95), grade=1.0)" published 150
    python -m reprozoo.methods.afr_net.probe_gates model "{}" maskpool 150
    python -m reprozoo.methods.afr_net.probe_gates data "dict(sc_noise=0.8)" ...
    python -m reprozoo.methods.afr_net.probe_gates closing 0 0.5 0.75 1.0
    python -m reprozoo.methods.afr_net.probe_gates fusion 0 0.125 0.25 0.375 0.5 0.75

``fusion``: the data-side rule that sets ``data.closing`` since the cold review of stop 50 (:func:`probe_fusion`);
``closing``: the earlier rule (:func:`probe_closing`, kept for the record).

``model``: the smoke cohort of seed 0 (with the data overrides given), the smoke AFR-Net built by
``method.build_model``, trained with Adam at 3e-3 for the given number of minibatches of 64 (0: at
initialisation); prints test+validation AUC with learned and with structural gates, ``gate_effect``, the
output shift when the mask is replaced by its subject mean or by all ones (``mask_effect``), ``mask_shift``,
``gate_sd``, the mask's and the gates' group-difference precision@12 and the summed squared gradient norms
of the gate network and of everything else. ``nofc`` (diagnostic only, not a model of the paper) blanks the
FC row out of the node features, leaving the gates and the mask as the only per-edge route of FC.
``published`` and ``nofc`` pool the graph readout by the plain mean (the reference code's), ``maskpool``
by each node's summed mask (``pooling: mask``, the smoke setting).
``data``: for each override, L2 logistic regressions on the planted edges' Fisher-z FC alone and with their
log SC, on every SC edge's FC alone and with SC (C = 0.05), and the FC t-test's precision@12 and margin:
how much a reader of per-edge SC next to FC gains.
"""
import sys
import time
from pathlib import Path

import numpy as np
import yaml

SMOKE = Path(__file__).parent / "configs" / "smoke.yaml"


def probe_model(over: dict, mode: str, steps: int) -> None:
    import torch

    from .method import _predict, build_model, precision_at_k, roc_auc

    torch.set_num_threads(1)
    cfg = yaml.safe_load(SMOKE.read_text())
    seed = 0
    c, sp, _, _ = _dev_cohort(cfg, seed, **over)
    T = {"S": torch.tensor(c.sc, dtype=torch.float32), "F": torch.tensor(c.fc, dtype=torch.float32),
         "y": torch.tensor(c.y)}
    for k in sp: T[k] = torch.tensor(sp[k])
    torch.manual_seed(0)
    model = build_model("afr_net", c, T, cfg)
    if mode == "nofc":   # diagnostic only: node features without the FC row (strength features kept)
        model.feat_std[:, :c.sc.shape[1]] = float("inf")
    # the readout's pooling: the published mean unless mode is maskpool (models.AFRNet.pool_weights)
    model.pooling = "mask" if mode == "maskpool" else "mean"
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(0)
    t0 = time.time(); gnorm = {"gate": 0.0, "rest": 0.0}
    for s in range(steps):
        model.train()
        b = T["train"][torch.randint(len(T["train"]), (64,), generator=gen)]
        z, _ = model(T["S"][b], T["F"][b])
        loss = torch.nn.functional.cross_entropy(z, T["y"][b])
        opt.zero_grad(); loss.backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                gnorm["gate" if n.startswith("gate") else "rest"] += p.grad.norm().item()**2
        opt.step()
    held = torch.cat([T["val"], T["test"]]); y = c.y[held.numpy()]
    zl, aux = _predict(model, T, held, 0)
    dl = (zl[:, 1] - zl[:, 0]).numpy()
    model.learn_gate = False; z0, aux0 = _predict(model, T, held, 0); model.learn_gate = True
    d0 = (z0[:, 1] - z0[:, 0]).numpy()
    # mask sensitivity: readout with the mask set to its subject mean (no edge structure), and with all ones
    with torch.no_grad():
        model.eval()
        H, E, m, a, Se = model.route(T["S"][held], T["F"][held])
        zc = model.readout(H, m.mean(-1, keepdim=True).expand_as(m)); dc = (zc[:, 1] - zc[:, 0]).numpy()
        z1 = model.readout(H, torch.ones_like(m)); d1 = (z1[:, 1] - z1[:, 0]).numpy()
    m = aux["m"].numpy(); g = aux["a"].numpy()
    sd = dl.std()
    print(over, mode, f"steps {steps} {time.time()-t0:.0f}s auc {roc_auc(y, dl):.3f} fixed-gate auc {roc_auc(y, d0):.3f}",
          f"gate_effect {np.abs(dl-d0).mean()/sd:.3f} mask->mean {np.abs(dl-dc).mean()/sd:.3f} mask->1 {np.abs(dl-d1).mean()/sd:.3f}",
          f"mask_shift {np.abs(m-aux0['m'].numpy()).mean():.3f} gate_sd {(g-np.log(aux['S_e'].numpy()+1e-6)).std(1).mean():.3f}",
          f"prec mask {precision_at_k(np.abs(m[y==1].mean(0)-m[y==0].mean(0)), c.planted):.2f} gate {precision_at_k(np.abs(g[y==1].mean(0)-g[y==0].mean(0)), c.planted):.2f}",
          f"grad^2 gate {gnorm['gate']:.3g} rest {gnorm['rest']:.3g}", flush=True)


def probe_data(overrides: list) -> None:
    from sklearn.linear_model import LogisticRegression

    from .method import precision_at_k, roc_auc, ttest_scores

    cfg = yaml.safe_load(SMOKE.read_text())

    def lr(X, y, tr, te, C=1.0):
        mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-9
        c = LogisticRegression(C=C, max_iter=3000).fit((X[tr]-mu)/sd, y[tr])
        return roc_auc(y[te], c.decision_function((X[te]-mu)/sd))

    seed = 0
    for over in [dict(), *overrides]:
        t = time.time()
        c, sp, fz, ls = _dev_cohort(cfg, seed, **over)
        e, y, tr, te = c.edges, c.y, sp["train"], sp["test"]
        P = c.planted
        t_fc = ttest_scores(fz[tr], y[tr])
        print(over, "seed", seed, "E", len(e),
              "orc FC+SC %.3f FConly %.3f | all-edge FC %.3f FC+SC %.3f | ttest prec %.2f margin %.1f | %.0fs" % (
                  lr(np.c_[fz[:, P], ls[:, P]], y, tr, te), lr(fz[:, P], y, tr, te),
                  lr(fz, y, tr, te, 0.05), lr(np.c_[fz, ls], y, tr, te, 0.05),
                  precision_at_k(t_fc, P), t_fc[P].min() - t_fc[~P].max(), time.time() - t), flush=True)


def _dev_cohort(cfg: dict, seed: int, **over):
    """A probe's cohort: the smoke config's data with ``over`` replacing its keys, drawn from ``seed`` (every
    override draws the same cohort otherwise): (cohort, split, Fisher-z FC and log SC per SC edge)."""
    from .data import make_cohort, split_indices

    d = {**cfg["data"], "severity": tuple(cfg["data"]["severity"]), **over}
    c = make_cohort(np.random.default_rng(seed * 1_000_003), **d)
    sp = split_indices(c.y, tuple(cfg["split"]), np.random.default_rng(seed * 1_000_003 + 1))
    e = c.edges
    return c, sp, np.arctanh(np.clip(c.fc[:, e[:, 0], e[:, 1]], -.999, .999)), np.log(c.sc[:, e[:, 0], e[:, 1]])


def probe_fusion(values: list, seed: int = 7) -> None:
    """The rule that sets ``closing`` since the cold review of stop 50 (written here before it was run): on the
    development cohort (seed 7, not a smoke seed; the smoke config otherwise) and its TRAINING and VALIDATION
    subjects only (fit on training, C and the score on validation), compute the fusion headroom of
    :func:`method.fusion_headroom_units` (linear model on every SC edge's FC + log SC + coupling, minus the
    better of FC alone and log SC alone) for closing in {0, 0.125, 0.25, 0.375, 0.5, 0.75}; choose the LARGEST
    closing whose headroom is >= 0.10, twice the precondition's margin (``fusion_headroom > 0.05``, spec.yaml),
    so that the precondition is not marginal on the smoke seeds while FC carries as much of the disease as the
    headroom allows (the baselines read FC). Prints the FC-only, SC-only and fused validation AUCs as well."""
    from .method import fusion_headroom_units

    cfg = yaml.safe_load(SMOKE.read_text())
    for closing in values:
        t = time.time()
        c, sp, fz, ls = _dev_cohort(cfg, seed, closing=closing)
        y, tr, va = c.y, sp["train"], sp["val"]
        hr, aucs = fusion_headroom_units(fz, ls, y, tr, va, va, cfg["linear"]["c_grid"])
        print(f"closing {closing} seed {seed} (validation): FC {aucs['fc']:.3f} SC {aucs['sc']:.3f} fused "
              f"{aucs['fused']:.3f} headroom {hr.mean():+.3f} | {time.time() - t:.0f}s", flush=True)


def probe_closing(values: list, seed: int = 7) -> None:
    """The rule that set ``closing`` (data-side only, before any network ran on the cohort): on a development
    cohort (seed 7, not a smoke seed; the smoke config otherwise), for each closing value print the FC and
    coupling t-tests' precision@12 and ceiling margins, ``oracle_auc`` and the ``linear`` variant's model
    (L2 logistic regression on the whole Fisher-z FC triangle, C on validation: FC alone, what the
    baselines read). Every value draws the same cohort except for the closing."""
    from .method import coupling_features, fit_linear, oracle_auc, precision_at_k, roc_auc, ttest_scores

    cfg = yaml.safe_load(SMOKE.read_text())
    for closing in values:
        t = time.time()
        c, sp, fz, ls = _dev_cohort(cfg, seed, closing=closing)
        y, tr, va, te, P = c.y, sp["train"], sp["val"], sp["test"], c.planted
        t_fc = ttest_scores(fz[tr], y[tr])
        t_cp = ttest_scores(coupling_features(fz, ls, tr)[tr], y[tr])
        iu = np.triu_indices(c.sc.shape[1], 1)
        X = np.arctanh(np.clip(c.fc[:, iu[0], iu[1]], -.999, .999))
        clf, mu, sd, C, _ = fit_linear(X, y, tr, va, cfg["linear"]["c_grid"])
        print(f"closing {closing} seed {seed}: FC t-test prec {precision_at_k(t_fc, P):.2f} margin "
              f"{t_fc[P].min() - t_fc[~P].max():.2f} | coupling t-test prec {precision_at_k(t_cp, P):.2f} margin "
              f"{t_cp[P].min() - t_cp[~P].max():.2f} | oracle {oracle_auc(fz, ls, y, P, tr, te):.3f} | "
              f"linear FC {roc_auc(y[te], clf.decision_function((X[te] - mu) / sd)):.3f} (C {C:g}) | "
              f"{time.time() - t:.0f}s", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "model":
        probe_model(eval(sys.argv[2]) if len(sys.argv) > 2 else {}, sys.argv[3] if len(sys.argv) > 3 else "published",
                    int(sys.argv[4]) if len(sys.argv) > 4 else 150)
    elif sys.argv[1] == "fusion":
        probe_fusion([float(x) for x in sys.argv[2:]])
    elif sys.argv[1] == "closing":
        probe_closing([float(x) for x in sys.argv[2:]])
    else:
        probe_data([eval(x) for x in sys.argv[2:]])
