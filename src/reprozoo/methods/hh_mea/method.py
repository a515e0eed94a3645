"""HH parameters from MEA electrical images by NPE, judged by predicting stimulation responses.

Variants (all share one seed's simulations, test cells and stimulation trials):
  npe_features  (method)   sbi NPE (MDN) on designed EI features + geometry descriptors
  npe_raw       (baseline) the same NPE on the raw EI traces (pooled 4x in time) with an MLP embedding
  gradient_fit  (baseline) Adam on the EI squared error through the differentiable simulator
  default_hh    (baseline) textbook HH parameters for every cell

Stages and units:
  train_shared  θ ~ prior (log ḡ_Na, log ḡ_K, log g_L, log R_a; mS/cm², Ω·cm), geometry ψ ~ its
                prior (µm, degrees); EIs (µV) of n_sims training and n_sbc held-out simulations;
                the first n_cells held-out cells are the "recorded" test cells: per cell
                n_patterns multi-electrode patterns, their true thresholds (µA, bisection) and
                n_amps trial amplitudes log-uniform in [thr/2, 2 thr], labelled spike / no spike
                by the true cell.
  train         fit θ̂ for the test cells, predict every trial's response with the fitted model,
                accuracy = fraction of a cell's trials predicted right; threshold error = median over
                a cell's patterns of |log(thr̂/thr)|; both per test cell (the claims' units);
                for NPE variants also SBC on the n_sbc held-out simulations.
"""
from __future__ import annotations

import time

import numpy as np

from .cell_model import PARAM_NAMES, PARAM_UNITS, Experiment, random_patterns
from reprozoo.figures import save_figure

VARIANTS = ("npe_features", "npe_raw", "gradient_fit", "default_hh")


def _experiment(p: dict) -> Experiment:
    return Experiment(**p.get("experiment", {}))


def _load(ctx) -> dict:
    f = ctx.shared_dir / "shared.npz"
    if not f.exists():
        raise FileNotFoundError(f"{f} missing: train_shared (spec train_shared: true) writes it per seed")
    with np.load(f) as z:
        return {k: z[k] for k in z.files}


# --- shared per-seed work --------------------------------------------------------------------

def train_shared(ctx) -> None:
    import torch

    from ...io import save_npz
    from .features import designed_features, raw_traces

    torch.set_num_threads(max(1, ctx.threads))
    p = ctx.params
    exp = _experiment(p)
    elec_xy = exp.elec[:, :2].numpy().astype(float)
    rng = ctx.rng(0)
    t0 = time.perf_counter()
    out = {}
    for split, n in (("train", p["n_sims"]), ("sbc", p["n_sbc"])):
        th, psi = exp.sample_theta(n, rng), exp.sample_geometry(n, rng)
        ei = exp.record(th, psi, rng)
        out[f"theta_{split}"], out[f"psi_{split}"] = th, psi
        out[f"feat_{split}"] = designed_features(ei, psi, elec_xy, exp.dt)
        out[f"raw_{split}"] = raw_traces(ei, psi)
        if split == "sbc":
            out["ei_cells"] = ei[: p["n_cells"]].numpy()
    ctx.metrics.scalar("sim_seconds", time.perf_counter() - t0)
    ctx.progress(f"{p['n_sims']} + {p['n_sbc']} recordings simulated in {time.perf_counter() - t0:.1f}s")

    # stimulation trials of the test cells
    nc, npat, namp = p["n_cells"], p["n_patterns"], p["n_amps"]
    th_c, psi_c = out["theta_sbc"][:nc], out["psi_sbc"][:nc]
    pats = random_patterns(exp, psi_c, npat, rng).reshape(nc * npat, -1)
    cell = np.repeat(np.arange(nc), npat)
    thr = exp.thresholds(th_c[cell], psi_c[cell], pats).numpy()
    keep = np.isfinite(thr)                    # patterns that can activate the true cell at all
    pats, cell, thr = pats[keep], cell[keep], thr[keep]
    amp_rel = np.exp(rng.uniform(np.log(0.5), np.log(2.0), size=(len(thr), namp)))
    amps = thr[:, None] * amp_rel
    t_cell = np.repeat(cell, namp)
    currents = np.repeat(pats, namp, 0) * amps.reshape(-1, 1)
    labels = exp.respond(th_c[t_cell], psi_c[t_cell], currents).numpy()
    out.update(patterns=pats, pattern_cell=cell, thr_true=thr, trial_cell=t_cell, trial_currents=currents,
               trial_pattern=np.repeat(np.arange(len(thr)), namp), labels=labels)
    ctx.metrics.scalar("n_trials", len(labels))
    ctx.metrics.scalar("spike_fraction", labels.mean())
    ctx.metrics.scalar("patterns_kept", keep.mean())
    ctx.progress(f"{len(labels)} stimulation trials, {labels.mean():.2f} spiking, {time.perf_counter() - t0:.1f}s")
    save_npz(ctx.outdir / "shared.npz", **out)


