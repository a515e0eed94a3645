"""GCN-SR numerics: the SPBT bijection, batched rewards, normalised policies (the level-D pass
filled without the network included), SWPG rewards, GP operators and the GP-only baseline, exact
recovery of the Nguyen targets and of a planted expression."""
import itertools

import numpy as np
import pytest

from reprozoo.methods.gcn_sr import expressions as E
from reprozoo.methods.gcn_sr.benchmarks import NGUYEN, task_data
from reprozoo.methods.gcn_sr.gp import crossover, grow, point_mutation, refine, subtree_mutation
from reprozoo.methods.gcn_sr.search import EXACT_REWARD, run_neural, swpg_rewards

A, S, M, D, SIN, COS, EXP, LOG, X = range(9)
ONE = [D, X, X]
TWO = [A, D, X, X, D, X, X]
X2 = [M, X, X]
X3 = [M, X, X2[0], X, X]
# shortest constructions of the targets in the Koza library (depth = Task.min_depth)
CONSTRUCTIONS = {
    "nguyen1": [A, *X3, A, *X2, X],                                               # x^3 + (x^2 + x)
    "nguyen2": [M, M, X, A, X, *ONE, A, *X2, *ONE],                               # x (x+1) (x^2+1)
    "nguyen3": [M, X, A, M, A, *X2, X, A, *X2, *ONE, *ONE],                       # x ((x^2+x)(x^2+1) + 1)
    "nguyen4": [M, A, *X3, A, *X2, X, A, *X3, *ONE],                              # (x^3+x^2+x)(x^3+1)
    "nguyen5": [S, M, SIN, *X2, COS, X, *ONE],                                    # sin(x^2) cos(x) - 1
    "nguyen6": [A, SIN, X, SIN, A, X, *X2],                                       # sin(x) + sin(x + x^2)
    "nguyen7": [LOG, M, A, X, *ONE, A, *X2, *ONE],                                # log((x+1)(x^2+1))
    "nguyen8": [EXP, D, LOG, X, *TWO],                                            # exp(log(x) / 2)
}


@pytest.mark.parametrize("name", list(NGUYEN))
def test_constructions_fit_exactly_and_are_recovered(name):
    task, prefix = NGUYEN[name], CONSTRUCTIONS[name]
    assert E.depth(prefix) == task.min_depth
    x, y = task_data(name, 0)
    assert E.reward(prefix, x, y) >= EXACT_REWARD
    assert E.symbolically_equal(prefix, task.truth, task.domain)
    a = E.prefix_to_spbt(prefix, task.min_depth)
    assert E.satisfies_constraints(a, task.min_depth)


def test_near_misses_are_not_recovered():
    assert not E.symbolically_equal([A, *X3, *X2], "x**3 + x**2 + x", (-1, 1))           # drops + x
    assert not E.symbolically_equal([SIN, X], "x - x**3/6", (-1, 1))                      # Taylor look-alike
    assert not E.symbolically_equal([A, LOG, X, LOG, X], "log(x**2)", (-1, 1))           # undefined for x < 0
    assert E.symbolically_equal([A, LOG, X, LOG, X], "log(x**2)", (0.5, 2))
    assert E.symbolically_equal([D, M, X, X2[0], X, X, X], "x**2", (-1, 1))              # x*x*x / x


def test_evaluate_agrees_with_sympy_and_depth():
    import sympy as sp

    rng = np.random.default_rng(0)
    xs = np.linspace(0.1, 0.9, 7)
    x = sp.Symbol("x")
    for _ in range(40):
        p = grow(rng, 4)
        e = E.to_sympy(p, x)
        if e.has(sp.zoo, sp.nan):     # e.g. x / (x - x): sympy folds it to complex infinity
            assert not np.any(np.isfinite(E.evaluate(p, xs)))
            continue
        f = sp.lambdify(x, e, "numpy")
        with np.errstate(all="ignore"):
            ref = np.broadcast_to(np.asarray(f(xs), float), xs.shape)
            val = E.evaluate(p, xs)
        ok = np.isfinite(ref) & (np.abs(ref) < 1e8)
        np.testing.assert_allclose(val[ok], ref[ok], rtol=1e-9)
        assert E.depth(p) <= 4
        assert E.subtree_end(p, 0) == len(p)


