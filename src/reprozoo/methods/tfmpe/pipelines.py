"""The two ways of training a hierarchical posterior from a simulator, with the calls they cost.

* :func:`train_tfmpe` (likelihood factorisation, the paper's method):
  1. simulate B SINGLE sites: (g, l) ~ prior with S = 1, x = simulator  ->  B calls;
  2. fit the tokenised likelihood q(x | g, l) by flow matching (one site, x generated);
  3. assemble synthetic S-site data sets: M = B draws (g, l_1..S) ~ prior, each x_s drawn from
     q(x | g, l_s) with the ODE sampler (no simulator calls);
  4. fit the tokenised posterior q(g, l_1..S | x_1..S) by flow matching on the synthetic sets.
  The likelihood of step 2 does not depend on S, so one likelihood serves every S (step 3-4 per S).
  The posterior's validation split is synthetic too: the whole method costs exactly B calls.
* :func:`train_joint` (baseline): simulate n_sets full S-site data sets (n_sets * S calls) and fit
  the SAME tokenised posterior network, same initial weights, learning-rate grid, step limits,
  batch and stopping rule, on them.
  Every fit (both posteriors and TFMPE's site likelihood) validates as a practitioner can: the energy
  score on its own held-out simulations, inside the call budget; the exact posterior and site law
  of the conjugate problem serve only to score (method.py), never to stop, select or pilot.
* :class:`PriorOnly` (negative control): draws from the prior whatever the data; marginally
  calibrated by construction, so a calibration check that it passes cannot tell a posterior from
  the prior.
"""
from __future__ import annotations

import numpy as np
import torch

from .simulators import Simulator
from .tokenised_fm import Layout, Standardizer, TokenVelocityField, fit_cfm, sample_cfm


def _t(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float32)


class PosteriorEstimator:
    """A trained tokenised posterior network with its standardisation: samples in model units."""

    def __init__(self, net: TokenVelocityField, layout: Layout, std: Standardizer, ode_steps: int):
        self.net, self.layout, self.std, self.ode_steps = net, layout, std, ode_steps

    def sample(self, x: np.ndarray, n_draws: int, generator: torch.Generator) -> np.ndarray:
        """Posterior draws (n_sets, n_draws, G + S*Lp) for observations x (n_sets, S, X)."""
        lay = self.layout
        n_sets, s = x.shape[:2]
        xs = np.repeat(self.std.fwd("x", x), n_draws, axis=0)
        ctx = lay.pack(torch.zeros(len(xs), lay.G), torch.zeros(len(xs), s, lay.Lp), _t(xs))
        present, gen = lay.masks(s, "posterior")
        out = sample_cfm(self.net, ctx, present, gen, self.ode_steps, generator)
        g, l, _ = lay.unpack(out)
        g = self.std.inv("g", g.double().numpy())
        l = self.std.inv("l", l.double().numpy()).reshape(len(g), s * lay.Lp)
        return np.concatenate([g, l], axis=1).reshape(n_sets, n_draws, -1)


def _net_factory(layout: Layout, net_cfg: dict, init_seed: int):
    """A constructor of fresh networks with fixed initial weights (the same for every variant and
    every learning rate of the grid)."""
    def make():
        torch.manual_seed(init_seed)
        return TokenVelocityField(layout.D, **net_cfg)
    return make


def fit_posterior(g, l, x, layout: Layout, std: Standardizer, net_cfg: dict, fit_cfg: dict,
                  ode_steps: int, init_seed: int, generator: torch.Generator) -> tuple[PosteriorEstimator, dict]:
    """Fit the tokenised posterior on (g, l, x); the stop, the kept weights and the rate follow the
    energy score on the fit's own held-out sets (tokenised_fm.fit_cfm): nothing outside the data."""
    s = l.shape[1]
    tok = layout.pack(_t(std.fwd("g", g)), _t(std.fwd("l", l)), _t(std.fwd("x", x)))
    present, gen = layout.masks(s, "posterior")
    net, hist = fit_cfm(_net_factory(layout, net_cfg, init_seed), tok, present, gen, generator=generator,
                        ode_steps=ode_steps, **fit_cfg)
    return PosteriorEstimator(net, layout, std, ode_steps), hist


