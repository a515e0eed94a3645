"""CEITNet: forward and training-step cost against the e3nn spherical-tensor baseline, same process.

Both networks at the smoke configuration's sizes (configs/smoke.yaml, untrained: the cost does not
depend on the weights), orders 2, 3 and 4, on periodic random fcc alloy cells made here (4-atom
conventional cells and 32-atom 2x2x2 supercells, Cu/Ni/Au/Al, rattled 0.05 A; cutoff of the config).
Interleaved, median of REPEATS, one thread: forward (float32, no grad) ms per structure on a batch of
BATCH structures, and one training step (forward, Voigt MSE, backward, Adam) on a batch of 8.

Writes benchmarks/results/ceitnet.json. ``python -m benchmarks ceitnet``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from benchmarks import save_report

REPEATS = 5
BATCH = 32
ORDERS = (2, 3, 4)


def _cells(n: int, repeat: int, seed: int):
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((repeat, repeat, repeat))
        a.numbers = rng.choice([13, 28, 29, 79], size=len(a))
        a.rattle(0.05, seed=seed * 1000 + k)
        out.append(a)
    return out


def main() -> dict:
    import torch
    import yaml

    from reprozoo.blocks.atomistic import AtomsData
    from reprozoo.blocks.cartesian import to_voigt
    from reprozoo.methods.ceitnet.method import build
    from reprozoo.methods.ceitnet.training import atoms_frames, mean_degree, model_args

    torch.set_num_threads(1)
    root = Path(__file__).resolve().parents[1]
    p = yaml.safe_load((root / "src/reprozoo/methods/ceitnet/configs/smoke.yaml").read_text())
    report = {"repeats": REPEATS, "batch": BATCH, "threads": 1, "cutoff": p["cutoff"], "models": p["models"],
              "results": {}}
    for repeat, label in ((1, "4 atoms"), (2, "32 atoms")):
        data = AtomsData(atoms_frames(_cells(BATCH, repeat, seed=repeat)), float(p["cutoff"]))
        deg = mean_degree(data, range(len(data)))
        fwd_batch = data.collate(range(BATCH), dtype=torch.float32)
        step_batch = data.collate(range(8), dtype=torch.float32)
        for order in ORDERS:
            models = {v: build(v, order, p, deg, 1.0) for v in ("ceitnet", "e3nn_baseline")}
            opts = {v: torch.optim.Adam(m.parameters(), lr=1e-3) for v, m in models.items()}

            def forward(v):
                with torch.no_grad():
                    models[v](*model_args(fwd_batch))

            def step(v):
                loss = (to_voigt(models[v](*model_args(step_batch))) ** 2).mean()
                opts[v].zero_grad()
                loss.backward()
                opts[v].step()

            times = {(v, k): [] for v in models for k in ("forward", "step")}
            for v in models:  # warm-up
                forward(v)
                step(v)
            for _ in range(REPEATS):
                for v in models:
                    for kind, fn in (("forward", forward), ("step", step)):
                        t0 = time.perf_counter()
                        fn(v)
                        times[(v, kind)].append(time.perf_counter() - t0)
            res = {v: {"params": models[v].param_count(),
                       "forward_ms_per_structure": 1e3 * float(np.median(times[(v, "forward")])) / BATCH,
                       "train_step_ms": 1e3 * float(np.median(times[(v, "step")]))} for v in models}
            res["forward_ratio_ceitnet_vs_e3nn"] = (res["ceitnet"]["forward_ms_per_structure"]
                                                    / res["e3nn_baseline"]["forward_ms_per_structure"])
            res["step_ratio_ceitnet_vs_e3nn"] = res["ceitnet"]["train_step_ms"] / res["e3nn_baseline"]["train_step_ms"]
            report["results"][f"{label}, order {order}"] = res
            print(f"{label:>8s} order {order}: forward ms/structure CEITNet "
                  f"{res['ceitnet']['forward_ms_per_structure']:.3f} vs e3nn "
                  f"{res['e3nn_baseline']['forward_ms_per_structure']:.3f} "
                  f"(ratio {res['forward_ratio_ceitnet_vs_e3nn']:.2f}); train step ms "
                  f"{res['ceitnet']['train_step_ms']:.1f} vs {res['e3nn_baseline']['train_step_ms']:.1f} "
                  f"(ratio {res['step_ratio_ceitnet_vs_e3nn']:.2f}); params {res['ceitnet']['params']} vs "
                  f"{res['e3nn_baseline']['params']}", flush=True)
    return save_report("ceitnet", report)


if __name__ == "__main__":
    main()
