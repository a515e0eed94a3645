"""Claim verdicts, computed from the long metrics table, never written by hand.

A claim's ``expr`` is arithmetic over tokens ``metric@variant``: a scalar metric resolves to a
number, a curve metric to the array of its values (aligned on the shared x grid). The expression
is evaluated once per seed, and the verdict is read from the seed spread, not the mean alone:

- **holds** when the one-sided 95 % Student-t interval of the mean over seeds lies wholly on the
  threshold's side (for ``>=``/``>``: the lower bound ``mean - t(0.95, n-1) s / sqrt(n)`` passes),
- **fails** when the interval lies wholly on the other side,
- **inconclusive** otherwise, and always for a single seed (no spread to judge from);
- **not measured** when a variant the claim reads was not run in this selection (a partial run
  never recomputes a claim from less than it needs).

The threshold comes from the paper's statement and is never moved after measuring. Allowed
functions: min, max, mean, abs, log10, sqrt.
"""
from __future__ import annotations

import ast
import re
from typing import Any

import numpy as np
import pandas as pd

from .registry import Claim

TOKEN = re.compile(r"([A-Za-z_][\w.]*)@([A-Za-z_][\w]*)")


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
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Load, ast.Constant,
            ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub, ast.UAdd)


VERDICTS = ("holds", "fails", "inconclusive", "not measured")
CONFIDENCE = 0.95


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
    tree = ast.parse(code, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ClaimError(f"expression '{expr}': {type(node).__name__} is not allowed")
        if isinstance(node, ast.Name) and node.id not in names and node.id not in FUNCS:
            raise ClaimError(f"expression '{expr}': unknown name '{node.id}' (use metric@variant)")
    return compile(tree, "<claim>", "eval"), names


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
    with np.errstate(divide="ignore", invalid="ignore"):
        result = eval(code, {"__builtins__": {}}, {**FUNCS, **values})  # noqa: S307 - AST checked above
    result = np.asarray(result, dtype=float)
    if result.size != 1:
        raise ClaimError(f"expression '{expr}' gives {result.size} values; reduce it with min/max/mean")
    return float(result.reshape(()))


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


def decide(values, op: str, threshold: float) -> str:
    """holds / fails / inconclusive from the per-seed values (see the module docstring)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0 or not np.all(np.isfinite(v)):
        return "fails" if len(v) else "not measured"
    lo, hi = interval(v, op)
    passing, opposite = (lo, hi) if op in (">=", ">") else (hi, lo)
    if len(v) >= 2 and compare(passing, op, threshold):
        return "holds"
    if not compare(opposite, op, threshold):
        return "fails" if len(v) >= 2 else "inconclusive"
    return "inconclusive"


def verify(claims: list[Claim], table: pd.DataFrame, selected_variants: list[str] | None = None) -> list[dict]:
    """Evaluate every claim per seed; ``selected_variants`` (default: those in the table) are the
    variants this run measured: a claim that reads any other is "not measured"."""
    seeds = sorted(int(s) for s in table.seed.unique())
    present = set(selected_variants if selected_variants is not None else table.variant.unique())
    out = []
    for c in claims:
        per_seed, error = {}, None
        missing = sorted({v for _, v in tokens(c.expr)} - present)
        if not missing:
            try:
                for s in seeds:
                    per_seed[s] = evaluate_expr(c.expr, table, s)
            except ClaimError as exc:
                error = str(exc)
        vals = np.array(list(per_seed.values()), dtype=float)
        ok = error is None and not missing and len(vals) > 0
        mean = float(np.mean(vals)) if ok else float("nan")
        std = float(np.std(vals, ddof=1)) if ok and len(vals) > 1 else float("nan") if not ok else 0.0
        lo, hi = interval(vals, c.op) if ok else (float("nan"), float("nan"))
        if missing:
            verdict = "not measured"
        elif not ok:
            verdict = "fails"
        else:
            verdict = decide(vals, c.op, c.threshold)
        out.append({
            "id": c.id, "text": c.text, "expr": c.expr, "op": c.op, "threshold": c.threshold,
            "paper_value": c.paper_value, "unit": c.unit,
            "value_mean": mean, "value_std": std, "n_seeds": len(vals),
            "ci_low": lo, "ci_high": hi, "confidence": CONFIDENCE,
            "per_seed": {str(k): v for k, v in per_seed.items()},
            "holds_every_seed": bool(ok and all(compare(v, c.op, c.threshold) for v in vals)),
            "single_seed": bool(ok and len(vals) == 1),
            "verdict": verdict, "error": error,
            "missing_variants": missing,
        })
    return out
