"""The one-seed validation pilot that chose the rates of ``configs/smoke.yaml`` (``lr_fixed``).

    nice -n 15 .venv/bin/python -m reprozoo.methods.ttfs.pilot [variant ...]

Seed ``pilot_seed`` (100: no claim reads it; the claim seeds are 0, 1, 2). For every data set a
variant trains on and every rate of ``pilot_grid`` (the rates of ``fit.lr_grid`` piloted: 3e-3, 1e-2,
3e-2; 1e-3 and 1e-1 lost every fit's pilot on seed 0 by 0.4-1.7 nats, README), the shared rule's pilot
(``blocks.fitting.fit_to_plateau`` with the whole grid and ``max_steps = pilot_steps``: every rate
trains ``pilot_steps`` from the same initial weights) is run and each rate scored as the rule scores
it (the mean of the second half of its validation losses, ``pilot_score: tail``); the lowest score
wins. Validation data only decide. Prints one JSON line per fit and appends them to
``results/smoke/ttfs/partial/pilot/runs.jsonl``."""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml


class _Sink:
    """Collects what fit_and_measure records (only the pilot scores are kept)."""

    def __init__(self):
        self.curves, self.scalars = {}, {}

    def scalar(self, k, v):
        self.scalars[k] = v

    def curve(self, k, x, y):
        self.curves[k] = (list(x), list(y))

    def units(self, k, v):
        pass


def main(argv: list[str]) -> None:
    import torch

    from . import method as M

    torch.set_num_threads(1)
    params = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    seed = int(params.get("pilot_seed", 100))
    params = copy.deepcopy(params)
    params.pop("lr_fixed", None)
    fit = params["fit"]
    grid = params.get("pilot_grid") or fit["lr_grid"]  # the rates piloted (a subset of fit.lr_grid)
    params["fit"] = {**fit, "lr_grid": grid, "max_steps": fit["pilot_steps"], "min_steps": fit["pilot_steps"], "lr_drop": 0}
    root = Path("results/smoke/ttfs/partial/pilot")
    root.mkdir(parents=True, exist_ok=True)
    data = {name: M._load_dataset(name, params, np.random.default_rng(seed * 1_000_003 + i))
            for i, name in enumerate(params["datasets"])}
    for variant in argv or list(M.VARIANTS):
        only = M.VARIANTS[variant].get("datasets")
        for name in params["datasets"]:
            if only is not None and name not in only:
                continue
            sink = _Sink()
            t0 = time.process_time()
            M.fit_and_measure(name, data[name], M.VARIANTS[variant], params, seed, sink, lambda s: None,
                              variant=variant)
            lg, sc = sink.curves[f"lr_pilot_{name}"]
            scores = {f"{10 ** x:.0e}": float(s) for x, s in zip(lg, sc)}
            best = min(scores, key=scores.get)
            row = {"variant": variant, "dataset": name, "seed": seed, "scores": scores, "chosen": best,
                   "cpu_s": time.process_time() - t0}
            with open(root / "runs.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
