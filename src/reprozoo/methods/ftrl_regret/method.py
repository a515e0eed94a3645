"""Discounted FTRL vs undiscounted FTRL vs OGD: dynamic regret against drifting comparators.

Variants (one training cell per variant x seed; every variant sees the same streams of its seed):
  dftrl_tuned     discounted FTRL with the theory's discount 1 - beta = sqrt(kappa P_T / (d T))
                  (P_T known, as the theorem's tuning assumes)
  dftrl_ensemble  discounted FTRL on a factor-2 grid of discounts, aggregated by fixed-share
                  exponential weights: no knowledge of P_T
  ftrl            undiscounted FTRL (beta = 1): the VAW forecaster / Newton-FTRL that never forgets
  ogd_tuned       projected OGD with Zinkevich's dynamic-regret step (P_T known)
  ogd_ensemble    OGD on a factor-2 step grid, the same meta-learner (Ader-style): no knowledge of P_T
  adam_two_discount  the Adam toy: a (beta1, beta2) sweep, clipped and clip-free (adam_toy.py)

Stages:
  train_shared (per seed): draw every stream of the sweeps (streams.py), save streams.npz.
  train (per variant): for task in (linear, logistic), run the learner on
    * the T sweep at fixed path length P_fix -> curve regret_T_<task> (x = T, rounds)
    * the P sweep at fixed horizon T_fix     -> curve regret_P_<task> (x = P_T, path length)
    and fit log-log slopes (slope_T_<task>, slope_P_<task>). The theorem's rate for the tuned
    discount is R_T = O~(sqrt(d T P_T)): slope 1/2 in T and 1/2 in P_T.
    The tuned variants (STATIC_VARIANTS) also run the static sweep on the tasks ``static_tasks``,
    P_T = 0 over the same horizons (-> curve regret_T0_<task>, slope slope_T0_<task>): the curved-loss point of the paper, where
    FTRL's regret is O(d log T) (log-log slope ~ 1/ln T) and OGD's O(sqrt T) (slope 1/2). Its
    streams are prefixes of one static stream per (seed, task): common random numbers across T.
Dynamic regret R_T = sum_t l_t(w_t) - l_t(u_t), in nats (logistic) or squared-loss units (linear),
u_t the planted comparator of the stream.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from . import learners as L
from .streams import make_stream, path_length
from reprozoo.figures import save_figure

TASKS = ("linear", "logistic")
SHORT = {"linear": "lin", "logistic": "logit"}
# the variants that also run the static (P_T = 0) sweep: the claim's learner and its OGD control
STATIC_VARIANTS = ("dftrl_tuned", "ogd_tuned")


def _streams(p: dict, rng: np.random.Generator):
    """Every (task, sweep, value) stream of one seed, in a fixed order."""
    d = p["d"]
    for task in TASKS:
        cfg = p[task]
        for T in p["T_sweep"]:
            yield task, "T", T, make_stream(task, T, d, p["P_fix"], cfg, rng)
        for P in p["P_sweep"]:
            yield task, "P", P, make_stream(task, p["T_fix"], d, P, cfg, rng)
    # drawn after every drifting stream, so those are the same streams as without the static sweep
    for task in p.get("static_tasks", ()):
        yield task, "T0", max(p["T_sweep"]), make_stream(task, max(p["T_sweep"]), d, 0.0, p[task], rng)


def train_shared(ctx) -> None:
    from ...io import save_npz

    arrays = {}
    for task, sweep, val, s in _streams(ctx.params, ctx.rng(1)):
        for k, a in s.items():
            arrays[f"{task}/{sweep}/{val:g}/{k}"] = a
    save_npz(ctx.outdir / "streams.npz", **arrays)


def _load(shared_dir: Path, p: dict):
    z = np.load(shared_dir / "streams.npz")
    for task in TASKS:
        for sweep, vals in (("T", p["T_sweep"]), ("P", p["P_sweep"])):
            for val in vals:
                yield task, sweep, val, {k: z[f"{task}/{sweep}/{val:g}/{k}"] for k in ("x", "y", "u")}


def _load_static(shared_dir: Path, p: dict):
    """The static (P_T = 0) sweep: the first T rounds of one static stream per task, T in T_sweep."""
    z = np.load(shared_dir / "streams.npz")
    top = max(p["T_sweep"])
    for task in p.get("static_tasks", ()):
        full = {k: z[f"{task}/T0/{top:g}/{k}"] for k in ("x", "y", "u")}
        for T in p["T_sweep"]:
            yield task, "T0", T, {k: a[:T] for k, a in full.items()}


def predictions(variant: str, task: str, stream: dict, p: dict) -> tuple[np.ndarray, dict]:
    """The variant's per-round predictions (T,) on one stream, and what it chose."""
    cfg = p[task]
    T, d = stream["x"].shape
    P = path_length(stream["u"])
    lam, bound, radius = p["ridge"], cfg["bound"], cfg["radius"]
    meta = dict(lr=cfg["meta_lr"], share=1.0 / T)
    if variant == "dftrl_tuned":
        beta = L.tuned_discount(T, d, cfg["kappa"] * P)
        return L.run_discounted_ftrl(task, stream, [beta], lam, bound)[:, 0], {"one_minus_beta": 1 - beta}
    if variant == "ftrl":
        return L.run_discounted_ftrl(task, stream, [1.0], lam, bound)[:, 0], {"one_minus_beta": 0.0}
    if variant == "dftrl_ensemble":
        experts = L.run_discounted_ftrl(task, stream, L.discount_grid(T), lam, bound)
        return L.fixed_share(task, experts, stream["y"], **meta), {}
    G = cfg["grad_bound"]
    if variant == "ogd_tuned":
        eta = L.tuned_ogd_step(T, P, 2 * radius, G)
        return L.run_ogd(task, stream, [eta], radius, bound)[:, 0], {"eta": eta}
    if variant == "ogd_ensemble":
        experts = L.run_ogd(task, stream, L.ogd_step_grid(T, 2 * radius, G), radius, bound)
        return L.fixed_share(task, experts, stream["y"], **meta), {}
    raise ValueError(f"unknown ftrl_regret variant '{variant}'")


