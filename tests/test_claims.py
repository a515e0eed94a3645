"""Claim evaluation: expressions over metric@variant, per seed, verdict against the threshold."""
import math

import pandas as pd
import pytest

from reprozoo.claims import ClaimError, evaluate_expr, verify
from reprozoo.registry import Claim


def table():
    rows = []
    for seed, scale in ((0, 1.0), (1, 1.2)):
        rows += [
            dict(method="m", variant="a", seed=seed, metric="err", x=float("nan"), value=0.1 * scale),
            dict(method="m", variant="b", seed=seed, metric="err", x=float("nan"), value=1.0 * scale),
        ]
        for x, ya, yb in ((10, 1e-12, 1.0), (20, 2e-12, 0.5), (40, 1e-12, 0.25)):
            rows += [dict(method="m", variant="a", seed=seed, metric="rt", x=float(x), value=ya),
                     dict(method="m", variant="b", seed=seed, metric="rt", x=float(x), value=yb)]
    return pd.DataFrame(rows)


def test_scalar_expression():
    assert evaluate_expr("err@b / err@a", table(), 0) == pytest.approx(10.0)


def test_curve_expressions_align_on_x_and_reduce():
    t = table()
    assert evaluate_expr("max(rt@a)", t, 0) == pytest.approx(2e-12)
    assert evaluate_expr("min(rt@b / rt@a)", t, 0) == pytest.approx(0.5 / 2e-12)
    with pytest.raises(ClaimError, match="reduce it"):
        evaluate_expr("rt@a", t, 0)


def test_rejects_anything_but_arithmetic():
    with pytest.raises(ClaimError):
        evaluate_expr("__import__('os').system('true')", table(), 0)
    with pytest.raises(ClaimError, match="no metric"):
        evaluate_expr("missing@a", table(), 0)


def test_verdicts_are_computed_with_mean_and_spread():
    claims = [Claim("ok", "b is 10x a", "err@b / err@a", ">=", 5.0, paper_value="10x"),
              Claim("bad", "a tiny", "err@a", "<=", 0.01, paper_value="0.01"),
              Claim("broken", "missing", "nothing@a", "<=", 1.0, paper_value="-")]
    out = {c["id"]: c for c in verify(claims, table())}
    assert out["ok"]["verdict"] == "holds" and out["ok"]["n_seeds"] == 2
    assert out["ok"]["value_mean"] == pytest.approx(10.0)
    assert out["bad"]["verdict"] == "fails"
    assert out["bad"]["value_mean"] == pytest.approx(0.11)
    assert out["bad"]["value_std"] > 0
    assert out["broken"]["verdict"] == "fails" and "no metric" in out["broken"]["error"]
    assert math.isnan(out["broken"]["value_mean"])
