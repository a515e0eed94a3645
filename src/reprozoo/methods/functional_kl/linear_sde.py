"""Linear (Ornstein-Uhlenbeck) SDEs: exact grid sampling and the closed-form path-space KL.

An SDE dX = (A X + c) dt + sigma dW on [0, T], X_0 ~ N(m0, S0), X in R^D, has Gaussian paths.
Its transition over a step h is exact (Van Loan's block exponential)::

    X_{t+h} | X_t ~ N(F X_t + g, Q),  F = e^{Ah},  g = int_0^h e^{As} c ds,
    Q = sigma^2 int_0^h e^{As} e^{A^T s} ds,

and its moments obey m' = A m + c, S' = A S + S A^T + sigma^2 I.

Two such SDEs P, Q with the SAME sigma and the same initial law have mutually absolutely
continuous path measures. Girsanov's theorem gives the path-space KL in closed form::

    KL(P || Q) = 1/(2 sigma^2) int_0^T E_P |b_P(X_t) - b_Q(X_t)|^2 dt
               = 1/(2 sigma^2) int_0^T ( |dA m_t + dc|^2 + tr(dA S_t dA^T) ) dt,

with dA = A_P - A_Q, dc = c_P - c_Q and (m_t, S_t) the moments under P (the time integral of a
closed-form integrand is done by adaptive quadrature to 1e-10). On a time grid t_1..t_M the path
vector is one Gaussian N(mu, Sigma), Cov(X_ti, X_tj) = e^{A(tj - ti)} S_ti (tj >= ti); the grid KL
is the Gaussian KL and increases to the path KL as the grid is refined (data processing).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.integrate import quad
from scipy.linalg import expm


@dataclass(frozen=True)
class LinearSDE:
    A: np.ndarray      # (D, D) drift matrix
    c: np.ndarray      # (D,) drift offset
    sigma: float       # isotropic diffusion coefficient
    m0: np.ndarray     # (D,) initial mean
    S0: np.ndarray     # (D, D) initial covariance

    @classmethod
    def ou(cls, theta: float = 0.0, mu: float = 0.0, sigma: float = 1.0, m0: float = 0.0, s0: float = 0.1,
           drift: float = 0.0) -> "LinearSDE":
        """Scalar dX = (theta (mu - X) + drift) dt + sigma dW (theta = 0: Brownian motion with drift)."""
        return cls(np.array([[-theta]]), np.array([theta * mu + drift]), sigma, np.array([m0]), np.array([[s0**2]]))

    @property
    def dim(self) -> int:
        return len(self.c)

    def transition(self, h: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(F, g, Q) of the exact step of length h (Van Loan block exponentials)."""
        D = self.dim
        # mean part: exp([[A, c], [0, 0]] h) = [[F, g], [0, 1]]
        Ma = np.zeros((D + 1, D + 1))
        Ma[:D, :D], Ma[:D, D] = self.A, self.c
        E = expm(Ma * h)
        F, g = E[:D, :D], E[:D, D]
        # covariance part: exp([[-A, s^2 I], [0, A^T]] h) = [[., G], [0, F^T]], Q = F G
        Mc = np.zeros((2 * D, 2 * D))
        Mc[:D, :D], Mc[:D, D:], Mc[D:, D:] = -self.A, self.sigma**2 * np.eye(D), self.A.T
        Ec = expm(Mc * h)
        Q = F @ Ec[:D, D:]
        return F, g, 0.5 * (Q + Q.T)

    def moments(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        F, g, Q = self.transition(t)
        return F @ self.m0 + g, F @ self.S0 @ F.T + Q

    def grid_gaussian(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean (M*D,) and covariance (M*D, M*D) of the path on the grid ts, time-major."""
        D, M = self.dim, len(ts)
        mus, Ss = zip(*(self.moments(float(t)) for t in ts))
        cov = np.zeros((M * D, M * D))
        for i in range(M):
            for j in range(i, M):
                F = expm(self.A * (ts[j] - ts[i]))
                block = F @ Ss[i]
                cov[j * D:(j + 1) * D, i * D:(i + 1) * D] = block
                cov[i * D:(i + 1) * D, j * D:(j + 1) * D] = block.T
        return np.concatenate(mus), cov

    def sample_paths(self, ts: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """n exact paths on the grid ts: (n, M, D)."""
        D = self.dim
        x = rng.multivariate_normal(self.m0, self.S0, size=n) if n else np.zeros((0, D))
        out = [x]
        for h in np.diff(ts):
            F, g, Q = self.transition(float(h))
            L = np.linalg.cholesky(Q + 1e-300 * np.eye(D))
            x = x @ F.T + g + rng.standard_normal((n, D)) @ L.T
            out.append(x)
        return np.stack(out, axis=1)


def girsanov_kl(P: LinearSDE, Q: LinearSDE, T: float = 1.0) -> float:
    """Closed-form path-space KL(P || Q) on [0, T] (same sigma and initial law required)."""
    if not np.isclose(P.sigma, Q.sigma):
        raise ValueError("path measures with different diffusion coefficients are mutually singular (KL = inf)")
    if not (np.allclose(P.m0, Q.m0) and np.allclose(P.S0, Q.S0)):
        raise ValueError("girsanov_kl assumes the same initial law for P and Q")
    dA, dc = P.A - Q.A, P.c - Q.c

    def integrand(t):
        m, S = P.moments(t)
        r = dA @ m + dc
        return float(r @ r + np.trace(dA @ S @ dA.T))

    val, _ = quad(integrand, 0.0, T, epsabs=1e-11, epsrel=1e-10, limit=200)
    return val / (2.0 * P.sigma**2)


def gaussian_kl(m_p: np.ndarray, S_p: np.ndarray, m_q: np.ndarray, S_q: np.ndarray) -> float:
    """KL(N(m_p, S_p) || N(m_q, S_q)) in nats."""
    Lq = np.linalg.cholesky(S_q)
    Lp = np.linalg.cholesky(S_p)
    A = np.linalg.solve(Lq, Lp)
    dm = np.linalg.solve(Lq, m_q - m_p)
    return 0.5 * (float(np.sum(A**2)) + float(dm @ dm) - len(m_p)
                  + 2.0 * float(np.sum(np.log(np.diag(Lq))) - np.sum(np.log(np.diag(Lp)))))
