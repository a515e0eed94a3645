"""Neural posterior estimation (sbi), simulation-based calibration, and the gradient fit.

NPE (Papamakarios & Murray 2016; Greenberg et al. 2019): a conditional density q(θ | x) trained by
maximum likelihood on simulated pairs (θ_i ~ prior, x_i ~ simulator(θ_i)) is, at its optimum, the
posterior for every x: amortised, so one training serves every recorded cell. The density
estimator is sbi's mixture density network (a Gaussian mixture whose weights, means and
covariances an MLP outputs): for a 4-dimensional θ it fits as well as a flow here and samples
~30x faster (measured, see README). The raw-trace baseline adds an MLP embedding net trained
jointly, as sbi recommends for high-dimensional x.

SBC (Talts et al. 2018): on held-out prior simulations, the rank of the true θ among posterior
draws is uniform iff q is calibrated; we report the largest gap between the expected coverage of
central credible intervals and their nominal level (ranks and coverage from blocks/gen_metrics).

Gradient fit: θ by Adam on the normalised squared error between simulated and recorded EIs,
gradients through the differentiable simulator (the Jaxley route), from the default parameters.
"""
from __future__ import annotations

import numpy as np
import torch

from ...blocks.gen_metrics import expected_coverage, sbc_ranks, sbc_uniformity_pvalue


def _embedding(d_in: int, width: int, d_out: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(d_in, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, d_out))


def train_npe(theta: np.ndarray, x: np.ndarray, low: np.ndarray, high: np.ndarray, cfg: dict,
              seed: int, embed: dict | None = None):
    """(posterior, summary) of sbi's NPE with an MDN; embed = {width, out} adds an MLP embedding."""
    from sbi.inference import NPE
    from sbi.neural_nets import posterior_nn
    from sbi.utils import BoxUniform

    torch.manual_seed(seed)
    prior = BoxUniform(torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32))
    kw = {}
    if embed:
        kw["embedding_net"] = _embedding(x.shape[1], embed["width"], embed["out"])
    if cfg.get("logit_theta", True):   # fit in logit(box) coordinates: a box posterior has no hard edges there
        kw.update(z_score_theta="transform_to_unconstrained", x_dist=prior)
    de = posterior_nn("mdn", hidden_features=cfg["hidden"], num_components=cfg["components"], **kw)
    inf = NPE(prior=prior, density_estimator=de, show_progress_bars=False)
    inf.append_simulations(torch.as_tensor(theta, dtype=torch.float32), torch.as_tensor(x, dtype=torch.float32))
    inf.train(training_batch_size=cfg["batch"], learning_rate=cfg["lr"], stop_after_epochs=cfg["patience"],
              max_num_epochs=cfg["max_epochs"], show_train_summary=False)
    return inf.build_posterior(), inf.summary


def sample_posterior(posterior, x: np.ndarray, n: int) -> np.ndarray:
    """(n, B, d) posterior draws for each row of x."""
    s = posterior.sample_batched((n,), x=torch.as_tensor(x, dtype=torch.float32), show_progress_bars=False)
    return s.numpy().astype(np.float64)


def sbc_summary(theta_true: np.ndarray, draws: np.ndarray) -> dict:
    """Calibration numbers from draws (L, N, d) of the posteriors of N held-out simulations."""
    samples = np.transpose(draws, (1, 0, 2))                            # (N, L, d)
    ranks = sbc_ranks(theta_true, samples)
    levels, cov = expected_coverage(ranks, samples.shape[1])
    pvals = sbc_uniformity_pvalue(ranks, samples.shape[1])
    return {"ranks": ranks, "levels": levels, "coverage": cov,
            "cov_err": float(np.max(np.abs(cov - levels[:, None]))),
            "ks_p_min": float(pvals.min()), "ks_p": pvals}


def gradient_fit(exp, ei_obs: torch.Tensor, psi: np.ndarray, low: np.ndarray, high: np.ndarray, fit: dict,
                 seed: int, progress=print):
    """θ (B, 4) minimising the normalised EI error Σ_t,e (EI(θ) - EI_obs)² / Σ EI_obs² of every cell,
    by Adam through the differentiable simulator under the shared training rule
    (``blocks.fitting.fit_to_plateau``: a learning-rate grid piloted on the loss, the best rate kept
    constant until the loss passes the plateau test, best iterate kept). θ lives in the prior box as
    θ = low + (high - low) σ(u); u = 0 is the box centre, which is the textbook (default) HH cell, so
    every fit starts from the defaults. The fit has no held-out data: its "validation" loss is the
    mean per-cell EI error itself (deterministic: all cells, every step). Returns (θ, fit record)."""
    from ...blocks.fitting import fit_to_plateau

    psi_t = exp._t(psi)
    lo, span = torch.as_tensor(low, dtype=exp.dtype), torch.as_tensor(high - low, dtype=exp.dtype)
    obs = ei_obs.to(exp.dtype)
    norm = (obs**2).mean((1, 2))

    class _Theta(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.u = torch.nn.Parameter(torch.zeros(len(obs), 4, dtype=exp.dtype))

        def theta(self):
            return lo + span * torch.sigmoid(self.u)

    def per_cell(model):
        return ((exp._record(model.theta(), psi_t) - obs) ** 2).mean((1, 2)) / norm

    def val_loss(model):
        with torch.no_grad():
            return float(per_cell(model).mean())

    model, rec = fit_to_plateau(lambda gen: _Theta(), lambda m, gen: per_cell(m).sum(), val_loss, fit, seed,
                                "gradient_fit", progress)
    with torch.no_grad():
        theta = model.theta().numpy().astype(np.float64)
    return theta, rec
