"""Planted two-branch Gaussian-mixture path laws: the adequacy check of the FKL regressor.

Why (issue 25 review, blocker): on a law whose paths split into branches, a regressor that cannot
express the branch posterior returns the KL between moment-matched Gaussians, not the KL. Before
the non-Gaussian suite is read, the regressor must recover the KL of a law whose denoiser is known
in closed form and has exactly that structure: a mixture of two Gaussian path measures.

A law here is, on the path grid t_1..t_M (time-major vectors y in R^{M D}),

    y ~ sum_k pi_k N(m + b_k r, S),   r = (r(t_1), 0, r(t_2), 0, ...): a branch profile on X,

with b = (+1, -1) (the two branches), r(t) = amp sqrt(max(t - t_b, 0)) (the pitchfork's branch
mean, cf. bifurcation.py), and (m, S) the grid mean and covariance of the 2-D linear SDE
dX = -theta X dt + sigma dW_1, dY = v dt + sigma dW_2 (linear_sde.py). Within one law both branches
share S, so the gate features of fkl.py represent its noise predictor exactly (up to the fit of
the mixture). The KL between two such laws has no closed form; it is a Monte-Carlo mean of the
exact log-density ratio over ``n_mc`` samples of P (log-sum-exp over the two components).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .linear_sde import LinearSDE


@dataclass(frozen=True)
class BranchMixture:
    weight: float = 0.5   # pi_1, the weight of the + branch
    amp: float = 0.8      # branch amplitude (X mean +-amp sqrt(t - t_b))
    t_b: float = 0.2
    theta: float = 1.0    # OU rate of X within a branch
    v: float = 1.0
    sigma: float = 0.3
    s0: float = 0.1

    def components(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pi (2,), means (2, M*2), shared covariance (M*2, M*2)) on the grid ts."""
        sde = LinearSDE(np.diag([-self.theta, 0.0]), np.array([0.0, self.v]), self.sigma, np.zeros(2),
                        self.s0**2 * np.eye(2))
        m, S = sde.grid_gaussian(np.asarray(ts, float))
        r = np.zeros((len(ts), 2))
        r[:, 0] = self.amp * np.sqrt(np.maximum(np.asarray(ts) - self.t_b, 0.0))
        r = r.ravel()
        return np.array([self.weight, 1 - self.weight]), np.stack([m + r, m - r]), S

    def sample(self, ts: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """n paths (n, M, 2)."""
        pi, mu, S = self.components(ts)
        k = (rng.random(n) >= pi[0]).astype(int)
        y = mu[k] + rng.standard_normal((n, len(S))) @ np.linalg.cholesky(S).T
        return y.reshape(n, len(ts), 2)

    def log_density(self, y: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Exact log density of flattened paths y (n, M*2)."""
        pi, mu, S = self.components(ts)
        L = np.linalg.cholesky(S)
        logdet = 2.0 * np.sum(np.log(np.diag(L)))
        comp = []
        for k in (0, 1):
            u = np.linalg.solve(L, (y - mu[k]).T)
            comp.append(np.log(pi[k]) - 0.5 * np.sum(u**2, 0) - 0.5 * logdet - 0.5 * len(S) * np.log(2 * np.pi))
        c = np.stack(comp, 1)
        top = c.max(1)
        return top + np.log(np.exp(c - top[:, None]).sum(1))


def mixture_kl(P: BranchMixture, Q: BranchMixture, ts: np.ndarray, n: int, rng: np.random.Generator,
               batch: int = 50_000) -> tuple[float, float]:
    """KL(P || Q) on the grid ts: Monte-Carlo mean of log p - log q over n paths of P, and its standard error."""
    vals = []
    for start in range(0, n, batch):
        y = P.sample(ts, min(batch, n - start), rng).reshape(-1, 2 * len(ts))
        vals.append(P.log_density(y, ts) - Q.log_density(y, ts))
    v = np.concatenate(vals)
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v)))
