"""Each verdict rule on a planted table: the platform, not the method, catches the artefacts a
skeptic would use to reject a claim (zero spread, ties, A/A controls, unmet preconditions, curves
that still fall, schedules at zero, missing metrics, duplicate spec keys, unit-level power)."""
import json
import textwrap

import numpy as np
import pandas as pd
import pytest

from reprozoo.claims import ClaimError, convergence, measure, verify
from reprozoo.planted import unit_table
from reprozoo.registry import Claim, Condition, Convergence, RegistryError

NAN = float("nan")


def scalars(values: dict[str, list[float]], metric="v") -> pd.DataFrame:
    """{variant: per-seed values} -> long table."""
    return pd.DataFrame([dict(method="m", variant=v, seed=s, metric=metric, x=NAN, value=x)
                         for v, xs in values.items() for s, x in enumerate(xs)])


def curve_rows(variant, seed, metric, xs, ys):
    return [dict(method="m", variant=variant, seed=seed, metric=metric, x=float(x), value=float(y))
            for x, y in zip(xs, ys)]


ROLES = {"a": "method", "b": "baseline", "c": "baseline"}


def one(claim, table, **kw):
    return verify([claim], table, **kw)[0]


def test_zero_spread_is_inconclusive_unless_exact():
    t = scalars({"a": [0.333, 0.333, 0.333]})
    c = Claim("z", "a small", "v@a", "<=", 0.5, paper_value="-")
    out = one(c, t)
    assert out["verdict"] == "inconclusive" and "zero spread" in out["reason"]
    exact = Claim("z", "a small", "v@a", "<=", 0.5, paper_value="-", exact=True)
    assert one(exact, t)["verdict"] == "holds"


def test_rounding_noise_between_seeds_is_zero_spread_not_an_interval():
    """dkmp's edge ratio came out 3.0 +- 1e-15 over seeds: the t-interval of rounding noise is not evidence."""
    t = scalars({"a": [3.0, 3.0 + 4e-15, 3.0 - 4e-15]})
    out = one(Claim("z", "a big", "v@a", ">=", 2.9, paper_value="-"), t)
    assert out["verdict"] == "inconclusive" and "zero spread" in out["reason"]
    real = scalars({"a": [3.0, 3.01, 2.99]})  # a real spread still gives an interval verdict
    assert one(Claim("z", "a big", "v@a", ">=", 2.9, paper_value="-"), real)["verdict"] == "holds"


def test_tie_against_ge_zero_is_refused_by_the_spec_and_a_tie_is_not_a_win():
    from reprozoo.registry import _claim

    raw = {"id": "t", "text": "a beats b", "expr": "v@a - v@b", "op": ">=", "threshold": 0, "paper_value": "-"}
    with pytest.raises(RegistryError, match="passes on a tie"):
        _claim(dict(raw), "spec", {"a", "b"})
    strict = _claim({**raw, "op": ">"}, "spec", {"a", "b"})
    # equal per-seed values (a tie at every seed) never hold a strict claim
    t = pd.concat([scalars({"a": [0.8, 0.9, 0.7]}), scalars({"b": [0.8, 0.9, 0.7]})])
    assert one(strict, t, roles=ROLES)["verdict"] == "inconclusive"
    # a stated margin makes it a non-inferiority test at -margin
    ni = _claim({**raw, "margin": 0.05}, "spec", {"a", "b"})
    assert ni.effective_threshold == pytest.approx(-0.05)
    t2 = pd.concat([scalars({"a": [0.80, 0.91, 0.70]}), scalars({"b": [0.81, 0.90, 0.71]})])
    assert one(ni, t2)["verdict"] == "holds"


def test_a_a_control_that_holds_makes_the_claim_non_discriminative():
    # "a is no worse than 0.9 x b": b replaced for a gives 1 >= 0.9 at every seed, so the claim
    # cannot tell the method from the baseline
    t = pd.concat([scalars({"a": [1.00, 1.05, 0.98]}), scalars({"b": [1.0, 1.0, 1.0]})])
    c = Claim("r", "a at least 0.9 of b", "v@a / v@b", ">=", 0.9, paper_value="-")
    out = one(c, t, roles=ROLES)
    assert out["verdict"] == "non-discriminative"
    assert out["control"]["kind"] == "A/A" and out["control"]["condition"] == "v@b / v@b >= 0.9"
    # a claim that only a real effect passes keeps its verdict, with the control beside it
    c2 = Claim("r2", "a 1.5x b", "v@a / v@b", ">=", 1.5, paper_value="-")
    t2 = pd.concat([scalars({"a": [2.0, 2.1, 1.9]}), scalars({"b": [1.0, 1.0, 1.0]})])
    out2 = one(c2, t2, roles=ROLES)
    assert out2["verdict"] == "holds" and out2["control"]["verdict"] == "fails"


