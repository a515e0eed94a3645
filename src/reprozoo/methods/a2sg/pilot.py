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
            out.append({"variant": variant, "key": key, "value": None if v is None else float(v), "lr": float(lr),
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
