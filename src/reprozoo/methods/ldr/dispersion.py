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
from torch import nn

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


class CachedLogProb(nn.Module):
    """Wraps a flow so the regulariser reuses the log q that the ML term just computed.

    ``fit_ml`` evaluates log q(x_batch) for the NLL and then calls ``extra_loss(flow, x_batch, c)``;
    ``pop(x)`` hands back that same graph node (if x is the batch it was computed on, else a
    fresh evaluation), so LDR costs no second forward pass and both terms share one backward.
    """

    def __init__(self, flow: nn.Module):
        super().__init__()
        self.flow = flow
        self._cache: tuple[Tensor, Tensor] | None = None

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        lq = self.flow.log_prob(x, context)
        self._cache = (x, lq)
        return lq

    def pop(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        cache, self._cache = self._cache, None
        if cache is not None and cache[0].shape == x.shape and torch.equal(cache[0], x):
            return cache[1]
        return self.flow.log_prob(x, context)


class Objective:
    """``extra_loss`` for ``fit_ml``: λ D(ℓ) (or nothing for the ML baseline), plus monitors.

    Every step it records the batch NLL and the batch log-dispersion (under no_grad for the
    baseline, so the baseline's dispersion is reported too), and every ``val_every`` steps the
    NLL of the held-out validation set: the convergence curves of every variant.
    """

    def __init__(self, energy_fn: Callable[[Tensor], Tensor], measure: str | None, weight: float,
                 temperature: float, x_val: Tensor, val_every: int, monitor_measure: str = "variance"):
        self.energy_fn, self.measure, self.weight, self.temperature = energy_fn, measure, weight, temperature
        self.x_val, self.val_every = x_val, max(1, int(val_every))
        self.monitor_measure = measure or monitor_measure
        self.step = 0
        self.train_nll: list[float] = []
        self.train_dispersion: list[float] = []
        self.val_steps: list[int] = []
        self.val_nll: list[float] = []

    def validate(self, flow) -> None:
        with torch.no_grad():
            self.val_nll.append(float(-flow.log_prob(self.x_val).mean()))
        self.val_steps.append(self.step)

    def __call__(self, flow: CachedLogProb, xb: Tensor, cb: Tensor | None):
        lq = flow.pop(xb, cb)
        self.step += 1
        self.train_nll.append(float(-lq.detach().mean()))
        if self.step % self.val_every == 0:
            self.validate(flow.flow)
        energy = self.energy_fn(xb)
        if self.measure is None:
            with torch.no_grad():
                d = log_dispersion(lq, energy, self.monitor_measure, self.temperature)
            self.train_dispersion.append(float(d))
            return lq.new_zeros(())
        d = log_dispersion(lq, energy, self.measure, self.temperature)
        self.train_dispersion.append(float(d.detach()))
        return self.weight * d
