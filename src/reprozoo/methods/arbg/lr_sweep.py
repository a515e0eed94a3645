"""The learning-rate sweep behind ``train.lr`` in a scale's config (run once, by hand; not a job).

Every variant trains at every peak rate of ``train.lr_grid`` for the full ``train.steps`` with the
scale's schedule, batch and data of seed 0 (the same MALA data ``train_shared`` makes for seed 0),
and the rate with the lowest VALIDATION loss at the end of training is the variant's rate for
every seed: for ArBG and the spline flow the mean validation NLL of the last five evaluations; for
the CNF, whose training loss (flow matching) is not a likelihood and differs between rates by
less than its noise, the validation NLL of its returned model (exact-divergence ODE solve on
``N_NLL_CNF`` validation points). The test split is never read. One grid for every model;
full-length runs, because a short pilot cannot tell the rates apart here (the spline flow's
validation loss at 3e-3 and 1e-2 ties at 15 % of the steps and ends far apart). For the CNF the
sweep also records the change of its proposal log q when the RK4 steps are doubled (the
``ode_logq_err`` precondition), at the configured steps and at half of them.

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
N_NLL_CNF = 256  # validation points of the CNF's NLL (one ODE solve each)


def end_loss(val_curve) -> float:
    """Mean validation loss over the last ``N_LAST`` evaluations (inf if any is not finite)."""
    tail = [v for _, v in val_curve[-N_LAST:]]
    return float(np.mean(tail)) if tail and all(math.isfinite(v) for v in tail) else float("inf")


def choose(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per variant, the grid rate with the lowest end-of-training validation loss."""
    return {v: float(min(r, key=lambda lr: r[lr])) for v, r in results.items()}


