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
    python -m reprozoo.methods.ldr.calibrate smoke gmm control              # n_control (the known harm)

* n_control (the no-harm claims' controls, known harms that must NOT pass the no-harm test), one
  per no-harm metric: ML's whole sweep on calibration seeds ``CONTROL_SEEDS``; for each N below the
  largest, the harm of training on N instead of all the samples, in the claim's own units (log10
  ESS ratio, NLL difference, log10 E-W2 ratios), divided by the claim's margin. A metric's
  n_control is the LARGEST N whose harm (mean over the seeds) is at least ``CONTROL_FACTOR`` (2)
  margins: the mildest harm on the grid that the metric sees at twice the margin. If no N on the
  grid gets there, the smallest N (the strongest harm the grid has; the claim's control may then
  hold, and the claim reads non-discriminative: the metric cannot see a harm of the margin's size).
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
CONTROL_SEEDS = (100, 101)
CONTROL_FACTOR = 2.0
# the no-harm claims' margins (spec.yaml), in the claims' units: harm > 0 means worse
MARGINS = {"ess": 0.0458, "nll": 0.05, "ew2c": 0.0969, "ew2rw": 0.0969}
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


def harms(res: dict, i: int) -> dict:
    """Harm of ML at grid index i against ML at the largest N, per no-harm metric, in margins."""
    import math

    h = {"ess": math.log10(res["ess"][-1]) - math.log10(res["ess"][i]),
         "nll": res["nll"][i] - res["nll"][-1],
         "ew2c": math.log10(res["ew2c"][i]) - math.log10(res["ew2c"][-1]),
         "ew2rw": math.log10(res["ew2rw"][i]) - math.log10(res["ew2rw"][-1])}
    return {k: v / MARGINS[k] for k, v in h.items()}


def control_n(scale: str, bench: str, seeds=CONTROL_SEEDS) -> dict:
    """n_control: the largest N whose every harm (mean over ``seeds``) is >= CONTROL_FACTOR margins."""
    from .method import datasets, sweep

    p, b = _load(scale, bench)
    ns = [int(n) for n in b["n_grid"]]
    per_seed = []
    for seed in seeds:
        t0 = time.process_time()
        res = sweep("ml", datasets(bench, b, seed), b, p, seed, bench)
        per_seed.append({str(n): harms(res, i) for i, n in enumerate(ns[:-1])})
        print(f"{bench} seed {seed}: {time.process_time() - t0:.1f} cpu-s", flush=True)
    table = {}
    for n in ns[:-1]:
        table[str(n)] = {k: sum(s[str(n)][k] for s in per_seed) / len(per_seed) for k in MARGINS}
        print(f"{bench} N={n}: harm / margin " + ", ".join(f"{k} {v:.2f}" for k, v in table[str(n)].items()), flush=True)
    chosen, reached = choose_controls(table, ns)
    print(f"{bench}: n_control = {chosen} (harm of 2 margins reached: {reached})", flush=True)
    return {"scale": scale, "bench": bench, "seeds": list(seeds), "n_max": ns[-1], "margins": MARGINS,
            "factor": CONTROL_FACTOR, "per_seed": per_seed, "harm_in_margins": table,
            "n_control": chosen, "reached": reached}


def choose_controls(table: dict, ns) -> tuple[dict, dict]:
    """Per metric: the largest N (of ``ns`` without the largest) with harm >= CONTROL_FACTOR margins
    in ``table`` (N as str -> metric -> harm in margins), else the smallest N; and whether it was reached."""
    chosen, reached = {}, {}
    for k in MARGINS:
        ok = [int(n) for n in ns[:-1] if table[str(n)][k] >= CONTROL_FACTOR]
        chosen[k], reached[k] = (max(ok), True) if ok else (int(ns[0]), False)
    return chosen, reached


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    scale, bench, what = argv[:3]
    if what == "grid":
        out = grid_table(scale, bench, argv[3:] or None)
    elif what == "star":
        out = ess_star(scale, bench)
    elif what == "control":
        out = control_n(scale, bench)
    else:
        raise SystemExit("usage: python -m reprozoo.methods.ldr.calibrate SCALE BENCH grid [VARIANT ...] | star | control")
    tag = "_".join([scale, bench, what] + argv[3:])
    (HERE / f"calibration_{tag}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
