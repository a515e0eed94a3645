"""One SchNet backbone serving several systems, each with its own head and energy scale.

``tie(models)`` makes the SchNet models share their backbone modules (embedding, radial basis,
interactions) in place, so that ``models[k]`` is "shared backbone + head k + energy scale k" and
the shared blocks' ``evaluate(models[k], data_k)`` works unchanged. ``fit_multitask`` trains all
of them at once (joint training from theta_0, or fine-tuning a merged model): every step takes
one batch of each system and descends the mean of the per-system losses (the loss of
``blocks.atomistic.train.loss_terms``), Adam with cosine decay to ``lr_final_factor`` x lr,
gradient clipping, seeded. With ``stop`` it validates every ``eval_every`` steps and stops at the
first validation where the curve so far is flat by the convergence gate's own test
(``reprozoo.claims.plateau``) with no new best in the tail, so a run it stops is one the gate
accepts.

``fit_multitask`` is the foundation's pre-training loop (recorded, not gated). Every gated
training (the specialists, joint training, both fine-tunes) goes through ``fit_rule``: the same
per-step loss on the platform's one training rule (``blocks.fitting.fit_to_plateau``: a rate grid
piloted on validation, a plateau, one drop of the rate, a second plateau).

``evaluate_frames(model, data)`` -> per-frame errors (the test units of the claims' intervals).
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from reprozoo.blocks.atomistic import AtomsData, evaluate, loss_terms

SHARED_MODULES = ("embedding", "rbf", "envelope", "interactions")


def tie(models: list) -> list:
    for m in models[1:]:
        for name in SHARED_MODULES:
            setattr(m, name, getattr(models[0], name))
    return models


def unique_parameters(models: list) -> list:
    seen, out = set(), []
    for m in models:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _cycle(data: AtomsData, batch_size: int, rng: np.random.Generator, dtype):
    while True:
        yield from data.batches(batch_size, rng, dtype=dtype)


def evaluate_systems(models: list, datas: list[AtomsData], batch_size: int = 8) -> list[dict]:
    return [evaluate(m, d, batch_size) for m, d in zip(models, datas)]


def evaluate_frames(model, data: AtomsData, batch_size: int = 8) -> dict:
    """Per frame, in the data's order: ``energy_ae_per_atom`` |E - E_ref| / n_atoms and
    ``force_mae`` mean |F - F_ref| over the frame's force components (eV, eV/A). For frames of
    equal size their means are :func:`evaluate`'s energy and force MAE."""
    was_training = model.training
    model.eval()
    dtype = next(model.parameters()).dtype
    e_out, f_out = [], []
    for s in range(0, len(data), batch_size):
        b = data.collate(range(s, min(s + batch_size, len(data))), dtype=dtype)
        e, f = model.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures,
                                       create_graph=False)
        n = b.n_atoms.double()
        e_out.append(((e.detach() - b.energy).double().abs() / n).numpy())
        af = (f.detach() - b.forces).double().abs().sum(1)
        per = torch.zeros(b.n_structures, dtype=torch.float64).index_add_(0, b.batch, af)
        f_out.append((per / (3 * n)).numpy())
    model.train(was_training)
    return {"energy_ae_per_atom": np.concatenate(e_out), "force_mae": np.concatenate(f_out)}


def cosine_lr(step: int, total: int, lr: float, lr_final_factor: float, decay_frac: float = 1.0) -> float:
    """The learning rate after ``step`` of ``total`` steps: cosine from lr to lr * lr_final_factor
    over the first ``decay_frac`` x ``total`` steps, then held there (``decay_frac = 1``: the shared
    ``fit``'s schedule). Held, the last 30 % of a run that reaches ``total`` trains at one fixed
    rate (>= the gate's floor of 0.1 x peak for ``lr_final_factor >= 0.1``), so a curve that is
    flat there is flat at that rate, not flattened by a decay in progress."""
    span = max(float(decay_frac) * max(total, 1), 1.0)
    return float(lr * (lr_final_factor + (1 - lr_final_factor) * 0.5 * (1 + np.cos(np.pi * min(step / span, 1.0)))))