class LikelihoodFactorisation:
    """Steps 1-2 of TFMPE: single-site simulations and the tokenised site likelihood q(x | g, l)."""

    def __init__(self, model: Simulator, budget: int, net_cfg: dict, fit_cfg: dict, ode_steps: int,
                 rng: np.random.Generator, generator: torch.Generator, init_seed: int):
        self.model, self.ode_steps, self.generator = model, ode_steps, generator
        self.layout = Layout(model.G, model.Lp, model.X)
        calls0 = model.calls
        g, l, x = model.sample_joint(budget, 1, rng)                # B single-site simulations
        self.calls = model.calls - calls0
        # parameter statistics from the prior (free); observation statistics from the B simulations
        gp, lp = model.sample_prior(4096, 1, rng)
        self.std = Standardizer(gp, lp, x)
        tok = self.layout.pack(_t(self.std.fwd("g", g)), _t(self.std.fwd("l", l)), _t(self.std.fwd("x", x)))
        self.present, self.gen = self.layout.masks(1, "likelihood")
        # validated like the posterior: energy score on held-out single-site simulations (part of
        # the B calls); the exact site law of the conjugate problem is never read here
        self.net, self.hist = fit_cfm(_net_factory(self.layout, net_cfg, init_seed + 7), tok, self.present, self.gen,
                                      generator=generator, ode_steps=ode_steps, **fit_cfg)

    def synthesise(self, n_sets: int, n_sites: int, rng: np.random.Generator):
        """Step 3: (g, l, x~) with x~_s ~ q(x | g, l_s): n_sets synthetic data sets of n_sites sites."""
        lay, model = self.layout, self.model
        g, l = model.sample_prior(n_sets, n_sites, rng)
        gs = np.repeat(g, n_sites, axis=0)                         # one single-site problem per site
        ls = l.reshape(n_sets * n_sites, 1, lay.Lp)
        ctx = lay.pack(_t(self.std.fwd("g", gs)), _t(self.std.fwd("l", ls)), torch.zeros(len(gs), 1, lay.X))
        out = sample_cfm(self.net, ctx, self.present, self.gen, self.ode_steps, self.generator)
        x = self.std.inv("x", lay.unpack(out)[2].double().numpy())
        return g, l, x.reshape(n_sets, n_sites, lay.X)


def train_tfmpe(lf: LikelihoodFactorisation, n_sites: int, n_sets: int, net_cfg: dict, fit_cfg: dict,
                init_seed: int, rng: np.random.Generator, generator: torch.Generator):
    """Steps 3-4 for one S; returns the posterior estimator, its training history, calls (= lf.calls)."""
    g, l, x = lf.synthesise(n_sets, n_sites, rng)
    est, hist = fit_posterior(g, l, x, lf.layout, lf.std, net_cfg, fit_cfg, lf.ode_steps, init_seed, generator)
    return est, hist, lf.calls


def train_joint(model: Simulator, n_sites: int, n_sets: int, net_cfg: dict, fit_cfg: dict, ode_steps: int,
                init_seed: int, rng: np.random.Generator, generator: torch.Generator):
    """Joint (non-factorised) training on n_sets real S-site simulations: n_sets * S calls."""
    calls0 = model.calls
    g, l, x = model.sample_joint(n_sets, n_sites, rng)
    calls = model.calls - calls0
    gp, lp = model.sample_prior(4096, 1, rng)
    std = Standardizer(gp, lp, x)
    est, hist = fit_posterior(g, l, x, Layout(model.G, model.Lp, model.X), std, net_cfg, fit_cfg,
                              ode_steps, init_seed, generator)
    return est, hist, calls


class PriorOnly:
    """The negative control: posterior draws that ignore the data (draws from the prior)."""

    def __init__(self, model: Simulator, rng: np.random.Generator):
        self.model, self.rng = model, rng

    def sample(self, x: np.ndarray, n_draws: int, generator=None) -> np.ndarray:
        n_sets, s = x.shape[:2]
        g, l = self.model.sample_prior(n_sets * n_draws, s, self.rng)
        return np.concatenate([g, l.reshape(len(g), -1)], axis=1).reshape(n_sets, n_draws, -1)
