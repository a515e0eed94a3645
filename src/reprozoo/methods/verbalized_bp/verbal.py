"""The verbalized game: schemes, commitments and messages as English text, and the offline agents.

Every agent implements the ``Backend`` protocol of ``reprozoo.blocks.llm_backend`` (chat messages in,
one string out), so an OpenAI-compatible model can replace either through ``backend_from_env``
without the loop knowing. No agent reads a machine-readable block: the prompts are prose, and the
offline agents find their game from the roles the prompt names and read schemes as text.

  TemplateSender   the offline sender "LLM": reads the current committed scheme from the prompt's
                   text through the lexicon and writes a new signalling scheme in English, either a
                   local edit of it or a fresh random draw, at the verbal resolution the prompt asks
                   for ("multiples of 5%"), with probabilities paraphrased ("always", "in 35% of
                   cases", "7 times out of 20").
  NoisyReader      the offline receiver, a bounded-rational interpreter of the text: it reads the
                   committed scheme and one message through the lexicon, forms the posterior of the
                   recommendation as Bayes' rule on the scheme *as read*, and then misjudges it: its
                   perceived log-odds of the first state are the true log-odds plus ``noise * z``,
                   z ~ N(0, 1) drawn afresh in every dialogue (the seed of the call). It takes the
                   action that is best at the perceived belief (ties: obey). ``noise = 0`` is the
                   exact Bayesian reader (``LexiconReceiver``), for which the words add nothing
                   beyond the numbers they state; ``noise > 0`` is a receiver that can misread, so a
                   scheme whose posterior sits exactly at the receiver's threshold (the BP optimum)
                   persuades only half of the time and the sender has to leave a margin.

Commitment assumption, verbalized: the receiver is shown the scheme text before the message.
Obedience, verbalized: messages are recommendations; a rational receiver follows one only if the
posterior it induces makes it a best response. Information obfuscation: a message carries only
its recommendation, in a paraphrase drawn independently of the state, and a PSRO mixture is
committed as "one of these schemes, drawn at random, not telling which", so the receiver cannot
recover the state or the drawn scheme from the wording.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from .games import GAMES, BPGame
from .solvers import TIE_TOL, receiver_best_action

ACTION_STEMS = {"hire": r"\bhir(?:e|es|ed|ing)\b"}  # default: r"\b<verb>\w*"


def action_pattern(action: str) -> re.Pattern:
    return re.compile(ACTION_STEMS.get(action, rf"\b{action}\w*"), re.I)


# --- probabilities <-> words -------------------------------------------------------------------

_WORDS = [(r"\balways\b|\bin every case\b|\bin all cases\b", 1.0),
          (r"\bnever\b|\bin no case\b", 0.0),
          (r"\bthree quarters\b", 0.75), (r"\ba quarter\b|\bone quarter\b", 0.25),
          (r"\bhalf (?:of )?the time\b|\bhalf of (?:the )?cases\b", 0.5)]
_REMAINDER = re.compile(r"\botherwise\b|\bremaining cases\b|\ball other cases\b|\bthe rest\b", re.I)


def phrase_probability(p: float, rng: np.random.Generator) -> str:
    """One paraphrase of probability p (p on a 5 % grid)."""
    pct = int(round(100 * p))
    options = [f"in {pct}% of cases", f"{pct // 5} times out of 20", f"with probability {p:.2f}"]
    if pct == 100:
        options += ["always", "in every case"]
    elif pct == 0:
        options += ["never", "in no case"]
    elif pct == 50:
        options += ["half of the time"]
    elif pct == 25:
        options += ["in a quarter of cases"]
    elif pct == 75:
        options += ["in three quarters of cases"]
    return options[int(rng.integers(len(options)))]


def read_probability(text: str) -> float | None:
    """The probability a clause states, or None (lexicon: words, percentages, k out of n, decimals)."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*(?:%|percent)", text, re.I)
    if m:
        return float(m.group(1)) / 100.0
    m = re.search(r"(\d+)\s*(?:times\s+)?(?:out of|in)\s+(?:every\s+)?(\d+)\b", text, re.I)
    if m and int(m.group(2)) > 0:
        return int(m.group(1)) / int(m.group(2))
    m = re.search(r"probability\s*(?:of\s*)?(\d*\.\d+|[01])\b", text, re.I)
    if m:
        return float(m.group(1))
    for pattern, value in _WORDS:
        if re.search(pattern, text, re.I):
            return value
    return None


