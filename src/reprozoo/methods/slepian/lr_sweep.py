"""The learning-rate sweep behind ``head.lr`` and ``coast_head.lr`` in a scale's config (run once,
by hand; not a job).

Every encoder's head trains on seed 0's split (the same points ``train_shared`` draws for seed 0)
at every peak rate of ``lr_grid`` (one grid for every encoder and both tasks), with the scale's
steps, batch, schedule and validation spacing. The rate whose kept model has the lowest
VALIDATION loss (the model selection the pipeline uses: the weights of the lowest validation loss),
among the rates whose run passes the convergence gate, is that encoder's rate for that task at every seed. The test points are never read. The sweep also
records the convergence gate's numbers for every run (:func:`reprozoo.claims.tail_fit` on the
validation curve, and the rate's floor in the last 30 %), so the chosen rates are known to pass
the gate on seed 0 before the pipeline runs.

    python -m reprozoo.methods.slepian.lr_sweep smoke      # writes lr_sweep_smoke.json (this folder)

The scale config's ``head.lr`` / ``coast_head.lr`` must equal the sweep's choice
(``tests/test_slepian.py`` checks it).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TASKS = {"head": "land", "coast_head": "coast"}


def sweep(scale: str, seed: int = 0, variants=None, lrs=None) -> dict:
    import torch
    import yaml

    from ...claims import _tail_check, tail_fit
    from ...registry import Convergence
    from .encoders import make_encoder
    from .head import fit_classifier, fit_regressor
    from .method import VARIANT_ORDER, make_tasks

    torch.set_num_threads(1)  # as the pipeline's jobs (threads: 1)
    p = yaml.safe_load((HERE / "configs" / f"{scale}.yaml").read_text())
    grid = [float(x) for x in (lrs or p["lr_grid"])]
    # the generators of train_shared for this seed (reprozoo.runtime: seed * 1_000_003 + offset)
    t = make_tasks(p, np.random.default_rng(seed * 1_000_003 + 11), np.random.default_rng(seed * 1_000_003 + 12))
    out = {"scale": scale, "seed": seed, "grid": grid,
           "criterion": "among the rates whose run passes the convergence gate (a run that is still improving "
                        "cannot be judged), the lowest validation loss of the kept model (land/sea: cross-entropy "
                        "on the validation points; coastal index: validation MSE); ties: the smaller rate; if no "
                        "rate passes, the lowest validation loss",
           "runs": {}, "choice": {"head": {}, "coast_head": {}}}
    for v in variants or VARIANT_ORDER:
        enc = make_encoder(v, p)
        feats = {"head": [enc(t[f"{s}_lat"], t[f"{s}_lon"]) for s in ("train", "val")],
                 "coast_head": [enc(t[f"coast_{s}_lat"], t[f"coast_{s}_lon"]) for s in ("train", "val")]}
        ys = {"head": (t["train_y"], t["val_y"]), "coast_head": (t["coast_train_y"], t["coast_val_y"])}
        for key, task in TASKS.items():
            runs = {}
            for lr in grid:
                cfg = {**p[key], "lr": lr}
                c0 = time.process_time()
                if key == "head":
                    model, steps, val, _ = fit_classifier(feats[key][0], ys[key][0], feats[key][1], ys[key][1], 2,
                                                          cfg, seed)
                else:
                    model, steps, val, _ = fit_regressor(feats[key][0], ys[key][0], feats[key][1], ys[key][1],
                                                         cfg, seed)
                gate = _tail_check(np.asarray(steps, float), np.asarray(val, float), Convergence(f"val_loss_{task}"),
                                   (np.asarray(steps, float), np.asarray(model.lr_history, float)))
                fit = tail_fit(steps, val)
                runs[str(lr)] = {"best_val": float(min(val)), "best_step": int(model.best_step),
                                 "tail_improvement": float(fit["improvement"]), "tail_points": fit["tail_points"],
                                 "lr_tail_min_over_peak": gate.get("lr_tail_min", np.nan) / gate.get("lr_peak", np.nan),
                                 "gate_passes": bool(gate["converged"]), "cpu_s": time.process_time() - c0}
                r = runs[str(lr)]
                print(f"{v:10s} {task:5s} lr {lr:g}: best val {r['best_val']:.5f} at {r['best_step']}, tail "
                      f"{100 * r['tail_improvement']:+.2f} % over {r['tail_points']} points, gate "
                      f"{'passes' if r['gate_passes'] else 'FAILS'} ({r['cpu_s']:.1f} CPU-s)", flush=True)
            out["runs"].setdefault(v, {})[task] = runs
            passing = [lr for lr in grid if runs[str(lr)]["gate_passes"]] or grid
            out["choice"][key][v] = min(passing, key=lambda lr: (runs[str(lr)]["best_val"], lr))
    return out


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    scale = argv[0] if argv else "smoke"
    res = sweep(scale)
    path = HERE / f"lr_sweep_{scale}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["choice"]), "->", path)


if __name__ == "__main__":
    main()