def test_an_a_a_control_the_baseline_cannot_evaluate_is_not_applicable():
    # the method records a merge time, joint training (the baseline) does not: no A/A control exists
    t = pd.concat([scalars({"a": [0.1, 0.12, 0.11]}, metric="merge_s"), scalars({"b": [3.0, 3.2, 2.9]}, metric="train_s")])
    c = Claim("s", "merge 5x faster", "train_s@b / merge_s@a", ">=", 5.0, paper_value="-")
    out = one(c, t, roles=ROLES)
    assert out["verdict"] == "holds" and out["control"]["verdict"] == "not applicable"
    declared = Claim("s", "-", "train_s@b / merge_s@a", ">=", 5.0, paper_value="-", control={"a": "b"})
    assert one(declared, t, roles=ROLES)["verdict"] == "error"


def test_declared_negative_control_must_fail():
    # a quantisation known to be too coarse must be flagged by the same claim
    t = pd.concat([scalars({"a": [0.010, 0.012, 0.011]}), scalars({"c": [0.011, 0.010, 0.012]})])
    c = Claim("q", "16-bit error small", "v@a", "<=", 0.05, paper_value="-",
              control=Condition("v@c", "<=", 0.05))
    assert one(c, t, roles=ROLES)["verdict"] == "non-discriminative"
    t2 = pd.concat([scalars({"a": [0.010, 0.012, 0.011]}), scalars({"c": [0.5, 0.6, 0.55]})])
    assert one(c, t2, roles=ROLES)["verdict"] == "holds"


def test_unmet_precondition_is_untestable():
    t = pd.concat([scalars({"a": [0.6, 0.62, 0.61]}), scalars({"a": [0.04, 0.05, 0.045]}, metric="tok_acc"),
                   scalars({"a": [0.035, 0.035, 0.036]}, metric="majority")])
    c = Claim("u", "a good", "v@a", ">", 0.5, paper_value="-",
              requires=(Condition("tok_acc@a - majority@a", ">", 0.05),))
    out = one(c, t)
    assert out["verdict"] == "untestable"
    assert "tok_acc@a - majority@a > 0.05" in out["reason"]
    c_ok = Claim("u", "a good", "v@a", ">", 0.5, paper_value="-",
                 requires=(Condition("tok_acc@a - majority@a", ">", 0.0),))
    assert one(c_ok, t)["verdict"] == "holds"


def _loss_table(tail_slope: float, lr_end: float, n=20):
    rows = []
    xs = np.linspace(0, 1000, n)
    for s in range(3):
        ys = 1.0 + 2.0 * np.exp(-xs / 100) - tail_slope * xs / 1000 + 0.001 * np.sin(xs + s)
        lr = np.linspace(1e-3, lr_end, n)
        rows += curve_rows("a", s, "val_loss", xs, ys) + curve_rows("a", s, "lr", xs, lr)
        rows.append(dict(method="m", variant="a", seed=s, metric="v", x=NAN, value=0.6 + 0.01 * s))
    return pd.DataFrame(rows)


def test_a_curve_still_falling_is_not_converged():
    conv = [Convergence(curve="val_loss", mode="min", lr="lr")]
    c = Claim("k", "a good", "v@a", ">", 0.5, paper_value="-")
    flat = _loss_table(tail_slope=0.0, lr_end=5e-4)
    st = convergence(conv, flat)
    assert st["a"]["converged"]
    assert one(c, flat, converged=st)["verdict"] == "holds"
    falling = _loss_table(tail_slope=0.5, lr_end=5e-4)  # -0.5 over training: ~15 % in the last 30 %
    st = convergence(conv, falling)
    assert not st["a"]["converged"] and "still improving" in st["a"]["reason"]
    out = one(c, falling, converged=st)
    assert out["verdict"] == "not converged" and "variant 'a'" in out["reason"]


def test_a_schedule_at_zero_cannot_show_a_plateau():
    conv = [Convergence(curve="val_loss", mode="min", lr="lr")]
    st = convergence(conv, _loss_table(tail_slope=0.0, lr_end=0.0))
    assert not st["a"]["converged"] and "learning rate" in st["a"]["reason"]


