"""The surrogates compared, A2SG's published adaptive rule, and our earlier guess (an ablation).

x = u - V_th is the membrane potential minus the threshold; β is the half-width of the window
[V_th - β, V_th + β] (the paper's "effective window width").

**Shapes, in the paper's parameterisation** (fixed peak height, not fixed area):

* ``tri``  (TRI, symmetric):   g(x) = max(0, 1 - |x| / β)                            peak 1 at x = 0
* ``asy``  (ASY, asymmetric):  g(x) = max(0, x / (2β) + h)  on |x| <= β, else 0       peak h + 1/2 at x = +β
  with the gradient bias h (h = 1/2: a ramp from 0 at V_th - β to 1 at V_th + β, area β). Neurons
  with higher membrane potential inside the window get the larger gradient.
* the fixed baselines at the paper's fixed width β = 0.5: ``tri`` and ``asy`` (area 0.5 each),
  BOX = the block's ``rectangular`` of width 2β = 1 (height 1, area 1) and the block's ``arctan``
  with α = 2 (peak 1, area 1). Every surrogate here has peak 1; a constant gradient scale per
  layer does not change Adam's updates (Adam divides by the gradient's running RMS).

**ST-ASG, the paper's adaptive rule** (``STAdaptive``), per layer l and time step t:

* local gradient δ^l[t] = ∂L/∂u^l[t] (membrane potential; it includes the surrogate and the leak
  path to later steps);
* spatial adaptation, final step T: β^l[T] = argmin SGV, SGV^l[T] = Var(δ^l[T]) / Mean(|δ^l[T]|);
* temporal adaptation, t = T-1 down to 1: β^l[t] = argmax TGC, TGC^l[t] = cos(δ^l[t], δ^l[t+1])
  (the final step is the reference direction the earlier steps are aligned with);
* layers from the read-out down (a layer's δ depends on the windows of the layers above it);
  repeated every ``update_every`` training steps (the paper: every epoch).

The paper searches β with Bayesian optimisation. Here, for a layer whose upper layers are fixed,
a_t = ∂L/∂s^l[t] does not depend on layer l's own windows (the reset path is detached), and

    δ^l[t] = a_t g_β(u_t) + λ (1 - s_t) δ^l[t+1]      (λ: the LIF leak)

so every candidate β costs one elementwise product: we evaluate the paper's objective exactly on
a grid of candidates (``beta_grid``) instead of a Bayesian search over the same range, with one
backward pass per layer. ``recursion_deltas`` is the same recursion, tested against autograd.

**Our earlier guess** (``MembraneGuess``, an ablation row named as such): window from the spread
of the membrane potential, w_{l,t} = κ(s) σ_{l,t} (σ an EMA of std(v - θ)), κ annealed over
training, with the block's two-sided asymmetric triangle (area 1) of above/below ratio r.
"""
from __future__ import annotations

import math

import torch

from ...blocks.spiking import SURROGATES, asymmetric


# ------------------------------------------------------------------ shapes (paper's parameterisation)
def tri(x: torch.Tensor, beta: float) -> torch.Tensor:
    """Symmetric triangle of half-width β, peak 1 at threshold."""
    return (1.0 - x.abs() / beta).clamp(min=0.0)


def asy(x: torch.Tensor, beta: float, h: float = 0.5) -> torch.Tensor:
    """The paper's asymmetric surrogate: x / (2β) + h on the window |x| <= β (clipped at 0)."""
    return ((x / (2.0 * beta) + h).clamp(min=0.0) * (x.abs() <= beta)).to(x.dtype)


def asy_rev(x: torch.Tensor, beta: float, h: float = 0.5) -> torch.Tensor:
    """ASY mirrored about the threshold (the larger gradient BELOW it): the control of Theorem 4.2's
    paired claim, the same ramp and area with the direction the theorem's argument rests on reversed."""
    return asy(-x, beta, h)


def shape_fn(kind: str, h: float = 0.5):
    if kind == "tri":
        return tri
    if kind == "asy":
        return lambda x, beta: asy(x, beta, h)
    if kind == "asy_rev":
        return lambda x, beta: asy_rev(x, beta, h)
    raise ValueError(f"unknown window shape {kind!r} (tri, asy, asy_rev)")


