"""Classic Bayesian persuasion games with a known optimum (the verbalized loop's test bed).

A game is a finite state set Omega with common prior mu0, receiver actions A, and utilities
u_s(omega, a) for the sender (who sees omega) and u_r(omega, a) for the receiver (who acts). The
sender commits to a signalling scheme pi(m | omega); by the revelation principle the messages can
be taken to be action recommendations m = a, and the scheme is optimal iff it solves the LP in
``solvers.lp_optimum`` (obedience: following each recommendation is a receiver best response).

All three games are binary-state, binary-action "threshold" games: the receiver takes the sender's
preferred action a+ iff its posterior on the high state is at least t, so the optimum is the
closed form min(1, mu0 / t) (Kamenica & Gentzkow 2011), truthful revelation gives mu0 and an
uninformative (babbling) scheme gives 0 whenever mu0 < t.

  courtroom               prosecutor -> judge, P(guilty) = 0.3, judge convicts iff P(guilty) >= 1/2
                          (Kamenica & Gentzkow 2011): optimum 0.6, truthful 0.3, babbling 0
  recommendation_letter   professor -> recruiter, P(strong) = 1/3, hiring a strong student +1, a weak
                          one -1, not hiring 0: hire iff P(strong) >= 1/2 (Dughmi 2017): 2/3, 1/3, 0
  law_enforcement         police -> drivers, P(patrolled) = 0.2, speeding +1 unpatrolled, -3 when
                          caught, driving slowly 0: slow iff P(patrolled) >= 1/4: 0.8, 0.2, 0
The words (state phrases, action verbs, message paraphrases) are what the verbal agents read and
write; the lexicon receiver knows them, the states are never named in a message (obfuscation).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class BPGame:
    name: str
    sender: str
    receiver: str
    states: tuple[str, ...]            # state ids, e.g. ("guilty", "innocent")
    state_phrases: tuple[str, ...]     # how a scheme names each state, e.g. "the defendant is guilty"
    actions: tuple[str, ...]           # receiver action verbs (lexicon keys), e.g. ("convict", "acquit")
    prior: tuple[float, ...]
    u_sender: tuple[tuple[float, ...], ...]    # [state][action]
    u_receiver: tuple[tuple[float, ...], ...]  # [state][action]
    messages: dict = field(default_factory=dict)  # action -> paraphrases recommending it
    closed_form: float = float("nan")  # sender-optimal value, min(1, mu0 / t)

    @property
    def mu0(self) -> np.ndarray:
        return np.asarray(self.prior, float)

    @property
    def us(self) -> np.ndarray:
        return np.asarray(self.u_sender, float)

    @property
    def ur(self) -> np.ndarray:
        return np.asarray(self.u_receiver, float)


COURTROOM = BPGame(
    name="courtroom", sender="prosecutor", receiver="judge",
    states=("guilty", "innocent"),
    state_phrases=("the defendant is guilty", "the defendant is innocent"),
    actions=("convict", "acquit"), prior=(0.3, 0.7),
    u_sender=((1.0, 0.0), (1.0, 0.0)),
    u_receiver=((1.0, 0.0), (0.0, 1.0)),
    messages={"convict": ("Your Honour, the evidence calls for a conviction.",
                          "I ask the court to convict.",
                          "The prosecution recommends that you convict."),
              "acquit": ("The prosecution will not oppose an acquittal.",
                         "I recommend that the court acquit.",
                         "An acquittal would be appropriate here.")},
    closed_form=0.6)

RECOMMENDATION_LETTER = BPGame(
    name="recommendation_letter", sender="professor", receiver="recruiter",
    states=("strong", "weak"),
    state_phrases=("the student is strong", "the student is weak"),
    actions=("hire", "reject"), prior=(1.0 / 3.0, 2.0 / 3.0),
    u_sender=((1.0, 0.0), (1.0, 0.0)),
    u_receiver=((1.0, 0.0), (-1.0, 0.0)),
    messages={"hire": ("I recommend that you hire this student without hesitation.",
                       "You should hire this candidate.",
                       "This student deserves an offer; please hire."),
              "reject": ("I cannot recommend this student; you may reject the application.",
                         "You should reject this candidate.",
                         "I suggest you reject this applicant.")},
    closed_form=2.0 / 3.0)

LAW_ENFORCEMENT = BPGame(
    name="law_enforcement", sender="police", receiver="driver",
    states=("patrolled", "unpatrolled"),
    state_phrases=("the road is patrolled", "the road is unpatrolled"),
    actions=("slow", "speed"), prior=(0.2, 0.8),
    u_sender=((1.0, 0.0), (1.0, 0.0)),
    u_receiver=((0.0, -3.0), (0.0, 1.0)),
    messages={"slow": ("Drivers are advised to slow down on this road.",
                       "Please slow down, checks are possible.",
                       "Slow traffic recommended ahead."),
              "speed": ("Normal traffic; you may speed up to your usual pace.",
                        "No checks announced; speed as you like.",
                        "Road clear; drivers may speed.")},
    closed_form=0.8)

GAMES = {g.name: g for g in (COURTROOM, RECOMMENDATION_LETTER, LAW_ENFORCEMENT)}
