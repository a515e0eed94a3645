"""The one-seed validation pilot that chose the rates, widths and β ranges written into
``configs/smoke.yaml`` (``lr:`` and ``surrogates:``); rerun it to check them:

    nice -n 15 .venv/bin/python -m reprozoo.methods.a2sg.pilot a2sg st_asg_tri tri_width_best ...

For each variant named, every (sweep value, rate) pair of ``pilot.sweep[variant]`` x ``fit.lr_grid``
is trained for ``fit.pilot_steps`` on seed ``pilot.seed`` exactly as the shared rule pilots its
rates (the pipeline's build, batches and validation; ``method._fit_one``) and scored by the mean of
the second half of its validation losses (the rule's ``pilot_score: tail``); the lowest score wins.
The sweep of a fixed-window row sets its ``beta`` (the best fixed width), of an adaptive or placebo
row its ``beta_max`` (the top of the search's grid, which the paper does not publish); a variant with
no sweep pilots the rates only. Validation data only: the test set is never read.

``--history a2sg`` instead trains A2SG's whole fit on the pilot seed (the config's settings and table
rate, the shared rule) and prints how often its search chose each grid value per layer and step: the
pool of the width-matched placebo (``surrogates.STMatched``, ``pool_counts`` in the config).

Prints one JSON line per pilot and a table per variant; appends the lines to
``results/smoke/a2sg/partial/pilot/runs.jsonl``."""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml


def pilots(variant: str, params: dict, ctx_factory) -> list[dict]:
    from . import method as M

    fit = params["fit"]
    sweep = (params.get("pilot", {}).get("sweep") or {}).get(variant)
    key, values = (sweep["key"], sweep["values"]) if sweep else (None, [None])
    pilot = {**fit, "max_steps": fit["pilot_steps"], "min_steps": fit["pilot_steps"], "lr_drop": 0}
    out = []
    for v in values:
        vcfg = dict(params["surrogates"][variant])
        vcfg.pop("width_grid", None)
        if key is not None:
            vcfg[key] = float(v)
        for lr in fit["lr_grid"]:
            ctx = ctx_factory(variant)
            t0 = time.process_time()
            _, rec = M._fit_one(ctx, ctx.tensors, vcfg, pilot, label=f"pilot {key}={v} lr={lr:g}", lr_grid=[lr])
            out.append({"variant": variant, "seed": int(ctx.seed), "key": key, "value": None if v is None else float(v), "lr": float(lr),
                        "score": float(np.mean(rec["vals"][len(rec["vals"]) // 2:])),
                        "cpu_s": time.process_time() - t0})
            print(json.dumps(out[-1]), flush=True)
    return out


def table(rows: list[dict]) -> str:
    """Markdown: one row per sweep value, one column per rate, the winner in bold."""
    best = min(rows, key=lambda r: r["score"])
    rates = sorted({r["lr"] for r in rows})
    values = sorted({r["value"] for r in rows}, key=lambda v: -1 if v is None else v)
    key = rows[0]["key"] or "-"
    lines = [f"| {rows[0]['variant']}: {key} | " + " | ".join(f"lr {r:g}" for r in rates) + " |",
             "|---|" + "---|" * len(rates)]
    for v in values:
        cells = []
        for r in rates:
            row = next(x for x in rows if x["value"] == v and x["lr"] == r)
            c = f"{row['score']:.4f}"
            cells.append(f"**{c}**" if row is best else c)
        lines.append(f"| {'-' if v is None else f'{v:.3g}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    import torch

    from ...runtime import RunContext
    from . import method as M

    torch.set_num_threads(1)
    params = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    seed = int(params.get("pilot", {}).get("seed", 0))
    root = Path("results/smoke/a2sg/partial/pilot")
    shared = root / f"_shared_seed{seed}"
    shared.mkdir(parents=True, exist_ok=True)
    if not (shared / "mnist1d.npz").exists():
        M.train_shared(RunContext("a2sg", "_shared", seed, "smoke", params, {}, shared))
    with np.load(shared / "mnist1d.npz") as arrays:
        tensors = {k: torch.from_numpy(arrays[k]) for k in arrays.files}

    def ctx_factory(variant):
        ctx = RunContext("a2sg", variant, seed, "smoke", copy.deepcopy(params), {}, root, shared_dir=shared)
        ctx.tensors = tensors
        return ctx

    if argv[:1] == ["--history"]:
        # the width-matched placebo's pool: A2SG's own choices over one whole fit on the pilot seed, at
        # the config's settings and table rate, under the shared rule (validation only, as the pilots)
        from ...blocks.rate_table import fit_with_table_rate
        from .surrogates import pool_counts

        variant = argv[1] if len(argv) > 1 else "a2sg"
        ctx = ctx_factory(variant)
        fit_cfg, _ = fit_with_table_rate(params["fit"], params.get("lr"), variant, required=True)
        t0 = time.process_time()
        model, rec = M._fit_one(ctx, ctx.tensors, dict(params["surrogates"][variant]), fit_cfg, label=f"history {variant}")
        counts = pool_counts(model.sur.history, model.sur.grid.tolist())
        row = {"history": variant, "seed": seed, "lr": float(rec["lr"]), "steps": int(rec["stop"]),
               "searches": len(model.sur.history), "grid": [float(b) for b in model.sur.grid],
               "pool_counts": counts, "mean_beta": [[float(np.mean([w[l][t] for _, w in model.sur.history]))
                                                     for t in range(len(counts[0]))] for l in range(len(counts))],
               "cpu_s": time.process_time() - t0}
        with open(root / "runs.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return
    for variant in argv:
        rows = pilots(variant, params, ctx_factory)
        with open(root / "runs.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        best = min(rows, key=lambda r: r["score"])
        print(table(rows), flush=True)
        print(f"{variant}: chosen {best['key']}={best['value']} lr={best['lr']:g} "
              f"({sum(r['cpu_s'] for r in rows):.1f} CPU-s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