def stop_here(steps, values, tol: float = 0.02, min_points: int = 6) -> bool:
    """The stopping rule on a validation curve so far (lower is better): flat by the convergence
    gate's own test (``reprozoo.claims.plateau``: improvement over the last 30 % <= ``tol``, at
    least ``min_points`` points there), not rising by more than ``tol`` either (a loss spike at a
    high rate passes the one-sided test but is no plateau: training goes on until it has
    recovered), and no new best in the tail (its best within ``tol`` of the best before it: a
    flat stretch of noise after a late drop is not a plateau yet). Stricter than the gate, never
    looser, so a run it stops is one the gate accepts."""
    from reprozoo.claims import TAIL, plateau, tail_fit

    xs, f = np.asarray(steps, float), np.asarray(values, float)
    if not plateau(xs, f, tol=tol, min_points=min_points):
        return False
    if tail_fit(xs, f, min_points=min_points)["improvement"] < -tol:
        return False
    tail = xs >= xs[0] + (1 - TAIL) * (xs[-1] - xs[0])
    return bool(np.min(f[tail]) >= (1 - tol) * np.min(f[~tail]))


def fit_multitask(models: list, trains: list[AtomsData], steps: int, lr: float, batch_size: int = 4,
                  lr_final_factor: float = 0.1, energy_weight: float = 1.0, force_weight: float = 10.0,
                  grad_clip: float | None = 10.0, seed: int = 0, vals: list[AtomsData] | None = None,
                  eval_at: list[int] | None = None, eval_every: int | None = None, stop: dict | None = None,
                  progress=None, decay_frac: float = 1.0, after_step=None) -> dict:
    """Train ``models`` on their systems for at most ``steps`` steps (:func:`cosine_lr` with
    ``decay_frac``: the decay spans ``decay_frac`` x ``steps``, then the rate is held). Tied models
    (:func:`tie`) are one backbone with a head per system (joint training, fine-tunes); untied ones
    are independent models trained side by side (the specialists: the loss is a sum of separate
    terms, so each model gets its own gradient; Adam is invariant to the 1/len(models) factor), and
    a single model is plain training (the foundation's pre-training); returns a history with ``seconds`` and ``cpu_seconds`` (training only:
    validations are not timed), ``steps`` (run), ``stopped`` (at a plateau) and, with ``vals``,
    ``curve`` = [(step, [metrics per system], lr)] at ``eval_at`` (or every ``eval_every`` steps,
    step 0 and the last included). ``stop`` = {"tol", "min_points", "min_steps"}: stop at the first
    validation (at or after ``min_steps``) where the mean force MAE curve so far passes
    ``reprozoo.claims.plateau`` with that tolerance and at least ``min_points`` points in its tail,
    the tail does not rise by more than ``tol`` either (a spike is not a plateau), and the best
    value in that tail is no more than ``tol`` below the best before it. ``after_step(step, models)``,
    if given, is called after every optimizer step (models in eval mode, not timed, before the
    step's validation): e.g. to score the models at a fixed step budget."""
    dtype = next(models[0].parameters()).dtype
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    params = unique_parameters(models)
    untied = len(models) > 1 and not any(m.embedding is models[0].embedding for m in models[1:])
    # untied: each model its own loss and its own clipping, exactly as if trained alone
    groups = [list(m.parameters()) for m in models] if untied else [params]
    opt = torch.optim.Adam(params, lr=lr)
    total = max(int(steps), 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, total, 1.0, lr_final_factor, decay_frac))
    streams = [_cycle(d, batch_size, rng, dtype) for d in trains]
    if eval_every:
        eval_at = list(range(0, total, int(eval_every))) + [total]
    eval_at = set(eval_at or [])
    hist = {"curve": [], "step_loss": [], "stopped": False}
    seconds = cpu = 0.0

    def record(step) -> bool:
        """Validate at ``step`` if due; True when the stopping rule says the curve is flat."""
        if vals is None or step not in eval_at:
            return False
        hist["curve"].append((step, evaluate_systems(models, vals), cosine_lr(step, total, lr, lr_final_factor, decay_frac)))
        f = [1e3 * np.mean([m["force_mae"] for m in ev]) for _, ev, _ in hist["curve"]]
        if progress and (len(f) % 5 == 1 or step == total):
            progress(f"step {step}/{steps}: val force MAE {f[-1]:.1f} meV/A")
        min_points = int(stop.get("min_points", 6)) if stop is not None else 0
        if stop is None or step < int(stop.get("min_steps", 0)) or len(f) < min_points:
            return False  # (too few points for a tail of min_points: plateau() would say no)
        xs = [st for st, _, _ in hist["curve"]]
        return stop_here(xs, f, float(stop.get("tol", 0.02)), min_points)

    record(0)
    for m in models:
        m.train()
    step = 0
    for step in range(1, int(steps) + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = 0.0
        for m, s in zip(models, streams):
            li, _, _ = loss_terms(m, next(s), energy_weight, force_weight)
            loss = loss + (li if untied else li / len(models))
        opt.zero_grad()
        loss.backward()
        if grad_clip:
            for g in groups:
                torch.nn.utils.clip_grad_norm_(g, grad_clip)
        opt.step()
        sched.step()
        seconds += time.perf_counter() - t0
        cpu += time.process_time() - c0
        hist["step_loss"].append(float(loss.detach()))
        if after_step is not None:
            for m in models:
                m.eval()
            after_step(step, models)
            for m in models:
                m.train()
        if step in eval_at:
            for m in models:
                m.eval()
            done = record(step)
            for m in models:
                m.train()
            if done:
                hist["stopped"] = True
                if progress:
                    progress(f"plateau at step {step}/{steps}: stopping")
                break
    for m in models:
        m.eval()
    hist.update(seconds=seconds, cpu_seconds=cpu, steps=int(step))
    return hist


# --- the shared training rule (blocks.fitting) for the specialists, joint training and fine-tunes ---

class Stack(torch.nn.Module):
    """Models trained together as one module for :func:`reprozoo.blocks.fitting.fit_to_plateau`:
    one model (a specialist), or tied models (:func:`tie`: one backbone, a head per system; shared
    parameters are counted once by ``parameters()`` and stay shared in copies)."""

    def __init__(self, models: list):
        super().__init__()
        self.models = torch.nn.ModuleList(models)


def fit_rule(models: list, trains: list[AtomsData], vals: list[AtomsData], fit: dict, seed: int, *,
             batch_size: int, energy_weight: float = 1.0, force_weight: float = 10.0, label: str = "fit",
             progress=None, after_step=None) -> tuple[list, dict]:
    """Train ``models`` (one model, or tied models with a head per system) on ``trains`` by the
    platform's one training rule (``blocks.fitting.fit_to_plateau``, config ``fit``: the rate grid
    piloted on validation and ranked by the pilots' tails, the chosen rate held until the plateau
    test holds, one drop of the rate, a second plateau past the drop). Every optimiser step takes
    ``batch_size`` frames of each system (drawn with the run's generator) and descends the mean of
    the systems' losses (``blocks.atomistic.loss_terms``). Validation: the force MAE (meV/A, mean
    over systems) is the selection and stopping curve; the energy MAE (meV/atom) is recorded.
    Every rate of the grid starts from the same weights (copies of ``models``).

    ``after_step(stack, step)`` (``step``: optimiser steps done) is called after every step of every
    rate's run, stack in train mode; ``runs`` in the record lists the stacks in grid order, so a
    caller can pick what the hook saw on the chosen run (``rec['chosen']``).
    Returns (the models with their best-validation weights, record with ``seconds`` and
    ``cpu_seconds`` of the whole fit: the pilots and validations included)."""
    from reprozoo.blocks.fitting import fit_to_plateau

    start = Stack(models)
    runs: list[Stack] = []

    def build(gen):
        s = copy.deepcopy(start)
        for m in s.models:
            m.train()
        runs.append(s)
        return s

    def train_loss(stack, gen):
        dtype = next(stack.parameters()).dtype
        loss = 0.0
        for m, d in zip(stack.models, trains):
            idx = torch.randperm(len(d), generator=gen)[:batch_size].sort().values
            li, _, _ = loss_terms(m, d.collate(idx.tolist(), dtype=dtype), energy_weight, force_weight)
            loss = loss + li / len(trains)
        return loss

    def val_loss(stack):
        ev = evaluate_systems(list(stack.models), vals)
        return {"force": 1e3 * float(np.mean([r["force_mae"] for r in ev])),
                "energy": 1e3 * float(np.mean([r["energy_mae_per_atom"] for r in ev]))}

    hook = None if after_step is None else (lambda stack, step: after_step(stack, step + 1))
    cfg = {"clip": 10.0, **fit, "select": "force", "stop_on": ["force"]}
    t0, c0 = time.perf_counter(), time.process_time()
    stack, rec = fit_to_plateau(build, train_loss, val_loss, cfg, seed, label=label,
                                progress=progress or (lambda s: None), after_step=hook)
    rec.update(seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0,
               chosen=next(i for i, lr in enumerate(fit["lr_grid"]) if float(lr) == float(rec["lr"])),
               runs=runs)
    out = list(stack.models)
    for m in out:
        m.eval()
    return out, rec
