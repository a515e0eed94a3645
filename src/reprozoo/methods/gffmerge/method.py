"""GFFMERGE in miniature: two SchNet force fields trained on different EMT systems, merged.

Two settings of the shared starting point theta_0, both run in every cell (metric prefix):
  pretrained  (no prefix; the paper's setting) theta_0 = a backbone pre-trained on the union of
              both systems (their own pre-training frames, disjoint from the specialists' training
              frames) for a small budget, with one head per system; the specialists and joint
              training start from it.
  random      (prefix ``rand_``; our extra row) theta_0 = a random shared initialisation.

train_shared (per seed): for each setting, theta_0 and one specialist per system trained from
theta_0 on that system only (Cu bulk, Pt cluster); every variant of the seed merges these same
models.

train (per variant x seed), for each setting, evaluated on each system's test frames with that
system's head:
  individual       each specialist on its own system (reference, no sharing)
  weight_avg       backbone = mean of the two specialists' backbones
  task_arithmetic  theta_0 + lambda * sum_k (theta_k - theta_0), lambda picked on validation frames
  gffmerge         closed-form layer-wise merge, merged-model inputs (merge.py, inputs=sequential)
  gffmerge_relaxed the same with each teacher's own layer inputs (the public GNNMerge regression)
  gffmerge_ft      gffmerge, then a short joint fine-tune (a fraction of the joint budget)
  gffmerge_force   extension (not in the brief): gffmerge plus force-aware rows, the layers'
                   directional derivatives along random displacements (merge.py, derivatives=1)
  weight_avg_ft    weight_avg, then the same fine-tune (is the merge a better starting point?)
  joint            one backbone + two heads trained from theta_0 on both systems (gold standard)
Metrics: energy MAE (meV/atom) and force MAE (meV/A) per system and averaged; merge, fine-tune
and joint-training wall times; per-layer alignment residuals; embedding alignment errors.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

VARIANTS_MERGE = ("gffmerge", "gffmerge_relaxed", "gffmerge_ft", "gffmerge_force")
# setting name -> metric prefix; the unprefixed metrics (read by the paper's claims) are the
# pre-trained setting
SETTINGS = {"pretrained": "", "random": "rand_"}


def settings(p: dict) -> list[str]:
    out = list(p.get("settings", SETTINGS))
    unknown = set(out) - set(SETTINGS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; allowed: {sorted(SETTINGS)}")
    return out


# --- data ------------------------------------------------------------------------------------------

def _dataset_dir(ctx, name: str) -> Path:
    if name not in ctx.data:
        raise KeyError(f"config system '{name}' is not among the spec's datasets at scale '{ctx.scale}' "
                       f"({sorted(ctx.data)}); add it to spec.yaml `datasets`")
    return Path(ctx.data[name])


def _atoms_data(frames, idx, cutoff):
    from reprozoo.blocks.atomistic import AtomsData

    idx = [int(i) for i in idx]
    fr = {"positions": [frames.frame(i)["positions"] for i in idx],
          "numbers": [frames.numbers_of(i).astype(np.int64) for i in idx],
          "cells": [frames.cells[i] for i in idx],
          "pbc": [np.asarray(frames.pbc, bool)] * len(idx),
          "energy": np.asarray(frames.energy)[idx],
          "forces": [frames.frame(i)["forces"] for i in idx]}
    return AtomsData(fr, cutoff)


def load_systems(ctx, pretrain: bool = False) -> list[dict]:
    """Per system: {'tag', 'train', 'val', 'test', 'merge'} AtomsData, the same for every variant
    of a seed (frames drawn from the dataset's own splits with a seed-dependent generator);
    with ``pretrain`` also 'pretrain': ``n_pretrain`` further frames of the train split, disjoint
    from 'train' (the pre-training pool of theta_0)."""
    from reprozoo.data.md import load

    p = ctx.params
    cutoff = p["model"]["cutoff"]
    out = []
    for k, sysc in enumerate(p["systems"]):
        frames = load(_dataset_dir(ctx, sysc["dataset"]))
        split = frames.table["split"].to_numpy() if frames.table is not None else None
        rng = np.random.default_rng([ctx.seed, 7919, k])
        parts, pre_idx = {}, None
        for name in ("train", "val", "test"):
            idx = np.flatnonzero(split == name) if split is not None else np.arange(len(frames))
            n = p[f"n_{name}"]
            perm = rng.permutation(idx)
            parts[name] = np.sort(perm[:n]) if n and n < len(idx) else idx
            if name == "train":
                n_pre = int(p.get("n_pretrain", 0))
                if pretrain and (not n or n + n_pre > len(idx)):
                    raise ValueError(f"{sysc['dataset']}: n_train + n_pretrain = {n} + {n_pre} exceeds the "
                                     f"{len(idx)} frames of the train split")
                pre_idx = np.sort(perm[n:n + n_pre])
        merge_idx = parts["train"][np.sort(rng.permutation(len(parts["train"]))[:p["n_merge"]])]
        entry = {"tag": sysc["tag"], "dataset": sysc["dataset"]}
        named = [*parts.items(), ("merge", merge_idx)] + ([("pretrain", pre_idx)] if pretrain else [])
        for name, idx in named:
            entry[name] = _atoms_data(frames, idx, cutoff)
            entry[name].precompute()
        out.append(entry)
    return out


# --- models ----------------------------------------------------------------------------------------

def _torch():
    import torch

    return torch


def new_model(p: dict, seed: int):
    torch = _torch()
    from reprozoo.blocks.atomistic import SchNet

    torch.manual_seed(seed)
    return SchNet(**p["model"])


def load_model(p: dict, path: Path):
    torch = _torch()
    m = new_model(p, 0)
    m.load_state_dict(torch.load(path, weights_only=True))
    return m.eval()


def train_cfg(p: dict, seed: int) -> dict:
    t = p["train"]
    return {"epochs": t["epochs"], "batch_size": t["batch_size"], "lr": t["lr"],
            "lr_final_factor": t.get("lr_final_factor", 0.1), "energy_weight": t.get("energy_weight", 1.0),
            "force_weight": t.get("force_weight", 10.0), "seed": seed}


def joint_steps(p: dict, systems: list[dict]) -> int:
    """Joint budget = the specialists' budget: epochs x the larger number of batches per epoch
    (each joint step takes one batch of every system)."""
    bs = p["train"]["batch_size"]
    return int(p["train"]["epochs"] * max(int(np.ceil(len(s["train"]) / bs)) for s in systems))


def pretrain_steps(p: dict) -> int:
    """Pre-training budget of theta_0 in joint steps (one batch of every system each):
    ``pretrain.epochs`` passes over the ``n_pretrain`` frames per system."""
    bs = p["train"]["batch_size"]
    return int(p["pretrain"]["epochs"] * int(np.ceil(p["n_pretrain"] / bs)))


def _multitask(ctx, models, systems, steps, lr, lr_final_factor, seed, n_curve, curve_name=None, part="train"):
    """Train the tied ``models`` on ``systems[*][part]`` (Adam, cosine decay, the spec's loss
    weights); record the validation learning curve as ``curve_name`` (force and energy MAE)."""
    from .multitask import fit_multitask

    p = ctx.params
    eval_at = sorted({int(round(x)) for x in np.linspace(0, steps, n_curve + 1)}) if curve_name is not None else []
    hist = fit_multitask(models, [s[part] for s in systems], steps, lr, p["train"]["batch_size"], lr_final_factor,
                         p["train"].get("energy_weight", 1.0), p["train"].get("force_weight", 10.0), seed=seed,
                         vals=[s["val"] for s in systems] if curve_name is not None else None, eval_at=eval_at,
                         progress=ctx.progress)
    if curve_name is not None:
        xs = [st for st, _ in hist["curve"]]
        ctx.metrics.curve(f"{curve_name}val_force_mae", xs,
                          [1e3 * np.mean([r["force_mae"] for r in ev]) for _, ev in hist["curve"]])
        ctx.metrics.curve(f"{curve_name}val_energy_mae", xs,
                          [1e3 * np.mean([r["energy_mae_per_atom"] for r in ev]) for _, ev in hist["curve"]])
    return hist


# --- shared per seed: theta_0 of each setting and its two specialists ------------------------------

def _theta0(ctx, setting: str, systems: list[dict], init) -> list:
    """theta_0 of a setting, one model per system (shared backbone values, own head and energy
    scale, the energy scale fitted on that system's training frames). ``pretrained``: the tied
    models trained on the union of both systems' pre-training frames for ``pretrain_steps``."""
    from reprozoo.blocks.atomistic import fit_energy_scale

    from .multitask import tie

    p = ctx.params
    models = [copy.deepcopy(init) for _ in systems]
    for m, s in zip(models, systems):
        fit_energy_scale(m, s["train"])
    if setting == "random":
        return models
    steps = pretrain_steps(p)
    tie(models)
    ctx.progress(f"pre-training theta_0 on the union: {steps} joint steps on {p['n_pretrain']} frames per system")
    hist = _multitask(ctx, models, systems, steps, p["pretrain"].get("lr", p["train"]["lr"]),
                      p["train"].get("lr_final_factor", 0.1), ctx.seed * 100 + 70,
                      p["pretrain"].get("curve_points", 4), curve_name="pretrain_", part="pretrain")
    ctx.metrics.scalar("pretrain_seconds", hist["seconds"])
    ctx.metrics.scalar("pretrain_steps", steps)
    return [copy.deepcopy(m) for m in models]  # untie: each copy owns its backbone


def train_shared(ctx) -> None:
    torch = _torch()
    from reprozoo.blocks.atomistic import evaluate, fit

    p = ctx.params
    sets = settings(p)
    systems = load_systems(ctx, pretrain="pretrained" in sets)
    import pickle

    (ctx.outdir / "systems.pkl").write_bytes(pickle.dumps([{k: v for k, v in s.items() if k != "pretrain"}
                                                           for s in systems]))
    init = new_model(p, ctx.seed)
    for setting in sets:
        pre = SETTINGS[setting]
        theta0 = _theta0(ctx, setting, systems, init)
        info = {}
        for k, (s, m0) in enumerate(zip(systems, theta0)):
            torch.save(m0.state_dict(), ctx.outdir / f"init_{setting}_{s['tag']}.pt")
            m = copy.deepcopy(m0)
            ctx.progress(f"[{setting}] specialist {s['tag']}: {len(s['train'])} frames, {p['train']['epochs']} epochs")
            hist = fit(m, s["train"], None, train_cfg(p, ctx.seed * 100 + k), progress=ctx.progress)
            torch.save(m.state_dict(), ctx.outdir / f"specialist_{setting}_{s['tag']}.pt")
            ev = evaluate(m, s["val"])
            info[s["tag"]] = {"train_seconds": hist["seconds"], "steps": hist["steps"],
                              "val_force_mae": ev["force_mae"], "val_energy_mae_per_atom": ev["energy_mae_per_atom"]}
            ctx.metrics.scalar(f"{pre}specialist_train_seconds_{s['tag']}", hist["seconds"])
            ctx.metrics.scalar(f"{pre}specialist_val_force_mae_{s['tag']}", 1e3 * ev["force_mae"])
        (ctx.outdir / f"specialists_{setting}.json").write_text(json.dumps(info, indent=1))


# --- per variant ------------------------------------------------------------------------------------

def _record_errors(ctx, systems, models, prefix: str = "") -> dict:
    from .multitask import evaluate_systems

    res = evaluate_systems(models, [s["test"] for s in systems])
    e = [1e3 * r["energy_mae_per_atom"] for r in res]
    f = [1e3 * r["force_mae"] for r in res]
    for s, ei, fi in zip(systems, e, f):
        ctx.metrics.scalar(f"{prefix}energy_mae_{s['tag']}", ei)
        ctx.metrics.scalar(f"{prefix}force_mae_{s['tag']}", fi)
    ctx.metrics.scalar(f"{prefix}energy_mae_mean", float(np.mean(e)))
    ctx.metrics.scalar(f"{prefix}force_mae_mean", float(np.mean(f)))
    ctx.progress(f"{prefix or 'test'}: energy MAE {['%.2f' % x for x in e]} meV/atom, "
                 f"force MAE {['%.1f' % x for x in f]} meV/A")
    return {"energy": e, "force": f}


def _merge_batches(p, systems):
    import torch

    bf = p["merge"].get("batch_frames", 8)
    out = []
    for s in systems:
        d = s["merge"]
        out.append([d.collate(range(i, min(i + bf, len(d))), dtype=torch.float64) for i in range(0, len(d), bf)])
    return out


def _teacher_deviation(teachers, models, datas) -> tuple[float, float]:
    """How far a merged model is from the specialists it merges, on held-out (validation) frames, mean over
    systems: (relative error of the final atom features |x - x_teacher|^2 / |x_teacher|^2,
    force MAE between the merged model and the teacher in meV/A)."""
    torch = _torch()
    emb, dev = [], []
    for t, m, d in zip(teachers, models, datas):
        num = den = fd = 0.0
        nf = 0
        for b in d.batches(8, dtype=next(t.parameters()).dtype):
            with torch.no_grad():
                xt = t.representation(b.numbers, b.positions, b.edge_index, b.shifts)
                xm = m.representation(b.numbers, b.positions, b.edge_index, b.shifts)
            num += float(((xm - xt) ** 2).sum())
            den += float((xt ** 2).sum())
            _, ft = t.batch_forward(b)
            _, fm = m.batch_forward(b)
            fd += float((fm.detach() - ft.detach()).abs().sum())
            nf += ft.numel()
        emb.append(num / den)
        dev.append(1e3 * fd / nf)
    return float(np.mean(emb)), float(np.mean(dev))


def _cached_systems(ctx) -> list[dict]:
    """The seed's systems as train_shared pickled them (graphs precomputed), else loaded afresh:
    reading the datasets' compressed npz costs more than most merges."""
    import pickle

    path = Path(ctx.shared_dir) / "systems.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    return load_systems(ctx)


def train(ctx) -> None:
    p = ctx.params
    systems = _cached_systems(ctx)
    for setting in settings(p):
        only = p.get("setting_variants", {}).get(setting)
        if only is None or ctx.variant in only:
            _train_setting(ctx, setting, systems)


def _train_setting(ctx, setting: str, systems: list[dict]) -> None:
    """One variant in one setting of theta_0; metrics carry the setting's prefix."""
    from .merge import backbone_state, gffmerge, task_arithmetic, weight_average, with_backbone
    from .multitask import evaluate_systems, tie

    p = ctx.params
    v = ctx.variant
    pre = SETTINGS[setting]
    sd = Path(ctx.shared_dir)
    theta0 = [load_model(p, sd / f"init_{setting}_{s['tag']}.pt") for s in systems]
    teachers = [load_model(p, sd / f"specialist_{setting}_{s['tag']}.pt") for s in systems]
    n_joint = joint_steps(p, systems)
    ctx.metrics.scalar("joint_budget_steps", n_joint)

    if v == "individual":
        _record_errors(ctx, systems, teachers, prefix=pre)
        info = json.loads((sd / f"specialists_{setting}.json").read_text())
        ctx.metrics.scalar(f"{pre}specialist_train_seconds", sum(i["train_seconds"] for i in info.values()))
        return

    if v == "joint":
        models = tie(theta0)
        ctx.progress(f"[{setting}] joint training from theta_0: {n_joint} steps x {len(systems)} systems")
        hist = _multitask(ctx, models, systems, n_joint, p["train"]["lr"], p["train"].get("lr_final_factor", 0.1),
                          ctx.seed * 100 + 90, 2 * p["finetune"].get("curve_points", 5), curve_name=pre)
        ctx.metrics.scalar(f"{pre}joint_train_seconds", hist["seconds"])
        ctx.metrics.scalar(f"{pre}joint_train_cpu_seconds", hist["cpu_seconds"])
        _record_errors(ctx, systems, models, prefix=pre)
        return

    states = [backbone_state(t) for t in teachers]
    if v in ("weight_avg", "weight_avg_ft"):
        t0 = time.perf_counter()
        merged = weight_average(states)
        ctx.metrics.scalar(f"{pre}merge_seconds", time.perf_counter() - t0)
    elif v == "task_arithmetic":
        best = None
        init_state = backbone_state(theta0[0])
        for lam in p["task_arithmetic"]["lambdas"]:
            st = task_arithmetic(init_state, states, float(lam))
            res = evaluate_systems([with_backbone(t, st) for t in teachers], [s["val"] for s in systems])
            loss = float(np.mean([r["loss"] for r in res]))
            ctx.progress(f"[{setting}] task arithmetic lambda={lam}: val loss {loss:.4g}")
            if best is None or loss < best[0]:
                best = (loss, float(lam), st)
        merged = best[2]
        ctx.metrics.scalar(f"{pre}ta_lambda", best[1])
    elif v in VARIANTS_MERGE:
        mode = "teacher" if v == "gffmerge_relaxed" else p["merge"].get("inputs", "sequential")
        der = float(p["merge"].get("force_rows", 1.0)) if v == "gffmerge_force" else 0.0
        merged, info = gffmerge(teachers, _merge_batches(p, systems), ridge=float(p["merge"]["ridge"]), inputs=mode,
                                edge_weighting=p["merge"].get("edge_weighting", True), derivatives=der,
                                seed=ctx.seed, progress=ctx.progress)
        ctx.metrics.scalar(f"{pre}merge_seconds", info.seconds)
        ctx.metrics.scalar(f"{pre}merge_cpu_seconds", info.cpu_seconds)
        ctx.metrics.scalar(f"{pre}align_residual_merged", float(np.mean(list(info.residual_merged.values()))))
        ctx.metrics.scalar(f"{pre}align_residual_average", float(np.mean(list(info.residual_average.values()))))
        if info.derivative_residual_merged:
            ctx.metrics.scalar(f"{pre}align_residual_deriv_merged",
                               float(np.mean(list(info.derivative_residual_merged.values()))))
            ctx.metrics.scalar(f"{pre}align_residual_deriv_average",
                               float(np.mean(list(info.derivative_residual_average.values()))))
        names = list(info.residual_merged)
        ctx.metrics.curve(f"{pre}layer_residual_merged", range(len(names)), [info.residual_merged[n] for n in names])
        ctx.metrics.curve(f"{pre}layer_residual_average", range(len(names)), [info.residual_average[n] for n in names])
        (ctx.outdir / "layers.json").write_text(json.dumps(names))
    else:
        raise ValueError(f"unknown variant '{v}'")

    models = [with_backbone(t, merged) for t in teachers]
    emb, dev = _teacher_deviation(teachers, models, [s["val"] for s in systems])
    ctx.metrics.scalar(f"{pre}embed_err", emb)
    ctx.metrics.scalar(f"{pre}teacher_force_dev", dev)

    if v.endswith("_ft"):
        _record_errors(ctx, systems, models, prefix=f"{pre}pre_ft_")
        steps = max(1, int(round(p["finetune"]["fraction"] * n_joint)))
        ctx.progress(f"[{setting}] fine-tuning {v} for {steps} joint steps ({p['finetune']['fraction']:.0%} of joint)")
        tie(models)
        hist = _multitask(ctx, models, systems, steps, p["finetune"]["lr"], p["finetune"].get("lr_final_factor", 0.1),
                          ctx.seed * 100 + 50, p["finetune"].get("curve_points", 5), curve_name=pre)
        sc = ctx.metrics.scalars
        ctx.metrics.scalar(f"{pre}finetune_seconds", hist["seconds"])
        ctx.metrics.scalar(f"{pre}finetune_cpu_seconds", hist["cpu_seconds"])
        ctx.metrics.scalar(f"{pre}finetune_steps", steps)
        ctx.metrics.scalar(f"{pre}merge_ft_seconds", sc[f"{pre}merge_seconds"] + hist["seconds"])
        if f"{pre}merge_cpu_seconds" in sc:
            ctx.metrics.scalar(f"{pre}merge_ft_cpu_seconds", sc[f"{pre}merge_cpu_seconds"] + hist["cpu_seconds"])
    _record_errors(ctx, systems, models, prefix=pre)


# --- plots -----------------------------------------------------------------------------------------

ORDER = ["individual", "joint", "gffmerge_ft", "gffmerge", "gffmerge_force", "gffmerge_relaxed", "weight_avg_ft",
         "task_arithmetic", "weight_avg"]


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pl = plt()
    tags = [s["tag"] for s in params["systems"]]
    variants = [v for v in ORDER if v in set(table.variant)] + sorted(set(table.variant) - set(ORDER))
    sc = table[table.x.isna()]

    def stat(metric, v):
        g = sc[(sc.metric == metric) & (sc.variant == v)].value
        return (g.mean(), g.std() if len(g) > 1 else 0.0) if len(g) else (np.nan, 0.0)

    # one row per setting of theta_0 present: pre-trained (the paper's), random (our extra row)
    rows = [(pre, name) for name, pre in SETTINGS.items() if (sc.metric == f"{pre}force_mae_mean").any()]
    fig, axes = pl.subplots(len(rows), 2, figsize=(11, 4.2 * len(rows)), squeeze=False)
    for (pre, name), row in zip(rows, axes):
        vs = [v for v in variants if (sc[(sc.variant == v)].metric == f"{pre}force_mae_mean").any()]
        for ax, (kind, unit) in zip(row, (("force", "meV/A"), ("energy", "meV/atom"))):
            width = 0.8 / max(len(tags), 1)
            for j, tag in enumerate(tags):
                ms = [stat(f"{pre}{kind}_mae_{tag}", v) for v in vs]
                ax.bar(np.arange(len(vs)) + (j - (len(tags) - 1) / 2) * width, [m for m, _ in ms], width,
                       yerr=[s for _, s in ms], label=tag, alpha=0.8, capsize=2)
            ax.set_xticks(np.arange(len(vs)))
            ax.set_xticklabels(vs, rotation=30, ha="right", fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel(f"test {kind} MAE ({unit})")
            ax.set_title(f"{kind} MAE per system, {name} theta_0 (mean +- std over seeds)", fontsize=9)
            ax.grid(alpha=0.3, axis="y", which="both")
            ax.legend(fontsize=8)
    save_figure(fig, plots_dir / "mae_per_system.png", dpi=110)

    # wall time: merge (closed form), merge + fine-tune, joint training
    bars = [("gffmerge\nclosed form", "merge_seconds", "gffmerge"),
            ("gffmerge_relaxed", "merge_seconds", "gffmerge_relaxed"),
            ("gffmerge_force", "merge_seconds", "gffmerge_force"),
            ("gffmerge_ft\nmerge + fine-tune", "merge_ft_seconds", "gffmerge_ft"),
            ("joint training", "joint_train_seconds", "joint"),
            ("2 specialists\n(paid once, before)", "specialist_train_seconds", "individual")]
    bars = [(lbl, *stat(m, v)) for lbl, m, v in bars if not np.isnan(stat(m, v)[0])]
    if bars:
        fig, ax = pl.subplots(figsize=(6.5, 3.6))
        ax.barh([b[0] for b in bars], [b[1] for b in bars], xerr=[b[2] for b in bars], color="tab:green", alpha=0.75)
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(right=3 * max(b[1] + b[2] for b in bars))
        ax.set_xlabel("wall seconds (mean +- std over seeds)")
        ax.set_title("Cost: merging vs joint training")
        for i, b in enumerate(bars):
            ax.annotate(f"{b[1]:.2g} s", (b[1] + b[2], i), fontsize=7, xytext=(4, 0), textcoords="offset points",
                        va="center")
        ax.grid(alpha=0.3, axis="x", which="both")
        save_figure(fig, plots_dir / "wall_time.png", dpi=110)

    # learning curves on validation frames: joint from scratch vs fine-tuning from a merge
    curves = [(f"{pre}{m}", unit, name) for name, pre in SETTINGS.items()
              for m, unit in (("val_force_mae", "meV/A"), ("val_energy_mae", "meV/atom"))]
    for metric, unit, name in curves:
        cur = table[(table.metric == metric) & table.x.notna()]
        if cur.empty:
            continue
        fig, ax = pl.subplots(figsize=(5.8, 4))
        for v in [v for v in variants if v in set(cur.variant)]:
            g = cur[cur.variant == v].groupby("x").value
            mean, std = g.mean(), g.std().fillna(0.0)
            ax.plot(mean.index, mean.values, marker="o", ms=3, label=v)
            ax.fill_between(mean.index, np.maximum(mean - std, mean * 1e-2), mean + std, alpha=0.15)
        ax.set_yscale("log")
        ax.set_xlabel("optimizer steps (one batch per system each)")
        ax.set_ylabel(f"{metric.replace('rand_', '').replace('_', ' ')} ({unit}), mean of systems")
        ax.set_title(f"Joint training from {name} theta_0 vs fine-tuning a merge", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        save_figure(fig, plots_dir / f"curve_{metric}.png", dpi=110)

    # per-layer alignment residual, closed form vs weight average
    cur = table[table.metric.isin(["layer_residual_merged", "layer_residual_average"]) & table.x.notna()]
    if not cur.empty:
        fig, ax = pl.subplots(figsize=(6.4, 4.4))
        for v in [v for v in ("gffmerge", "gffmerge_relaxed", "gffmerge_force") if v in set(cur.variant)]:
            g = cur[(cur.variant == v) & (cur.metric == "layer_residual_merged")].groupby("x").value.mean()
            ax.semilogy(g.index, g.values, "-", marker="o", ms=3, label=f"{v}: closed form")
        g = cur[(cur.variant == "gffmerge") & (cur.metric == "layer_residual_average")].groupby("x").value.mean()
        if not g.empty:
            ax.semilogy(g.index, g.values, "k:", marker="o", ms=3, label="weight average (gffmerge's inputs)")
        n_blocks = int(params.get("model", {}).get("n_interactions", 0))
        parts = ("in2f", "filter1", "filter2", "f2out", "dense")
        names = ["embedding"] + [f"{t}.{n}" for t in range(n_blocks) for n in parts]
        if len(names) == int(cur.x.max()) + 1:
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
        ax.set_xlabel("layer (forward order)")
        ax.set_ylabel("relative alignment residual")
        ax.set_title("Layer-wise embedding alignment (pre-trained theta_0)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        save_figure(fig, plots_dir / "curve_layer_residual_merged.png", dpi=110)
