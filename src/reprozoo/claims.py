"""Claim verdicts, computed from the long metrics table, never written by hand.

A claim's ``expr`` is arithmetic over tokens ``metric@variant``: a scalar metric resolves to a
number, a curve metric to the array of its values (aligned on the shared x grid). The expression
is evaluated once per seed. Each claim then gets exactly one verdict (``docs/verdicts.md`` explains
each to a newcomer), checked in this order:

1. **not measured**: a variant the claim (or its control or precondition) reads was not run in this
   selection; a partial run never recomputes a claim from less than it needs.
2. **error**: the expression cannot be evaluated (a missing metric, a non-finite value such as a
   division by zero). A pipeline bug, never a scientific failure: ``verify`` exits non-zero.
3. **untestable**: a precondition (``requires:``) does not hold (by the same interval rule).
4. **not converged**: a variant the claim reads did not reach a plateau of its validation curve
   (spec ``convergence:``; :func:`convergence` below).
5. **holds** / **fails** / **inconclusive** from the interval: holds when the one-sided 95 % bound
   lies on the threshold's side, fails when the opposite bound lies wholly on the other side,
   inconclusive otherwise (always for one seed, and for zero spread over seeds unless the claim is
   ``exact: true``). The bound is Student-t over seeds; where every metric the claim reads has
   per-unit values (``ctx.metrics.units``), it is a percentile bootstrap resampling seeds and units
   (paired across variants: the same resampled units for every variant), from
   ``scipy.stats.bootstrap``.
6. **non-discriminative**: the claim holds, and so does its control (``control:``, by default the
   A/A control of a comparison: every method variant replaced by the baseline). A control with zero
   spread that passes at every seed counts as holding: a tie is not a win.

Allowed functions: min, max, mean, abs, log10, sqrt.
"""
from __future__ import annotations

import ast
import math
import re
from typing import Any

import numpy as np
import pandas as pd

from .registry import Claim, Condition, Convergence

TOKEN = re.compile(r"([A-Za-z_][\w.]*)@([A-Za-z_][\w]*)")
UNIT_SUFFIX = "#unit"


def _flat(*xs):
    return np.concatenate([np.atleast_1d(np.asarray(x, dtype=float)) for x in xs])


FUNCS = {
    "min": lambda *xs: float(np.min(_flat(*xs))),
    "max": lambda *xs: float(np.max(_flat(*xs))),
    "mean": lambda *xs: float(np.mean(_flat(*xs))),
    "abs": np.abs,
    "log10": np.log10,
    "sqrt": np.sqrt,
}
# the same functions over bootstrap replicates: every argument is one array of replicates
VFUNCS = {
    "min": lambda *xs: np.minimum.reduce([np.asarray(x, dtype=float) for x in xs]),
    "max": lambda *xs: np.maximum.reduce([np.asarray(x, dtype=float) for x in xs]),
    "mean": lambda *xs: np.mean([np.asarray(x, dtype=float) for x in xs], axis=0),
    "abs": np.abs,
    "log10": np.log10,
    "sqrt": np.sqrt,
}
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Load, ast.Constant,
            ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub, ast.UAdd)

VERDICTS = ("holds", "fails", "inconclusive", "not converged", "non-discriminative", "untestable",
            "error", "not measured")
CONFIDENCE = 0.95
N_BOOT = 2000
TAIL = 0.3  # the last 30 % of training is where a plateau must show
MIN_TAIL_POINTS = 5
LR_FLOOR = 0.1  # the learning rate must still be above a tenth of its peak there


class ClaimError(ValueError):
    pass


def tokens(expr: str) -> list[tuple[str, str]]:
    return TOKEN.findall(expr)


