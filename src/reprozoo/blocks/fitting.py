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
``optimizer`` (``adam`` default, or ``adamw``) and ``weight_decay``. In the spec:
``convergence: - {curve: val_ours, mode: min, lr: lr_ours}``.

The plateau of a constant rate is only the floor of that rate's gradient noise: a fit stopped there can be
beaten by the same model at a lower rate, and a verdict read from it follows the optimiser (four reviews found
rate drops that moved the loss by more than the effect a claim tested). So the rule, by default:

- drops the rate once, by ``lr_drop`` (default 0.1, the gate's floor), after the first plateau, and trains on
  until the plateau test holds on a window that lies wholly after the drop (or ``max_steps``). The record's
  ``drop_gain`` is how much the drop lowered the best validation value (relative): large values say the
  first plateau was a noise floor, which the dropped run has left behind. ``lr_drop: 0`` (or null) turns it
  off; a config that does so says why;
- ranks the pilot rates by the mean of the second half of their validation points (``pilot_score: tail``),
  not by their single best point: a noisy high rate's lucky minimum no longer wins the grid. The record's
  ``lr_edge`` says when the chosen rate is the top or bottom of the grid (the grid does not bracket it).
Optional keys, each asked for by a method whose stop the gate would otherwise reject (defaults keep the
rule above):

- ``scale``: ``value`` (default) or ``range``: the plateau test's scale; use the one the spec's
  ``convergence:`` entry reads, so that a stop here is a pass there.
- ``keep_from``: best weights are kept only from this step on (a curve whose best point is its start, at
  the chance loss, is not a model).
- ``min_progress``: the plateau stop is refused until the best validation value is below the first by
  this fraction of the first's magnitude (a model sitting on its initial plateau trains on to
  ``max_steps`` instead of stopping at ``min_steps``).
- ``pilot_score``: ``tail`` (default) or ``best``: rank the pilot rates by their best point instead.
- ``patience``: the plateau stop also waits until the best validation value is at least this many
  evaluations old (a curve still setting new minima is not done, however flat its trend).
- ``ema_decay``: validate (and keep) an exponential moving average of the weights, updated after every
  optimiser step; it averages out the rate's gradient noise the way a drop does, without slowing learning.
- ``warmup``: linear warm-up over this many steps (the lr curve records it; the gate's floor reads
  the tail only); ``clip``: gradient-norm clipping; ``fused``: the fused Adam kernel.
- Several curves: ``val_loss`` may return a dict ``{name: value}``. The plateau must then hold on every
  curve named in ``stop_on`` (default: all), and the best weights follow ``select`` (default: the
  first name). ``log_fit`` writes ``val_<label>`` (the selection curve) and ``val_<label>_<name>``.
- ``fit_to_plateau(..., after_step=f)`` calls ``f(model, step)`` after every optimiser step (weight
  averaging).
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import numpy as np

DEFAULT_LR_DROP = 0.1  # one drop to the convergence gate's floor (claims.LR_FLOOR) after the first plateau


