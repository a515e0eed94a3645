"""The functional KL estimator (FKL): KL between path measures from samples, by flow matching.

Paths are functions x: [0, T] -> R^D observed on a grid t_1..t_M, i.e. vectors in R^{M D}. A
Gaussian reference measure N(0, C) on path space, C = K (x) I_D with K a Matern-1/2 kernel on the
grid (the paper uses trace-class Matern covariances), defines the flow-matching interpolant::

    x_s = s x_1 + (1 - s) x_0,   x_1 ~ nu (a path measure),  x_0 ~ N(0, C),  s in [0, 1].

For two path measures nu^A, nu^B with velocity fields v^A_s, v^B_s of that interpolant::

    KL(nu^A || nu^B) = int_0^1 s / (1 - s) E_{x ~ mu^A_s} || v^A_s(x) - v^B_s(x) ||^2_{C^{-1}} ds

(the paper's Eq.; ||.||_{C^{-1}} is the Cameron-Martin norm of C). Equivalently, with the
denoiser D_s(x) = E[x_1 | x_s = x] (v = (D - x)/(1 - s)) and the signal-to-noise ratio
SNR = s^2/(1 - s)^2, lambda = log SNR::

    KL = 1/2 int SNR(lambda) E_{mu^A} || D^A - D^B ||^2_{C^{-1}} d lambda.

Implementation (ours; the paper trains neural-operator velocity fields): whiten paths with the
Cholesky factor of C (z = L^{-1} x makes the Cameron-Martin norm Euclidean and the noise N(0, I));
at each Gauss-Legendre node in lambda, regress x_1 on features of x_s by ridge least squares
(affine + random ReLU features; ``n_noise`` noise draws per path) - we predict the noise x_0,
an equivalent parametrisation, 1/2 SNR ||D^A - D^B||^2 = 1/2 ||eps^A - eps^B||^2 - once for A and B;
evaluate the squared difference on fresh interpolants of A. The s-range is truncated to
[s_min, s_max] = [0.01, 0.99] as in the paper's uniform scheme; the truncation makes the estimate
the KL between the two path measures smoothed by Gaussian noise of Cameron-Martin scale
(1 - s_max)/s_max, which stays finite even when one measure is singular (deterministic paths).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def matern12_kernel(ts: np.ndarray, length: float, variance: float, jitter: float = 1e-9) -> np.ndarray:
    """k(s, t) = variance * exp(-|s - t| / length): Matern nu = 1/2, Brownian-rough like SDE paths."""
    K = variance * np.exp(-np.abs(ts[:, None] - ts[None, :]) / length)
    return K + jitter * variance * np.eye(len(ts))


@dataclass
class Whitener:
    """z = (L^{-1} (x)) per output dimension, C = L L^T (x) I_D: the Cameron-Martin isometry."""
    L: np.ndarray  # (M, M)

    @classmethod
    def from_grid(cls, ts, length: float, variance: float) -> "Whitener":
        return cls(np.linalg.cholesky(matern12_kernel(np.asarray(ts, float), length, variance)))

    def __call__(self, paths: np.ndarray) -> np.ndarray:
        """(n, M, D) paths -> (n, M*D) whitened vectors."""
        n, M, D = paths.shape
        z = np.linalg.solve(self.L, paths.transpose(1, 0, 2).reshape(M, n * D))
        return z.reshape(M, n, D).transpose(1, 0, 2).reshape(n, M * D)


@dataclass
class FKLConfig:
    n_nodes: int = 24          # Gauss-Legendre nodes in lambda = log SNR
    s_min: float = 0.01        # paper's uniform scheme: s in [0.01, 0.99]
    s_max: float = 0.99
    n_noise: int = 8           # noise draws per path when fitting each denoiser
    n_features: int = 128      # random ReLU features (0: affine regression only)
    ridge: float = 1e-3        # ridge penalty, relative to the mean feature second moment
    feature_seed: int = 12345  # the same random features for A and B
    estimator: str = "plain"   # "plain": the paper's plug-in ||D^A - D^B||^2; "crossfit": ours, see below

    @classmethod
    def from_params(cls, p: dict | None) -> "FKLConfig":
        return cls(**{k: v for k, v in (p or {}).items() if k in cls.__dataclass_fields__})


def lambda_nodes(cfg: FKLConfig) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights in lambda = 2 log(s / (1 - s)) over [s_min, s_max]."""
    lo, hi = (2 * np.log(s / (1 - s)) for s in (cfg.s_min, cfg.s_max))
    x, w = np.polynomial.legendre.leggauss(cfg.n_nodes)
    return 0.5 * (hi - lo) * x + 0.5 * (hi + lo), 0.5 * (hi - lo) * w