# --- per variant -----------------------------------------------------------------------------

def train(ctx) -> None:
    import torch

    torch.set_num_threads(max(1, ctx.threads))
    p, v = ctx.params, ctx.variant
    if v not in VARIANTS:
        raise ValueError(f"unknown variant {v!r}; this method has {VARIANTS}")
    d = _load(ctx)
    exp = _experiment(p)
    low, high = exp.prior_low, exp.prior_high
    nc = p["n_cells"]
    t0 = time.perf_counter()
    post_cell0 = None
    sim_calls = 0
    if v in ("npe_features", "npe_raw"):
        from .inference import sample_posterior, sbc_summary, train_npe

        key = "feat" if v == "npe_features" else "raw"
        posterior, summ = train_npe(d["theta_train"], d[f"{key}_train"], low, high, p["npe"], ctx.seed,
                                    embed=p["raw_embed"] if v == "npe_raw" else None)
        vl = [float(x) for x in summ["validation_loss"]]    # sbi 0.27 stores the validation loss (-log q), lower is better
        ctx.metrics.curve("val_loss", range(1, len(vl) + 1), vl)
        ctx.metrics.scalar("epochs", len(vl))
        ctx.metrics.scalar("val_loss_final", min(vl))
        tail = vl[-min(10, len(vl)):]
        ctx.metrics.scalar("val_loss_slope_last10", float(np.polyfit(np.arange(len(tail)), tail, 1)[0]) if len(tail) > 1 else 0.0)
        ctx.progress(f"NPE trained, {len(vl)} epochs, val loss {min(vl):.3f}")
        draws = sample_posterior(posterior, d[f"{key}_sbc"], p["sbc_draws"])      # (L, N, 4)
        sbc = sbc_summary(d["theta_sbc"], draws)
        ctx.metrics.scalar("sbc_cov_err", sbc["cov_err"])
        ctx.metrics.scalar("sbc_ks_p_min", sbc["ks_p_min"])
        # negative control for the calibration claim: the same posteriors made over-confident (every draw
        # pulled halfway to its posterior's mean); the SBC test must flag them
        centre = draws.mean(0, keepdims=True)
        ctx.metrics.scalar("sbc_cov_err_overconf", sbc_summary(d["theta_sbc"], centre + 0.5 * (draws - centre))["cov_err"])
        ctx.metrics.curve("sbc_coverage", sbc["levels"], sbc["coverage"].mean(1))
        for j, name in enumerate(PARAM_NAMES):
            ctx.metrics.curve(f"sbc_coverage_{name}", sbc["levels"], sbc["coverage"][:, j])
        post_mean = draws.mean(0)
        _param_errors(ctx, post_mean, d["theta_sbc"], low, high, "sbc")
        theta_hat = post_mean[:nc]
        post_cell0 = draws[:, 0]
        sim_calls = len(d["theta_train"])
    elif v == "gradient_fit":
        from ...blocks.fitting import log_fit
        from .inference import gradient_fit

        ei = torch.as_tensor(d["ei_cells"])
        theta_hat, rec = gradient_fit(exp, ei, d["psi_sbc"][:nc], low, high, p["grad_fit"], ctx.seed, ctx.progress)
        log_fit(ctx.metrics, "gradient_fit", rec)          # val_gradient_fit / lr_gradient_fit: the gate's curves
        ctx.metrics.scalar("grad_loss_final", min(rec["vals"]))
        ctx.metrics.scalar("grad_plateau", float(rec["plateau"]))
        sim_calls = nc * (len(p["grad_fit"]["lr_grid"]) * p["grad_fit"]["pilot_steps"]
                          + rec["stop"] - p["grad_fit"]["pilot_steps"])
    else:
        theta_hat = np.repeat(exp.theta_default[None], nc, 0)
    ctx.metrics.scalar("fit_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("sim_calls", sim_calls)
    _param_errors(ctx, theta_hat, d["theta_sbc"][:nc], low, high, "cells")

    # predict the held-out stimulation trials with the fitted models
    psi_c = d["psi_sbc"][:nc]
    tc = d["trial_cell"]
    pred = exp.respond(theta_hat[tc], psi_c[tc], d["trial_currents"]).numpy()
    acc_trial = pred == d["labels"]
    cells = [c for c in range(nc) if np.any(tc == c)]              # test units: the cells (same for every variant)
    ctx.metrics.scalar("acc_trials", acc_trial.mean())
    acc_cell = np.array([acc_trial[tc == c].mean() for c in cells])
    ctx.metrics.units("acc", acc_cell)                              # mean over cells of each cell's trial accuracy
    ctx.metrics.scalar("acc_cell_min", acc_cell.min())
    pc = d["pattern_cell"]
    thr_hat = exp.thresholds(theta_hat[pc], psi_c[pc], d["patterns"], hi=THR_HI).numpy()
    ctx.metrics.scalar("thr_never_fires", float(np.mean(~np.isfinite(thr_hat))))
    thr_hat = np.minimum(thr_hat, THR_HI)     # a model that never fires below THR_HI counts as firing at it (a lower bound)
    err = np.abs(np.log(thr_hat / d["thr_true"]))                  # per pattern
    ctx.metrics.units("thr_log_err", [np.median(err[pc == c]) for c in cells])
    ctx.metrics.scalar("thr_log_err_median", float(np.median(err)))
    ctx.metrics.scalar("thr_within_10pct", float(np.mean(err < np.log(1.1))))
    widths = np.array(WINDOWS)
    ctx.metrics.curve("acc_window", widths, window_accuracy(err, widths))
    ctx.progress(f"stimulation accuracy {acc_cell.mean():.3f} (per cell), mean per-cell median |log thr ratio| "
                 f"{np.mean([np.median(err[pc == c]) for c in cells]):.3f}")
    _record_traces(ctx, exp, d["theta_sbc"][0], theta_hat[0], psi_c[0], post_cell0)
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t0)