class PlateauRun:
    """One model at one constant learning rate, advanced in stages, validated every ``every`` steps;
    keeps the best-validation weights (from step ``keep_from`` on). ``val_loss`` returns a float or a
    dict of curves (see the module docstring)."""

    def __init__(self, model, lr: float, train_loss: Callable, val_loss: Callable, every: int, gen,
                 optimizer: str = "adam", weight_decay: float = 0.0, *, scale: str = "value",
                 keep_from: int = 0, min_progress: float = 0.0, warmup: int = 0, clip: float | None = None,
                 fused: bool = False, select: str | None = None, stop_on=None, after_step: Callable | None = None,
                 patience: int = 0, ema_decay: float | None = None):
        import torch

        opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(optimizer)
        if opt is None:
            raise ValueError(f"fit.optimizer '{optimizer}': expected one of adam, adamw")
        if scale not in ("value", "range"):
            raise ValueError(f"fit.scale '{scale}': expected one of value, range")
        self.model, self.lr, self.train_loss, self.val_loss, self.every, self.gen = \
            model, lr, train_loss, val_loss, max(1, int(every)), gen
        self.scale, self.keep_from, self.min_progress = scale, int(keep_from), float(min_progress)
        self.warmup, self.clip, self.after_step = int(warmup), clip, after_step
        self.select, self.stop_on, self.patience = select, stop_on, int(patience)
        if ema_decay is not None and not 0.0 < float(ema_decay) < 1.0:
            raise ValueError(f"fit.ema_decay {ema_decay}: expected a number in (0, 1)")
        # the averaged copy is what validation reads and what the best weights are taken from
        self.ema_decay = None if ema_decay is None else float(ema_decay)
        self.ema = None if ema_decay is None else copy.deepcopy(model).requires_grad_(False)
        self.best_eval = 0
        extra = {"fused": True} if fused else {}
        self.opt = opt(model.parameters(), lr=lr if self.warmup <= 0 else lr / self.warmup,
                       weight_decay=weight_decay, **extra)
        self.step, self.steps, self.vals, self.lrs, self.losses = 0, [], [], [], []
        self.curves: dict[str, list] = {}
        self.best, self.best_state = float("inf"), None
        self.evaluate()

    def evaluate(self) -> None:
        # gradients stay enabled: Hamiltonian and force models differentiate inside their forward pass;
        # a val_loss that needs none wraps itself in torch.no_grad()
        judged = self.model if self.ema is None else self.ema
        was = judged.training
        judged.eval()
        out = self.val_loss(judged)
        judged.train(was)
        if isinstance(out, dict):
            if self.select is None:
                self.select = next(iter(out))
            if self.select not in out:
                raise ValueError(f"fit.select '{self.select}': expected one of {sorted(out)}")
            for k, v in out.items():
                v = float(v)
                self.curves.setdefault(k, []).append(v if np.isfinite(v) else 1e6)
            v = self.curves[self.select][-1]
        else:
            v = float(out)
        v = v if np.isfinite(v) else 1e6  # a diverged rate loses the pilot instead of crashing it
        self.steps.append(self.step)
        self.vals.append(v)
        self.lrs.append(self.opt.param_groups[0]["lr"])
        if self.step >= self.keep_from and v < self.best:
            self.best, self.best_state = v, copy.deepcopy(judged.state_dict())
            self.best_eval = len(self.vals) - 1
        elif self.best_state is None:  # a placeholder until the first evaluation that counts
            self.best_state = copy.deepcopy(judged.state_dict())

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def average(self) -> None:
        """One step of the weights' exponential moving average (buffers are copied, not averaged)."""
        import torch

        with torch.no_grad():
            for avg, cur in zip(self.ema.parameters(), self.model.parameters()):
                avg.lerp_(cur, 1.0 - self.ema_decay)
            for avg, cur in zip(self.ema.buffers(), self.model.buffers()):
                avg.copy_(cur)

    def flat(self, tol: float) -> bool:
        """The plateau test on every stopping curve, enough progress from the first point, and (with
        ``patience``) a best point old enough."""
        from ..claims import plateau

        if self.patience > 0 and len(self.vals) - 1 - self.best_eval < self.patience:
            return False
        if self.min_progress > 0:
            first, best = self.vals[0], min(self.vals)
            if first - best < self.min_progress * abs(first):
                return False
        if self.curves:
            names = self.stop_on or list(self.curves)
            return all(plateau(self.steps, self.curves[k], tol, scale=self.scale) for k in names)
        return plateau(self.steps, self.vals, tol, scale=self.scale)

    def advance(self, until: int, min_steps: int | None = None, tol: float = 0.0) -> bool:
        """Train to step ``until``; with ``min_steps``, stop (True) once the plateau test holds."""
        import torch

        while self.step < until:
            if 0 < self.warmup and self.step < self.warmup:
                self.set_lr(self.lr * (self.step + 1) / self.warmup)
            loss = self.train_loss(self.model, self.gen)
            self.opt.zero_grad()
            loss.backward()
            if self.clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(self.clip))
            self.opt.step()
            if self.ema is not None:
                self.average()
            if self.after_step is not None:
                self.after_step(self.model, self.step)
            self.losses.append(float(loss.detach()))
            self.step += 1
            if self.step % self.every == 0:
                self.evaluate()
                if min_steps is not None and self.step >= min_steps and self.flat(tol):
                    return True
        return False

    def pilot_score(self, how: str = "tail") -> float:
        if how == "best":
            if np.isfinite(self.best):
                return self.best
            # a pilot shorter than keep_from has no kept point yet: rank it by its evaluations after
            # the first (the shared initial weights score the same for every rate)
            return float(min(self.vals[1:] or self.vals))
        if how == "tail":
            half = self.vals[len(self.vals) // 2:]
            return float(np.mean(half))
        raise ValueError(f"fit.pilot_score '{how}': expected one of best, tail")


def fit_to_plateau(build: Callable, train_loss: Callable, val_loss: Callable, fit: dict, seed: int,
                   label: str = "model", progress: Callable = print, after_step: Callable | None = None):
    """The rule of the module docstring. Returns (model with its best-validation weights, record);
    the record holds the chosen run's ``steps``, ``vals``, ``lrs``, ``losses``, ``curves`` (a dict, empty
    unless ``val_loss`` returns one), the chosen ``lr``, ``stop`` (steps taken), ``plateau`` (whether the
    plateau test held), ``pilot_best`` (each rate's score at the end of its pilot, the one it was
    chosen on), ``drop_step`` and ``drop_gain`` (None without a drop) and ``lr_edge`` (``top``, ``bottom``
    or None)."""
    import torch

    from ..claims import LR_FLOOR, TAIL

    missing = [k for k in ("lr_grid", "pilot_steps", "eval_every", "min_steps", "max_steps", "flat_tol")
               if k not in fit]
    if missing:
        raise ValueError(f"fit: missing key(s) {missing}; see reprozoo.blocks.fitting")
    kw = {"optimizer": fit.get("optimizer", "adam"), "weight_decay": float(fit.get("weight_decay", 0.0)),
          "scale": fit.get("scale", "value"), "keep_from": int(fit.get("keep_from", 0)),
          "min_progress": float(fit.get("min_progress", 0.0)), "warmup": int(fit.get("warmup", 0)),
          "clip": fit.get("clip"), "fused": bool(fit.get("fused", False)), "select": fit.get("select"),
          "stop_on": fit.get("stop_on"), "after_step": after_step, "patience": int(fit.get("patience", 0)),
          "ema_decay": fit.get("ema_decay")}
    how = fit.get("pilot_score", "tail")
    factor = fit.get("lr_drop", DEFAULT_LR_DROP)
    factor = float(factor) if factor else 0.0
    if not 0.0 <= factor < 1.0 or 0.0 < factor < LR_FLOOR:
        raise ValueError(f"fit.lr_drop {fit.get('lr_drop')}: expected 0 (no drop) or a factor in "
                         f"[{LR_FLOOR:g}, 1), the gate's floor on the tail's rate")
    runs = []
    for lr in fit["lr_grid"]:
        model = build(torch.Generator().manual_seed(seed))
        run = PlateauRun(model, float(lr), train_loss, val_loss, int(fit["eval_every"]),
                         torch.Generator().manual_seed(seed + 7), **kw)
        run.advance(int(fit["pilot_steps"]))
        runs.append(run)
    pilots = {float(r.lr): r.pilot_score(how) for r in runs}  # scored at the pilot's end, as chosen
    run = min(runs, key=lambda r: pilots[float(r.lr)])
    grid = sorted(float(x) for x in fit["lr_grid"])
    edge = None if len(grid) < 2 else ("top" if run.lr == grid[-1] else "bottom" if run.lr == grid[0] else None)
    tol, top, first = float(fit["flat_tol"]), int(fit["max_steps"]), int(fit["min_steps"])
    stopped = run.advance(top, min_steps=first, tol=tol)
    drop_step, drop_gain = None, None
    if stopped and factor and run.step < top:
        drop_step, before = run.step, run.best
        run.set_lr(run.lr * factor)
        # the plateau test reads the last 30 % of the whole curve: stop only once that window lies
        # after the drop, so a flat pre-drop stretch cannot vouch for the dropped rate
        after = max(run.step + int(fit["eval_every"]) * 5, math.ceil(drop_step / (1 - TAIL)))
        stopped = run.advance(top, min_steps=after, tol=tol)
        drop_gain = float((before - run.best) / abs(before)) if before and np.isfinite(before) else None
    stopped = stopped or run.flat(tol)
    run.model.load_state_dict(run.best_state)
    drop = "" if drop_step is None else \
        f" (x{factor:g} from step {drop_step}, best {-100 * (drop_gain or 0):+.1f} %)"
    warn = f"; chosen rate at the grid's {edge}: the grid does not bracket it" if edge else ""
    progress(f"{label}: lr {run.lr:g}{drop}, {run.step} steps ({'plateau' if stopped else 'max steps'}), "
             f"best validation loss {run.best:.3e}{warn}")
    return run.model, {"steps": run.steps, "vals": run.vals, "lrs": run.lrs, "lr": run.lr, "stop": run.step,
                       "drop_step": drop_step, "drop_gain": drop_gain, "lr_edge": edge, "plateau": stopped,
                       "losses": run.losses, "curves": run.curves, "pilot_best": pilots}


def log_fit(metrics, name: str, rec: dict) -> None:
    """Curves ``val_<name>`` and ``lr_<name>`` (what a ``convergence:`` entry reads), one
    ``val_<name>_<curve>`` per curve when ``val_loss`` returned several, and scalars
    ``lr_chosen_<name>``, ``steps_<name>`` (and ``drop_gain_<name>`` after a drop)."""
    metrics.curve(f"val_{name}", rec["steps"], rec["vals"])
    metrics.curve(f"lr_{name}", rec["steps"], rec["lrs"])
    for k, vals in (rec.get("curves") or {}).items():
        metrics.curve(f"val_{name}_{k}", rec["steps"], vals)
    metrics.scalar(f"lr_chosen_{name}", float(rec["lr"]))
    metrics.scalar(f"steps_{name}", float(rec["stop"]))
    if rec.get("drop_gain") is not None:
        metrics.scalar(f"drop_gain_{name}", float(rec["drop_gain"]))
