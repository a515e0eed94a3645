"""Verbalized Bayesian persuasion: LP and concavification against closed forms, obedience, the
verbal round trip (scheme -> English -> scheme), the noisy reader against its analytic model, the
channel oracle, the mediator-augmented meta-game, the PSRO loop (what the theory guarantees is
tested here, not claimed), and the optional LLM path against a fake OpenAI-compatible server."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback import chat_server  # noqa: E402

from reprozoo.methods.verbalized_bp import method as M  # noqa: E402
from reprozoo.methods.verbalized_bp.games import GAMES, BPGame  # noqa: E402
from reprozoo.methods.verbalized_bp.psro import draw_dialogues, play_dialogues, run_psro  # noqa: E402
from reprozoo.methods.verbalized_bp.solvers import (all_deviation_rules, babbling_scheme,  # noqa: E402
                                                    channel_follow, channel_oracle, channel_value,
                                                    concavify_binary, lagrangian, lp_optimum,
                                                    max_violation, realized_sender_utility,
                                                    truthful_scheme, zero_sum_nash)
from reprozoo.methods.verbalized_bp.verbal import (LexiconReceiver, NoisyReader, TemplateSender,  # noqa: E402
                                                   commitment_text, game_of, parse_commitment,
                                                   parse_scheme, receiver_prompt, sender_prompt,
                                                   verbalize_scheme)
from reprozoo.runtime import RunContext  # noqa: E402

CR = GAMES["courtroom"]
P = {"games": ["courtroom"], "channels": {"low": 0.1, "mid": 0.2, "high": 0.3}, "iterations": 12,
     "n_proposals": 4, "p_fresh": 0.3, "grid": 0.05, "lam": 10.0, "temperature": 1.0, "n_train": 400,
     "n_val": 200, "n_test": 400, "receiver": "reader"}


# --- exact references ------------------------------------------------------------------------

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


# --- the verbal layer ------------------------------------------------------------------------

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
    # that mixture of truthful and "always convict" is the optimal scheme: an exact reader gives 0.6
    d = play_dialogues(CR, c, draw_dialogues(CR, 20000, rng), LexiconReceiver())
    assert d["sender_utility"] == pytest.approx(0.6, abs=0.015)
    assert d["obedience_rate"] == 1.0


def test_prompts_are_prose_and_name_the_game():
    text = verbalize_scheme(CR, truthful_scheme(CR), np.random.default_rng(0))
    for msgs, role in ((sender_prompt(CR, text, "feedback", 0.05), "sender"),
                       (receiver_prompt(CR, text, "I ask the court to convict."), "receiver")):
        assert "<<task>>" not in json.dumps(msgs) and "{" not in msgs[-1]["content"]
        assert game_of(msgs) == (CR, role)


def test_template_sender_reads_the_scheme_from_the_text():
    """With p_fresh = 0 every proposal is a one-step edit of the scheme the prompt states in words."""
    sender = TemplateSender(p_fresh=0.0)
    current = np.array([[0.6, 0.4], [0.2, 0.8]])
    text = verbalize_scheme(CR, current, np.random.default_rng(1))
    for seed in range(40):
        pi = parse_scheme(CR, sender.complete(sender_prompt(CR, text, "none", 0.05), seed=seed))
        diff = np.abs(pi - current)
        assert (diff.sum(axis=1) > 1e-9).sum() <= 1  # one state's row moved
        assert diff.max() <= 0.4 + 1e-9 and np.allclose(pi.sum(axis=1), 1)
    # and a different scheme in the words gives edits around that one
    other = verbalize_scheme(CR, np.array([[1.0, 0.0], [1.0, 0.0]]), np.random.default_rng(2))
    pis = [parse_scheme(CR, sender.complete(sender_prompt(CR, other, "none", 0.05), seed=s)) for s in range(20)]
    assert all(max(pi[0, 0], pi[1, 0]) == 1.0 for pi in pis)


# --- the noisy reader against its analytic model ----------------------------------------------------

def test_noise_free_reader_is_the_exact_bayesian():
    rng = np.random.default_rng(3)
    dlg = draw_dialogues(CR, 5000, rng)
    always = np.array([[1.0, 0.0], [1.0, 0.0]])
    texts = [verbalize_scheme(CR, truthful_scheme(CR), rng), verbalize_scheme(CR, np.array([[1.0, 0.0], [0.6, 0.4]]), rng),
             commitment_text(CR, [verbalize_scheme(CR, truthful_scheme(CR), rng), verbalize_scheme(CR, always, rng)],
                             np.array([4 / 7, 3 / 7]))]
    for text, expect in zip(texts, (0.3, 0.0, 0.6)):
        assert realized_sender_utility(CR, parse_commitment(CR, text)) == pytest.approx(expect, abs=1e-6)
        got = play_dialogues(CR, text, dlg, NoisyReader(0.0))["sender_utility"]
        assert got == pytest.approx(expect, abs=4 * np.sqrt(0.25 / len(dlg)))


@pytest.mark.parametrize("noise", [0.1, 0.3, 1.0])
def test_noisy_reader_follows_with_the_probit_rate(noise):
    """P(convict | posterior q) = Phi((logit q - logit t) / noise), by Monte Carlo over noise draws."""
    from scipy.special import ndtr

    reader, rng = NoisyReader(noise), np.random.default_rng(4)
    for x in (0.25, 3 / 7, 0.6):
        q = 0.3 / (0.3 + 0.7 * x)
        z = rng.standard_normal(40000)
        acts = reader.decide(CR, np.array([q, 1 - q]), 0, z)
        expect = ndtr(np.log(q / (1 - q)) / noise)
        assert (acts == 0).mean() == pytest.approx(expect, abs=4 * np.sqrt(expect * (1 - expect) / len(z)) + 1e-9)
        assert channel_follow(CR, np.array([q, 1 - q]), 0, noise)[0] == pytest.approx(expect, abs=1e-12)
    # a certain posterior is read without error at any noise
    assert set(reader.decide(CR, np.array([1.0, 0.0]), 0, rng.standard_normal(1000))) == {0}
    assert set(reader.decide(CR, np.array([0.0, 1.0]), 1, rng.standard_normal(1000))) == {1}


def test_text_path_equals_fast_path():
    reader = NoisyReader(0.3)
    text = verbalize_scheme(CR, np.array([[1.0, 0.0], [0.35, 0.65]]), np.random.default_rng(5))
    msg = "I ask the court to convict."
    for seed in range(30):
        z = np.random.default_rng(seed).standard_normal()
        fast = reader.act_many(CR, text, msg, np.array([z]))[0]
        assert reader.complete(receiver_prompt(CR, text, msg), seed=seed) == CR.actions[fast]


@pytest.mark.parametrize("name", list(GAMES))
def test_channel_value_matches_dialogues(name):
    g, rng = GAMES[name], np.random.default_rng(6)
    dlg = draw_dialogues(g, 40000, rng)
    for noise in (0.1, 0.3):
        for x1 in (0.2, 0.45):
            pi = np.array([[1.0, 0.0], [x1, 1 - x1]])
            u, obey = channel_value(g, pi, noise)
            d = play_dialogues(g, verbalize_scheme(g, pi, rng), dlg, NoisyReader(noise))
            tol = 4 * np.sqrt(0.25 / len(dlg))
            assert d["sender_utility"] == pytest.approx(u, abs=tol)
            assert d["obedience_rate"] == pytest.approx(obey, abs=tol)


@pytest.mark.parametrize("name", list(GAMES))
def test_channel_oracle_is_the_brute_force_optimum(name):
    g = GAMES[name]
    qs = np.round(np.arange(0, 1.0001, 0.05), 10)
    for noise in (0.1, 0.3):
        best = max(channel_value(g, np.array([[a, 1 - a], [b, 1 - b]]), noise)[0] for a in qs for b in qs
                   if max_violation(g, np.array([[a, 1 - a], [b, 1 - b]])) <= 1e-9)
        value, pi = channel_oracle(g, noise, 0.05)
        assert value == pytest.approx(best, abs=1e-12)
        assert max_violation(g, pi) <= 1e-9
        assert channel_value(g, pi, noise)[0] == pytest.approx(value, abs=1e-12)
    # without noise the grid oracle is the grid theory of the page: 0.58, 2/3, 0.8
    assert channel_oracle(g, 0.0, 0.05)[0] == pytest.approx({"courtroom": 0.58, "recommendation_letter": 2 / 3,
                                                             "law_enforcement": 0.8}[name], abs=1e-9)


@pytest.mark.parametrize("name", list(GAMES))
def test_theory_of_the_noisy_channel(name):
    """What the page states and the claims must not re-test: the threshold scheme (the exact BP
    optimum) persuades half of the time, the oracle falls strictly with noise and stays below the
    LP, truthful revelation is read without error, and the 5 % grid costs the oracle at most 0.006."""
    g = GAMES[name]
    lp, pi_lp = lp_optimum(g)
    stars = []
    for noise in (0.1, 0.2, 0.3):
        assert channel_value(g, pi_lp, noise)[0] == pytest.approx(lp / 2, abs=1e-6)
        assert channel_value(g, truthful_scheme(g), noise)[0] == pytest.approx(g.prior[0], abs=1e-12)
        star = channel_oracle(g, noise, 0.05)[0]
        fine = max(channel_value(g, np.array([[1.0, 0.0], [x, 1 - x]]), noise)[0]
                   for x in np.linspace(0, 1, 2001) if max_violation(g, np.array([[1.0, 0.0], [x, 1 - x]])) <= 1e-9)
        assert 0 <= fine - star <= 0.006
        stars.append(star)
    assert stars[0] < lp - 0.02 and np.all(np.diff(stars) < -0.02)


@pytest.mark.parametrize("name", list(GAMES))
def test_claims_can_hold_and_their_controls_cannot(name):
    """Theory of the receiver behind each claim's threshold and control: the oracle (what the verbal
    loop should reach) is obeyed in at least 94 % of dialogues and beats truthful revelation by more
    than 0.15, while the threshold scheme (where the numeric-BP control converges) is more than 0.03
    short of the oracle and obeyed in under 90 % of dialogues at every noise level, so
    tracks_receiver_optimum and obedience_at_equilibrium must fail on the control; and the spec
    passes the platform's tie lint."""
    from reprozoo import registry, spec_lint

    g = GAMES[name]
    lp, pi_lp = lp_optimum(g)
    for noise in (0.1, 0.2, 0.3):
        star, star_pi = channel_oracle(g, noise, 0.05)
        u_star, obey_star = channel_value(g, star_pi, noise)
        assert u_star == pytest.approx(star, abs=1e-12)
        assert obey_star >= 0.94 and max_violation(g, star_pi) <= 1e-9
        assert star - channel_value(g, truthful_scheme(g), noise)[0] > 0.15
        u_thr, obey_thr = channel_value(g, pi_lp, noise)
        assert star - u_thr > 0.03 and obey_thr < 0.9
    spec_lint.check(registry.get("verbalized_bp"))


