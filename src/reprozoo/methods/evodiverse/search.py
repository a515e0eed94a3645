"""Evolutionary hypothesis search at a fixed oracle budget: tempered populations vs one greedy one.

Sampling view (EvoDiverse). Population i targets pi_i(x) ~ r(x)^beta_i, with r the reference
code's reward for the task (``task.log_reward``: -ln NMSE for formulas, ln(sum of radii / 2.635)
for packings; no temperature of ours). A cold population (beta = 0.8) exploits, a hot one
(beta = 0.2) explores; each generation a population
  1. draws parents with probability ~ r^beta (2 % uniform mixed in),
  2. asks the proposer for ``offspring`` children, each scored by the oracle (one call per new
     hypothesis; a hypothesis already scored is looked up for free),
  3. keeps ``size`` members of parents + children, duplicates (same hypothesis) removed: the
     ``elites`` best always, the rest drawn without replacement with weights
     r^beta * exp(-alpha * crowding) (Gumbel top-k); crowding = mean similarity to the 5
     nearest others, applied in hot populations only (beta < 0.5). Steps 1 and 3 are our
     reading of the paper's sampling view (the reference's LLM-SR pools keep the best).
Every ``swap_every`` generations, ``swap_size`` members of each population are drawn, as in the
reference (``pt_migration_softmax_random_inplace``): without replacement with probabilities
softmax(beta * score) in BOTH populations, score being the reference's raw score
(``task.ref_score``: -NMSE, or sum of radii / 2.635). Each pair is exchanged with the
replica-exchange (parallel-tempering) probability

    A = min(1, exp((beta_a - beta_b) * xi * (log r_b - log r_a))),

which keeps pi_a x pi_b invariant: a better hypothesis found hot moves cold, a worse one found
cold moves hot. A hypothesis already held by the receiving population is not copied in (each
direction checked on its own, as in the reference). xi (start 2.5) is adapted from the
cumulative acceptance (x0.9 below 0.3, x1.1 above 0.5), as in the reference code.

Greedy baseline (FunSearch / OpenEvolve-style elitist GA): one population of the same total size
and the same offspring per generation; parents ~ r^beta_cold, survival by truncation
(the ``size`` best). ``pt_noswap`` is EvoDiverse without the exchange step.

Every variant spends exactly ``budget`` oracle calls and starts from the same random hypotheses.
The reported set is the top-k distinct hypotheses of its final populations (all populations
pooled; the reference code reports per-population top-k quality and diversity); the top-k of
everything it evaluated (``Oracle.top_k``) is recorded beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Candidate:
    genome: object
    quality: float
    skey: str
    call: int  # oracle call at which it was first scored
    feat: object = None


class Oracle:
    """Counts validation calls; a hypothesis scored before costs nothing (looked up)."""

    def __init__(self, task, budget: int):
        self.task, self.budget = task, int(budget)
        self.calls = 0
        self.cache: dict[str, Candidate] = {}
        self.archive: dict[str, Candidate] = {}  # distinct hypotheses (semantic key), first found
        self.best_per_call: list[float] = []

    @property
    def exhausted(self) -> bool:
        return self.calls >= self.budget

    def __call__(self, genome) -> Candidate | None:
        k = self.task.key(genome)
        if k in self.cache:
            return self.cache[k]
        if self.exhausted:
            return None
        self.calls += 1
        q, skey = self.task.score(genome)
        c = Candidate(genome, q, skey, self.calls)
        self.cache[k] = c
        if skey not in ("invalid", "constant") and skey not in self.archive:
            self.archive[skey] = c
        prev = self.best_per_call[-1] if self.best_per_call else -np.inf
        self.best_per_call.append(max(prev, q))
        return c

    def top_k(self, k: int, upto_call: int | None = None) -> list[Candidate]:
        cands = [c for c in self.archive.values() if upto_call is None or c.call <= upto_call]
        return sorted(cands, key=lambda c: (-c.quality, c.call))[:k]


def _features(task, c: Candidate):
    if c.feat is None:
        c.feat = task.features(c.genome)
    return c.feat


def gumbel_topk(logw: np.ndarray, k: int, rng) -> np.ndarray:
    """k indices drawn without replacement with probabilities ~ exp(logw) (successive sampling)."""
    return np.argsort(-(logw + rng.gumbel(size=len(logw))))[:k]


@dataclass
class Population:
    beta: float | None  # None: greedy (truncation survival)
    size: int
    members: list = field(default_factory=list)

    def qualities(self) -> np.ndarray:
        return np.array([c.quality for c in self.members])


class TemperedSearch:
    def __init__(self, task, proposer, oracle: Oracle, cfg: dict, rng: np.random.Generator):
        self.task, self.proposer, self.oracle, self.cfg, self.rng = task, proposer, oracle, cfg, rng
        self.xi = float(cfg.get("xi0", 2.5))
        self.swap_proposed = self.swap_accepted = 0
        self._sim_cache: dict[tuple, float] = {}

    # -- selection --------------------------------------------------------------------------------
    def parents(self, pop: Population, n: int) -> list[Candidate]:
        lr = self.task.log_reward(pop.qualities())
        beta = pop.beta if pop.beta is not None else self.cfg["greedy_parent_beta"]
        w = np.exp(beta * (lr - lr.max()))
        p = 0.98 * w / w.sum() + 0.02 / len(w)
        idx = self.rng.choice(len(lr), size=min(n, len(lr)), replace=False, p=p)
        chosen = [pop.members[i] for i in idx]
        return sorted(chosen, key=lambda c: -c.quality)

    def _similarity(self, a: Candidate, b: Candidate) -> float:
        k = (a.skey, b.skey) if a.skey < b.skey else (b.skey, a.skey)
        if k not in self._sim_cache:
            self._sim_cache[k] = self.task.similarity(_features(self.task, a), _features(self.task, b))
        return self._sim_cache[k]

    def crowding(self, cands: list[Candidate], k_nn: int = 5) -> np.ndarray:
        n = len(cands)
        S = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1, n):
                S[i, j] = S[j, i] = self._similarity(cands[i], cands[j])
        np.fill_diagonal(S, -np.inf)
        k = min(k_nn, n - 1)
        return np.sort(S, axis=1)[:, ::-1][:, :k].mean(axis=1) if k > 0 else np.zeros(n)

    def survive(self, pop: Population, children: list[Candidate]) -> None:
        seen, cands = set(), []
        for c in pop.members + children:
            if c.skey not in seen:
                seen.add(c.skey)
                cands.append(c)
        q = np.array([c.quality for c in cands])
        n = min(pop.size, len(cands))
        if pop.beta is None:  # greedy: truncation
            take = np.argsort(-q, kind="stable")[:n]
        else:
            logw = pop.beta * self.task.log_reward(q)
            if pop.beta < 0.5 and self.cfg["alpha_div"] > 0:
                logw = logw - self.cfg["alpha_div"] * self.crowding(cands)
            order = np.argsort(-logw, kind="stable")
            e = min(self.cfg["elites"], n)
            rest = order[e:]
            take = np.concatenate([order[:e], rest[gumbel_topk(logw[rest], n - e, self.rng)]])
        pop.members = [cands[i] for i in take]

    # -- replica exchange -----------------------------------------------------------------------------
    def pairing(self, pop: Population, m: int) -> np.ndarray:
        """m members drawn without replacement with probabilities softmax(beta * score), score the
        reference's raw score (the reference's swap pairing, in every population)."""
        z = pop.beta * self.task.ref_score(pop.qualities())
        w = np.exp(z - z.max())
        return self.rng.choice(len(w), size=m, replace=False, p=w / w.sum())

    def exchange(self, cold: Population, hot: Population) -> None:
        m = min(self.cfg["swap_size"], len(cold.members), len(hot.members))
        if m <= 0:
            return
        ia, ib = self.pairing(cold, m), self.pairing(hot, m)
        keys_c = {c.skey for c in cold.members}
        keys_h = {c.skey for c in hot.members}
        for a, b in zip(ia, ib):
            ca, cb = cold.members[a], hot.members[b]
            lr_a, lr_b = self.task.log_reward(ca.quality), self.task.log_reward(cb.quality)
            log_a = (cold.beta - hot.beta) * self.xi * (lr_b - lr_a)
            self.swap_proposed += 1
            if np.log(self.rng.random()) <= min(0.0, log_a):
                self.swap_accepted += 1
                if cb.skey not in keys_c:  # into the cold population, unless it holds cb already
                    keys_c.discard(ca.skey), keys_c.add(cb.skey)
                    cold.members[a] = cb
                if ca.skey not in keys_h:  # and the other way round, checked on its own
                    keys_h.discard(cb.skey), keys_h.add(ca.skey)
                    hot.members[b] = ca
        rate = self.swap_accepted / self.swap_proposed
        if rate < 0.3:
            self.xi *= 0.9
        elif rate > 0.5:
            self.xi *= 1.1

    # -- the loop ---------------------------------------------------------------------------------------
    def breed(self, pop: Population, n_children: int) -> list[Candidate]:
        children, attempts = [], 0
        while len(children) < n_children and attempts < 4 * n_children and not self.oracle.exhausted:
            attempts += 1
            par = self.parents(pop, 2)
            g = self.proposer.propose([(c.genome, c.quality) for c in par], self.rng)
            if g is None:
                continue
            c = self.oracle(g)
            if c is not None and c.skey not in ("invalid", "constant"):
                children.append(c)
        return children

    def run(self, pops: list[Population], initial: list, swaps: bool) -> dict:
        """``initial``: genomes shared by every variant, split evenly over the populations."""
        per = len(initial) // len(pops)
        for i, pop in enumerate(pops):
            scored = [self.oracle(g) for g in initial[i * per:(i + 1) * per]]
            self.survive(pop, [c for c in scored if c is not None and c.skey not in ("invalid", "constant")])
        children_per_pop = self.cfg["offspring"] * self.cfg["populations"] // len(pops)
        gen, stall = 0, 0
        while not self.oracle.exhausted and stall < 20:
            before = self.oracle.calls
            for pop in pops:
                self.survive(pop, self.breed(pop, children_per_pop))
            gen += 1
            stall = stall + 1 if self.oracle.calls == before else 0
            if swaps and len(pops) > 1 and gen % self.cfg["swap_every"] == 0:
                self.exchange(pops[0], pops[1])
        return {"generations": gen,
                "swap_rate": self.swap_accepted / self.swap_proposed if self.swap_proposed else float("nan"),
                "xi": self.xi}


def run_variant(variant: str, task, proposer, cfg: dict, initial: list, rng) -> tuple[Oracle, dict]:
    """One search: ``evodiverse`` (tempered + exchange), ``pt_noswap``, or ``greedy``."""
    oracle = Oracle(task, cfg["budget"])
    search = TemperedSearch(task, proposer, oracle, cfg, rng)
    if variant == "greedy":
        pops = [Population(None, cfg["pop_size"] * cfg["populations"])]
    elif variant in ("evodiverse", "pt_noswap"):
        betas = cfg["betas"]
        pops = [Population(float(b), cfg["pop_size"]) for b in sorted(betas, reverse=True)]
    else:
        raise ValueError(f"unknown variant {variant!r}: evodiverse, pt_noswap or greedy")
    info = search.run(pops, initial, swaps=variant == "evodiverse")
    info["final"] = final_set([c for pop in pops for c in pop.members])
    return oracle, info


def final_set(members: list[Candidate]) -> list[Candidate]:
    """The hypotheses a search holds at the end (all its populations), distinct, best first."""
    seen, out = set(), []
    for c in sorted(members, key=lambda c: (-c.quality, c.call)):
        if c.skey not in seen:
            seen.add(c.skey)
            out.append(c)
    return out


def top_k_diversity(task, cands: list[Candidate]) -> float:
    """Mean pairwise distance among the top-k (with the task's symmetries)."""
    feats = [_features(task, c) for c in cands]
    d = [task.distance(feats[i], feats[j]) for i in range(len(feats)) for j in range(i + 1, len(feats))]
    return float(np.mean(d)) if d else 0.0
