"""GFFMERGE: cost of the closed-form merge against the cost of joint training, same process.

Two SchNet models (theta_0 plus different perturbations; cost does not depend on the values) on
EMT frames made here (Cu bulk 108 atoms periodic, Pt cluster 55 atoms). Interleaved, median of
REPEATS: wall and CPU seconds of one merge (merged-model inputs, teacher inputs, and merged-model
inputs with the force-aware derivative rows of the gffmerge_force extension) for 4 ... 32
unlabelled frames per system, and of one joint training step (energy/force loss, backward, Adam;
one batch of 4 frames per system). Reports the merge cost in joint steps and the speedup against a
joint budget of JOINT_EPOCHS epochs over 32 frames per system (the smoke setting), for two widths.

Writes benchmarks/results/gffmerge.json. ``python -m benchmarks gffmerge``.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np
from benchmarks import save_report

N_MERGE = [4, 8, 16, 32]
WIDTHS = [32, 64]
REPEATS = 3
JOINT_EPOCHS, TRAIN_FRAMES, BATCH = 24, 32, 4


def _timed(fn):
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def main() -> dict:
    import torch

    from reprozoo.blocks.atomistic import AtomsData, SchNet, fit_energy_scale, loss_terms, make_emt_frames
    from reprozoo.methods.gffmerge.merge import gffmerge
    from reprozoo.methods.gffmerge.multitask import tie, unique_parameters

    torch.set_num_threads(1)
    cutoff = 4.0
    datas = [AtomsData(make_emt_frames("cu_bulk", n_frames=max(N_MERGE), rattle=0.1, seed=1, size=3), cutoff),
             AtomsData(make_emt_frames("pt_cluster", n_frames=max(N_MERGE), rattle=0.1, seed=2, size=2), cutoff)]
    for d in datas:
        d.precompute()
    report = {"n_merge": N_MERGE, "widths": WIDTHS, "repeats": REPEATS, "threads": 1,
              "joint_budget": {"epochs": JOINT_EPOCHS, "frames_per_system": TRAIN_FRAMES, "batch": BATCH},
              "results": {}}
    for width in WIDTHS:
        torch.manual_seed(0)
        init = SchNet(n_features=width, n_interactions=2, n_rbf=16, cutoff=cutoff)
        teachers = []
        g = torch.Generator().manual_seed(1)
        for d in datas:
            m = copy.deepcopy(init)
            fit_energy_scale(m, d)
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(0.3 * p.abs().mean() * torch.randn(p.shape, generator=g))
            teachers.append(m.eval())
        joint = [copy.deepcopy(t) for t in teachers]
        tie(joint)
        opt = torch.optim.Adam(unique_parameters(joint), lr=1e-3)
        batches = [d.collate(range(BATCH), dtype=torch.float32) for d in datas]

        def joint_step():
            loss = sum(loss_terms(m, b, 1.0, 10.0)[0] for m, b in zip(joint, batches)) / len(joint)
            opt.zero_grad()
            loss.backward()
            opt.step()

        res = {"joint_step_s": [], "joint_step_cpu_s": []}
        modes = {"sequential": {"inputs": "sequential"}, "teacher": {"inputs": "teacher"},
                 "force": {"inputs": "sequential", "derivatives": 1.0}}
        for mode in modes:
            res[mode] = {"wall_s": [], "cpu_s": []}
        gffmerge(teachers, [[d.collate([0], dtype=torch.float64)] for d in datas], derivatives=1.0)  # warm-up
        joint_step()  # warm-up
        for n in N_MERGE:
            mb = [[d.collate(range(i, min(i + 8, n)), dtype=torch.float64) for i in range(0, n, 8)] for d in datas]
            runs = {m: [] for m in (*modes, "joint")}
            for _ in range(REPEATS):
                for mode, kw in modes.items():
                    runs[mode].append(_timed(lambda: gffmerge(teachers, mb, ridge=1e-3, **kw)))
                runs["joint"].append(_timed(joint_step))
            for mode in modes:
                res[mode]["wall_s"].append(float(np.median([r[0] for r in runs[mode]])))
                res[mode]["cpu_s"].append(float(np.median([r[1] for r in runs[mode]])))
            res["joint_step_s"].append(float(np.median([r[0] for r in runs["joint"]])))
            res["joint_step_cpu_s"].append(float(np.median([r[1] for r in runs["joint"]])))
        steps = JOINT_EPOCHS * int(np.ceil(TRAIN_FRAMES / BATCH))
        step_cpu = float(np.median(res["joint_step_cpu_s"]))
        res["joint_budget_steps"] = steps
        res["joint_budget_cpu_s"] = steps * step_cpu
        res["speedup_cpu_sequential"] = [round(steps * step_cpu / c, 2) for c in res["sequential"]["cpu_s"]]
        res["merge_in_joint_steps_sequential"] = [round(c / step_cpu, 2) for c in res["sequential"]["cpu_s"]]
        res["speedup_cpu_force"] = [round(steps * step_cpu / c, 2) for c in res["force"]["cpu_s"]]
        report["results"][f"width{width}"] = res
        print(f"width {width}: joint step {1e3 * step_cpu:.0f} ms CPU, budget {steps} steps = "
              f"{steps * step_cpu:.1f} s CPU", flush=True)
        for i, n in enumerate(N_MERGE):
            print(f"  {n:3d} frames/system: merge {1e3 * res['sequential']['cpu_s'][i]:.0f} ms CPU "
                  f"(teacher inputs {1e3 * res['teacher']['cpu_s'][i]:.0f} ms, "
                  f"force-aware {1e3 * res['force']['cpu_s'][i]:.0f} ms) = "
                  f"{res['merge_in_joint_steps_sequential'][i]} joint steps; "
                  f"speedup vs joint budget {res['speedup_cpu_sequential'][i]}x", flush=True)
    return save_report("gffmerge", report)


if __name__ == "__main__":
    main()
