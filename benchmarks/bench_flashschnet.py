"""FlashSchNet vs baseline SchNet: peak memory and Langevin-MD throughput across system sizes and
replica counts, both implementations measured in the same run (same process, same weights,
interleaved timing rounds).

    .venv/bin/python benchmarks/bench_flashschnet.py --quick
    .venv/bin/python benchmarks/bench_flashschnet.py --beads 100 269 538 --replicas 1 4 16 32 --out bench.json

Peak memory: torch CPU allocator bytes (every allocation/free recorded by the autograd profiler,
replayed; see reprozoo/methods/flashschnet/measure.py) of one energy+force evaluation, plus the
persistent neighbour-list / CSR index bytes; on CUDA, torch.cuda.max_memory_allocated.
Throughput: BAOAB Langevin steps (prior + SchNet forces, Verlet neighbour list) x replicas / s,
median of interleaved rounds. Weights: a SchNet with perturbed random weights (speed and memory do
not depend on training) or ``--weights results/flashschnet/_shared/seed0/schnet.pt``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reprozoo.blocks.atomistic import SchNet  # noqa: E402
from reprozoo.methods.flashschnet.cgchain import (ChainPotential, compact_start, generate_frames,  # noqa: E402
                                                   make_chain)
from reprozoo.methods.flashschnet.md import Evaluator, peak_memory, throughput, tile_start  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--beads", type=int, nargs="+", default=[100, 269])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--interactions", type=int, default=2)
    ap.add_argument("--rbf", type=int, default=24)
    ap.add_argument("--cutoff", type=float, default=8.0)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--full-list", action="store_true", help="flash kernel over every directed edge (no pair symmetry)")
    ap.add_argument("--quantize", default=None, choices=[None, "float16", "bfloat16", "int16"])
    ap.add_argument("--steps", type=int, default=2, help="MD steps per timing round")
    ap.add_argument("--repeats", type=int, default=3, help="timing rounds (median kept)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--quick", action="store_true", help="--beads 269 --replicas 1 4 --steps 1 --repeats 2")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    if a.quick:
        a.beads, a.replicas, a.steps, a.repeats = [269], [1, 4], 1, 2
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.weights:
        ck = torch.load(a.weights, weights_only=True)
        model = SchNet(**ck["hparams"])
        model.load_state_dict(ck["state"])
    else:
        model = SchNet(a.features, a.interactions, a.rbf, a.cutoff, max_z=20)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
    model = model.float().to(a.device).eval()
    cfg = {"T": 300.0, "dt": 0.01, "gamma": 2.0, "md_steps": a.steps, "repeats": a.repeats}
    rows = []
    print(f"device {a.device}, threads {a.threads}, F={model.hparams['n_features']}, T={model.hparams['n_interactions']}, "
          f"K={model.hparams['n_rbf']}, cutoff {model.cutoff}, chunk {a.chunk}, pairs {not a.full_list}")
    print(f"{'beads':>5} {'R':>3} {'edges':>8} {'base MiB':>9} {'flash MiB':>9} {'mem x':>6} "
          f"{'base st*R/s':>11} {'flash st*R/s':>12} {'speed x':>7} {'max|dF|/max|F|':>14}")
    for nb in a.beads:
        system = make_chain(nb, 0)
        prior = ChainPotential(system)
        # equilibrated starting conformations: a short Langevin run on the reference potential
        start = generate_frames(system, n_replicas=2, n_equil=100, n_frames_per_replica=1, every=1, dt=0.01, T=300.0,
                                gamma=2.0, seed=0)["final_positions"]
        for R in a.replicas:
            evs = {"baseline": Evaluator("baseline", model, system.types, R, chunk_size=a.chunk, prior=prior,
                                         device=a.device),
                   "flash": Evaluator("flash", model, system.types, R, chunk_size=a.chunk, quantize=a.quantize,
                                      pairs=not a.full_list, prior=prior, device=a.device)}
            pos = tile_start(start, R, np.random.default_rng(R))
            mem = {k: peak_memory(ev, pos) for k, ev in evs.items()}
            flat = pos.reshape(-1, 3).to(a.device, torch.float32)
            _, fb = evs["baseline"].model_energy_forces(flat)
            _, ff = evs["flash"].model_energy_forces(flat)
            dF = float((ff - fb).abs().max() / fb.abs().max())
            t0 = time.perf_counter()
            thr = throughput(evs, start, R, cfg, system, seed=R)
            row = {"beads": nb, "replicas": R, "atoms": nb * R, "edges": mem["flash"]["n_edges"],
                   "base_peak_mib": mem["baseline"]["peak_mb"], "flash_peak_mib": mem["flash"]["peak_mb"],
                   "base_work_mib": mem["baseline"]["peak_work_mb"], "flash_work_mib": mem["flash"]["peak_work_mb"],
                   "mem_ratio": mem["baseline"]["peak_mb"] / mem["flash"]["peak_mb"],
                   "base_throughput": thr["baseline"], "flash_throughput": thr["flash"],
                   "speedup": thr["flash"] / thr["baseline"], "force_maxdiff_rel": dF,
                   "bench_seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"{nb:5d} {R:3d} {row['edges']:8d} {row['base_peak_mib']:9.1f} {row['flash_peak_mib']:9.1f} "
                  f"{row['mem_ratio']:6.1f} {row['base_throughput']:11.2f} {row['flash_throughput']:12.2f} "
                  f"{row['speedup']:7.2f} {dF:14.2e}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
