"""A2SG in miniature: one LIF CNN (T = 4), five surrogates, two small data sets.

Variants (same network, data, steps, optimiser, batch order and initialisation per seed; only the
backward pass of the spike differs, every surrogate with area 1):

* ``a2sg``: adaptive + asymmetric triangle, window from per-(layer, step) membrane spread
  (``surrogates.AdaptiveWindow``), above/below ratio r = 2.
* ``a2sg_symmetric``: ablation, the same adaptive window with r = 1 (adaptive part only).
* ``rectangular`` (width 1), ``sigmoid`` (α = 4), ``arctan`` (α = 2): fixed symmetric baselines,
  the block's default widths.

Stages: ``train_shared`` (per seed) draws both data sets; ``train`` (per variant x seed) trains on
each data set in turn (sklearn digits 8x8 with a 2-D CNN, procedural MNIST-1D with a 1-D CNN) and
records per data set ``<metric>_<dataset>``: test accuracy, sharpness (mean loss rise under a
relative weight perturbation ρ, nats), mean cross-time-step gradient cosine, firing rates per
layer (spikes / neuron / step), synaptic operations per sample, the validation-loss curve and the
surrogate windows at the start and the end of training (A2SG).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import data as D

GENERIC_CURVES = {}
DATASETS = ("digits", "mnist1d")


def train_shared(ctx) -> None:
    p = ctx.params
    xd, yd = D.digits(ctx.rng(1))
    xm, ym = D.mnist1d(sum(p["mnist1d"]["split"]), ctx.rng(2), **p["mnist1d"].get("generator", {}))
    for name, (x, y), sp in (("digits", (xd, yd), p["digits"]["split"]), ("mnist1d", (xm, ym), p["mnist1d"]["split"])):
        np.savez(ctx.outdir / f"{name}.npz", **D.split(x, y, *sp))


def _fit(ctx, name: str, arrays) -> None:
    import torch
    import torch.nn.functional as F

    from .measures import evaluate, gradient_cosine, per_step_gradients, sharpness
    from .snn import SpikingCNN
    from .surrogates import make_surrogate

    p, net = ctx.params, ctx.params["net"]
    tr = p["train"]
    device = p.get("device", "cpu")
    t = {k: torch.from_numpy(arrays[k]).to(device) for k in arrays.files}
    dim = 2 if name == "digits" else 1
    # identical initialisation and batch order for every variant of a seed
    torch.manual_seed(ctx.seed * 7919 + dim)
    model = SpikingCNN(dim, t["x_train"].shape[-1], channels=tuple(net["channels"]),
                       kernel=net["kernel"][name], T=net["T"], beta=net["beta"], threshold=net["threshold"]).to(device)
    sur = make_surrogate(ctx.variant, 2, net["T"], p)
    opt = torch.optim.Adam(model.parameters(), lr=tr["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, tr["steps"])
    gen = torch.Generator().manual_seed(ctx.seed * 104729 + dim)
    n = len(t["y_train"])
    steps_x, val_loss, val_acc, cos_x, cos_y = [], [], [], [], []
    widths_start = None
    xv, yv = t["x_val"], t["y_val"]
    for step in range(tr["steps"] + 1):
        if step % tr["eval_every"] == 0 or step == tr["steps"]:
            ev = evaluate(model, sur, xv, yv)
            steps_x.append(step)
            val_loss.append(ev["loss"])
            val_acc.append(ev["acc"])
            cos_x.append(step)
            cos_y.append(gradient_cosine(per_step_gradients(model, sur, xv[: tr["cos_batch"]], yv[: tr["cos_batch"]])))
        if step == tr["steps"]:
            break
        model.train()
        sur.training = True
        sur.progress = step / tr["steps"]
        idx = torch.randint(n, (tr["batch"],), generator=gen).to(device)
        loss = F.cross_entropy(model(t["x_train"][idx], sur), t["y_train"][idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step == 0 and hasattr(sur, "widths"):
            widths_start = sur.widths()
    sur.training = False
    m = ctx.metrics
    ev = evaluate(model, sur, t["x_test"], t["y_test"])
    for k in ("acc", "loss", "fr_l1", "fr_l2", "fr", "sops"):
        m.scalar(f"{k}_{name}", ev[k])
    for l in (1, 2):
        m.curve(f"fr_l{l}_t_{name}", range(1, net["T"] + 1), ev[f"fr_l{l}_t"])
    m.curve(f"val_loss_{name}", steps_x, val_loss)
    m.curve(f"val_acc_{name}", steps_x, val_acc)
    m.curve(f"grad_cos_train_{name}", cos_x, cos_y)  # over training; the scalar grad_cos_ is the end value
    tail = max(2, len(val_loss) // 4)
    m.scalar(f"val_loss_slope_{name}", float(np.polyfit(steps_x[-tail:], val_loss[-tail:], 1)[0]))
    cos = [gradient_cosine(per_step_gradients(model, sur, xv[i:i + tr["cos_batch"]], yv[i:i + tr["cos_batch"]]))
           for i in range(0, min(len(yv), tr["cos_batch"] * tr["cos_batches"]), tr["cos_batch"])]
    m.scalar(f"grad_cos_{name}", float(np.mean(cos)))
    sh_n = p["sharpness"]["n"]
    m.scalar(f"sharp_{name}", sharpness(model, sur, t["x_train"][:sh_n], t["y_train"][:sh_n],
                                        p["sharpness"]["rho"], p["sharpness"]["dirs"],
                                        torch.Generator().manual_seed(ctx.seed * 31 + dim)))
    m.scalar(f"train_loss_{name}", evaluate(model, sur, t["x_train"][:sh_n], t["y_train"][:sh_n])["loss"])
    if hasattr(sur, "widths"):
        for l in range(2):
            m.curve(f"window_start_l{l + 1}_{name}", range(1, net["T"] + 1), widths_start[l])
            m.curve(f"window_end_l{l + 1}_{name}", range(1, net["T"] + 1), sur.widths()[l])
    ctx.progress(f"{name}: acc {ev['acc']:.3f} sharp {m.scalars[f'sharp_{name}']:.4f} "
                 f"cos {m.scalars[f'grad_cos_{name}']:.3f} fr {ev['fr_l1']:.3f}/{ev['fr_l2']:.3f}")


def train(ctx) -> None:
    import torch

    torch.set_num_threads(max(1, ctx.threads))
    t0 = time.process_time()
    for name in ctx.params.get("datasets", DATASETS):
        with np.load(Path(ctx.shared_dir) / f"{name}.npz") as arrays:
            _fit(ctx, name, arrays)
    ctx.metrics.scalar("cpu_seconds", time.process_time() - t0)


# --- plots ---------------------------------------------------------------------------------------
from .plots import plot  # noqa: E402,F401  (plot(table, plots_dir, params))