# --- the loop ------------------------------------------------------------------------------------

def _dlg(game, n, offset):
    return draw_dialogues(game, n, np.random.default_rng(offset))


def test_exact_reader_loop_reaches_lp_and_no_obedience_babbles():
    """The old claims, now tests: with an exact reader the numeric-BP loop reproduces the LP optimum
    (obfuscated mixtures pool 5 %-grid schemes into 3/7), the verbal-play loop the best single grid
    scheme (0.58: a pooled mixture is worth what the receiver makes of the pooled scheme, and its
    non-obedient members are worth 0 alone, so it never pools), and without the obedience penalty the
    model loop commits a scheme the receiver ignores (sender utility about 0)."""
    reader, p = NoisyReader(0.0), dict(P, iterations=30, n_proposals=6)
    for payoff, lo, hi in (("dialogue", 0.58 - 0.02, 0.58 + 1e-9), ("model", 0.6 - 0.02, 0.6 + 1e-6)):
        out = run_psro(CR, p, np.random.default_rng(0), TemplateSender(), 10.0, reader,
                       _dlg(CR, 2000, 1), _dlg(CR, 500, 2), payoff=payoff)
        assert lo <= realized_sender_utility(CR, out["pi"]) <= hi
        assert max_violation(CR, out["pi"]) <= 1e-6
    assert out["n_support"] >= 2 and out["meta_values"][-1] <= 0.6 + 1e-6
    off = run_psro(CR, P, np.random.default_rng(0), TemplateSender(), 0.0, reader, payoff="model")
    assert realized_sender_utility(CR, off["pi"]) <= 0.1


