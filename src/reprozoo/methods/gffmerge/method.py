"""GFFMERGE in miniature: two SchNet force fields fine-tuned on different EMT systems, merged.

theta_0, the shared starting point, in one or two settings (configs' ``settings``; metric prefix):
  pretrained  (no prefix; the paper's setting) a foundation-model stand-in: one SchNet pre-trained
              on a DISJOINT EMT chemistry, small periodic alloy cells of ``md_emt_alloy_pool``
              (structures made only of the targets' elements, Cu and Pt, left out), which the
              target systems (a 108-atom Cu bulk MD, a Pt147 cluster MD) never saw. Each system
              gets a copy with its own reference energies (atomref, fitted on its training frames).
  random      (prefix ``rand_``; an extra row, off at smoke) theta_0 = a random initialisation.

train_shared (per seed): the foundation (pre-trained once per job, written to the seed's own
shared folder), then for each setting theta_0 and one specialist per system fine-tuned from
theta_0 on that system only (Cu bulk, Pt cluster), each by its own run of the shared rule; every
variant of the seed merges these same models. Validation curves of the pre-training and of the specialists
are kept and recorded in every variant that builds on them, for the convergence gate.

train (per variant x seed), for each setting, evaluated on each system's test frames with that
system's head:
  individual       each specialist on its own system (reference, no sharing)
  weight_avg       backbone = mean of the two specialists' backbones
  task_arithmetic  theta_0 + lambda * sum_k (theta_k - theta_0), lambda picked on validation frames
  gffmerge         the GNNMerge++ code rule (teacher inputs, layer-wise least squares) transferred
                   to SchNet: each teacher's own layer inputs, a fixed 1e-6 x I added to X^T X (ours:
                   the public code has no ridge), no prior (merge.py, inputs=teacher,
                   ridge_mode=absolute; configs' merge.published). Mathematically RegMean with
                   per-system weighting (merge.py's docstring; a test checks it)
  gffmerge_ft      gffmerge, then a joint fine-tune until its validation curve is flat
  gffmerge_seq     the same rule with the merged model's own layer inputs (inputs=sequential, layers
                   solved in forward order), the same fixed 1e-6 x I, plain rows, no prior, no grid
                   (configs' merge.seq): isolates the input choice from our other additions
  gffmerge_seq_ft  gffmerge_seq, then the same joint fine-tune (the initialisation claims on a
                   closed form that works)
  gffmerge_ours    our variant: merged-model inputs (inputs=sequential), a ridge towards the weight
                   average chosen on validation from merge.ridge_grid, edge rows weighted
  weight_avg_ft    weight_avg, then the same fine-tune (is the merge a better starting point?)
  null_merge       theta_0's backbone under each specialist's head: a merge that does nothing (the
                   negative control of the "beats the baselines" claims)
  joint            one backbone + two heads trained from theta_0 on both systems until flat
                   (the gold standard; trained in train_shared, whose converged validation error
                   sets the fine-tunes' accuracy target)
The specialists, joint training and the three fine-tunes train by the platform's one rule
(``blocks.fitting.fit_to_plateau`` via ``multitask.fit_rule``, configs' ``fit``: the config's ``lr``
table rate, chosen once on seed 0's validation (``pilot_rates.py``; without a table entry the rate
grid piloted on validation), held to a plateau, one drop, a second plateau), so the
method and every baseline that trains share the grid, the rule and the caps; wall times of joint
training and fine-tunes are the whole fits'. The foundation's pre-training (recorded, not gated)
keeps this folder's loop (``_train_until_flat``: cosine decay over 70 % of a cap then held, stopped
at the gate's own plateau test). Metrics: energy MAE (meV/atom) and force MAE (meV/A) per system and their
means, the means also per test frame (``ctx.metrics.units``: the claims' intervals resample
frames); merge, fine-tune and joint-training wall times; per-layer alignment residuals. The
fine-tunes are also scored after a fixed budget of ``finetune.budget_steps`` steps (``budget_*``,
per test frame) and record their steps to a validation force MAE within ``finetune.target_factor``
of joint training's best (both curves smoothed over ``finetune.smooth_points`` validations) and the
CPU time to it at the seed's one CPU cost per step (``steps_to_target``, ``time_to_target`` = merge
CPU + steps x joint training's CPU per step; joint training's own: ``joint_steps_to_target``,
``joint_time_to_target``).
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

# fixed closed-form rules (no grid, no prior; configs' merge.<rule>): the GNNMerge++ code rule on
# each teacher's own layer inputs (merge.published) and the same rule on the merged model's inputs
# (merge.seq); our variant (merged-model inputs, a prior towards the weight average, the ridge
# chosen on validation). ``gffmerge_ours_force`` (force-aware rows) is no longer run (no claim read it).
VARIANTS_FIXED = {"gffmerge": "published", "gffmerge_ft": "published", "gffmerge_seq": "seq", "gffmerge_seq_ft": "seq"}
VARIANTS_PUBLISHED = ("gffmerge", "gffmerge_ft")
VARIANTS_OURS = ("gffmerge_ours", "gffmerge_ours_force")
VARIANTS_MERGE = tuple(VARIANTS_FIXED) + VARIANTS_OURS
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
        raise KeyError(f"config dataset '{name}' is not among the spec's datasets at scale '{ctx.scale}' "
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


def load_systems(ctx) -> list[dict]:
    """Per system: {'tag', 'train', 'val', 'test', 'merge'} AtomsData, the same for every variant
    of a seed (frames drawn from the dataset's own splits with a seed-dependent generator). Every
    system gets the same number of test frames, so the per-frame units of the mean over systems
    have the same mean as the per-system MAEs' mean."""
    from reprozoo.data.md import load

    p = ctx.params
    cutoff = p["model"]["cutoff"]
    out = []
    for k, sysc in enumerate(p["systems"]):
        frames = load(_dataset_dir(ctx, sysc["dataset"]))
        split = frames.table["split"].to_numpy() if frames.table is not None else None
        rng = np.random.default_rng([ctx.seed, 7919, k])
        parts = {}
        for name in ("train", "val", "test"):
            idx = np.flatnonzero(split == name) if split is not None else np.arange(len(frames))
            n = p[f"n_{name}"]
            if name == "test" and n and n > len(idx):
                raise ValueError(f"{sysc['dataset']}: n_test = {n} exceeds the {len(idx)} frames of its test split")
            perm = rng.permutation(idx)
            parts[name] = np.sort(perm[:n]) if n and n < len(idx) else idx
        merge_idx = parts["train"][np.sort(rng.permutation(len(parts["train"]))[:p["n_merge"]])]
        entry = {"tag": sysc["tag"], "dataset": sysc["dataset"]}
        for name, idx in [*parts.items(), ("merge", merge_idx)]:
            entry[name] = _atoms_data(frames, idx, cutoff)
            entry[name].precompute()
        out.append(entry)
    return out


def pool_indices(frames, pc: dict, seed: int) -> dict:
    """Pre-training and validation structures of the foundation stand-in: the pool's own train and
    val splits, without the structures made only of ``exclude_only`` elements (the targets'
    chemistry), ``n_train`` / ``n_val`` drawn with a seed-dependent generator."""
    from ase.data import atomic_numbers

    excl = {atomic_numbers[e] for e in pc.get("exclude_only", [])}
    keep = np.array([not set(frames.numbers_of(i).tolist()) <= excl for i in range(len(frames.table))]) \
        if excl else np.ones(len(frames), bool)
    split = frames.table["split"].to_numpy()
    rng = np.random.default_rng([seed, 104729])
    out = {}
    for name in ("train", "val"):
        idx = rng.permutation(np.flatnonzero((split == name) & keep))
        n = int(pc[f"n_{name}"])
        if n > len(idx):
            raise ValueError(f"{pc['dataset']}: n_{name} = {n} exceeds the {len(idx)} usable structures of its {name} split")
        out[name] = np.sort(idx[:n])
    return out


def load_pool(ctx) -> dict:
    """The foundation stand-in's pre-training data (``pretrain.dataset``, see :func:`pool_indices`),
    drawn with ``pretrain.seed``."""
    from reprozoo.data.md import load

    p = ctx.params
    pc = p["pretrain"]
    frames = load(_dataset_dir(ctx, pc["dataset"]))
    idx = pool_indices(frames, pc, int(pc.get("seed", 0)))  # the foundation does not depend on the run's seed
    return {name: _atoms_data(frames, ix, p["model"]["cutoff"]).precompute() for name, ix in idx.items()}


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


def _stop_rule(p: dict, part: str) -> dict:
    """The stopping rule of the foundation's pre-training (the gated trainings use the shared rule):
    the gate's plateau test (tolerance ``stop.tol``, at least ``stop.min_points`` validations in
    the last 30 %) with no new best in that tail, not before the part's ``min_steps``."""
    st = p.get("stop", {})
    return {"tol": float(st.get("tol", 0.02)), "min_points": int(st.get("min_points", 6)),
            "min_steps": int(p[part].get("min_steps", 0))}


def _train_until_flat(ctx, models, trains: list, vals: list, part: str, seed: int, after_step=None) -> dict:
    """Train ``models`` (tied: one backbone with a head per system; untied: independent models
    side by side; one: plain training) with the ``part`` config (lr, lr_final_factor, decay_frac,
    or decay_steps, max_steps, eval_every, min_steps, batch_size) until the mean validation force MAE is flat
    (``_stop_rule``) or ``max_steps``. The foundation's pre-training goes through this loop
    (``multitask.fit_multitask``: Adam, cosine decay to ``lr_final_factor`` x lr over
    ``decay_frac`` x ``max_steps``, then held), so all share the schedule and the stopping rule.
    Returns the history with ``curve`` = {x, force (meV/A, mean of systems), energy (meV/atom),
    lr}. Used by the foundation's pre-training only (every gated training uses :func:`fit_models`)."""
    from .multitask import fit_multitask

    p = ctx.params
    c = p[part]
    hist = fit_multitask(models, trains, int(c["max_steps"]), float(c["lr"]),
                         int(c.get("batch_size", p["train"]["batch_size"])), float(c.get("lr_final_factor", 0.12)),
                         p["train"].get("energy_weight", 1.0), p["train"].get("force_weight", 10.0), seed=seed,
                         vals=vals, eval_every=int(c["eval_every"]), stop=_stop_rule(p, part), progress=ctx.progress,
                         decay_frac=float(c["decay_steps"]) / int(c["max_steps"]) if "decay_steps" in c
                         else float(c.get("decay_frac", 1.0)), after_step=after_step)
    hist["curve_dict"] = {
        "x": [int(st) for st, _, _ in hist["curve"]],
        "force": [1e3 * float(np.mean([r["force_mae"] for r in ev])) for _, ev, _ in hist["curve"]],
        "energy": [1e3 * float(np.mean([r["energy_mae_per_atom"] for r in ev])) for _, ev, _ in hist["curve"]],
        "lr": [float(lr) for _, _, lr in hist["curve"]]}
    return hist


FIT_KEYS = ("lr_grid", "pilot_steps", "eval_every", "min_steps", "max_steps", "flat_tol", "lr_drop", "pilot_score",
            "patience", "ema_decay", "clip", "optimizer", "weight_decay")


def fit_config(p: dict, part: str) -> dict:
    """The shared rule's config (``blocks.fitting``) of a training part (``train``: the specialists,
    ``joint``, ``finetune``): the config's common ``fit`` block (one rate grid and one stopping rule
    for every training) with the part's own step floor and cap (and any other ``fit`` key the part
    overrides)."""
    c = {**p["fit"], **{k: v for k, v in p[part].items() if k in FIT_KEYS}}
    missing = [k for k in ("lr_grid", "pilot_steps", "eval_every", "min_steps", "max_steps", "flat_tol") if k not in c]
    if missing:
        raise KeyError(f"fit config of '{part}': missing {missing} (configs' `fit` block or `{part}`)")
    return c


def rate_keys(part: str, tag: str | None = None) -> tuple:
    """The config ``lr`` table's path of a training part's rate: ``specialist.<system tag>``, ``joint``,
    ``finetune`` (one rate for the three fine-tunes, whatever their start)."""
    return ("specialist", str(tag)) if part == "train" else (part,)


def effective_fit(p: dict, part: str, tag: str | None = None) -> tuple[dict, dict]:
    """(the shared rule's config of ``part``, the rate's source): with an entry in the config's ``lr``
    table (``blocks.rate_table``: chosen once on seed 0's validation, ``pilot_rates.py``) a one-rate
    grid, so the rule runs no pilots; without one the part's grid, piloted in every fit."""
    from reprozoo.blocks.rate_table import fit_with_table_rate

    return fit_with_table_rate(fit_config(p, part), p.get("lr"), *rate_keys(part, tag), required=False)


def pilot_overhead(fit: dict) -> int:
    """Optimiser steps a fit spends on the rates it does not keep: (rates - 1) x pilot steps (0 for a
    table rate, whose one-rate grid pilots nothing)."""
    return (len(fit["lr_grid"]) - 1) * int(fit["pilot_steps"])


def fit_models(ctx, models, systems, part: str, seed: int, label: str, after_step=None,
               tag: str | None = None) -> tuple[list, dict]:
    """Train ``models`` (one specialist, or tied models with a head per system) on ``systems`` by the
    platform's shared rule (:func:`multitask.fit_rule`, config :func:`effective_fit` of ``part``: the
    ``lr`` table's rate where the config has one, else the grid piloted); returns (models, record).
    The record's ``curve_dict`` holds the chosen run's validation curves (``x``, ``force`` meV/A and
    ``energy`` meV/atom, means over the systems, ``lr``); ``fit`` the config it ran, ``lr_source``
    and ``lr_edge`` (a table rate's edge on the configured grid)."""
    from reprozoo.blocks.rate_table import stamp_source

    from .multitask import fit_rule

    p = ctx.params
    fit, source = effective_fit(p, part, tag)
    how = (f"table rate {fit['lr_grid'][0]:g}" if source["lr_source"] == "table"
           else f"rate grid {fit['lr_grid']} piloted {fit['pilot_steps']} steps")
    ctx.progress(f"{label}: {how}, then until flat (at least {fit['min_steps']}, at most {fit['max_steps']} steps)")
    models, rec = fit_rule(models, [s["train"] for s in systems], [s["val"] for s in systems], fit, seed,
                           batch_size=int(p["train"]["batch_size"]), energy_weight=p["train"].get("energy_weight", 1.0),
                           force_weight=p["train"].get("force_weight", 10.0), label=label, progress=ctx.progress,
                           after_step=after_step)
    stamp_source(rec, source)
    rec["fit"] = fit
    rec["curve_dict"] = {"x": [int(x) for x in rec["steps"]], "force": [float(v) for v in rec["vals"]],
                         "energy": [float(v) for v in rec["curves"]["energy"]], "lr": [float(v) for v in rec["lrs"]]}
    return models, rec


def _log_rule(ctx, name: str, rec: dict) -> None:
    """The shared rule's scalars of one fit: chosen rate, steps, the drop's gain, the grid edge flag."""
    ctx.metrics.scalar(f"lr_chosen_{name}", float(rec["lr"]))
    ctx.metrics.scalar(f"steps_{name}", float(rec["stop"]))
    ctx.metrics.scalar(f"plateau_{name}", float(bool(rec["plateau"])))
    ctx.metrics.scalar(f"lr_edge_{name}", {None: 0.0, "bottom": -1.0, "top": 1.0}[rec["lr_edge"]])
    ctx.metrics.scalar(f"lr_table_{name}", float(rec.get("lr_source") == "table"))
    if rec.get("drop_gain") is not None:
        ctx.metrics.scalar(f"drop_gain_{name}", float(rec["drop_gain"]))


def _multitask(ctx, models, systems, part: str, seed: int, curve_name: str | None = None, after_step=None):
    """Joint training / fine-tuning of the tied ``models`` on ``systems`` (``part`` = ``joint`` or
    ``finetune``) by the shared rule; records the chosen run's validation curves (force and energy
    MAE, mean of systems) and its learning rate as ``{curve_name}val_force_mae`` etc."""
    models, rec = fit_models(ctx, models, systems, part, seed, label=part, after_step=after_step)
    if curve_name is not None:
        c = rec["curve_dict"]
        ctx.metrics.curve(f"{curve_name}val_force_mae", c["x"], c["force"])
        ctx.metrics.curve(f"{curve_name}val_energy_mae", c["x"], c["energy"])
        ctx.metrics.curve(f"{curve_name}lr", c["x"], c["lr"])
        _log_rule(ctx, f"{curve_name}{part}", rec)
    return models, rec


# --- shared per seed: theta_0 of each setting and its two specialists ------------------------------

def _refit_reference_energies(model, data) -> None:
    """A pre-trained model adapted to a system: per-element reference energies (atomref, e_mean)
    refitted on the system's training frames, the output scale (e_std) of the pre-training kept."""
    from reprozoo.blocks.atomistic import fit_energy_scale

    std = model.e_std.clone()
    fit_energy_scale(model, data)
    model.e_std.copy_(std)


def pretrain_foundation(ctx, pool: dict) -> tuple:
    """The foundation stand-in: a SchNet (seed ``pretrain.seed``, the same for every seed of the
    run, as one published checkpoint would be; own energy scale) trained on the pool by the same
    loop and stopping rule as every other training here (``_train_until_flat``, config
    ``pretrain``) until its validation force MAE is flat; returns (model, curve, hist)."""
    from reprozoo.blocks.atomistic import fit_energy_scale

    p = ctx.params
    pc = p["pretrain"]
    seed = int(pc.get("seed", 0))
    m = new_model(p, seed)
    fit_energy_scale(m, pool["train"])
    ctx.progress(f"pre-training the foundation stand-in on {len(pool['train'])} {pc['dataset']} structures "
                 f"(targets' chemistry left out) until flat, at most {pc['max_steps']} steps of batch {pc['batch_size']}")
    hist = _train_until_flat(ctx, [m], [pool["train"]], [pool["val"]], "pretrain", seed * 100 + 70)
    c = hist["curve_dict"]
    return m, {"x": c["x"], "force": c["force"], "lr": c["lr"]}, hist


def _foundation_key(ctx) -> str:
    """What the foundation model depends on: its config, the model, the loss weights, the pool's
    data card and this method's code."""
    import hashlib

    from reprozoo.codehash import method_code_hash

    p = ctx.params
    card = (_dataset_dir(ctx, p["pretrain"]["dataset"]) / "card.json")
    blob = json.dumps({"pretrain": p["pretrain"], "model": p["model"],
                       "w": [p["train"].get("energy_weight", 1.0), p["train"].get("force_weight", 10.0)],
                       "card": card.read_text() if card.exists() else "", "code": method_code_hash("gffmerge")},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# foundation models pre-trained in this process, by key: at ci/smoke every seed's train_shared
# runs in one job (train_batch), which pre-trains once; at paper scale each seed's train_shared
# job pre-trains its own (deterministic: the same model). Nothing is shared through files, so
# no job reads what another job writes without declaring it.
_FOUNDATIONS: dict[str, tuple] = {}


def foundation(ctx) -> tuple:
    """The foundation model and its record ({curve, seconds, cpu_seconds, steps, stopped, key}),
    written into this seed's shared folder (``foundation.pt``, ``pretrain.json``: outputs of the
    seed's train_shared job). It does not depend on the seed: pre-trained once per process and
    reused by later seeds of the same process (``reused`` in the record)."""
    torch = _torch()
    key = _foundation_key(ctx)
    if key in _FOUNDATIONS:
        state, info = _FOUNDATIONS[key]
        m = new_model(ctx.params, 0)
        m.load_state_dict(state)
        info = {**info, "reused": True}
        ctx.progress(f"foundation stand-in {key}: pre-trained earlier in this job, reused")
    else:
        m, curve, hist = pretrain_foundation(ctx, load_pool(ctx))
        info = {"curve": curve, "seconds": hist["seconds"], "cpu_seconds": hist["cpu_seconds"], "steps": hist["steps"],
                "stopped": bool(hist["stopped"]), "key": key, "reused": False}
        _FOUNDATIONS[key] = ({k: v.clone() for k, v in m.state_dict().items()}, info)
    torch.save(m.state_dict(), ctx.outdir / "foundation.pt")
    (ctx.outdir / "pretrain.json").write_text(json.dumps(info))
    return m.eval(), info


def _theta0(ctx, setting: str, systems: list[dict], init, foundation=None) -> list:
    """theta_0 of a setting, one model per system (the same backbone and head values, own
    reference energies fitted on that system's training frames). ``pretrained``: copies of the
    ``foundation`` model (its output scale kept); ``random``: copies of ``init`` (energy scale
    fitted per system)."""
    from reprozoo.blocks.atomistic import fit_energy_scale

    if setting == "random":
        models = [copy.deepcopy(init) for _ in systems]
        for m, s in zip(models, systems):
            fit_energy_scale(m, s["train"])
        return models
    if foundation is None:
        raise ValueError("the pretrained setting needs the foundation model")
    models = [copy.deepcopy(foundation) for _ in systems]
    for m, s in zip(models, systems):
        _refit_reference_energies(m, s["train"])
    return models


def cpu_per_step(rec: dict, fit: dict) -> float:
    """CPU seconds per optimiser step of a fit by the shared rule (``fit``: the config it ran): its
    whole CPU time (the rate grid's pilots, if any, and every validation included) over every step it
    ran (the chosen run's steps and the other rates' pilots)."""
    n = int(rec["stop"]) + pilot_overhead(fit)
    return float(rec["cpu_seconds"]) / max(n, 1)


def train_shared(ctx) -> None:
    torch = _torch()
    import pickle

    from reprozoo.blocks.atomistic import evaluate

    from .multitask import tie

    p = ctx.params
    sets = settings(p)
    systems = load_systems(ctx)
    (ctx.outdir / "systems.pkl").write_bytes(pickle.dumps(systems))
    init = new_model(p, ctx.seed)
    found = None
    if "pretrained" in sets:
        found, info = foundation(ctx)
        ctx.metrics.scalar("pretrain_seconds", info["seconds"])
        ctx.metrics.scalar("pretrain_steps", info["steps"])
    for setting in sets:
        pre = SETTINGS[setting]
        theta0 = _theta0(ctx, setting, systems, init, found)
        for s, m0 in zip(systems, theta0):
            torch.save(m0.state_dict(), ctx.outdir / f"init_{setting}_{s['tag']}.pt")
        # the two specialists, each fine-tuned from theta_0 on its own system alone by the shared
        # rule (its own rate from the grid, its own plateau, drop and stop)
        info = {"train_seconds": 0.0, "train_cpu_seconds": 0.0, "steps": 0, "stopped": True, "curves": [],
                "systems": {}}
        for k, (s, m0) in enumerate(zip(systems, theta0)):
            (m,), rec = fit_models(ctx, [copy.deepcopy(m0)], [s], "train", ctx.seed * 100 + 10 + k,
                                   label=f"[{setting}] specialist {s['tag']}", tag=s["tag"])
            torch.save(m.state_dict(), ctx.outdir / f"specialist_{setting}_{s['tag']}.pt")
            ev = evaluate(m, s["val"])
            info["systems"][s["tag"]] = {"val_force_mae": ev["force_mae"], "val_energy_mae_per_atom": ev["energy_mae_per_atom"],
                                         "lr": float(rec["lr"]), "steps": int(rec["stop"]), "plateau": bool(rec["plateau"]),
                                         "drop_gain": rec["drop_gain"], "lr_edge": rec["lr_edge"]}
            info["curves"].append(rec["curve_dict"])
            info["train_seconds"] += rec["seconds"]
            info["train_cpu_seconds"] += rec["cpu_seconds"]
            info["steps"] += int(rec["stop"])
            info["stopped"] = info["stopped"] and bool(rec["plateau"])
            ctx.metrics.scalar(f"{pre}specialist_val_force_mae_{s['tag']}", 1e3 * ev["force_mae"])
            _log_rule(ctx, f"{pre}specialist{k}", rec)
        ctx.metrics.scalar(f"{pre}specialist_train_seconds", info["train_seconds"])
        ctx.metrics.scalar(f"{pre}specialist_steps", info["steps"])
        (ctx.outdir / f"specialists_{setting}.json").write_text(json.dumps(info, indent=1))
        # joint training (the gold standard) from theta_0, here so that every variant of the seed
        # reads its converged validation error: the fine-tunes' accuracy target (time_to_target)
        models, rec = fit_models(ctx, tie([copy.deepcopy(m0) for m0 in theta0]), systems, "joint",
                                 ctx.seed * 100 + 90, label=f"[{setting}] joint")
        for s, m in zip(systems, models):
            torch.save(m.state_dict(), ctx.outdir / f"joint_{setting}_{s['tag']}.pt")
        c = rec["curve_dict"]
        # the accuracy target: target_factor x the best of joint training's SMOOTHED validation curve
        # (trailing mean over finetune.smooth_points validations: a single noisy minimum no longer sets
        # it), and joint training's own steps to it on the same smoothed curve
        k = smooth_points(p)
        xs, fs = _after_start(c)
        target = float(p["finetune"].get("target_factor", 1.1)) * float(min(smoothed(fs, k)))
        hit = steps_to_target(xs, smoothed(fs, k), target)
        hit = int(rec["stop"]) if hit is None else hit  # (only if the best were the start itself)
        # the seed's ONE CPU cost per optimiser step of this architecture and batch (joint training's
        # whole fit over its steps): joint training and every fine-tune are timed with it, so the
        # time-to-target ratios are ratios of step counts (plus the merge in step-equivalents)
        per_step = cpu_per_step(rec, rec["fit"])
        over = pilot_overhead(rec["fit"])
        jinfo = {"curve_dict": c, "lr": float(rec["lr"]), "stop": int(rec["stop"]), "plateau": bool(rec["plateau"]),
                 "lr_edge": rec["lr_edge"], "lr_source": rec["lr_source"], "drop_gain": rec["drop_gain"],
                 "seconds": rec["seconds"], "cpu_seconds": rec["cpu_seconds"], "cpu_per_step": per_step,
                 "target_force_mae": target, "steps_to_target": int(hit), "pilot_steps": over,
                 "time_to_target": time_to_target(0.0, hit, over, per_step)}
        (ctx.outdir / f"joint_{setting}.json").write_text(json.dumps(jinfo, indent=1))
        ctx.metrics.scalar(f"{pre}joint_train_seconds", rec["seconds"])


# --- per variant ------------------------------------------------------------------------------------

def _record_errors(ctx, systems, models, prefix: str = "") -> dict:
    """Test MAEs per system and their mean over systems; the means also per test frame (units in
    the order cu frames, pt frames; equal counts per system, so the unit mean is the mean of
    the per-system MAEs)."""
    from .multitask import evaluate_frames

    res = [evaluate_frames(m, s["test"]) for m, s in zip(models, systems)]
    if len({len(r["force_mae"]) for r in res}) != 1:
        raise ValueError("every system needs the same number of test frames (per-frame units of the mean)")
    e = [1e3 * float(np.mean(r["energy_ae_per_atom"])) for r in res]
    f = [1e3 * float(np.mean(r["force_mae"])) for r in res]
    for s, ei, fi in zip(systems, e, f):
        ctx.metrics.scalar(f"{prefix}energy_mae_{s['tag']}", ei)
        ctx.metrics.scalar(f"{prefix}force_mae_{s['tag']}", fi)
    ctx.metrics.units(f"{prefix}energy_mae_mean", 1e3 * np.concatenate([r["energy_ae_per_atom"] for r in res]))
    ctx.metrics.units(f"{prefix}force_mae_mean", 1e3 * np.concatenate([r["force_mae"] for r in res]))
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


def _record_shared_curves(ctx, setting: str, with_specialists: bool) -> None:
    """The curves of the shared training this variant builds on, for the convergence gate:
    the foundation pre-training (``pretrain_val_force_mae``, ``pretrain_lr``; recorded, not gated)
    and each specialist's (``{pre}specialist{k}_val_force_mae`` and ``{pre}specialist{k}_lr``, k the
    system's index in the config)."""
    sd = Path(ctx.shared_dir)
    pre = SETTINGS[setting]
    if setting == "pretrained" and (sd / "pretrain.json").exists():
        c = json.loads((sd / "pretrain.json").read_text())["curve"]
        ctx.metrics.curve("pretrain_val_force_mae", c["x"], c["force"])
        ctx.metrics.curve("pretrain_lr", c["x"], c["lr"])
    if with_specialists:
        info = json.loads((sd / f"specialists_{setting}.json").read_text())
        for k, c in enumerate(info["curves"]):
            ctx.metrics.curve(f"{pre}specialist{k}_val_force_mae", c["x"], c["force"])
            ctx.metrics.curve(f"{pre}specialist{k}_lr", c["x"], c["lr"])
        for k, (tag, r) in enumerate(info["systems"].items()):
            ctx.metrics.scalar(f"{pre}lr_chosen_specialist{k}", r["lr"])
            ctx.metrics.scalar(f"{pre}steps_specialist{k}", r["steps"])


def train(ctx) -> None:
    p = ctx.params
    systems = _cached_systems(ctx)
    for setting in settings(p):
        only = p.get("setting_variants", {}).get(setting)
        if only is None or ctx.variant in only:
            _train_setting(ctx, setting, systems)


def _train_setting(ctx, setting: str, systems: list[dict]) -> None:
    """One variant in one setting of theta_0; metrics carry the setting's prefix."""
    from .merge import backbone_state, gffmerge, gffmerge_select_ridge, task_arithmetic, weight_average, with_backbone
    from .multitask import evaluate_systems, tie

    p = ctx.params
    v = ctx.variant
    pre = SETTINGS[setting]
    sd = Path(ctx.shared_dir)
    theta0 = [load_model(p, sd / f"init_{setting}_{s['tag']}.pt") for s in systems]
    teachers = [load_model(p, sd / f"specialist_{setting}_{s['tag']}.pt") for s in systems]
    _record_shared_curves(ctx, setting, with_specialists=v != "joint")

    if v == "individual":
        _record_errors(ctx, systems, teachers, prefix=pre)
        _record_errors(ctx, systems, theta0, prefix=f"{pre}theta0_")  # theta_0 itself, before any fine-tuning
        info = json.loads((sd / f"specialists_{setting}.json").read_text())
        ctx.metrics.scalar(f"{pre}specialist_train_seconds", info["train_seconds"])
        ctx.metrics.scalar(f"{pre}specialist_steps", info["steps"])
        return

    if v == "joint":  # trained in train_shared (its validation error is the fine-tunes' target)
        rec = json.loads((sd / f"joint_{setting}.json").read_text())
        models = [load_model(p, sd / f"joint_{setting}_{s['tag']}.pt") for s in systems]
        c = rec["curve_dict"]
        ctx.metrics.curve(f"{pre}val_force_mae", c["x"], c["force"])
        ctx.metrics.curve(f"{pre}val_energy_mae", c["x"], c["energy"])
        ctx.metrics.curve(f"{pre}lr", c["x"], c["lr"])
        _log_rule(ctx, f"{pre}joint", rec)
        ctx.metrics.scalar(f"{pre}joint_train_seconds", rec["seconds"])
        ctx.metrics.scalar(f"{pre}joint_train_cpu_seconds", rec["cpu_seconds"])
        ctx.metrics.scalar(f"{pre}joint_steps", rec["stop"])
        ctx.metrics.scalar(f"{pre}joint_cpu_per_step", rec["cpu_per_step"])
        ctx.metrics.scalar(f"{pre}joint_target_force_mae", rec["target_force_mae"])
        ctx.metrics.scalar(f"{pre}joint_steps_to_target", rec["steps_to_target"])
        ctx.metrics.scalar(f"{pre}joint_time_to_target", rec["time_to_target"])
        _record_errors(ctx, systems, models, prefix=pre)
        return

    states = [backbone_state(t) for t in teachers]
    reps = int(p["merge"].get("timing_repeats", 3))
    if v == "null_merge":
        # the negative control of the merge claims: a merge that does nothing, theta_0's backbone
        # under each specialist's head and energy scale (what the merges improve on)
        merged = backbone_state(theta0[0])
        ctx.metrics.scalar(f"{pre}merge_cpu_seconds", 0.0)
    elif v in ("weight_avg", "weight_avg_ft"):
        merged, secs, cpus = _timed(lambda: weight_average(states), reps)
        ctx.metrics.scalar(f"{pre}merge_seconds", secs)
        ctx.metrics.scalar(f"{pre}merge_cpu_seconds", cpus)
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
    elif v in VARIANTS_FIXED:
        # a fixed closed-form rule: the GNNMerge++ code rule (teacher inputs; merge.published) or the
        # same with the merged model's inputs (merge.seq); a fixed ridge (1e-6) added to the normalised
        # X^T X, no prior, plain rows; no grid, no tuning
        rule = VARIANTS_FIXED[v]
        pub = published_rule(p, rule)
        batches = _merge_batches(p, systems)
        (merged, info), secs, cpus = _timed(lambda: gffmerge(teachers, batches, seed=ctx.seed, **pub), reps)
        ctx.progress(f"[{setting}] {v}: fixed rule '{rule}' {pub}")
        ctx.metrics.scalar(f"{pre}ridge_chosen", float(pub["ridge"]))
        ctx.metrics.scalar(f"{pre}merge_seconds", secs)
        ctx.metrics.scalar(f"{pre}merge_cpu_seconds", cpus)
    elif v in VARIANTS_OURS:
        der = float(p["merge"].get("force_rows", 1.0)) if v == "gffmerge_ours_force" else 0.0
        # the ridge: chosen from merge.ridge_grid (fixed in the config before any measurement) on the
        # same validation frames and loss that pick task arithmetic's lambda; a single `ridge` only
        # where no grid is given
        grid = [float(r) for r in p["merge"].get("ridge_grid", [p["merge"].get("ridge", 1e-6)])]
        batches = _merge_batches(p, systems)
        kw = dict(inputs=p["merge"].get("inputs", "sequential"), edge_weighting=p["merge"].get("edge_weighting", True),
                  derivatives=der, seed=ctx.seed)

        def val_loss(st):
            res = evaluate_systems([with_backbone(t, st) for t in teachers], [s["val"] for s in systems])
            return float(np.mean([r["loss"] for r in res]))

        gffmerge(teachers, batches, ridge=grid[0], **kw)  # warm-up (untimed): the timing below is one selection
        merged, info, ridge, losses = gffmerge_select_ridge(teachers, batches, grid, val_loss, **kw)
        for r in grid:
            ctx.progress(f"[{setting}] {v} ridge={r:g}: val loss {losses[r]:.4g}")
        ctx.progress(f"[{setting}] {v}: ridge {ridge:g} chosen on validation")
        ctx.metrics.scalar(f"{pre}ridge_chosen", ridge)
        ctx.metrics.scalar(f"{pre}ridge_grid_size", len(grid))
        ctx.metrics.scalar(f"{pre}merge_seconds", info.seconds)
        ctx.metrics.scalar(f"{pre}merge_cpu_seconds", info.cpu_seconds)
    if v in VARIANTS_MERGE:
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
    elif v not in ("weight_avg", "weight_avg_ft", "task_arithmetic", "null_merge"):
        raise ValueError(f"unknown variant '{v}'")
    if v in VARIANTS_MERGE:
        # the closed form's cost against joint training (diagnostics, not claims: a millisecond closed
        # form is faster than an 800-step floor by construction; tests/test_gffmerge.py checks it)
        jrec = json.loads((sd / f"joint_{setting}.json").read_text())
        cpu = ctx.metrics.scalars[f"{pre}merge_cpu_seconds"]
        ctx.metrics.scalar(f"{pre}merge_step_equiv", cpu / float(jrec["cpu_per_step"]))
        ctx.metrics.scalar(f"{pre}merge_speedup_x", float(jrec["cpu_seconds"]) / max(cpu, 1e-9))

    models = [with_backbone(t, merged) for t in teachers]
    emb, dev = _teacher_deviation(teachers, models, [s["val"] for s in systems])
    ctx.metrics.scalar(f"{pre}embed_err", emb)
    ctx.metrics.scalar(f"{pre}teacher_force_dev", dev)

    if v.endswith("_ft"):
        _record_errors(ctx, systems, models, prefix=f"{pre}pre_ft_")
        ctx.progress(f"[{setting}] fine-tuning {v} until flat (at most {p['finetune']['max_steps']} steps)")
        tie(models)
        # the fixed fine-tuning budget (configs' finetune.budget_steps, stated before any
        # measurement): test errors after exactly that many steps, the same for both starts
        budget = int(p["finetune"]["budget_steps"])
        if not 1 <= budget <= int(p["finetune"]["max_steps"]):
            raise ValueError("finetune.budget_steps must lie in [1, finetune.max_steps]")
        seen: dict[int, list] = {}  # per run of the rate grid (by identity): its models at the budget

        def at_budget(stack, step):
            if step == budget:
                seen[id(stack)] = [copy.deepcopy(m).eval() for m in stack.models]

        models, hist = _multitask(ctx, models, systems, "finetune", ctx.seed * 100 + 50, curve_name=pre,
                                  after_step=at_budget)
        at = seen.get(id(hist["runs"][hist["chosen"]]))
        if at is None:  # the chosen run reaches the budget unless it stops before (min_steps >= budget_steps)
            raise RuntimeError(f"{v}: the chosen fine-tune stopped at step {hist['stop']}, before its fixed budget "
                               f"of {budget} steps")
        ctx.progress(f"[{setting}] {v} after the fixed budget of {budget} fine-tuning steps (lr {hist['lr']:g})")
        _record_errors(ctx, systems, at, prefix=f"{pre}budget_")
        ctx.metrics.scalar(f"{pre}budget_steps", budget)
        # time to a fixed accuracy (the paper's speed-up): the first validation at which the
        # fine-tune's validation force MAE (mean of systems), smoothed over finetune.smooth_points
        # validations, is at or below the seed's joint-training target (finetune.target_factor x the
        # best of joint training's smoothed validation curve on the same frames; train_shared); never
        # reached: the steps run (censored, flagged). Time = the merge's CPU + (steps to the target +
        # the steps of any discarded rate pilots) x the seed's ONE CPU cost per step (joint training's:
        # same architecture and batch), so the ratio to joint training (timed alike) is a ratio of step
        # counts, not of two noisy timings; the merge enters as step-equivalents (merge_step_equiv)
        jrec = json.loads((sd / f"joint_{setting}.json").read_text())
        target, step_cpu = float(jrec["target_force_mae"]), float(jrec["cpu_per_step"])
        xs, fs = _after_start(hist["curve_dict"])
        hit = steps_to_target(xs, smoothed(fs, smooth_points(p)), target)
        steps = hit if hit is not None else int(hist["stop"])
        sc = ctx.metrics.scalars
        over = pilot_overhead(hist["fit"])
        ctx.metrics.scalar(f"{pre}ft_target_force_mae", target)
        ctx.metrics.scalar(f"{pre}steps_to_target", steps)
        ctx.metrics.scalar(f"{pre}target_reached", float(hit is not None))
        ctx.metrics.scalar(f"{pre}ft_pilot_steps", over)
        ctx.metrics.scalar(f"{pre}ft_cpu_per_step", cpu_per_step(hist, hist["fit"]))  # diagnostic only
        ctx.metrics.scalar(f"{pre}step_cpu", step_cpu)
        if f"{pre}merge_step_equiv" not in sc:  # (the closed forms recorded theirs above)
            ctx.metrics.scalar(f"{pre}merge_step_equiv", sc[f"{pre}merge_cpu_seconds"] / step_cpu)
        ctx.metrics.scalar(f"{pre}time_to_target", time_to_target(sc[f"{pre}merge_cpu_seconds"], steps, over, step_cpu))
        ctx.metrics.scalar(f"{pre}finetune_seconds", hist["seconds"])
        ctx.metrics.scalar(f"{pre}finetune_cpu_seconds", hist["cpu_seconds"])
        ctx.metrics.scalar(f"{pre}finetune_steps", hist["stop"])
        ctx.metrics.scalar(f"{pre}merge_ft_seconds", sc[f"{pre}merge_seconds"] + hist["seconds"])
        if f"{pre}merge_cpu_seconds" in sc:
            ctx.metrics.scalar(f"{pre}merge_ft_cpu_seconds", sc[f"{pre}merge_cpu_seconds"] + hist["cpu_seconds"])
    _record_errors(ctx, systems, models, prefix=pre)


FIXED_RULES = {
    # the GNNMerge++ code rule transferred to SchNet: each teacher's own layer inputs
    "published": {"inputs": "teacher", "ridge": 1e-6, "ridge_mode": "absolute", "edge_weighting": False},
    # the same with the merged model's own layer inputs (layers solved in forward order)
    "seq": {"inputs": "sequential", "ridge": 1e-6, "ridge_mode": "absolute", "edge_weighting": False},
}


def published_rule(p: dict, rule: str = "published") -> dict:
    """A fixed closed-form rule's settings (configs' ``merge.<rule>``; defaults :data:`FIXED_RULES`).
    The 1e-6 ridge is ours (a fixed numerical regulariser): neither the brief (plain
    ``lstsq([X1;X2],[Y1;Y2])``) nor the public code (``torch.linalg.lstsq``) has one."""
    pub = {**FIXED_RULES[rule], **p["merge"].get(rule, {})}
    return {"inputs": str(pub["inputs"]), "ridge": float(pub["ridge"]), "ridge_mode": str(pub["ridge_mode"]),
            "edge_weighting": bool(pub["edge_weighting"])}


def _timed(fn, repeats: int):
    """``fn()`` once untimed (warm-up: lazy library set-up), then ``repeats`` timed calls; returns
    (the last call's result, median wall seconds, median CPU seconds)."""
    out = fn()
    walls, cpus = [], []
    for _ in range(max(int(repeats), 1)):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return out, float(np.median(walls)), float(np.median(cpus))


def steps_to_target(steps, values, target: float):
    """The first step at which ``values`` (a validation curve, lower is better) is at or below
    ``target``; None if it never is."""
    for st, v in zip(steps, values):
        if v <= target:
            return int(st)
    return None


def smooth_points(p: dict) -> int:
    """How many validations the accuracy target's crossing averages (``finetune.smooth_points``)."""
    return max(int(p["finetune"].get("smooth_points", 1)), 1)


def smoothed(values, k: int) -> list[float]:
    """Trailing mean of ``values`` over the last ``k`` points (fewer at the start; ``k`` <= 1: the
    values). A crossing of the smoothed curve is a level the fit holds for about ``k`` validations,
    not one lucky point, and it is causal (no later validation enters)."""
    v = [float(x) for x in values]
    k = max(int(k), 1)
    return [sum(v[max(0, i - k + 1):i + 1]) / (i + 1 - max(0, i - k + 1)) for i in range(len(v))]


def _after_start(curve: dict) -> tuple[list, list]:
    """A validation curve's steps and force MAEs after step 0 (a start already at the target counts
    its first validation after a step)."""
    xs = [int(x) for x in curve["x"] if x > 0]
    return xs, [float(f) for x, f in zip(curve["x"], curve["force"]) if x > 0]


def time_to_target(merge_cpu: float, steps: int, pilot_steps: int, step_cpu: float) -> float:
    """CPU seconds to the accuracy target: the merge's CPU (0 for joint training) plus the optimiser
    steps (the chosen rate's steps to the target and the steps of any rate pilots the fit discarded)
    at the seed's one CPU cost per step (joint training's, the same architecture and batch)."""
    return float(merge_cpu) + (int(steps) + int(pilot_steps)) * float(step_cpu)


# --- plots -----------------------------------------------------------------------------------------

ORDER = ["individual", "joint", "gffmerge_ft", "gffmerge_seq_ft", "gffmerge", "gffmerge_seq", "gffmerge_ours",
         "gffmerge_ours_force", "weight_avg_ft",
         "task_arithmetic", "weight_avg", "null_merge"]


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
    bars = [("gffmerge\ncode rule, teacher inputs", "merge_seconds", "gffmerge"),
            ("gffmerge_seq\nmerged-model inputs", "merge_seconds", "gffmerge_seq"),
            ("gffmerge_ours\n(ridge selection)", "merge_seconds", "gffmerge_ours"),
            ("gffmerge_ours_force", "merge_seconds", "gffmerge_ours_force"),
            ("gffmerge_ft\nmerge + fine-tune", "merge_ft_seconds", "gffmerge_ft"),
            ("gffmerge_seq_ft\nmerge + fine-tune", "merge_ft_seconds", "gffmerge_seq_ft"),
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
        for v in [v for v in ("gffmerge", "gffmerge_seq", "gffmerge_ours", "gffmerge_ours_force") if v in set(cur.variant)]:
            g = cur[(cur.variant == v) & (cur.metric == "layer_residual_merged")].groupby("x").value.mean()
            ax.semilogy(g.index, g.values, "-", marker="o", ms=3, label=f"{v}: closed form")
        g = cur[(cur.variant == "gffmerge") & (cur.metric == "layer_residual_average")].groupby("x").value.mean()
        if not g.empty:
            ax.semilogy(g.index, g.values, "k:", marker="o", ms=3, label="weight average (teachers' inputs)")
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