THR_HI = 200.0                  # µA, top of the threshold bisection (patterns the true cell ignores there are dropped)
WINDOWS = (1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0)


def window_accuracy(err: np.ndarray, widths) -> np.ndarray:
    """Expected trial accuracy when trial amplitudes are log-uniform in [thr/w, w·thr] around each
    pattern's true threshold thr, for a model whose predicted threshold is off by err = |log(thr̂/thr)|
    (responses monotone in amplitude: the true cell fires iff a >= thr, the model iff a >= thr̂). The
    trials between thr and thr̂ are the wrong ones, a log-length min(err, log w) out of 2 log w, so
    acc(w) = 1 - mean min(err, log w) / (2 log w). The accuracy's level is set by the window w: this
    curve shows how, and the threshold error is the window-free number behind it."""
    lw = np.log(np.asarray(widths, float))[:, None]
    e = np.asarray(err, float)[None]
    return 1.0 - (np.minimum(e, lw) / (2 * lw)).mean(1)


def _param_errors(ctx, theta_hat, theta_true, low, high, tag: str) -> None:
    """RMSE of θ̂ in units of the prior width, per parameter and averaged."""
    e = np.sqrt(np.mean(((theta_hat - theta_true) / (high - low)) ** 2, axis=0))
    for name, x in zip(PARAM_NAMES, e):
        ctx.metrics.scalar(f"nrmse_{name}_{tag}", x)
    ctx.metrics.scalar(f"nrmse_{tag}", e.mean())