def _compile(expr: str):
    names = {}

    def sub(m):
        key = f"_t{len(names)}"
        names[key] = (m.group(1), m.group(2))
        return key

    code = TOKEN.sub(sub, expr)
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as exc:
        raise ClaimError(f"expression '{expr}' does not parse: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ClaimError(f"expression '{expr}': {type(node).__name__} is not allowed")
        if isinstance(node, ast.Name) and node.id not in names and node.id not in FUNCS:
            raise ClaimError(f"expression '{expr}': unknown name '{node.id}' (use metric@variant)")
    return compile(tree, "<claim>", "eval"), names


def check_syntax(expr: str) -> None:
    """Raise :class:`ClaimError` unless ``expr`` is a valid claim expression."""
    _compile(expr)


def substitute(expr: str, mapping: dict[str, str]) -> str:
    """``expr`` with the variants of its tokens replaced (``{method: baseline}``)."""
    return TOKEN.sub(lambda m: f"{m.group(1)}@{mapping.get(m.group(2), m.group(2))}", expr)


def _lookup(table: pd.DataFrame, metric: str, variant: str, seed: int):
    rows = table[(table.metric == metric) & (table.variant == variant) & (table.seed == seed)]
    if rows.empty:
        raise ClaimError(f"no metric '{metric}' for variant '{variant}' seed {seed}")
    if len(rows) == 1 and pd.isna(rows.x.iloc[0]):
        return float(rows.value.iloc[0])
    rows = rows.sort_values("x")
    return rows.set_index("x").value


def evaluate_expr(expr: str, table: pd.DataFrame, seed: int) -> float:
    code, names = _compile(expr)
    values: dict[str, Any] = {}
    series = {}
    for key, (metric, variant) in names.items():
        v = _lookup(table, metric, variant, seed)
        if isinstance(v, pd.Series):
            series[key] = v
        else:
            values[key] = v
    if series:  # align curves on their common x grid
        common = sorted(set.intersection(*(set(s.index) for s in series.values())))
        if not common:
            raise ClaimError(f"expression '{expr}': curves share no x values")
        for key, s in series.items():
            values[key] = s.loc[common].to_numpy(dtype=float)
    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            result = eval(code, {"__builtins__": {}}, {**FUNCS, **values})  # noqa: S307 - AST checked above
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as exc:
        raise ClaimError(f"expression '{expr}' at seed {seed}: {type(exc).__name__}: {exc} (a division by "
                         "zero?): a pipeline bug, not a measurement") from None
    result = np.asarray(result, dtype=float)
    if result.size != 1:
        raise ClaimError(f"expression '{expr}' gives {result.size} values; reduce it with min/max/mean")
    value = float(result.reshape(()))
    if not math.isfinite(value):
        raise ClaimError(f"expression '{expr}' is {value} at seed {seed} (a division by zero or log of "
                         "zero?): a pipeline bug, not a measurement")
    return value


def compare(value: float, op: str, threshold: float) -> bool:
    if not np.isfinite(value):
        return False
    return {"<=": value <= threshold, "<": value < threshold,
            ">=": value >= threshold, ">": value > threshold}[op]


def interval(values, op: str, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The one-sided Student-t bound of the mean that a claim with ``op`` must pass, and the
    opposite bound: ``(lower, upper)`` of the two one-sided ``confidence`` intervals."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    n, mean = len(v), float(np.mean(v))
    if n < 2:
        return mean, mean
    half = float(stats.t.ppf(confidence, n - 1)) * float(np.std(v, ddof=1)) / np.sqrt(n)
    return mean - half, mean + half


def _from_bounds(lo: float, hi: float, n: int, op: str, threshold: float) -> str:
    passing, opposite = (lo, hi) if op in (">=", ">") else (hi, lo)
    if n >= 2 and compare(passing, op, threshold):
        return "holds"
    if n >= 2 and not compare(opposite, op, threshold):
        return "fails"
    return "inconclusive"


ZERO_SPREAD_REL = 1e-9


def no_spread(values) -> bool:
    """Seeds that agree to rounding: a spread below ``ZERO_SPREAD_REL`` of the values' size.
    A deterministic quantity computed through floating point differs between seeds by 1e-15, and an
    exact ``ptp == 0`` test would let that rounding pass as a spread (and the t-interval as an
    interval)."""
    v = np.asarray(values, dtype=float)
    return bool(np.ptp(v) <= ZERO_SPREAD_REL * float(np.max(np.abs(v))))


def decide(values, op: str, threshold: float, exact: bool = False, bounds: tuple[float, float] | None = None,
           ties_hold: bool = False) -> str:
    """holds / fails / inconclusive from the per-seed values (see the module docstring).

    ``bounds``: an interval computed elsewhere (the unit bootstrap) instead of the seed t-interval.
    Zero spread over seeds decides nothing unless ``exact`` (a deterministic quantity); with
    ``ties_hold`` (a control) zero spread that passes at every seed holds."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return "not measured"
    if not np.all(np.isfinite(v)):
        raise ClaimError("non-finite per-seed values")
    if len(v) >= 2 and no_spread(v) and bounds is None:
        if exact or ties_hold:
            return "holds" if compare(v[0], op, threshold) else "fails"
        return "inconclusive"
    lo, hi = bounds if bounds is not None else interval(v, op)
    return _from_bounds(lo, hi, len(v), op, threshold)


# --- unit-level intervals ----------------------------------------------------------------------

def _unit_arrays(expr: str, table: pd.DataFrame, seeds: list[int]) -> dict | None:
    """Per token and seed, the per-unit values, if every token of ``expr`` has them (same count
    everywhere, so units pair across variants and seeds); None for a seed-only claim."""
    names = _compile(expr)[1]
    units = table[table.metric.str.endswith(UNIT_SUFFIX)]
    if units.empty:
        return None
    out, counts = {}, set()
    for key, (metric, variant) in names.items():
        rows = units[(units.metric == metric + UNIT_SUFFIX) & (units.variant == variant)]
        if rows.empty:
            return None
        per = {}
        for s in seeds:
            r = rows[rows.seed == s].sort_values("x")
            if r.empty:
                return None
            per[s] = r.value.to_numpy(dtype=float)
            counts.add(len(per[s]))
        out[key] = per
    if len(counts) != 1:
        raise ClaimError(f"expression '{expr}': per-unit metrics have different unit counts {sorted(counts)}; "
                         "units must pair across variants and seeds")
    return out


def unit_bootstrap(expr: str, table: pd.DataFrame, seeds: list[int], confidence: float = CONFIDENCE,
                   n_resamples: int = N_BOOT, random_state: int = 0) -> dict | None:
    """The one-sided ``confidence`` bounds of the seed-mean of ``expr`` from a percentile
    bootstrap that resamples seeds and (paired) units, or None when the claim has no per-unit
    values. The unit means are recomputed for every resample and the expression evaluated on
    them, so ratios and differences of unit metrics are resampled as a whole.

    Returns ``{"low", "high", "n_units", "v_units", "v_seeds", "used"}``. Resampling seeds and units
    independently (``scipy.stats.bootstrap`` with two samples) counts the unit noise twice (it is
    in the seed means too) and the between-seed variance at (S-1)/S; the two cancel where the
    between-seed variance is twice the unit-noise variance of the mean, and the interval is
    conservative below that. Above it (the seeds, not the units, carry the noise) the bootstrap
    would be too narrow, so ``used`` is False and the claim keeps the Student-t interval over
    seeds. ``v_units``: the variance with the seeds held fixed (units only); ``v_seeds``: the
    squared standard error of the mean of the per-seed values."""
    from scipy import stats

    arrays = _unit_arrays(expr, table, seeds)
    if arrays is None:
        return None
    code, _ = _compile(expr)
    n_units = len(next(iter(next(iter(arrays.values())).values())))
    seed_list = list(seeds)
    fixed_seeds = np.arange(len(seed_list))

    def statistic(si, ui, axis=-1):
        si = np.atleast_2d(np.asarray(si, dtype=int))
        ui = np.atleast_2d(np.asarray(ui, dtype=int))
        if si.shape[0] == 1 and ui.shape[0] > 1:
            si = np.broadcast_to(si, (ui.shape[0], si.shape[1]))
        per_seed = []
        for s in seed_list:
            vals = {k: per[s][ui].mean(axis=-1) for k, per in arrays.items()}
            with np.errstate(divide="ignore", invalid="ignore"):
                per_seed.append(np.broadcast_to(eval(code, {"__builtins__": {}}, {**VFUNCS, **vals}),  # noqa: S307
                                                (ui.shape[0],)))
        f = np.stack(per_seed)  # (seeds, batch)
        out = np.take_along_axis(f, si.T, axis=0).mean(axis=0)
        return out if out.size > 1 else out[0]

    common = dict(vectorized=True, n_resamples=n_resamples, batch=250, method="percentile",
                  confidence_level=2 * confidence - 1, random_state=random_state)
    both = stats.bootstrap((fixed_seeds, np.arange(n_units)), statistic, paired=False, **common)
    units_only = stats.bootstrap((np.arange(n_units),), lambda ui, axis=-1: statistic(fixed_seeds[None, :], ui),
                                 **common)
    lo, hi = float(both.confidence_interval.low), float(both.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ClaimError(f"expression '{expr}': non-finite bootstrap bounds (a division by zero on resampled units?)")
    per_seed = np.array([evaluate_expr(expr, table, s) for s in seed_list])
    v_units = float(np.var(units_only.bootstrap_distribution))
    v_seeds = float(np.var(per_seed, ddof=1) / len(per_seed))
    return {"low": lo, "high": hi, "n_units": n_units, "v_units": v_units, "v_seeds": v_seeds,
            "used": bool(v_seeds <= 3 * v_units)}


def _would_decide(mean: float, lo: float, hi: float, op: str, threshold: float, n_seeds: int,
                  n_units: int | None, std: float) -> str:
    """What an inconclusive verdict lacks: the interval half-width against the gap to the
    threshold, and the seeds (or units) the observed spread would need."""
    from scipy import stats

    half = (hi - lo) / 2
    gap = abs(mean - threshold)
    if n_seeds < 2:
        return "one seed has no spread to judge from: run at least 3 seeds"
    if half <= ZERO_SPREAD_REL * abs(mean):
        return ("zero spread over seeds: the seeds do not vary what they should (or declare exact: true "
                "for a deterministic quantity)")
    head = f"interval half-width {half:.3g} against a gap of {gap:.3g} to the threshold"
    if gap == 0:
        return head + ": the mean sits on the threshold, no sample size decides it"
    if n_units:
        need = math.ceil(n_units * (half / gap) ** 2)
        return head + f": the observed spread would need about {need} units per seed (now {n_units})"
    for n in range(2, 10001):
        if stats.t.ppf(CONFIDENCE, n - 1) * std / math.sqrt(n) < gap:
            return head + f": the observed spread would need about {n} seeds (now {n_seeds})"
    return head + ": more than 10000 seeds would be needed"


def measure(expr: str, op: str, threshold: float, table: pd.DataFrame, seeds: list[int],
            exact: bool = False, ties_hold: bool = False) -> dict:
    """Per-seed values, mean, spread, interval and the interval verdict of ``expr op threshold``.
    Raises :class:`ClaimError` when it cannot be evaluated."""
    per_seed = {s: evaluate_expr(expr, table, s) for s in seeds}
    vals = np.array(list(per_seed.values()), dtype=float)
    n = len(vals)
    mean = float(np.mean(vals)) if n else float("nan")
    std = float(np.std(vals, ddof=1)) if n > 1 else 0.0
    boot = unit_bootstrap(expr, table, seeds) if n >= 2 else None
    n_units = boot["n_units"] if boot else None
    if boot is not None and boot["used"]:
        lo, hi = boot["low"], boot["high"]
        method = "seed x unit bootstrap"
    else:
        lo, hi = interval(vals, op)
        method = "Student-t over seeds" + (" (the seeds, not the units, carry the spread)" if boot else "")
    verdict = decide(vals, op, threshold, exact=exact, bounds=(lo, hi) if boot and boot["used"] else None,
                     ties_hold=ties_hold)
    out = {"per_seed": {str(k): v for k, v in per_seed.items()}, "value_mean": mean, "value_std": std,
           "n_seeds": n, "n_units": n_units, "ci_low": lo, "ci_high": hi, "interval": method,
           "verdict": verdict}
    if verdict == "inconclusive":
        out["to_decide"] = _would_decide(mean, lo, hi, op, threshold, n,
                                         n_units if boot and boot["used"] else None, std)
    return out


# --- convergence -------------------------------------------------------------------------------

def tail_fit(steps, values, mode: str = "min", scale: str = "value", tail: float = TAIL,
             min_points: int = MIN_TAIL_POINTS) -> dict:
    """How much a curve still improves over its last ``tail`` of training: the Theil-Sen slope
    there times the tail's length, relative to the tail's median level (``scale: value``) or to the
    curve's whole improvement from its first point to its best (``scale: range``, for losses that
    cross zero). ``improvement`` is ``inf`` when the tail holds fewer than ``min_points``
    evaluations (an unknown slope is not a flat one).

    The one definition of a plateau: the convergence gate reads it, and every method's early
    stopping rule calls :func:`plateau`, so "stopped at a plateau" and "passes the gate" cannot
    drift apart."""
    from scipy import stats

    xs, ys = np.asarray(steps, float), np.asarray(values, float)
    order = np.argsort(xs, kind="stable")
    xs, ys = xs[order], ys[order]
    if len(xs) == 0:
        return {"tail_points": 0, "tail_start": math.nan, "improvement": math.inf}
    start = float(xs[0] + (1 - tail) * (xs[-1] - xs[0]))
    m = xs >= start
    rec = {"tail_points": int(m.sum()), "tail_start": start, "improvement": math.inf}
    if m.sum() < max(2, min_points):
        return rec
    slope = float(stats.theilslopes(ys[m], xs[m])[0])
    gain = (-slope if mode == "min" else slope) * float(xs[m][-1] - xs[m][0])  # > 0: still improving
    best = ys.min() if mode == "min" else ys.max()
    level = abs(float(np.median(ys[m]))) if scale == "value" else abs(float(ys[0] - best))
    rec.update(slope=slope, improvement=float(gain / level) if level > 0 else (0.0 if gain <= 0 else math.inf))
    return rec


def plateau(steps, values, tol: float = 0.02, mode: str = "min", scale: str = "value",
            tail: float = TAIL, min_points: int = MIN_TAIL_POINTS) -> bool:
    """Is the curve flat by the convergence gate's own test (:func:`tail_fit`, tolerance ``tol``)?
    Early-stopping rules call this so that a fit they stop is one the gate accepts."""
    return bool(tail_fit(steps, values, mode, scale, tail, min_points)["improvement"] <= tol)


def _tail_check(xs: np.ndarray, ys: np.ndarray, conv: Convergence, lr: tuple | None) -> dict:
    """:func:`tail_fit` against the spec's tolerance, and the learning rate's floor in the tail."""
    fit = tail_fit(xs, ys, conv.mode, conv.scale)
    start = fit["tail_start"]
    rec = {"tail_points": fit["tail_points"], "tail_start": start}
    if fit["tail_points"] < MIN_TAIL_POINTS:
        rec.update(converged=False, reason=f"only {fit['tail_points']} evaluation points in the last 30 % of "
                                           f"training (need {MIN_TAIL_POINTS})")
        return rec
    rel = fit["improvement"]
    rec.update(tail_slope=fit["slope"], tail_improvement=float(rel))
    ok = rel <= conv.tol
    reasons = [] if ok else [f"still improving by {100 * rel:.1f} % over the last 30 % of training "
                             f"(tolerance {100 * conv.tol:g} %)"]
    if lr is not None:
        lx, ly = np.asarray(lr[0], float), np.asarray(lr[1], float)
        peak = float(np.max(ly))
        floor = float(np.min(ly[lx >= start])) if np.any(lx >= start) else float(ly[-1])
        rec.update(lr_peak=peak, lr_tail_min=floor)
        if peak > 0 and floor < LR_FLOOR * peak:
            ok = False
            reasons.append(f"learning rate fell to {floor / peak:.2g} of its peak in the tail (a schedule near "
                           f"zero makes any curve flat; need >= {LR_FLOOR:g})")
    rec["converged"] = bool(ok)
    if reasons:
        rec["reason"] = "; ".join(reasons)
    return rec


def convergence(specs: list[Convergence], table: pd.DataFrame, variants: list[str] | None = None) -> dict:
    """Per variant: ``{"converged": bool, "curve": ..., "seeds": {seed: record}, "reason": ...}``
    for every variant that a ``convergence:`` entry covers. A listed variant that does not record
    its curve (or its declared lr curve) is not converged, with that reason."""
    out: dict[str, dict] = {}
    present = set(variants if variants is not None else table.variant.unique())
    curves = table[table.x.notna()]
    for conv in specs:
        listed = [v for v in conv.variants if v in present]
        if not conv.variants:  # default: every variant that records the curve
            listed = sorted(v for v in present
                            if not curves[(curves.metric == conv.curve_for(v)) & (curves.variant == v)].empty)
        for v in listed:
            name, lr_name = conv.curve_for(v), conv.lr_for(v)
            rows = curves[(curves.variant == v) & (curves.metric == name)]
            seeds: dict[str, dict] = {}
            for s in sorted(table[table.variant == v].seed.unique()):
                r = rows[rows.seed == s]
                if r.empty:
                    seeds[str(s)] = {"converged": False, "reason": f"curve '{name}' not recorded"}
                    continue
                lr = None
                if lr_name:
                    lrr = curves[(curves.variant == v) & (curves.metric == lr_name) & (curves.seed == s)]
                    if lrr.empty:
                        seeds[str(s)] = {"converged": False, "reason": f"lr curve '{lr_name}' not recorded"}
                        continue
                    lr = (lrr.x.to_numpy(float), lrr.value.to_numpy(float))
                seeds[str(s)] = _tail_check(r.x.to_numpy(float), r.value.to_numpy(float), conv, lr)
            bad = {s: rec for s, rec in seeds.items() if not rec["converged"]}
            rec = {"curve": name, "mode": conv.mode, "lr_checked": bool(lr_name), "seeds": seeds,
                   "converged": not bad and bool(seeds)}
            if bad:
                s, first = next(iter(bad.items()))
                rec["reason"] = f"{name}: seed {s}: {first.get('reason')}" + (
                    f" (and {len(bad) - 1} more seed(s))" if len(bad) > 1 else "")
            gate = {"curve": name, "claims": list(conv.claims), "converged": rec["converged"],
                    "reason": rec.get("reason")}
            prev = out.get(v)
            entries = (prev or {}).get("curves", []) + [gate]
            if prev is None or (prev["converged"] and not rec["converged"]):
                out[v] = rec
            out[v]["curves"] = entries
    return out


def _gate_for(claim_id: str, state: dict) -> dict:
    """A variant's convergence as one claim sees it: only the curves that gate that claim
    (``Convergence.claims``; every curve when it names none)."""
    curves = [c for c in state.get("curves", []) if not c["claims"] or claim_id in c["claims"]]
    if "curves" not in state:  # a record written before curves were scoped
        return {"converged": state["converged"], "reason": state.get("reason")}
    stalled = [c for c in curves if not c["converged"]]
    return {"converged": not stalled, "reason": stalled[0]["reason"] if stalled else None}


# --- verdicts ----------------------------------------------------------------------------------

def default_control(claim: Claim, roles: dict[str, str] | None) -> dict[str, str] | None:
    """The A/A control of a comparison claim: every method variant it reads replaced by the first
    baseline it reads. None for a claim that reads no baseline or no method variant."""
    if not roles:
        return None
    read = [v for _, v in tokens(claim.expr)]
    methods = [v for v in dict.fromkeys(read) if roles.get(v) == "method"]
    baselines = [v for v in read if roles.get(v) == "baseline"]
    if not methods or not baselines:
        return None
    return {m: baselines[0] for m in methods}


def _control_condition(claim: Claim, roles) -> tuple[Condition | None, str]:
    ctl, kind = claim.control, "declared"
    if ctl is None:
        ctl, kind = default_control(claim, roles), "A/A"
    if ctl is None:
        return None, "none"
    if isinstance(ctl, Condition):
        return ctl, "declared"
    return Condition(substitute(claim.expr, ctl), claim.op, claim.effective_threshold), kind


def _variants_of(*exprs: str) -> set[str]:
    return {v for e in exprs for _, v in tokens(e)}


def verify(claims: list[Claim], table: pd.DataFrame, selected_variants: list[str] | None = None,
           roles: dict[str, str] | None = None, converged: dict[str, dict] | None = None) -> list[dict]:
    """Evaluate every claim (see the module docstring for the order of the verdicts).

    ``selected_variants`` (default: those in the table): the variants this run measured;
    ``roles``: variant -> "method" / "baseline", for the default A/A control; ``converged``: the
    output of :func:`convergence`."""
    seeds = sorted(int(s) for s in table.seed.unique())
    present = set(selected_variants if selected_variants is not None else table.variant.unique())
    converged = converged or {}
    out = []
    for c in claims:
        thr = c.effective_threshold
        control, control_kind = _control_condition(c, roles)
        exprs = [c.expr] + [r.expr for r in c.requires] + ([control.expr] if control else [])
        rec: dict[str, Any] = {
            "id": c.id, "text": c.text, "expr": c.expr, "op": c.op, "threshold": c.threshold,
            "margin": c.margin, "effective_threshold": thr, "exact": c.exact,
            "paper_value": c.paper_value, "unit": c.unit,
            "value_mean": float("nan"), "value_std": float("nan"), "n_seeds": 0, "n_units": None,
            "ci_low": float("nan"), "ci_high": float("nan"), "confidence": CONFIDENCE, "interval": None,
            "per_seed": {}, "holds_every_seed": False, "single_seed": False,
            "verdict": None, "reason": None, "error": None,
            "missing_variants": sorted(_variants_of(*exprs) - present),
            "requires": [], "control": None, "convergence": {},
        }
        if rec["missing_variants"]:
            rec["verdict"] = "not measured"
            out.append(rec)
            continue
        try:
            m = measure(c.expr, c.op, thr, table, seeds, exact=c.exact)
            rec.update({k: v for k, v in m.items() if k != "verdict"})
            vals = list(m["per_seed"].values())
            rec["holds_every_seed"] = bool(all(compare(v, c.op, thr) for v in vals))
            rec["single_seed"] = len(vals) == 1
            for r in c.requires:
                rm = measure(r.expr, r.op, r.threshold, table, seeds)
                rec["requires"].append({"condition": str(r), "value_mean": rm["value_mean"],
                                        "ci_low": rm["ci_low"], "ci_high": rm["ci_high"], "verdict": rm["verdict"]})
            if control is not None:
                try:
                    cm = measure(control.expr, control.op, control.threshold, table, seeds, ties_hold=True)
                    rec["control"] = {"kind": control_kind, "condition": str(control),
                                      "value_mean": cm["value_mean"], "ci_low": cm["ci_low"],
                                      "ci_high": cm["ci_high"], "verdict": cm["verdict"]}
                except ClaimError as exc:
                    if control_kind != "A/A":
                        raise  # a declared control that cannot be evaluated is a spec bug
                    # the baseline does not record the method's metric (a merge time has no
                    # counterpart in joint training): there is no A/A control to run
                    rec["control"] = {"kind": control_kind, "condition": str(control), "value_mean": float("nan"),
                                      "ci_low": float("nan"), "ci_high": float("nan"),
                                      "verdict": "not applicable", "reason": str(exc)}
        except ClaimError as exc:
            rec.update(verdict="error", error=str(exc), reason=str(exc))
            out.append(rec)
            continue
        read = sorted(_variants_of(c.expr) | (_variants_of(control.expr) if control else set()))
        rec["convergence"] = {v: _gate_for(c.id, converged[v]) for v in read if v in converged}
        unmet = [r for r in rec["requires"] if r["verdict"] != "holds"]
        stalled = [v for v, s in rec["convergence"].items() if not s["converged"]]
        if unmet:
            rec["verdict"] = "untestable"
            said = {"fails": "does not hold", "inconclusive": "is not shown (inconclusive)"}
            rec["reason"] = "precondition " + "; ".join(f"'{r['condition']}' {said.get(r['verdict'], 'is ' + r['verdict'])} "
                                                        f"(mean {r['value_mean']:.4g})" for r in unmet)
        elif stalled:
            rec["verdict"] = "not converged"
            rec["reason"] = "; ".join(f"variant '{v}' did not converge: {rec['convergence'][v]['reason']}"
                                      for v in stalled)
        elif m["verdict"] == "holds" and rec["control"] and rec["control"]["verdict"] == "holds":
            rec["verdict"] = "non-discriminative"
            rec["reason"] = (f"the {control_kind} control '{rec['control']['condition']}' holds too "
                             f"(mean {rec['control']['value_mean']:.4g})")
        else:
            rec["verdict"] = m["verdict"]
            rec["reason"] = m.get("to_decide")
        out.append(rec)
    return out


def count(results: list[dict]) -> dict[str, int]:
    """Claims per verdict class, every class present (zeros included)."""
    return {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