def sgv(delta: torch.Tensor) -> torch.Tensor:
    """Spatial gradient variation along the last axis: Var(δ) / Mean(|δ|) (the paper's Eq.)."""
    return delta.var(dim=-1, unbiased=False) / delta.abs().mean(dim=-1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine along the last axis (b broadcast against a)."""
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def recursion_deltas(a, u, s, betas, shape, leak: float):
    """δ[t] = a[t] g(u[t], β[t]) + leak (1 - s[t]) δ[t+1], from t = T-1 down (lists of tensors)."""
    T = len(a)
    out = [None] * T
    nxt = None
    for t in reversed(range(T)):
        d = a[t] * shape(u[t], betas[t])
        if nxt is not None:
            d = d + leak * (1.0 - s[t]) * nxt
        out[t] = d
        nxt = d
    return out


# ------------------------------------------------------------------ providers: surrogate(layer, t, u) -> g
class FixedWindow:
    """A fixed window shape at one β for every layer and time step (tri_fixed, asy_fixed)."""

    def __init__(self, n_layers: int, T: int, shape: str = "tri", beta: float = 0.5, h: float = 0.5):
        self.shape = shape_fn(shape, h)
        self.beta = [[float(beta)] * T for _ in range(n_layers)]
        self.training, self.progress = True, 0.0

    def __call__(self, layer: int, t: int, x: torch.Tensor):
        return lambda z, l=layer, tt=t: self.shape(z, self.beta[l][tt])

    def widths(self) -> list[list[float]]:
        return [list(row) for row in self.beta]


class STAdaptive(FixedWindow):
    """ST-ASG: per-(layer, step) β chosen by min SGV at the final step and max TGC before it.

    ``g`` closures read β when the backward pass runs, so a search between two backward passes of
    the same graph takes effect at once (the search itself relies on this for the lower layers)."""

    def __init__(self, n_layers: int, T: int, shape: str = "asy", beta0: float = 0.5, h: float = 0.5,
                 beta_grid=None, update_every: int = 12, beta_max: float | None = None):
        super().__init__(n_layers, T, shape, beta0, h)
        # default grid 0.5 * 2^(k/4), k = -8..6 (0.125 to 1.414); ``beta_max`` moves its top end
        # (the paper does not publish its range: the pilots sweep it)
        k_max = 6 if beta_max is None else int(round(4 * math.log2(float(beta_max) / 0.5)))
        grid = beta_grid if beta_grid is not None else [0.5 * 2 ** (k / 4) for k in range(-8, k_max + 1)]
        self.grid = torch.tensor(sorted(float(b) for b in grid))
        self.update_every = int(update_every)
        self.beta_default = float(beta0)
        self.history: list[tuple[int, list[list[float]]]] = []

    def due(self, step: int) -> bool:
        return self.update_every > 0 and step % self.update_every == 0

    @torch.no_grad()
    def _choose(self, a, u, s, leak: float) -> list[float]:
        """β per step for one layer, given a[t] = ∂L/∂s[t] (flattened tensors)."""
        T = len(a)
        G = self.grid.view(-1, 1).to(u[0].device)
        chosen: list[float] = [0.0] * T
        nxt = None
        for t in reversed(range(T)):
            cand = a[t] * self.shape(u[t].unsqueeze(0), G)               # (n_grid, N)
            if nxt is not None:
                cand = cand + leak * (1.0 - s[t]) * nxt
            if t == T - 1:
                score = -sgv(cand)                                         # spatial: minimise SGV
            else:
                score = cosine(cand, nxt)                                  # temporal: maximise TGC
            score = torch.nan_to_num(score, nan=-float("inf"))
            if torch.isinf(score).all():                                   # no gradient reaches this slot
                i = int((self.grid - self.beta_default).abs().argmin())
            else:
                i = int(score.argmax())
            chosen[t] = float(self.grid[i])
            nxt = cand[i]
        return chosen

    def search(self, loss: torch.Tensor, trace: dict, leak: float, threshold: float, step: int = 0) -> None:
        """One ST-ASG update on the graph of ``loss`` (recorded by ``SpikingCNN.forward(trace=...)``).

        Layers from the top: a = ∂L/∂s for layer l under the windows already chosen above it."""
        L = len(trace["s"])
        for l in reversed(range(L)):
            s_list, v_list = trace["s"][l], trace["v"][l]
            a = torch.autograd.grad(loss, s_list, retain_graph=True, allow_unused=True)
            a = [torch.zeros_like(s) if g is None else g for g in a]
            flat = lambda ts: [x.detach().reshape(-1) for x in ts]             # noqa: E731
            u = [x - threshold for x in flat(v_list)]
            chosen = self._choose(flat(a), u, flat(s_list), leak)
            for t, b in enumerate(chosen):
                self.beta[l][t] = b
        self.history.append((step, self.widths()))


class STRandom(STAdaptive):
    """Placebo of ST-ASG (review of round 3, item 2): the same windows, grid and schedule, but at
    every search slot each (layer, step) gets a β drawn uniformly from the search's own candidate
    grid, ignoring SGV and TGC. An adaptivity claim must beat it: a gain that this placebo also
    shows comes from varying β over the range, not from the paper's objective."""

    def __init__(self, *args, seed: int = 0, **kw):
        super().__init__(*args, **kw)
        self.gen = torch.Generator().manual_seed(int(seed))

    def reseed(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(int(seed))

    def search(self, loss: torch.Tensor, trace: dict, leak: float, threshold: float, step: int = 0) -> None:
        for l in range(len(self.beta)):
            idx = torch.randint(len(self.grid), (len(self.beta[l]),), generator=self.gen)
            self.beta[l] = [float(self.grid[int(i)]) for i in idx]
        self.history.append((step, self.widths()))


class STMatched(STRandom):
    """Width-matched placebo of ST-ASG (cold review after the budget round, item 5): the same windows,
    grid and schedule, but at every search slot each (layer, step) gets a β dealt from A2SG's OWN
    choices for that (layer, step), ignoring SGV and TGC. ``pool_counts[l][t][k]`` is how often A2SG's
    search chose grid value k at (layer l, step t) over a whole fit on the pilot seed (``pilot.py
    --history``; a fit on a claim seed cannot serve: at paper scale every variant of a seed is its
    own job, with no order between them). The values are dealt from a shuffled deck of that multiset
    (a permutation of A2SG's history, reshuffled when it runs out), so the placebo's windows have
    A2SG's distribution per (layer, step) (the same mean width) but no link to the current state."""

    def __init__(self, *args, pool_counts=None, **kw):
        super().__init__(*args, **kw)
        if pool_counts is None:
            raise ValueError("st_matched needs pool_counts (A2SG's chosen-β counts per layer, step and grid value)")
        self.pool = []
        for l, row in enumerate(pool_counts):
            per = []
            for t, counts in enumerate(row):
                if len(counts) != len(self.grid):
                    raise ValueError(f"pool_counts[{l}][{t}] has {len(counts)} counts for a grid of {len(self.grid)}")
                deck = [float(self.grid[k]) for k, c in enumerate(counts) for _ in range(int(c))]
                if not deck:
                    raise ValueError(f"pool_counts[{l}][{t}] is empty")
                per.append(deck)
            self.pool.append(per)
        if len(self.pool) != len(self.beta) or any(len(r) != len(b) for r, b in zip(self.pool, self.beta)):
            raise ValueError("pool_counts must have one row per layer and one count list per time step")
        self._decks = [[[] for _ in row] for row in self.pool]

    def reseed(self, seed: int) -> None:
        super().reseed(seed)
        self._decks = [[[] for _ in row] for row in self.pool]

    def _deal(self, l: int, t: int) -> float:
        deck = self._decks[l][t]
        if not deck:
            src = self.pool[l][t]
            order = torch.randperm(len(src), generator=self.gen).tolist()
            deck.extend(src[i] for i in order)
        return deck.pop()

    def search(self, loss: torch.Tensor, trace: dict, leak: float, threshold: float, step: int = 0) -> None:
        for l in range(len(self.beta)):
            self.beta[l] = [self._deal(l, t) for t in range(len(self.beta[l]))]
        self.history.append((step, self.widths()))


def pool_counts(history, grid) -> list[list[list[int]]]:
    """``STMatched``'s pool from an ST-ASG history [(step, widths[l][t]), ...]: per layer and step, how
    often each grid value was chosen."""
    g = [float(b) for b in grid]
    L, T = len(history[0][1]), len(history[0][1][0])
    out = [[[0] * len(g) for _ in range(T)] for _ in range(L)]
    for _, w in history:
        for l in range(L):
            for t in range(T):
                k = min(range(len(g)), key=lambda i: abs(g[i] - w[l][t]))
                out[l][t][k] += 1
    return out


class MembraneGuess:
    """Our earlier guess at "adaptive" (ablation): window w_{l,t} = κ(s) σ_{l,t} from the membrane
    spread, with the block's two-sided asymmetric triangle (area 1), above/below ratio r."""

    def __init__(self, n_layers: int, T: int, ratio: float = 2.0, kappa_start: float = 1.5,
                 kappa_end: float = 0.75, momentum: float = 0.9, w_min: float = 0.2, w_max: float = 4.0):
        self.sigma = [[None] * T for _ in range(n_layers)]
        self.ratio, self.momentum = ratio, momentum
        self.kappa_start, self.kappa_end = kappa_start, kappa_end
        self.w_min, self.w_max = w_min, w_max
        self.progress = 0.0        # fraction of training done, set by the training loop
        self.training = True

    def kappa(self) -> float:
        return self.kappa_start + (self.kappa_end - self.kappa_start) * self.progress

    def width(self, layer: int, t: int) -> float:
        s = self.sigma[layer][t]
        s = 1.0 if s is None else s
        return min(max(self.kappa() * s, self.w_min), self.w_max)

    def observe(self, layer: int, t: int, x: torch.Tensor) -> None:
        s = float(x.detach().std())
        old = self.sigma[layer][t]
        self.sigma[layer][t] = s if old is None else self.momentum * old + (1 - self.momentum) * s

    def __call__(self, layer: int, t: int, x: torch.Tensor):
        if self.training:
            self.observe(layer, t, x)
        return asymmetric_window(self.width(layer, t), self.ratio)

    def widths(self) -> list[list[float]]:
        return [[self.width(l, t) for t in range(len(row))] for l, row in enumerate(self.sigma)]


def asymmetric_window(width: float, ratio: float):
    """Area-1 two-sided triangle with total support 2*width, above/below half-width ratio ``ratio``."""
    w_below = 2.0 * width / (1.0 + ratio)
    return asymmetric(a_left=1.0 / w_below, a_right=1.0 / (ratio * w_below))


class LibrarySurrogate:
    """A fixed library surrogate from ``blocks.spiking``, same at every layer and step (BOX, arctan)."""

    def __init__(self, name: str, **kw):
        self.g = SURROGATES[name](**kw)
        self.training, self.progress = True, 0.0

    def __call__(self, layer: int, t: int, x: torch.Tensor):
        return self.g


def make_surrogate(cfg: dict, n_layers: int, T: int):
    """The surrogate provider of a config's ``surrogates`` entry (``kind`` and its hyper-parameters;
    a width sweep's ``width_grid`` is read by the training loop, not here)."""
    cfg = {k: v for k, v in cfg.items() if k != "width_grid"}
    kind = cfg.pop("kind")
    if kind == "st_asg":
        return STAdaptive(n_layers, T, **cfg)
    if kind == "st_random":
        return STRandom(n_layers, T, **cfg)
    if kind == "st_matched":
        return STMatched(n_layers, T, **cfg)
    if kind == "fixed_window":
        return FixedWindow(n_layers, T, **cfg)
    if kind == "membrane_guess":
        return MembraneGuess(n_layers, T, **cfg)
    return LibrarySurrogate(kind, **cfg)