def _record_traces(ctx, exp, theta_true, theta_hat, psi, draws) -> None:
    """Test cell 0: soma / distal-axon V(t) and the max-electrode EI, truth and fitted model;
    its posterior draws (NPE variants) for the pair plot. Stored as curves of the long table."""
    import torch

    from ...blocks.hodgkin_huxley import Stimulus, simulate

    th = np.stack([theta_true, theta_hat])
    ps = np.stack([psi, psi])
    steps = int(round(exp.t_record / exp.dt))
    wave = torch.zeros(steps, dtype=exp.dtype)
    on = int(round(0.2 / exp.dt))
    wave[on:on + int(round(exp.trigger_ms / exp.dt))] = 1.0
    prof = torch.zeros(2, exp.cable.n, dtype=exp.dtype)
    prof[:, 0] = exp.trigger_na
    with torch.no_grad():
        r = simulate(exp.params(exp._t(th)), exp.cable, exp.dt, steps, 2, i_inj=Stimulus(prof, wave),
                     record_current=True, dtype=exp.dtype)
        ei = 1e3 * torch.einsum("ben,btn->bet", exp.lead_field(exp._t(ps)), r.i_m)
    t = r.t_ms.numpy()
    e_max = int((ei[0].amax(-1) - ei[0].amin(-1)).argmax())
    for tag, i in (("true", 0), ("fit", 1)):
        ctx.metrics.curve(f"trace_v_soma_{tag}", t, r.v[i, :, 0].numpy())
        ctx.metrics.curve(f"trace_v_axon_{tag}", t, r.v[i, :, -3].numpy())
        ctx.metrics.curve(f"trace_ei_{tag}", t, ei[i, e_max].numpy())
    for j, name in enumerate(PARAM_NAMES):
        ctx.metrics.scalar(f"cell0_true_{name}", theta_true[j])
        ctx.metrics.scalar(f"cell0_fit_{name}", theta_hat[j])
        if draws is not None:
            ctx.metrics.curve(f"post_{name}", range(len(draws)), draws[:, j])


# --- plots -----------------------------------------------------------------------------------

_COLORS = {"npe_features": "C0", "npe_raw": "C1", "gradient_fit": "C2", "default_hh": "C3"}