def test_too_few_points_in_the_tail_is_not_converged():
    rows = []
    for s in range(3):
        rows += curve_rows("a", s, "val_loss", [0, 100, 200, 900, 1000], [3, 2, 1.5, 1.0, 1.0])
    st = convergence([Convergence(curve="val_loss")], pd.DataFrame(rows))
    assert not st["a"]["converged"] and "evaluation points" in st["a"]["reason"]


def test_early_stopping_rules_and_the_gate_share_one_plateau_test():
    """Every method's stopping rule calls claims.plateau; on the gate's own curves it must agree
    with the gate, on both scales, and the methods' wrappers must agree with it."""
    from reprozoo.claims import plateau, tail_fit
    from reprozoo.methods.functional_kl.trajectory import plateau as fkl_plateau
    from reprozoo.methods.ldr.method import tail_improvement

    for slope, scale in [(0.0, "value"), (0.5, "value"), (0.0, "range"), (0.5, "range"), (0.05, "range")]:
        t = _loss_table(tail_slope=slope, lr_end=5e-4)
        st = convergence([Convergence(curve="val_loss", scale=scale)], t)
        for s in range(3):
            r = t[(t.metric == "val_loss") & (t.seed == s)]
            flat = plateau(r.x, r.value, 0.02, scale=scale)
            assert flat == st["a"]["seeds"][str(s)]["converged"]
            assert tail_fit(r.x, r.value, scale=scale)["improvement"] == pytest.approx(
                st["a"]["seeds"][str(s)]["tail_improvement"])
            if scale == "value":
                assert fkl_plateau(r.x, r.value, 0.02) == flat
            else:  # (the shared rule, blocks/fitting.py, calls claims.plateau itself)
                assert tail_improvement(r.x, r.value, scale="range") == pytest.approx(st["a"]["seeds"][str(s)]["tail_improvement"])
        if slope in (0.0, 0.5):  # flat passes on either scale; -0.5 over training fails on either
            assert st["a"]["converged"] == (slope == 0.0)
    # too few points is never a plateau, a rising curve is a plateau of a loss, not of an accuracy
    assert not plateau([0, 1, 2], [3.0, 2.0, 1.0])
    xs = np.linspace(0, 100, 30)
    assert plateau(xs, 1 + xs / 100) and not plateau(xs, 1 + xs / 100, mode="max")


def test_missing_metric_or_division_by_zero_is_an_error_and_fails_verify(tmp_path, monkeypatch):
    t = scalars({"a": [0.0, 0.0, 0.0], "b": [1.0, 2.0, 3.0]})
    assert one(Claim("e", "-", "nothing@a", "<=", 1.0, paper_value="-"), t)["verdict"] == "error"
    out = one(Claim("d", "-", "v@b / v@a", ">", 1.0, paper_value="-"), t)
    assert out["verdict"] == "error" and "division by zero" in out["error"]


def test_verify_stage_exits_non_zero_naming_the_claim(tmp_path, monkeypatch):
    from reprozoo import registry, stages

    spec = registry.get("ftrl_regret")
    bad = Claim("typo", "-", "no_such_metric@" + spec.variant_ids[0], "<=", 1.0, paper_value="-")
    monkeypatch.setattr(spec, "claims", [bad])
    table = tmp_path / "results" / "ci" / "ftrl_regret" / "metrics.parquet"
    table.parent.mkdir(parents=True)
    scalars({spec.variant_ids[0]: [1.0]}).assign(method="ftrl_regret").to_parquet(table)
    claims = table.with_name("claims.json")
    with pytest.raises(stages.ClaimsError, match="'typo'"):
        stages.verify("ftrl_regret", "ci", table, claims, tracking={"mode": "deferred"})
    assert not claims.exists() and json.loads(claims.with_name("claims.error.json").read_text())["claims"]


def test_spec_with_a_duplicate_key_is_rejected_with_file_and_line(tmp_path):
    from reprozoo.strict_yaml import DuplicateKeyError, load

    f = tmp_path / "spec.yaml"
    f.write_text(textwrap.dedent("""\
        claims:
          - id: c
            op: "<="
            threshold: 1.5
            op: ">"
        """))
    with pytest.raises(DuplicateKeyError, match=r"spec.yaml:5: duplicate key 'op' \(first at line 3\)"):
        load(f)


