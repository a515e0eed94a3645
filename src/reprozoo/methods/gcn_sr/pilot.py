"""Seed-0 pilots behind the smoke config's choices (budget, tasks, GP-only's grid), reproducible:

    python -m reprozoo.methods.gcn_sr.pilot --variants dsr --tasks nguyen2 nguyen4 --runs 4
    python -m reprozoo.methods.gcn_sr.pilot --variants gp --set gp_only.population=1000 ...

Runs ``method.search_once`` exactly as ``train`` does (the smoke config, the same data and search
seeds as seed 0 of the pipeline), then prints per variant and task the recovery rate, the copy
rate of GP children, evaluations and CPU seconds, and per variant the convergence gate's numbers
(``reprozoo.claims.tail_fit``) on every search curve. Writes a JSON record with ``--out``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml


def main(argv=None) -> dict:
    from reprozoo.claims import tail_fit

    from .benchmarks import NGUYEN, task_data
    from .expressions import symbolically_equal
    from .method import _checkpoints, _trace_on, search_curves, search_once

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--tasks", nargs="+")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], help="config overrides key.sub=value (yaml values)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cfg = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    for kv in a.set:
        key, val = kv.split("=", 1)
        d = cfg
        *path, last = key.split(".")
        for k in path:
            d = d.setdefault(k, {})
        d[last] = yaml.safe_load(val)
    tasks, runs = a.tasks or cfg["benchmarks"], a.runs or cfg["runs"]
    grid = _checkpoints(cfg["budget"])
    out = {"config": cfg, "seed": a.seed, "variants": {}}
    for v in a.variants:
        traces, rec, rows = [], {}, []
        for name in tasks:
            x, y = task_data(name, a.seed)
            ok = []
            for run in range(runs):
                t0 = time.process_time()
                hall = search_once(v, x, y, cfg, a.seed * 1000 + run)
                cpu = time.process_time() - t0
                ok.append(bool(symbolically_equal(hall.best, NGUYEN[name].truth, NGUYEN[name].domain)))
                traces.append(_trace_on(hall, grid))
                rows.append({"task": name, "run": run, "evals": hall.evals, "proposed": hall.proposed,
                             "cpu_s": round(cpu, 2), "recovered": ok[-1], "best_reward": hall.best_reward})
            rec[name] = float(np.mean(ok))
        curves = search_curves(grid, np.array(traces))
        gate = {k: tail_fit(xs, ys, "max") for k, (xs, ys) in curves.items()}
        res = {"recovery": rec, "recovery_rate": float(np.mean([r["recovered"] for r in rows])),
               "cpu_s_per_search": float(np.mean([r["cpu_s"] for r in rows])),
               "evals": float(np.mean([r["evals"] for r in rows])),
               "repeat_fraction": 1 - float(np.sum([r["evals"] for r in rows]) / np.sum([r["proposed"] for r in rows])),
               "gate": {k: {"improvement_pct": round(100 * g["improvement"], 2), "points": g["tail_points"]}
                        for k, g in gate.items()},
               "curves": {k: [round(float(t), 4) for t in ys] for k, (_, ys) in curves.items()},
               "searches": rows}
        out["variants"][v] = res
        print(f"{v}: recovery {res['recovery_rate']:.2f} {rec} cpu/search {res['cpu_s_per_search']:.2f} s "
              f"evals {res['evals']:.0f} repeats {res['repeat_fraction']:.2f}", flush=True)
        for k, g in res["gate"].items():
            print(f"   {k}: tail improvement {g['improvement_pct']} % over {g['points']} points; "
                  f"curve {res['curves'][k][::3]}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