def dynamic_regret(task: str, pred: np.ndarray, stream: dict) -> np.ndarray:
    """Cumulative dynamic regret sum_{s<=t} l_s(w_s) - l_s(u_s), per round t."""
    losses = L.loss(task, pred, stream["y"])
    return np.cumsum(losses - L.comparator_losses(task, stream))


def loglog_slope(xs, ys) -> float:
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if len(xs) < 2 or np.any(ys <= 0) or not np.all(np.isfinite(ys)):
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def train(ctx) -> None:
    p, v = ctx.params, ctx.variant
    if v == "adam_two_discount":
        return train_adam(ctx)
    static = v in STATIC_VARIANTS
    results = {(t, s): [] for t in TASKS for s in "TP"}
    results.update({(t, "T0"): [] for t in p.get("static_tasks", ()) if static})
    sweeps = itertools.chain(_load(ctx.shared_dir, p), _load_static(ctx.shared_dir, p) if static else ())
    for task, sweep, val, stream in sweeps:
        pred, chosen = predictions(v, task, stream, p)
        cum = dynamic_regret(task, pred, stream)
        results[(task, sweep)].append((val, cum[-1]))
        if sweep == "T" and val == max(p["T_sweep"]):
            idx = np.unique(np.geomspace(1, len(cum), 40).astype(int)) - 1
            ctx.metrics.curve(f"cumregret_{SHORT[task]}", idx + 1, cum[idx])
            for k, c in chosen.items():
                ctx.metrics.scalar(f"{k}_{SHORT[task]}", c)
        ctx.progress(f"{task} {sweep}={val:g}: dynamic regret {cum[-1]:.1f}")
    for (task, sweep), rows in results.items():
        xs, ys = zip(*rows)
        ctx.metrics.curve(f"regret_{sweep}_{SHORT[task]}", xs, ys)
        ctx.metrics.scalar(f"slope_{sweep}_{SHORT[task]}", loglog_slope(xs, ys))


# --- the Adam toy ----------------------------------------------------------------------------------

def train_adam(ctx) -> None:
    from .adam_toy import run_adam_grid

    a = ctx.params["adam"]
    one_minus_b1 = 2.0 ** -np.arange(a["n_beta1"], dtype=float)  # 1 (no momentum) ... 2^-(n-1)
    b1 = 1.0 - one_minus_b1
    b2 = 1.0 - 10.0 ** -np.asarray(a["beta2_decades"], float)
    for drift, cycles in a["cycles"].items():
        best = {}
        for clipped in (True, False):
            tag = "clipped" if clipped else "free"
            err = run_adam_grid(b1, b2, clipped, cycles, a, ctx.rng(100 + int(cycles * 10)))
            for j, k in enumerate(a["beta2_decades"]):
                ctx.metrics.curve(f"adam_err_{drift}_{tag}_b2_{k}", one_minus_b1, err[:, j])
            per_b1 = err.min(axis=1)  # best beta2 at each beta1
            best[tag] = float(per_b1.min())
            ctx.metrics.scalar(f"adam_best_{drift}_{tag}", best[tag])
            ctx.metrics.scalar(f"adam_best_one_minus_beta1_{drift}_{tag}", float(one_minus_b1[per_b1.argmin()]))
            ctx.metrics.scalar(f"adam_nomomentum_{drift}_{tag}", float(per_b1[0]))
            ctx.metrics.scalar(f"adam_leastdiscount_{drift}_{tag}", float(per_b1[-1]))
            ctx.metrics.scalar(f"adam_interior_ratio_{drift}_{tag}", best[tag] / min(per_b1[0], per_b1[-1]))
            ctx.progress(f"Adam {drift} drift ({tag}): best F_t(x_t) {best[tag]:.4f} at 1-beta1="
                         f"{one_minus_b1[per_b1.argmin()]:.4g}; beta1=0 {per_b1[0]:.4f}; "
                         f"1-beta1={one_minus_b1[-1]:.4g} {per_b1[-1]:.4f}")
        ctx.metrics.scalar(f"adam_free_over_clipped_{drift}", best["free"] / best["clipped"])


