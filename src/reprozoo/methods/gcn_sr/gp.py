"""Genetic-programming refinement of a batch of generated expressions (ours, numpy).

As in neural-guided GP population seeding (Mundhenk et al., NeurIPS 2021), the batch the
generator just sampled is the initial population of a short GP run; GCN-SR keeps the
expressions GP refines from it (its elites) and, instead of training on them, uses them to shape
the rewards of the generator's own samples (SWPG, ``search.py``).

One generation (DEAP's eaSimple with elitism 1): tournament selection (size ``tournament``);
with probability ``p_crossover`` subtree crossover of two parents, else a mutation: subtree
mutation (a random subtree replaced by a grown tree) or point mutation (one symbol replaced by
a *different* symbol of the same arity), half-half. A child must be a new expression in the
policies' search space: it differs from its (first) parent, fits the scaffold (depth <= D) and
obeys the policies' structural constraints (``expressions.prefix_ok``: no exp(log), log(exp),
sin/cos below sin/cos). The operator is retried (at most ``TRIES`` times, parents kept) until
it produces such a child, then subtree mutation (``TRIES`` more); after that the last attempt
that fits, or the parent, is kept (a test checks that copies stay under 2 %). Rewards come from a cached scorer (``expressions.Scorer``): a
child GP or the generator has seen before is not charged to the evaluation budget again.
"""
from __future__ import annotations

import numpy as np

from .expressions import ARITY, V, depth, prefix_ok, subtree_end

BINARY = np.flatnonzero(ARITY == 2)
UNARY = np.flatnonzero(ARITY == 1)
TERMINAL = np.flatnonzero(ARITY == 0)
OPERATORS = np.flatnonzero(ARITY > 0)
TRIES = 10


def grow(rng: np.random.Generator, max_depth: int, p_terminal: float = 0.3, full: bool = False,
         root_operator: bool = False) -> list[int]:
    """Random tree by the grow method (a terminal w.p. ``p_terminal``, always at max_depth) or,
    with ``full``, the full method (operators down to max_depth along every path). With
    ``root_operator`` the root is never a bare terminal (when max_depth > 0)."""
    if max_depth == 0 or (not full and not root_operator and rng.random() < p_terminal):
        return [int(rng.choice(TERMINAL))]
    t = int(rng.choice(OPERATORS))
    out = [t]
    for _ in range(ARITY[t]):
        out += grow(rng, max_depth - 1, p_terminal, full)
    return out


def ramped_half_and_half(rng: np.random.Generator, size: int, max_depth: int, ok=None) -> list[list[int]]:
    """Koza's ramped half-and-half: depth limits cycle through 2..D (1..D when D < 2), half the
    trees by the full method and half by grow, every root an operator. With ``ok`` (a predicate
    on prefixes) a tree failing it is redrawn (at most 10 x ``TRIES`` times)."""
    lo = min(2, max_depth)
    out = []
    for i in range(size):
        d, full = lo + (i // 2) % (max_depth - lo + 1), i % 2 == 0
        for _ in range(10 * TRIES):
            t = grow(rng, d, full=full, root_operator=True)
            if ok is None or ok(t):
                break
        out.append(t)
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


def crossover(a, b, rng, max_depth: int) -> list[int] | None:
    """Replace a random subtree of ``a`` with a random subtree of ``b``; None if the child is
    deeper than ``max_depth``."""
    i, j = int(rng.integers(len(a))), int(rng.integers(len(b)))
    child = a[:i] + b[j:subtree_end(b, j)] + a[subtree_end(a, i):]
    return child if depth(child) <= max_depth else None


def subtree_mutation(a, rng, max_depth: int) -> list[int]:
    i = int(rng.integers(len(a)))
    room = max_depth - _depth_at(a, i)
    return a[:i] + grow(rng, min(room, 2)) + a[subtree_end(a, i):]


def point_mutation(a, rng) -> list[int] | None:
    """One operator replaced by a different operator of the same arity (the library's only
    terminal, x, has no alternative); None for a bare terminal."""
    ops = [k for k, t in enumerate(a) if ARITY[t] > 0]
    if not ops:
        return None
    i = ops[int(rng.integers(len(ops)))]
    same = [s for s in np.flatnonzero(ARITY == ARITY[a[i]]) if s != a[i]]
    child = list(a)
    child[i] = int(rng.choice(same))
    return child


def vary(p1, p2, rng, max_depth: int, p_crossover: float) -> list[int]:
    """One child of parents ``p1`` (and ``p2`` for crossover): the operator is drawn once and
    retried until the child differs from ``p1`` and is valid (depth, constraints); when the
    drawn operator cannot (crossover of two copies of x), subtree mutation is tried instead."""
    op = "cross" if rng.random() < p_crossover else "sub" if rng.random() < 0.5 else "point"
    fallback = None
    for attempt in range(2 * TRIES):
        if attempt == TRIES:
            op = "sub"
        if op == "cross":
            child = crossover(p1, p2, rng, max_depth)
        elif op == "sub":
            child = subtree_mutation(p1, rng, max_depth)
        else:
            child = point_mutation(p1, rng)
            if child is None:                    # a bare x: mutate its subtree instead
                op, child = "sub", subtree_mutation(p1, rng, max_depth)
        if child is None or not prefix_ok(child, max_depth):
            continue
        if child != p1:
            return child
        fallback = child
    return fallback if fallback is not None else list(p1)


def refine(population: list[list[int]], fitness: np.ndarray, score, generations: int, rng,
           max_depth: int, p_crossover: float = 0.5, tournament: int = 5):
    """Run ``generations`` GP generations from ``population`` (fitness already known).

    ``score(list of prefixes) -> rewards`` of the leading part of the list that the budget
    allows (``expressions.Scorer``). Returns every child scored with its reward
    (``children, rewards``), in order; fewer than ``generations * len(population)`` when the
    budget ran out.
    """
    pop, fit = [list(p) for p in population], np.asarray(fitness, dtype=float)
    all_children, all_rewards = [], []
    n = len(pop)
    for _ in range(generations):
        def select():
            idx = rng.integers(0, n, tournament)
            return pop[int(idx[np.argmax(fit[idx])])]
        children = [vary(select(), select(), rng, max_depth, p_crossover) for _ in range(n)]
        rew = np.asarray(score(children), dtype=float)
        if len(rew) < n:                          # budget spent mid-generation
            all_children += children[:len(rew)]
            all_rewards.append(rew)
            break
        best = int(np.argmax(fit))
        worst = int(np.argmin(rew))
        children[worst], rew[worst] = pop[best], fit[best]      # elitism: the best survives
        all_children += children
        all_rewards.append(rew)
        pop, fit = children, rew
    rewards = np.concatenate(all_rewards) if all_rewards else np.zeros(0)
    return all_children, rewards
