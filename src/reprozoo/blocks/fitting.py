"""One training rule for every fitted model: a learning-rate grid piloted on validation, then the best
rate continued at a constant rate until the validation curve passes the platform's plateau test.

Why one rule: the convergence gate (``reprozoo.claims.plateau`` over the last 30 % of the curve, with
the learning rate still up) rejects models stopped on a budget or annealed to zero. A method that
trains its baselines with the same grid, the same stopping rule and the same step cap cannot be
accused of tuning the proposed model harder than its rivals; and a stop at the plateau instead of a
fixed step count buys the compute that converging costs.

Usage::

    def build(gen):            # a fresh model; the same initial weights for every rate
        return Net(generator=gen)
    def train_loss(model, gen):  # one minibatch loss (a scalar tensor); gen draws the batch
        ...
    def val_loss(model):       # the held-out validation loss (float); called in eval mode, with
                               # autograd on (wrap in torch.no_grad() unless the model needs it)
        ...
    model, rec = fit_to_plateau(build, train_loss, val_loss, cfg["fit"], seed, label="ours")
    log_fit(ctx.metrics, "ours", rec)   # curves val_ours and lr_ours for the gate, chosen rate

``cfg["fit"]`` keys: ``lr_grid`` (list), ``pilot_steps``, ``eval_every``, ``min_steps``, ``max_steps``,
``flat_tol`` (the plateau test's tolerance; use half the gate's, so a stop here passes the gate),
optional ``lr_drop`` (one drop of the rate by this factor if the first plateau comes in the first half
of the budget; keep it >= 0.1, the gate's floor), ``optimizer`` (``adam`` default, or ``adamw``) and
``weight_decay``. In the spec: ``convergence: - {curve: val_ours, mode: min, lr: lr_ours}``.
"""
from __future__ import annotations

import copy
from typing import Callable

import numpy as np


class PlateauRun:
    """One model at one constant learning rate, advanced in stages, validated every ``every`` steps;
    keeps the best-validation weights."""

    def __init__(self, model, lr: float, train_loss: Callable, val_loss: Callable, every: int, gen,
                 optimizer: str = "adam", weight_decay: float = 0.0):
        import torch

        opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(optimizer)
        if opt is None:
            raise ValueError(f"fit.optimizer '{optimizer}': expected one of adam, adamw")
        self.model, self.lr, self.train_loss, self.val_loss, self.every, self.gen = \
            model, lr, train_loss, val_loss, max(1, int(every)), gen
        self.opt = opt(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.step, self.steps, self.vals, self.lrs, self.losses = 0, [], [], [], []
        self.best, self.best_state = float("inf"), None
        self.evaluate()

    def evaluate(self) -> None:
        # gradients stay enabled: Hamiltonian and force models differentiate inside their forward pass;
        # a val_loss that needs none wraps itself in torch.no_grad()
        was = self.model.training
        self.model.eval()
        v = float(self.val_loss(self.model))
        self.model.train(was)
        v = v if np.isfinite(v) else 1e6  # a diverged rate loses the pilot instead of crashing it
        self.steps.append(self.step)
        self.vals.append(v)
        self.lrs.append(self.opt.param_groups[0]["lr"])
        if v < self.best:
            self.best, self.best_state = v, copy.deepcopy(self.model.state_dict())

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def advance(self, until: int, min_steps: int | None = None, tol: float = 0.0) -> bool:
        """Train to step ``until``; with ``min_steps``, stop (True) once the plateau test holds."""
        from ..claims import plateau

        while self.step < until:
            loss = self.train_loss(self.model, self.gen)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.losses.append(float(loss.detach()))
            self.step += 1
            if self.step % self.every == 0:
                self.evaluate()
                if min_steps is not None and self.step >= min_steps and plateau(self.steps, self.vals, tol):
                    return True
        return False


def fit_to_plateau(build: Callable, train_loss: Callable, val_loss: Callable, fit: dict, seed: int,
                   label: str = "model", progress: Callable = print):
    """The rule of the module docstring. Returns (model with its best-validation weights, record);
    the record holds the chosen run's ``steps``, ``vals``, ``lrs``, ``losses``, the chosen ``lr``,
    ``stop`` (steps taken), ``plateau`` (whether the plateau test held) and ``pilot_best``."""
    import torch

    from ..claims import plateau

    missing = [k for k in ("lr_grid", "pilot_steps", "eval_every", "min_steps", "max_steps", "flat_tol")
               if k not in fit]
    if missing:
        raise ValueError(f"fit: missing key(s) {missing}; see reprozoo.blocks.fitting")
    kw = {"optimizer": fit.get("optimizer", "adam"), "weight_decay": float(fit.get("weight_decay", 0.0))}
    runs = []
    for lr in fit["lr_grid"]:
        model = build(torch.Generator().manual_seed(seed))
        run = PlateauRun(model, float(lr), train_loss, val_loss, int(fit["eval_every"]),
                         torch.Generator().manual_seed(seed + 7), **kw)
        run.advance(int(fit["pilot_steps"]))
        runs.append(run)
    run = min(runs, key=lambda r: r.best)
    tol, top, first = float(fit["flat_tol"]), int(fit["max_steps"]), int(fit["min_steps"])
    stopped = run.advance(top, min_steps=first, tol=tol)
    drop_step = None
    if stopped and fit.get("lr_drop") and run.step <= top // 2:
        drop_step = run.step
        run.set_lr(run.lr * float(fit["lr_drop"]))
        stopped = run.advance(top, min_steps=run.step + int(fit["eval_every"]) * 5, tol=tol)
    stopped = stopped or plateau(run.steps, run.vals, tol)
    run.model.load_state_dict(run.best_state)
    drop = "" if drop_step is None else f" (x{fit['lr_drop']} from step {drop_step})"
    progress(f"{label}: lr {run.lr:g}{drop}, {run.step} steps ({'plateau' if stopped else 'max steps'}), "
             f"best validation loss {run.best:.3e}")
    return run.model, {"steps": run.steps, "vals": run.vals, "lrs": run.lrs, "lr": run.lr, "stop": run.step,
                       "drop_step": drop_step, "plateau": stopped, "losses": run.losses,
                       "pilot_best": {float(r.lr): r.best for r in runs}}


def log_fit(metrics, name: str, rec: dict) -> None:
    """Curves ``val_<name>`` and ``lr_<name>`` (what a ``convergence:`` entry reads) and scalars
    ``lr_chosen_<name>``, ``steps_<name>``."""
    metrics.curve(f"val_{name}", rec["steps"], rec["vals"])
    metrics.curve(f"lr_{name}", rec["steps"], rec["lrs"])
    metrics.scalar(f"lr_chosen_{name}", float(rec["lr"]))
    metrics.scalar(f"steps_{name}", float(rec["stop"]))
