"""Online learners of the miniature, each run as K copies at once (one per discount or step size).

Discounted FTRL (the method). With discount beta in (0, 1], round t plays
    w_t = argmin_w  sum_{s<t} beta^{t-s} l_s(w) + (lam/2) ||w||^2   (+ the round's own x_t for VAW)
beta = 1 is ordinary (undiscounted) FTRL, the baseline that never forgets.
  * linear regression: the discounted Vovk-Azoury-Warmuth forecaster (Jacobsen & Cutkosky 2024),
        S_t = beta S_{t-1} + x_t x_t^T,  r_t = beta r_{t-1} + y_t x_t,
        w_t = (lam I + S_t)^{-1} beta r_{t-1},   y_hat_t = clip(<w_t, x_t>, -Y, Y).
    The VAW trick is that x_t enters S_t before y_t is seen.
  * logistic regression: FTRL on the second-order (Newton) surrogates of the logistic losses,
        q_s(w) = <g_s, w - w_s> + h_s/2 <x_s, w - w_s>^2,  h_s = sigma(z_s)(1 - sigma(z_s)),
    discounted by beta and solved in closed form, then projected on the ball ||w|| <= B. One
    d x d solve per round; for exp-concave losses this is the FTRL form the analysis covers.

Online gradient descent (baseline): w_{t+1} = Proj_{||w||<=R}(w_t - eta grad l_t(w_t)).

Ensembles (learning the discount / step size on the fly): the experts above on a geometric grid,
aggregated by exponentially weighted averaging with fixed share (Herbster & Warmuth), which
tracks the best expert of each stretch; predictions are mixed (squared loss: exp-concave mixing
of predictions; log loss: mixture of probabilities, 1-mixable).
"""
from __future__ import annotations

import numpy as np


def sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def loss(task: str, pred: np.ndarray, y: float) -> np.ndarray:
    """Linear: pred = y_hat, loss 1/2 (y - y_hat)^2. Logistic: pred = P(y=+1), log loss.
    ``pred`` and ``y`` broadcast (one round's K experts, or a whole stream)."""
    if task == "linear":
        return 0.5 * (y - pred) ** 2
    p = np.clip(np.where(np.asarray(y) > 0, pred, 1.0 - pred), 1e-12, 1.0)
    return -np.log(p)


def comparator_losses(task: str, stream: dict) -> np.ndarray:
    z = np.einsum("...d,...d->...", stream["x"], stream["u"])
    if task == "linear":
        return 0.5 * (stream["y"] - z) ** 2
    return np.logaddexp(0.0, -stream["y"] * z)


def run_discounted_ftrl(task: str, stream: dict, betas, lam: float, bound: float) -> np.ndarray:
    """Predictions (T, K) of discounted FTRL with the K discounts ``betas`` (beta = 1: FTRL)."""
    return run_discounted_ftrl_batch(task, stream["x"][None], stream["y"][None],
                                     np.asarray(betas, float)[None], lam, bound)[0]


def run_discounted_ftrl_batch(task: str, x_all: np.ndarray, y_all: np.ndarray, betas: np.ndarray,
                              lam: float, bound: float) -> np.ndarray:
    """N streams of one length at once: x (N, T, d), y (N, T), discounts (N, K) -> predictions (N, T, K).
    Every (stream, discount) pair is an independent learner; batching only amortises the round loop."""
    N, T, d = x_all.shape
    beta = np.asarray(betas, dtype=float).reshape(N, -1)
    K = beta.shape[1]
    bm = beta[..., None, None]
    S = np.zeros((N, K, d, d))
    r = np.zeros((N, K, d))
    eye = lam * np.eye(d)
    preds = np.empty((N, T, K))
    w = np.zeros((N, K, d))
    for t in range(T):
        x, y = x_all[:, t], y_all[:, t]                      # (N, d), (N,)
        xx = (x[:, :, None] * x[:, None, :])[:, None]         # (N, 1, d, d)
        xk = x[:, None, :]                                    # (N, 1, d)
        if task == "linear":
            S = bm * S + xx
            w = np.linalg.solve(S + eye, (beta[..., None] * r)[..., None])[..., 0]
            preds[:, t] = np.clip(np.einsum("nkd,nd->nk", w, x), -bound, bound)
            r = beta[..., None] * r + (y[:, None] * x)[:, None]
        else:
            z = np.einsum("nkd,nd->nk", w, x)
            p = sigmoid(z)
            preds[:, t] = p
            g = (-y[:, None] * sigmoid(-y[:, None] * z))[..., None] * xk   # logistic gradient
            h = p * (1.0 - p)
            S = bm * S + h[..., None, None] * xx
            r = beta[..., None] * r + (h * z)[..., None] * xk - g         # sum beta^{t-s} (H_s w_s - g_s)
            w = np.linalg.solve(S + eye, r[..., None])[..., 0]
            nrm = np.linalg.norm(w, axis=-1, keepdims=True)
            w = w * np.minimum(1.0, bound / np.maximum(nrm, 1e-300))
    return preds