# --- schemes <-> text ----------------------------------------------------------------------------

def verbalize_scheme(game: BPGame, pi: np.ndarray, rng: np.random.Generator) -> str:
    """One English sentence per state: how often the sender recommends each action there."""
    lead = ("If", "When", "Whenever")
    out = []
    for s, phrase in enumerate(game.state_phrases):
        parts = [f"{game.actions[a]} {phrase_probability(pi[s, a], rng)}" for a in range(len(game.actions))]
        if rng.random() < 0.5 and len(parts) == 2:  # "... and <other action> otherwise"
            parts[1] = f"{game.actions[1]} otherwise"
        out.append(f"{lead[int(rng.integers(3))]} {phrase}, I recommend " + " and ".join(parts) + ".")
    return " ".join(out)


def _sentences(text: str) -> list[str]:
    return [t for t in re.split(r"\.(?=\s|$)|[;\n]", text) if t.strip()]


def _state_of(game: BPGame, sentence: str) -> int | None:
    hits = [s for s, sid in enumerate(game.states) if re.search(rf"\b{sid}\b", sentence, re.I)]
    return hits[0] if len(hits) == 1 else None


def parse_scheme(game: BPGame, text: str) -> np.ndarray | None:
    """Scheme pi[s, a] a text states, or None if some state or probability cannot be read."""
    n_s, n_a = len(game.states), len(game.actions)
    pi = np.full((n_s, n_a), np.nan)
    pats = [action_pattern(a) for a in game.actions]
    for sentence in _sentences(text):
        s = _state_of(game, sentence)
        if s is None:
            continue
        rest = None
        for clause in re.split(r",|\band\b|\bbut\b", sentence):
            acts = [a for a in range(n_a) if pats[a].search(clause)]
            if len(acts) != 1:
                continue
            if _REMAINDER.search(clause):
                rest = acts[0]
                continue
            p = read_probability(clause)
            if p is not None:
                pi[s, acts[0]] = p
        if rest is not None:
            pi[s, rest] = 1.0 - np.nansum(np.where(np.arange(n_a) == rest, 0.0, pi[s]))
    for s in range(n_s):  # a row with one unknown entry is completed to sum to one
        if np.isnan(pi[s]).sum() == 1:
            pi[s, np.isnan(pi[s])] = 1.0 - np.nansum(pi[s])
    if np.isnan(pi).any() or (pi < -1e-9).any() or np.abs(pi.sum(1) - 1).max() > 0.02:
        return None
    pi = np.clip(pi, 0, None)
    return pi / pi.sum(1, keepdims=True)


def commitment_text(game: BPGame, texts: Sequence[str], weights: np.ndarray) -> str:
    """A PSRO mixture committed in words: the schemes and the odds of each, the draw kept secret."""
    keep = [(t, w) for t, w in zip(texts, weights) if w > 1e-9]
    if len(keep) == 1:
        return keep[0][0]
    odds = ", ".join(f"scheme {k + 1} with probability {w:.8f}" for k, (_, w) in enumerate(keep))
    body = " ".join(f"Scheme {k + 1}: {t}" for k, (t, _) in enumerate(keep))
    return (f"Before each case I draw one of {len(keep)} schemes at random ({odds}) and I do not "
            f"say which one I drew. {body}")


_PARSED: dict = {}


def parse_commitment(game: BPGame, text: str) -> np.ndarray | None:
    """The aggregate scheme sum_k w_k pi_k a (possibly mixed) commitment states (memoised per text:
    the loop reads the same commitment in every dialogue)."""
    key = (game.name, game.states, game.actions, text)
    if key not in _PARSED:
        if len(_PARSED) > 50_000:
            _PARSED.clear()
        _PARSED[key] = _parse_commitment(game, text)
    out = _PARSED[key]
    return None if out is None else out.copy()


def _parse_commitment(game: BPGame, text: str) -> np.ndarray | None:
    odds = re.findall(r"scheme (\d+) with probability (\d*\.?\d+)", text, re.I)
    if not odds:
        return parse_scheme(game, text)
    pieces = re.split(r"\bScheme (\d+):", text)
    schemes = {int(pieces[i]): pieces[i + 1] for i in range(1, len(pieces) - 1, 2)}
    total = np.zeros((len(game.states), len(game.actions)))
    for k, w in odds:
        pi = parse_scheme(game, schemes.get(int(k), ""))
        if pi is None:
            return None
        total += float(w) * pi
    return total / max(sum(float(w) for _, w in odds), 1e-12)