def test_spbt_is_a_bijection_and_context_marks_the_used_slots():
    rng = np.random.default_rng(1)
    for _ in range(100):
        p = grow(rng, 4)
        a = E.prefix_to_spbt(p, 4)
        assert E.spbt_to_prefix(a) == p
        active = E.scaffold_context(a[None], 4)[0][0]
        np.testing.assert_array_equal(active, a != E.EMPTY)
        assert [int(a[i]) for i in E.preorder_slots(a)] == p
    with pytest.raises(ValueError):
        E.prefix_to_spbt(CONSTRUCTIONS["nguyen1"], 2)
    # a unary node keeps its operand in the LEFT child, the right child stays EMPTY
    a = E.prefix_to_spbt([SIN, X], 2)
    assert a[0] == SIN and a[1] == X and a[2] == E.EMPTY


def test_constraints():
    assert not E.satisfies_constraints(E.prefix_to_spbt([EXP, LOG, X], 2), 2)
    assert not E.satisfies_constraints(E.prefix_to_spbt([SIN, A, X, COS, X], 3), 3)
    assert E.satisfies_constraints(E.prefix_to_spbt([EXP, D, LOG, X, X], 3), 3)
    m = E.allowed_symbols(np.array([-1, EXP]), np.array([False, False]), np.array([2, 1]), 2)
    assert m[0].tolist() == (E.ARITY == 0).tolist()          # level D: terminals only
    assert not m[1, LOG] and m[1, SIN]


def test_spbt_similarity():
    a = E.prefix_to_spbt([A, X, X], 2)
    b = E.prefix_to_spbt([A, X, SIN, X], 2)   # shares 'add' and the left 'x'; union 4 slots
    c = E.prefix_to_spbt([X], 2)
    s = E.spbt_similarity(np.array([a, b, c]), np.array([a, b, c]))
    np.testing.assert_allclose(np.diag(s), 1.0)
    np.testing.assert_allclose(s, s.T)
    assert s[0, 1] == pytest.approx(2 / 4)
    assert s[0, 2] == 0.0


def _all_trees(max_depth):
    """Every complete expression of depth <= max_depth that the constraints allow."""
    def rec(d):
        out = [[X]]
        if d == 0:
            return out
        subs = rec(d - 1)
        for t in range(E.V):
            if E.ARITY[t] == 1:
                out += [[t] + s for s in subs]
            elif E.ARITY[t] == 2:
                out += [[t] + s1 + s2 for s1, s2 in itertools.product(subs, subs)]
        return out
    trees = [E.prefix_to_spbt(p, max_depth) for p in rec(max_depth)]
    return np.array([a for a in trees if E.satisfies_constraints(a, max_depth)])


@pytest.mark.parametrize("kind", ["gcn", "rnn"])
def test_policy_is_a_normalised_distribution_over_valid_trees(kind):
    import torch

    from reprozoo.methods.gcn_sr.policies import make_policy

    torch.manual_seed(0)
    pol = make_policy(kind, 2, {"width": 16, "layers": 2, "embed": 8})
    trees = _all_trees(2)
    with torch.no_grad():
        lp, ent = pol.log_prob(trees)
    assert torch.exp(lp).sum().item() == pytest.approx(1.0, abs=1e-4)
    assert (ent >= 0).all()
    # samples obey the constraints and their frequencies follow exp(log p)
    gen = torch.Generator().manual_seed(0)
    samples = pol.sample(3000, gen)
    assert all(E.satisfies_constraints(a, 2) for a in samples[:300])
    keys = {tuple(a): i for i, a in enumerate(trees)}
    counts = np.bincount([keys[tuple(a)] for a in samples], minlength=len(trees))
    p = torch.exp(lp).numpy()
    top = np.argsort(-p)[:5]
    assert np.all(np.abs(counts[top] / 3000 - p[top]) <= 4 * np.sqrt(p[top] / 3000) + 1e-3)


