"""One symbolic-regression run of a neural variant on one task, under an evaluation budget.

Loop (every distinct expression scored, generator sample or GP child, counts once against
``budget``; repeats are served from the search's reward cache and are free, ``expressions.Scorer``)::

    repeat until the budget is spent or an exact fit (NRMSE < 1e-10) is found
    (or after max_batches_factor x budget / B generator batches, a collapsed policy's end):
        tau_1..B ~ p_theta                      <= B evaluations (new expressions only)
        [GP variants] refine the batch for G generations -> children (<= G*B evaluations);
                      elites E = top-k distinct children
        training rewards R~ (below); top-eps selection; risk-seeking policy-gradient step
        (lr 0: no step, the untrained generator, i.e. random search under the constraints)

    mode "pg"      (DSR, GCN ablation)  R~_i = R_i
    mode "swpg"    (GCN-SR)             R~_i = R_i + lambda * max_e s(tau_i, e) * max(0, R_e - R_i)
    mode "imitate" (hybrid ablation)    batch <- batch + E with their own rewards (off-policy,
                                        the direct imitation of GP elites SWPG replaces)

SWPG keeps the gradient on the generator's own samples: a sample earns part of an elite's extra
reward in proportion to its scaffold similarity s (``expressions.spbt_similarity``: fraction of
shared slot symbols), so the update moves probability towards what GP found through samples the
policy actually draws, without a target the generator cannot represent well. The exact form of
the weighting is our assumption (README). The best expression over all evaluations (generator and
GP) is the run's answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .expressions import (Scorer, constraints_ok, n_nodes, prefix_to_spbt, spbt_similarity,
                          spbt_to_prefix)
from .gp import refine
from .policies import make_policy, risk_seeking_loss, risk_seeking_selection

EXACT_NRMSE = 1e-10
EXACT_REWARD = 1.0 / (1.0 + EXACT_NRMSE)


@dataclass
class Hall:
    """Best expression seen so far and the best-reward-vs-evaluations trace (evaluations =
    distinct expressions charged by the search's :class:`~.expressions.Scorer`)."""
    best: list[int] | None = None
    best_reward: float = -1.0
    evals: int = 0
    proposed: int = 0
    trace_evals: list[int] = field(default_factory=list)
    trace_best: list[float] = field(default_factory=list)

    def add(self, prefixes, rewards, scorer) -> None:
        for pr, r in zip(prefixes, rewards):
            # ties: keep the shorter expression
            if r > self.best_reward or (r == self.best_reward and self.best is not None and len(pr) < len(self.best)):
                self.best, self.best_reward = list(pr), float(r)
        self.evals, self.proposed = scorer.evals, scorer.proposed
        self.trace_evals.append(self.evals)
        self.trace_best.append(self.best_reward)

    @property
    def exact(self) -> bool:
        return self.best_reward >= EXACT_REWARD


def swpg_rewards(samples: np.ndarray, r: np.ndarray, elites: np.ndarray, r_elites: np.ndarray,
                 lam: float) -> np.ndarray:
    """Similarity-weighted rewards R~_i = R_i + lam * max_e s_ie * max(0, R_e - R_i)."""
    if len(elites) == 0:
        return r.copy()
    s = spbt_similarity(samples, elites)                                   # (B, K)
    gain = np.maximum(0.0, r_elites[None, :] - r[:, None])
    return r + lam * np.max(s * gain, axis=1)


def run_neural(x: np.ndarray, y: np.ndarray, policy_kind: str, mode: str, cfg: dict, seed: int,
               progress=None) -> Hall:
    import torch

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    depth = cfg["max_depth"]
    policy = make_policy(policy_kind, depth, cfg["policy"])
    lr = float(cfg["lr"])
    opt = torch.optim.Adam(policy.parameters(), lr=lr) if lr > 0 else None   # lr 0: untrained generator
    budget, batch = cfg["budget"], cfg["batch"]
    # a generator whose batches are mostly repeats charges little: cap its batches, so a
    # collapsed policy ends (its curve then holds its last value up to the budget)
    max_batches = int(np.ceil(cfg.get("max_batches_factor", 4) * budget / batch))
    gp_cfg = cfg.get("gp", {})
    scorer = Scorer(x, y, depth, budget)
    hall = Hall()
    it = 0
    while not scorer.spent and not hall.exact and it < max_batches:
        a = policy.sample(batch, gen)
        prefixes = [spbt_to_prefix(row) for row in a]
        r = scorer.score_spbt(a, prefixes)
        a, prefixes = a[:len(r)], prefixes[:len(r)]      # the budget may end inside the batch
        hall.add(prefixes, r, scorer)
        it += 1
        if len(r) == 0:
            break
        r_train, train_a = r, a
        g = gp_cfg.get("generations", 0) if mode in ("swpg", "imitate") else 0
        if g > 0 and not hall.exact and not scorer.spent:
            children, r_children = refine(prefixes, r, scorer, g, rng, depth,
                                          gp_cfg.get("p_crossover", 0.5), gp_cfg.get("tournament", 5))
            hall.add(children, r_children, scorer)
            elites, r_el = _elites(children, r_children, gp_cfg.get("elites", 10), depth)
            if mode == "swpg":
                r_train = swpg_rewards(a, r, elites, r_el, cfg["swpg_lambda"])
            else:
                train_a, r_train = np.concatenate([a, elites]), np.concatenate([r, r_el])
        if opt is not None and not hall.exact and not scorer.spent:
            keep, r_eps = risk_seeking_selection(r_train, cfg["epsilon"])
            logp, ent = policy.log_prob(train_a[keep])
            loss = risk_seeking_loss(logp, ent, r_train[keep] - r_eps, cfg["entropy_coef"])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if progress and it % 10 == 0:
            progress(f"{policy_kind}/{mode} it {it} evals {hall.evals} best R {hall.best_reward:.4f}")
    return hall


def _elites(children, rewards, k: int, depth: int):
    """Top-k distinct GP children as SPBTs, keeping only trees the policies can emit
    (constraint-violating trees have probability 0 under them, so imitation could not train on
    them); both GP variants see the same elites."""
    order = np.argsort(-rewards, kind="stable")
    seen, cand = set(), []
    for i in order:                      # distinct children, best first
        key = tuple(children[i])
        if key not in seen:
            seen.add(key)
            cand.append(int(i))
    out, r_out = [np.zeros((0, n_nodes(depth)), dtype=np.int64)], [np.zeros(0)]
    for lo in range(0, len(cand), 4 * k):   # constraint check in blocks, stop once k pass
        part = np.array(cand[lo:lo + 4 * k])
        a = np.array([prefix_to_spbt(children[i], depth) for i in part], dtype=np.int64)
        ok = constraints_ok(a, depth)
        out.append(a[ok])
        r_out.append(rewards[part][ok])
        if sum(len(o) for o in out) >= k:
            break
    out, r_out = np.concatenate(out), np.concatenate(r_out)
    return out[:k], r_out[:k]
