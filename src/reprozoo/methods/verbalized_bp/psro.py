"""Generalised equilibrium finding: PSRO over verbalized sender schemes and receiver deviation rules.

Populations: sender schemes S (English texts, with the pi[s, a] the game solver reads from them) and
receiver deviation rules D (phi: recommendation -> action; the identity = obey). Each iteration
  1. meta-game  M[i, j] = U_i - lam * D(pi_i, phi_j), solved as a zero-sum matrix game by LP ->
     sender mixture sigma, deviator mixture rho. U_i is the sender's payoff of scheme i:
       payoff = "dialogue" (the paper's loop, Prompt-PSRO style): measured in verbal play, the scheme
                committed as text to the receiver agent over a fixed set of training dialogues
                (common random numbers: the same states, draws and receiver noise for every scheme);
       payoff = "model"    (the numeric-BP baseline): the solver's model of an exact, obedient
                Bayesian receiver, U_i = sum_s,a mu0 pi_i u_s (no dialogue is played);
     D is the game solver's exact obedience penalty of the scheme as written (solvers.py);
  2. commitment: the mixture is committed in words (verbal.commitment_text). The receiver reads a
     mixture as one pooled scheme, so the committed text is itself scored by the same payoff (and
     penalty against the deviation rules of D); if the best single scheme of S is worth more, that
     one is committed instead. Under payoff "model" this never happens (the pooled scheme's worth is
     the meta-game value, which no single row exceeds). The commitment's sender utility in verbal
     play on a separate validation set of dialogues is the curve we record per iteration;
  3. receiver oracle (game solver): the deviation rule with the largest gain against the commitment;
  4. sender oracle (the language model, or the offline TemplateSender): n_proposals schemes written
     from a prose prompt with the current scheme and the solver's feedback, read back through the
     lexicon; the best one against rho (by the same payoff) joins S.
Obfuscation: the receiver sees the committed mixture but not which scheme was drawn; ``reveal_draw``
(ablation, tested) tells it, so only single schemes can be committed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .games import BPGame
from .solvers import (TIE_TOL, all_deviation_rules, babbling_scheme, deviation_gain, max_violation,
                      zero_sum_nash)
from .verbal import (commitment_text, parse_commitment, parse_scheme, read_action, receiver_prompt,
                     sender_prompt, verbalize_scheme)

PAYOFFS = ("dialogue", "model")


@dataclass(frozen=True)
class Dialogues:
    """A fixed set of episodes (the same for every scheme and variant that plays it): the state, the
    uniform draw that picks the recommendation from the scheme, the message paraphrase and the
    receiver's standard-normal misreading draw z of each dialogue."""
    states: np.ndarray
    u: np.ndarray
    paraphrase: np.ndarray
    z: np.ndarray

    def __len__(self) -> int:
        return len(self.states)


def draw_dialogues(game: BPGame, n: int, rng: np.random.Generator) -> Dialogues:
    return Dialogues(states=rng.choice(len(game.states), size=n, p=game.mu0), u=rng.random(n),
                     paraphrase=rng.integers(0, 1 << 30, size=n), z=rng.standard_normal(n))


def play_dialogues(game: BPGame, commitment: str, dlg: Dialogues, receiver) -> dict:
    """The verbalized game on the episodes ``dlg``: message from the committed scheme, receiver acts.

    The sender executes the scheme its commitment states (parsed back, mediator-style) and writes a
    paraphrase of the recommendation that does not depend on the state (obfuscation). The receiver
    gets the commitment and the message as text. A receiver with ``act_many`` (the offline reader)
    answers all dialogues of one message at once with their noise draws; any other backend (an LLM)
    is asked once per distinct message at temperature 0. Returns per-dialogue arrays ``u_s``,
    ``u_r``, ``obey`` and their means."""
    pi = parse_commitment(game, commitment)
    if pi is None:
        raise ValueError(f"{game.name}: the committed scheme cannot be read back: {commitment[:200]}")
    recs = (dlg.u[:, None] > np.cumsum(pi[dlg.states], axis=1)).sum(1).clip(0, len(game.actions) - 1)
    actions = np.empty(len(dlg), int)
    calls = 0
    for a in np.unique(recs):
        options = game.messages[game.actions[a]]
        which = dlg.paraphrase % len(options)
        for k, msg in enumerate(options):
            mask = (recs == a) & (which == k)
            if not mask.any():
                continue
            if hasattr(receiver, "act_many"):
                actions[mask] = receiver.act_many(game, commitment, msg, dlg.z[mask])
            else:
                act = read_action(game, receiver.complete(receiver_prompt(game, commitment, msg), temperature=0.0))
                actions[mask] = act if act is not None else int(np.argmax(game.mu0 @ game.ur))
            calls += 1
    u_s, u_r = game.us[dlg.states, actions], game.ur[dlg.states, actions]
    obey = (actions == recs).astype(float)
    return {"u_s": u_s, "u_r": u_r, "obey": obey, "sender_utility": float(u_s.mean()),
            "receiver_utility": float(u_r.mean()), "obedience_rate": float(obey.mean()), "receiver_calls": calls}


def _key(pi: np.ndarray) -> tuple:
    return tuple(np.round(pi, 9).ravel())


