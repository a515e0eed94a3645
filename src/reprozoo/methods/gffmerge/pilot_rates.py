"""Choose the fine-tune rate once, on seed 0's validation frames, for all three starts (config ``lr.finetune``).

The cold review of issue 24 (M3) found that piloting the grid in every fine-tune of every seed let one seed
(``gffmerge_seq_ft``, seed 2) choose the grid's bottom (3e-4) after 100-step pilots, which penalise a rate that
disturbs a good start: that one choice drove two verdicts. The platform's cheaper protocol
(``blocks.rate_table``; docs/verdicts.md) pilots the grid once, on one seed's validation data, and trains every
seed at the chosen rate with no pilots. Here the three fine-tunes (from the teacher-input merge, from the
merged-model-input merge and from the weight average) share ONE rate, so the comparison of starts is at the same
rate:

* the three starts are rebuilt from seed 0's saved specialists (``<shared>/specialist_pretrained_*.pt``, the
  pipeline's ``train_shared`` output) exactly as the pipeline builds them (``method.published_rule``,
  ``merge.gffmerge``, ``merge.weight_average``);
* every rate of ``--grid`` (default: the config's ``fit.lr_grid`` extended one step down, 1e-4) is run by the
  shared rule's own pilot (``multitask.fit_rule``: same start, same batches, the fine-tunes' seed) for
  ``--steps`` steps (default 300, three times the rule's 100-step pilots: about the steps a fine-tune needs to
  reach joint training's accuracy, so a rate that first disturbs a good start is not ruled out by its first
  100 steps), scored by the rule's pilot score (mean of the second half of the validation force MAE);
* the rate with the lowest mean over the three starts of score / that start's best score is the table's rate.

Test frames are never read. The specialists' and joint training's table rates are seed 0's choices of the
grid pilots in the pipeline (the last 3-seed smoke's ``lr_chosen_specialist*`` and ``lr_chosen_joint`` at seed 0,
interior rates of the grid), recorded in the config.

    nice -n 15 .venv/bin/python -m reprozoo.methods.gffmerge.pilot_rates [--shared results/smoke/gffmerge/_shared/seed0]
"""
from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).parent


def starts(p: dict, shared: Path, seed: int = 0) -> tuple[list, dict]:
    """(the seed's systems, {fine-tune variant: its starting models, one per system}), built from the saved specialists."""
    from . import method as M
    from .merge import backbone_state, gffmerge, weight_average, with_backbone

    systems = pickle.loads((shared / "systems.pkl").read_bytes())
    teachers = [M.load_model(p, shared / f"specialist_pretrained_{s['tag']}.pt") for s in systems]
    states = [backbone_state(t) for t in teachers]
    batches = M._merge_batches(p, systems)
    out = {"weight_avg_ft": weight_average(states)}
    for v, rule in (("gffmerge_ft", "published"), ("gffmerge_seq_ft", "seq")):
        out[v], _ = gffmerge(teachers, batches, seed=seed, **M.published_rule(p, rule))
    return systems, {v: [with_backbone(t, st) for t in teachers] for v, st in out.items()}


def pilot(p: dict, shared: Path, grid, steps: int, seed: int = 0, log=print) -> dict:
    import torch

    from . import method as M
    from .multitask import fit_rule, tie

    torch.set_num_threads(1)
    systems, models = starts(p, shared, seed)
    fit = {**M.fit_config(p, "finetune"), "lr_grid": [float(r) for r in grid], "pilot_steps": int(steps),
           "min_steps": int(steps), "max_steps": int(steps)}
    scores = {}
    for v, ms in models.items():
        c0 = time.process_time()
        _, rec = fit_rule(tie(ms), [s["train"] for s in systems], [s["val"] for s in systems], fit, seed * 100 + 50,
                          batch_size=int(p["train"]["batch_size"]), energy_weight=p["train"].get("energy_weight", 1.0),
                          force_weight=p["train"].get("force_weight", 10.0), label=v)
        scores[v] = {float(r): float(s) for r, s in rec["pilot_best"].items()}
        log(f"{v}: " + ", ".join(f"{r:g}: {s:.2f}" for r, s in scores[v].items())
            + f" meV/A ({time.process_time() - c0:.1f} CPU-s)")
    rel = {float(r): float(np.mean([scores[v][float(r)] / min(scores[v].values()) for v in scores])) for r in grid}
    best = min(rel, key=rel.get)
    log("mean score / best score over the three starts: " + ", ".join(f"{r:g}: {x:.3f}" for r, x in rel.items()))
    log(f"fine-tune rate for all three starts: {best:g}")
    return {"scores": scores, "relative": rel, "rate": best, "steps": int(steps)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", default="results/smoke/gffmerge/_shared/seed0")
    ap.add_argument("--config", default=str(HERE / "configs" / "smoke.yaml"))
    ap.add_argument("--grid", type=float, nargs="*", default=None)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    p = yaml.safe_load(Path(a.config).read_text())
    grid = a.grid or sorted({1e-4, *[float(r) for r in p["fit"]["lr_grid"]]})
    c0 = time.process_time()
    res = pilot(p, Path(a.shared), grid, a.steps)
    res["cpu_seconds"] = time.process_time() - c0
    print(f"total {res['cpu_seconds']:.1f} CPU-s")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