def test_claim_schema_errors_before_any_job(tmp_path):
    from reprozoo.registry import _claim

    base = {"id": "c", "text": "-", "expr": "v@a - v@b", "op": ">", "threshold": 0, "paper_value": "-"}
    with pytest.raises(RegistryError, match=r"unknown key\(s\) \['treshold'\]"):
        _claim({**base, "treshold": 1}, "spec", {"a", "b"})
    with pytest.raises(RegistryError, match="paper_value"):
        _claim({k: v for k, v in base.items() if k != "paper_value"}, "spec", {"a", "b"})
    with pytest.raises(RegistryError, match="control: unknown variant 'zz'"):
        _claim({**base, "control": {"a": "zz"}}, "spec", {"a", "b"})
    with pytest.raises(RegistryError, match=r"requires\[0\]: 'v@q' reads unknown variant"):
        _claim({**base, "requires": ["v@q > 1"]}, "spec", {"a", "b"})


def test_requires_reading_an_unrecorded_metric_is_an_error(monkeypatch):
    from reprozoo import registry

    spec = registry.get("ftrl_regret")
    v = spec.variant_ids[0]
    c = Claim("c", "-", spec.claims[0].expr, spec.claims[0].op, spec.claims[0].threshold, paper_value="-",
              requires=(Condition(f"notarecordedmetric@{v}", ">", 0.0),))
    monkeypatch.setattr(spec, "claims", [c])
    with pytest.raises(RegistryError, match="notarecordedmetric"):
        registry.check_metrics(spec)


def test_every_registered_spec_loads_strictly_and_reads_recorded_metrics():
    from reprozoo import registry

    assert not registry.broken()
    for spec in registry.all_specs():
        registry.check_metrics(spec)


# --- unit-level intervals ----------------------------------------------------------------------

def test_unit_bootstrap_decides_where_the_seed_interval_cannot():
    """One planted table (3 seeds x 200 paired items, effect 0.1, per-seed spread 0.01) where the
    three per-seed differences happen to spread enough that the t(2) bound straddles 0 while the
    items pin the effect down. (On average the two decide about as often: docs/verdicts.md.)"""
    t = unit_table(np.random.default_rng(7), delta=0.1, seed_sd=0.01)
    c = Claim("u", "a beats b", "acc@a - acc@b", ">", 0.0, paper_value="-")
    out = one(c, t, roles=ROLES)
    assert out["interval"] == "seed x unit bootstrap" and out["n_units"] == 200
    assert out["verdict"] == "holds"
    # the same per-seed values without their units: the Student-t interval over 3 seeds
    seed_only = t[~t.metric.str.endswith("#unit")]
    m = measure("acc@a - acc@b", ">", 0.0, seed_only, [0, 1, 2])
    assert m["interval"] == "Student-t over seeds" and m["verdict"] == "inconclusive"
    # a table whose seeds, not its items, carry the spread keeps the seed interval
    wide = unit_table(np.random.default_rng(2), delta=0.1, seed_sd=0.3)
    assert measure("acc@a - acc@b", ">", 0.0, wide, [0, 1, 2])["interval"].startswith("Student-t")


def test_metrics_units_records_mean_and_units():
    from reprozoo.runtime import Metrics

    m = Metrics()
    m.units("acc", [1, 0, 1, 1])
    assert m.scalars["acc"] == 0.75
    back = Metrics.from_json(json.loads(json.dumps(m.to_json())))
    assert back.unit_values["acc"] == [1.0, 0.0, 1.0, 1.0]
    assert [r["metric"] for r in back.rows()].count("acc#unit") == 4


def test_unit_bootstrap_covers_a_planted_effect_at_its_nominal_rate():
    """400 simulated tables (3 seeds x 200 paired units, a planted effect of 0.1): the one-sided
    95 % lower bound lies below the true effect in 93-97 % of them (docs/verdicts.md gives the
    rate over other seed/unit noise mixes)."""
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(400):
        m = measure("acc@a - acc@b", ">", 0.0, unit_table(rng, delta=0.1), [0, 1, 2])
        covered += m["ci_low"] <= 0.1
    assert 0.93 <= covered / 400 <= 0.97


def test_inconclusive_says_what_would_decide_it():
    t = scalars({"a": [0.4, 0.6, 0.55]})
    out = one(Claim("i", "-", "v@a", ">", 0.45, paper_value="-"), t)
    assert out["verdict"] == "inconclusive"
    assert "half-width" in out["reason"] and "seeds (now 3)" in out["reason"]


