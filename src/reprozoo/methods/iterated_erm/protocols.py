"""The two iterated-ERM protocols, simulated at finite d.

active_learning (pool-based, budget split): a pool of N unlabelled points; n1 random ones are
labelled, stage 1 fits w1 on them; stage 2 labels n2 more points from the rest of the pool chosen
by ``rule`` from w1's predictions (margin: smallest |w1.x|/sqrt d, i.e. most uncertain; random:
passive) and fits w2 on all n1 + n2 labels (the n1 reused).

reweighting (selection on the same data): n labelled points; stage 1 fits w1 on all; stage 2 fits
w2 on the n2 of the SAME points that ``rule`` keeps from their in-sample predictions.

candidate_selection (selection strength at fixed n2): as reweighting, but n2 is fixed and the
rule picks the n2 from a random candidate subset of c of the n points; c sweeps from n2 (random)
to n (the rule on the whole set).
"""
from __future__ import annotations

import numpy as np

from .data import sample
from .erm import fit, population_error


def _select(z1: np.ndarray, n2: int, rule: str, rng) -> np.ndarray:
    if rule == "margin":
        return np.argsort(np.abs(z1), kind="stable")[:n2]
    if rule == "random":
        return rng.choice(len(z1), size=n2, replace=False)
    raise ValueError(f"unknown selection rule '{rule}' (margin, random)")


def active_learning(X, y, n1, n2, r, loss, lam1, lam2, rule, rng):
    """One run on the pool (X, y) (its first n1 points are the random stage-1 labels).
    Returns (stage-1 error, stage-2 error), exact population errors."""
    pool, d = X.shape
    w1 = fit(loss, X[:n1], y[:n1], lam1)
    rest = np.arange(n1, pool)
    z1 = X[rest] @ w1 / np.sqrt(d)
    chosen = rest[_select(z1, n2, rule, rng)]
    train = np.concatenate([np.arange(n1), chosen])
    w2 = fit(loss, X[train], y[train], lam2)
    return population_error(w1, r), population_error(w2, r)


def reweighting(X, y, n2_list, r, loss, lam1, lam2, rule, rng):
    """Stage 1 on all of (X, y), then stage 2 on the n2 kept points, for every n2 in ``n2_list``
    (one w1 for all: the curve is a function of the selection alone). Returns stage-2 errors."""
    d = X.shape[1]
    w1 = fit(loss, X, y, lam1)
    z1 = X @ w1 / np.sqrt(d)
    errs = []
    for n2 in n2_list:
        keep = _select(z1, n2, rule, rng)
        errs.append(population_error(fit(loss, X[keep], y[keep], lam2), r))
    return errs


def candidate_selection(X, y, n2, cand_list, r, loss, lam1, lam2, rule, rng):
    """Selection strength at a fixed stage-2 size: stage 1 on all n labelled points, then for each
    c in ``cand_list`` stage 2 keeps n2 of a random candidate subset of c points (nested subsets: the
    first c of one random permutation, common random numbers along the sweep), chosen by ``rule``
    from the in-sample predictions. c = n2: random selection; c = n: ``rule`` on the whole set.
    n, n2, d and w1 stay fixed; only how hard the n2 are selected changes. Returns stage-2 errors."""
    n, d = X.shape
    w1 = fit(loss, X, y, lam1)
    z1 = X @ w1 / np.sqrt(d)
    order = rng.permutation(n)
    errs = []
    for c in cand_list:
        cand = order[:c]
        keep = cand[_select(z1[cand], n2, rule, rng)]
        errs.append(population_error(fit(loss, X[keep], y[keep], lam2), r))
    return errs


def pool(n, d, r, rng):
    return sample(n, d, r, rng)
