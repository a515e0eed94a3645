"""Choose each network's learning rate once, on validation, by full fits over the grid (round 4).

For every variant that trains (``ceitnet``, ``e3nn_baseline`` and the control's ``e3nn_baseline_b``) and every
rate of ``fit.lr_grid``, the order-4 network is fitted by the platform's rule at that one rate, exactly as the
smoke job fits it (``training.fit``: the rule's plateau, 10x drop and second plateau, best-validation EMA
weights; seed 0's initial weights and minibatches, ``method.SEED_OFFSET`` included), on seed 0's training cells,
scored on the 60 validation cells (``method.validation_cells``). The rate with the lowest best validation Fnorm
is the variant's rate; a fit whose tail the convergence gate would reject is marked ``*``, not excluded. The
same procedure, grid and score for every network. Test cells are never read. The printed table is the smoke
config's ``lr`` table (read by ``method.train`` through ``blocks.rate_table.fit_with_table_rate``); the grid stays
in the config, and an edge choice is recorded (``lr_edge_o4``).

    nice -n 15 .venv/bin/python -m reprozoo.methods.ceitnet.pilot_rates [--variants ceitnet ...] [--rates 0.01 ...]
        [--out rows.json] [--rows saved.json ...]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml

from . import method as M

HERE = Path(__file__).parent
GATE_TOL = 0.02  # the convergence gate's tolerance on the tail improvement (reprozoo.claims.plateau)
VARIANTS = ("ceitnet", "e3nn_baseline", "e3nn_baseline_b")


def pilot(p: dict, data_dir: Path, seed: int = 0, variants=VARIANTS, rates=None, log=print) -> list[dict]:
    import torch

    from ...blocks.atomistic import AtomsData
    from ...claims import tail_fit
    from ...data.crystals.common import load
    from .training import crystal_frames, fit, mean_degree, target_scale

    torch.set_num_threads(1)
    ds = load(Path(data_dir))
    data = AtomsData(crystal_frames(ds.structures), float(p["cutoff"]))
    tr, va = ds.split_index("train"), ds.split_index("val")
    _, ev4, _ = M.eval_cells(ds)
    va4, _ = M.validation_cells(ds, va, ev4, int(p.get("n_val", 0)))  # the test cells are never touched
    order = 4
    targets = ds.targets(order)
    avg_deg, scale = mean_degree(data, tr), target_scale(targets[tr])
    rows = []
    for v in variants:
        fp = M.fit_config({k: val for k, val in p["fit"].items()}, order, v)
        for lr in [float(r) for r in fp["lr_grid"] if rates is None or float(r) in rates]:
            t0 = time.process_time()
            try:
                _, hist = fit(lambda v=v: M.build(v, order, p, avg_deg, scale), data, tr, va4, targets,
                              dict(fp, lr_grid=[lr]), seed * 100 + order + M.SEED_OFFSET.get(v, 0))
            except Exception as exc:  # noqa: BLE001 (a diverged fit: recorded, scores inf)
                row = {"variant": v, "lr": lr, "best_val": None, "error": repr(exc)[:200], "tail": None,
                       "cpu_s": time.process_time() - t0}
                rows.append(row)
                log(json.dumps(row))
                continue
            vals = np.asarray(hist["val_fnorm"], float)
            row = {"variant": v, "lr": lr, "best_val": float(np.nanmin(vals)) if np.isfinite(vals).any() else None,
                   "best_epoch": hist["best_epoch"], "drop_epoch": hist["drop_epoch"],
                   "stopped_epoch": hist["stopped_epoch"], "drop_gain": hist["drop_gain"],
                   "plateau": hist["plateau"], "cpu_s": time.process_time() - t0}
            try:
                row["tail"] = float(tail_fit(hist["epoch"], hist["val_fnorm"], "min")["improvement"])
            except Exception:  # noqa: BLE001 (a note only; the gate is the platform's)
                row["tail"] = None
            rows.append(row)
            log(json.dumps(row))
    return rows


def choose(rows: list[dict], grid) -> tuple[dict, list[str]]:
    """{variant: {"o4": rate}} (lowest best validation Fnorm of the full fits; a failed fit scores inf) and a
    markdown table."""
    from ...blocks.rate_table import grid_edge

    table, lines = {}, ["| variant | best validation Fnorm (GPa) per rate | chosen | edge |", "|---|---|---|---|"]
    for v in [v for v in VARIANTS if any(r["variant"] == v for r in rows)]:
        mine = {r["lr"]: r for r in rows if r["variant"] == v}
        score = {lr: (r["best_val"] if r["best_val"] is not None else float("inf")) for lr, r in sorted(mine.items())}
        best = min(score, key=score.get)
        table[v] = {"o4": best}
        ok = {lr: r["tail"] is not None and r["tail"] <= GATE_TOL for lr, r in mine.items()}
        lines.append(f"| {v} | " + ", ".join(f"{lr:g}: {s:.2f}{'' if ok[lr] else '*'}" for lr, s in score.items())
                     + f" | {best:g} | {grid_edge(best, grid) or '-'} |")
    return table, lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None,
                    help="the dataset folder (default results/data/crystals_emt_elastic/<scale>)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--rates", nargs="*", type=float, default=None, help="only these rates of the grid")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows", nargs="*", default=None, help="choose from saved rows (json lists or logs) instead")
    a = ap.parse_args(argv)
    p = yaml.safe_load(open(HERE / "configs" / f"{a.scale}.yaml"))
    if a.rows:
        rows = []
        for f in a.rows:
            text = Path(f).read_text()
            rows += json.loads(text) if text.lstrip().startswith("[") else \
                [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    else:
        data = a.data or f"results/data/{M.DATASET}/{a.scale}"
        rows = pilot(p, Path(data), a.seed, a.variants, set(a.rates) if a.rates else None)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    table, lines = choose(rows, p["fit"]["lr_grid"])
    print("\n".join(lines))
    print(yaml.safe_dump({"lr": table}, default_flow_style=None))


if __name__ == "__main__":
    main()
