"""A2SG in miniature: one LIF CNN (T = 4) on procedural MNIST-1D, seven surrogate variants.

Variants (same network, data, steps, optimiser, learning-rate grid, batch order and
initialisation per seed; only the backward pass of the spike differs):

* ``a2sg``: the paper's rule, ST-ASG (β per layer and time step: min SGV at the final step,
  max TGC before it, re-chosen every ``update_every`` steps) with the asymmetric ASY window.
* ``st_asg_tri``: ablation, the same ST-ASG rule with the symmetric TRI window (adaptive only).
* ``asy_fixed``: ablation, the ASY window at the paper's fixed β = 0.5 (asymmetric only).
* ``tri_fixed``: baseline, TRI at β = 0.5 (neither): with the three above, a 2 x 2 factorial
  {fixed, adaptive} x {symmetric, asymmetric}.
* ``rectangular`` (BOX, width 2β = 1) and ``arctan`` (α = 2): fixed symmetric baselines.
* ``guess_membrane``: our earlier guess at "adaptive" (window from the membrane spread, two-sided
  asymmetric triangle), kept as an ablation row and read by no claim.

Training (the same grid and rule for every variant), batches of ``batch`` samples, validation
every ``eval_every`` steps. Phase 1: Adam at each rate of ``lr_grid`` for ``phase1`` steps; the
rate with the lowest validation loss over the last 30 % of phase 1 goes on (successive halving of
the grid). Phase 2: that run at ``lr_drop`` x its rate (0.25, well above the convergence gate's
floor of 0.1) until its validation accuracy, the convergence curve, is on a plateau by the gate's
own test (``claims.plateau``) over a tail wholly in phase 2 with no new best for ``patience``
evaluations, or until ``max_steps``.

Records (each variant and seed): test accuracy and SOPs as per-sample units (``acc``, ``sops``),
sharpness, weight-gradient cross-step cosine, the paper's SGV / CV / TGC of the local gradients,
firing rates, the validation curves, the learning rate, the chosen β per layer and step (adaptive
variants), and the CPU time (the β search included).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import data as D

GENERIC_CURVES = {}


def train_shared(ctx) -> None:
    p = ctx.params["data"]
    n = p["n_train"] + p["n_val"] + p["n_test"]
    x, y = D.mnist1d(n, ctx.rng(2), **p.get("generator", {}))
    np.savez(ctx.outdir / "mnist1d.npz", **D.split(x, y, p["n_train"], p["n_val"], p["n_test"]))


def _tail_mean(xs, ys, tail: float = 0.3) -> float:
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    start = xs[0] + (1 - tail) * (xs[-1] - xs[0])
    return float(ys[xs >= start].mean())


class _Run:
    """One training run at one learning rate, continued in phases (see ``train``)."""

    def __init__(self, ctx, t: dict, lr: float):
        import torch

        from .snn import SpikingCNN
        from .surrogates import STAdaptive, make_surrogate

        p, net = ctx.params, ctx.params["net"]
        self.ctx, self.t, self.lr = ctx, t, lr
        torch.manual_seed(ctx.seed * 7919 + 1)      # identical initialisation for every variant and rate
        self.model = SpikingCNN(1, t["x_train"].shape[-1], channels=tuple(net["channels"]), kernel=net["kernel"],
                                T=net["T"], beta=net["beta"], threshold=net["threshold"]).to(t["y_train"].device)
        self.sur = make_surrogate(ctx.variant, len(net["channels"]), net["T"], p)
        self.adaptive = isinstance(self.sur, STAdaptive)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.gen = torch.Generator().manual_seed(ctx.seed * 104729 + 1)   # identical batch order
        self.step = 0
        self.xs, self.val_loss, self.val_acc, self.lrs = [], [], [], []
        self.search_s = 0.0
        self.evaluate()

    def evaluate(self) -> None:
        from .measures import loss_acc

        self.sur.training = False
        vl, va = loss_acc(self.model, self.sur, self.t["x_val"], self.t["y_val"])
        self.xs.append(self.step)
        self.val_loss.append(vl)
        self.val_acc.append(va)
        self.lrs.append(self.opt.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def train_until(self, last: int, stop=None) -> None:
        """Train to step ``last``, evaluating every ``eval_every`` steps; ``stop(run)`` after an
        evaluation ends the phase early."""
        import torch
        import torch.nn.functional as F

        net, tr, t = self.ctx.params["net"], self.ctx.params["train"], self.t
        n = len(t["y_train"])
        while self.step < last:
            self.model.train()
            self.sur.training = True
            self.sur.progress = self.step / tr["max_steps"]
            idx = torch.randint(n, (tr["batch"],), generator=self.gen).to(t["y_train"].device)
            trace: dict | None = {} if self.adaptive and self.sur.due(self.step) else None
            loss = F.cross_entropy(self.model(t["x_train"][idx], self.sur, trace=trace), t["y_train"][idx])
            if trace is not None:                  # ST-ASG: choose the windows on this batch's graph
                t0 = time.process_time()
                self.sur.search(loss, trace, leak=net["beta"], threshold=net["threshold"], step=self.step)
                self.search_s += time.process_time() - t0
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.step += 1
            if self.step % tr["eval_every"] == 0 or self.step == last:
                self.evaluate()
                if stop is not None and stop(self):
                    break
        self.sur.training = False

    def tail(self) -> float:
        return _tail_mean(self.xs, self.val_loss)


def train(ctx) -> None:
    import torch

    from ...claims import plateau, tail_fit
    from .measures import evaluate, gradient_cosine, local_gradient_stats, local_gradients, per_step_gradients, sharpness
    from .surrogates import STAdaptive

    torch.set_num_threads(max(1, ctx.threads))
    t0 = time.process_time()
    p, net, tr = ctx.params, ctx.params["net"], ctx.params["train"]
    with np.load(Path(ctx.shared_dir) / "mnist1d.npz") as arrays:
        t = {k: torch.from_numpy(arrays[k]).to(p.get("device", "cpu")) for k in arrays.files}
    m = ctx.metrics
    # phase 1: every rate of the grid at a constant rate for ``phase1`` steps; the rate with the
    # lowest validation loss over the last 30 % of phase 1 goes on (successive halving of the grid)
    runs = [_Run(ctx, t, float(lr)) for lr in tr["lr_grid"]]
    for i, run in enumerate(runs):
        run.train_until(tr["phase1"])
        m.scalar(f"val_tail_lr{i}", run.tail())
        ctx.progress(f"lr {run.lr:g}: validation loss over the last 30 % of phase 1 {run.tail():.4f}")
    best = min(runs, key=lambda r: r.tail())
    m.curve("val_loss_grid", [r.lr for r in runs], [r.tail() for r in runs])
    m.scalar("lr_chosen", best.lr)
    # phase 2: the chosen run at lr_drop x lr until its validation accuracy (the convergence
    # curve) is on a plateau by the gate's own test (claims.plateau) over a tail that lies wholly
    # in phase 2 and has made no new best for ``patience`` evaluations, or until max_steps
    earliest = int(np.ceil(tr["phase1"] / 0.7))

    def stop(r) -> bool:
        since_best = len(r.val_acc) - 1 - int(np.argmax(r.val_acc))
        return r.step >= earliest and since_best >= tr["patience"] and plateau(r.xs, r.val_acc, mode="max")

    best.set_lr(best.lr * tr["lr_drop"])
    best.train_until(tr["max_steps"], stop=stop)
    model, sur = best.model, best.sur
    m.scalar("steps_trained", best.step)
    m.scalar("val_loss_tail_improvement", tail_fit(best.xs, best.val_loss)["improvement"])
    m.curve("val_loss", best.xs, best.val_loss)
    m.curve("val_acc", best.xs, best.val_acc)
    m.curve("lr", best.xs, best.lrs)

    ev = evaluate(model, sur, t["x_test"], t["y_test"])
    m.units("acc", ev["correct"])                  # per test sample: 1 correct, 0 wrong
    m.units("sops", ev["sops_units"])              # per test sample: synaptic operations
    for k in ("loss", "fr_l1", "fr_l2", "fr"):
        m.scalar(k, ev[k])
    for l in (1, 2):
        m.curve(f"fr_l{l}_t", range(1, net["T"] + 1), ev[f"fr_l{l}_t"])
    cb, nb = tr["cos_batch"], tr["cos_batches"]
    xt, yt = t["x_test"], t["y_test"]
    m.scalar("grad_cos", float(np.mean([gradient_cosine(per_step_gradients(model, sur, xt[i:i + cb], yt[i:i + cb]))
                                        for i in range(0, cb * nb, cb)])))
    stats = [local_gradient_stats(local_gradients(model, sur, xt[i:i + cb], yt[i:i + cb])) for i in range(0, cb * nb, cb)]
    for k in ("sgv", "cv", "tgc"):
        m.scalar(k, float(np.nanmean([s[k] for s in stats])))
    sh = p["sharpness"]
    m.scalar("sharp", sharpness(model, sur, t["x_train"][:sh["n"]], t["y_train"][:sh["n"]], sh["rho"], sh["dirs"],
                                torch.Generator().manual_seed(ctx.seed * 31 + 1)))
    m.scalar("train_loss", evaluate(model, sur, t["x_train"], t["y_train"])["loss"])
    if hasattr(sur, "widths"):
        for l, row in enumerate(sur.widths()):
            m.curve(f"window_l{l + 1}", range(1, net["T"] + 1), row)
    if isinstance(sur, STAdaptive) and sur.history:
        steps = [s for s, _ in sur.history]
        for l in range(len(net["channels"])):
            m.curve(f"window_mean_l{l + 1}", steps, [float(np.mean(w[l])) for _, w in sur.history])
        m.scalar("search_cpu_seconds", sum(r.search_s for r in runs))
    m.scalar("cpu_seconds", time.process_time() - t0)
    ctx.progress(f"lr {best.lr:g}, {best.step} steps: acc {ev['acc']:.3f} sops {ev['sops']:.0f} sharp {m.scalars['sharp']:.4f} "
                 f"cos {m.scalars['grad_cos']:.3f} tgc {m.scalars['tgc']:.3f} cv {m.scalars['cv']:.3f}")


# --- plots ---------------------------------------------------------------------------------------
from .plots import plot  # noqa: E402,F401  (plot(table, plots_dir, params))
