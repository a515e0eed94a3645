"""Energy/force training and evaluation of atomistic models (any module with ``energy_and_forces``).

``fit(model, train, val, cfg)`` minimises
    energy_weight * mean(((E_pred - E) / n_atoms)^2) + force_weight * mean((F_pred - F)^2)
with Adam, cosine learning-rate decay to ``lr * lr_final_factor``, optional gradient clipping,
optional early stopping on the validation loss (best weights restored), and stops early on
``max_steps`` / ``time_budget_s``. Validates ``val_per_epoch`` times per pass, or every
``val_every_steps`` steps (steps in ``history['val_steps']``, the learning rate then in force in
``history['lr']``), so the convergence gate sees the curve's tail and its learning rate.
Deterministic for a seed (batch order from numpy, torch seeded).
``evaluate(model, data)`` -> energy MAE/RMSE per atom and force MAE/RMSE (per component).
``fit_energy_scale(model, data)`` sets per-element reference energies (least squares on
composition), the mean, and the output scale (force RMS) before training.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .data import AtomsData, Batch


@dataclass
class TrainConfig:
    epochs: int = 50
    batch_size: int = 8
    lr: float = 1e-3
    lr_final_factor: float = 0.1
    energy_weight: float = 1.0
    force_weight: float = 10.0
    patience: int | None = None      # early stopping on the validation loss (validations); None = off
    val_per_epoch: int = 1           # validations per pass over the training frames (the last at its end)
    val_every_steps: int | None = None  # instead: validate every k optimiser steps (and at the last);
                                        # a small training set (a few steps a pass) is not validated
                                        # val_per_epoch times per pass, and every run gets the same spacing
    max_steps: int | None = None
    time_budget_s: float | None = None
    grad_clip: float | None = 10.0
    seed: int = 0
    dtype: str = "float32"

    @classmethod
    def from_dict(cls, d: dict | None) -> "TrainConfig":
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown training options {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}")
        cfg = cls(**d)
        for key in ("epochs", "batch_size", "val_per_epoch"):
            value = getattr(cfg, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"training option {key} = {value!r}: allowed values are integers >= 1")
        v = cfg.val_every_steps
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"training option val_every_steps = {v!r}: allowed values are null or integers >= 1")
        return cfg


def _dtype(name):
    return {"float32": torch.float32, "float64": torch.float64}[name] if isinstance(name, str) else name


def loss_terms(model, b: Batch, energy_weight: float, force_weight: float, create_graph: bool = True):
    e, f = model.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures,
                                   create_graph=create_graph)
    n = b.n_atoms.to(e.dtype)
    le = torch.mean(((e - b.energy) / n) ** 2) if b.energy is not None else e.new_zeros(())
    lf = torch.mean((f - b.forces) ** 2) if b.forces is not None else e.new_zeros(())
    return energy_weight * le + force_weight * lf, le, lf


@torch.no_grad()
def fit_energy_scale(model, data: AtomsData, max_frames: int = 2000) -> dict:
    """atomref[Z] by least squares of E on composition; e_std = force RMS (or residual std)."""
    idx = np.arange(min(len(data), max_frames))
    nums = [data.frames["numbers"][k] for k in idx]
    energies = np.asarray(data.frames["energy"])[idx]
    zs = np.unique(np.concatenate(nums))
    comp = np.stack([np.bincount(n, minlength=zs.max() + 1)[zs] for n in nums]).astype(float)
    coef, *_ = np.linalg.lstsq(comp, energies, rcond=None)
    if np.linalg.matrix_rank(comp) < len(zs):  # e.g. one composition for every frame: put it in the mean
        coef = np.full(len(zs), energies.mean() / comp.sum(1).mean())
    model.atomref.zero_()
    model.atomref[torch.from_numpy(zs)] = torch.from_numpy(coef).to(model.atomref.dtype)
    resid = (energies - comp @ coef) / comp.sum(1)
    if data.frames.get("forces") is not None:
        scale = float(np.sqrt(np.mean(np.concatenate([data.frames["forces"][k].ravel() for k in idx]) ** 2)))
    else:
        scale = float(np.std(resid))
    scale = scale if np.isfinite(scale) and scale > 1e-8 else 1.0
    model.e_mean.fill_(0.0)
    model.e_std.fill_(scale)
    return {"atomref": dict(zip(zs.tolist(), coef.tolist())), "e_std": scale, "resid_std": float(np.std(resid))}


def fit(model, train: AtomsData, val: AtomsData | None = None, cfg: TrainConfig | dict | None = None,
        progress=None) -> dict:
    cfg = cfg if isinstance(cfg, TrainConfig) else TrainConfig.from_dict(cfg)
    dtype = _dtype(cfg.dtype)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model.to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    steps_per_epoch = int(np.ceil(len(train) / cfg.batch_size))
    total = cfg.epochs * steps_per_epoch if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: cfg.lr_final_factor + (1 - cfg.lr_final_factor) * 0.5 * (1 + np.cos(np.pi * min(s, total) / max(total, 1))))
    hist = {"train_loss": [], "val_loss": [], "val_energy_mae_per_atom": [], "val_force_mae": [], "step_loss": []}
    best, best_state, bad, step = np.inf, None, 0, 0
    t0 = time.perf_counter()
    stop = False
    # validate after every ``val_every`` steps of a pass and at its end: the convergence gate needs
    # several points in the last 30 % of training, which a few long epochs do not give
    val_every = int(np.ceil(steps_per_epoch / max(1, int(cfg.val_per_epoch))))
    hist["val_steps"], hist["lr"] = [], []  # lr: the rate in force at each validation (the gate reads it)

    def due(k: int) -> bool:
        """A validation after the k-th batch of a pass (not its last: the end of a pass has its own)."""
        if cfg.val_every_steps:
            return step % cfg.val_every_steps == 0
        return k % val_every == 0 and k < steps_per_epoch

    def validate(epoch: int) -> bool:
        nonlocal best, best_state, bad
        m = evaluate(model, val, cfg.batch_size, cfg.energy_weight, cfg.force_weight)
        model.train()
        hist["val_steps"].append(step)
        hist["lr"].append(float(opt.param_groups[0]["lr"]))
        hist["val_loss"].append(m["loss"])
        hist["val_energy_mae_per_atom"].append(m["energy_mae_per_atom"])
        hist["val_force_mae"].append(m["force_mae"])
        if m["loss"] < best:
            best, best_state, bad = m["loss"], copy.deepcopy(model.state_dict()), 0
            hist["best_epoch"], hist["best_step"] = epoch, step
        else:
            bad += 1
        return cfg.patience is not None and bad >= cfg.patience

    has_val = val is not None and len(val) > 0
    for epoch in range(cfg.epochs):
        model.train()
        losses = []
        for k, b in enumerate(train.batches(cfg.batch_size, rng, dtype=dtype), start=1):
            loss, _, _ = loss_terms(model, b, cfg.energy_weight, cfg.force_weight)
            opt.zero_grad()
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            step += 1
            losses.append(loss.item())
            hist["step_loss"].append(losses[-1])
            if (cfg.max_steps and step >= cfg.max_steps) or (cfg.time_budget_s and time.perf_counter() - t0 > cfg.time_budget_s):
                stop = True
                break
            if has_val and due(k) and validate(epoch):
                stop = True
                break
        hist["train_loss"].append(float(np.mean(losses)))
        at_end = cfg.val_every_steps is None or stop or epoch == cfg.epochs - 1
        if has_val and at_end and (not hist["val_steps"] or hist["val_steps"][-1] != step) and validate(epoch):
            stop = True
        if progress and (epoch % max(1, cfg.epochs // 5) == 0 or stop or epoch == cfg.epochs - 1):
            msg = f"epoch {epoch} train loss {hist['train_loss'][-1]:.4g}"
            if hist["val_loss"]:
                msg += f" val loss {hist['val_loss'][-1]:.4g} force MAE {hist['val_force_mae'][-1]:.4g}"
            progress(msg)
        if stop:
            break
    if best_state is not None and cfg.patience is not None:
        model.load_state_dict(best_state)
    model.eval()
    hist.update(epochs=epoch + 1, steps=step, seconds=time.perf_counter() - t0, config=asdict(cfg))
    return hist


def evaluate(model, data: AtomsData, batch_size: int = 16, energy_weight: float = 1.0, force_weight: float = 10.0,
             dtype=None) -> dict:
    """Energy MAE/RMSE per atom, force MAE/RMSE per component, loss; model left in eval mode."""
    was_training = model.training
    model.eval()
    dtype = dtype or next(model.parameters()).dtype
    ae, se, af, sf, nf, ne = 0.0, 0.0, 0.0, 0.0, 0, 0
    for b in data.batches(batch_size, dtype=dtype):
        e, f = model.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures,
                                       create_graph=False)
        e, f = e.detach(), f.detach()
        if b.energy is not None:
            d = ((e - b.energy) / b.n_atoms.to(e.dtype)).double()
            ae += d.abs().sum().item()
            se += (d**2).sum().item()
            ne += len(d)
        if b.forces is not None:
            d = (f - b.forces).double()
            af += d.abs().sum().item()
            sf += (d**2).sum().item()
            nf += d.numel()
    model.train(was_training)
    out = {"energy_mae_per_atom": ae / max(ne, 1), "energy_rmse_per_atom": float(np.sqrt(se / max(ne, 1))),
           "force_mae": af / max(nf, 1), "force_rmse": float(np.sqrt(sf / max(nf, 1)))}
    out["loss"] = energy_weight * out["energy_rmse_per_atom"] ** 2 + force_weight * out["force_rmse"] ** 2
    return out
