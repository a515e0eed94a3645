"""Smooth dilated stars: DKMP's star leaves picked by *soft* distance ranks, so the energy is a
continuously differentiable function of the positions (a force field usable for MD).

Why. ``blocks.atomistic.dilated`` picks a star's k leaves at hard distance ranks (``floor((m + 1/2)
n / k)`` of the n atoms of a shell). When two atoms of a shell swap rank, or an atom enters or
leaves the shell, the picked set changes and the energy jumps: at thermal motion this happens within
a few fs, and central differences of the energy over 0.001 A disagree with the forces (issue 24:
median relative error 0.29 at smoke). Here the same rule is interpolated so that an atom entering
or leaving the star does so with zero weight.

Definitions (one atom i, one shell [r_in, r_out) with leaf budget k; d_j = |r_ij| for the atoms j
of the shell; w_j = the shell window of d_j, 1 inside, cosine ramps to 0 at both radii, the same
window the layer multiplies its filters with):

* soft count   n_i   = sum_j w_j
* soft rank    rho_j = sum_{j' != j} w_j' S((d_j - d_j') / tau),  S(x) = 0 (x <= -1), 1 (x >= 1),
  1/2 + 3x/4 - x^3/4 between (C1): the (window-weighted) number of atoms closer than j, swaps
  smoothed over a distance difference of +- tau (``rank_width``);
* targets      t_m   = (m + 1/2) n_i / k - 1/2, m = 0..k-1 (the hard rule's dilated ranks
  floor((m + 1/2) n / k), centred: with n = k every rank is a target);
* leaf weight  g_j   = 1 - prod_m (1 - b(rho_j - t_m)),  b(x) = cos^2(pi x / 2) for |x| < 1, else 0.
* normalised   g_j  <- g_j K / psi(s),  s = sum_j w_j g_j,  K = min(n_i, k) (C1, :func:`smooth_min`),
  psi(s) = s where s >= K / 4 (C1 floor below, :func:`star_scale`): each star's weights sum to K,
  a k-leaf star (cold review of b59ea2e: without it the sums ranged 2.2-5.7 and 3.0-12.3 for k = 4
  and 8 at 0.08 A rattle, because tau is wider than a shell's thermal spread and the soft ranks blur).

With hard ranks (all |d_j - d_j'| >= tau, all w = 1) rho_j is j's rank and a target on an integer
rank picks that atom with weight 1; a target between two ranks splits between the two atoms
(cos^2 + sin^2 = 1), so each target reaches at most two atoms. Every edge with g_j > 0 passes a
message weighted by w_j g_j; g, S, b and the windows are C1, so the energy is C1 and the forces
(-dE/dx by autograd, through the weights too) are continuous. At a switch (an atom's bumps all
reach |x| = 1) its weight is exactly 0, so dropping or adding that edge changes nothing.

The selection runs inside the model on the candidate list (every atom within the outer radius,
the same neighbour list as a dense model at that radius): the graph a step builds is the plain
radius list, the star selection is part of the forward pass (counted in the step's time and
memory), and only the selected edges carry filter networks and messages.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...blocks.atomistic import AtomsData
from ...blocks.atomistic.dilated import DilatedSchNet, distinct_shells, parse_shells, shell_window
from ...blocks.atomistic.schnet import edge_vectors


def smooth_step(x):
    """0 for x <= -1, 1 for x >= 1, the cubic 1/2 + 3x/4 - x^3/4 between (C1: slope 0 at +-1)."""
    x = torch.clamp(x, -1.0, 1.0)
    return 0.5 + 0.75 * x - 0.25 * x**3


def bump(x):
    """cos^2(pi x / 2) for |x| < 1, exactly 0 outside (C1)."""
    return torch.cos(0.5 * math.pi * torch.clamp(x, -1.0, 1.0)) ** 2 * (x.abs() < 1.0).to(x.dtype)


NORM_PATCH = 1.0  # atoms: the width of smooth_min's blend below n = k
NORM_FLOOR = 0.25  # a star's leaf-weight sum is normalised exactly where it is at least a quarter of K


def soft_star_weights(d, w, centre, k: int, tau: float, normalise: bool = True):
    """Leaf weights g (E,) of one shell's candidate edges (see the module docstring).

    ``d`` (E,) edge lengths (differentiable), ``w`` (E,) their shell windows (differentiable),
    ``centre`` (E,) int64 receiving atom of each edge, ``k`` leaves per star, ``tau`` the rank
    softness in A. Exact and O(E): the stars are laid out as rows of a padded (stars x largest star)
    table, each row sorted by distance, and the pairs closer than ``tau`` enter through prefix sums
    of the moments of their distances (the cubic S is a polynomial on [-tau, tau]). ``normalise``
    (default): each star's weights scaled so that sum w g = min(n, k) (:func:`star_scale`)."""
    E = int(d.shape[0])
    if E == 0:
        return d.new_zeros(0)
    if E > 1 and not bool((centre[1:] >= centre[:-1]).all()):  # group the stars' edges together
        order = torch.argsort(centre, stable=True)
        g = soft_star_weights(d[order], w[order], centre[order], k, tau, normalise)
        return torch.empty_like(g).index_put((order,), g)
    _, counts = torch.unique_consecutive(centre, return_counts=True)
    G, M = int(counts.shape[0]), int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    row = torch.repeat_interleave(torch.arange(G), counts)
    col = torch.arange(E) - starts[row]
    d0 = d.detach()
    pad = float(d0.max()) + 2.0 * tau + 1.0  # padding: farther than tau from every edge, weight 0
    D = d.new_full((G, M), pad).index_put((row, col), d)
    W = w.new_zeros((G, M)).index_put((row, col), w)
    perm = torch.argsort(D.detach(), dim=1)
    Ds, Ws = torch.gather(D, 1, perm), torch.gather(W, 1, perm)
    Dk = Ds.detach().contiguous()
    lo = torch.searchsorted(Dk, Dk - tau, right=True)   # first q with d_q > d_p - tau (S < 1 from here)
    hi = torch.searchsorted(Dk, Dk + tau, right=False)  # first q with d_q >= d_p + tau (S = 0 from here)
    # sum_q w_q S((x_p - x_q) / tau) over q in [lo, hi) except p, with the cubic S, from the prefix
    # sums of w x^m (m = 0..3); x measured from the row's nearest atom, so that x is in [0, shell width]
    x = Ds - Dk[:, :1]
    x2 = x * x
    wx = Ws[None] * torch.stack([torch.ones_like(x), x, x2, x2 * x])          # (4, G, M)
    c = torch.cat([Ws.new_zeros((4, G, 1)), torch.cumsum(wx, 2)], 2)          # prefix sums, (4, G, M + 1)
    a0, a1, a2, a3 = torch.gather(c, 2, hi.expand(4, G, M)) - torch.gather(c, 2, lo.expand(4, G, M)) - wx
    near = 0.5 * a0 + 0.75 / tau * (x * a0 - a1) - 0.25 / tau**3 * (x2 * x * a0 - 3 * x2 * a1 + 3 * x * a2 - a3)
    rho = torch.gather(c[0], 1, lo) + near   # atoms closer by >= tau count fully (S = 1)
    n = c[0][:, -1:]
    # only the targets within 1 of rho have a bump: m in ((rho - 1/2) k / n - 1/2, (rho + 3/2) k / n - 1/2)
    with torch.no_grad():
        nn = torch.clamp(n, min=1e-9)
        m_lo = torch.clamp(torch.floor((rho - 0.5) * k / nn - 0.5), 0, k - 1)
        m_hi = torch.clamp(torch.floor((rho + 1.5) * k / nn - 0.5), 0, k - 1)
        J = int((m_hi - m_lo).max()) + 1
        ms = m_lo[..., None] + torch.arange(J, dtype=rho.dtype)
        valid = (ms <= k - 1).to(rho.dtype)
    t = (ms + 0.5) * n[..., None] / k - 0.5
    g = 1.0 - torch.prod(1.0 - bump(rho[..., None] - t) * valid, dim=-1)
    if normalise:
        g = g * star_scale(n, (Ws * g).sum(1, keepdim=True), k)
    return torch.zeros_like(g).scatter(1, perm, g)[row, col]