def test_revealed_draw_caps_at_best_grid_scheme():
    out = run_psro(CR, P, np.random.default_rng(1), TemplateSender(), 10.0, payoff="model", reveal_draw=True)
    # a single obedient scheme on the 5 % grid convicts an innocent at most 40 %: 0.3 + 0.7 * 0.4
    assert max(out["curve"]) <= 0.58 + 1e-9
    assert np.count_nonzero(out["sigma"]) == 1


@pytest.mark.parametrize("noise", [0.1, 0.3])
def test_dialogue_loop_recovers_the_receiver_optimum_and_model_loop_does_not(noise):
    """Planted signal: the loop that measures its payoff in verbal play finds the oracle's scheme of
    a receiver it never sees the model of; the numeric-BP loop stays at the threshold (half of LP)."""
    reader, p = NoisyReader(noise), dict(P, iterations=30, n_proposals=6)
    star = channel_oracle(CR, noise, 0.05)[0]
    out = run_psro(CR, p, np.random.default_rng(2), TemplateSender(), 10.0, reader,
                   _dlg(CR, 3000, 3), _dlg(CR, 500, 4), payoff="dialogue")
    assert channel_value(CR, out["pi"], noise)[0] >= star - 0.02
    assert max_violation(CR, out["pi"]) <= 1e-9
    model = run_psro(CR, p, np.random.default_rng(2), TemplateSender(), 10.0, reader,
                     _dlg(CR, 3000, 3), _dlg(CR, 500, 4), payoff="model")
    assert channel_value(CR, model["pi"], noise)[0] == pytest.approx(0.3, abs=0.01)
    assert model["n_support"] >= 2  # the model loop pools grid schemes into the exact threshold


