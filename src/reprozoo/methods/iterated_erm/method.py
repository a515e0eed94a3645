"""Iterated (two-stage) ERM in miniature: Monte-Carlo at d = 100, 200, 400 against the fixed point.

Data: two-class Gaussian mixture x = y mu/sqrt(d) + z (``data.py``), ||mu||^2/d = r^2; errors are
exact population errors Phi(-m/sqrt q) of the trained weights (no test-set noise).

Variants (``loss`` x stage-2 ``rule``; the same pools for every variant of a seed, since every pool is
drawn from ``ctx.rng`` which depends on the seed alone):
* ``margin_square`` / ``margin_logistic`` (method): stage 2 keeps the points of smallest |w1.x|
  (uncertainty sampling), ridge resp. L2-regularised logistic ERM in both stages;
* ``random_square`` / ``random_logistic`` (baseline): stage 2 keeps random points = passive learning
  with the same label budget.

Experiments per cell (all sizes per d; ``protocols.py``):
1. budget split (pool-based active learning): budget B = beta d labels, n1 = rho B random labels for
   stage 1, n2 = B - n1 chosen from a pool of N = pool d points, stage 2 on all B labels (the n1
   reused). Sweep rho; every replicate uses one pool for all rho (common random numbers).
   Metrics ``split_err_d<d>`` (mean over replicates, x = rho; ``split_err_sim`` = the largest d,
   read by the claims), the variance over replicates averaged
   over rho at each d (``split_var``, x = d) and its log-log slope ``var_slope``; at the largest d:
   ``split_u_ratio`` = min(err at smallest rho, err at rho = 1) / mean err over rho in ``u_band``
   (> 1: U shape).
2. selection on the same data (square loss only): n = n_dd d labels, stage 1 on all, stage 2 with
   small ridge on the n2 kept of the same points; sweep n2/d. ``dd_err_d<d>`` (``dd_err_sim``: the
   largest d), ``dd_peak_ratio``
   (n2/d at the error peak that follows the first minimum), ``dd_peak_prominence`` (peak / that min).
   n2 varies along this sweep, so its peak at n2 = d is the ordinary stage-2 interpolation peak.
3. selection strength at a fixed stage-2 size (square loss only): n = fs.n d labels, stage 1 on all,
   stage 2 with small ridge on n2 = fs.n2 d (!= d) of the same points, picked by ``rule`` among
   kappa n2 random candidates; sweep kappa from 1 (random) to n / n2. ``fs_err_d<d>``,
   ``fs_err_sim`` (largest d), ``fs_peak_prominence`` / ``fs_peak_kappa`` (the interior peak,
   ``interior_peak``), ``fs_theory_peak_prominence`` (the same on the theory curve).
Theory (square loss; ``theory.py``): ``split_err_theory``, ``dd_err_theory``, ``fs_err_theory`` and
the sample-splitting predictions ``split_err_naive``, ``dd_err_naive``, ``fs_err_naive`` on the same
grids.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import protocols as P
from . import theory as T
from reprozoo.figures import save_figure


def _variant(ctx) -> tuple[str, str]:
    cfg = ctx.params["variants"][ctx.variant]
    return cfg["loss"], cfg["rule"]


def budget_split(ctx, loss: str, rule: str) -> dict[int, np.ndarray]:
    """errors[d] of shape (replicates, len(rho)) for the pool-based two-stage protocol."""
    p = ctx.params
    r, beta, pool, lam1, lam2 = p["r"], p["budget"], p["pool"], p["lam1"], p["lam2"]
    out = {}
    for d, reps in zip(p["dims"], p["reps"][loss]):
        B = int(round(beta * d))
        errs = np.empty((reps, len(p["rho"])))
        rng = ctx.rng(d)  # same pools for every variant of the seed
        for k in range(reps):
            X, y = P.pool(int(round(pool * d)), d, r, rng)
            sel_rng = np.random.default_rng(rng.integers(2**63))
            for j, rho in enumerate(p["rho"]):
                n1 = int(round(rho * B))
                errs[k, j] = P.active_learning(X, y, n1, B - n1, r, loss, lam1, lam2, rule, sel_rng)[1]
        out[d] = errs
        ctx.progress(f"budget split d={d}: {reps} replicates, mean err {errs.mean():.4f}")
    return out


def selection_dd(ctx, loss: str, rule: str) -> dict[int, np.ndarray]:
    p = ctx.params
    dd = p["dd"]
    out = {}
    for d, reps in zip(dd["dims"], dd["reps"]):
        n2_list = [int(round(a * d)) for a in dd["n2"]]
        errs = np.empty((reps, len(n2_list)))
        rng = ctx.rng(10_000 + d)
        for k in range(reps):
            X, y = P.pool(int(round(dd["n"] * d)), d, p["r"], rng)
            sel_rng = np.random.default_rng(rng.integers(2**63))
            errs[k] = P.reweighting(X, y, n2_list, p["r"], loss, p["lam1"], dd["lam2"], rule, sel_rng)
        out[d] = errs
        ctx.progress(f"selection double descent d={d}: {reps} replicates")
    return out


def _cand_counts(fs, d):
    """Candidate-set sizes for the fixed-n2 sweep: kappa n2 candidates per kept point, at most n."""
    n, n2 = int(round(fs["n"] * d)), int(round(fs["n2"] * d))
    return n, n2, [min(int(round(k * n2)), n) for k in fs["kappa"]]


def selection_strength(ctx, loss: str, rule: str) -> dict[int, np.ndarray]:
    """errors[d] of shape (replicates, len(kappa)): n labels, stage 1 on all, stage 2 on n2 of them
    chosen by ``rule`` among kappa n2 random candidates (n2 fixed; kappa = 1 is random selection)."""
    p = ctx.params
    fs = p["fs"]
    out = {}
    for d, reps in zip(fs["dims"], fs["reps"]):
        n, n2, cands = _cand_counts(fs, d)
        errs = np.empty((reps, len(cands)))
        rng = ctx.rng(20_000 + d)  # same data for every variant of the seed
        for k in range(reps):
            X, y = P.pool(n, d, p["r"], rng)
            sel_rng = np.random.default_rng(rng.integers(2**63))
            errs[k] = P.candidate_selection(X, y, n2, cands, p["r"], loss, p["lam1"], fs["lam2"], rule, sel_rng)
        out[d] = errs
        ctx.progress(f"selection strength at fixed n2 d={d}: {reps} replicates")
    return out


def interior_peak(xs, errs) -> tuple[float, float]:
    """(x, prominence) of the strongest interior double-descent point of the curve. For every
    interior point i the two-sided excess is min(errs[i] / lowest point before i, errs[i] / lowest
    point after i); the prominence is its maximum over i. It is > 1 only for a rise AND a second
    descent (a double descent), and < 1 for a strictly monotone or U-shaped curve, by how far the
    curve is from having a bump, so that it varies continuously with the data (x = nan when <= 1)."""
    errs = np.asarray(errs, float)
    scores = [min(errs[i] / errs[:i].min(), errs[i] / errs[i + 1:].min()) for i in range(1, len(errs) - 1)]
    i = int(np.argmax(scores))
    prom = float(scores[i])
    return (float(xs[i + 1]) if prom > 1 else float("nan"), prom)


def variance_slope(dims, variances) -> float:
    """Slope of log(variance over replicates) against log d (-1 for 1/d concentration)."""
    return float(np.polyfit(np.log(dims), np.log(variances), 1)[0])


def u_ratio(rho, errs, band) -> float:
    """min(error at the smallest rho, error at the largest rho) / mean error over rho in ``band``.
    The band is fixed in the config (around the theory's optimum), not picked from the noisy curve:
    a minimum over noisy grid points would exceed 1 for a flat curve (the passive baseline)."""
    rho, errs = np.asarray(rho), np.asarray(errs)
    inner = (rho >= band[0]) & (rho <= band[1])
    return float(min(errs[0], errs[-1]) / errs[inner].mean())


def dd_peak(xs, errs) -> tuple[float, float]:
    """(x at the peak after the first local minimum, peak / that minimum); (nan, 1) if the curve
    only decreases. The first grid point counts as a minimum when the curve rises after it."""
    errs = np.asarray(errs)
    i_min = next((i for i in range(len(errs) - 1)
                  if (i == 0 or errs[i] <= errs[i - 1]) and errs[i] < errs[i + 1]), None)
    if i_min is None:
        return float("nan"), 1.0
    i_peak = i_min + int(np.argmax(errs[i_min:]))
    return float(xs[i_peak]), float(errs[i_peak] / errs[i_min])


def train(ctx) -> None:
    p = ctx.params
    loss, rule = _variant(ctx)
    t0 = time.perf_counter()
    split = budget_split(ctx, loss, rule)
    dims = sorted(split)
    for d in dims:
        ctx.metrics.curve(f"split_err_d{d}", p["rho"], split[d].mean(axis=0))
    var = [float(split[d].var(axis=0, ddof=1).mean()) for d in dims]
    ctx.metrics.curve("split_var", dims, var)
    ctx.metrics.scalar("var_slope", variance_slope(dims, var))
    top = split[dims[-1]].mean(axis=0)
    ctx.metrics.curve("split_err_sim", p["rho"], top)  # the largest d, read by the claims
    ctx.metrics.scalar("split_u_ratio", u_ratio(p["rho"], top, p["u_band"]))
    ctx.metrics.scalar("split_best_rho", p["rho"][int(np.argmin(top))])
    ctx.metrics.scalar("split_err_passive_over_best", top[-1] / top.min())
    ctx.metrics.scalar("sim_seconds_split", time.perf_counter() - t0)

    if loss != "square":
        return
    t1 = time.perf_counter()
    beta = p["budget"]
    for reuse, name in ((True, "theory"), (False, "naive")):
        th = [T.solve(T.active_learning_types(rho * beta, p["pool"], rule), p["r"] ** 2, p["lam1"], p["lam2"],
                      (1 - rho) * beta, reuse=reuse).err2 for rho in p["rho"]]
        ctx.metrics.curve(f"split_err_{name}", p["rho"], th)
    dd = p["dd"]
    for reuse, name in ((True, "theory"), (False, "naive")):
        th = [T.solve(T.reweighting_types(dd["n"], rule), p["r"] ** 2, p["lam1"], dd["lam2"], a2,
                      reuse=reuse).err2 for a2 in dd["n2"]]
        ctx.metrics.curve(f"dd_err_{name}", dd["n2"], th)
    ctx.metrics.scalar("theory_seconds", time.perf_counter() - t1)

    t2 = time.perf_counter()
    sel = selection_dd(ctx, loss, rule)
    for d in sorted(sel):
        ctx.metrics.curve(f"dd_err_d{d}", dd["n2"], sel[d].mean(axis=0))
    top = sel[max(sel)].mean(axis=0)
    ctx.metrics.curve("dd_err_sim", dd["n2"], top)  # the largest d, read by the claims
    peak_x, prominence = dd_peak(dd["n2"], top)
    ctx.metrics.scalar("dd_peak_ratio", peak_x)
    ctx.metrics.scalar("dd_peak_prominence", prominence)
    ctx.metrics.scalar("sim_seconds_dd", time.perf_counter() - t2)

    t3 = time.perf_counter()
    fs = p["fs"]
    fs_theory = {}
    for reuse, name in ((True, "theory"), (False, "naive")):
        fs_theory[name] = [T.solve(T.candidate_types(fs["n"], min(k * fs["n2"], fs["n"]), rule), p["r"] ** 2,
                                   p["lam1"], fs["lam2"], fs["n2"], reuse=reuse).err2 for k in fs["kappa"]]
        ctx.metrics.curve(f"fs_err_{name}", fs["kappa"], fs_theory[name])
    ctx.metrics.scalar("fs_theory_peak_prominence", interior_peak(fs["kappa"], fs_theory["theory"])[1])
    strength = selection_strength(ctx, loss, rule)
    for d in sorted(strength):
        ctx.metrics.curve(f"fs_err_d{d}", fs["kappa"], strength[d].mean(axis=0))
    top = strength[max(strength)].mean(axis=0)
    ctx.metrics.curve("fs_err_sim", fs["kappa"], top)  # the largest d, read by the claims
    peak_k, prominence = interior_peak(fs["kappa"], top)
    ctx.metrics.scalar("fs_peak_kappa", peak_k)
    ctx.metrics.scalar("fs_peak_prominence", prominence)
    ctx.metrics.scalar("sim_seconds_fs", time.perf_counter() - t3)


# --- plots ---------------------------------------------------------------------------------------

def _band(ax, table, metric, variant, **kw):
    """Mean over seeds with a +-1 std band; returns False when the metric is absent."""
    sub = table[(table.metric == metric) & (table.variant == variant)]
    if sub.empty:
        return False
    g = sub.groupby("x").value
    mean, std = g.mean(), g.std().fillna(0.0)
    line, = ax.plot(mean.index, mean.values, **kw)
    ax.fill_between(mean.index, mean - std, mean + std, color=line.get_color(), alpha=0.18, lw=0)
    return True


def _line(ax, table, metric, variant, **kw):
    sub = table[(table.metric == metric) & (table.variant == variant)]
    if not sub.empty:
        g = sub.groupby("x").value.mean()
        ax.plot(g.index, g.values, **kw)


def _dims(table, prefix):
    names = table.metric[table.metric.str.startswith(prefix)].unique()
    return sorted(int(n[len(prefix):]) for n in names if n[len(prefix):].isdigit())


def _axes(ax, xlabel, ylabel, title, log=False):
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def _save(pyplot, fig, path):
    save_figure(fig, path, dpi=110)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    pyplot = plt()
    colors = {100: "tab:blue", 200: "tab:orange", 400: "tab:green"}
    err_label = "stage-2 test error (probability)"

    fig, axes = pyplot.subplots(1, 2, figsize=(11, 4.2))
    for ax, loss in zip(axes, ("square", "logistic")):
        for d in _dims(table, "split_err_d"):
            _band(ax, table, f"split_err_d{d}", f"margin_{loss}", marker="o", ms=3,
                  color=colors.get(d), label=f"margin selection, simulation d={d}")
        _band(ax, table, "split_err_sim", f"random_{loss}", color="grey", ls="-.",
              label="random selection (passive), largest d")
        _line(ax, table, "split_err_theory", f"margin_{loss}", color="k", lw=1.8, label="theory (data reuse)")
        _line(ax, table, "split_err_naive", f"margin_{loss}", color="k", ls=":", lw=1.5,
              label="sample-splitting theory")
        _line(ax, table, "split_err_theory", f"random_{loss}", color="grey", lw=1.0, label="theory, passive")
        _axes(ax, "budget fraction spent on stage 1, rho = n1 / (n1 + n2)", err_label,
              f"How should the label budget be split? ({loss} loss)")
    _save(pyplot, fig, plots_dir / "curve_split_err_sim.png")

    fig, ax = pyplot.subplots(figsize=(6, 4.2))
    for d in _dims(table, "dd_err_d"):
        _band(ax, table, f"dd_err_d{d}", "margin_square", marker="o", ms=3, color=colors.get(d),
              label=f"margin selection, simulation d={d}")
        _band(ax, table, f"dd_err_d{d}", "random_square", marker="s", ms=3, color="grey",
              label=f"random selection, simulation d={d}")
    _line(ax, table, "dd_err_theory", "margin_square", color="k", lw=1.8, label="theory (data reuse)")
    _line(ax, table, "dd_err_naive", "margin_square", color="k", ls=":", lw=1.5, label="sample-splitting theory")
    _line(ax, table, "dd_err_theory", "random_square", color="grey", lw=1.0, label="theory, random selection")
    ax.axvline(1.0, color="r", lw=0.6, ls="--")
    _axes(ax, "selected samples per dimension, n2 / d (same n labels; n2 varies)", err_label,
          "Sample-wise sweep: the peak is the interpolation threshold n2 = d")
    _save(pyplot, fig, plots_dir / "curve_dd_err_sim.png")

    fs = params.get("fs", {})
    fig, ax = pyplot.subplots(figsize=(6, 4.2))
    for d in _dims(table, "fs_err_d"):
        _band(ax, table, f"fs_err_d{d}", "margin_square", marker="o", ms=3, color=colors.get(d),
              label=f"margin selection, simulation d={d}")
        _band(ax, table, f"fs_err_d{d}", "random_square", marker="s", ms=3, color="grey",
              label=f"random selection, simulation d={d}")
    _line(ax, table, "fs_err_theory", "margin_square", color="k", lw=1.8, label="theory (data reuse)")
    _line(ax, table, "fs_err_naive", "margin_square", color="k", ls=":", lw=1.5, label="sample-splitting theory")
    _line(ax, table, "fs_err_theory", "random_square", color="grey", lw=1.0, label="theory, random selection")
    _axes(ax, "selection strength kappa = candidates per selected point", err_label,
          f"Fixed n2 = {fs.get('n2', '?')} d, n = {fs.get('n', '?')} d: selection alone")
    _save(pyplot, fig, plots_dir / "curve_fs_err_sim.png")

    fig, ax = pyplot.subplots(figsize=(5.5, 4.2))
    ref = None
    for v in sorted(table.variant.unique()):
        if _band(ax, table, "split_var", v, marker="o", ms=3, label=v):
            ref = table[(table.metric == "split_var") & (table.variant == v)].groupby("x").value.mean()
    if ref is not None:
        xs = np.array(ref.index, float)
        ax.plot(xs, ref.values[0] * xs[0] / xs, "k:", label="1/d reference")
    _axes(ax, "dimension d", "variance of the test error over replicates",
          "Do the error curves concentrate like 1/d?", log=True)
    _save(pyplot, fig, plots_dir / "curve_split_var.png")
