"""Choose each model's learning rate once, on validation, on a pilot seed that no claim reads (round 6).

For every (dataset, variant) that a config trains and every rate of its grid (``fit.lr_grid``, with
``fit.per_dataset.<ds>`` over it), the model is fitted by the platform's rule at that one rate to its
plateau, rate drop and second plateau (``blocks.fitting.fit_to_plateau``, exactly the fit the smoke
runs) on the pilot seed's data, at every (lookback, horizon) of the dataset; the rate with the lowest
best validation MSE, averaged over the dataset's configs, is the variant's rate on that dataset (a fit
the gate's tail test would reject is marked in the table, not excluded). The
same procedure for every model. Test data are never read. The table it prints is the config's ``lr``
table (read through ``blocks.rate_table.fit_with_table_rate``); the grid stays in the config.

    nice -n 15 .venv/bin/python -m reprozoo.methods.prime_attention.pilot_rates --scale smoke --seed 100 \\
        [--datasets syn nopair macro] [--variants prime ...] [--out rates.json] [--rows saved.json|run.log ...]
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


def pilot(p: dict, seed: int, datasets, variants=None, data_folder=None, log=print, rates=None,
          lookbacks=None) -> list[dict]:
    """Fit every (dataset, variant, rate of the grid, config); ``rates``: only these rates of the grid (to
    finish a pilot in parts, e.g. after a rate is already out because one of its fits failed the gate)."""
    import torch

    torch.set_num_threads(1)
    rows = []
    for ds in datasets:
        rng_of = lambda off: np.random.default_rng(seed * 1_000_003 + off)  # noqa: E731 (ctx.rng)
        if ds == "macro":
            tasks = M.macro_tasks(p, data_folder)
        else:
            tasks, _, _ = M.synthetic_tasks(p, rng_of, ds)
        only = p["configs"][ds].get("variants") or [v for v in M.VARIANTS if v != "standard_wide"]
        for variant in only:
            if variants and variant not in variants:
                continue
            fp = {k: v for k, v in p["fit"].items() if k != "per_dataset"}
            fp.update((p["fit"].get("per_dataset") or {}).get(ds) or {})
            for lr in [r for r in fp["lr_grid"] if rates is None or float(r) in rates]:
                for (L, H) in sorted(k for k in tasks if lookbacks is None or k[0] in lookbacks):
                    t0 = time.process_time()
                    f = dict(fp, lr_grid=[float(lr)])
                    rec = M.fit_and_score(tasks[(L, H)], variant, p["model"], f, seed * 7919 + L * 31 + H,
                                          f"{ds}_L{L}_H{H}", progress=lambda *a: None,
                                          norm=M.window_norm(p["model"], ds))
                    from ...claims import tail_fit
                    row = {"ds": ds, "variant": variant, "lr": float(lr), "L": L, "H": H,
                           "best_val": float(np.min(rec["vals"])), "steps": int(rec["stop"]),
                           "plateau": bool(rec["plateau"]), "drop_gain": rec["drop_gain"],
                           "cpu_s": time.process_time() - t0}
                    try:
                        row["tail"] = float(tail_fit(rec["steps"], rec["vals"], "min")["improvement"])
                    except Exception:  # noqa: BLE001 (the number is a note, the gate is the platform's)
                        row["tail"] = None
                    rows.append(row)
                    log(json.dumps(row))
    return rows


def choose(rows: list[dict], grids: dict) -> tuple[dict, list[str]]:
    """{ds: {variant: rate}} (lowest mean best validation MSE over the dataset's configs) and a markdown table."""
    from ...blocks.rate_table import grid_edge

    table, lines = {}, ["| dataset | variant | " + "mean best val. MSE per rate | chosen | edge |", "|---|---|---|---|---|"]
    keys = sorted({(r["ds"], r["variant"]) for r in rows}, key=lambda k: (k[0], M.VARIANTS.index(k[1])))
    for ds, v in keys:
        mine = [r for r in rows if (r["ds"], r["variant"]) == (ds, v)]
        rates = sorted({r["lr"] for r in mine})
        score = {lr: float(np.mean([r["best_val"] for r in mine if r["lr"] == lr])) for lr in rates}
        # the lowest mean best validation MSE; a fit whose tail the convergence gate would reject (above its 2 %,
        # e.g. one cut at max_steps while still falling) is marked * in the table, not excluded: the smoke's gate
        # says whether the chosen rate's fits converge on the claim seeds
        done = {lr: all(r["tail"] is not None and r["tail"] <= GATE_TOL for r in mine if r["lr"] == lr) for lr in rates}
        best = min(rates, key=score.get)
        table.setdefault(ds, {})[v] = best
        lines.append(f"| {ds} | {v} | " + ", ".join(f"{lr:g}: {s:.4f}{'' if done[lr] else '*'}" for lr, s in score.items())
                     + f" | {best:g} | {grid_edge(best, grids[ds]) or '-'} |")
    return table, lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--datasets", nargs="*", default=None)
    ap.add_argument("--variants", nargs="*", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rates", nargs="*", type=float, default=None, help="only these rates of the grid")
    ap.add_argument("--lookbacks", nargs="*", type=int, default=None, help="only these lookbacks")
    ap.add_argument("--rows", nargs="*", default=None, help="choose from saved rows (json files) instead of fitting")
    a = ap.parse_args(argv)
    p = yaml.safe_load(open(HERE / "configs" / f"{a.scale}.yaml"))
    dss = a.datasets or p["datasets"]
    if a.rows:
        rows = []  # a saved --out file (a JSON list) or a log (one JSON row a line)
        for f in a.rows:
            text = Path(f).read_text()
            rows += json.loads(text) if text.lstrip().startswith("[") else \
                [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    else:
        rows = pilot(p, a.seed, dss, a.variants, None, rates=set(a.rates) if a.rates else None,
                     lookbacks=set(a.lookbacks) if a.lookbacks else None)  # macrodata: the CSV bundled in statsmodels (the same table)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    grids = {ds: ((p["fit"].get("per_dataset") or {}).get(ds) or {}).get("lr_grid", p["fit"]["lr_grid"]) for ds in dss}
    table, lines = choose(rows, grids)
    print("\n".join(lines))
    print(yaml.safe_dump({"lr": table}, default_flow_style=None))


if __name__ == "__main__":
    main()
