"""EvoDiverse numerics: oracle, replica-exchange detailed balance, budgets, LLM proposer on loopback."""
import json

import numpy as np
import pytest

from loopback import chat_server
from reprozoo.blocks import llm_backend as lb
from reprozoo.methods.evodiverse import expressions as ex
from reprozoo.methods.evodiverse import proposers as P
from reprozoo.methods.evodiverse import search as S
from reprozoo.methods.evodiverse import tasks as T

CFG = dict(budget=300, pop_size=8, populations=2, offspring=4, betas=[0.8, 0.2], greedy_parent_beta=0.8,
           elites=2, alpha_div=1.0, swap_every=2, swap_size=3, xi0=2.5)


@pytest.fixture(scope="module")
def coulomb():
    return T.EquationTask.sample("I.12.2", 80, np.random.default_rng(0))


def test_parse_print_round_trip_and_semantics(coulomb):
    rng = np.random.default_rng(1)
    for _ in range(200):
        t = ex.random_tree(rng, 3, max_depth=4)
        back = ex.parse(ex.to_str(t, coulomb.names), coulomb.names)
        with np.errstate(all="ignore"):
            a, b = ex.evaluate(t, coulomb.X), ex.evaluate(back, coulomb.X)
        np.testing.assert_allclose(a, b, rtol=1e-12, equal_nan=True)
    with pytest.raises(ex.ParseError):
        ex.parse("__import__('os').system('x')", coulomb.names)
    with pytest.raises(ex.ParseError):
        ex.parse("q1 * zeta", coulomb.names)


def test_oracle_scores_truth_exactly_and_is_affine_invariant(coulomb):
    q, key = coulomb.score(coulomb.truth)
    assert q == T.Q_MAX
    # linear scaling: 3 - 2 * q1 q2 / r^2 is the same hypothesis (same quality, same semantic key)
    q2, key2 = coulomb.score(ex.parse("3 - 2 * q2 * q1 / r**2", coulomb.names))
    assert q2 == T.Q_MAX and key2 == key
    # a wrong exponent is clearly worse; a constant scores zero
    assert coulomb.score(ex.parse("q1 * q2 / r", coulomb.names))[0] < 2.0
    assert coulomb.score(ex.parse("2", coulomb.names))[0] == 0.0


@pytest.mark.parametrize("fid", list(T.FEYNMAN))
def test_every_ground_truth_scores_exact(fid):
    task = T.EquationTask.sample(fid, 50, np.random.default_rng(2))
    assert task.score(task.truth)[0] == T.Q_MAX


def test_lp_radii_closed_forms():
    # one circle in the middle: r = 1/2; a 2x2 grid at the quarter points: four circles of 1/4
    np.testing.assert_allclose(T.lp_radii(np.array([[0.5, 0.5]])), [0.5], atol=1e-9)
    grid = np.array([[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]])
    np.testing.assert_allclose(T.lp_radii(grid), [0.25] * 4, atol=1e-9)
    c = np.random.default_rng(3).uniform(size=(12, 2))
    r = T.lp_radii(c)
    d = np.linalg.norm(c[:, None] - c[None], axis=-1)
    iu = np.triu_indices(12, 1)
    assert np.all(r[iu[0]] + r[iu[1]] <= d[iu] + 1e-9)  # no overlaps
    assert np.all(r <= np.minimum(c, 1 - c).min(1) + 1e-9)  # inside the square


def test_packing_distance_is_symmetry_and_permutation_invariant():
    rng = np.random.default_rng(4)
    a = rng.uniform(size=(10, 2))
    rotated = (a - 0.5) @ np.array([[0.0, -1.0], [1.0, 0.0]]).T + 0.5
    assert T.matched_distance(a, rotated[rng.permutation(10)]) < 1e-12
    assert T.matched_distance(a, rotated, symmetric=False) > 0.05
    assert T.matched_distance(a, rng.uniform(size=(10, 2))) > 0.05


