"""Off-policy log-dispersion regularisation (LDR).

Let q_θ be the flow, p(x) = exp(-E(x)/T) / Z the target and r any distribution we hold samples
of (here: the MCMC training set; no sample of q is drawn). Define the log-ratio

    ℓ_θ(x) = log q_θ(x) + E(x)/T = log q_θ(x) - log p(x) - log Z .

q_θ = p exactly when ℓ_θ is CONSTANT on the support of r, whatever r is and whatever Z is: so any
dispersion measure D of ℓ_θ(X), X ~ r, is a divergence-like loss that is zero iff q_θ = p on
supp r, is invariant to the unknown log Z (a shift of ℓ), and needs only the energy labels E(x_i)
of the data already in hand. With D = variance this is the log-variance objective (Richter et
al. 2020; Nüsken & Richter 2021) evaluated OFF-POLICY; the paper generalises it to other
dispersion measures and adds it to the maximum-likelihood loss as a regulariser of the SHAPE of
log q (it pins log q to -E/T up to a constant at the data, which ML alone never sees):

    L(θ) = -(1/B) Σ_i log q_θ(x_i)  +  λ D({ℓ_θ(x_i)}_{i=1..B})        (minibatch of the data)

Dispersion measures here (both shift invariant, zero iff all ℓ_i are equal):
* ``variance``: (1/B) Σ (ℓ_i - mean ℓ)^2 (the log-variance loss);
* ``mad``: (1/B) Σ |ℓ_i - median ℓ| (mean absolute deviation about the median: linear, not
  quadratic, in outlying log-ratios, so single badly fitted points pull less).
"""
from __future__ import annotations

from typing import Callable

import torch

Tensor = torch.Tensor


def variance(ell: Tensor) -> Tensor:
    return (ell - ell.mean()).pow(2).mean()


def mean_absolute_deviation(ell: Tensor) -> Tensor:
    return (ell - ell.median()).abs().mean()


MEASURES: dict[str, Callable[[Tensor], Tensor]] = {"variance": variance, "mad": mean_absolute_deviation}


def log_ratio(log_q: Tensor, energy: Tensor, temperature: float = 1.0) -> Tensor:
    """ℓ = log q(x) + E(x)/T (= log q - log p up to the constant log Z)."""
    return log_q + energy / temperature


def log_dispersion(log_q: Tensor, energy: Tensor, measure: str, temperature: float = 1.0) -> Tensor:
    """D(ℓ) for one of MEASURES."""
    if measure not in MEASURES:
        raise ValueError(f"unknown dispersion measure {measure!r}; one of {sorted(MEASURES)}")
    return MEASURES[measure](log_ratio(log_q, energy, temperature))


def objective(log_q: Tensor, offset: Tensor, measure: str | None, weight: float) -> tuple[Tensor, Tensor]:
    """(loss, nll) on one batch: -mean log q, plus λ D(ℓ) with ℓ = log q + offset when ``measure``.

    ``offset`` = E(x)/T + (the chart's log-density correction at x): everything in ℓ that does
    not depend on the flow, computed once per data point (the energy labels of the data).
    """
    nll = -log_q.mean()
    if measure is None:
        return nll, nll
    if measure not in MEASURES:
        raise ValueError(f"unknown dispersion measure {measure!r}; one of {sorted(MEASURES)}")
    return nll + weight * MEASURES[measure](log_q + offset), nll