def plot(table, plots_dir, params) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = table[table["method"] == "hh_mea"] if "method" in table else table
    if t.empty:
        return
    seed0 = sorted(t["seed"].unique())[0]

    def curve(variant, metric, seed=seed0):
        c = t[(t["variant"] == variant) & (t["metric"] == metric) & (t["seed"] == seed)].sort_values("x")
        return c["x"].to_numpy(), c["value"].to_numpy()

    def scalars(metric):
        s = t[(t["metric"] == metric) & t["x"].isna()]
        return {v: s[s["variant"] == v]["value"].to_numpy() for v in VARIANTS if (s["variant"] == v).any()}

    variants = [v for v in VARIANTS if (t["variant"] == v).any()]

    # 1. voltage traces of test cell 0: truth vs each variant's fitted model
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    panels = (("trace_v_soma", "soma V (mV)"), ("trace_v_axon", "distal axon V (mV)"),
              ("trace_ei", "EI, max electrode (µV)"))
    for ax, (m, lab) in zip(axes, panels):
        drawn = False
        for v in variants:
            x, y = curve(v, f"{m}_fit")
            if len(x):
                ax.plot(x, y, color=_COLORS[v], lw=1.2, label=v)
            if not drawn:
                x, y = curve(v, f"{m}_true")
                if len(x):
                    ax.plot(x, y, "k--", lw=1.5, label="true cell")
                    drawn = True
        ax.set_xlabel("time (ms)")
        ax.set_ylabel(lab)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Does the fitted HH model reproduce the test cell's spike? (seed {seed0}, cell 0)")
    save_figure(fig, plots_dir / "voltage_traces.png", dpi=120)

    # 2. posterior pair plot of test cell 0
    from .cell_model import PARAM_NAMES as names
    post = {v: [curve(v, f"post_{n}")[1] for n in names] for v in ("npe_features", "npe_raw")
            if len(curve(v, f"post_{names[0]}")[0])}
    if post:
        d = len(names)
        fig, axes = plt.subplots(d, d, figsize=(9, 9))
        truth = [t[(t["metric"] == f"cell0_true_{n}") & (t["seed"] == seed0)]["value"].iloc[0] for n in names]
        for i in range(d):
            for j in range(d):
                ax = axes[i, j]
                for v, s in post.items():
                    if i == j:
                        ax.hist(s[i], bins=25, alpha=0.5, color=_COLORS[v], density=True, label=v)
                    elif i > j:
                        ax.scatter(s[j], s[i], s=3, alpha=0.4, color=_COLORS[v])
                if i == j:
                    ax.axvline(truth[i], color="k", ls="--")
                elif i > j:
                    ax.plot(truth[j], truth[i], "k*", ms=10)
                else:
                    ax.axis("off")
                if i == d - 1:
                    ax.set_xlabel(f"log {names[j]} ({PARAM_UNITS[j]})")
                if j == 0 and i > 0:
                    ax.set_ylabel(f"log {names[i]} ({PARAM_UNITS[i]})")
        axes[0, 0].legend(fontsize=7)
        fig.suptitle(f"Where is test cell 0's posterior, and does it cover the truth (star)? (seed {seed0})")
        save_figure(fig, plots_dir / "posterior_pairs.png", dpi=120)

    # 3. stimulation accuracy per variant, every seed
    acc = scalars("acc")
    if acc:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        for k, (v, a) in enumerate(acc.items()):
            ax.bar(k, a.mean(), color=_COLORS[v], alpha=0.6)
            ax.plot(np.full(len(a), k), a, "ko", ms=4)
        ax.axhline(0.904, color="gray", ls=":", label="paper 90.4 % (at its own amplitudes)")
        ax.set_xticks(range(len(acc)), list(acc), rotation=15)
        ax.set_ylabel("held-out stimulation accuracy, w = 2 (per-cell mean)")
        ax.set_ylim(0.5, 1.0)
        ax.legend(fontsize=8)
        ax.set_title("Which fitted model predicts held-out stimulation responses best?")
        save_figure(fig, plots_dir / "stim_accuracy.png", dpi=120)

    # 3b. accuracy as a function of the trial window (from the threshold errors), every variant
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for v in variants:
        c = t[(t["variant"] == v) & (t["metric"] == "acc_window")]
        if c.empty:
            continue
        g = c.groupby("x")["value"]
        ax.plot(g.mean().index, g.mean(), "o-", ms=3, color=_COLORS[v], label=v)
        ax.fill_between(g.mean().index, g.min(), g.max(), color=_COLORS[v], alpha=0.2)
    ax.axhline(0.904, color="gray", ls=":", label="paper 90.4 %")
    ax.set_xscale("log")
    ax.set_xticks(WINDOWS, [f"{w:g}" for w in WINDOWS])
    ax.minorticks_off()
    ax.set_xlabel("trial window w: amplitudes log-uniform in [thr/w, w thr]")
    ax.set_ylabel("expected trial accuracy")
    ax.legend(fontsize=7)
    ax.set_title("How much of the accuracy is the window's? (seed min-max)")
    save_figure(fig, plots_dir / "accuracy_vs_window.png", dpi=120)

    # 4. SBC expected coverage with the seed spread
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for v in ("npe_features", "npe_raw"):
        c = t[(t["variant"] == v) & (t["metric"] == "sbc_coverage")]
        if c.empty:
            continue
        g = c.groupby("x")["value"]
        x, m, lo, hi = g.mean().index, g.mean(), g.min(), g.max()
        ax.plot(x, m, color=_COLORS[v], label=v)
        ax.fill_between(x, lo, hi, color=_COLORS[v], alpha=0.2)
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
    ax.set_xlabel("nominal credibility level")
    ax.set_ylabel("empirical coverage (mean over parameters)")
    ax.legend(fontsize=8)
    ax.set_title("Are the NPE posteriors calibrated (SBC)?")
    save_figure(fig, plots_dir / "sbc_coverage.png", dpi=120)

    # 5. training curves
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for v in ("npe_features", "npe_raw"):
        for s in sorted(t["seed"].unique()):
            x, y = curve(v, "val_loss", s)
            if len(x):
                axes[0].plot(x, y, color=_COLORS[v], alpha=0.7, label=v if s == seed0 else None)
    axes[0].set_xlabel("epoch")
    axes[0].set_ylabel("validation -log q(θ|x) (nats)")
    axes[0].legend(fontsize=8)
    for s in sorted(t["seed"].unique()):
        x, y = curve("gradient_fit", "val_gradient_fit", s)
        if len(x):
            axes[1].plot(x, y, color=_COLORS["gradient_fit"], alpha=0.7)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("Adam step (chosen rate, after the rate pilot)")
    axes[1].set_ylabel("normalised EI squared error")
    fig.suptitle("Did NPE and the gradient fit train until flat?")
    save_figure(fig, plots_dir / "curve_training.png", dpi=120)
