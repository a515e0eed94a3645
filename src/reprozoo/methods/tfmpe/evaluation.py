"""Scores of a posterior estimator: C2ST against exact draws, calibration given the data, and the
simulator calls a budget sweep needs to reach a C2ST.

* :func:`c2st_quadratic`: the classifier two-sample test (accuracy of telling model draws from
  reference draws, 5-fold cross-validated, 0.5 = indistinguishable) with sbi's protocol
  (z-scoring by the reference draws, shuffled KFold, accuracy) and a logistic regression on all
  first- and second-order monomials as the classifier. Between two Gaussians the Bayes classifier
  is quadratic, so on the conjugate model (Gaussian reference) it is the natural classifier; it is
  about 20 times cheaper than sbi's random forest, which lets C2ST be averaged over many
  observations. It is a lower bound on the optimal accuracy, as every C2ST is: differences beyond
  the second moments (skew, multimodality) are seen only through the squared terms.
* :func:`conditional_ecdf_excess`: calibration given the data, from SBC ranks. Drawing from the
  prior is marginally calibrated by construction (the ranks of prior draws are uniform over the
  prior predictive), so a marginal SBC check cannot tell a posterior from the prior. Calibration
  given the data can: an exact posterior's ranks are uniform conditional on x, hence within any
  stratum of a statistic of x, while the prior's are not. Each parameter is stratified by the data
  most directly informative about it (:func:`site_summaries`). Inside each stratum the empirical
  CDF of the ranks is compared with the uniform one at every rank, and the squared deviation is
  corrected for its binomial sampling variance, so an exact posterior scores 0 in expectation
  whatever the numbers of data sets and draws (no Monte Carlo floor). The ECDF's deviation is of
  first order in a width error and in a shift (means shrunk toward the prior), where the
  coverage of central intervals is of second order in a shift; squaring keeps deviations of
  opposite signs at different ranks from cancelling.
* :func:`calls_to_target`: the simulator calls at which a C2ST-versus-calls curve first reaches a
  target (linear in log10 calls between grid points); :func:`calls_to_target_per_unit` reads it
  off each observation's own curve (log10 calls per observation, the units of the claim);
  :func:`worst_case_for_censored` gives the method's units that never reached the target the top
  of the baseline's grid, so that they count as no saving (never as an S-fold one).
"""
from __future__ import annotations

import math

import numpy as np


