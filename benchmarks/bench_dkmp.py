"""DKMP vs dense radius graphs: cost of one step on Cu icosahedral clusters of 309 ... 2869 atoms.

Same process, interleaved, same untrained weights' shapes (cost does not depend on the values):
per size and variant, the best wall time over the repeats of an MD step (energy + forces, graph given) and of a
training step (energy/force loss + backward), the peak torch tensor memory of each (allocator
events replayed, ``blocks.atomistic.cost``), graph construction time and edges per step. Reports
dense/DKMP ratios per size and log-log slopes against atom count. The process-level check runs
one MD step of DKMP and of the dense model at the largest size in fresh subprocesses and reads
their RSS high-water marks (interpreter + torch included, so the ratio is smaller).

Writes benchmarks/results/dkmp.json. ``python -m benchmarks dkmp``.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHELLS = [(1, 309), (2, 561), (3, 923), (4, 1415), (5, 2057), (6, 2869)]  # icosahedron shells -> atoms
VARIANTS = {
    "dkmp": {"shells": [[0.0, 3.1], [3.1, 4.6, 8], [4.6, 6.0, 8]], "select": "dilated"},
    "dense_same_field": {"shells": [[0.0, 6.0]] * 3},
    "dense_short_cutoff": {"shells": [[0.0, 3.1]] * 3},
}
MODEL = {"n_features": 24, "n_rbf": 16, "window_width": 0.3}
REPEATS = 3

_CHILD = r"""
import sys, json, numpy as np, torch
sys.path.insert(0, {src!r})
from benchmarks.bench_dkmp import cluster_frames, VARIANTS, MODEL
from reprozoo.methods.dkmp.method import build_model, build_data
from reprozoo.blocks.atomistic.cost import rss_high_water_mb
torch.set_num_threads(1)
fr = cluster_frames({n_shells})
before = rss_high_water_mb()
m = build_model(VARIANTS[{variant!r}], MODEL, 0).float().eval()
b = build_data(fr, VARIANTS[{variant!r}]).collate([0], dtype=torch.float32)
m.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, 1, create_graph=False)
print(json.dumps({{"rss_before_mb": before, "rss_after_mb": rss_high_water_mb()}}))
"""


def cluster_frames(n_shells: int, seed: int = 0) -> dict:
    """A rattled Cu icosahedron (shells + 4: 309 atoms for 1, ..., 2869 for 6), no labels."""
    from ase.cluster import Icosahedron

    a = Icosahedron("Cu", n_shells + 4, latticeconstant=3.61)
    pos = a.positions + np.random.default_rng(seed).normal(0, 0.1, a.positions.shape)
    return {"positions": [pos], "numbers": [a.numbers.astype(np.int64)], "cells": [np.zeros((3, 3))],
            "pbc": [np.zeros(3, bool)], "energy": np.zeros(1), "forces": [np.zeros_like(pos)]}


def main() -> dict:
    import torch

    from reprozoo.blocks.atomistic import loss_terms
    from reprozoo.blocks.atomistic.cost import loglog_slope, median_seconds, peak_tensor_bytes
    from reprozoo.blocks.atomistic.dilated import star_graph
    from reprozoo.methods.dkmp.method import build_data, build_model

    torch.set_num_threads(1)
    names = list(VARIANTS)
    models = {v: build_model(VARIANTS[v], MODEL, 0).float() for v in names}
    res = {v: {"n_atoms": [], "edges": [], "graph_ms": [], "step_ms": [], "step_mb": [], "train_ms": [],
               "train_mb": []} for v in names}
    for n_shells, n_atoms in SHELLS:
        fr = cluster_frames(n_shells)
        assert len(fr["numbers"][0]) == n_atoms
        batches = {}
        for v in names:
            d = build_data(fr, VARIANTS[v])
            batches[v] = d.collate([0], dtype=torch.float32)
            res[v]["n_atoms"].append(n_atoms)
            res[v]["edges"].append(int(d.messages_per_layer(0).sum()))
            res[v]["graph_ms"].append(1e3 * median_seconds(
                lambda: star_graph(fr["positions"][0], d.shells, None, False, VARIANTS[v].get("select", "dilated")),
                REPEATS, 1))

        def md_step(v):
            b = batches[v]
            models[v].eval()
            return models[v].energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, 1,
                                               create_graph=False)

        def train_step(v):
            models[v].train()
            models[v].zero_grad(set_to_none=True)
            loss, _, _ = loss_terms(models[v], batches[v], 1.0, 10.0)
            loss.backward()

        step = {v: [] for v in names}
        train = {v: [] for v in names}
        for v in names:
            md_step(v), train_step(v)  # warm-up
        for r in range(REPEATS):  # interleaved, alternating order
            for v in (names if r % 2 == 0 else names[::-1]):
                step[v].append(median_seconds(lambda: md_step(v), 1, 0))
                train[v].append(median_seconds(lambda: train_step(v), 1, 0))
        for v in names:
            res[v]["step_ms"].append(1e3 * float(np.min(step[v])))
            res[v]["train_ms"].append(1e3 * float(np.min(train[v])))
            res[v]["step_mb"].append(peak_tensor_bytes(lambda: md_step(v))[0] / 2**20)
            res[v]["train_mb"].append(peak_tensor_bytes(lambda: train_step(v))[0] / 2**20)
        print(f"{n_atoms:5d} atoms: " + "  ".join(
            f"{v} {res[v]['step_ms'][-1]:.0f} ms {res[v]['step_mb'][-1]:.0f} MiB {res[v]['edges'][-1]} edges"
            for v in names), flush=True)

    report = {"variants": VARIANTS, "model": MODEL, "repeats": REPEATS, "threads": 1, "results": res,
              "ratios_dense_over_dkmp": {}, "slopes": {}}
    for key in ("edges", "step_ms", "step_mb", "train_ms", "train_mb", "graph_ms"):
        report["ratios_dense_over_dkmp"][key] = [round(a / b, 3) for a, b in
                                                  zip(res["dense_same_field"][key], res["dkmp"][key])]
        report["slopes"][key] = {v: round(loglog_slope(res[v]["n_atoms"], res[v][key]), 3) for v in names}
    # process-level memory: RSS high-water of one MD step at the largest size, fresh subprocesses
    rss = {}
    for v in ("dkmp", "dense_same_field"):
        code = _CHILD.format(src=str(ROOT / "src"), n_shells=SHELLS[-1][0], variant=v)
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        rss[v] = json.loads(out.stdout.strip().splitlines()[-1])
        rss[v]["step_mb"] = rss[v]["rss_after_mb"] - rss[v]["rss_before_mb"]
    report["rss_largest"] = rss
    report["rss_step_ratio_dense_over_dkmp"] = round(
        rss["dense_same_field"]["step_mb"] / max(rss["dkmp"]["step_mb"], 1e-9), 3)

    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "dkmp.json").write_text(json.dumps(report, indent=2))
    print("\ndense_same_field / dkmp per size " + str([n for _, n in SHELLS]))
    for key, vals in report["ratios_dense_over_dkmp"].items():
        print(f"  {key:9s} {vals}")
    print("log-log slopes vs atoms")
    for key, vals in report["slopes"].items():
        print(f"  {key:9s} {vals}")
    print(f"RSS high-water growth of one MD step at {SHELLS[-1][1]} atoms (MB): "
          f"dkmp {rss['dkmp']['step_mb']:.0f}, dense {rss['dense_same_field']['step_mb']:.0f} "
          f"(ratio {report['rss_step_ratio_dense_over_dkmp']})")
    return report


if __name__ == "__main__":
    main()
