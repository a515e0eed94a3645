"""Hierarchical simulators with exchangeable sites, and an exact count of their calls.

Both models share one structure (the one TFMPE is built for):

    g   ~ p(g)                      global parameters, shape (G,)
    l_s ~ p(l | g),  s = 1..S       site (local) parameters, exchangeable, shape (Lp,)
    x_s ~ p(x | g, l_s)             site observation, shape (X,), independent across sites given (g, l_s)

so the likelihood factorises over sites, p(x_1..S | g, l_1..S) = prod_s p(x_s | g, l_s). That is
what likelihood factorisation (LF) exploits: p(x | g, l) can be learned from SINGLE-site
simulations and then used to assemble synthetic S-site data sets.

One simulator call = the simulation of one site (one draw of x_s). ``Simulator.calls`` counts
every site ever simulated through :meth:`simulate`; drawing parameters from the prior is free.

* :class:`HierarchicalGaussian` (conjugate): g = mu ~ N(0, s_mu^2), l_s = theta_s ~ N(mu, tau^2),
  x_s = theta_s + sigma * eps, eps ~ N(0, I_K) (K replicates per site). The posterior over
  z = (mu, theta_1..S) is Gaussian and known in closed form (:meth:`posterior`).
* :class:`HierarchicalSIR` (SIR-like, intractable likelihood): g = (log beta_bar, log gamma),
  l_s = log beta_s ~ N(log beta_bar, tau^2); each site runs a discrete-time chain-binomial SIR
  epidemic in a population of N for T days from I_0 infected and reports log(1 + new infections)
  per day: a function-valued (length-T) observation per site.
"""
from __future__ import annotations

import numpy as np