# --- messages ---------------------------------------------------------------------------------

def write_message(game: BPGame, action: int, rng: np.random.Generator) -> str:
    """The sender's message for a recommendation: a paraphrase drawn independently of the state."""
    options = game.messages[game.actions[action]]
    return options[int(rng.integers(len(options)))]


def classify_message(game: BPGame, text: str) -> int | None:
    """Which recommendation a message carries (the action whose stems occur most), None if unclear."""
    counts = [len(action_pattern(a).findall(text)) for a in game.actions]
    best = max(counts)
    return counts.index(best) if best > 0 and counts.count(best) == 1 else None


# --- prompts and the offline agents ----------------------------------------------------------------

GRID_RE = re.compile(r"multiples of (\d+(?:\.\d+)?)\s*%", re.I)


def game_of(messages: Sequence[dict]) -> tuple[BPGame, str]:
    """The game and role a prompt is about, from the role its system message names ("You are the judge")."""
    system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
    for game in GAMES.values():
        for role, who in (("sender", game.sender), ("receiver", game.receiver)):
            if re.search(rf"\bYou are the {re.escape(who)}\b", system):
                return game, role
    raise ValueError("the prompt names no known game role ('You are the <sender/receiver>')")


def _between(text: str, start: str, end: str | None) -> str:
    body = text.split(start, 1)[1]
    return body.split(end, 1)[0] if end else body


def _states_line(game: BPGame) -> str:
    return "; ".join(f"{p} (prior probability {q:.3f})" for p, q in zip(game.state_phrases, game.prior))


def sender_prompt(game: BPGame, current_text: str, feedback: str, grid: float) -> list[dict]:
    sys = (f"You are the {game.sender} in a Bayesian persuasion game. Before the case you commit to a "
           f"signalling scheme: for each state, how often you recommend each action to the {game.receiver}. "
           f"The {game.receiver} knows your scheme and follows a recommendation only if it is in their own "
           f"interest given the scheme (obedience); they may misjudge close calls. You want the "
           f"{game.receiver} to {game.actions[0]} as often as possible. Answer with the scheme only, one "
           f"sentence per state, in the form 'If <state>, I recommend {game.actions[0]} in X% of cases and "
           f"{game.actions[1]} in Y% of cases.', with probabilities that are multiples of {100 * grid:g}%.")
    states = _states_line(game)
    user = (f"States: {states}.\nThe {game.receiver}'s payoffs [state][action] for actions "
            f"{list(game.actions)}: {game.u_receiver}.\nCurrent scheme: {current_text}\n"
            f"Feedback from the equilibrium solver: {feedback}\nPropose a better scheme.")
    return [{"role": "system", "content": sys}, {"role": "user", "content": user}]


def receiver_prompt(game: BPGame, commitment: str, message: str) -> list[dict]:
    sys = (f"You are the {game.receiver} in a Bayesian persuasion game. The {game.sender} has committed to "
           f"the signalling scheme below and then sent you one message. Use Bayes' rule with the prior and "
           f"the scheme, then choose the action with the highest expected payoff for you. Answer with one "
           f"word: one of {list(game.actions)}.")
    states = _states_line(game)
    user = (f"States: {states}.\nYour payoffs [state][action] for actions {list(game.actions)}: "
            f"{game.u_receiver}.\nCOMMITMENT:\n{commitment}\nMESSAGE:\n{message}\n")
    return [{"role": "system", "content": sys}, {"role": "user", "content": user}]


class TemplateSender:
    """Offline sender: local edits of the current scheme (read from the prompt's text) or fresh draws,
    rounded to the verbal grid the prompt asks for."""

    name = "template-sender"

    def __init__(self, p_fresh: float = 0.3, steps: Sequence[float] = (0.05, 0.1, 0.2, 0.4)):
        self.p_fresh, self.steps = p_fresh, tuple(steps)

    def complete(self, messages: Sequence[dict], *, temperature: float = 0.0, max_tokens: int = 256,
                 seed: int | None = None) -> str:
        game, role = game_of(messages)
        if role != "sender":
            raise ValueError("TemplateSender got a receiver prompt")
        system, user = messages[0]["content"], messages[-1]["content"]
        m = GRID_RE.search(system)
        grid = float(m.group(1)) / 100.0 if m else 0.05
        current = parse_commitment(game, _between(user, "Current scheme: ", "\nFeedback from"))
        rng = np.random.default_rng(seed)
        n_s, n_a = len(game.states), len(game.actions)
        if current is None or rng.random() < self.p_fresh:
            pi = rng.dirichlet(np.ones(n_a), size=n_s)
        else:
            pi = current.copy()
            s = int(rng.integers(n_s))
            a, b = rng.choice(n_a, 2, replace=False)
            shift = min(self.steps[int(rng.integers(len(self.steps)))], pi[s, b])
            pi[s, a] += shift
            pi[s, b] -= shift
        pi = np.round(pi / grid) * grid  # words carry a coarse probability
        for s in range(n_s):
            pi[s, -1] = 1.0 - pi[s, :-1].sum()
            if pi[s, -1] < 0:
                pi[s] = np.clip(pi[s], 0, None)
                pi[s, int(np.argmax(pi[s]))] += 1.0 - pi[s].sum()
        return verbalize_scheme(game, np.clip(pi, 0, 1), rng)


