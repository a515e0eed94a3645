"""Verbalized Bayesian persuasion: LP and concavification against closed forms, obedience, the
verbal round trip (scheme -> English -> scheme), the mediator-augmented meta-game, the PSRO loop,
and the optional LLM path against a fake OpenAI-compatible server on 127.0.0.1."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback import chat_server  # noqa: E402

from reprozoo.methods.verbalized_bp import method as M  # noqa: E402
from reprozoo.methods.verbalized_bp.games import GAMES, BPGame  # noqa: E402
from reprozoo.methods.verbalized_bp.psro import play_dialogues, run_psro  # noqa: E402
from reprozoo.methods.verbalized_bp.solvers import (all_deviation_rules, babbling_scheme,  # noqa: E402
                                                    concavify_binary, lagrangian, lp_optimum,
                                                    max_violation, realized_sender_utility,
                                                    truthful_scheme, zero_sum_nash)
from reprozoo.methods.verbalized_bp.verbal import (LexiconReceiver, commitment_text,  # noqa: E402
                                                   parse_commitment, parse_scheme, verbalize_scheme)
from reprozoo.runtime import RunContext  # noqa: E402

CR = GAMES["courtroom"]
P = {"games": ["courtroom"], "iterations": 12, "n_proposals": 4, "p_fresh": 0.3, "grid": 0.05, "lam": 10.0,
     "temperature": 1.0, "tolerance": 0.02, "n_dialogues": 4000, "receiver": "any"}


def test_courtroom_lp_is_kamenica_gentzkow():
    value, pi = lp_optimum(CR)
    assert value == pytest.approx(0.6, abs=1e-9)
    # convict always when guilty, 3/7 of the time when innocent: posterior 1/2 after "convict"
    np.testing.assert_allclose(pi[:, 0], [1.0, 3.0 / 7.0], atol=1e-8)


@pytest.mark.parametrize("name", list(GAMES))
def test_lp_matches_closed_form_and_is_obedient(name):
    g = GAMES[name]
    value, pi = lp_optimum(g)
    t = {"courtroom": 0.5, "recommendation_letter": 0.5, "law_enforcement": 0.25}[name]
    assert value == pytest.approx(min(1.0, g.prior[0] / t), abs=1e-9) == pytest.approx(g.closed_form)
    # obedience: every constraint sum_s mu0 pi (u_r(s,a') - u_r(s,a)) <= 0 holds at the solution
    j = g.mu0[:, None] * pi
    for a in range(2):
        for b in range(2):
            assert j[:, a] @ (g.ur[:, b] - g.ur[:, a]) <= 1e-9
    assert max_violation(g, pi) <= 1e-9
    assert realized_sender_utility(g, pi) == pytest.approx(value, abs=1e-7)
    assert realized_sender_utility(g, truthful_scheme(g)) == pytest.approx(g.prior[0])
    assert realized_sender_utility(g, babbling_scheme(g)) == 0.0


def _random_game(rng, n_actions=3):
    return BPGame(name="random", sender="s", receiver="r", states=("x", "y"), state_phrases=("x", "y"),
                  actions=tuple(f"a{k}" for k in range(n_actions)), prior=tuple(rng.dirichlet([1, 1])),
                  u_sender=tuple(map(tuple, rng.normal(size=(2, n_actions)))),
                  u_receiver=tuple(map(tuple, rng.normal(size=(2, n_actions)))))


@pytest.mark.parametrize("seed", range(12))
def test_concavification_equals_lp(seed):
    g = _random_game(np.random.default_rng(seed))
    assert concavify_binary(g) == pytest.approx(lp_optimum(g)[0], abs=1e-7)
    # and never below the no-information value (the envelope lies above v)
    assert concavify_binary(g) >= realized_sender_utility(g, np.full((2, 3), 1 / 3)) - 1e-9


def test_concavification_of_classic_games():
    for g in GAMES.values():
        assert concavify_binary(g) == pytest.approx(g.closed_form, abs=1e-12)


def test_zero_sum_nash_matching_pennies_and_exact_penalty():
    v, s, r = zero_sum_nash(np.array([[1.0, -1.0], [-1.0, 1.0]]))
    assert v == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(s, [0.5, 0.5], atol=1e-8)
    np.testing.assert_allclose(r, [0.5, 0.5], atol=1e-8)
    # mediator-augmented game over a 1/70 grid of schemes (it holds 3/7 = 30/70) and all deviation
    # rules: max_pi min_phi U_s - lam D equals the LP optimum for lam = 10 and exceeds it for lam = 0
    qs = np.linspace(0, 1, 71)
    pis = [np.array([[a, 1 - a], [b, 1 - b]]) for a in qs[::7] for b in qs]
    rules = all_deviation_rules(2)
    for lam, expect in ((10.0, 0.6), (0.0, 1.0)):
        m = np.array([[lagrangian(CR, pi, phi, lam) for phi in rules] for pi in pis])
        assert zero_sum_nash(m)[0] == pytest.approx(expect, abs=1e-9)


@pytest.mark.parametrize("name", list(GAMES))
def test_verbal_round_trip(name):
    g, rng = GAMES[name], np.random.default_rng(7)
    for _ in range(200):
        pi = np.round(rng.dirichlet([1, 1], size=2) * 20) / 20
        pi[:, 1] = 1 - pi[:, 0]
        text = verbalize_scheme(g, pi, rng)
        np.testing.assert_allclose(parse_scheme(g, text), pi, atol=1e-12, err_msg=text)


def test_parser_reads_free_wording_and_mixtures():
    text = ("When the defendant is guilty, I will always recommend conviction. If the defendant is "
            "innocent I recommend convict 3 out of 7 times, and acquit otherwise.")
    np.testing.assert_allclose(parse_scheme(CR, text), [[1, 0], [3 / 7, 4 / 7]], atol=1e-12)
    assert parse_scheme(CR, "I will persuade the judge.") is None
    rng = np.random.default_rng(0)
    a, b = truthful_scheme(CR), np.array([[1.0, 0.0], [1.0, 0.0]])
    w = np.array([4 / 7, 3 / 7])
    c = commitment_text(CR, [verbalize_scheme(CR, a, rng), verbalize_scheme(CR, b, rng)], w)
    np.testing.assert_allclose(parse_commitment(CR, c), w[0] * a + w[1] * b, atol=1e-7)
    # that mixture of truthful and "always convict" is the optimal scheme: dialogues give 0.6
    d = play_dialogues(CR, c, 20000, rng, LexiconReceiver())
    assert d["sender_utility"] == pytest.approx(0.6, abs=0.015)
    assert d["obedience_rate"] == 1.0


def test_psro_offline_reaches_lp_and_ablation_does_not():
    from reprozoo.methods.verbalized_bp.verbal import TemplateSender

    out = run_psro(CR, P, np.random.default_rng(0), TemplateSender(), lam=10.0)
    assert out["curve"][-1] == pytest.approx(0.6, abs=0.02)
    assert max_violation(CR, out["pi"]) <= 1e-6
    assert max(out["meta_values"][-1], out["curve"][-1]) <= 0.6 + 1e-6  # never above the LP
    off = run_psro(CR, P, np.random.default_rng(0), TemplateSender(), lam=0.0)
    assert off["curve"][-1] <= 0.1


def _ctx(tmp_path, variant="vbp_psro"):
    return RunContext(method="verbalized_bp", variant=variant, seed=0, scale="ci", params=dict(P),
                      data={}, outdir=tmp_path, shared_dir=tmp_path)


def test_llm_path_against_fake_server(tmp_path, monkeypatch, capsys):
    receiver = LexiconReceiver()

    def reply(body):
        if "signalling scheme: for each state" in body["messages"][0]["content"]:  # the sender prompt
            return ("If the defendant is guilty, I recommend convict always. "
                    "If the defendant is innocent, I recommend convict 3 times out of 7 and acquit otherwise.")
        return receiver.complete(body["messages"])  # the receiver prompt: answer as a Bayesian would

    with chat_server(reply=reply) as (url, requests):
        monkeypatch.setenv("REPROZOO_LLM_BASE_URL", url)
        monkeypatch.setenv("REPROZOO_LLM_MODEL", "fake-model")
        monkeypatch.setenv("REPROZOO_LLM_API_KEY", "sk-test-secret")
        ctx = _ctx(tmp_path)
        M.train(ctx)
    s = ctx.metrics.scalars
    assert s["llm_backend"] == 1.0
    assert len(requests) >= P["iterations"] * P["n_proposals"]
    assert all(r["body"]["model"] == "fake-model" for r in requests)
    assert requests[0]["headers"]["Authorization"] == "Bearer sk-test-secret"
    assert any("COMMITMENT:" in r["body"]["messages"][-1]["content"] for r in requests)  # receiver went too
    assert s["parse_failures_courtroom"] == 0
    assert s["u_courtroom"] == pytest.approx(0.6, abs=0.03)  # the model's scheme is the optimal one
    assert s["obedience_rate_courtroom"] == 1.0
    dumped = json.dumps(ctx.metrics.to_json()) + capsys.readouterr().out
    dumped += "".join(p.read_text() for p in tmp_path.glob("*.txt"))
    assert "sk-test-secret" not in dumped


def test_llm_garbage_is_counted_not_fatal(tmp_path, monkeypatch):
    with chat_server(reply=lambda body: "I would rather not say.") as (url, _):
        monkeypatch.setenv("REPROZOO_LLM_BASE_URL", url)
        monkeypatch.setenv("REPROZOO_LLM_MODEL", "fake-model")
        ctx = _ctx(tmp_path)
        M.train(ctx)
    s = ctx.metrics.scalars
    assert s["parse_failures_courtroom"] == P["iterations"] * P["n_proposals"]
    assert s["u_courtroom"] == 0.0  # stuck at the uninformative opening: the judge acquits


def test_revealed_draw_caps_at_best_grid_scheme():
    from reprozoo.methods.verbalized_bp.verbal import TemplateSender

    out = run_psro(CR, P, np.random.default_rng(1), TemplateSender(), lam=10.0, reveal_draw=True)
    # a single obedient scheme on the 5 % grid convicts an innocent at most 40 %: 0.3 + 0.7 * 0.4
    assert max(out["curve"]) <= 0.58 + 1e-9
    assert np.count_nonzero(out["sigma"]) == 1
