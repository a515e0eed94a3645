"""Discounted FTRL vs fixed discounts, an ensemble over discounts and OGD: dynamic regret against
drifting comparators.

Variants (one training cell per variant x seed; every variant sees the same streams of its seed):
  dftrl_tuned     discounted FTRL with the theory's discount 1 - beta = sqrt(kappa P_T / (d T)),
                  retuned at every sweep point (P_T known, as the theorem's tuning assumes)
  dftrl_fixed     control of the level claims: the same discounted FTRL with the theory's discount
                  tuned once at ONE point (a sweep point, a geometric midpoint of two, or one sweep
                  step beyond either end) and never retuned: K = 13 columns on a 5-point sweep,
                  a factor-sqrt(2) grid of windows. It records, per sweep point, the regret of the best of these columns
                  (``regret_<sweep>_<task>``: the best fixed discount in hindsight, what the level
                  claims divide by) and ``fixlvl_<sweep>_<task>``: the worst-case ratio to that best of
                  the single column that does best over the whole sweep (the control: it holds if ANY
                  discount fixed once stays within the claims' factor at every sweep point)
  dftrl_ensemble  discounted FTRL on a factor-2 grid of discounts, aggregated by fixed-share
                  exponential weights (one layer): no knowledge of P_T
  ftrl            undiscounted FTRL (beta = 1): not in the spec since this round (the claims that read
                  it held by construction and are tests now); kept callable
  ogd_tuned       projected OGD with Zinkevich's step (P_T known): runs the static sweep only
  ogd_ensemble    OGD on a factor-2 step grid, the same meta-learner (Ader-style); not in the spec
  adam_two_discount  the Adam toy: a (beta1, beta2) sweep, clipped and clip-free (adam_toy.py)
  adam_aa         its A/A control: the same sweep (clipped) with both drift slots at the slow rate

Stages:
  train (per variant): draw every stream of the sweeps from the seed's generator (streams.py; the same
  streams for every variant of a seed), ``replicates`` independent streams per sweep point, learnt
  together (batched; the points of a P_T sweep share one horizon and are learnt in one batch) and
  their final regrets averaged; for task in (linear, logistic), run the learner on
    * the T sweep at fixed path length P_fix -> curve regret_T_<task> (x = T, rounds)
    * the P sweep at fixed horizon T_fix     -> curve regret_P_<task> (x = P_T, path length)
      (a task may override P_sweep and T_fix: logistic's tuned window is longer)
    Each sweep spans 256x, so the theory's window sqrt(d T / (kappa P_T)) moves 16x across it. The
    level claims divide a variant's regret by dftrl_fixed's best-fixed-discount regret point by point.
    Log-log slopes (full range and halves) are still recorded (slope_*), unclaimed.
    The variants in STATIC_VARIANTS also run the static sweep on the tasks ``static_tasks``,
    P_T = 0 over the horizons ``static_T_sweep`` (-> curve regret_T0_<task>, slope slope_T0_<task>):
    the curved-loss point of the paper, where FTRL's regret is O(d log T) (log-log slope ~ 1/ln T)
    and OGD at Zinkevich's step ~ 1/sqrt(T) pays ~ sqrt(T) (slope 1/2). Its streams are prefixes of
    the static streams of (seed, task): common random numbers across T.
Dynamic regret R_T = sum_t l_t(w_t) - l_t(u_t), in nats (logistic) or squared-loss units (linear),
u_t the planted comparator of the stream.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import learners as L
from .streams import make_stream, path_length
from reprozoo.figures import save_figure

TASKS = ("linear", "logistic")
SHORT = {"linear": "lin", "logistic": "logit"}
# the variants that run the static (P_T = 0) sweep: the claim's learner and its OGD control
STATIC_VARIANTS = ("dftrl_tuned", "ogd_tuned")
# the drifting sweeps each variant runs (ogd_tuned: the static sweep only, read by the static claim;
# dftrl_ensemble: the T sweeps only, what its claims read; its P sweeps would cost ~9 CPU-s a seed,
# an estimate from the per-round cost of its learners, not a measurement of them)
DRIFT_SWEEPS = {"dftrl_tuned": "TP", "dftrl_fixed": "TP", "dftrl_ensemble": "T", "ftrl": "TP", "ogd_ensemble": "TP"}


def _sweep(p: dict, task: str, sweep: str) -> tuple[list, float | None, int | None]:
    """(values, P_fix, T_fix) of one sweep; a task may override P_sweep / T_fix / P_jump (logistic:
    its tuned window is longer, so its P sweep runs at its own path lengths to keep the switch
    spacing above the window; at smoke its T sweep's ``jump`` is one antipodal flip of 4 and its
    P sweep's ``P_jump`` switches of 2)."""
    cfg = p[task]
    if sweep == "T":
        return list(p["T_sweep"]), p["P_fix"], None
    return list(cfg.get("P_sweep", p["P_sweep"])), None, int(cfg.get("T_fix", p["T_fix"]))


def _static_sweep(p: dict) -> list:
    """The static (P_T = 0) sweep's horizons: ``static_T_sweep`` (default: the T sweep)."""
    return list(p.get("static_T_sweep", p["T_sweep"]))


def _stack(streams: list[dict]) -> dict:
    return {k: np.stack([s[k] for s in streams]) for k in ("x", "y", "u")}


def _streams(p: dict, rng: np.random.Generator):
    """Every (task, sweep, value) point of one seed with its ``replicates`` independent streams,
    stacked along a leading axis (x (R, T, d), y (R, T), u (R, T, d)), in a fixed order. The static
    (P_T = 0) sweep ("T0") yields one stack of full-length static streams per task; its horizons are
    prefixes of it (``_static_prefixes``). Drawn after every drifting stream, so adding it leaves
    those unchanged."""
    d, R = p["d"], int(p.get("replicates", 1))
    for task in TASKS:
        cfg = p[task]
        for sweep in "TP":
            vals, P_fix, T_fix = _sweep(p, task, sweep)
            for val in vals:
                T, P = (val, P_fix) if sweep == "T" else (T_fix, val)
                # the P sweep may use its own switch size (P_jump)
                c = cfg if sweep == "T" else {**cfg, "jump": cfg.get("P_jump", cfg["jump"])}
                yield task, sweep, val, _stack([make_stream(task, T, d, P, c, rng) for _ in range(R)])
    for task in p.get("static_tasks", ()):
        top = max(_static_sweep(p))
        yield task, "T0", top, _stack([make_stream(task, top, d, 0.0, p[task], rng) for _ in range(R)])


def _batches(p: dict, rng: np.random.Generator):
    """The points of ``_streams`` as learning batches (task, sweep, values, streams): a T-sweep or
    static point alone; the points of a P sweep (one horizon) concatenated along the stream axis,
    ``replicates`` streams per point in sweep order. The same streams as ``_streams``."""
    buf: list = []

    def flush():
        task, sweep = buf[0][:2]
        return task, sweep, [b[2] for b in buf], {k: np.concatenate([b[3][k] for b in buf]) for k in ("x", "y", "u")}

    for task, sweep, val, st in _streams(p, rng):
        if buf and (buf[0][0], buf[0][1]) != (task, sweep):
            yield flush()
            buf = []
        if sweep == "P":
            buf.append((task, sweep, val, st))
        else:
            yield task, sweep, [val], st
    if buf:
        yield flush()


def _static_prefixes(p: dict, full: dict):
    """The static sweep's horizons: the first T rounds of the static streams, T in static_T_sweep."""
    for T in _static_sweep(p):
        yield T, {k: a[:, :T] for k, a in full.items()}


def fixed_tuning_points(p: dict, task: str, sweep: str) -> list[tuple[float, float]]:
    """The (T, P_T) points at which ``dftrl_fixed`` tunes its discounts: the sweep extended by one
    sweep step beyond each end (x_0^2 / x_1 and x_{n-1}^2 / x_{n-2}), and the geometric midpoint
    between neighbours: 2n + 3 points for an n-point sweep, column 2k + 2 the discount tuned at the
    sweep's k-th point (dftrl_tuned's there). Each column is the theory's discount
    1-beta = sqrt(kappa P_T / (d T)) tuned once at its point and kept over the whole sweep (never
    retuned): on a geometric sweep of factor 4 the windows form a factor-sqrt(2) grid that brackets
    every retuned window by 2x on both sides, so the best fixed discount in hindsight can beat the
    retuned one at the sweep's ends too, and between grid points."""
    vals, P_fix, T_fix = _sweep(p, task, sweep)
    v = np.asarray(vals, float)
    v = np.concatenate([[v[0] ** 2 / v[1]], v, [v[-1] ** 2 / v[-2]]])
    pts = np.empty(2 * len(v) - 1)
    pts[0::2], pts[1::2] = v, np.sqrt(v[:-1] * v[1:])
    return [(float(x), float(P_fix)) for x in pts] if sweep == "T" else [(float(T_fix), float(x)) for x in pts]


def half_dev(lo: float, hi: float) -> float:
    """The larger distance of the two half-range slopes from 1/2 (recorded, unclaimed)."""
    return float(max(abs(lo - 0.5), abs(hi - 0.5)))


def predictions_batch(variant: str, task: str, streams: dict, p: dict,
                      sweep: str | None = None) -> tuple[np.ndarray, dict]:
    """The variant's per-round predictions (N, T) on N stacked streams of one length, and what it
    chose (mean over the streams). Each stream is learnt independently (own tuned discount/step).
    ``sweep`` ("T" or "P") is read only by ``dftrl_fixed`` (its discount is tuned at one point of the
    sweep and never retuned)."""
    cfg = p[task]
    x, y, u = streams["x"], streams["y"], streams["u"]
    N, T, d = x.shape
    P = np.array([path_length(ui) for ui in u])
    lam, bound, radius = p["ridge"], cfg["bound"], cfg["radius"]
    meta = dict(lr=cfg["meta_lr"], share=1.0 / T)
    if variant == "dftrl_tuned":
        beta = np.array([[L.tuned_discount(T, d, cfg["kappa"] * Pi)] for Pi in P])
        out = L.run_discounted_ftrl_batch(task, x, y, beta, lam, bound)[..., 0]
        return out, {"one_minus_beta": float(np.mean(1 - beta))}
    if variant == "dftrl_fixed":
        if sweep not in ("T", "P"):
            raise ValueError("dftrl_fixed needs the sweep ('T' or 'P') its discounts are tuned on")
        # K columns: the discount tuned at each point of the sweep, the same at every point
        beta = np.array([[L.tuned_discount(T0, d, cfg["kappa"] * P0)
                          for T0, P0 in fixed_tuning_points(p, task, sweep)]] * N)
        out = L.run_discounted_ftrl_batch(task, x, y, beta, lam, bound)       # (N, T, K)
        return out, {"one_minus_beta": 1 - beta[0]}
    if variant == "ftrl":
        return L.run_discounted_ftrl_batch(task, x, y, np.ones((N, 1)), lam, bound)[..., 0], {"one_minus_beta": 0.0}
    if variant == "dftrl_ensemble":
        experts = L.run_discounted_ftrl_batch(task, x, y, np.tile(L.discount_grid(T), (N, 1)), lam, bound)
        return L.fixed_share_batch(task, experts, y, **meta), {}
    G = cfg["grad_bound"]
    if variant == "ogd_tuned":
        eta = np.array([[L.tuned_ogd_step(T, Pi, 2 * radius, G)] for Pi in P])
        return L.run_ogd_batch(task, x, y, eta, radius, bound)[..., 0], {"eta": float(eta.mean())}
    if variant == "ogd_ensemble":
        experts = L.run_ogd_batch(task, x, y, np.tile(L.ogd_step_grid(T, 2 * radius, G), (N, 1)), radius, bound)
        return L.fixed_share_batch(task, experts, y, **meta), {}
    raise ValueError(f"unknown ftrl_regret variant '{variant}'")


def predictions(variant: str, task: str, stream: dict, p: dict) -> tuple[np.ndarray, dict]:
    """One stream (x (T, d), y (T,), u (T, d)): predictions (T,) and what the variant chose."""
    out, chosen = predictions_batch(variant, task, {k: stream[k][None] for k in ("x", "y", "u")}, p)
    return out[0], chosen


def dynamic_regret(task: str, pred: np.ndarray, stream: dict) -> np.ndarray:
    """Cumulative dynamic regret sum_{s<=t} l_s(w_s) - l_s(u_s), per round t."""
    losses = L.loss(task, pred, stream["y"])
    return np.cumsum(losses - L.comparator_losses(task, stream), axis=-1)


def loglog_slope(xs, ys) -> float:
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if len(xs) < 2 or np.any(ys <= 0) or not np.all(np.isfinite(ys)):
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def half_slopes(xs, ys) -> tuple[float, float]:
    """Log-log slopes over the lower and the upper half of a sweep, the middle point in both
    (5 points: points 1-3 and 3-5)."""
    mid = len(xs) // 2
    return loglog_slope(xs[: mid + 1], ys[: mid + 1]), loglog_slope(xs[mid:], ys[mid:])


def per_point(final: np.ndarray, n_points: int) -> np.ndarray:
    """Mean final regret per sweep point: ``final`` (..., N) with N = n_points x replicates streams in
    sweep order -> (..., n_points)."""
    return final.reshape(*final.shape[:-1], n_points, -1).mean(axis=-1)


def train(ctx) -> None:
    p, v = ctx.params, ctx.variant
    if v.startswith("adam_"):
        return train_adam(ctx)
    results: dict = {}
    # the streams are drawn here from the seed's generator ctx.rng(1) (seed-only: every variant of a
    # seed sees the same streams, common random numbers) instead of being stored
    for task, sweep, vals, streams in _batches(p, ctx.rng(1)):
        if sweep == "T0":
            if v not in STATIC_VARIANTS:
                continue
            points = [([T], st) for T, st in _static_prefixes(p, streams)]
        elif sweep not in DRIFT_SWEEPS.get(v, ""):
            continue
        else:
            points = [(vals, streams)]
        for pts, st in points:
            pred, chosen = predictions_batch(v, task, st, p, sweep=sweep)
            if v == "dftrl_fixed":
                # one regret per fixed discount (column k: tuned at fixed_tuning_points' k-th point)
                final = np.stack([dynamic_regret(task, pred[..., k], st)[:, -1] for k in range(pred.shape[-1])])
                reg = per_point(final, len(pts))                               # (K, n_points)
                for j, val in enumerate(pts):
                    results.setdefault((task, sweep), []).append((val, reg[:, j]))
                    ctx.progress(f"{task} {sweep}={val:g}: dynamic regret of the {reg.shape[0]} fixed discounts "
                                 + " ".join(f"{r:.1f}" for r in reg[:, j]))
                continue
            cum = dynamic_regret(task, pred, st)                    # (N, T)
            reg = per_point(cum[:, -1], len(pts))
            for j, val in enumerate(pts):
                results.setdefault((task, sweep), []).append((val, float(reg[j])))
                ctx.progress(f"{task} {sweep}={val:g}: dynamic regret {reg[j]:.1f} "
                             f"(mean of {cum.shape[0] // len(pts)} streams)")
            if sweep == "T" and pts[0] == max(p["T_sweep"]):
                idx = np.unique(np.geomspace(1, cum.shape[1], 40).astype(int)) - 1
                ctx.metrics.curve(f"cumregret_{SHORT[task]}", idx + 1, cum[:, idx].mean(axis=0))
                for k, c in chosen.items():
                    ctx.metrics.scalar(f"{k}_{SHORT[task]}", c)
    for (task, sweep), rows in results.items():
        xs, ys = zip(*rows)
        if v == "dftrl_fixed":
            _record_fixed(ctx, task, sweep, xs, np.array(ys))
            continue
        ctx.metrics.curve(f"regret_{sweep}_{SHORT[task]}", xs, ys)
        ctx.metrics.scalar(f"slope_{sweep}_{SHORT[task]}", loglog_slope(xs, ys))
        if sweep in ("T", "P"):
            lo, hi = half_slopes(xs, ys)
            ctx.metrics.scalar(f"slope_{sweep}_lo_{SHORT[task]}", lo)
            ctx.metrics.scalar(f"slope_{sweep}_hi_{SHORT[task]}", hi)


def vertex_min(ys) -> float:
    """The minimum of ``ys`` over a continuum of the grid's coordinate, by the parabola through the
    log values at the discrete argmin and its two neighbours (the grid is uniform in log window); at
    an end of the grid, or without curvature, the discrete minimum itself. Never above the discrete
    minimum."""
    y = np.log(np.asarray(ys, float))
    k = int(np.argmin(y))
    if k == 0 or k == len(y) - 1:
        return float(np.exp(y[k]))
    a, b, c = y[k - 1], y[k], y[k + 1]
    curv = a - 2.0 * b + c
    return float(np.exp(b - (a - c) ** 2 / (8.0 * curv))) if curv > 0 else float(np.exp(b))


def best_fixed(xs, ys: np.ndarray) -> dict:
    """The fixed discounts on one sweep: ``ys`` (n_points, K), column k the regret of the discount
    tuned at ``fixed_tuning_points``' k-th point and kept over the whole sweep (a factor-sqrt(2) grid
    of windows). Returns
      ``oracle`` (n_points,): the best fixed discount in hindsight at each point, over the continuum
        of windows the grid spans (``vertex_min`` of the row: at most the best column; without it the
        retuned discount, itself a column, would read a ratio of exactly 1 wherever it is the best
        column, no spread over seeds),
      ``grid`` (n_points,): the best column at each point,
      ``levels`` (K,): each column's worst-case ratio to the oracle over the sweep points,
      ``level``: the smallest of them (the best single discount fixed once: the control),
      ``k``: the column that gives it, and the smallest half-range slope deviation (``dev``)."""
    ys = np.asarray(ys, float)
    oracle = np.array([vertex_min(row) for row in ys])
    levels = (ys / oracle[:, None]).max(axis=0)
    k = int(np.argmin(levels))
    devs = [half_dev(*half_slopes(xs, ys[:, j])) for j in range(ys.shape[1])]
    return {"oracle": oracle, "grid": ys.min(axis=1), "levels": levels, "level": float(levels[k]), "k": k,
            "dev": float(np.nanmin(devs)), "devs": devs}


def _record_fixed(ctx, task: str, sweep: str, xs, ys: np.ndarray) -> None:
    """dftrl_fixed's metrics on one sweep: the best fixed discount's regret at each point
    (curve regret_<sweep>_<task>, interpolated over the window continuum: what the level claims
    divide by; fixgridbest_<sweep>_<task> the best column itself), each column's worst-case ratio
    to it (fixlvl_<sweep>_<task>_k<k>), the smallest of these (fixlvl_<sweep>_<task>: the control of
    the level claims, which holds if ANY discount fixed once stays within the factor everywhere),
    each column's regret curve (fixregret_<sweep>_<task>_k<k>) and the recorded slope deviations."""
    t = SHORT[task]
    b = best_fixed(xs, ys)
    ctx.metrics.curve(f"regret_{sweep}_{t}", xs, b["oracle"])
    ctx.metrics.curve(f"fixgridbest_{sweep}_{t}", xs, b["grid"])
    for k in range(ys.shape[1]):
        ctx.metrics.curve(f"fixregret_{sweep}_{t}_k{k}", xs, ys[:, k])
        ctx.metrics.scalar(f"fixlvl_{sweep}_{t}_k{k}", float(b["levels"][k]))
    ctx.metrics.scalar(f"fixlvl_{sweep}_{t}", b["level"])
    ctx.metrics.scalar(f"fixbest_k_{sweep}_{t}", float(b["k"]))
    ctx.metrics.scalar(f"fixdev_{sweep}_{t}", b["dev"])
    ctx.metrics.scalar(f"slope_{sweep}_{t}", loglog_slope(xs, b["oracle"]))


# --- the Adam toy ----------------------------------------------------------------------------------

def subgrid_argmin(err: np.ndarray) -> float:
    """Location (in grid steps, 0 .. n-1) of the minimum of ``err`` on a geometric grid: the vertex
    of the parabola through log err at the discrete argmin and its two neighbours (it lies within
    half a step of the discrete argmin). At an end point there is no neighbour on one side: the end
    point itself is returned (the precondition of the Adam claim rules that case out)."""
    y = np.log(np.asarray(err, float))
    k = int(np.argmin(y))
    if k == 0 or k == len(y) - 1:
        return float(k)
    curv = y[k - 1] - 2.0 * y[k] + y[k + 1]
    return float(k + (0.5 * (y[k - 1] - y[k + 1]) / curv if curv > 0 else 0.0))


def train_adam(ctx) -> None:
    from .adam_toy import run_adam_grid

    a = ctx.params["adam"]
    n = int(a["n_beta1"])
    one_minus_b1 = 2.0 ** -np.arange(n, dtype=float)  # 1 (no momentum) ... 2^-(n-1)
    b1 = 1.0 - one_minus_b1
    b2 = 1.0 - 10.0 ** -np.asarray(a["beta2_decades"], float)
    # adam_aa, the A/A control of adam_discount_grows_with_drift: both "drifts" at the slow rate, on
    # independent noise (its "fast" slot draws from another generator), clipped Adam only
    aa = ctx.variant == "adam_aa"
    cycles_of = {k: (a["cycles"]["slow"] if aa else c) for k, c in a["cycles"].items()}
    loc = {}
    for drift, cycles in cycles_of.items():
        best = {}
        for clipped in ((True,) if aa else (True, False)):
            tag = "clipped" if clipped else "free"
            offset = 100 + int(cycles * 10) + (1000 if aa and drift == "fast" else 0)
            err = run_adam_grid(b1, b2, clipped, cycles, a, ctx.rng(offset))
            for j, k in enumerate(a["beta2_decades"]):
                ctx.metrics.curve(f"adam_err_{drift}_{tag}_b2_{k}", one_minus_b1, err[:, j])
            per_b1 = err.min(axis=1)  # best beta2 at each beta1
            k_star = subgrid_argmin(per_b1)          # grid steps: 1 - beta1 = 2^-k_star
            loc[(drift, tag)] = k_star
            best[tag] = float(per_b1.min())
            ctx.metrics.scalar(f"adam_best_{drift}_{tag}", best[tag])
            ctx.metrics.scalar(f"adam_best_one_minus_beta1_{drift}_{tag}", float(2.0 ** -k_star))
            # how far (grid steps) the optimum sits from the nearer end of the beta1 grid: > 0.5 iff
            # the discrete minimum is an interior grid point (precondition of the Adam claim)
            ctx.metrics.scalar(f"adam_b1_edge_steps_{drift}_{tag}", float(min(k_star, n - 1 - k_star)))
            ctx.metrics.scalar(f"adam_nomomentum_{drift}_{tag}", float(per_b1[0]))
            ctx.metrics.scalar(f"adam_leastdiscount_{drift}_{tag}", float(per_b1[-1]))
            ctx.progress(f"Adam {drift} drift ({tag}): best F_t(x_t) {best[tag]:.4f} at 1-beta1="
                         f"2^-{k_star:.2f}; beta1=0 {per_b1[0]:.4f}; "
                         f"1-beta1={one_minus_b1[-1]:.4g} {per_b1[-1]:.4f}")
        if "free" in best:
            ctx.metrics.scalar(f"adam_free_over_clipped_{drift}", best["free"] / best["clipped"])
    # the theory's prediction: a faster drift needs a larger discount 1 - beta1, by the square root of
    # the ratio of path lengths (log2 sqrt(fast/slow) = 1.5 for 8x); measured on the sub-grid optimum
    shift = loc[("slow", "clipped")] - loc[("fast", "clipped")]
    ctx.metrics.scalar("adam_log2_b1_fast_over_slow_clipped", float(shift))
    ratio = a["cycles"]["fast"] / a["cycles"]["slow"]
    if not aa:
        # the exponent of the measured law 1 - beta1* ~ (path length)^alpha (square-root law: 0.5)
        ctx.metrics.scalar("adam_b1_drift_exponent_clipped", float(shift / np.log2(ratio)))


# --- plots ---------------------------------------------------------------------------------------

LABELS = {"dftrl_fixed": "dftrl_fixed: best fixed discount at each point (hindsight)"}
VARIANT_ORDER = ["dftrl_tuned", "dftrl_fixed", "dftrl_ensemble", "ftrl", "ogd_tuned", "ogd_ensemble"]  # absent ones are skipped


def _band(ax, sub, v, **kw):
    g = sub[sub.variant == v].groupby("x").value
    mean, std = g.mean(), g.std().fillna(0.0)
    if mean.empty:
        return None
    line, = ax.plot(mean.index, mean.values, marker="o", ms=3, label=LABELS.get(v, v), **kw)
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
            fixed = labels[sweep][1] if sweep == "T" else f"T = {_sweep(params, name, 'P')[2]} rounds fixed"
            if not sub.empty:
                _loglog_panel(pyplot, sub, plots_dir / f"curve_regret_{sweep}_{task}.png", labels[sweep][0], unit,
                              f"Does {name}-regression dynamic regret grow as sqrt({sweep})?\n"
                              f"({fixed}; mean of {params.get('replicates', 1)} streams, +- std over seeds)",
                              theorem=True)
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