def c2st_quadratic(x: np.ndarray, ref: np.ndarray, seed: int = 0, n_folds: int = 5) -> float:
    """Cross-validated accuracy of a quadratic logistic classifier separating ``x`` from ``ref``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures, StandardScaler

    x, ref = np.asarray(x, float), np.asarray(ref, float)
    m, s = ref.mean(0), ref.std(0)
    s = np.where(s < 1e-12, 1.0, s)
    data = np.concatenate([(x - m) / s, (ref - m) / s])
    target = np.concatenate([np.ones(len(x)), np.zeros(len(ref))])
    clf = make_pipeline(PolynomialFeatures(2, include_bias=False), StandardScaler(),
                        LogisticRegression(C=1.0, max_iter=2000))
    cv = KFold(n_splits=n_folds, shuffle=True, random_state=seed)
    return float(cross_val_score(clf, data, target, cv=cv, scoring="accuracy").mean())


def coverage_error(ranks: np.ndarray, n_draws: int) -> float:
    """Mean over levels 0.05..0.95 and dimensions of |coverage - level| (central intervals)."""
    from ...blocks.gen_metrics import expected_coverage

    levels, cov = expected_coverage(ranks, n_draws)
    return float(np.abs(cov - levels[:, None]).mean())


def site_summaries(x: np.ndarray, G: int, Lp: int) -> np.ndarray:
    """The statistic of the data each parameter is stratified by: for the global parameters the mean
    of all observations, for site s's parameters the mean of site s's observation. x (n, S, X) ->
    (n, G + S * Lp), in the order of the parameters (g, l_1..S)."""
    n, s = x.shape[:2]
    site = x.reshape(n, s, -1).mean(axis=2)
    return np.concatenate([np.repeat(site.mean(axis=1, keepdims=True), G, axis=1), np.repeat(site, Lp, axis=1)], axis=1)


def conditional_ecdf_excess(ranks: np.ndarray, n_draws: int, summary: np.ndarray, n_strata: int = 3) -> float:
    """Mean over dimensions, ``n_strata`` equal-count strata of a statistic of the data and ranks
    m = 1..L of (F^(m) - p_m)^2 - p_m (1 - p_m) / n_k, where F^(m) is the fraction of the n_k
    ranks of the stratum below m and p_m = m / (L + 1) its value under exact calibration (ranks
    uniform on {0..L}, independent of the data). Each term has expectation 0 for an exact
    posterior (the binomial variance of F^ is subtracted), so the mean is 0 up to sampling noise
    and positive for any miscalibration given the data. ``summary``: (n,) one statistic per data
    set for every dimension, or (n, d) one per dimension (:func:`site_summaries`)."""
    ranks = np.asarray(ranks)
    ranks = ranks[:, None] if ranks.ndim == 1 else ranks
    summary = np.asarray(summary, float)
    if summary.ndim == 1:
        summary = np.repeat(summary[:, None], ranks.shape[1], axis=1)
    m = np.arange(1, n_draws + 1)
    p = m / (n_draws + 1)
    terms = []
    for j in range(ranks.shape[1]):
        order = np.argsort(summary[:, j], kind="stable")
        for idx in np.array_split(order, n_strata):
            ecdf = (ranks[idx, j][:, None] < m[None, :]).mean(axis=0)
            terms.append(np.mean((ecdf - p) ** 2 - p * (1 - p) / len(idx)))
    return float(np.mean(terms))


def calls_to_target_per_unit(calls, c2st_units, target: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`calls_to_target` for every unit (observation) on its own C2ST-versus-calls curve:
    ``c2st_units`` (n_budgets, n_units) in the order of ``calls``. Returns (log10 calls, reached)
    per unit, in unit order: the read-off averages over observations on a log scale (a geometric
    mean of the calls), and per-unit values let the platform bootstrap it over observations."""
    c2st_units = np.asarray(c2st_units, float)
    out = [calls_to_target(calls, c2st_units[:, i], target) for i in range(c2st_units.shape[1])]
    return np.log10([c for c, _ in out]), np.array([float(r) for _, r in out])


def worst_case_for_censored(log_calls, reached, ceiling: float) -> np.ndarray:
    """The method's per-unit read-off for a calls *ratio* against a baseline whose grid ends at
    ``ceiling`` calls: a unit that never reached the target inside the method's own grid (its
    read-off is only a lower bound, the grid's top) is given log10(``ceiling``), the most the
    baseline's read-off can be. Its difference baseline - method is then <= 0: a censored unit can
    never count as a saving (at the grid's top it would count log10(ceiling / own top), an S-fold
    saving for nothing). Reached units are unchanged."""
    log_calls = np.array(log_calls, float)
    reached = np.asarray(reached, bool)
    if log_calls.size and math.log10(ceiling) < log_calls.max() - 1e-12:
        raise ValueError("ceiling below the method's own read-offs")
    log_calls[~reached] = math.log10(ceiling)
    return log_calls


def calls_to_target(calls, c2st, target: float) -> tuple[float, bool]:
    """Simulator calls at which the C2ST curve (one value per budget, increasing ``calls``) first
    reaches ``target``, interpolating linearly in log10(calls) between the bracketing budgets.

    Censored at the grid's ends: below the target already at the smallest budget -> that budget
    (an upper bound); never below it -> the largest budget (a lower bound), with ``reached`` False.
    """
    calls, c2st = np.asarray(calls, float), np.asarray(c2st, float)
    order = np.argsort(calls)
    calls, c2st = calls[order], c2st[order]
    if c2st[0] <= target:
        return float(calls[0]), True
    for i in range(1, len(calls)):
        if c2st[i] <= target:
            a, b = math.log10(calls[i - 1]), math.log10(calls[i])
            frac = (c2st[i - 1] - target) / (c2st[i - 1] - c2st[i])
            return float(10 ** (a + frac * (b - a))), True
    return float(calls[-1]), False
