"""Gaussian mixture data: the one target where the diffusion score is exact.

For y = x0 + rho * eps with x0 ~ sum_k w_k N(mu_k, S_k), the noised density is
sum_k w_k N(mu_k, S_k + rho^2 I), so eps(y, rho) = -rho * grad log p_rho(y) is available in closed form.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...io import save_npz
from reprozoo.figures import save_figure


@dataclass
class GaussianMixture:
    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, D)
    covs: np.ndarray  # (K, D, D)

    @classmethod
    def load(cls, path: Path | str) -> "GaussianMixture":
        z = np.load(path)
        return cls(z["weights"], z["means"], z["covs"])

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        k = rng.choice(len(self.weights), size=n, p=self.weights)
        chol = np.linalg.cholesky(self.covs)
        z = rng.standard_normal((n, self.means.shape[1]))
        return self.means[k] + np.einsum("nij,nj->ni", chol[k], z)

    def _posterior(self, y: np.ndarray, rho: float):
        d = self.means.shape[1]
        cov = self.covs + rho**2 * np.eye(d)  # (K, D, D)
        prec = np.linalg.inv(cov)
        diff = y[:, None, :] - self.means[None]  # (N, K, D)
        maha = np.einsum("nki,kij,nkj->nk", diff, prec, diff)
        _, logdet = np.linalg.slogdet(cov)
        logw = np.log(self.weights)[None] - 0.5 * (maha + logdet[None] + d * np.log(2 * np.pi))
        m = logw.max(axis=1, keepdims=True)
        resp = np.exp(logw - m)
        log_p = (m[:, 0] + np.log(resp.sum(axis=1)))
        resp /= resp.sum(axis=1, keepdims=True)
        return resp, prec, diff, log_p

    def score(self, y: np.ndarray, rho: float) -> np.ndarray:
        """grad_y log p_rho(y)."""
        resp, prec, diff, _ = self._posterior(y, rho)
        return -np.einsum("nk,kij,nkj->ni", resp, prec, diff)

    def eps(self, y: np.ndarray, rho: float) -> np.ndarray:
        """The exact noise predictor E[eps | y] = -rho * score."""
        return -rho * self.score(y, rho)

    def denoise(self, y: np.ndarray, rho: float) -> np.ndarray:
        """The exact denoiser E[x0 | y] = y + rho^2 * score (Tweedie)."""
        return y + rho**2 * self.score(y, rho)

    def log_prob(self, y: np.ndarray, rho: float = 0.0) -> np.ndarray:
        return self._posterior(y, rho)[3]


def make(components: int, radius: float, dim: int, rng: np.random.Generator) -> GaussianMixture:
    angles = 2 * np.pi * np.arange(components) / components
    means = np.zeros((components, dim))
    means[:, 0], means[:, 1] = radius * np.cos(angles), radius * np.sin(angles)
    covs = np.empty((components, dim, dim))
    for k in range(components):
        a = rng.normal(size=(dim, dim)) * 0.12
        covs[k] = a @ a.T + 0.02 * np.eye(dim)
    weights = rng.dirichlet(np.full(components, 5.0))
    return GaussianMixture(weights, means, covs)


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    rng = np.random.default_rng(seed)
    gmm = make(params["components"], params["radius"], params["dim"], rng)
    save_npz(raw_dir / "gmm_params.npz", weights=gmm.weights, means=gmm.means, covs=gmm.covs)
    return {"version": "generator-1", "generator": "reprozoo.data.synthetic.gmm.make"}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    gmm = GaussianMixture.load(raw_dir / "gmm_params.npz")
    rng = np.random.default_rng(12345)
    x = gmm.sample(params["n_train"], rng)
    save_npz(out_dir / "gmm_params.npz", weights=gmm.weights, means=gmm.means, covs=gmm.covs)
    save_npz(out_dir / "samples.npz", x=x)
    return {"files": ["gmm_params.npz", "samples.npz"], "sizes": {"n_train": len(x), "dim": x.shape[1]}}


def preview(out_dir: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gmm = GaussianMixture.load(out_dir / "gmm_params.npz")
    x = np.load(out_dir / "samples.npz")["x"][:5000]
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.scatter(x[:, 0], x[:, 1], s=1, alpha=0.4)
    ax.scatter(gmm.means[:, 0], gmm.means[:, 1], c="r", marker="x")
    ax.set_title("gmm2d samples (red: component means)")
    ax.set_aspect("equal")
    save_figure(fig, png, dpi=100)


def load(out_dir: Path) -> GaussianMixture:
    return GaussianMixture.load(Path(out_dir) / "gmm_params.npz")