def test_risk_seeking_gradient_raises_the_best_samples_probability():
    import torch

    from reprozoo.methods.gcn_sr.policies import (make_policy, risk_seeking_loss,
                                                  risk_seeking_selection)

    torch.manual_seed(0)
    pol = make_policy("gcn", 2, {"width": 16, "layers": 2})
    target = E.prefix_to_spbt([A, *X2, X], 2)
    batch = np.array([target] + [E.prefix_to_spbt(p, 2) for p in ([X], [SIN, X], [M, X, X])] * 5)
    r = np.array([1.0] + [0.1, 0.2, 0.3] * 5)
    keep, r_eps = risk_seeking_selection(r, 0.1)
    assert r_eps == pytest.approx(0.3) and 0 in keep and len(keep) == 6   # ties at R_eps kept, advantage 0
    opt = torch.optim.SGD(pol.parameters(), lr=0.5)
    before = pol.log_prob(target[None])[0].item()
    for _ in range(3):
        logp, ent = pol.log_prob(batch[keep])
        loss = risk_seeking_loss(logp, ent, r[keep] - r_eps, 0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert pol.log_prob(target[None])[0].item() > before + 0.5


def test_swpg_rewards():
    e = E.prefix_to_spbt([A, *X2, X], 2)
    same, half, other = e, E.prefix_to_spbt([A, X, X], 2), E.prefix_to_spbt([COS, X], 2)
    samples = np.array([same, half, other])
    r = np.array([0.4, 0.5, 0.6])
    out = swpg_rewards(samples, r, e[None], np.array([0.9]), lam=1.0)
    s = E.spbt_similarity(samples, e[None])[:, 0]
    np.testing.assert_allclose(out, r + s * (0.9 - r))
    assert out[0] == pytest.approx(0.9) and out[2] == pytest.approx(0.6)   # identical -> elite reward; unrelated -> own
    assert np.all(out >= r)
    # elites worse than the sample never lower its reward; no elites -> plain rewards
    np.testing.assert_allclose(swpg_rewards(samples, r, e[None], np.array([0.1]), 1.0), r)
    np.testing.assert_allclose(swpg_rewards(samples, r, np.zeros((0, 7), int), np.zeros(0), 1.0), r)


def test_gp_operators_respect_the_scaffold_and_elitism():
    rng = np.random.default_rng(3)
    pop = [grow(rng, 3) for _ in range(30)]
    for _ in range(200):
        a, b = pop[rng.integers(30)], pop[rng.integers(30)]
        for child in (crossover(a, b, rng, 3), subtree_mutation(a, rng, 3), point_mutation(a, rng)):
            if child is None:          # crossover too deep / point mutation of a bare x: no child
                continue
            assert E.depth(child) <= 3 and E.subtree_end(child, 0) == len(child)
        pm = point_mutation(a, rng)
        assert (pm is None) == (a == [X])
        if pm is not None:             # exactly one symbol changed, to another of the same arity
            diff = [k for k in range(len(a)) if a[k] != pm[k]]
            assert len(pm) == len(a) and len(diff) == 1 and E.ARITY[a[diff[0]]] == E.ARITY[pm[diff[0]]]
    x, y = task_data("nguyen1", 0)
    score = lambda ps: np.array([E.reward(p, x, y) for p in ps])
    fit = score(pop)
    children, rew = refine(pop, fit, score, 4, rng, 3)
    assert len(children) == 4 * 30 and len(rew) == 4 * 30
    best_per_gen = rew.reshape(4, 30).max(1)
    assert best_per_gen[0] >= fit.max() and np.all(np.diff(best_per_gen) >= 0)
    np.testing.assert_allclose(score(children), rew)
    # every child lives in the policies' search space (depth and constraints)
    assert all(E.prefix_ok(c, 3) for c in children)


def test_gp_children_are_rarely_copies_of_their_parent():
    """The variation step's output differs from its first parent (point mutation never redraws
    the same symbol, too-deep crossovers and invalid children are retried): on a converged
    population (a few distinct trees, bare x included) under 2 % of children are copies, and a
    ramped half-and-half population has no bare terminal and obeys the constraints."""
    from reprozoo.methods.gcn_sr.gp import ramped_half_and_half, vary

    rng = np.random.default_rng(0)
    small = [[X], [SIN, X], [M, X, X], CONSTRUCTIONS["nguyen6"], CONSTRUCTIONS["nguyen2"]]
    copies, n = 0, 2000
    for _ in range(n):
        p1, p2 = small[rng.integers(len(small))], small[rng.integers(len(small))]
        child = vary(p1, p2, rng, 4, 0.5)
        copies += child == p1
        assert E.prefix_ok(child, 4)
    assert copies / n < 0.02
    pop = ramped_half_and_half(rng, 400, 4, ok=lambda p: E.prefix_ok(p, 4))
    assert all(len(p) > 1 and E.prefix_ok(p, 4) for p in pop)
    assert max(E.depth(p) for p in pop) == 4 and sum(E.depth(p) == 2 for p in pop) > 50


def test_prefix_constraint_check_equals_the_scaffold_one():
    rng = np.random.default_rng(4)
    trees = [grow(rng, 4, 0.2) for _ in range(1500)]
    a = np.array([E.prefix_to_spbt(p, 4) for p in trees])
    ok = E.constraints_ok(a, 4)
    assert 0.1 < ok.mean() < 0.95
    np.testing.assert_array_equal(ok, [E.prefix_ok(p, 4) for p in trees])
    assert not E.prefix_ok(CONSTRUCTIONS["nguyen2"], 3)              # deeper than the cap


def test_scorer_charges_each_distinct_expression_once_and_stops_at_the_budget():
    x, y = task_data("nguyen1", 0)
    sc = E.Scorer(x, y, 4, budget=5)
    batch = [[X], [SIN, X], [X], [M, X, X], [SIN, X]]
    r = sc(batch)
    assert sc.evals == 3 and sc.proposed == 5 and len(r) == 5
    np.testing.assert_array_equal(r, [E.reward(p, x, y) for p in batch])
    r = sc([[X], [COS, X], [EXP, X], [LOG, X], [M, X, X]])    # 2 new fit, the third does not
    assert sc.evals == 5 and sc.spent and len(r) == 3
    a = np.array([E.prefix_to_spbt(p, 4) for p in batch])
    assert len(sc.score_spbt(a, batch)) == 5 and sc.evals == 5   # repeats stay free after the budget


def test_batched_rewards_equal_the_stack_machine():
    """The batched SPBT evaluation gives bit-identical rewards to the per-expression one,
    including the non-finite cases (division by zero, log of a negative) that score 0."""
    rng = np.random.default_rng(5)
    x, y = task_data("nguyen6", 0)
    prefixes = [grow(rng, 4, 0.2) for _ in range(600)] + [[D, X, S, X, X], [LOG, S, X, X], CONSTRUCTIONS["nguyen6"]]
    ref = np.array([E.reward(p, x, y) for p in prefixes])
    assert (ref == 0).sum() > 10 and ref[-1] >= EXACT_REWARD
    np.testing.assert_array_equal(E.prefix_rewards(prefixes, x, y, 4), ref)
    np.testing.assert_array_equal(E.spbt_rewards(np.array([E.prefix_to_spbt(p, 4) for p in prefixes]), x, y), ref)


def test_gp_baseline_counts_evaluations_and_recovers_a_planted_expression():
    from reprozoo.methods.gcn_sr.gp_baseline import initial_population, run_gp

    rng = np.random.default_rng(0)
    pop = initial_population(rng, 60, 4)
    assert len(pop) == 60 and all(E.depth(p) <= 4 and E.prefix_ok(p, 4) for p in pop) and max(E.depth(p) for p in pop) == 4
    x = rng.uniform(-1, 1, 20)
    y = x * x + x
    cfg = {"max_depth": 2, "budget": 1000, "batch": 50, "gp": {"p_crossover": 0.5, "tournament": 5}}
    wins = 0
    for seed in range(3):
        hall = run_gp(x, y, cfg, seed)
        assert hall.evals <= 1000 and hall.trace_evals[0] <= 50 and np.all(np.diff(hall.trace_best) >= 0)
        assert hall.best_reward == pytest.approx(E.reward(hall.best, x, y))
        assert hall.exact or hall.evals == 1000
        if hall.exact:
            assert E.symbolically_equal(hall.best, "x**2 + x", (-1, 1)), E.to_string(hall.best)
            wins += 1
    assert wins >= 2


@pytest.mark.parametrize("policy,mode", [("gcn", "swpg"), ("gcn", "pg"), ("gcn", "imitate"), ("rnn", "pg")])
def test_planted_expression_is_recovered_within_budget(policy, mode):
    """x^2 + sin(x) on a depth-3 scaffold (thousands of valid trees): at least 2 of 3 searches
    stop at an exact fit within 6000 evaluations, and the fit is the planted expression."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 20)
    y = x * x + np.sin(x)
    cfg = {"max_depth": 3, "budget": 6000, "batch": 100, "lr": 0.005, "epsilon": 0.1, "entropy_coef": 0.005,
           "swpg_lambda": 1.0, "policy": {"width": 16, "layers": 2, "embed": 8},
           "gp": {"generations": 1, "elites": 5, "p_crossover": 0.5, "tournament": 5}}
    wins = 0
    for seed in range(3):
        hall = run_neural(x, y, policy, mode, cfg, seed=seed)
        assert hall.evals <= 6000 and np.all(np.diff(hall.trace_best) >= 0)
        if hall.exact:
            assert E.symbolically_equal(hall.best, "x**2 + sin(x)", (-1, 1)), E.to_string(hall.best)
            wins += 1
    assert wins >= 2


def test_every_variant_stays_within_its_evaluation_budget():
    """Each variant's charged evaluations never exceed the budget, whatever stops it; the
    untrained control (lr 0) never moves its generator's parameters."""
    from reprozoo.methods.gcn_sr.method import VARIANTS, search_once

    x, y = task_data("nguyen5", 0)     # not found at this budget: every search runs to its end
    cfg = {"max_depth": 3, "budget": 700, "batch": 60, "lr": 0.005, "epsilon": 0.1, "entropy_coef": 0.005,
           "swpg_lambda": 1.0, "policy": {"width": 8, "layers": 2, "embed": 8},
           "gp": {"generations": 1, "elites": 5, "p_crossover": 0.5, "tournament": 5},
           "gp_only": {"population": 50, "tournament": 3}}
    for v in VARIANTS:
        hall = search_once(v, x, y, cfg, seed=1)
        assert hall.evals <= 700 and hall.proposed >= hall.evals, v
        assert hall.evals == 700 or hall.exact, (v, hall.evals)
        assert hall.trace_evals == sorted(hall.trace_evals) and hall.trace_evals[-1] == hall.evals


def test_untrained_control_keeps_its_initial_generator():
    import torch

    from reprozoo.methods.gcn_sr import policies

    seen = []
    orig = policies.make_policy

    def spy(*a, **k):
        pol = orig(*a, **k)
        seen.append((pol, [p.detach().clone() for p in pol.parameters()]))
        return pol

    x, y = task_data("nguyen5", 0)
    cfg = {"max_depth": 3, "budget": 400, "batch": 50, "lr": 0.0, "epsilon": 0.1, "entropy_coef": 0.005,
           "swpg_lambda": 1.0, "policy": {"width": 8, "layers": 2}}
    import reprozoo.methods.gcn_sr.search as S
    S.make_policy, saved = spy, S.make_policy
    try:
        run_neural(x, y, "gcn", "pg", cfg, seed=0)
    finally:
        S.make_policy = saved
    pol, before = seen[0]
    assert all(torch.equal(p, q) for p, q in zip(pol.parameters(), before))


def test_configs_and_spec_agree_on_the_tasks():
    """Every scale's tasks fit its scaffold; the tasks the spec's per-task preconditions read are
    the ci and smoke tasks (otherwise a precondition reads an unrecorded metric), every spec
    variant is a known one, and the pair-mean precondition form says exactly what min/max say."""
    import re
    from pathlib import Path

    import yaml

    from reprozoo.methods.gcn_sr.method import VARIANTS

    root = Path(E.__file__).parent
    spec = yaml.safe_load((root / "spec.yaml").read_text())
    cfgs = {s: yaml.safe_load((root / "configs" / f"{s}.yaml").read_text()) for s in ("ci", "smoke", "paper")}
    for scale, cfg in cfgs.items():
        for name in cfg["benchmarks"]:
            assert NGUYEN[name].min_depth <= cfg["max_depth"], (scale, name)
    read = {m for c in spec["claims"] for r in c.get("requires", []) for m in re.findall(r"recovery_(nguyen\d)@", r)}
    assert read == set(cfgs["smoke"]["benchmarks"]) == set(cfgs["ci"]["benchmarks"])
    assert {v["id"] for v in spec["variants"]} <= set(VARIANTS)
    grid = np.linspace(0, 1, 9)
    for a, b in itertools.product(grid, grid):
        assert ((a + b) / 2 > 0) == (max(a, b) > 0) and ((a + b) / 2 < 1) == (min(a, b) < 1)
