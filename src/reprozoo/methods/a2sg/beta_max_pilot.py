"""One-seed pilot, not a claim: how the adaptive arms depend on the top of the β grid (``beta_max``),
a range the paper does not publish. Trains a variant exactly as the pipeline does (smoke config,
seed 0, the shared rule) with ``surrogates.<variant>.beta_max`` set, and prints one JSON line per run.

    nice -n 15 .venv/bin/python -m reprozoo.methods.a2sg.beta_max_pilot a2sg 0.7071 st_asg_tri 1.0 ...

Results go to ``results/smoke/a2sg/partial/beta_max_pilot/`` (``runs.jsonl``)."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import yaml

KEYS = ("lr_chosen", "lr_edge", "steps_trained", "plateau_reached", "val_loss_tail_improvement", "sharp",
        "grad_cos", "cv", "tgc", "sgv", "beta_edge_frac", "beta_top_frac", "beta_bottom_frac", "cpu_seconds")


def main(argv: list[str]) -> None:
    from ...runtime import RunContext
    from . import method as M

    params = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    root = Path("results/smoke/a2sg/partial/beta_max_pilot")
    shared = root / "_shared"
    shared.mkdir(parents=True, exist_ok=True)
    if not (shared / "mnist1d.npz").exists():
        M.train_shared(RunContext("a2sg", "_shared", 0, "smoke", params, {}, shared))
    for variant, top in zip(argv[0::2], argv[1::2]):
        p = copy.deepcopy(params)
        p["surrogates"][variant]["beta_max"] = float(top)
        out = root / f"{variant}_{top}"
        out.mkdir(exist_ok=True)
        ctx = RunContext("a2sg", variant, 0, "smoke", p, {}, out, shared_dir=shared)
        M.train(ctx)
        rec = {"variant": variant, "beta_max": float(top)}
        rec.update({k: ctx.metrics.scalars[k] for k in KEYS if k in ctx.metrics.scalars})
        for k in ("acc", "sops", "energy_pj"):
            u = ctx.metrics.unit_values[k]
            rec[k] = sum(u) / len(u)
        print(json.dumps(rec), flush=True)
        with open(root / "runs.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