# --- plots ---------------------------------------------------------------------------------------

VARIANT_ORDER = ["dftrl_tuned", "dftrl_ensemble", "ftrl", "ogd_tuned", "ogd_ensemble"]


def _band(ax, sub, v, **kw):
    g = sub[sub.variant == v].groupby("x").value
    mean, std = g.mean(), g.std().fillna(0.0)
    if mean.empty:
        return None
    line, = ax.plot(mean.index, mean.values, marker="o", ms=3, label=v, **kw)
    ax.fill_between(mean.index, np.maximum(mean - std, mean * 1e-2), mean + std, alpha=0.15,
                    color=line.get_color())
    return mean


def _through(ax, ref, shape, style: str, label: str) -> None:
    """Draw shape(x) scaled (least squares in log) through the mean points ``ref``."""
    if ref is None or not len(ref):
        return
    xs = np.asarray(ref.index, float)
    anchor = float(np.exp(np.mean(np.log(np.maximum(ref.values, 1e-12)) - np.log(shape(xs)))))
    ax.plot(xs, anchor * shape(xs), style, lw=1.2, label=label)


def _loglog_panel(pyplot, sub, path: Path, xlabel: str, ylabel: str, title: str, theorem: bool,
                  static: bool = False) -> None:
    """One log-log figure: every FTRL/OGD variant (mean +- std over seeds), optionally the
    theorem's slope 1/2 drawn through the tuned discounted FTRL's points; for the static sweep
    (P_T = 0) the log T shape through discounted FTRL and sqrt T through OGD."""
    fig, ax = pyplot.subplots(figsize=(6, 4.3))
    means = {v: _band(ax, sub, v) for v in VARIANT_ORDER}
    if static:
        _through(ax, means.get("dftrl_tuned"), np.log, "k--", "FTRL theory: d log T")
        _through(ax, means.get("ogd_tuned"), np.sqrt, "k:", "OGD: sqrt T")
    elif theorem:
        _through(ax, means.get("dftrl_tuned"), np.sqrt, "k--", "theorem: slope 1/2 (sqrt(d T P_T))")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pyplot = plt()
    labels = {"T": ("horizon T (rounds)", f"P_T = {params['P_fix']:g} fixed"),
              "P": ("path length P_T (comparator units)", f"T = {params['T_fix']} rounds fixed")}
    units = {"lin": "dynamic regret (squared-loss units)", "logit": "dynamic regret (nats)"}
    for task, unit in units.items():
        name = "linear" if task == "lin" else "logistic"
        for sweep in "TP":
            sub = table[table.metric == f"regret_{sweep}_{task}"]
            if not sub.empty:
                _loglog_panel(pyplot, sub, plots_dir / f"curve_regret_{sweep}_{task}.png", labels[sweep][0], unit,
                              f"Does {name}-regression dynamic regret grow as sqrt({sweep})?\n"
                              f"({labels[sweep][1]}; mean +- std over seeds)", theorem=True)
        sub = table[table.metric == f"regret_T0_{task}"]
        if not sub.empty:
            _loglog_panel(pyplot, sub, plots_dir / f"curve_regret_T0_{task}.png", labels["T"][0], unit,
                          f"Static comparator (P_T = 0): {name}-regression regret log T (FTRL) or sqrt T (OGD)?\n"
                          "(prefixes of one static stream per seed; mean +- std over seeds)",
                          theorem=False, static=True)
        sub = table[table.metric == f"cumregret_{task}"]
        if not sub.empty:
            _loglog_panel(pyplot, sub, plots_dir / f"curve_cumregret_{task}.png", "round t", f"cumulative {unit}",
                          f"How does {name}-regression regret accumulate within one run?\n"
                          f"(T = {max(params['T_sweep'])}, P_T = {params['P_fix']:g}; switches evenly spaced)",
                          theorem=False)
    _plot_adam(table, plots_dir, params, pyplot)


def _plot_adam(table, plots_dir: Path, params: dict, pyplot) -> None:
    sub = table[table.metric.str.startswith("adam_err_")]
    if sub.empty:
        return
    drifts = list(params["adam"]["cycles"])
    fig, axes = pyplot.subplots(1, len(drifts), figsize=(5 * len(drifts), 4), squeeze=False)
    for ax, drift in zip(axes[0], drifts):
        for tag, ls in (("clipped", "-"), ("free", ":")):
            for k in params["adam"]["beta2_decades"]:
                s = sub[sub.metric == f"adam_err_{drift}_{tag}_b2_{k}"]
                g = s.groupby("x").value
                mean, std = g.mean(), g.std().fillna(0.0)
                line, = ax.plot(mean.index, mean.values, ls, marker="o", ms=3,
                                label=f"{tag}, beta2 = 1 - 1e-{k}")
                ax.fill_between(mean.index, mean - std, mean + std, alpha=0.1, color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("1 - beta1 (discount of the gradients)")
        ax.set_ylabel("mean F_t(x_t) - min F_t (objective units)")
        ax.set_title(f"Which (beta1, beta2) tracks a {drift} drift best?", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    save_figure(fig, plots_dir / "adam_beta_sweep.png", dpi=110)