class Simulator:
    """Base: prior over (g, l_1..S) and a site simulator whose calls are counted exactly."""

    G: int
    Lp: int
    X: int
    names_global: tuple[str, ...]
    names_local: tuple[str, ...]

    def __init__(self):
        self.calls = 0

    def sample_global(self, n: int, rng: np.random.Generator) -> np.ndarray:  # (n, G)
        raise NotImplementedError

    def sample_local(self, g: np.ndarray, n_sites: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError  # (n, S, Lp)

    def _simulate_sites(self, g: np.ndarray, l: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError  # g (m, G), l (m, Lp) -> x (m, X)

    def simulate(self, g: np.ndarray, l: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """x (n, S, X) for g (n, G), l (n, S, Lp); adds n * S to ``calls`` (one call per site)."""
        n, s = l.shape[:2]
        gs = np.repeat(g, s, axis=0)
        x = self._simulate_sites(gs, l.reshape(n * s, self.Lp), rng)
        self.calls += n * s
        return x.reshape(n, s, self.X)

    def sample_prior(self, n: int, n_sites: int, rng: np.random.Generator):
        g = self.sample_global(n, rng)
        return g, self.sample_local(g, n_sites, rng)

    def sample_joint(self, n: int, n_sites: int, rng: np.random.Generator):
        """(g, l, x) from the full generative model: n data sets of n_sites sites (n * n_sites calls)."""
        g, l = self.sample_prior(n, n_sites, rng)
        return g, l, self.simulate(g, l, rng)


class HierarchicalGaussian(Simulator):
    """Conjugate hierarchical Gaussian: mu -> theta_s -> x_s (K replicates); analytic posterior."""

    G, Lp = 1, 1
    names_global, names_local = ("mu",), ("theta",)

    def __init__(self, s_mu: float = 1.0, tau: float = 0.5, sigma: float = 0.5, replicates: int = 2):
        super().__init__()
        self.s_mu, self.tau, self.sigma, self.X = s_mu, tau, sigma, replicates

    def sample_global(self, n, rng):
        return self.s_mu * rng.standard_normal((n, 1))

    def sample_local(self, g, n_sites, rng):
        return g[:, None, :] + self.tau * rng.standard_normal((len(g), n_sites, 1))

    def _simulate_sites(self, g, l, rng):
        return l + self.sigma * rng.standard_normal((len(l), self.X))

    def prior_cov(self, n_sites: int) -> np.ndarray:
        """Cov of z = (mu, theta_1..S): Var mu = s_mu^2, Cov(theta_s, theta_r) = s_mu^2 + tau^2 [s=r]."""
        c = np.full((n_sites + 1, n_sites + 1), self.s_mu**2)
        c[1:, 1:] += self.tau**2 * np.eye(n_sites)
        return c

    def posterior(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean (S+1,) and covariance of p(mu, theta_1..S | x) for one data set x (S, K).

        Prior z ~ N(0, C0); the site means xbar_s = mean_k x_sk are sufficient, xbar_s | theta_s ~
        N(theta_s, sigma^2 / K). Precision P = C0^{-1} + H^T R^{-1} H with H selecting the thetas,
        mean = P^{-1} H^T R^{-1} xbar (the prior mean is 0).
        """
        s, k = x.shape
        prec = np.linalg.inv(self.prior_cov(s))
        lik = k / self.sigma**2
        prec[1:, 1:] += lik * np.eye(s)
        cov = np.linalg.inv(prec)
        rhs = np.zeros(s + 1)
        rhs[1:] = lik * x.mean(axis=1)
        return cov @ rhs, 0.5 * (cov + cov.T)

    def site_moments(self, g: np.ndarray, l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd (m, K) of the site law x | g, l for l (m, Lp): theta + sigma * eps."""
        return np.repeat(l[:, :1], self.X, axis=1), np.full((len(l), self.X), self.sigma)

    def sample_posterior(self, x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """n exact posterior draws (n, S+1), ordered (mu, theta_1..S)."""
        mean, cov = self.posterior(x)
        return mean + rng.standard_normal((n, len(mean))) @ np.linalg.cholesky(cov).T


class HierarchicalSIR(Simulator):
    """Chain-binomial SIR per site; shared mean transmission and recovery rate, site transmission."""

    G, Lp = 2, 1
    names_global, names_local = ("log_beta_bar", "log_gamma"), ("log_beta",)

    def __init__(self, days: int = 8, population: int = 500, infected0: int = 5, tau: float = 0.3,
                 log_beta_bar: tuple[float, float] = (-0.3, 0.3), log_gamma: tuple[float, float] = (-1.2, 0.2)):
        super().__init__()
        self.X = days
        self.population, self.infected0, self.tau = population, infected0, tau
        self.prior_beta, self.prior_gamma = log_beta_bar, log_gamma  # (mean, sd) of normal priors

    def sample_global(self, n, rng):
        b = self.prior_beta[0] + self.prior_beta[1] * rng.standard_normal(n)
        c = self.prior_gamma[0] + self.prior_gamma[1] * rng.standard_normal(n)
        return np.stack([b, c], axis=1)

    def sample_local(self, g, n_sites, rng):
        return g[:, None, :1] + self.tau * rng.standard_normal((len(g), n_sites, 1))

    def _simulate_sites(self, g, l, rng):
        """S_t -> S_t - new, I_t -> I_t + new - rec; new ~ Bin(S_t, 1 - exp(-beta I_t / N)), rec ~ Bin(I_t, 1 - exp(-gamma))."""
        m, n_pop = len(l), self.population
        beta, gamma = np.exp(l[:, 0]), np.exp(g[:, 1])
        sus = np.full(m, n_pop - self.infected0, dtype=np.int64)
        inf = np.full(m, self.infected0, dtype=np.int64)
        p_rec = 1.0 - np.exp(-gamma)
        out = np.empty((m, self.X))
        for t in range(self.X):
            new = rng.binomial(sus, 1.0 - np.exp(-beta * inf / n_pop))
            rec = rng.binomial(inf, p_rec)
            sus, inf = sus - new, inf + new - rec
            out[:, t] = np.log1p(new)
        return out


def make_model(name: str, cfg: dict | None = None) -> Simulator:
    cfg = dict(cfg or {})
    if name == "gaussian":
        return HierarchicalGaussian(**cfg)
    if name == "sir":
        return HierarchicalSIR(**cfg)
    raise ValueError(f"unknown hierarchical model {name!r}; one of 'gaussian', 'sir'")
