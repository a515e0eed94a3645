"""Stage 1's rate table, chosen once on validation (blocks.rate_table's protocol): each rate of
``fit1.lr_grid`` run in full by the shared rule (blocks.fitting.fit_to_plateau, the config's ``fit1``)
on one seed's training data, scored on the validation records only; prints one JSON line per
(variant, rate) with the best validation evidence reward (the one the table ranks by), its step, the
stop, the validation cross-entropy there and at its minimum, and the CPU seconds. Needs the seed's cached data (a smoke run of that seed first)::

    python -m reprozoo.methods.ecg_r1.pilot_stage1 ecg_r1,rl_no_dropout '{"lr_grid": [0.002, 0.004]}'

The optional JSON overrides ``fit1`` keys (the round's pilots ran parts of the grid at a time).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(variants: list[str], override: dict, seed: int = 0) -> None:
    import numpy as np
    import torch
    import yaml

    from ...blocks.fitting import fit_to_plateau
    from . import method as M
    from .model import ReportModel

    torch.set_num_threads(1)
    here = Path(__file__).parent
    p = yaml.safe_load((here / "configs" / "smoke.yaml").read_text())
    fit1 = {**p["fit1"], **override}
    z = np.load(Path("results/smoke/ecg_r1/_shared") / f"seed{seed}" / "data.npz")
    tr = {k: z[f"train_{k}"] for k in ("sig", "img", "report")}
    va = {k: z[f"val_{k}"] for k in ("sig", "img", "report")}
    for variant in variants:
        setup, drop, _ = M.SETUP[variant]
        train_loss, val_loss = M.stage_losses(tr, va, setup, drop, "sft", p, p["batch"])
        for lr in fit1["lr_grid"]:
            t = time.process_time()

            def build(gen):
                torch.manual_seed(seed)
                return ReportModel(p["width"])
            cfg = {**fit1, "lr_grid": [lr], "select": "neg_reward", "stop_on": ["neg_reward"]}
            _, r = fit_to_plateau(build, train_loss, val_loss, cfg, seed, label=f"{variant} {lr:g}",
                                  progress=lambda *a: None)
            v = np.asarray(r["vals"])
            i = int(v.argmin())
            ce = np.asarray(r["curves"]["ce"])
            print(json.dumps({"variant": variant, "lr": lr, "best_reward": round(-float(v[i]), 4),
                              "best_step": r["steps"][i], "stop": r["stop"], "plateau": bool(r["plateau"]),
                              "drop_step": r["drop_step"], "drop_gain": r["drop_gain"],
                              "ce_at_best": round(float(ce[i]), 3), "ce_min": round(float(ce.min()), 3),
                              "ce_min_step": r["steps"][int(ce.argmin())],
                              "cpu_s": round(time.process_time() - t, 1)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
