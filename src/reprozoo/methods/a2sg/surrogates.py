"""The surrogates compared, and A2SG's adaptive window.

Every surrogate g(x) of x = v - θ integrates to 1 (from ``blocks/spiking.py``), so variants differ
in shape and width, never in total gradient scale.

A2SG (our reading of the abstract; the reference repository holds no code):

* **asymmetric**: a two-sided triangle (``blocks.spiking.asymmetric``) whose half-width above
  threshold is ``r`` times the one below (r > 1): neurons with higher membrane potential get
  the larger gradient share. With total support 2w the half-widths are
  w_below = 2w / (1 + r) and w_above = 2 r w / (1 + r) (r = 1: the symmetric triangle of width w).
* **adaptive**: the window w is set per layer l and per time step t from the spread of the
  membrane potentials there, w_{l,t} = κ(s) σ_{l,t}, where σ_{l,t} is an exponential moving average
  (over training steps) of the standard deviation of v - θ in layer l at step t. The same fraction
  of neurons then receives gradient in every layer and at every time step (the "effective window
  for spatio-temporal adaptation" that reduces spatial gradient variation), and as the membrane
  distribution drifts over training the window follows it. κ(s) anneals linearly from κ_start to
  κ_end over the training steps s (wide early for coverage, narrower late for a sharper
  estimate of the step); w is clamped to [w_min, w_max].
"""
from __future__ import annotations

import torch

from ...blocks.spiking import SURROGATES, asymmetric


def asymmetric_window(width: float, ratio: float):
    """Area-1 triangle with total support 2*width, above/below half-width ratio ``ratio``."""
    w_below = 2.0 * width / (1.0 + ratio)
    w_above = ratio * w_below
    return asymmetric(a_left=1.0 / w_below, a_right=1.0 / w_above)


class AdaptiveWindow:
    """Per-(layer, time step) surrogate windows tracked from membrane statistics.

    ``surrogate(layer, t, x)`` returns g for that slot and, in training mode, first updates the
    moving average σ_{l,t} from ``x`` (no gradient flows through the statistics)."""

    def __init__(self, n_layers: int, T: int, ratio: float = 2.0, kappa_start: float = 1.5,
                 kappa_end: float = 0.75, momentum: float = 0.9, w_min: float = 0.2,
                 w_max: float = 4.0, adaptive: bool = True, fixed_width: float = 1.0):
        self.sigma = [[None] * T for _ in range(n_layers)]
        self.ratio, self.momentum = ratio, momentum
        self.kappa_start, self.kappa_end = kappa_start, kappa_end
        self.w_min, self.w_max = w_min, w_max
        self.adaptive, self.fixed_width = adaptive, fixed_width
        self.progress = 0.0        # fraction of training done, set by the training loop
        self.training = True

    def kappa(self) -> float:
        return self.kappa_start + (self.kappa_end - self.kappa_start) * self.progress

    def width(self, layer: int, t: int) -> float:
        if not self.adaptive:
            return self.fixed_width
        s = self.sigma[layer][t]
        if s is None:  # never observed
            s = 1.0
        return min(max(self.kappa() * s, self.w_min), self.w_max)

    def observe(self, layer: int, t: int, x: torch.Tensor) -> None:
        s = float(x.detach().std())
        old = self.sigma[layer][t]
        self.sigma[layer][t] = s if old is None else self.momentum * old + (1 - self.momentum) * s

    def __call__(self, layer: int, t: int, x: torch.Tensor):
        if self.training and self.adaptive:
            self.observe(layer, t, x)
        return asymmetric_window(self.width(layer, t), self.ratio)

    def widths(self) -> list[list[float]]:
        return [[self.width(l, t) for t in range(len(row))] for l, row in enumerate(self.sigma)]


class FixedSurrogate:
    """A fixed library surrogate, same at every layer and time step (the baselines)."""

    def __init__(self, name: str, **kw):
        self.g = SURROGATES[name](**kw)
        self.training = True
        self.progress = 0.0

    def __call__(self, layer: int, t: int, x: torch.Tensor):
        return self.g


def make_surrogate(variant: str, n_layers: int, T: int, p: dict):
    """The surrogate provider of a variant; hyper-parameters from the config's ``surrogates``."""
    cfg = dict(p["surrogates"][variant])
    kind = cfg.pop("kind")
    if kind == "a2sg":
        return AdaptiveWindow(n_layers, T, **cfg)
    return FixedSurrogate(kind, **cfg)
