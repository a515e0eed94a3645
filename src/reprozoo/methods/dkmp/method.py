"""DKMP in miniature: dilated star-structured message passing vs dense radius graphs on EMT Cu clusters.

Model (all variants): the shared SchNet blocks (embedding, continuous-filter interactions, Gaussian
basis, atom-wise head, energy scaling; forces = -dE/dx by autograd) in
``blocks.atomistic.dilated.DilatedSchNet``: interaction l passes messages only along the edges
whose length lies in its shell [r_in, r_out), weighted by a window that vanishes at the shell's
boundaries. The variants differ only in their graphs:

* ``dkmp``: disjoint shells [0, 3.1), [3.1, 4.6), [4.6, 6.0) A, one per layer (progressively
  farther); the first shell keeps every atom (the nearest-neighbour shell of Cu), each farther shell
  keeps a star of k = 8 leaves per atom at evenly dilated distance ranks (ranks
  floor((m + 1/2) n / k) of the n atoms of the shell); the union of shells is DKMP's receptive
  radius 6.0 A;
* ``dense_same_field``: the full radius graph at 6.0 A in every layer (same receptive field);
* ``dense_short_cutoff``: the full radius graph at 3.1 A in every layer (about DKMP's edge budget).

train_shared (per seed): cost of one MD step (energy + forces; graph given) and of one training
step (energy/force loss + backward) of every variant at every cluster size, interleaved in one
process: best wall time over the repeats (contention from other processes only adds time), peak
torch tensor memory (allocator events replayed, see ``blocks.atomistic.cost``), edges per layer,
graph construction time -> ``cost.json``.
train (per variant x seed): fit on the training frames (shared ``fit``, same steps for all),
energy/force MAE on held-out frames (overall and per cluster size), edges per layer; the variant's
costs from ``cost.json`` and their log-log slopes against atom count.
Units: energy MAE meV/atom, force MAE meV/A, time ms, memory MiB.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np


# --- data ---------------------------------------------------------------------------------------

def _load(ctx):
    from ...data.md import load

    name = ctx.params["dataset"]
    if name not in ctx.data:
        raise KeyError(f"dataset '{name}' is not among this method's datasets {sorted(ctx.data)}; "
                       "add it to spec.datasets (the paper config is config only)")
    return load(ctx.data[name])


def _system_ids(md, names) -> list[int]:
    all_names = [str(s) for s in md.system_names]
    if names in (None, "all"):
        return sorted(int(s) for s in np.unique(md.system))
    missing = [n for n in names if n not in all_names]
    if missing:
        raise KeyError(f"systems {missing} not in the dataset; it has {all_names}")
    return [all_names.index(n) for n in names]


def frames_of(md, systems, split: str | None = None, first_only: bool = False) -> dict:
    """Per-frame lists (AtomsData layout) of the given systems (and split), padding removed."""
    from ...blocks.atomistic.data import frames_from_arrays

    mask = np.isin(md.system, systems)
    if split is not None:
        mask &= md.table["split"].to_numpy() == split
    idx = np.flatnonzero(mask)
    if first_only:
        idx = np.array([np.flatnonzero(mask & (md.system == s))[0] for s in systems])
    sub = md.select(idx)
    return frames_from_arrays(sub.positions, sub.numbers, sub.cells, sub.pbc, sub.energy, sub.forces, sub.n_atoms)


def layer_shells(vcfg: dict):
    from ...blocks.atomistic.dilated import parse_shells

    return parse_shells(vcfg["shells"])


def build_model(vcfg: dict, mcfg: dict, seed: int):
    import torch

    from ...blocks.atomistic.dilated import DilatedSchNet

    torch.manual_seed(seed)
    return DilatedSchNet(layer_shells(vcfg), window_width=mcfg.get("window_width", 0.3),
                         n_features=mcfg["n_features"], n_rbf=mcfg["n_rbf"])


def build_data(frames: dict, vcfg: dict, device=None):
    from ...blocks.atomistic.dilated import StarGraphData

    return StarGraphData(frames, layer_shells(vcfg), vcfg.get("select", "dilated"), device=device)


# --- cost of a step (shared per seed) -----------------------------------------------------------

def measure_costs(variants: dict, mcfg: dict, frames_by_size: list[dict], train_frames: dict, seed: int,
                  repeats: int = 2, device: str = "cpu", progress=print) -> dict:
    """Interleaved per-size cost of every variant: MD step time/peak memory, graph time, edges,
    and training-step time/peak memory on ``train_frames`` (one frame)."""
    import torch

    from ...blocks.atomistic import fit_energy_scale, loss_terms
    from ...blocks.atomistic.cost import median_seconds, peak_tensor_bytes
    from ...blocks.atomistic.dilated import star_graph

    names = list(variants)
    models, batches, out = {}, {}, {}
    sizes = [len(fr["numbers"][0]) for fr in frames_by_size]
    for v in names:
        m = build_model(variants[v], mcfg, seed)
        td = build_data(train_frames, variants[v], device)
        fit_energy_scale(m, td)
        models[v] = m.float().to(device)
        batches[v] = {"train": td.collate([0], dtype=torch.float32)}
        out[v] = {"n_atoms": sizes, "edges_layer": [], "graph_ms": [], "time_step_ms": [], "mem_step_mb": []}
        for s, fr in enumerate(frames_by_size):
            d = build_data(fr, variants[v], device)
            batches[v][s] = d.collate([0], dtype=torch.float32)
            out[v]["edges_layer"].append(d.messages_per_layer(0).tolist())
            sh = d.shells
            out[v]["graph_ms"].append(1e3 * median_seconds(
                lambda fr=fr, sh=sh: star_graph(fr["positions"][0], sh, fr["cells"][0], fr["pbc"][0],
                                                variants[v].get("select", "dilated")), repeats, 1))

    def md_step(v, s):
        m, b = models[v], batches[v][s]
        m.eval()
        return m.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures,
                                   create_graph=False)

    def train_step(v):
        m, b = models[v], batches[v]["train"]
        m.train()
        m.zero_grad(set_to_none=True)
        loss, _, _ = loss_terms(m, b, 1.0, 10.0)
        loss.backward()
        return loss.detach()

    for v in names:  # warm-up (allocator, autograd)
        md_step(v, 0)
        train_step(v)
    times = {v: {s: [] for s in range(len(sizes))} for v in names}
    ttrain = {v: [] for v in names}
    for r in range(repeats):
        for s in range(len(sizes)):
            for v in (names if r % 2 == 0 else names[::-1]):
                times[v][s].append(median_seconds(lambda: md_step(v, s), 1, 0, device))
        for v in (names if r % 2 == 0 else names[::-1]):
            ttrain[v].append(median_seconds(lambda: train_step(v), 1, 0, device))
        progress(f"cost repeat {r + 1}/{repeats} done")
    for v in names:
        for s in range(len(sizes)):
            out[v]["time_step_ms"].append(1e3 * float(np.min(times[v][s])))
            peak, _ = peak_tensor_bytes(lambda: md_step(v, s), device)
            out[v]["mem_step_mb"].append(peak / 2**20)
        out[v]["time_train_ms"] = 1e3 * float(np.min(ttrain[v]))
        peak, _ = peak_tensor_bytes(lambda: train_step(v), device)
        out[v]["mem_train_mb"] = peak / 2**20
        out[v]["n_atoms_train"] = int(batches[v]["train"].numbers.shape[0])
        progress(f"{v}: step ms {['%.1f' % t for t in out[v]['time_step_ms']]}, "
                 f"MB {['%.1f' % t for t in out[v]['mem_step_mb']]}")
    return out


def train_shared(ctx) -> None:
    p = ctx.params
    md = _load(ctx)
    scal = _system_ids(md, p["scaling_systems"])
    frames_by_size = [frames_of(md, [s], first_only=True) for s in scal]
    train_frame = frames_of(md, _system_ids(md, p["train_systems"])[:1], split="train", first_only=True)
    t0 = time.perf_counter()
    cost = measure_costs(p["variants"], p["model"], frames_by_size, train_frame, ctx.seed,
                         p.get("cost", {}).get("repeats", 2), p.get("device", "cpu"), ctx.progress)
    ctx.metrics.scalar("cost_seconds", time.perf_counter() - t0)
    (ctx.outdir / "cost.json").write_text(json.dumps(cost, indent=1))


# --- per variant -------------------------------------------------------------------------------

def train(ctx) -> None:
    import torch

    from ...blocks.atomistic import TrainConfig, evaluate, fit, fit_energy_scale
    from ...blocks.atomistic.cost import loglog_slope

    p, v = ctx.params, ctx.variant
    vcfg = p["variants"][v]
    device = p.get("device", "cpu")
    md = _load(ctx)
    train_ids = _system_ids(md, p["train_systems"])
    eval_ids = _system_ids(md, p["eval_systems"])
    train_data = build_data(frames_of(md, train_ids, "train"), vcfg, device).precompute()

    model = build_model(vcfg, p["model"], ctx.seed)
    fit_energy_scale(model, train_data)
    model.to(device)
    cfg = TrainConfig.from_dict({**p["train"], "seed": ctx.seed})
    hist = fit(model, train_data, None, cfg, progress=ctx.progress)
    ctx.metrics.scalar("train_seconds", hist["seconds"])
    ctx.metrics.scalar("train_steps", hist["steps"])
    ctx.metrics.scalar("train_ms_per_step", 1e3 * hist["seconds"] / max(hist["steps"], 1))
    losses = np.asarray(hist["step_loss"])
    every = max(1, len(losses) // 20)
    ctx.metrics.curve("train_loss", np.arange(0, len(losses), every) + 1, losses[::every])
    ctx.metrics.scalar("n_params", sum(q.numel() for q in model.parameters()))

    # held-out frames, per cluster size, then pooled (frame-weighted energy, component-weighted forces)
    sizes, fmae, emae, n_frames, n_comp, per_layer = [], [], [], [], [], []
    for s in eval_ids:
        d = build_data(frames_of(md, [s], "test"), vcfg, device)
        ms = evaluate(model, d, batch_size=1, dtype=torch.float32)
        sizes.append(d.n_atoms(0))
        fmae.append(1e3 * ms["force_mae"])
        emae.append(1e3 * ms["energy_mae_per_atom"])
        n_frames.append(len(d))
        n_comp.append(3 * sum(d.n_atoms(k) for k in range(len(d))))
        # messages per layer (edges each interaction passes over) per atom
        per_layer += [d.messages_per_layer(k) / d.n_atoms(k) for k in range(len(d))]
    energy_mae = float(np.average(emae, weights=n_frames))
    force_mae = float(np.average(fmae, weights=n_comp))
    ctx.metrics.scalar("energy_mae", energy_mae)
    ctx.metrics.scalar("force_mae", force_mae)
    ctx.metrics.curve("force_mae_by_size", sizes, fmae)
    ctx.metrics.curve("energy_mae_by_size", sizes, emae)
    ctx.progress(f"test: energy MAE {energy_mae:.2f} meV/atom, force MAE {force_mae:.1f} meV/A "
                 f"(by size {dict(zip(sizes, np.round(fmae, 1)))})")
    per_layer = np.array(per_layer)
    ctx.metrics.curve("edges_layer", np.arange(1, per_layer.shape[1] + 1), per_layer.mean(0))
    ctx.metrics.scalar("edges_per_atom", float(per_layer.sum(1).mean()))
    ctx.metrics.scalar("edges_per_layer_per_atom", float(per_layer.mean()))

    # cost of a step (measured for every variant in one process by train_shared)
    cost = json.loads((Path(ctx.shared_dir) / "cost.json").read_text())[v]
    n = cost["n_atoms"]
    edges = [float(np.sum(e)) for e in cost["edges_layer"]]
    ctx.metrics.curve("time_step_ms", n, cost["time_step_ms"])
    ctx.metrics.curve("mem_step_mb", n, cost["mem_step_mb"])
    ctx.metrics.curve("edges_total", n, edges)
    ctx.metrics.curve("graph_ms", n, cost["graph_ms"])
    ctx.metrics.curve("time_md_step_ms", n, np.add(cost["time_step_ms"], cost["graph_ms"]))
    ctx.metrics.scalar("time_train_step_ms", cost["time_train_ms"])
    ctx.metrics.scalar("mem_train_step_mb", cost["mem_train_mb"])
    ctx.metrics.scalar("slope_time_step", loglog_slope(n, cost["time_step_ms"]))
    ctx.metrics.scalar("slope_mem_step", loglog_slope(n, cost["mem_step_mb"]))
    ctx.metrics.scalar("slope_edges", loglog_slope(n, edges))
    ctx.metrics.scalar("slope_time_md_step", loglog_slope(n, np.add(cost["time_step_ms"], cost["graph_ms"])))


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    curve_plot(table, "time_step_ms", plots_dir / "curve_time_step_ms.png", logx=True, logy=True,
               xlabel="atoms", ylabel="ms per MD step (energy + forces)", title="Step time vs system size")
    curve_plot(table, "mem_step_mb", plots_dir / "curve_mem_step_mb.png", logx=True, logy=True,
               xlabel="atoms", ylabel="peak tensor memory per step (MiB)", title="Step memory vs system size")
    curve_plot(table, "edges_total", plots_dir / "curve_edges_total.png", logx=True, logy=True,
               xlabel="atoms", ylabel="messages per step (edges summed over layers)", title="Edges vs system size")
    curve_plot(table, "force_mae_by_size", plots_dir / "curve_force_mae_by_size.png", logx=True,
               xlabel="atoms", ylabel="force MAE (meV/A)", title="Held-out force MAE by cluster size")
    p = plt()
    fig, axes = p.subplots(1, 4, figsize=(17, 3.8))
    variants = sorted(table.variant.unique())
    for ax, (metric, ylabel) in zip(axes[:3], [("time_step_ms", "ms per step"), ("mem_step_mb", "MiB per step"),
                                               ("edges_total", "edges per step")]):
        sub = table[table.metric == metric]
        for v in variants:
            g = sub[sub.variant == v].groupby("x").value.mean()
            if g.empty:
                continue
            slope = np.polyfit(np.log(g.index), np.log(g.values), 1)[0] if len(g) > 1 else float("nan")
            ax.loglog(g.index, g.values, "o-", ms=3, label=f"{v} (slope {slope:.2f})")
        ax.set_xlabel("atoms")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    sub = table[table.metric == "edges_layer"]
    width = 0.8 / max(len(variants), 1)
    for k, v in enumerate(variants):
        g = sub[sub.variant == v].groupby("x").value.mean()
        axes[3].bar(g.index + (k - (len(variants) - 1) / 2) * width, g.values, width, label=v)
    axes[3].set_xlabel("layer")
    axes[3].set_ylabel("edges per atom")
    axes[3].set_title("Edges per layer (held-out frames)")
    axes[3].set_ylim(0, 1.3 * max(float(sub.value.max()) if not sub.empty else 1.0, 1e-9))
    axes[3].legend(fontsize=7, loc="upper right", ncol=len(variants))
    fig.suptitle("DKMP vs dense radius graphs: cost scaling on Cu clusters (EMT)")
    fig.tight_layout()
    fig.savefig(plots_dir / "scaling.png", dpi=100)
    p.close(fig)
