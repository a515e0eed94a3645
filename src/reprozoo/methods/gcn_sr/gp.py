"""Genetic-programming refinement of a batch of generated expressions (ours, numpy).

As in neural-guided GP population seeding (Mundhenk et al., NeurIPS 2021), the batch the
generator just sampled is the initial population of a short GP run; GCN-SR keeps the
expressions GP refines from it (its elites) and, instead of training on them, uses them to shape
the rewards of the generator's own samples (SWPG, ``search.py``).

One generation (DEAP's eaSimple with elitism 1): tournament selection (size ``tournament``);
with probability ``p_crossover`` subtree crossover of two parents, else a mutation: subtree
mutation (a random subtree replaced by a grown tree) or point mutation (one symbol replaced by
another of the same arity), half-half. Children deeper than the scaffold are replaced by their
parent, so every refined expression still lives on the SPBT. Each child is one evaluation of
the reward and counts against the evaluation budget.
"""
from __future__ import annotations

import numpy as np

from .expressions import ARITY, V, depth, subtree_end

BINARY = np.flatnonzero(ARITY == 2)
UNARY = np.flatnonzero(ARITY == 1)
TERMINAL = np.flatnonzero(ARITY == 0)


def grow(rng: np.random.Generator, max_depth: int, p_terminal: float = 0.3) -> list[int]:
    """Random tree by the grow method: a terminal w.p. ``p_terminal`` (always at max_depth)."""
    if max_depth == 0 or rng.random() < p_terminal:
        return [int(rng.choice(TERMINAL))]
    t = int(rng.integers(0, V))
    while ARITY[t] == 0:
        t = int(rng.integers(0, V))
    out = [t]
    for _ in range(ARITY[t]):
        out += grow(rng, max_depth - 1, p_terminal)
    return out


def _depth_at(prefix, k: int) -> int:
    """Depth of the node at prefix position ``k``."""
    pending, d = [0], 0
    for i, t in enumerate(prefix):
        d = pending.pop()
        if i == k:
            return d
        pending.extend([d + 1] * int(ARITY[t]))
    raise IndexError(k)


def crossover(a, b, rng, max_depth: int) -> list[int]:
    """Replace a random subtree of ``a`` with a random subtree of ``b``."""
    i, j = int(rng.integers(len(a))), int(rng.integers(len(b)))
    child = a[:i] + b[j:subtree_end(b, j)] + a[subtree_end(a, i):]
    return child if depth(child) <= max_depth else list(a)


def subtree_mutation(a, rng, max_depth: int) -> list[int]:
    i = int(rng.integers(len(a)))
    room = max_depth - _depth_at(a, i)
    return a[:i] + grow(rng, min(room, 2)) + a[subtree_end(a, i):]


def point_mutation(a, rng) -> list[int]:
    i = int(rng.integers(len(a)))
    same = np.flatnonzero(ARITY == ARITY[a[i]])
    child = list(a)
    child[i] = int(rng.choice(same))
    return child


def refine(population: list[list[int]], fitness: np.ndarray, score, generations: int, rng,
           max_depth: int, p_crossover: float = 0.5, tournament: int = 5):
    """Run ``generations`` GP generations from ``population`` (fitness already known).

    ``score(list of prefixes) -> rewards``. Returns every child evaluated with its reward
    (``children, rewards``), in order; ``len(children) = generations * len(population)``.
    """
    pop, fit = [list(p) for p in population], np.asarray(fitness, dtype=float)
    all_children, all_rewards = [], []
    n = len(pop)
    for _ in range(generations):
        def select():
            idx = rng.integers(0, n, tournament)
            return pop[int(idx[np.argmax(fit[idx])])]
        children = []
        for _ in range(n):
            if rng.random() < p_crossover:
                children.append(crossover(select(), select(), rng, max_depth))
            elif rng.random() < 0.5:
                children.append(subtree_mutation(select(), rng, max_depth))
            else:
                children.append(point_mutation(select(), rng))
        rew = np.asarray(score(children), dtype=float)
        best = int(np.argmax(fit))
        worst = int(np.argmin(rew))
        children[worst], rew[worst] = pop[best], fit[best]      # elitism: the best survives
        all_children += children
        all_rewards.append(rew)
        pop, fit = children, rew
    rewards = np.concatenate(all_rewards) if all_rewards else np.zeros(0)
    return all_children, rewards