class Features:
    """phi(x) = [1, x, relu(W x / sqrt(d) + b)] on standardised x: one map shared by A and B."""

    def __init__(self, dim: int, n_features: int, seed: int):
        rng = np.random.default_rng(seed)
        self.W = rng.standard_normal((dim, n_features)) / np.sqrt(dim)
        self.b = rng.uniform(-1.5, 1.5, n_features)

    def __call__(self, x: np.ndarray, loc: np.ndarray, scale: np.ndarray) -> np.ndarray:
        u = (x - loc) / scale
        parts = [np.ones((len(u), 1)), u]
        if self.W.shape[1]:
            parts.append(np.maximum(u @ self.W + self.b, 0.0))
        return np.concatenate(parts, axis=1)


@dataclass
class Denoisers:
    """Ridge noise predictors eps_s(x) ~ E[x_0 | x_s = x] (whitened) at each lambda node, one measure.

    D = (x - (1 - s) eps) / s, so 1/2 SNR ||D^A - D^B||^2 = 1/2 ||eps^A - eps^B||^2: predicting the
    noise keeps the regression error from being amplified by the weight s/(1 - s) near s = 1."""
    lambdas: np.ndarray
    weights: list[np.ndarray]
    locs: list[np.ndarray]
    scales: list[np.ndarray]

    def predict(self, k: int, xs: np.ndarray, feats: Features) -> np.ndarray:
        return feats(xs, self.locs[k], self.scales[k]) @ self.weights[k]


def _alpha_sigma(lam: float) -> tuple[float, float]:
    s = 1.0 / (1.0 + np.exp(-lam / 2.0))  # SNR = s^2/(1-s)^2 = e^lambda
    return s, 1.0 - s


def fit_denoisers(z: np.ndarray, cfg: FKLConfig, feats: Features, rng: np.random.Generator) -> Denoisers:
    """Flow-matching regression of the noise x_0 on x_s at every node, for whitened paths z (n, d)."""
    lams, _ = lambda_nodes(cfg)
    n, d = z.shape
    zz = np.repeat(z, cfg.n_noise, axis=0)
    weights, locs, scales = [], [], []
    for lam in lams:
        a, s = _alpha_sigma(lam)
        eps = rng.standard_normal(zz.shape)
        xs = a * zz + s * eps
        loc, scale = xs.mean(0), xs.std(0) + 1e-12
        Phi = feats(xs, loc, scale)
        G = Phi.T @ Phi
        reg = cfg.ridge * np.trace(G) / G.shape[0]
        W = np.linalg.solve(G + reg * np.eye(G.shape[0]), Phi.T @ eps)
        weights.append(W)
        locs.append(loc)
        scales.append(scale)
    return Denoisers(lams, weights, locs, scales)


