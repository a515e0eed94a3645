"""Generalised equilibrium finding: PSRO over verbalized sender schemes and receiver deviation rules.

Populations: sender schemes S (English texts, with the pi[s, a] the receiver reads from them) and
receiver deviation rules D (phi: recommendation -> action; the identity = obey). Each iteration
  1. meta-game  M[i, j] = L(pi_i, phi_j) = U_s(pi_i) - lam * D(pi_i, phi_j)  (solvers.py), solved
     as a zero-sum matrix game by LP -> sender mixture sigma, deviator mixture rho;
  2. commitment: the mixture is committed in words (verbal.commitment_text); the Bayesian receiver
     reads it back and best-responds -> the realized sender utility we record per iteration;
  3. receiver oracle (game solver): the deviation rule with the largest gain against the commitment;
  4. sender oracle (the language model, or the offline TemplateSender): n_proposals schemes written
     from a prompt with the current scheme and the solver's feedback, read back through the
     lexicon; the best one against rho joins S.
lam = 0 switches the verbalized obedience constraint off (ablation): the sender then optimises as if
the receiver always obeyed. Obfuscation: the receiver sees the committed mixture but not which
scheme was drawn; ``reveal_draw`` (ablation) tells it, so only single schemes can be committed.
"""
from __future__ import annotations

import numpy as np

from .games import BPGame
from .solvers import (TIE_TOL, all_deviation_rules, babbling_scheme, deviation_gain, lagrangian,
                      max_violation, realized_sender_utility, zero_sum_nash)
from .verbal import (commitment_text, parse_commitment, parse_scheme, read_action, receiver_prompt,
                     sender_prompt, verbalize_scheme, write_message)


def describe_rule(game: BPGame, phi: tuple[int, ...]) -> str:
    return "; ".join(f"when told to {game.actions[a]}, {game.actions[b]}" for a, b in enumerate(phi))


def run_psro(game: BPGame, p: dict, rng: np.random.Generator, sender, lam: float, progress=None,
             reveal_draw: bool = False) -> dict:
    """One PSRO run; ``reveal_draw`` (ablation of obfuscation) tells the receiver which scheme was drawn.

    With the draw revealed the receiver can deviate per scheme, so the meta-game decomposes: each
    scheme is worth min_j M[i, j] on its own, the sender commits to the best single one and a
    mixture of coarse verbal schemes can no longer pool its signals into a finer scheme.
    """
    grid = float(p["grid"])
    identity = tuple(range(len(game.actions)))
    start = verbalize_scheme(game, babbling_scheme(game), rng)  # an uninformative opening scheme
    texts, pis, rules = [start], [parse_scheme(game, start)], [identity]
    curve, meta_values, failures = [], [], 0
    rule_set = all_deviation_rules(len(game.actions))
    for it in range(int(p["iterations"]) + 1):
        m = np.array([[lagrangian(game, pi, phi, lam) for phi in rules] for pi in pis])
        if reveal_draw:
            worth = m.min(axis=1)
            sigma = np.eye(len(pis))[int(np.argmax(worth))]
            value, rho = float(worth.max()), np.eye(len(rules))[int(np.argmin(m[int(np.argmax(worth))]))]
        else:
            value, sigma, rho = zero_sum_nash(m)
        commit = commitment_text(game, texts, sigma)
        pi_c = parse_commitment(game, commit)
        curve.append(realized_sender_utility(game, pi_c))
        meta_values.append(value)
        if it == int(p["iterations"]):
            break
        gains = [deviation_gain(game, pi_c, phi) for phi in rule_set]
        best_rule = rule_set[int(np.argmax(gains))]
        if max(gains) > TIE_TOL and best_rule not in rules:
            rules_next = rules + [best_rule]
        else:
            rules_next = rules
        feedback = (f"meta-game value {value:.4f}; the {game.receiver} would gain {max_violation(game, pi_c):.4f} "
                    f"by disobeying; the solver's deviating {game.receiver}: "
                    + ", ".join(f"{r:.2f} x ({describe_rule(game, phi)})" for r, phi in zip(rho, rules)))
        best, best_score = None, -np.inf
        for _ in range(int(p["n_proposals"])):
            reply = sender.complete(sender_prompt(game, commit, feedback, pi_c, grid),
                                    temperature=float(p.get("temperature", 1.0)),
                                    seed=int(rng.integers(2**31)))
            pi = parse_scheme(game, reply)
            if pi is None:
                failures += 1
                continue
            if reveal_draw:  # the deviator answers this scheme alone
                score = min(lagrangian(game, pi, phi, lam) for phi in rules)
            else:
                score = sum(r * lagrangian(game, pi, phi, lam) for r, phi in zip(rho, rules))
            if score > best_score:
                best, best_score = (reply, pi), score
        if best is not None and not any(np.allclose(best[1], q, atol=1e-9) for q in pis):
            texts.append(best[0])
            pis.append(best[1])
        rules = rules_next
        if progress and it % 10 == 0:
            progress(f"{game.name} it {it}: realized U_s {curve[-1]:.4f}, meta value {value:.4f}, "
                     f"|S| = {len(pis)}, |D| = {len(rules)}")
    return {"texts": texts, "sigma": sigma, "commitment": commit, "pi": pi_c, "curve": curve,
            "meta_values": meta_values, "parse_failures": failures, "n_schemes": len(pis),
            "n_rules": len(rules)}


def play_dialogues(game: BPGame, commitment: str, n: int, rng: np.random.Generator, receiver) -> dict:
    """n episodes of the verbalized game: state ~ prior, message from the committed scheme, receiver acts.

    The sender executes the scheme its commitment states (parsed back, mediator-style); the
    receiver gets the commitment and the message as text and answers with an action word. Its
    answers are cached per distinct message (the receiver is deterministic at temperature 0).
    """
    pi = parse_commitment(game, commitment)
    if pi is None:
        raise ValueError(f"{game.name}: the committed scheme cannot be read back: {commitment[:200]}")
    states = rng.choice(len(game.states), size=n, p=game.mu0)
    u = rng.random(n)
    recs = (u[:, None] > np.cumsum(pi[states], axis=1)).sum(1).clip(0, len(game.actions) - 1)
    cache, calls = {}, 0
    actions = np.empty(n, int)
    for k in range(n):
        msg = write_message(game, int(recs[k]), rng)
        if msg not in cache:
            reply = receiver.complete(receiver_prompt(game, commitment, msg), temperature=0.0)
            calls += 1
            act = read_action(game, reply)
            cache[msg] = act if act is not None else int(np.argmax(game.mu0 @ game.ur))
        actions[k] = cache[msg]
    return {"sender_utility": float(game.us[states, actions].mean()),
            "receiver_utility": float(game.ur[states, actions].mean()),
            "obedience_rate": float((actions == recs).mean()), "receiver_calls": calls}
