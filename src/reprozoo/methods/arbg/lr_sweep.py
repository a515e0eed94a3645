"""The learning-rate sweep behind ``train.lr`` in a scale's config (run once, by hand; not a job).

Every variant trains at every peak rate of ``train.lr_grid`` for the full ``train.steps`` with the
scale's schedule, batch and data of seed 0 (the same MALA data ``train_shared`` makes for seed 0),
and the rate with the lowest VALIDATION loss at the end of training (mean of the last five
evaluations) is the variant's rate for every seed. The test split is never read. One grid for
every model; full-length runs, because a short pilot cannot tell the rates apart here (the spline
flow's validation loss at 3e-3 and 1e-2 ties at 15 % of the steps and ends far apart).

    python -m reprozoo.methods.arbg.lr_sweep smoke        # writes lr_sweep_smoke.json (this folder)

The scale config's ``train.lr`` must equal the sweep's choice (``tests/test_arbg.py`` checks it).
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
N_LAST = 5  # evaluations averaged at the end of training


def end_loss(val_curve) -> float:
    """Mean validation loss over the last ``N_LAST`` evaluations (inf if any is not finite)."""
    tail = [v for _, v in val_curve[-N_LAST:]]
    return float(np.mean(tail)) if tail and all(math.isfinite(v) for v in tail) else float("inf")


def choose(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per variant, the grid rate with the lowest end-of-training validation loss."""
    return {v: float(min(r, key=lambda lr: r[lr])) for v, r in results.items()}


def sweep(scale: str, seed: int = 0) -> dict:
    import torch
    import yaml

    from ...claims import _tail_check
    from ...registry import Convergence
    from .data import make_dataset
    from .method import VARIANTS, _target, _val_loss, fit
    from .models import build

    torch.set_num_threads(1)
    p = yaml.safe_load((HERE / "configs" / f"{scale}.yaml").read_text())
    tp, name, k = p["train"], p["targets"][0], 0
    tgt = _target(name)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 17 + k)  # as train_shared
    data = make_dataset(tgt, p["data"]["n_train"], p["data"]["n_val"], p["data"]["n_test"], p["data"]["augment"],
                        gen, p["data"]["mala"])
    y_tr, y_va = data["y_train"].float(), data["y_val"].float()
    results: dict[str, dict[str, float]] = {}
    gate: dict[str, dict[str, float]] = {}
    for v in VARIANTS:
        results[v], gate[v] = {}, {}
        for lr in tp["lr_grid"]:
            torch.manual_seed(seed * 7919 + k)  # as train: the same initial model for every rate
            model = build(v, y_tr.shape[1], float(data["scale"]), p)
            t0 = time.process_time()
            _, rec = fit(model, y_tr, y_va, tp["steps"], tp["batch"], [lr], tp.get("schedule", {}), tp["eval_every"],
                         [], torch.Generator().manual_seed(seed * 1_000_003 + 101 + k), _val_loss,
                         progress=lambda m: None)
            xs, ys = (np.array(a, dtype=float) for a in zip(*rec["val"]))
            lx, ly = (np.array(a, dtype=float) for a in zip(*rec["lr"]))
            g = _tail_check(xs, ys, Convergence("val", scale="range", lr="lr"), (lx, ly))
            results[v][str(lr)] = end_loss(rec["val"])
            gate[v][str(lr)] = float(g.get("tail_improvement", float("nan")))
            print(f"{v} lr {lr:g}: end validation loss {results[v][str(lr)]:.4f}, tail improvement "
                  f"{100 * gate[v][str(lr)]:.2f} % ({time.process_time() - t0:.1f} CPU-s)", flush=True)
    return {"scale": scale, "seed": seed, "target": name, "grid": tp["lr_grid"], "steps": tp["steps"],
            "criterion": f"mean validation loss over the last {N_LAST} evaluations",
            "end_val_loss": results, "tail_improvement": gate, "chosen": choose(results)}


if __name__ == "__main__":
    scale = sys.argv[1] if len(sys.argv) > 1 else "smoke"
    out = sweep(scale)
    path = HERE / f"lr_sweep_{scale}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"chosen: {out['chosen']} -> {path}")
