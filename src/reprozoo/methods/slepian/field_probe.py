"""Probe (not part of the pipeline): the regional-field task alone, on further seeds, cheaply. The
smoke config's field task and field head (``data.field_task``, ``head.fit_classifier`` with
``field_head``), all four encoders, the generator ``numpy.random.default_rng(SEED)`` (not the
pipeline's stream, so seed 0 here is not the pipeline's seed 0). Prints the k-NN reference, each
encoder's test accuracy, and the precondition's and the three local claims' values on this one seed,
with 95 % half-widths from the test points alone (no seed spread).

    OMP_NUM_THREADS=1 python -m reprozoo.methods.slepian.field_probe SEED
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from .data import field_task
from .encoders import make_encoder
from .head import fit_classifier

VARIANTS = ("slepian", "hybrid", "sh", "sinusoidal")


def main(seed: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    p = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    t, _ = field_task(p, np.random.default_rng(seed))
    y = t["field_test_y"]
    knn = (t["field_test_knn_y"] == y).astype(float)
    print(f"seed {seed}: k {int(t['field_knn_k'])} knn {knn.mean():.4f} 1nn {np.mean(t['field_test_nn_y'] == y):.4f} "
          f"positive {y.mean():.3f}", flush=True)
    acc = {}
    for v in VARIANTS:
        c0 = time.process_time()
        enc = make_encoder(v, p)
        X = {sp: enc(t[f"field_{sp}_lat"], t[f"field_{sp}_lon"]) for sp in ("train", "val", "test")}
        clf, rec = fit_classifier(X["train"], t["field_train_y"], X["val"], t["field_val_y"], 2, p["field_head"], seed,
                                  label=v, progress=lambda m: None)
        acc[v] = (clf.proba(X["test"]).argmax(1) == y).astype(float)
        print(f"  {v}: {acc[v].mean():.4f} lr {rec['lr']} stop {rec['stop']} cpu {time.process_time() - c0:.1f}",
              flush=True)
    best = max(VARIANTS, key=lambda v: acc[v].mean())
    diffs = {"precondition (best - knn)": acc[best] - knn, "slepian - sh": acc["slepian"] - acc["sh"],
             "slepian - sinusoidal": acc["slepian"] - acc["sinusoidal"], "hybrid - sh": acc["hybrid"] - acc["sh"]}
    for name, d in diffs.items():
        print(f"  {name}: {d.mean():+.4f} +- {1.96 * d.std(ddof=1) / np.sqrt(len(d)):.4f}")
    return {name: float(d.mean()) for name, d in diffs.items()}


if __name__ == "__main__":
    main(int(sys.argv[1]))