def test_replica_exchange_satisfies_detailed_balance():
    """Two one-member 'populations' at betas b1 > b2 exchanging states of known quality: the
    fraction of time the better state sits in the cold slot must be the product-target value
    pi(x_good cold) / (sum over both placements) = 1 / (1 + exp(-(b1 - b2) xi (log r_g - log r_b))),
    with log r the reference's log reward (packing: ln(sum of radii / 2.635))."""
    task = T.CirclePackingTask(2)
    good, bad = S.Candidate("g", 2.0, "g", 0), S.Candidate("b", 1.0, "b", 0)
    cfg = {**CFG, "swap_size": 1, "elites": 0}
    search = S.TemperedSearch(task, None, None, cfg, np.random.default_rng(5))
    cold, hot = S.Population(0.8, 1, [bad]), S.Population(0.2, 1, [good])
    n, good_cold = 20000, 0
    for _ in range(n):
        search.xi = 2.5  # freeze the adaptive scale: the target is then fixed
        search.exchange(cold, hot)
        good_cold += cold.members[0] is good
    expected = 1.0 / (1.0 + np.exp(-(0.8 - 0.2) * 2.5 * np.log(2.0)))
    assert abs(good_cold / n - expected) < 0.015


def test_rewards_are_the_reference_codes_not_a_tuned_temperature(coulomb):
    """Equations: log r = -ln NMSE (the reference's log MSE), score -NMSE; packing: the score is
    OpenEvolve's combined_score = sum of radii / 2.635 and log r its logarithm."""
    tree = ex.parse("q1 * q2 / r", coulomb.names)
    q = coulomb.score(tree)[0]
    f = ex.evaluate(tree, coulomb.X)
    A = np.stack([f, np.ones_like(f)], 1)
    resid = coulomb.y - A @ np.linalg.lstsq(A, coulomb.y, rcond=None)[0]
    nmse = np.mean(resid**2) / np.var(coulomb.y)
    np.testing.assert_allclose(coulomb.log_reward(q), -np.log(nmse), rtol=1e-9)
    np.testing.assert_allclose(coulomb.ref_score(q), -nmse, rtol=1e-9)
    pack = T.CirclePackingTask(26)
    np.testing.assert_allclose(pack.ref_score(2.635), 1.0)
    np.testing.assert_allclose(pack.log_reward(2.0), np.log(2.0 / 2.635))


def test_swap_pairing_draws_both_populations_by_softmax_of_beta_score():
    """The reference pairs swap members by softmax(beta * score) in BOTH populations (no uniform
    draw over the cold non-elites): with scores 0, 1, 2 (combined_score units: sum / 2.635) and a
    large beta the single draw follows softmax(beta * score), the best (an elite) included."""
    task = T.CirclePackingTask(2)
    search = S.TemperedSearch(task, None, None, CFG, np.random.default_rng(11))
    members = [S.Candidate(str(i), 2.635 * i, str(i), 0) for i in range(3)]
    for beta in (2.0, 0.2):
        pop = S.Population(beta, 3, members)
        draws = np.bincount([search.pairing(pop, 1)[0] for _ in range(20000)], minlength=3) / 20000
        w = np.exp(beta * np.arange(3.0))
        np.testing.assert_allclose(draws, w / w.sum(), atol=0.015)
    # without replacement: m draws are m distinct members
    assert sorted(search.pairing(S.Population(0.8, 3, members), 3)) == [0, 1, 2]


def test_gumbel_topk_samples_without_replacement_proportionally():
    rng = np.random.default_rng(6)
    logw = np.log(np.array([0.7, 0.2, 0.1]))
    first = np.bincount([S.gumbel_topk(logw, 1, rng)[0] for _ in range(20000)], minlength=3) / 20000
    np.testing.assert_allclose(first, [0.7, 0.2, 0.1], atol=0.015)
    assert len(set(S.gumbel_topk(logw, 3, rng))) == 3


@pytest.mark.parametrize("variant", ["evodiverse", "pt_noswap", "greedy"])
def test_every_variant_spends_exactly_the_budget(coulomb, variant):
    rng = np.random.default_rng(7)
    init = [coulomb.random(rng) for _ in range(16)]
    oracle, info = S.run_variant(variant, coulomb, P.SymbolicProposer(coulomb), CFG, init, np.random.default_rng(8))
    assert oracle.calls == CFG["budget"] and len(oracle.best_per_call) == CFG["budget"]
    assert np.all(np.diff(oracle.best_per_call) >= 0)
    keys = [c.skey for c in info["final"]]
    assert len(keys) == len(set(keys)) and len(keys) <= 16
    if variant == "evodiverse":
        assert 0.0 <= info["swap_rate"] <= 1.0


