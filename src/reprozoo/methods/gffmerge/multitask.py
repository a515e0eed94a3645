"""One SchNet backbone serving several systems, each with its own head and energy scale.

``tie(models)`` makes the SchNet models share their backbone modules (embedding, radial basis,
interactions) in place, so that ``models[k]`` is "shared backbone + head k + energy scale k" and
the shared blocks' ``evaluate(models[k], data_k)`` works unchanged. ``fit_multitask`` trains all
of them at once (joint training from scratch, or fine-tuning a merged model): every step takes
one batch of each system and descends the mean of the per-system losses (the loss of
``blocks.atomistic.train.loss_terms``), Adam with cosine decay, gradient clipping, seeded.
"""
from __future__ import annotations

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


def fit_multitask(models: list, trains: list[AtomsData], steps: int, lr: float, batch_size: int = 4,
                  lr_final_factor: float = 0.1, energy_weight: float = 1.0, force_weight: float = 10.0,
                  grad_clip: float | None = 10.0, seed: int = 0, vals: list[AtomsData] | None = None,
                  eval_at: list[int] | None = None, progress=None) -> dict:
    """Train tied ``models`` on their systems for ``steps`` steps; returns a history with
    ``seconds`` and ``cpu_seconds`` (training only: evaluations for the learning curve are not
    timed), ``steps`` and,
    when ``vals`` and ``eval_at`` are given, ``curve`` = [(step, [metrics per system])]."""
    dtype = next(models[0].parameters()).dtype
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    params = unique_parameters(models)
    opt = torch.optim.Adam(params, lr=lr)
    total = max(int(steps), 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_final_factor + (1 - lr_final_factor) * 0.5 * (1 + np.cos(np.pi * min(s, total) / total)))
    streams = [_cycle(d, batch_size, rng, dtype) for d in trains]
    eval_at = sorted(set(eval_at or []))
    hist = {"curve": [], "step_loss": []}
    seconds = cpu = 0.0

    def record(step):
        if vals is not None and step in eval_at:
            hist["curve"].append((step, evaluate_systems(models, vals)))
            if progress:
                f = np.mean([m["force_mae"] for m in hist["curve"][-1][1]])
                progress(f"step {step}/{steps}: val force MAE {1e3 * f:.1f} meV/A")

    record(0)
    for m in models:
        m.train()
    for step in range(1, int(steps) + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = 0.0
        for m, s in zip(models, streams):
            li, _, _ = loss_terms(m, next(s), energy_weight, force_weight)
            loss = loss + li / len(models)
        opt.zero_grad()
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        sched.step()
        seconds += time.perf_counter() - t0
        cpu += time.process_time() - c0
        hist["step_loss"].append(float(loss.detach()))
        if step in eval_at:
            for m in models:
                m.eval()
            record(step)
            for m in models:
                m.train()
    for m in models:
        m.eval()
    hist.update(seconds=seconds, cpu_seconds=cpu, steps=int(steps))
    return hist