def describe_rule(game: BPGame, phi: tuple[int, ...]) -> str:
    return "; ".join(f"when told to {game.actions[a]}, {game.actions[b]}" for a, b in enumerate(phi))


def run_psro(game: BPGame, p: dict, rng: np.random.Generator, sender, lam: float, receiver=None,
             train: Dialogues | None = None, val: Dialogues | None = None, payoff: str = "dialogue",
             progress=None, reveal_draw: bool = False) -> dict:
    """One PSRO run. ``payoff``: where the sender's term of the meta-game comes from (module doc);
    ``receiver``/``train``: the agent and episodes it is measured on ("dialogue"); ``val``: the
    episodes of the recorded curve (none: the curve is the solver's model value)."""
    if payoff not in PAYOFFS:
        raise ValueError(f"payoff must be one of {PAYOFFS}")
    if payoff == "dialogue" and (receiver is None or train is None):
        raise ValueError("payoff 'dialogue' needs a receiver and training dialogues")
    grid = float(p["grid"])
    identity = tuple(range(len(game.actions)))

    def utility(text: str, pi: np.ndarray) -> float:
        if payoff == "dialogue":
            return play_dialogues(game, text, train, receiver)["sender_utility"]
        return float((game.mu0[:, None] * pi * game.us).sum())

    def curve_value(text: str, pi: np.ndarray) -> float:
        if val is not None and receiver is not None:
            return play_dialogues(game, text, val, receiver)["sender_utility"]
        return float((game.mu0[:, None] * pi * game.us).sum())

    start = verbalize_scheme(game, babbling_scheme(game), rng)  # an uninformative opening scheme
    texts, pis, rules = [start], [parse_scheme(game, start)], [identity]
    utils = [utility(start, pis[0])]
    seen = {_key(pis[0])}
    curve, meta_values, failures = [], [], 0
    rule_set = all_deviation_rules(len(game.actions))
    for it in range(int(p["iterations"]) + 1):
        m = np.array([[u - lam * deviation_gain(game, pi, phi) for phi in rules] for u, pi in zip(utils, pis)])
        if reveal_draw:
            worth = m.min(axis=1)
            sigma = np.eye(len(pis))[int(np.argmax(worth))]
            value, rho = float(worth.max()), np.eye(len(rules))[int(np.argmin(m[int(np.argmax(worth))]))]
        else:
            value, sigma, rho = zero_sum_nash(m)
        commit = commitment_text(game, texts, sigma)
        pi_c = parse_commitment(game, commit)
        if np.count_nonzero(sigma > 1e-9) > 1:
            # the receiver reads the mixture as one pooled scheme, so the sender checks the committed
            # text itself by the same payoff and keeps the best single scheme if that is worth more
            # (never under payoff "model": there the mixture's worth is the meta-game value)
            worth = m.min(axis=1)
            w_c = min(utility(commit, pi_c) - lam * deviation_gain(game, pi_c, phi) for phi in rules)
            if w_c < worth.max() - 1e-9:
                sigma = np.eye(len(pis))[int(np.argmax(worth))]
                commit = texts[int(np.argmax(worth))]
                pi_c = parse_commitment(game, commit)
        curve.append(curve_value(commit, pi_c))
        meta_values.append(value)
        if it == int(p["iterations"]):
            break
        gains = [deviation_gain(game, pi_c, phi) for phi in rule_set]
        best_rule = rule_set[int(np.argmax(gains))]
        rules_next = rules + [best_rule] if max(gains) > TIE_TOL and best_rule not in rules else rules
        feedback = (f"meta-game value {value:.4f}; the {game.receiver} would gain {max_violation(game, pi_c):.4f} "
                    f"by disobeying; the solver's deviating {game.receiver}: "
                    + ", ".join(f"{r:.2f} x ({describe_rule(game, phi)})" for r, phi in zip(rho, rules)))
        best, best_score = None, -np.inf
        for _ in range(int(p["n_proposals"])):
            reply = sender.complete(sender_prompt(game, commit, feedback, grid),
                                    temperature=float(p.get("temperature", 1.0)),
                                    seed=int(rng.integers(2**31)))
            pi = parse_scheme(game, reply)
            if pi is None:
                failures += 1
                continue
            if _key(pi) in seen:
                continue  # already in the population
            u = utility(reply, pi)
            pen = [u - lam * deviation_gain(game, pi, phi) for phi in rules]
            score = min(pen) if reveal_draw else float(np.dot(rho, pen))
            if score > best_score:
                best, best_score = (reply, pi, u), score
        if best is not None:
            seen.add(_key(best[1]))
            texts.append(best[0])
            pis.append(best[1])
            utils.append(best[2])
        rules = rules_next
        if progress and it % 10 == 0:
            progress(f"{game.name} it {it}: curve {curve[-1]:.4f}, meta value {value:.4f}, "
                     f"|S| = {len(pis)}, |D| = {len(rules)}")
    return {"texts": texts, "sigma": sigma, "commitment": commit, "pi": pi_c, "curve": curve,
            "meta_values": meta_values, "parse_failures": failures, "n_schemes": len(pis),
            "n_rules": len(rules), "n_support": int(np.count_nonzero(sigma > 1e-9))}