class NoisyReader:
    """Offline receiver reading commitment and message as text: Bayes on the scheme as read, then a
    misjudged posterior (log-odds + noise * z, z ~ N(0, 1) per dialogue) and its best response.

    ``complete`` is the text path (the same prompt an LLM receiver gets; z is drawn from the call's
    seed, 0 without one). ``act_many`` is the same rule for many dialogues of one (commitment,
    message) pair, with their z's given: the loop uses it so that 10^4 dialogues cost one reading."""

    def __init__(self, noise: float = 0.0):
        self.noise = float(noise)
        self.name = f"noisy-lexicon-reader(noise={self.noise:g})"
        self._readings: dict = {}

    def reading(self, game: BPGame, commitment: str, message: str) -> tuple[np.ndarray, int] | None:
        """(posterior of the message's recommendation under the scheme as read, recommendation), or
        None when the scheme or the message cannot be read (the receiver then acts on its prior)."""
        key = (game.name, commitment, message)
        if key not in self._readings:
            pi, rec = parse_commitment(game, commitment), classify_message(game, message)
            out = None
            if pi is not None and rec is not None:
                joint = game.mu0 * pi[:, rec]
                out = (joint / joint.sum() if joint.sum() > 1e-12 else game.mu0, rec)
            self._readings[key] = out
        return self._readings[key]

    def decide(self, game: BPGame, belief: np.ndarray, rec: int | None, z: np.ndarray) -> np.ndarray:
        """Actions at the perceived beliefs of dialogues with noise draws ``z`` (ties go to ``rec``)."""
        z = np.atleast_1d(np.asarray(z, float))
        if self.noise > 0:
            if len(game.states) != 2:
                raise ValueError("NoisyReader with noise > 0 needs a two-state game")
            with np.errstate(divide="ignore"):
                logit = np.log(belief[0]) - np.log(belief[1])
            b0 = 1.0 / (1.0 + np.exp(-(logit + self.noise * z))) if np.isfinite(logit) else \
                np.full(z.shape, float(logit > 0))
            beliefs = np.stack([b0, 1.0 - b0], axis=1)
        else:
            beliefs = np.broadcast_to(belief, (len(z), len(belief)))
        eu = beliefs @ game.ur
        best = eu.argmax(axis=1)
        if rec is not None:
            best = np.where(eu[:, rec] >= eu.max(axis=1) - TIE_TOL, rec, best)
        return best

    def act_many(self, game: BPGame, commitment: str, message: str, z: np.ndarray) -> np.ndarray:
        r = self.reading(game, commitment, message)
        if r is None:
            return np.full(len(np.atleast_1d(z)), receiver_best_action(game, game.mu0))
        return self.decide(game, r[0], r[1], z)

    def complete(self, messages: Sequence[dict], *, temperature: float = 0.0, max_tokens: int = 256,
                 seed: int | None = None) -> str:
        game, _ = game_of(messages)
        text = messages[-1]["content"]
        commitment = _between(text, "COMMITMENT:\n", "\nMESSAGE:\n")
        message = _between(text, "\nMESSAGE:\n", None).rstrip("\n")
        z = 0.0 if seed is None else float(np.random.default_rng(seed).standard_normal())
        return game.actions[int(self.act_many(game, commitment, message, np.array([z]))[0])]


def LexiconReceiver() -> NoisyReader:
    """The exact Bayesian reader (noise 0): the words add nothing beyond the numbers they state."""
    return NoisyReader(0.0)


def read_action(game: BPGame, reply: str) -> int | None:
    """The action a receiver's reply names (lexicon), None if none or several."""
    return classify_message(game, reply)
