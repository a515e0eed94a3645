"""The paper's measurements of connectivity and dynamics, on numpy arrays.

- effective rank (Roy & Vetterli 2007): exp(H(p)), p_i = s_i / sum_j s_j over the singular
  values s of a matrix; N for a matrix with equal singular values, 1 for a rank-1 matrix.
- participation ratio of activity: (sum_i l_i)^2 / sum_i l_i^2 over the eigenvalues l of the
  covariance of the hidden rates (samples = time steps x trials); the number of dimensions the
  dynamics occupy, between 1 and N.
- Hill estimator of the tail index alpha from the k largest values x_(1) >= ... >= x_(k+1):
  1 / alpha = (1/k) sum_{i<=k} log(x_(i) / x_(k+1)); a Pareto law with P(X > x) ~ x^-alpha has
  alpha, lighter tails give larger values (half-normal: alpha grows with the sample).
"""
from __future__ import annotations

import numpy as np


def effective_rank(mat: np.ndarray) -> float:
    s = np.linalg.svd(np.asarray(mat, float), compute_uv=False)
    s = s[s > s.max() * 1e-12] if s.max() > 0 else s
    if s.size == 0 or s.sum() == 0:
        return 0.0
    p = s / s.sum()
    return float(np.exp(-np.sum(p * np.log(p))))


def participation_ratio(rates: np.ndarray) -> float:
    """rates: (..., N) samples of the N-dimensional activity."""
    x = np.asarray(rates, float).reshape(-1, np.shape(rates)[-1])
    lam = np.clip(np.linalg.eigvalsh(np.cov(x, rowvar=False)), 0.0, None)
    return float(lam.sum() ** 2 / np.sum(lam**2)) if lam.sum() > 0 else 0.0


def hill_tail_index(values: np.ndarray, k_frac: float = 0.1) -> float:
    x = np.sort(np.abs(np.asarray(values, float).ravel()))[::-1]
    x = x[x > 0]
    k = max(2, int(k_frac * x.size))
    if x.size <= k:
        return float("nan")
    return float(1.0 / np.mean(np.log(x[:k] / x[k])))
