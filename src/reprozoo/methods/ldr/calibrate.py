"""The constants of each benchmark's config that are fixed BEFORE the pipeline measures: every
variant's learning rate, each LDR variant's weight λ, the level ESS* and the no-harm controls'
N. All come from calibration seeds the pipeline never uses (100-104; the pipeline's seeds are
0-4), with the pipeline's own training rule, so no test-seed result can move them.

* learning rate and λ (``grid``): every variant gets the same grid, ``LR_GRID`` (x ``LAMBDA_GRID``
  for an LDR variant; our grid, no public code gives one), and the cell with the lowest validation
  NLL of the trained flow, averaged over the smallest and the largest N, on calibration seed 100.
  The validation NLL is the criterion for every variant (it is ML's objective, and the part of
  LDR's objective that λ does not scale); neither ESS nor any test metric enters the choice.
* ESS* and n_control (``sweeps``): ML's whole sweep on every calibration seed.
  ESS* = ``STAR_FRACTION`` (0.9) x the mean of ML's ESS at ``STAR_N`` (a mid-grid N, where ML's
  curve is still steep; at the largest N, the previous anchor, ML's curve is a flat, noisy
  plateau and the N where a seed crosses 0.9 of it is noise). It reads ML only. The
  sample-efficiency claims ask how many samples each model needs to get there (efficiency.py).
  n_control, one per no-harm metric (known harms that must NOT pass the no-harm test): for each
  N below the largest, the harm of training ML on N instead of all the samples, in the claim's
  own units (log10 ESS ratio, NLL difference, log10 clipped E-W2 ratio), divided by the claim's
  margin, averaged over the seeds; the LARGEST N whose harm is at least ``CONTROL_FACTOR`` (2)
  margins (the mildest harm on the grid that the metric sees at twice the margin), else the
  smallest N.

    python -m reprozoo.methods.ldr.calibrate smoke gmm grid [VARIANT ...]   # lr (x λ) tables
    python -m reprozoo.methods.ldr.calibrate smoke gmm sweeps [SEED ...]    # ESS*, n_control
    python -m reprozoo.methods.ldr.calibrate smoke gmm sweeps_merge         # parts run in parallel
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
# the N whose ML ESS (mean over CALIBRATION_SEEDS) sets ESS*: mid-grid, where ML's curve is still
# steep (fixed before the sweeps below were run; the largest N, the previous anchor, sat on ML's
# flat, noisy plateau, and the N at which a seed crossed it was noise)
STAR_N = {"gmm": 512, "dw4": 1024}
# the no-harm claims' margins (spec.yaml), in the claims' units: harm > 0 means worse
MARGINS = {"ess": 0.0458, "nll": 0.05, "ew2c": 0.0969}
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


def harms(res: dict, i: int) -> dict:
    """Harm of ML at grid index i against ML at the largest N, per no-harm metric, in margins."""
    import math

    h = {"ess": math.log10(res["ess"][-1]) - math.log10(res["ess"][i]),
         "nll": res["nll"][i] - res["nll"][-1],
         "ew2c": math.log10(res["ew2c"][i]) - math.log10(res["ew2c"][-1])}
    return {k: v / MARGINS[k] for k, v in h.items()}


def choose_controls(table: dict, ns) -> tuple[dict, dict]:
    """Per metric: the largest N (of ``ns`` without the largest) with harm >= CONTROL_FACTOR margins
    in ``table`` (N as str -> metric -> harm in margins), else the smallest N; and whether it was reached."""
    chosen, reached = {}, {}
    for k in MARGINS:
        ok = [int(n) for n in ns[:-1] if table[str(n)][k] >= CONTROL_FACTOR]
        chosen[k], reached[k] = (max(ok), True) if ok else (int(ns[0]), False)
    return chosen, reached


def ml_sweeps(scale: str, bench: str, seeds=CALIBRATION_SEEDS) -> dict:
    """ML's whole sweep (the pipeline's ``sweep`` and training rule) on every calibration seed, and
    from it both constants: ESS* = STAR_FRACTION x the mean of ML's ESS at STAR_N[bench], and
    n_control per no-harm metric (``choose_controls`` on the harm table, mean over the same seeds)."""
    from .method import datasets, sweep

    p, b = _load(scale, bench)
    ns = [int(n) for n in b["n_grid"]]
    n_star = STAR_N[bench]
    if n_star not in ns:
        raise ValueError(f"STAR_N {n_star} is not on the {bench} grid {ns}")
    curves, per_seed = [], []
    for seed in seeds:
        t0 = time.process_time()
        res = sweep("ml", datasets(bench, b, seed), b, p, seed, bench)
        curves.append({k: res[k] for k in ("ess", "nll", "ew2c", "ew2rw", "crop_frac", "stop_step", "final_step",
                                           "capped", "anneal_gain_nll", "tail_phase2")})
        per_seed.append({str(n): harms(res, i) for i, n in enumerate(ns[:-1])})
        print(f"{bench} seed {seed}: {time.process_time() - t0:.1f} cpu-s", flush=True)
    return _constants(scale, bench, b, ns, list(seeds), curves, per_seed)


def merge_sweeps(scale: str, bench: str) -> dict:
    """The per-seed part files of ``sweeps`` (run in parallel), merged in CALIBRATION_SEEDS order,
    with ESS* and n_control computed from all of them (the same rule as ``ml_sweeps``)."""
    parts = {}
    for f in sorted(HERE.glob(f"calibration_part_{scale}_{bench}_sweeps_*.json")):
        d = json.loads(f.read_text())
        for s, c, h in zip(d["seeds"], d["curves"], d["per_seed_harm"]):
            parts[int(s)] = (c, h)
    missing = [s for s in CALIBRATION_SEEDS if s not in parts]
    if missing:
        raise SystemExit(f"sweeps_merge: no part file for seeds {missing}")
    p, b = _load(scale, bench)
    ns = [int(n) for n in b["n_grid"]]
    curves = [parts[s][0] for s in CALIBRATION_SEEDS]
    per_seed = [parts[s][1] for s in CALIBRATION_SEEDS]
    return _constants(scale, bench, b, ns, list(CALIBRATION_SEEDS), curves, per_seed)


def _constants(scale, bench, b, ns, seeds, curves, per_seed) -> dict:
    n_star = STAR_N[bench]
    ess_at = [c["ess"][ns.index(n_star)] for c in curves]
    star = STAR_FRACTION * sum(ess_at) / len(ess_at)
    table = {str(n): {k: sum(s[str(n)][k] for s in per_seed) / len(per_seed) for k in MARGINS} for n in ns[:-1]}
    chosen, reached = choose_controls(table, ns)
    reach = [max(c["ess"]) >= star for c in curves]
    print(f"{bench}: ESS* = {STAR_FRACTION:g} x mean ML ESS at N = {n_star} {ess_at} = {star:.4f}; "
          f"reached on {sum(reach)}/{len(reach)} seeds; n_control = {chosen} ({reached})", flush=True)
    lr = b["train"]["lr"]
    return {"scale": scale, "bench": bench, "seeds": list(seeds), "n": ns, "lr": lr["ml"] if isinstance(lr, dict) else lr,
            "curves": curves, "star_n": n_star, "fraction": STAR_FRACTION, "ess_at_star_n": ess_at, "ess_star": star,
            "reached_per_seed": reach, "margins": MARGINS, "factor": CONTROL_FACTOR, "per_seed_harm": per_seed,
            "harm_in_margins": table, "n_control": chosen, "reached": reached}


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    scale, bench, what = argv[:3]
    if what == "grid":
        out = grid_table(scale, bench, argv[3:] or None)
    elif what == "sweeps":  # optional seeds: one part file per call, merged by `sweeps_merge`
        out = ml_sweeps(scale, bench, tuple(int(x) for x in argv[3:]) or CALIBRATION_SEEDS)
    elif what == "sweeps_merge":
        out = merge_sweeps(scale, bench)
        what, argv = "sweeps", argv[:3]
    else:
        raise SystemExit("usage: python -m reprozoo.methods.ldr.calibrate SCALE BENCH grid [VARIANT ...] | sweeps [SEED ...]"
                         " | sweeps_merge")
    tag = "_".join([scale, bench, what] + argv[3:])
    if what == "sweeps" and len(argv) > 3:
        tag = "part_" + tag
    (HERE / f"calibration_{tag}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