def sweep(scale: str, seed: int = 0, variants=None, lrs=None, data_cache: str | None = None) -> dict:
    """The sweep; ``variants`` / ``lrs`` restrict it to part of the grid (parts run as separate
    processes and are joined by :func:`merge`), ``data_cache`` keeps seed 0's MALA data on disk so
    that the parts do not each redraw it (the same data: same generator seed)."""
    import copy

    import torch
    import yaml

    from ...claims import _tail_check
    from ...registry import Convergence
    from .data import make_dataset
    from .method import VARIANTS, _target, _val_loss, cnf_ode_error, fit
    from .models import build

    torch.set_num_threads(1)
    p = yaml.safe_load((HERE / "configs" / f"{scale}.yaml").read_text())
    tp, name, k = p["train"], p["targets"][0], 0
    tgt = _target(name)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 17 + k)  # as train_shared
    t0 = time.process_time()
    if data_cache and Path(data_cache).exists():
        data = torch.load(data_cache, weights_only=True)
    else:
        data = make_dataset(tgt, p["data"]["n_train"], p["data"]["n_val"], p["data"]["n_test"],
                            p["data"]["augment"], gen, p["data"]["mala"])
        if data_cache:
            torch.save(data, data_cache)
    print(f"data: {time.process_time() - t0:.1f} CPU-s", flush=True)
    y_tr, y_va = data["y_train"].float(), data["y_val"].float()
    results: dict[str, dict[str, float]] = {}
    gate: dict[str, dict[str, float]] = {}
    cnf_fm: dict[str, float] = {}
    cnf_ode: dict[str, dict[str, float]] = {}
    seconds: dict[str, dict[str, float]] = {}
    for v in variants or VARIANTS:
        results[v], gate[v], seconds[v] = {}, {}, {}
        for lr in (lrs or tp["lr_grid"]):
            torch.manual_seed(seed * 7919 + k)  # as train: the same initial model for every rate
            model = build(v, y_tr.shape[1], float(data["scale"]), p)
            t0 = time.process_time()
            trained, rec = fit(model, y_tr, y_va, tp["steps"], tp["batch"], [lr], tp.get("schedule", {}),
                               tp["eval_every"], [], torch.Generator().manual_seed(seed * 1_000_003 + 101 + k),
                               _val_loss, progress=lambda m: None)
            seconds[v][str(lr)] = time.process_time() - t0
            xs, ys = (np.array(a, dtype=float) for a in zip(*rec["val"]))
            lx, ly = (np.array(a, dtype=float) for a in zip(*rec["lr"]))
            g = _tail_check(xs, ys, Convergence("val", scale="range", lr="lr"), (lx, ly))
            if v == "cnf":
                with torch.no_grad():
                    results[v][str(lr)] = float(-trained.log_prob(y_va[:N_NLL_CNF]).mean())
                cnf_fm[str(lr)] = end_loss(rec["val"])
                cnf_ode[str(lr)] = {}
                for n_steps in (max(1, trained.ode_steps // 2), trained.ode_steps):
                    m2 = copy.deepcopy(trained)
                    m2.ode_steps = n_steps
                    cnf_ode[str(lr)][str(n_steps)] = cnf_ode_error(m2, 256, torch.Generator().manual_seed(404))
            else:
                results[v][str(lr)] = end_loss(rec["val"])
            gate[v][str(lr)] = float(g.get("tail_improvement", float("nan")))
            print(f"{v} lr {lr:g}: criterion {results[v][str(lr)]:.4f}, tail improvement "
                  f"{100 * gate[v][str(lr)]:.2f} % ({seconds[v][str(lr)]:.1f} CPU-s)"
                  + (f", ODE err {cnf_ode[str(lr)]}" if v == "cnf" else ""), flush=True)
    return {"scale": scale, "seed": seed, "target": name, "grid": tp["lr_grid"], "steps": tp["steps"],
            "criterion": f"arbg/flow: mean validation NLL over the last {N_LAST} evaluations; cnf: validation NLL "
                         f"of the returned model on {N_NLL_CNF} validation points (ODE solve)",
            "end_val_loss": results, "tail_improvement": gate, "cnf_end_fm_loss": cnf_fm,
            "cnf_ode_logq_err_by_steps": cnf_ode, "train_cpu_seconds": seconds, "chosen": choose(results)}


def merge(parts: list[dict]) -> dict:
    """One sweep record from parts over disjoint (variant, rate) cells of the same grid and data."""
    out = {k: parts[0][k] for k in ("scale", "seed", "target", "grid", "steps", "criterion")}
    for key in ("end_val_loss", "tail_improvement", "train_cpu_seconds"):
        out[key] = {}
        for part in parts:
            for v, cells in part[key].items():
                out[key].setdefault(v, {}).update(cells)
    for key in ("cnf_end_fm_loss", "cnf_ode_logq_err_by_steps"):
        out[key] = {k: val for part in parts for k, val in part[key].items()}
    out["end_val_loss"] = {v: out["end_val_loss"][v] for v in sorted(out["end_val_loss"])}
    out["chosen"] = choose(out["end_val_loss"])
    return out


if __name__ == "__main__":
    # python -m reprozoo.methods.arbg.lr_sweep smoke                  the whole grid, one process
    # python -m reprozoo.methods.arbg.lr_sweep smoke part V LR[,LR] CACHE OUT   one part
    # python -m reprozoo.methods.arbg.lr_sweep smoke merge PART.json ...      join the parts
    scale = sys.argv[1] if len(sys.argv) > 1 else "smoke"
    path = HERE / f"lr_sweep_{scale}.json"
    if len(sys.argv) > 2 and sys.argv[2] == "part":
        v, lrs, cache, dest = sys.argv[3], [float(x) for x in sys.argv[4].split(",")], sys.argv[5], sys.argv[6]
        Path(dest).write_text(json.dumps(sweep(scale, variants=[v], lrs=lrs, data_cache=cache), indent=1) + "\n")
        sys.exit(0)
    if len(sys.argv) > 2 and sys.argv[2] == "merge":
        out = merge([json.loads(Path(f).read_text()) for f in sys.argv[3:]])
    else:
        out = sweep(scale)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"chosen: {out['chosen']} -> {path}")
