"""Stage 2's and stage 3's rate tables (``lr2``, ``lr3``), chosen once on validation set B
(blocks.rate_table's protocol, as ``pilot_stage1`` does for stage 1): each rate of ``fit2.lr_grid``
(SFT continued on the stage-2 pool) or ``fit3.lr_grid`` (GRPO on the pool, from stage 2's model at
its ``lr2`` rate) run in full by the shared rule on one seed, scored on set B only; prints one JSON
line per (variant, stage, rate) with the shared rule's pilot score of the whole run (``score``: what the
table ranks by, ``rule_score``), the best validation evidence reward and its step, the stop and the CPU
seconds. Needs the seed's cached data (a smoke run of that seed
first); stage 1 and stage 2 come from the seed's shared cache (trained there if absent)::

    python -m reprozoo.methods.ecg_r1.pilot_stage2 2 ecg_r1,rl_no_dropout '[0.001, 0.003]'
    python -m reprozoo.methods.ecg_r1.pilot_stage2 3 ecg_r1 '[0.001, 0.003]' '{"ecg_r1": 0.001}'

The optional last JSON is the ``lr2`` rate per variant for stage-3 pilots (default: the config's).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def rule_score(vals: list, fit: dict) -> float:
    """The shared rule's pilot score of a run (blocks.fitting.PlateauRun.pilot_score, ``fit.pilot_score``,
    default ``tail``: the mean of the second half of its validation points; ``best``: its best point), as
    a reward (higher is better). The table takes the rate that scores highest; the single best point
    (printed as ``best_reward``) is a noisy rate's lucky maximum and does not rank."""
    import numpy as np

    how = fit.get("pilot_score", "tail")
    if how == "tail":
        return -float(np.mean(vals[len(vals) // 2:]))
    if how == "best":
        return -float(min(vals[1:] or vals))
    raise ValueError(f"fit.pilot_score '{how}': expected one of best, tail")


def main(stage: int, variants: list[str], rates: list[float], lr2: dict | None = None, seed: int = 0) -> None:
    import torch
    import yaml

    from . import method as M

    torch.set_num_threads(1)
    here = Path(__file__).parent
    p = yaml.safe_load((here / "configs" / "smoke.yaml").read_text())
    if lr2:
        p["lr2"] = {**(p.get("lr2") or {}), **lr2}
    shared = Path("results/smoke/ecg_r1/_shared") / f"seed{seed}"
    split = M.load_splits(shared)
    quiet = lambda *a: None  # noqa: E731
    for variant in variants:
        t = time.process_time()
        model, _, _, key1 = M.run_stage1(p, variant, seed, shared, split, quiet)
        if stage == 3:
            fit2, _ = M.later_fit(p, variant, 2)
            model, _ = M.run_stage2(p, variant, seed, shared, split, model, key1, fit2, quiet)
        base = time.process_time() - t
        for lr in rates:
            t = time.process_time()
            fit, _ = M.later_fit({**p, f"lr{stage}": {variant: lr}}, variant, stage)
            if stage == 2:
                import copy

                from ...blocks.fitting import fit_to_plateau
                setup, drop, _ = M.SETUP[variant]
                tl, vl = M.stage_losses(split["pool"], split["valb"], setup, drop, "sft", p, p["rl_batch"])
                _, r = fit_to_plateau(lambda gen: copy.deepcopy(model), tl, vl, fit, seed, progress=quiet)
            else:
                _, r, _ = M.run_stage3(p, variant, seed, split, model, fit, quiet)
            vals = [-v for v in r["vals"]]
            kept = [i for i, x in enumerate(r["steps"]) if x >= fit["keep_from"]]
            i = max(kept, key=lambda j: vals[j])
            print(json.dumps({"variant": variant, "stage": stage, "lr": lr, "start_reward": round(vals[0], 4),
                              "score": round(rule_score(r["vals"], fit), 4),
                              "best_reward": round(vals[i], 4), "best_step": r["steps"][i], "stop": r["stop"],
                              "plateau": bool(r["plateau"]), "cpu_s": round(time.process_time() - t, 1),
                              "cpu_s_before": round(base, 1)}), flush=True)
            base = 0.0


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2].split(","), [float(x) for x in json.loads(sys.argv[3])],
         json.loads(sys.argv[4]) if len(sys.argv) > 4 else None)
