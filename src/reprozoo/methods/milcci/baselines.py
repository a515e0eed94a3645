"""The label-blind baselines the paper compares with: PCA, NMF (scikit-learn), CP (tensorly).

Each gets the training trials Y (M, N, T), the true number of components P and the same number
of restarts as MILCCI (best training fit kept), and returns the same three things:

- ``maps`` (N, P): one spatial map per component, shared by every trial (none of them can let a
  map depend on a label);
- ``traces`` (M, T, P): per-trial temporal traces (PCA scores, NMF activations, CP's temporal
  factor scaled by the trial factor: CP forces one trace shape per component for all trials);
- ``predict(Y_heldout, observed)``: the held-out trials' traces fitted on the observed channels
  only, with the maps (and for CP the temporal factor) fixed, then every channel predicted.

PCA and CP are signed, so recovery is scored with absolute correlations for every method.
NMF needs non-negative data: it gets max(Y, 0) (the noise makes a few entries negative).

``fit_nmf_percond`` is the label-aware matrix baseline: one rank-P NMF per condition (label
combination), so every condition gets its own P maps, as MILCCI does, but with nothing shared
between conditions. Its maps are (K, N, P). Separate fits number their components arbitrarily, so
each condition's fit is started from the pooled NMF (``fit_nmf``) and the conditions' components are
then put in one order: each condition's maps are matched (Hungarian, map correlation) to a consensus
map set, the mean of the aligned maps, started from the pooled fit and iterated until the order
stops changing. No planted quantity is used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class BaselineFit:
    maps: np.ndarray      # (N, P)
    traces: np.ndarray    # (M, T, P)
    predict: Callable[[np.ndarray, np.ndarray], np.ndarray]
    n_iter: int           # iterations the solver ran (for the budget report)


def unfold_time(Y: np.ndarray) -> np.ndarray:
    """(M, N, T) -> (M*T, N): time points of all trials as samples, channels as features."""
    M, N, T = Y.shape
    return Y.transpose(0, 2, 1).reshape(M * T, N)


def fit_pca(Y: np.ndarray, P: int, n_restarts: int = 1, seed: int = 0) -> BaselineFit:
    from sklearn.decomposition import PCA

    M, N, T = Y.shape
    pca = PCA(n_components=P, svd_solver="full").fit(unfold_time(Y))   # exact: restarts are moot
    W, mu = pca.components_.T, pca.mean_

    def predict(Yh, observed):
        out = np.empty_like(Yh)
        for m, y in enumerate(Yh):
            Z, *_ = np.linalg.lstsq(W[observed], y[observed] - mu[observed, None], rcond=None)
            out[m] = mu[:, None] + W @ Z
        return out

    traces = pca.transform(unfold_time(Y)).reshape(M, T, P)
    return BaselineFit(W, traces, predict, 1)


def fit_nmf(Y: np.ndarray, P: int, n_restarts: int = 3, seed: int = 0, max_iter: int = 2000,
            tol: float = 1e-6) -> BaselineFit:
    from scipy.optimize import nnls
    from sklearn.decomposition import NMF

    M, N, T = Y.shape
    X = np.maximum(unfold_time(Y), 0.0)
    best = None
    for r in range(n_restarts):
        model = NMF(n_components=P, init="nndsvda" if r == 0 else "random", random_state=seed + r,
                    max_iter=max_iter, tol=tol)
        Wt = model.fit_transform(X)
        if best is None or model.reconstruction_err_ < best[0].reconstruction_err_:
            best = (model, Wt)
    model, Wt = best
    H = model.components_.T  # (N, P)

    def predict(Yh, observed):
        out = np.empty_like(Yh)
        for m, y in enumerate(np.maximum(Yh, 0.0)):
            Z = np.stack([nnls(H[observed], y[observed, t])[0] for t in range(y.shape[1])], axis=1)
            out[m] = H @ Z
        return out

    return BaselineFit(H, Wt.reshape(M, T, P), predict, int(model.n_iter_))


def fit_cp(Y: np.ndarray, P: int, n_restarts: int = 3, seed: int = 0, n_iter_max: int = 2000,
           tol: float = 1e-9) -> BaselineFit:
    import tensorly as tl
    from tensorly.decomposition import parafac

    M, N, T = Y.shape
    X = tl.tensor(Y.transpose(1, 2, 0))  # channels x time x trials
    best = None
    for r in range(n_restarts):
        cp, errs = parafac(X, rank=P, init="svd" if r == 0 else "random", random_state=seed + r,
                           n_iter_max=n_iter_max, tol=tol, return_errors=True)
        if best is None or errs[-1] < best[1][-1]:
            best = (cp, errs)
    (w, (A, B, Cm)), errs = best
    A = np.asarray(A) * np.asarray(w)[None, :]
    B, Cm = np.asarray(B), np.asarray(Cm)

    def predict(Yh, observed):
        out = np.empty_like(Yh)
        for m, y in enumerate(Yh):
            design = np.stack([np.outer(A[observed, p], B[:, p]).ravel() for p in range(P)], axis=1)
            c, *_ = np.linalg.lstsq(design, y[observed].ravel(), rcond=None)
            out[m] = (A * c[None, :]) @ B.T
        return out

    traces = Cm[:, None, :] * B[None, :, :]
    return BaselineFit(A, traces, predict, len(errs))


@dataclass
class PerConditionFit:
    maps: np.ndarray      # (K, N, P): condition k's maps
    traces: np.ndarray    # (M, T, P)
    predict: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]   # (Y_heldout, cond_heldout, observed)
    n_iter: int
    n_capped: int = 0     # kept per-condition fits that stopped at max_iter rather than on tol


def fit_nmf_percond(Y: np.ndarray, cond: np.ndarray, n_conditions: int, P: int, n_restarts: int = 3,
                    seed: int = 0, max_iter: int = 2000, tol: float = 1e-6) -> PerConditionFit:
    """One rank-P NMF per condition, each the best of ``n_restarts`` starts (start 0: the pooled
    NMF's maps with NNLS activations; others random), components ordered as the pooled fit's."""
    from scipy.optimize import linear_sum_assignment, nnls
    from sklearn.decomposition import NMF

    from .recovery import abs_corr

    M, N, T = Y.shape
    pooled = fit_nmf(Y, P, n_restarts, seed, max_iter, tol)
    maps = np.zeros((n_conditions, N, P))
    traces = np.zeros((M, T, P))
    n_iter, n_capped = pooled.n_iter, 0
    for k in range(n_conditions):
        idx = np.flatnonzero(cond == k)
        X = np.maximum(unfold_time(Y[idx]), 0.0)                      # (|idx| T, N)
        best = None
        for r in range(n_restarts):
            model = NMF(n_components=P, init="custom" if r == 0 else "random", random_state=seed + 100 * k + r,
                        max_iter=max_iter, tol=tol)
            if r == 0:
                H0 = np.maximum(pooled.maps.T, 1e-6)                   # (P, N)
                W0 = np.maximum(np.stack([nnls(H0.T, x)[0] for x in X]), 1e-6)
                W = model.fit_transform(X, W=W0, H=H0)
            else:
                W = model.fit_transform(X)
            if best is None or model.reconstruction_err_ < best[0].reconstruction_err_:
                best = (model, W)
        model, W = best
        n_iter += int(model.n_iter_)
        n_capped += int(model.n_iter_ >= max_iter)
        maps[k] = model.components_.T                                  # (N, P)
        traces[idx] = W.reshape(len(idx), T, P)

    # one component order for all conditions: align every condition's maps to the consensus (mean of
    # the aligned unit-norm maps), starting from the pooled fit, until the order stops changing
    unit = maps / np.maximum(np.linalg.norm(maps, axis=1, keepdims=True), 1e-12)
    ref, orders = pooled.maps, None
    for _ in range(10):
        new = []
        for k in range(n_conditions):
            rows, cols = linear_sum_assignment(-abs_corr(unit[k], ref))   # own component -> consensus slot
            new.append(rows[np.argsort(cols)])
        if orders is not None and all(np.array_equal(a, b) for a, b in zip(orders, new)):
            break
        orders = new
        ref = np.mean([unit[k][:, o] for k, o in enumerate(orders)], axis=0)
    for k, o in enumerate(orders):
        maps[k] = maps[k][:, o]
        idx = np.flatnonzero(cond == k)
        traces[idx] = traces[idx][:, :, o]

    def predict(Yh, cond_h, observed):
        out = np.empty_like(Yh)
        for m, y in enumerate(np.maximum(Yh, 0.0)):
            H = maps[cond_h[m]]
            Z = np.stack([nnls(H[observed], y[observed, t])[0] for t in range(y.shape[1])], axis=1)
            out[m] = H @ Z
        return out

    return PerConditionFit(maps, traces, predict, n_iter, n_capped)
