"""GP-only baseline: the GP that GCN-SR refines its batches with (``gp.py``), run on its own.

Like for like with the neural variants: the same library (unprotected operators, no constants),
the same depth cap (the SPBT depth D: children deeper than D are replaced by their parent), the
same operators and rates as GCN-SR's refinement (tournament, subtree crossover, subtree/point
mutation, elitism 1), a population the size of a generator batch, the same reward, evaluation
budget and exact-fit stop. It is GCN-SR with the neural generator taken away: the initial
population is drawn by the ramped grow method (depths 2..D) instead of by a policy, and each
generation breeds from the last instead of from a fresh generator batch.

(Until this version the baseline was gplearn's ``SymbolicRegressor``: protected operators, hoist
mutation, parsimony pressure and trees of any depth, i.e. a different operator set and search
space; it also cost more CPU per evaluation than all neural variants together.)
"""
from __future__ import annotations

import numpy as np

from .expressions import prefix_rewards
from .gp import grow, refine
from .search import Hall


def initial_population(rng: np.random.Generator, size: int, max_depth: int) -> list[list[int]]:
    """Ramped grow: depth limits cycle through 2..D (1..D when D < 2)."""
    lo = min(2, max_depth)
    return [grow(rng, lo + i % (max_depth - lo + 1)) for i in range(size)]


def run_gp(x: np.ndarray, y: np.ndarray, cfg: dict, seed: int) -> Hall:
    rng = np.random.default_rng(seed)
    depth, size, budget = cfg["max_depth"], cfg["batch"], cfg["budget"]
    g = cfg.get("gp", {})
    score = lambda prefixes: prefix_rewards(prefixes, x, y, depth)
    hall = Hall()
    pop = initial_population(rng, min(size, budget), depth)
    fit = score(pop)
    hall.add(pop, fit)
    while hall.evals < budget and not hall.exact:
        children, rew = refine(pop, fit, score, 1, rng, depth, g.get("p_crossover", 0.5), g.get("tournament", 5))
        left = budget - hall.evals
        hall.add(children[:left], rew[:left])
        pop, fit = children, rew
    return hall