def test_search_recovers_a_planted_formula():
    """A planted one-variable formula, y = theta**2 + theta, is found exactly (up to a*f + b) by the
    tempered search within 1500 calls on most seeds: the search climbs, it does not only wander."""
    task = T.EquationTask("I.6.20a", *(lambda X: (X, X[:, 0] ** 2 + X[:, 0]))(
        np.random.default_rng(9).uniform(1, 3, size=(60, 1))))
    found = 0
    for seed in range(3):
        rng = np.random.default_rng(seed)
        init = [task.random(rng) for _ in range(16)]
        oracle, _ = S.run_variant("evodiverse", task, P.SymbolicProposer(task), {**CFG, "budget": 1500},
                                  init, np.random.default_rng(seed))
        found += oracle.best_per_call[-1] >= 10.0
    assert found >= 2


def test_llm_proposer_through_the_shared_backend_on_loopback(coulomb, monkeypatch):
    """The fake server answers with a mutated expression in prose + code fence; the proposer must
    send the parents in the prompt, parse the reply and hand back the formula as a tree."""
    def reply(body):
        prompt = body["messages"][-1]["content"]
        assert "q1 * q2 / r" in prompt  # the parent, as text
        return "Squaring the distance should help.\n```python\ny = q1 * q2 / r**2\n```"

    monkeypatch.setenv(lb.ENV_KEY, "sk-test-key")
    with chat_server(reply=reply) as (url, reqs):
        monkeypatch.setenv(lb.ENV_URL, url)
        monkeypatch.setenv(lb.ENV_MODEL, "fake")
        prop = P.make_proposer(coulomb, "auto")
        assert isinstance(prop, P.LLMProposer)
        parent = ex.parse("q1 * q2 / r", coulomb.names)
        child = prop.propose([(parent, coulomb.score(parent)[0])], np.random.default_rng(0))
    assert coulomb.score(child)[0] == T.Q_MAX
    assert reqs[0]["body"]["model"] == "fake" and "seed" in reqs[0]["body"]
    assert "sk-test-key" not in repr(prop.backend)


def test_llm_proposer_drives_a_search_and_survives_bad_replies(monkeypatch):
    """Packing path: the fake jitters the first parent's centres (JSON) or answers nonsense; the
    search still spends its budget and unparsable replies cost no oracle call."""
    task = T.CirclePackingTask(5)
    state = {"n": 0}

    def reply(body):
        state["n"] += 1
        if state["n"] % 3 == 0:
            return "I cannot help with that."
        text = body["messages"][-1]["content"].split("Parent hypotheses:")[1]
        start = text.index("[[")
        centres = np.array(json.loads(text[start:text.index("]]", start) + 2]))
        centres = np.clip(centres + 0.01 * np.random.default_rng(state["n"]).standard_normal(centres.shape), 0, 1)
        return json.dumps(centres.tolist())

    with chat_server(reply=reply) as (url, _):
        monkeypatch.setenv(lb.ENV_URL, url)
        monkeypatch.setenv(lb.ENV_MODEL, "fake")
        prop = P.make_proposer(task, "llm")
        rng = np.random.default_rng(1)
        init = [task.random(rng) for _ in range(8)]
        oracle, _ = S.run_variant("evodiverse", task, prop, {**CFG, "budget": 40, "pop_size": 4, "offspring": 2},
                                  init, np.random.default_rng(2))
    assert oracle.calls == 40
    assert prop.failures > 0 and prop.calls >= 32 + prop.failures
    assert oracle.best_per_call[-1] > oracle.best_per_call[7]  # improved on the initial population


def test_offline_is_the_default(monkeypatch, coulomb):
    monkeypatch.delenv(lb.ENV_URL, raising=False)
    assert isinstance(P.make_proposer(coulomb, "auto"), P.SymbolicProposer)
    with pytest.raises(lb.BackendError):
        P.make_proposer(coulomb, "llm")


def test_every_configured_formula_is_within_the_search_space():
    """The formulas of every scale can be written in the grammar within the size and depth
    limits the search enforces (so recovery is possible at all), and score exactly."""
    from pathlib import Path

    import yaml

    folder = Path(T.__file__).parent / "configs"
    for scale in ("ci", "smoke", "paper"):
        cfg = yaml.safe_load((folder / f"{scale}.yaml").read_text())
        for fid in cfg["formulas"]:
            task = T.EquationTask.sample(fid, 50, np.random.default_rng(3), max_size=cfg["max_size"])
            assert task.valid(task.truth), (scale, fid, ex.size(task.truth), ex.depth(task.truth))
            assert task.score(task.truth)[0] == T.Q_MAX