def fkl_from_denoisers(z_eval: np.ndarray, den_p: Denoisers, den_q: Denoisers, cfg: FKLConfig,
                       feats: Features, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """KL(P || Q) = 1/2 sum_k w_k E_P ||eps^P - eps^Q||^2, evaluated on interpolants of z_eval ~ P.

    Returns the estimate and the integrand per node (nats per unit lambda)."""
    lams, wts = lambda_nodes(cfg)
    integrand = np.empty(len(lams))
    for k, lam in enumerate(lams):
        a, s = _alpha_sigma(lam)
        xs = a * z_eval + s * rng.standard_normal(z_eval.shape)
        diff = den_p.predict(k, xs, feats) - den_q.predict(k, xs, feats)
        integrand[k] = 0.5 * float(np.mean(np.sum(diff**2, axis=1)))
    return float(np.sum(wts * integrand)), integrand


def fkl_crossfit(z_eval: np.ndarray, dens_p: tuple[Denoisers, Denoisers], dens_q: tuple[Denoisers, Denoisers],
                 cfg: FKLConfig, feats: Features, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """Cross-fitted FKL (ours, not in the paper): E <eps^P_1 - eps^Q_1, eps^P_2 - eps^Q_2>, fits 1, 2
    on disjoint halves of the paths. Their regression errors are independent, so the positive bias of
    the plug-in square (the variance of the fitted denoisers, ~ d p / n per unit lambda) cancels."""
    lams, wts = lambda_nodes(cfg)
    integrand = np.empty(len(lams))
    for k, lam in enumerate(lams):
        a, s = _alpha_sigma(lam)
        xs = a * z_eval + s * rng.standard_normal(z_eval.shape)
        d1 = dens_p[0].predict(k, xs, feats) - dens_q[0].predict(k, xs, feats)
        d2 = dens_p[1].predict(k, xs, feats) - dens_q[1].predict(k, xs, feats)
        integrand[k] = 0.5 * float(np.mean(np.sum(d1 * d2, axis=1)))
    return float(np.sum(wts * integrand)), integrand


class FKL:
    """FKL between a fixed path measure P (fitted once) and any number of measures Q.

    ``kl(paths_q)`` returns (KL(P || Q), KL(Q || P)) and the integrands; P's denoisers are reused,
    which is how one reference law is compared with several trajectory-inference methods."""

    def __init__(self, paths_p: np.ndarray, whiten: Whitener, cfg: FKLConfig, rng: np.random.Generator):
        self.whiten, self.cfg, self.rng = whiten, cfg, rng
        self.zp = whiten(paths_p)
        self.feats = Features(self.zp.shape[1], cfg.n_features, cfg.feature_seed)
        self.dp = self._fit(self.zp)

    def _fit(self, z):
        if self.cfg.estimator == "plain":
            return fit_denoisers(z, self.cfg, self.feats, self.rng)
        if self.cfg.estimator == "crossfit":
            h = len(z) // 2
            return (fit_denoisers(z[:h], self.cfg, self.feats, self.rng),
                    fit_denoisers(z[h:2 * h], self.cfg, self.feats, self.rng))
        raise ValueError(f"unknown estimator '{self.cfg.estimator}' (plain | crossfit)")

    def _kl(self, z_eval, d_first, d_second):
        if self.cfg.estimator == "plain":
            return fkl_from_denoisers(z_eval, d_first, d_second, self.cfg, self.feats, self.rng)
        return fkl_crossfit(z_eval, d_first, d_second, self.cfg, self.feats, self.rng)

    def kl(self, paths_q: np.ndarray) -> dict:
        zq = self.whiten(paths_q)
        dq = self._fit(zq)
        fwd, int_fwd = self._kl(self.zp, self.dp, dq)
        rev, int_rev = self._kl(zq, dq, self.dp)
        return {"forward": fwd, "reverse": rev, "integrand_forward": int_fwd, "integrand_reverse": int_rev}


def functional_kl(paths_p: np.ndarray, paths_q: np.ndarray, whiten: Whitener, cfg: FKLConfig,
                  rng: np.random.Generator, both: bool = False):
    """FKL(P || Q) (and FKL(Q || P) if ``both``) from sample paths (n, M, D) of each measure."""
    out = FKL(paths_p, whiten, cfg, rng).kl(paths_q)
    return (out["forward"], out["reverse"]) if both else out["forward"]