def test_mixture_check_keeps_the_better_commitment():
    """A pooled mixture worth less in verbal play than its best member is not committed."""
    reader = NoisyReader(0.3)
    out = run_psro(GAMES["law_enforcement"], dict(P, iterations=16), np.random.default_rng(0), TemplateSender(),
                   10.0, reader, _dlg(GAMES["law_enforcement"], 400, 5), _dlg(GAMES["law_enforcement"], 200, 6))
    star = channel_oracle(GAMES["law_enforcement"], 0.3, 0.05)[0]
    assert channel_value(GAMES["law_enforcement"], out["pi"], 0.3)[0] >= star - 0.05


# --- the method's cell -----------------------------------------------------------------------

def _ctx(tmp_path, variant="vbp_psro", params=None):
    return RunContext(method="verbalized_bp", variant=variant, seed=0, scale="ci", params=dict(params or P),
                      data={}, outdir=tmp_path / variant, shared_dir=tmp_path)


def test_cells_share_their_test_dialogues(tmp_path):
    p = dict(P, iterations=4, n_proposals=2)
    cells = {}
    for v in ("vbp_psro", "vbp_exact_model", "truthful"):
        (tmp_path / v).mkdir()
        ctx = _ctx(tmp_path, v, p)
        M.train(ctx)
        cells[v] = ctx.metrics
    for ch in P["channels"]:
        k = f"courtroom_{ch}"
        lens = {len(c.unit_values[f"u_{k}"]) for c in cells.values()}
        assert lens == {P["n_test"]}
        # the oracle's dialogues are the same draws in every cell (common random numbers)
        assert cells["vbp_psro"].unit_values[f"ustar_{k}"] == cells["truthful"].unit_values[f"ustar_{k}"]
        assert cells["truthful"].unit_values[f"u_{k}"] == cells["truthful"].unit_values["u_courtroom_low"]
    s = cells["truthful"].scalars
    assert s["lp_courtroom"] == pytest.approx(0.6) and s["u_channel_exact_courtroom_high"] == pytest.approx(0.3)
    assert "val_utility_courtroom_low" in cells["vbp_exact_model"].curves