def test_expression_errors_are_claim_errors():
    with pytest.raises(ClaimError):
        measure("v@a +", ">", 0, scalars({"a": [1.0]}), [0])


def test_a_curve_gates_only_the_claims_it_names():
    """ceitnet trains one head per tensor order in each variant: its order-2 head still falling
    must hold back the order-2 claim, not the order-4 one (spec ``convergence: claims:``)."""
    falling = _loss_table(tail_slope=0.5, lr_end=5e-4)
    flat = _loss_table(tail_slope=0.0, lr_end=5e-4)
    flat = flat[flat.metric != "v"].assign(metric=lambda d: d.metric.replace({"val_loss": "val_o4", "lr": "lr_o4"}))
    t = pd.concat([falling, flat], ignore_index=True)
    o2 = Claim("o2", "a good at order 2", "v@a", ">", 0.5, paper_value="-")
    o4 = Claim("o4", "a good at order 4", "v@a", ">", 0.5, paper_value="-")
    scoped = [Convergence(curve="val_loss", lr="lr", claims=("o2",)), Convergence(curve="val_o4", lr="lr_o4")]
    st = convergence(scoped, t)
    assert not st["a"]["converged"]  # the variant as a whole still shows its stalled head
    got = {r["id"]: r["verdict"] for r in verify([o2, o4], t, converged=st)}
    assert got == {"o2": "not converged", "o4": "holds"}
    # unscoped, the stalled head holds back every claim of the variant (the default)
    st = convergence([Convergence(curve="val_loss", lr="lr"), Convergence(curve="val_o4", lr="lr_o4")], t)
    assert {r["verdict"] for r in verify([o2, o4], t, converged=st)} == {"not converged"}


def test_a_convergence_entry_naming_an_unknown_claim_is_refused():
    from reprozoo.registry import _convergence

    with pytest.raises(RegistryError, match="unknown claim"):
        _convergence([{"curve": "val", "claims": ["typo"]}], "spec", {"a"}, {"o2", "o4"})
    assert _convergence([{"curve": "val", "claims": ["o2"]}], "spec", {"a"}, {"o2"})[0].gates("o2")


def test_a_claim_that_holds_on_a_tie_needs_a_declared_control():
    """A ratio '<= 1' passes when the method is the baseline, and a non-inferiority '<= 1.05' (or a
    difference '>= -margin') with no control has an A/A control that holds by construction: the lint
    refuses both before any job runs, naming the fix."""
    from reprozoo.registry import _claim
    from reprozoo.spec_lint import tie_problem, tie_value

    assert tie_value("v@a / v@b") == 1.0 and tie_value("1 - v@a / v@b") == 0.0
    assert tie_value("v@a") is None and tie_value("v@a / w@b") is None  # one variant; not a comparison
    base = {"id": "t", "text": "-", "paper_value": "-"}

    def problem(**kw):
        return tie_problem(_claim({**base, **kw}, "spec", {"a", "b", "c"}))

    assert "passes on a tie" in problem(expr="v@a / v@b", op="<=", threshold=1.0)
    assert "declare a control" in problem(expr="v@a / v@b", op="<=", threshold=1.05)
    assert "declare a control" in problem(expr="v@a - v@b", op=">=", threshold=-0.1)
    assert "declare a control" in problem(expr="v@a - v@b", op=">=", threshold=0.0, margin=0.1)
    # accepted: a strict win, or a non-inferiority with the control it must fail
    assert problem(expr="v@a / v@b", op="<", threshold=1.0) is None
    assert problem(expr="v@a / v@b", op="<=", threshold=1.05, control={"a": "c"}) is None
    assert problem(expr="v@a - v@b", op=">=", threshold=0.0, margin=0.1, control={"a": "c"}) is None


def test_the_plan_refuses_a_spec_whose_claim_holds_on_a_tie(monkeypatch):
    """The lint runs where runs start (config.plan: the workflow and `reprozoo run`), before any job."""
    import dataclasses

    from reprozoo import config, registry

    spec = registry.get("rex")
    bad = dataclasses.replace(spec.claims[0], expr="v@a / v@b", op="<=", threshold=1.05, control=None, margin=None)
    monkeypatch.setattr(registry, "get", lambda m: dataclasses.replace(spec, claims=[bad]))
    monkeypatch.setattr(registry, "check_metrics", lambda s: None)
    with pytest.raises(RegistryError, match="declare a control"):
        config.plan({"scale": "ci", "methods": ["rex"], "seeds": "auto", "tracking": {}})
