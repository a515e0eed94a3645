"""A2SG in miniature: one LIF CNN (T = 4) on procedural MNIST-1D, eleven surrogate variants.

Variants (same network, data, optimiser, learning-rate grid, batch order and initialisation per
seed; only the backward pass of the spike differs):

* ``a2sg``: the paper's rule, ST-ASG (β per layer and time step: min SGV at the final step,
  max TGC before it, re-chosen every ``update_every`` steps) with the asymmetric ASY window.
* ``st_asg_tri``: ablation, the same ST-ASG rule with the symmetric TRI window (adaptive only).
* ``asy_fixed``: ablation, the ASY window at the paper's fixed β = 0.5 (asymmetric only).
* ``tri_fixed``: baseline, TRI at β = 0.5 (neither): with the three above, a 2 x 2 factorial
  {fixed, adaptive} x {symmetric, asymmetric}.
* ``tri_width_best`` / ``asy_width_best``: the fixed window at the best width of one sweep, chosen
  jointly with the rate once on validation of the pilot seed (``pilot.py``, seed 100, outside the
  claim seeds; at paper scale, per fit from ``width_grid``): adaptivity against the best fixed width,
  not against β = 0.5 alone; ``asy_width_best`` is A2SG's width control.
* ``asy_random_beta``: the width-matched placebo of ST-ASG, ASY whose β per (layer, step) is dealt on
  the search's schedule from A2SG's own choices for that slot (a fit on the pilot seed, permuted;
  ``surrogates.STMatched``), ignoring the objective; ``tri_random_beta`` the same for ``st_asg_tri``.
* ``asy_rev_fixed``: ASY mirrored about the threshold at β = 0.5 (the larger gradient below it): the
  control of the asymmetry claims.
* ``rectangular`` (BOX, width 2β = 1) and ``arctan`` (α = 2): fixed symmetric baselines.

Training: the shared rule, ``reprozoo.blocks.fitting.fit_to_plateau``, on the validation
cross-entropy (plateau, one rate drop, second plateau, best-validation weights) at the rate of the
config's ``lr`` table (chosen once on validation pilots of the pilot seed, ``pilot.py``; without a table the rule
pilots ``fit.lr_grid`` in every fit); the ST-ASG search runs inside the training loss (before the
backward pass of a due step).

Records (each variant and seed): test accuracy, SOPs and energy as per-sample units (``acc``,
``sops``, ``energy_pj``), sharpness, weight-gradient cross-step cosine, the paper's SGV / CV / TGC
of the local gradients (and, for the fixed windows, both shapes' CV on the same trained weights),
firing rates, the validation curves, the learning rate and its place in the grid (``lr_edge``), the
chosen β per layer and step and how often the search chose an end of its grid (``beta_edge_frac``),
and the CPU time (the β search included).
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


def _fit_one(ctx, t: dict, variant_cfg: dict, fit: dict, label: str, lr_grid=None):
    """One variant's surrogate trained by the shared rule (``blocks.fitting.fit_to_plateau``) on the
    validation cross-entropy. ``variant_cfg`` is its ``surrogates`` entry (a width sweep's entry
    with ``beta`` set to one width). Returns (model, record); ``model.sur`` is its surrogate."""
    import torch
    import torch.nn.functional as F

    from ...blocks.fitting import fit_to_plateau
    from .measures import loss_acc
    from .snn import SpikingCNN
    from .surrogates import STAdaptive, make_surrogate

    p, net = ctx.params, ctx.params["net"]
    n, batch = len(t["y_train"]), int(fit["batch"])
    dev = t["y_train"].device

    def build(gen):
        torch.manual_seed(ctx.seed * 7919 + 1)      # identical initialisation for every variant and rate
        model = SpikingCNN(1, t["x_train"].shape[-1], channels=tuple(net["channels"]), kernel=net["kernel"],
                           T=net["T"], beta=net["beta"], threshold=net["threshold"]).to(dev)
        model.sur = make_surrogate(variant_cfg, len(net["channels"]), net["T"])
        if hasattr(model.sur, "reseed"):            # the placebo's draws: the same for every rate of a seed
            model.sur.reseed(ctx.seed * 7919 + 3)
        model.n_step, model.search_s = 0, 0.0
        return model

    def train_loss(model, gen):
        sur = model.sur
        model.train()
        sur.training = True
        sur.progress = model.n_step / fit["max_steps"]
        idx = torch.randint(n, (batch,), generator=gen).to(dev)   # gen: the same batch order for every run
        adaptive = isinstance(sur, STAdaptive)
        trace: dict | None = {} if adaptive and sur.due(model.n_step) else None
        loss = F.cross_entropy(model(t["x_train"][idx], sur, trace=trace), t["y_train"][idx])
        if trace is not None:                      # ST-ASG: choose the windows on this batch's graph
            t0 = time.process_time()
            sur.search(loss, trace, leak=net["beta"], threshold=net["threshold"], step=model.n_step)
            model.search_s += time.process_time() - t0
        model.n_step += 1
        return loss

    def val_loss(model):
        model.sur.training = False
        vl, va = loss_acc(model, model.sur, t["x_val"], t["y_val"])
        return {"loss": vl, "acc": va}

    cfg = dict(fit)
    if lr_grid is not None:
        cfg["lr_grid"] = list(lr_grid)
    return fit_to_plateau(build, train_loss, val_loss, cfg, ctx.seed, label=label, progress=ctx.progress)


def _pilot_width(ctx, t: dict, sweep_cfg: dict, fit: dict):
    """Width sweep (``*_width_best``): every (width, rate) pair of ``width_grid`` x ``lr_grid``
    piloted for ``pilot_steps`` exactly as the shared rule pilots its rates (the same build,
    batches and validation; scored by the mean of the second half of the validation losses, the
    rule's ``pilot_score: tail``); the pair with the lowest score goes on. Returns (width, rate,
    scores)."""
    scores = {}
    pilot = {**fit, "max_steps": fit["pilot_steps"], "min_steps": fit["pilot_steps"], "lr_drop": 0}
    for w in sweep_cfg["width_grid"]:
        cfg = {k: v for k, v in sweep_cfg.items() if k != "width_grid"}
        cfg["beta"] = float(w)
        for lr in fit["lr_grid"]:
            _, rec = _fit_one(ctx, t, cfg, pilot, label=f"pilot width {float(w):g}", lr_grid=[lr])
            scores[(float(w), float(lr))] = float(np.mean(rec["vals"][len(rec["vals"]) // 2:]))
    (w, lr), _ = min(scores.items(), key=lambda kv: kv[1])
    return w, lr, scores


def train(ctx) -> None:
    import torch

    from ...blocks.fitting import log_fit
    from ...blocks.rate_table import fit_with_table_rate, grid_edge
    from ...claims import tail_fit
    from .measures import (evaluate, final_step_local, gradient_cosine, local_gradient_stats, local_gradients,
                           per_step_gradients, sharpness, theorem_condition, window_cv)
    from .surrogates import STAdaptive, make_surrogate

    torch.set_num_threads(max(1, ctx.threads))
    t0 = time.process_time()
    p, net, fit = ctx.params, ctx.params["net"], ctx.params["fit"]
    with np.load(Path(ctx.shared_dir) / "mnist1d.npz") as arrays:
        t = {k: torch.from_numpy(arrays[k]).to(p.get("device", "cpu")) for k in arrays.files}
    m = ctx.metrics
    vcfg = dict(p["surrogates"][ctx.variant])
    # smoke and ci: the rate of the config's `lr` table, chosen once on validation pilots (pilot seed) of
    # fit.lr_grid (pilot.py; its table on the page), so no fit pilots the grid again; without a table
    # entry (paper scale) the shared rule pilots the grid in every fit
    fit_cfg, lr_rec = fit_with_table_rate(fit, p.get("lr"), ctx.variant, required=False)
    m.scalar("lr_from_table", 1.0 if lr_rec["lr_source"] == "table" else 0.0)
    if "width_grid" in vcfg:
        # paper scale: the best fixed width of a small sweep, chosen jointly with the rate on every
        # fit's pilots (the same sweep for TRI and ASY); then the shared rule at that pair
        width, lr, scores = _pilot_width(ctx, t, vcfg, fit)
        widths = sorted(float(w) for w in vcfg["width_grid"])
        m.scalar("width_chosen", width)
        m.scalar("width_edge", 1.0 if width == widths[-1] else -1.0 if width == widths[0] else 0.0)
        for (w, r), s in scores.items():
            m.scalar(f"pilot_w{w:g}_lr{r:g}", s)
        vcfg = {k: v for k, v in vcfg.items() if k != "width_grid"}
        vcfg["beta"] = width
        model, rec = _fit_one(ctx, t, vcfg, fit, label=ctx.variant, lr_grid=[lr])
    else:
        model, rec = _fit_one(ctx, t, vcfg, fit_cfg, label=ctx.variant)
        lr = float(rec["lr"])
        if lr_rec["lr_source"] == "grid":
            for r, s in rec["pilot_best"].items():     # each rate's pilot score (validation loss, 2nd half)
                m.scalar(f"pilot_lr{r:g}", s)
    if vcfg.get("kind") == "fixed_window":
        m.scalar("width_chosen", float(vcfg["beta"]))
    if vcfg.get("beta_max") is not None:
        m.scalar("beta_max", float(vcfg["beta_max"]))
    sur = model.sur
    # the rate's position in fit.lr_grid (whether piloted now or once on the pilot seed): +1 top, -1 bottom,
    # 0 inside (the grid brackets it)
    edge = grid_edge(lr, fit["lr_grid"])
    m.scalar("lr_edge", 1.0 if edge == "top" else -1.0 if edge == "bottom" else 0.0)
    log_fit(m, "model", rec)
    m.scalar("lr_chosen", lr)
    m.scalar("steps_trained", float(rec["stop"]))
    m.scalar("plateau_reached", float(bool(rec["plateau"])))
    m.scalar("val_loss_tail_improvement", tail_fit(rec["steps"], rec["vals"])["improvement"])
    m.curve("val_acc", rec["steps"], rec["curves"]["acc"])

    ev = evaluate(model, sur, t["x_test"], t["y_test"])
    m.units("acc", ev["correct"])                  # per test sample: 1 correct, 0 wrong
    m.units("sops", ev["sops_units"])              # per test sample: synaptic operations
    m.units("energy_pj", ev["energy_units"])       # per test sample: 4.6 pJ / MAC (layer 1) + 0.9 pJ / AC
    for k in ("loss", "fr_l1", "fr_l2", "fr", "macs_l1"):
        m.scalar(k, ev[k])
    for l in (1, 2):
        m.curve(f"fr_l{l}_t", range(1, net["T"] + 1), ev[f"fr_l{l}_t"])
    cb, nb = fit["cos_batch"], fit["cos_batches"]
    xt, yt = t["x_test"], t["y_test"]
    m.scalar("grad_cos", float(np.mean([gradient_cosine(per_step_gradients(model, sur, xt[i:i + cb], yt[i:i + cb]))
                                        for i in range(0, cb * nb, cb)])))
    stats = [local_gradient_stats(local_gradients(model, sur, xt[i:i + cb], yt[i:i + cb])) for i in range(0, cb * nb, cb)]
    for k in ("sgv", "cv", "tgc"):
        m.scalar(k, float(np.nanmean([s[k] for s in stats])))
    if vcfg.get("kind") == "fixed_window":
        # Theorem 4.2 paired: the shapes' final-step local gradients on the SAME trained weights, at
        # this width (asy_rev, the ramp mirrored, is the paired claims' control). Per layer: the CV over
        # all entries (cv_<shape>_same, layer mean, as before) and over the in-window entries only
        # (cv_<shape>_win_l<l>); the theorem's condition from the membrane distribution (thm_cond_l<l>,
        # measures.theorem_condition); the ratios to TRI's in-window CV, layer means (cv_ratio_*_win).
        beta_w, L = float(vcfg["beta"]), len(net["channels"])
        batches = [(xt[i:i + cb], yt[i:i + cb]) for i in range(0, cb * nb, cb)]
        win, alls = {}, {}
        for shape in ("tri", "asy", "asy_rev"):
            other = make_surrogate({**vcfg, "shape": shape}, L, net["T"])
            per = [final_step_local(model, other, xb, yb) for xb, yb in batches]
            win[shape] = [float(np.nanmean([window_cv(b[l][0], b[l][1], beta_w) for b in per])) for l in range(L)]
            alls[shape] = float(np.nanmean([float(b[l][0].std(unbiased=False)) / float(b[l][0].abs().mean())
                                            for b in per for l in range(L) if float(b[l][0].abs().mean()) > 0]))
            m.scalar(f"cv_{shape}_same", alls[shape])
            for l in range(L):
                m.scalar(f"cv_{shape}_win_l{l + 1}", win[shape][l])
            if shape == "tri":
                for l in range(L):
                    u_all = torch.cat([b[l][1] for b in per])
                    cond = theorem_condition(u_all, beta_w)
                    m.scalar(f"thm_cond_l{l + 1}", cond["margin"])
                    m.scalar(f"win_mean_x_l{l + 1}", cond["mean_x"])
                    m.scalar(f"win_frac_l{l + 1}", cond["frac"])
        for shape, name in (("asy", "asy"), ("asy_rev", "rev")):
            ratios = [win[shape][l] / win["tri"][l] for l in range(L)]
            for l in range(L):
                m.scalar(f"cv_ratio_{name}_win_l{l + 1}", ratios[l])
            m.scalar(f"cv_ratio_{name}_win", float(np.mean(ratios)))
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
        # how often the search chose an end of its grid (every layer, step and search of the chosen run):
        # a search pinned at an edge says the range, not the objective, chose the window
        lo, hi = float(sur.grid.min()), float(sur.grid.max())
        chosen = np.array([b for _, w in sur.history for row in w for b in row])
        m.scalar("beta_edge_frac", float(np.mean(np.isclose(chosen, lo) | np.isclose(chosen, hi))))
        m.scalar("beta_top_frac", float(np.mean(np.isclose(chosen, hi))))
        m.scalar("beta_bottom_frac", float(np.mean(np.isclose(chosen, lo))))
        m.scalar("search_cpu_seconds", float(model.search_s))
    m.scalar("cpu_seconds", time.process_time() - t0)
    ctx.progress(f"lr {lr:g}, {rec['stop']} steps: acc {ev['acc']:.4f} sops {ev['sops']:.0f} sharp {m.scalars['sharp']:.4f} "
                 f"cos {m.scalars['grad_cos']:.3f} tgc {m.scalars['tgc']:.3f} cv {m.scalars['cv']:.3f}")


# --- plots ---------------------------------------------------------------------------------------
from .plots import plot  # noqa: E402,F401  (plot(table, plots_dir, params))