def test_llm_sender_against_fake_server(tmp_path, monkeypatch, capsys):
    def reply(body):
        assert "signalling scheme: for each state" in body["messages"][0]["content"]  # sender prompts only
        return ("If the defendant is guilty, I recommend convict always. "
                "If the defendant is innocent, I recommend convict 5 times out of 20 and acquit otherwise.")

    with chat_server(reply=reply) as (url, requests):
        monkeypatch.setenv("REPROZOO_LLM_BASE_URL", url)
        monkeypatch.setenv("REPROZOO_LLM_MODEL", "fake-model")
        monkeypatch.setenv("REPROZOO_LLM_API_KEY", "sk-test-secret")
        (tmp_path / "vbp_psro").mkdir()
        ctx = _ctx(tmp_path)
        M.train(ctx)
    s = ctx.metrics.scalars
    assert s["llm_backend"] == 1.0
    assert len(requests) >= P["iterations"] * P["n_proposals"]
    assert all(r["body"]["model"] == "fake-model" for r in requests)
    assert requests[0]["headers"]["Authorization"] == "Bearer sk-test-secret"
    assert s["parse_failures_courtroom_low"] == 0
    # the model's one scheme (25 %) is committed and read by the noisy reader
    assert s["u_channel_exact_courtroom_high"] == pytest.approx(channel_value(CR, np.array([[1, 0], [0.25, 0.75]]), 0.3)[0])
    dumped = json.dumps(ctx.metrics.to_json()) + capsys.readouterr().out
    dumped += "".join(p.read_text() for p in (tmp_path / "vbp_psro").glob("*.txt"))
    assert "sk-test-secret" not in dumped


def test_llm_receiver_is_asked_per_message(tmp_path, monkeypatch):
    reader = NoisyReader(0.0)

    def reply(body):
        if "signalling scheme: for each state" in body["messages"][0]["content"]:
            return "I would rather not say."
        return reader.complete(body["messages"])  # answer as an exact Bayesian would

    with chat_server(reply=reply) as (url, requests):
        monkeypatch.setenv("REPROZOO_LLM_BASE_URL", url)
        monkeypatch.setenv("REPROZOO_LLM_MODEL", "fake-model")
        (tmp_path / "truthful").mkdir()
        ctx = _ctx(tmp_path, "truthful", dict(P, receiver="llm"))
        M.train(ctx)
    assert any("COMMITMENT:" in r["body"]["messages"][-1]["content"] for r in requests)
    assert ctx.metrics.scalars["obedience_rate_courtroom_low"] == 1.0


def test_llm_garbage_is_counted_not_fatal(tmp_path, monkeypatch):
    with chat_server(reply=lambda body: "I would rather not say.") as (url, _):
        monkeypatch.setenv("REPROZOO_LLM_BASE_URL", url)
        monkeypatch.setenv("REPROZOO_LLM_MODEL", "fake-model")
        (tmp_path / "vbp_psro").mkdir()
        ctx = _ctx(tmp_path)
        M.train(ctx)
    s = ctx.metrics.scalars
    assert s["parse_failures_courtroom_low"] == P["iterations"] * P["n_proposals"]
    assert s["u_courtroom_low"] == 0.0  # stuck at the uninformative opening: the judge acquits
