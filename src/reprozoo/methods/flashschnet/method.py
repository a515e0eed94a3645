"""FlashSchNet in miniature (CPU): the same SchNet weights run by a baseline and by an IO-aware
flash kernel, on Langevin MD of a 269-bead C-alpha-like chain with many replicas.

train_shared (per seed): build the chain (bead types, harmonic bond/angle priors, repulsion, and a
type-dependent attraction that stands in for the all-atom free energy), sample frames by Langevin MD
on the reference potential from several independent replicas, train a SchNet by force matching on
the reference-minus-prior forces (CGSchNet's setting) until its validation force error flattens
(validation = the frames of one held-out replica, also the test frames), save the weights, the
training history, test frames and equilibrated conformations, and independent equilibrated
starts of a short chain (the first beads of the same sequence) for the MD observables.
train (variant x seed): with the variant's implementation of the same weights: forces on the test
frames (accuracy, max difference vs the baseline, 16-bit quantisation error), peak memory of one
force evaluation and Langevin MD throughput (steps x replicas / s) over replica counts, the speed-up
over the CGSchNet-style baseline in paired ABBA rounds in the same process (process CPU time, median
of the per-round ratios; for the baseline itself against a second baseline evaluator: the A/A control),
MD observables (radius of gyration, bond-length distribution, contacts) over several
autocorrelation times with common random numbers, NVE energy drift. Control variants (a weight
format known to be too coarse) run only the force error and the observables.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ...io import save_npz
from reprozoo.figures import save_figure


def _device(p):
    import torch

    dev = p.get("device", "cpu")
    if str(dev).startswith("cuda") and not torch.cuda.is_available():
        return "cpu"
    return dev


def _system(p):
    from .cgchain import make_chain

    return make_chain(p["system"]["n_beads"], p["system"].get("seed", 0))


def _obs_system(p, system):
    """The chain of the MD observables: the first ``observables.n_beads`` beads of the sequence."""
    import dataclasses

    return dataclasses.replace(system, types=system.types[:int(p["observables"]["n_beads"])])


def _load_model(shared_dir: Path, device: str = "cpu"):
    import torch

    from ...blocks.atomistic import SchNet

    ck = torch.load(shared_dir / "schnet.pt", weights_only=True)
    model = SchNet(**ck["hparams"])
    model.load_state_dict(ck["state"])
    return model.float().to(device).eval()


# --- shared per seed -----------------------------------------------------------------------------

def train_shared(ctx) -> None:
    import torch

    from ...blocks.atomistic import AtomsData, SchNet, TrainConfig, fit, fit_energy_scale
    from .cgchain import equilibrated_starts, generate_frames

    p = ctx.params
    system = _system(p)
    t0 = time.perf_counter()
    fr = generate_frames(system, seed=ctx.seed, progress=ctx.progress, **p["data"])
    ctx.metrics.scalar("data_seconds", time.perf_counter() - t0)
    n_frames, n_rep = len(fr["positions"]), int(p["data"]["n_replicas"])
    frames = {"positions": list(fr["positions"]), "numbers": [fr["numbers"]] * n_frames,
              "cells": list(fr["cells"]), "pbc": [fr["pbc"]] * n_frames, "energy": fr["energy"],
              "forces": list(fr["forces"])}
    data = AtomsData(frames, p["model"]["cutoff"])
    # frames are time-major (index = t * n_rep + r): the last replica is held out entirely, so the
    # validation / test frames are an independent trajectory, not neighbours in time of training frames
    held_out = np.arange(n_frames) % n_rep == n_rep - 1
    train_set, test_set = data.subset(np.flatnonzero(~held_out)), data.subset(np.flatnonzero(held_out))
    test_forces = fr["forces"][held_out]
    torch.manual_seed(ctx.seed)
    model = SchNet(**p["model"], max_z=int(system.types.max()))
    fit_energy_scale(model, train_set)
    t0 = time.perf_counter()
    hist = fit(model, train_set, test_set, TrainConfig.from_dict({**p["train"], "seed": ctx.seed}),
               progress=ctx.progress)
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t0)
    ctx.metrics.curve("train_loss", range(len(hist["step_loss"])), hist["step_loss"])
    # validation val_per_epoch times a pass on the held-out replica (no early stopping: the last
    # value is the test error of the weights every variant uses)
    val_steps = [int(k) for k in hist["val_steps"]]
    zero = float(np.mean(np.abs(test_forces)))
    m = {"force_mae": float(hist["val_force_mae"][-1])}
    (ctx.outdir / "train_history.json").write_text(json.dumps({
        "val_steps": val_steps, "val_force_mae": [float(v) for v in hist["val_force_mae"]],
        "lr": [float(v) for v in hist.get("lr", [])],
        "steps": int(hist["steps"]), "force_mae": m["force_mae"], "force_mae_zero_model": zero,
        "force_rms": float(np.sqrt(np.mean(test_forces ** 2)))}))
    ctx.progress(f"SchNet trained {hist['steps']} steps in {hist['seconds']:.1f}s; test force MAE "
                 f"{m['force_mae']:.4f} (zero model {zero:.4f}) kcal/mol/A")
    torch.save({"hparams": model.hparams, "state": model.float().state_dict()}, ctx.outdir / "schnet.pt")
    # independent starts of the observables' chain: long reference-potential Langevin per replica
    o = p["observables"]
    t0 = time.perf_counter()
    obs_start = equilibrated_starts(_obs_system(p, system), int(o["replicas"]), int(o["equil_steps"]),
                                    o.get("equil_dt", o["dt"]), p["data"]["T"], o["gamma"], seed=31 * ctx.seed + 5)
    ctx.metrics.scalar("obs_start_seconds", time.perf_counter() - t0)
    save_npz(ctx.outdir / "chain.npz", types=system.types, hydro=system.hydro,
             test_positions=fr["positions"][held_out], test_forces=test_forces,
             test_energy=fr["energy"][held_out], start=fr["final_positions"], obs_start=obs_start)


# --- per variant -----------------------------------------------------------------------------------

def train(ctx) -> None:
    import torch

    from .cgchain import ChainPotential
    from .md import (OBSERVABLES, Evaluator, interleaved_rounds, nve_run, observables_run, paired_rounds,
                     peak_memory, summarise_observables, tile_start, variant_kind)

    p, variant = ctx.params, ctx.variant
    dev = _device(p)
    kind, quant, pairs = variant_kind(variant)
    system = _system(p)
    shared = np.load(ctx.shared_dir / "chain.npz")
    assert np.array_equal(shared["types"], system.types)
    model = _load_model(ctx.shared_dir, dev)
    fl = p["flash"]

    def make(R, k=kind, q=quant, pr=pairs, sys_=system):
        # every evaluator gets its own prior (its own Verlet cache): none pays another's rebuilds
        return Evaluator(k, model, sys_.types, R, skin=p["bench"]["skin"], chunk_size=fl["chunk_size"],
                         quantize=q, pairs=pr, prior=ChainPotential(sys_), device=dev)

    control = variant in p.get("controls", ())  # a too-coarse weight format: force error and observables only

    # 0. the training every variant shares: its validation curve and learning rate in every variant
    # (the convergence gate reads them for each variant a claim reads); the rest once, by the baseline
    h = json.loads((ctx.shared_dir / "train_history.json").read_text())
    ctx.metrics.curve("train_val_force_mae", h["val_steps"], h["val_force_mae"])
    if h.get("lr"):
        ctx.metrics.curve("train_lr", h["val_steps"], h["lr"])
    if variant == "baseline_schnet":
        ctx.metrics.scalar("train_steps", h["steps"])
        ctx.metrics.scalar("force_mae_zero_model", h["force_mae_zero_model"])
        v = h["val_force_mae"]
        if len(v) > 1:  # relative drop of the validation force MAE over the last epoch (flattening)
            ctx.metrics.scalar("train_val_last_epoch_rel_drop", (v[-2] - v[-1]) / v[-1])

    # 1. forces on the test frames: accuracy, identity with the baseline, quantisation error
    X = torch.from_numpy(shared["test_positions"])
    R = len(X)
    ev = make(R)
    _, f = ev.energy_forces(X, with_prior=False)
    ref = torch.from_numpy(shared["test_forces"])
    ctx.metrics.scalar("force_mae", (f - ref).abs().mean().item())
    ctx.metrics.scalar("force_rmse", (f - ref).pow(2).mean().sqrt().item())
    if variant != "baseline_schnet":  # (weight formats: also compared with their fp32 kernel below)
        _, fb = make(R, "baseline", None, False).energy_forces(X, with_prior=False)
        d = (f - fb).abs().max().item()
        ctx.metrics.scalar("force_maxdiff", d)
        ctx.metrics.scalar("force_maxdiff_rel", d / fb.abs().max().item())
        ctx.progress(f"forces vs baseline: max |dF| {d:.2e} (rel {d / fb.abs().max().item():.2e})")
    if quant:
        _, f32 = make(R, kind, None).energy_forces(X, with_prior=False)
        dq = (f - f32).abs().max().item()
        rms = f32.pow(2).mean().sqrt().item()
        ctx.metrics.scalar("quant_force_err", dq / rms)
        ctx.metrics.scalar("quant_force_maxdiff", dq)
        ctx.metrics.scalar("quant_force_rmse_rel", (f - f32).pow(2).mean().sqrt().item() / rms)
        ctx.metrics.scalar("weight_mb", ev.flash.weight_bytes() / 2**20)
        ctx.metrics.scalar("weight_mb_fp32", sum(m.weight.numel() * 4 for m in model.modules()
                                                  if isinstance(m, torch.nn.Linear)) / 2**20)

    # 2. peak memory over replica counts; MD throughput over replica counts, and the speed-up over
    # the baseline timed interleaved in this process at bench.speedup_replicas (the claim: rounds of
    # many steps; the ablations: shorter rounds, indicative)
    b = p["bench"]
    start = shared["start"]
    if not control:
        mem, work, edges = [], [], []
        reps = list(b["replicas"])
        for R in reps:
            m = peak_memory(make(R), tile_start(start, R, ctx.rng(100 + R)))
            mem.append(m["peak_mb"])
            work.append(m["peak_work_mb"])
            edges.append(m["n_edges"])
            ctx.progress(f"R={R}: {m['n_edges']} edges, peak {m['peak_mb']:.1f} MiB "
                         f"(work {m['peak_work_mb']:.1f} + graph {m['graph_mb']:.1f})")
        ctx.metrics.curve("peak_mem_mb", reps, mem)
        ctx.metrics.curve("peak_work_mb", reps, work)
        ctx.metrics.curve("n_edges", reps, edges)
        ctx.metrics.scalar("peak_mem_mb_max_replicas", mem[-1])
        thr, treps = [], list(b.get("throughput_replicas", reps))
        timed = b.get("interleaved", {})
        for R in treps:
            if variant in timed and R == b["speedup_replicas"]:
                # paired ABBA rounds against the baseline (baseline_schnet: against a second baseline
                # evaluator, the A/A control), in the same process; the claim reads CPU time (one
                # thread), the statistic is the median of the per-round ratios
                tcfg = {**b, **timed[variant]}
                res = paired_rounds(make(R), make(R, "baseline", None, False), start, R, tcfg, system,
                                    seed=1000 * ctx.seed + R)
                n = tcfg["md_steps"] * R
                rc, rw = np.asarray(res["ratio_cpu"]), np.asarray(res["ratio_wall"])
                thr.append(n / float(np.median(res["a_wall"])))
                ctx.metrics.scalar("speedup", float(np.median(rc)))
                ctx.metrics.scalar("speedup_wall", float(np.median(rw)))
                ctx.metrics.scalar("throughput_timed_cpu", n / float(np.median(res["a_cpu"])))
                ctx.metrics.scalar("baseline_throughput_timed_cpu", n / float(np.median(res["b_cpu"])))
                ctx.metrics.curve("speedup_rounds", list(range(1, len(rc) + 1)), list(rc))
                ctx.metrics.curve("speedup_wall_rounds", list(range(1, len(rw) + 1)), list(rw))
                ctx.progress(f"R={R}: CPU x{np.median(rc):.3f} (per round x{', x'.join(f'{r:.2f}' for r in rc)}), "
                             f"wall x{np.median(rw):.3f}; {n / np.median(res['a_cpu']):.2f} vs baseline "
                             f"{n / np.median(res['b_cpu']):.2f} steps*replicas per CPU-s; {len(rc)} ABBA rounds of "
                             f"{tcfg['md_steps']} steps")
            else:  # the other points of the curve: a single short timing in this job (indicative)
                tcfg = {**b, "md_steps": b.get("curve_steps", 1), "repeats": b.get("curve_repeats", 1)}
                rounds = interleaved_rounds({variant: make(R)}, start, R, tcfg, system, seed=1000 * ctx.seed + R)
                thr.append(tcfg["md_steps"] * R / float(np.median(rounds[variant])))
                ctx.progress(f"R={R}: {thr[-1]:.2f} steps*replicas/s")
        ctx.metrics.curve("throughput", treps, thr)

    # 3. MD observables on the short chain from independent equilibrated starts, several
    # autocorrelation times long; the same starts and noise at a seed for every weight format
    # (common random numbers). Yardstick: the standard error over the independent replicas.
    o = p["observables"]
    if variant in o["variants"]:
        sys_o = _obs_system(p, system)
        ocfg = {**o, "T": b["T"]}
        ev = make(int(o["replicas"]), pr=bool(o.get("pairs", pairs)) and kind == "flash", sys_=sys_o)
        series = observables_run(ev, shared["obs_start"], ocfg, sys_o, seed=7919 * ctx.seed + 17)
        summ = summarise_observables(series, o["dt"] * o["every"])
        for name, v in summ.items():
            ctx.metrics.scalar(f"md_{name}", v["mean"])
            ctx.metrics.scalar(f"md_{name}_sem", v["sem"])
            ctx.metrics.scalar(f"md_{name}_tau_ps", v["tau_ps"])
            ctx.metrics.scalar(f"md_{name}_n_tau", v["n_tau"])
        ctx.metrics.scalar("md_decorrelation", min(summ[k]["n_tau"] for k in OBSERVABLES))
        ctx.progress("MD observables: " + ", ".join(
            f"{k} {v['mean']:.4f} +- {v['sem']:.4f} (tau {v['tau_ps']:.2f} ps, run {v['n_tau']:.1f} tau)"
            for k, v in summ.items()))

    # 4. NVE energy drift with this implementation
    n = p["nve"]
    if variant in n["variants"] and not control:
        res = nve_run(make(n["replicas"]), start, {**n, "T": b["T"]}, system, seed=ctx.seed)
        ctx.metrics.curve("nve_energy_per_bead", res["t"], res["dE"])
        ctx.metrics.scalar("nve_drift", res["drift"])
        ctx.metrics.scalar("nve_max_dev", res["max_dev"])
        ctx.progress(f"NVE: drift {res['drift']:.2e} kcal/mol/bead/ps, max deviation {res['max_dev']:.2e}")


# --- plots ---------------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    curve_plot(table, "peak_mem_mb", plots_dir / "curve_peak_mem_mb.png", logx=True, logy=True,
               xlabel="replicas of the 269-bead chain", ylabel="peak memory of one force call (MiB)",
               title="Peak memory (torch CPU allocator bytes, incl. graph)")
    curve_plot(table, "throughput", plots_dir / "curve_throughput.png", logx=True,
               xlabel="replicas", ylabel="steps x replicas / s", title="MD throughput: single short timings in separate jobs (indicative;\n"
                     "the claim is the paired ABBA CPU-time ratio, speedup)", )
    curve_plot(table, "nve_energy_per_bead", plots_dir / "curve_nve_energy_per_bead.png",
               xlabel="time (ps)", ylabel="E_tot(t) - E_tot(0) per bead (kcal/mol)", title="NVE energy conservation")
    curve_plot(table, "train_val_force_mae", plots_dir / "curve_train_val_force_mae.png",
               xlabel="Adam steps (batch 1 frame)", ylabel="force MAE on the held-out replica (kcal/mol/A)",
               title="Has the shared SchNet finished training? (validation force MAE)")
    sub = table[table.metric == "peak_mem_mb"]
    if sub.empty or "baseline_schnet" not in set(sub.variant):
        return
    p = plt()
    fig, ax = p.subplots(figsize=(5.5, 4))
    base = sub[sub.variant == "baseline_schnet"].groupby("x").value.mean()
    for v in sorted(set(sub.variant) - {"baseline_schnet"}):
        g = sub[sub.variant == v].groupby("x").value.mean()
        ax.plot(g.index, base.loc[g.index] / g.values, marker="o", label=f"memory: baseline / {v}")
    thr = table[table.metric == "throughput"]
    tb = thr[thr.variant == "baseline_schnet"].groupby("x").value.mean()
    for v in sorted(set(thr.variant) - {"baseline_schnet"}):
        g = thr[thr.variant == v].groupby("x").value.mean()
        ax.plot(g.index, g.values / tb.loc[g.index], marker="s", ls="--", label=f"throughput: {v} / baseline")
    ax.axhline(3.0, color="k", lw=0.8, ls=":")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("replicas")
    ax.set_ylabel("ratio")
    ax.set_title("Memory ratio (claim) and throughput ratio from single timings in separate jobs\n"
                 "(indicative only; the throughput claim is the paired ABBA CPU-time ratio)", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save_figure(fig, plots_dir / "ratios.png", dpi=110)
