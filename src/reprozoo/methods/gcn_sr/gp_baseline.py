"""GP-only baseline: the GP that GCN-SR refines its batches with (``gp.py``), run on its own.

Like for like with the neural variants: the same library (unprotected operators, no constants),
the same search space (depth <= D and the policies' structural constraints: children and
initial trees that break them are redrawn), the same variation operators and elitism as GCN-SR's
refinement, the same reward cache and evaluation budget (each distinct expression charged once)
and the same exact-fit stop. It is GCN-SR with the neural generator taken away: the initial
population is drawn by ramped half-and-half (depths 2..D, every root an operator) instead of by
a policy, and each generation breeds from the last instead of from a fresh generator batch.
Its own population size and tournament size (``gp_only`` in the config) are chosen on a seed-0
pilot from the grid {200, 1000} x {3, 7} (README).

(Until 55d4561 the baseline was gplearn's ``SymbolicRegressor``: protected operators, hoist
mutation, parsimony pressure and trees of any depth, i.e. a different operator set and search
space.)
"""
from __future__ import annotations

from functools import partial

import numpy as np

from .expressions import Scorer, prefix_ok
from .gp import ramped_half_and_half, refine
from .search import Hall


def initial_population(rng: np.random.Generator, size: int, max_depth: int) -> list[list[int]]:
    """Ramped half-and-half (depths 2..D), each tree obeying the policies' constraints."""
    return ramped_half_and_half(rng, size, max_depth, ok=partial(prefix_ok, max_depth=max_depth))


def run_gp(x: np.ndarray, y: np.ndarray, cfg: dict, seed: int) -> Hall:
    rng = np.random.default_rng(seed)
    depth, budget = cfg["max_depth"], cfg["budget"]
    g = {**cfg.get("gp", {}), **cfg.get("gp_only", {})}
    size = int(g.get("population", cfg["batch"]))
    scorer = Scorer(x, y, depth, budget)
    hall = Hall()
    pop = initial_population(rng, size, depth)
    fit = scorer(pop)
    pop = pop[:len(fit)]
    hall.add(pop, fit, scorer)
    # a generation whose children are all repeats charges nothing: cap the generations likewise
    max_gens = int(np.ceil(cfg.get("max_batches_factor", 4) * budget / size))
    gen = 0
    while not scorer.spent and not hall.exact and gen < max_gens and len(pop) > 1:
        children, rew = refine(pop, fit, scorer, 1, rng, depth, g.get("p_crossover", 0.5), g.get("tournament", 5))
        hall.add(children, rew, scorer)
        if len(rew) < len(pop):
            break
        pop, fit = children, rew
        gen += 1
    return hall
