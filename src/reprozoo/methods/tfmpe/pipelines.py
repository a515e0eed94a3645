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
  the SAME tokenised posterior network, same steps, batch, optimiser and early stopping, on them.
"""
from __future__ import annotations

import numpy as np
import torch

from .simulators import Simulator
from .tokenised_fm import Layout, Standardizer, TokenVelocityField, fit_best_val, fit_cfm, sample_cfm


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


def _new_net(layout: Layout, net_cfg: dict, init_seed: int) -> TokenVelocityField:
    torch.manual_seed(init_seed)  # same initial weights for every variant's posterior network
    return TokenVelocityField(layout.D, **net_cfg)


def fit_posterior(g, l, x, layout: Layout, std: Standardizer, net_cfg: dict, fit_cfg: dict,
                  ode_steps: int, init_seed: int, generator: torch.Generator) -> tuple[PosteriorEstimator, dict]:
    s = l.shape[1]
    tok = layout.pack(_t(std.fwd("g", g)), _t(std.fwd("l", l)), _t(std.fwd("x", x)))
    present, gen = layout.masks(s, "posterior")
    net = _new_net(layout, net_cfg, init_seed)
    hist = fit_cfm(net, tok, present, gen, generator=generator, **fit_cfg)
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
        self.net = _new_net(self.layout, net_cfg, init_seed + 7)
        self.hist = fit_cfm(self.net, tok, self.present, self.gen, generator=generator, **fit_cfg)

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


class FlatNPE:
    """Conventional (non-tokenised) joint NPE: a zuko flow q(g, l_1..S | flatten(x_1..S)), fixed S."""

    def __init__(self, flow, std: Standardizer, G: int, Lp: int):
        self.flow, self.std, self.G, self.Lp = flow, std, G, Lp

    def sample(self, x: np.ndarray, n_draws: int, generator: torch.Generator) -> np.ndarray:
        n_sets, s = x.shape[:2]
        ctx = _t(self.std.fwd("x", x).reshape(n_sets, -1))
        out = self.flow.sample(n_draws, ctx).transpose(0, 1).double().numpy()   # (n_sets, n_draws, d)
        g = self.std.inv("g", out[..., :self.G])
        l = self.std.inv("l", out[..., self.G:].reshape(n_sets, n_draws, s, self.Lp))
        return np.concatenate([g, l.reshape(n_sets, n_draws, -1)], axis=-1)


def _fit_flow_best_val(flow, theta, ctx, fit_cfg: dict, generator: torch.Generator) -> dict:
    """NLL of the flow with the FM posteriors' schedule (fit_best_val: Adam, cosine decay, best
    validation weights; sbi's NPE also stops on a 10 % validation split): only the loss differs."""
    n_val = max(1, int(round(fit_cfg["val_frac"] * len(theta))))
    perm = torch.randperm(len(theta), generator=generator)
    vi = perm[:n_val]
    return fit_best_val(flow, perm[n_val:], lambda idx: -flow.log_prob(theta[idx], ctx[idx]).mean(),
                        lambda: -flow.log_prob(theta[vi], ctx[vi]).mean(), steps=fit_cfg["steps"],
                        batch=fit_cfg["batch"], lr=fit_cfg["lr"], eval_every=fit_cfg["eval_every"],
                        generator=generator)


def train_flat_npe(model: Simulator, n_sites: int, n_sets: int, flow_cfg: dict, fit_cfg: dict,
                   init_seed: int, rng: np.random.Generator, generator: torch.Generator):
    """sbi-style NPE baseline on n_sets real S-site data sets (n_sets * S calls): maximum likelihood
    of a masked autoregressive flow (blocks/flows.py, zuko) over the flattened parameters given the
    flattened observations; same steps, batch, learning rate and best-validation rule as the FM posteriors."""
    from ...blocks.flows import make_flow

    calls0 = model.calls
    g, l, x = model.sample_joint(n_sets, n_sites, rng)
    calls = model.calls - calls0
    gp, lp = model.sample_prior(4096, 1, rng)
    std = Standardizer(gp, lp, x)
    theta = _t(np.concatenate([std.fwd("g", g), std.fwd("l", l).reshape(n_sets, -1)], axis=1))
    ctx = _t(std.fwd("x", x).reshape(n_sets, -1))
    torch.manual_seed(init_seed)
    flow = make_flow(flow_cfg.get("kind", "maf"), theta.shape[1], context=ctx.shape[1],
                     hidden=tuple(flow_cfg.get("hidden", (64, 64))), transforms=flow_cfg.get("transforms", 3))
    hist = _fit_flow_best_val(flow, theta, ctx, fit_cfg, generator)
    return FlatNPE(flow.eval(), std, model.G, model.Lp), hist, calls
