"""Claim evaluation: expressions over metric@variant, per seed, verdict against the threshold."""
import math

import pandas as pd
import pytest

from reprozoo.claims import ClaimError, evaluate_expr, verify
from reprozoo.registry import Claim


def table():
    rows = []
    for seed, scale, ratio in ((0, 1.0, 10.0), (1, 1.2, 9.0)):
        rows += [
            dict(method="m", variant="a", seed=seed, metric="err", x=float("nan"), value=0.1 * scale),
            dict(method="m", variant="b", seed=seed, metric="err", x=float("nan"), value=0.1 * scale * ratio),
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
    assert out["ok"]["value_mean"] == pytest.approx(9.5)
    assert out["bad"]["verdict"] == "fails"
    assert out["bad"]["value_mean"] == pytest.approx(0.11)
    assert out["bad"]["value_std"] > 0
    # a claim that cannot be evaluated is a pipeline error, never a scientific failure
    assert out["broken"]["verdict"] == "error" and "no metric" in out["broken"]["error"]
    assert math.isnan(out["broken"]["value_mean"])


def _seeds(values, metric="v", variant="a"):
    return pd.DataFrame([dict(method="m", variant=variant, seed=s, metric=metric, x=float("nan"), value=v)
                         for s, v in enumerate(values)])


def test_verdict_reads_the_seed_interval_not_the_mean():
    from reprozoo.claims import decide, interval

    # TriForces' "gap shrinks" case: mean -0.04 < 0 but the seeds straddle 0 -> inconclusive
    assert decide([-0.69, 0.45, 0.13], "<", 0.0) == "inconclusive"
    # GFFMERGE's energy case: mean 1.41 <= 2 with one seed at 2.13 -> inconclusive
    assert decide([0.9, 1.2, 2.13], "<=", 2.0) == "inconclusive"
    # tight seeds well on either side decide
    assert decide([0.50, 0.52, 0.51], "<=", 1.0) == "holds"
    assert decide([1.50, 1.52, 1.51], "<=", 1.0) == "fails"
    assert decide([3.0, 3.1, 2.9], ">=", 2.0) == "holds"
    assert decide([1.0, 1.1, 0.9], ">=", 2.0) == "fails"
    # a single seed never holds (and never fails): there is no spread to judge from
    assert decide([0.1], "<=", 1.0) == "inconclusive"
    assert decide([5.0], "<=", 1.0) == "inconclusive"
    with pytest.raises(ClaimError):
        decide([0.1, float("nan")], "<=", 1.0)
    # the bound is the one-sided 95 % Student-t one: t(0.95, 2) = 2.919986
    lo, hi = interval([1.0, 2.0, 3.0], ">=")
    assert lo == pytest.approx(2.0 - 2.919986 * 1.0 / 3 ** 0.5, rel=1e-6)
    assert hi == pytest.approx(2.0 + 2.919986 * 1.0 / 3 ** 0.5, rel=1e-6)


def test_verify_reports_interval_per_seed_and_single_seed():
    c = [Claim("c", "v small", "v@a", "<=", 1.0, paper_value="-")]
    out = verify(c, _seeds([0.2, 0.3, 0.25]))[0]
    assert out["verdict"] == "holds" and out["ci_high"] < 1.0 and set(out["per_seed"]) == {"0", "1", "2"}
    one = verify(c, _seeds([0.2]))[0]
    assert one["verdict"] == "inconclusive" and one["single_seed"] and one["n_seeds"] == 1


def test_claim_on_a_variant_not_run_is_not_measured():
    c = [Claim("c", "a beats b", "v@a / v@b", "<=", 1.0, paper_value="-"),
         Claim("d", "a small", "v@a", "<=", 1.0, paper_value="-")]
    out = {x["id"]: x for x in verify(c, _seeds([0.2, 0.3, 0.25]), selected_variants=["a"])}
    assert out["c"]["verdict"] == "not measured" and out["c"]["missing_variants"] == ["b"]
    assert out["d"]["verdict"] == "holds"

