"""The two ERMs of the miniature: ridge (closed form) and L2-regularised logistic (Newton).

Both minimise  sum_a c_a l(y_a, w.x_a / sqrt(d)) + lam/2 ||w||^2  over w in R^d, with sample
weights c_a in {0, 1} given by a selection rule; predictions z = X w / sqrt(d).
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.special import expit


def ridge(X: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """argmin sum (y - w.x/sqrt d)^2 / 2 + lam/2 ||w||^2, solved in the smaller of the primal
    (d x d) and dual (n x n) systems; both are exact."""
    n, d = X.shape
    Xs = X / np.sqrt(d)
    if n >= d:
        return cho_solve(cho_factor(Xs.T @ Xs + lam * np.eye(d)), Xs.T @ y)
    return Xs.T @ cho_solve(cho_factor(Xs @ Xs.T + lam * np.eye(n)), y)


def logistic(X: np.ndarray, y: np.ndarray, lam: float, tol: float = 1e-10, max_iter: int = 100) -> np.ndarray:
    """argmin sum log(1 + exp(-y w.x/sqrt d)) + lam/2 ||w||^2 by Newton's method (strictly convex
    for lam > 0; stops when the Newton decrement is below tol)."""
    n, d = X.shape
    Xs = X / np.sqrt(d)
    w = np.zeros(d)
    for _ in range(max_iter):
        z = Xs @ w
        p = expit(-y * z)                       # = -l'(z) * y
        grad = -Xs.T @ (y * p) + lam * w
        h = p * (1.0 - p)
        H = (Xs.T * h) @ Xs + lam * np.eye(d)
        step = cho_solve(cho_factor(H), grad)
        w -= step
        if grad @ step < tol:
            break
    return w


def fit(loss: str, X, y, lam):
    if loss == "square":
        return ridge(X, y, lam)
    if loss == "logistic":
        return logistic(X, y, lam)
    raise ValueError(f"unknown loss '{loss}' (square, logistic)")


def population_error(w: np.ndarray, r: float) -> float:
    """Exact population error P(y w.x < 0) = Phi(-m/sqrt q) for x = y mu/sqrt d + z, mu = r sqrt(d) e1
    (m = w.mu/d = r w_1/sqrt d, q = ||w||^2/d): no test-sample noise."""
    from scipy.stats import norm

    d = len(w)
    m = r * w[0] / np.sqrt(d)
    q = w @ w / d
    return float(norm.cdf(-m / np.sqrt(q)))
