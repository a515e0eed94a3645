"""The constants of each benchmark's config that are fixed BEFORE the pipeline measures: every
variant's learning rate, each LDR variant's weight λ, and the level ESS*. All come from
calibration seeds the pipeline never uses (100-104; the pipeline's seeds are 0-4), with the
pipeline's own training rule (method.train_flow: plateau stop at a constant lr, then the lr/10
phase), so no test-seed result can move them.

* learning rate and λ: every variant gets the same grid, ``LR_GRID`` (x ``LAMBDA_GRID`` for an
  LDR variant), and the cell with the lowest validation NLL of the trained flow, averaged over
  the smallest and the largest N, on calibration seed 100. The validation NLL is the criterion
  for every variant (it is ML's objective, and the part of LDR's objective that λ does not
  scale); neither ESS nor any test metric enters the choice.
* ESS* = ``STAR_FRACTION`` (0.9) x the mean over ``CALIBRATION_SEEDS`` (five) of ML's ESS at the
  largest N, with ML's chosen learning rate: 90 % of what the baseline reaches with all the data.
  It reads ML only. The sample-efficiency claims ask how many samples each model needs to get
  there (efficiency.py).

    python -m reprozoo.methods.ldr.calibrate smoke gmm grid [VARIANT ...]   # lr (x λ) tables
    python -m reprozoo.methods.ldr.calibrate smoke gmm star                 # ESS* (config's ml lr)

Prints its tables and the values to write into configs/<scale>.yaml, and writes them to
``calibration_<scale>_<bench>_<what>.json`` in this folder (the record the config cites).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

LR_GRID = (1e-3, 3e-3, 1e-2, 3e-2)
LAMBDA_GRID = (0.1, 0.3, 1.0)
CALIBRATION_SEEDS = (100, 101, 102, 103, 104)
STAR_FRACTION = 0.9
HERE = Path(__file__).parent


def _load(scale: str, bench: str) -> tuple[dict, dict]:
    from ...registry import get

    p = get("ldr").config(scale)
    return p, p["benchmarks"][bench]


def _prepared(b: dict, name: str, seed: int, device: str):
    from .method import _setup, datasets, flow_coords

    target, chart = _setup(b)
    data = datasets(name, b, seed)
    out = {k: flow_coords(chart, data[k], data["e_" + k], target.temperature, device) for k in ("pool", "val", "test")}
    return target, chart, data, out


def grid_table(scale: str, bench: str, variants=None, seed: int = CALIBRATION_SEEDS[0]) -> dict:
    """Per variant and (lr, λ) cell: the trained flow's validation NLL at the smallest and the
    largest N; and the chosen cell (lowest mean)."""
    from .method import VARIANT_MEASURE, train_flow

    p, b = _load(scale, bench)
    _, chart, _, d = _prepared(b, bench, seed, p.get("device", "cpu"))
    ns = [int(n) for n in b["n_grid"]]
    out = {}
    for v in variants or b["variants"]:
        measure = VARIANT_MEASURE[v]
        cells = {}
        for lam in (LAMBDA_GRID if measure else (0.0,)):
            for lr in LR_GRID:
                row = []
                for n in (ns[0], ns[-1]):
                    t0 = time.process_time()
                    _, rec = train_flow(measure, lam, d["pool"][0][:n], d["pool"][1][:n], *d["val"], chart.dim, b,
                                        seed, n, bench, lr=lr)
                    row.append(rec["val_nll_final"])
                    print(f"{bench} {v} lambda={lam:g} lr={lr:g} N={n}: val NLL {row[-1]:.4f} (stop {rec['stop_step']}, "
                          f"lr/10 to {rec['final_step']}, capped {rec['capped']}, {time.process_time() - t0:.1f} cpu-s)",
                          flush=True)
                cells[f"lambda={lam:g} lr={lr:g}"] = {"lambda": lam, "lr": lr, "val_nll": row,
                                                      "mean": sum(row) / len(row)}
        best = min(cells.values(), key=lambda c: c["mean"])
        out[v] = {"cells": cells, "chosen": {"lr": best["lr"], "lambda": best["lambda"]}}
        print(f"{bench} {v}: chosen lr = {best['lr']:g}" + (f", lambda = {best['lambda']:g}" if measure else ""),
              flush=True)
    return {"scale": scale, "bench": bench, "seed": seed, "n": [ns[0], ns[-1]], "lr_grid": LR_GRID,
            "lambda_grid": LAMBDA_GRID, "criterion": "validation NLL, mean of the smallest and the largest N",
            "variants": out}


def ess_star(scale: str, bench: str, seeds=CALIBRATION_SEEDS) -> dict:
    """STAR_FRACTION x the mean over ``seeds`` of ML's ESS at the largest N (the config's ml lr)."""
    from .method import _seed, evaluate, settings, train_flow

    p, b = _load(scale, bench)
    _, _, lr = settings(b, p, "ml")
    n = max(int(n) for n in b["n_grid"])
    vals = []
    for seed in seeds:
        target, chart, data, d = _prepared(b, bench, seed, p.get("device", "cpu"))
        flow, rec = train_flow(None, 0.0, d["pool"][0][:n], d["pool"][1][:n], *d["val"], chart.dim, b, seed, n, bench,
                               lr=lr)
        flow.eval()
        res = evaluate(flow, target, chart, d["test"][0], data["e_test"], b["eval"], _seed(seed, n, 2, bench))
        vals.append(res["ess"])
        print(f"{bench} seed {seed} N={n}: ML ESS {res['ess']:.4f} (stop {rec['stop_step']})", flush=True)
    mean = sum(vals) / len(vals)
    star = STAR_FRACTION * mean
    print(f"{bench}: ESS* = {STAR_FRACTION:g} x mean {mean:.4f} = {star:.4f}", flush=True)
    return {"scale": scale, "bench": bench, "seeds": list(seeds), "n": n, "lr": lr, "ess": vals,
            "fraction": STAR_FRACTION, "ess_star": star}


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    scale, bench, what = argv[:3]
    if what == "grid":
        out = grid_table(scale, bench, argv[3:] or None)
    elif what == "star":
        out = ess_star(scale, bench)
    else:
        raise SystemExit("usage: python -m reprozoo.methods.ldr.calibrate SCALE BENCH grid [VARIANT ...] | star")
    tag = "_".join([scale, bench, what] + argv[3:])
    (HERE / f"calibration_{tag}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