def smooth_min(n, k: float, a: float = NORM_PATCH):
    """min(n, k), C1, exact outside n in (k - a, k): n below, k from n = k on, and between the cubic
    (k - a) + a (t + t^2 - t^3), t = (n - k + a) / a (slope 1 at t = 0, 0 at t = 1; at most 0.15 a
    above n), so a star of n = k atoms keeps all of them with weight 1, as the hard rule does."""
    t = torch.clamp((n - (k - a)) / a, 0.0, 1.0)
    mid = (k - a) + a * (t + t * t - t * t * t)
    return torch.where(n <= k - a, n, torch.where(n >= k, torch.full_like(n, float(k)), mid))


def star_scale(n, s, k: int, floor: float = NORM_FLOOR):
    """The factor that normalises a star (cold review of b59ea2e, item 1): its window-weighted leaf
    weights sum to K = min(n, k) (the hard rule's leaf count: k, or every atom of a shell with fewer
    than k; C1 via :func:`smooth_min`), i.e. K / s with s the sum of w g over the star. Why: the soft
    ranks blur when the rank width is wider than a shell's thermal spread (a shell's distances within
    tau of each other), so the bumps miss the targets and s strays from k (2.2-5.7 and 3.0-12.3 for
    k = 4 and 8 at 0.08 A rattle in bulk Cu, 1.6 and 0 on the perfect lattice). s enters as
    psi = s for s >= floor K and (floor^2 K^2 + s^2) / (2 floor K) below (C1, >= floor K / 2): the
    factor is at most 2 / floor, a star with almost no leaf weight is not blown up, and one with none
    (every distance of the shell tied, e.g. the perfect lattice's 24-atom shell for k = 8) stays
    empty. So the weights stay C1 and bounded."""
    K = smooth_min(n, float(k))
    fK = floor * K
    psi = torch.where(s >= fK, s, (fK * fK + s * s) / (2.0 * fK + 1e-30))
    return K / torch.clamp(psi, min=1e-30)