def run_ogd(task: str, stream: dict, etas, radius: float, bound: float) -> np.ndarray:
    """Predictions (T, K) of projected OGD with the K step sizes ``etas``."""
    return run_ogd_batch(task, stream["x"][None], stream["y"][None], np.asarray(etas, float)[None],
                         radius, bound)[0]


def run_ogd_batch(task: str, x_all: np.ndarray, y_all: np.ndarray, etas: np.ndarray, radius: float,
                  bound: float) -> np.ndarray:
    """N streams at once: x (N, T, d), y (N, T), steps (N, K) -> predictions (N, T, K)."""
    N, T, d = x_all.shape
    eta = np.asarray(etas, dtype=float).reshape(N, -1)[..., None]
    w = np.zeros((N, eta.shape[1], d))
    preds = np.empty((N, T, eta.shape[1]))
    for t in range(T):
        x, y = x_all[:, t], y_all[:, t]
        z = np.einsum("nkd,nd->nk", w, x)
        if task == "linear":
            preds[:, t] = np.clip(z, -bound, bound)
            g = (z - y[:, None])[..., None] * x[:, None, :]
        else:
            preds[:, t] = sigmoid(z)
            g = (-y[:, None] * sigmoid(-y[:, None] * z))[..., None] * x[:, None, :]
        w = w - eta * g
        nrm = np.linalg.norm(w, axis=-1, keepdims=True)
        w = w * np.minimum(1.0, radius / np.maximum(nrm, 1e-300))
    return preds


def fixed_share(task: str, preds: np.ndarray, y: np.ndarray, lr: float, share: float) -> np.ndarray:
    """Meta-learner over the K experts' predictions (T, K): fixed-share exponential weights."""
    return fixed_share_batch(task, preds[None], np.asarray(y)[None], lr, share)[0]


def fixed_share_batch(task: str, preds: np.ndarray, y: np.ndarray, lr: float, share: float) -> np.ndarray:
    """Fixed share over N streams at once: experts' predictions (N, T, K), labels (N, T) -> (N, T)."""
    N, T, K = preds.shape
    logw = np.full((N, K), -np.log(K))
    out = np.empty((N, T))
    for t in range(T):
        p = np.exp(logw - logw.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, t] = (p * preds[:, t]).sum(axis=1)
        logw = np.log(p) - lr * loss(task, preds[:, t], y[:, t, None])
        q = np.exp(logw - logw.max(axis=1, keepdims=True))
        q = (1.0 - share) * q / q.sum(axis=1, keepdims=True) + share / K
        logw = np.log(q)
    return out


# --- the theory's tuning (P_T known) and the grids the ensembles search -------------------------

def tuned_discount(T: int, d: int, P: float) -> float:
    """1 - beta = sqrt(P_T / (d T)): balances the reduction's forgetting cost (1-beta) d T
    against the tracking cost P_T / (1-beta); the dynamic regret is then O(sqrt(d T P_T))."""
    return 1.0 - float(np.clip(np.sqrt(max(P, 1e-12) / (d * T)), 1.0 / T, 0.5))


def discount_grid(T: int) -> np.ndarray:
    """1 - beta in {1/2, 1/4, ..., ~1/T}: a factor-2 grid covers every tuned discount."""
    k = np.arange(1, int(np.ceil(np.log2(T))) + 1)
    return 1.0 - 2.0 ** -k.astype(float)


def tuned_ogd_step(T: int, P: float, diameter: float, grad_bound: float) -> float:
    """Zinkevich's dynamic bound for projected OGD, R <= (7D^2/4 + D P_T)/eta + eta G^2 T / 2,
    minimised over eta: eta = sqrt((7 D^2 / 2 + 2 D P_T) / (G^2 T)); regret O(sqrt(T (1 + P_T)))."""
    return float(np.sqrt((3.5 * diameter**2 + 2 * diameter * P) / (grad_bound**2 * T)))


def ogd_step_grid(T: int, diameter: float, grad_bound: float) -> np.ndarray:
    """Factor-2 grid from the static step (P_T = 0) to the step for P_T = D T (Ader's grid)."""
    lo = tuned_ogd_step(T, 0.0, diameter, grad_bound)
    hi = tuned_ogd_step(T, diameter * T, diameter, grad_bound)
    n = int(np.ceil(np.log2(hi / lo))) + 1
    return lo * 2.0 ** np.arange(n)
