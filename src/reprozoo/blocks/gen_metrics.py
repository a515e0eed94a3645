"""Metrics of generative models and of simulation-based inference, defined once.

Boltzmann generators (samples x ~ q, target p ∝ exp(-E)):
* Kish effective sample size of the importance weights w = p/q, ESS = (Σw)^2 / (n Σw^2), reported
  NORMALISED to [1/n, 1] (1: q = p; 1/n: one sample carries all the weight). Computed from log
  weights, so the unknown log Z cancels.
* E-W2: the 2-Wasserstein distance between the 1-D distributions of ENERGIES of model samples and
  of reference samples (Klein et al. 2023 and later BG papers): sqrt of the 1-D optimal-transport
  cost with squared distance, computed from sorted quantiles by POT. Optional importance weights
  give the reweighted version.
* sample W2: exact discrete OT (POT's network simplex) with squared Euclidean cost, O(n^3): keep
  n in the low thousands.
* NLL of reference samples under the model, -mean log q(x).

SBI (posterior q(θ | x_o) against a reference posterior):
* C2ST: cross-validated accuracy of a classifier told to separate the two samples; 0.5 means
  indistinguishable, 1 means disjoint. sbi's implementation (random forest or MLP, z-scored by the
  first sample, 5-fold CV) - the number sbibm reports.
* SBC (Talts et al. 2018): for θ_i ~ prior, x_i ~ simulator(θ_i) and L posterior draws given x_i,
  the rank of θ_i among the draws is uniform on {0..L} for every dimension iff the posterior is
  exact (in the prior-averaged sense). ``sbc_uniformity_pvalue`` turns the discrete ranks into
  continuous U(0,1) variates by uniform jitter, (r + u)/(L + 1), which are exactly uniform under
  the null, and applies a KS test; ``expected_coverage`` gives, for each credibility level α, the
  fraction of θ_i inside the central α-interval of their posterior draws (the diagonal when calibrated;
  below it = over-confident).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch


def _np(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def kish_ess(log_w) -> float:
    """Normalised Kish ESS in [1/n, 1] from (unnormalised) log importance weights; non-finite -> 0 weight."""
    lw = _np(log_w).ravel()
    lw = np.where(np.isfinite(lw), lw, -np.inf)
    if not np.isfinite(lw).any():
        return 0.0
    w = np.exp(lw - lw.max())
    return float(w.sum() ** 2 / (len(w) * (w**2).sum()))


def log_importance_weights(log_p_unnorm, log_q) -> np.ndarray:
    """log w = log p~(x) - log q(x) (up to the constant log Z)."""
    return _np(log_p_unnorm) - _np(log_q)


def energy_w2(e_model, e_ref, weights=None, max_energy: float | None = None) -> float:
    """E-W2: W2 between the 1-D energy distributions (model samples vs reference samples).

    ``weights``: importance weights of the model samples (reweighted E-W2). ``max_energy`` drops
    model and reference energies above it (some papers cut high-energy outliers; off by default).
    Non-finite model energies are always dropped.
    """
    import ot

    em, er = _np(e_model).ravel(), _np(e_ref).ravel()
    wm = None if weights is None else _np(weights).ravel()
    keep = np.isfinite(em)
    if max_energy is not None:
        keep &= em <= max_energy
        er = er[er <= max_energy]
    em = em[keep]
    if wm is not None:
        wm = wm[keep] / wm[keep].sum()
    return float(math.sqrt(max(ot.wasserstein_1d(em, er, u_weights=wm, p=2), 0.0)))


def sample_w2(x, y) -> float:
    """Exact W2 between two empirical point clouds (n, d), (m, d): sqrt of emd2 with |x - y|^2 cost."""
    import ot

    xa, ya = _np(x), _np(y)
    xa, ya = xa.reshape(len(xa), -1), ya.reshape(len(ya), -1)
    cost = ot.dist(xa, ya, metric="sqeuclidean")
    a, b = np.full(len(xa), 1 / len(xa)), np.full(len(ya), 1 / len(ya))
    return float(math.sqrt(max(ot.emd2(a, b, cost, numItermax=10_000_000), 0.0)))


def nll(log_prob: Callable[[torch.Tensor], torch.Tensor] | torch.Tensor | np.ndarray, x=None,
        batch_size: int = 4096) -> float:
    """-mean log q(x): pass log q values, or a callable and the points (evaluated without gradient)."""
    if callable(log_prob):
        with torch.no_grad():
            vals = torch.cat([log_prob(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])
        return float(-vals.double().mean())
    return float(-_np(log_prob).mean())


def c2st(x, y, seed: int = 1, classifier: str = "rf", n_folds: int = 5, **kw) -> float:
    """Classifier two-sample test accuracy (sbi.utils.metrics.c2st): 0.5 same law, 1 disjoint."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sbi.utils.metrics import c2st as _c2st

        xt = torch.as_tensor(_np(x), dtype=torch.float32)
        yt = torch.as_tensor(_np(y), dtype=torch.float32)
        return float(_c2st(xt, yt, seed=seed, n_folds=n_folds, classifier=classifier, **kw))


def sbc_ranks(theta_true, posterior_samples) -> np.ndarray:
    """Ranks (N, d) in {0..L}: how many of the L draws (N, L, d) lie below the true θ (N, d)."""
    th, ps = _np(theta_true), _np(posterior_samples)
    if th.ndim == 1:
        th = th[:, None]
    if ps.ndim == 2:
        ps = ps[..., None]
    return (ps < th[:, None, :]).sum(axis=1)


def sbc_uniformity_pvalue(ranks, n_draws: int, seed: int = 0) -> np.ndarray:
    """Per-dimension KS p-value of H0 'ranks uniform on {0..L}' (jittered to U(0,1), exact under H0)."""
    from scipy.stats import kstest

    r = _np(ranks)
    r = r[:, None] if r.ndim == 1 else r
    u = (r + np.random.default_rng(seed).random(r.shape)) / (n_draws + 1)
    return np.array([kstest(u[:, j], "uniform").pvalue for j in range(r.shape[1])])


def expected_coverage(ranks, n_draws: int, levels: Sequence[float] | None = None):
    """(levels, coverage (n_levels, d)): fraction of θ in the central α-interval of their draws.

    θ lies in the central α-interval iff its (jittered-free) normalised rank r/L is within α/2 of
    1/2. Calibrated posteriors give coverage ≈ α; over-confident ones fall below the diagonal.
    """
    lv = np.linspace(0.05, 0.95, 19) if levels is None else np.asarray(levels, dtype=float)
    q = _np(ranks) / n_draws
    q = q[:, None] if q.ndim == 1 else q
    cov = np.stack([(np.abs(q - 0.5) <= a / 2).mean(axis=0) for a in lv])
    return lv, cov
