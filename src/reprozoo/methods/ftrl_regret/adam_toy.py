"""Adam with two discounts (beta1, beta2) on a drifting, stochastic, non-convex, non-smooth objective.

Adam read as discounted FTRL (Ahn & Cutkosky 2024; the paper's Section on Adam): the update is the
FTRL solution of the online linear game <g_t, Delta> with the gradients discounted by beta1 and a
scale-free regulariser discounted by beta2,
    m_t = beta1 m_{t-1} + (1-beta1) g_t,   v_t = beta2 v_{t-1} + (1-beta2) g_t^2,
    Delta_t = -lr * m_hat_t / sqrt(v_hat_t)     (hat: Adam's bias correction),
so 1-beta1 plays the role of the discount 1-beta of the reduction: forgetting costs (1-beta1) per
round (noise is averaged over only ~1/(1-beta1) gradients), tracking a moving target costs
~ P_T / (1-beta1) (momentum lags behind the drift). The clipped variant bounds each coordinate of
Delta_t by lr (the analysis' ||Delta|| <= D); clip-free Adam is bounded only through beta1^2 < beta2
(Cauchy-Schwarz: |m_t| / sqrt(v_t) <= (1-beta1) / sqrt((1-beta2)(1 - beta1^2/beta2))).

Objective (per coordinate, averaged over d coordinates), minimum 0 at x = c_t:
    F_t(x) = mean_i log(1 + |x_i - c_{t,i}|),   c_{t,i} = A sin(2 pi f t / T + phi_i),
non-convex and non-smooth at the minimiser, drifting with f cycles over the run; the stochastic
subgradient adds N(0, sigma^2) noise. Measured: mean over the last 3/4 of the run of F_t(x_t),
the per-round dynamic regret against the moving minimiser.
"""
from __future__ import annotations

import numpy as np


def adam_bound(beta1: float, beta2: float) -> float:
    """Largest |m_t| / sqrt(v_t) of clip-free Adam (no bias correction) when beta1^2 < beta2."""
    if beta1**2 >= beta2:
        return float("inf")
    return (1.0 - beta1) / np.sqrt((1.0 - beta2) * (1.0 - beta1**2 / beta2))


def objective(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.log1p(np.abs(x - c)).mean(axis=-1)


def subgradient(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    r = x - c
    return np.sign(r) / (1.0 + np.abs(r))


def run_adam_grid(beta1s, beta2s, clipped: bool, cycles: float, cfg: dict, rng: np.random.Generator):
    """Tracking error F_t(x_t) averaged over the last 3/4 of the run, for every (beta1, beta2).

    All pairs see the same target path and the same gradient noise (common random numbers).
    Returns an array (len(beta1s), len(beta2s)).
    """
    T, d, lr, sigma, amp = cfg["T"], cfg["d"], cfg["lr"], cfg["noise"], cfg["amplitude"]
    b1, b2 = np.meshgrid(np.asarray(beta1s, float), np.asarray(beta2s, float), indexing="ij")
    b1, b2 = b1.reshape(-1, 1), b2.reshape(-1, 1)
    phase = rng.uniform(0, 2 * np.pi, d)
    noise = rng.standard_normal((T, d))
    x = np.zeros((len(b1), d))
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    err = np.zeros(len(b1))
    t0 = T // 4
    for t in range(T):
        c = amp * np.sin(2 * np.pi * cycles * t / T + phase)
        if t >= t0:
            err += objective(x, c)
        g = subgradient(x, c) + sigma * noise[t]
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        step = (m / (1 - b1 ** (t + 1))) / (np.sqrt(v / (1 - b2 ** (t + 1))) + 1e-12)
        if clipped:
            step = np.clip(step, -1.0, 1.0)
        x = x - lr * step
    return (err / (T - t0)).reshape(len(beta1s), len(beta2s))