def layer_edges(dist, edge_index, r_in: float, r_out: float, k, width: float, tau: float, normalise: bool = True):
    """One layer's edges: (positions into the candidate list, edge weight = window x leaf weight).
    ``k`` None: every atom of the shell (weight = window)."""
    d0 = dist.detach()
    idx = torch.nonzero((d0 >= r_in) & (d0 < r_out), as_tuple=True)[0]
    d = dist[idx]
    env = shell_window(d, r_in, r_out, width)
    if k is None:
        return idx, env
    g = soft_star_weights(d, env, edge_index[0, idx], int(k), tau, normalise)
    keep = torch.nonzero(g.detach() > 0, as_tuple=True)[0]
    return idx[keep], (env * g)[keep]


class SoftStarSchNet(DilatedSchNet):
    """:class:`DilatedSchNet` whose star shells pick their leaves by soft ranks (module docstring).

    Takes the plain candidate list at the outer radius (any :class:`AtomsData` at that cutoff); layer
    l passes messages over the edges of shell l with a positive leaf weight, each weighted by its
    shell window times its leaf weight."""

    def __init__(self, layer_shells, window_width: float = 0.3, rank_width: float = 0.05, normalise: bool = True,
                 **schnet_kwargs):
        super().__init__(layer_shells, window_width, **schnet_kwargs)
        self.layer_ks = [s.k for s in parse_shells(layer_shells)]
        self.rank_width, self.normalise = float(rank_width), bool(normalise)
        self.hparams.update(rank_width=self.rank_width, select="soft", normalise=self.normalise)

    def representation(self, numbers, positions, edge_index, shifts=None):
        _, dist = edge_vectors(positions, edge_index, shifts)
        cache = {}
        x = self.embedding(numbers)
        for (r_in, r_out), k, block in zip(self.layer_shells, self.layer_ks, self.interactions):
            if (r_in, r_out, k) not in cache:
                idx, env = layer_edges(dist, edge_index, r_in, r_out, k, self.window_width, self.rank_width,
                                       self.normalise)
                cache[(r_in, r_out, k)] = (self.rbf(dist[idx]), env, edge_index[:, idx])
            r, env, ei = cache[(r_in, r_out, k)]
            x = block(x, r, env, ei)
        return x


class SoftStarData(AtomsData):
    """The candidate list (plain radius graph at the outermost shell radius) for a
    :class:`SoftStarSchNet`, with the message counts of its layers (``messages_per_layer``)."""

    def __init__(self, frames: dict, layer_shells, window_width: float = 0.3, rank_width: float = 0.05, device=None,
                 normalise: bool = True):
        self.layer_shells = parse_shells(layer_shells)
        self.shells = distinct_shells(self.layer_shells)
        self.window_width, self.rank_width, self.device = float(window_width), float(rank_width), device
        self.normalise = bool(normalise)
        self.mode = "soft"
        super().__init__(frames, max(s.r_out for s in self.shells))

    def subset(self, idx) -> "SoftStarData":
        idx = [int(k) for k in idx]
        fr = {k: ([v[i] for i in idx] if isinstance(v, list) else (None if v is None else np.asarray(v)[idx]))
              for k, v in self.frames.items()}
        out = type(self)(fr, self.layer_shells, self.window_width, self.rank_width, self.device, self.normalise)
        out._graphs = {new: self._graphs[old] for new, old in enumerate(idx) if old in self._graphs}
        return out

    def collate(self, idx, dtype=None):
        b = super().collate(idx, dtype)
        return b if self.device in (None, "cpu") else b.to(device=self.device)

    def layer_weights(self, k: int):
        """Per layer: (edge positions into frame k's candidate list, edge weights), float64."""
        b = AtomsData.collate(self, [k], dtype=torch.float64)
        with torch.no_grad():
            _, dist = edge_vectors(b.positions, b.edge_index, b.shifts)
            return [layer_edges(dist, b.edge_index, s.r_in, s.r_out, s.k, self.window_width, self.rank_width,
                                self.normalise)
                    for s in self.layer_shells]

    def messages_per_layer(self, k: int) -> np.ndarray:
        """Edges each model layer passes messages over (positive weight), for frame k (L,)."""
        return np.array([len(idx) for idx, _ in self.layer_weights(k)], dtype=np.int64)
