"""The hand-run probe the README quotes (not part of the pipeline; run after a smoke run of
seed 0, from the project root):

    python -m reprozoo.methods.rector.probes eegnet 16 1e-3 3e-3 1e-2   # EEGNet on 48 labels
    python -m reprozoo.methods.rector.probes eegnet all 1e-3 3e-3       # ... on every training epoch
    python -m reprozoo.methods.rector.probes pilot 40 1e-3 3e-3 1e-2 3e-2   # EEGNet's rate pilot (round 4)
    python -m reprozoo.methods.rector.probes sim '{"node_jitter": 0.45, "node_scale": 2.5}'   # round 9

The ``sim`` probe (round 9, no smoke run needed) simulates the 30 smoke subjects with the given
simulate.simulate options and fits logistic regressions at 16 labels per class on the smoke splits of
seeds 0-2 (test weighted-F1, mean over the 10 test subjects): on the alpha+beta DE of C3 and C4 only,
on the network-pooled alpha+beta DE (mean over each planted network's four nodes), on all channels'
DE, and on each left-right node pair: can a single node read the class, does pooling a network help?

Why they exist: EEGNet sits at chance at 16 labels per class, and the probe shows it lacks labels,
not steps.
"""
from __future__ import annotations

import sys
import time

import numpy as np

FEATURES = "results/smoke/rector/_shared/seed0/features.npz"


def eegnet(labels: str, rates: list[float], steps: int = 300) -> None:
    """AdamW, batch 16, every 50 steps: (step, validation CE, test weighted-F1)."""
    import torch
    import torch.nn.functional as F

    from . import method, models

    torch.set_num_threads(1)
    f = dict(np.load(FEATURES))
    y, tr, va, te = f["y"], f["train"], f["val"], f["test"]
    X, Y = torch.as_tensor(f["raw"]), torch.as_tensor(y)
    idx = torch.as_tensor(f["labels_16"] if labels == "16" else tr)
    full = torch.ones(len(X), X.shape[1], dtype=torch.bool)
    for lr in rates:
        torch.manual_seed(0)
        net = models.EEGNet(X.shape[1], X.shape[2], 3, F1=8, D=2, F2=16, kern=64, dropout=0.25)  # as the pipeline (smoke.yaml eegnet)
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
        g = torch.Generator().manual_seed(0)
        out, t = [], time.process_time()
        for s in range(steps + 1):
            if s % 50 == 0:
                net.eval()
                with torch.no_grad():
                    vl = float(F.cross_entropy(net(X[va], full[va]), Y[va]))
                    p = net(X[te], full[te]).argmax(1).numpy()
                net.train()
                out.append((s, round(vl, 3), round(method.weighted_f1(y[te], p), 3)))
            b = idx[torch.randperm(len(idx), generator=g)[:16]]
            loss = F.cross_entropy(net(X[b], full[b]), Y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"lr {lr:g}: (step, val CE, test wF1) {out}; {time.process_time() - t:.1f} CPU-s")


def pilot(pilot_steps: int, rates: list[float]) -> None:
    """EEGNet on every training label through the pipeline's own fine-tune (method.finetune, the smoke
    config's fit options) with the given grid and pilot length: each rate's pilot score, the chosen
    rate, the stop, the convergence gate on the stopping curve and the test weighted-F1 per subject."""
    import copy
    from pathlib import Path

    import torch
    import yaml

    from reprozoo.claims import plateau

    from . import method

    torch.set_num_threads(1)
    p = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    p["fit"] = {**p["fit"], "lr_grid": rates, "pilot_steps": int(pilot_steps)}
    f = dict(np.load(FEATURES))
    idx, X, y, va, te = f["labels_all"], f["raw"], f["y"], f["val"], f["test"]
    torch.manual_seed(0)
    net0 = method.build_net("eegnet", f, p)
    t = time.process_time()
    net, rec = method.finetune(lambda: copy.deepcopy(net0), X[idx], y[idx], X[va], y[va], p, 0, "eegnet", print)
    f1 = method.per_subject_f1(y[te], method.predict(net, X[te], np.ones((len(te), X.shape[1]), bool)), f["subj"][te])
    print(f"pilot scores {({k: round(v, 3) for k, v in rec['pilot_best'].items()})}; lr {rec['lr']:g}, "
          f"{rec['stop']} steps, gate {plateau(rec['steps'], rec['curves']['ce'], 0.02)}; test wF1 per subject "
          f"{np.round(f1, 3).tolist()} (mean {f1.mean():.3f}); {time.process_time() - t:.1f} CPU-s")


def sim(kw: dict) -> None:
    from sklearn.linear_model import LogisticRegression

    from . import method, simulate
    from .features import de_features

    t = time.process_time()
    X, y, subj, ch, _ = simulate.simulate(30, 20, 128.0, 4.0, 23, **kw)
    _, whole, _ = de_features(X, 128.0, 1.0)
    W = method.per_subject_standardise(whole, subj, (0,))
    idx = {c: i for i, c in enumerate(ch)}
    L, R = ([idx[c] for c in simulate.NETWORKS[h]] for h in ("left", "right"))
    feats = {"c3c4_ab": W[:, [idx["C3"], idx["C4"]]][:, :, 2:4].reshape(len(W), -1),
             "netpool_ab": np.concatenate([W[:, L, 2:4].mean(1), W[:, R, 2:4].mean(1)], 1),
             "all_C1": W.reshape(len(W), -1)}
    for a, b in zip(simulate.NETWORKS["left"], simulate.NETWORKS["right"]):
        feats[a + b] = W[:, [idx[a], idx[b]]][:, :, 2:4].reshape(len(W), -1)
    subjects = [f"S{s + 1:03d}" for s in subj]
    res = {k: [] for k in feats}
    for seed in (0, 1, 2):
        sp = method.subject_split(subjects, None, 10, 2, seed=seed, n_pretrain=13, step=10)
        part = np.array([sp[s] for s in subjects])
        tr, te = np.flatnonzero(part == "train"), np.flatnonzero(part == "test")
        lab = method.nested_label_sets(y, tr, [16], np.random.default_rng([seed, 1]))[16]
        for k, F in feats.items():
            clf = LogisticRegression(C=1.0, max_iter=2000).fit(F[lab], y[lab])
            res[k].append(round(float(method.per_subject_f1(y[te], clf.predict(F[te]), subj[te]).mean()), 3))
    print(kw, res, f"{time.process_time() - t:.1f} CPU-s", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["sim"]:
        import json

        sim(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
        raise SystemExit(0)
    if sys.argv[1:2] == ["eegnet"]:
        eegnet(sys.argv[2], [float(a) for a in sys.argv[3:]])
    elif sys.argv[1:2] == ["pilot"]:
        pilot(int(sys.argv[2]), [float(a) for a in sys.argv[3:]])
    else:
        raise SystemExit(__doc__)
