"""Invariant structure descriptors and latent-space tools (torch; any dtype, differentiable).

Power spectrum (SOAP-like, per atom)
------------------------------------
``p_i[n, n', l] = sum_{j, k in N(i)} g_n(r_ij) g_n'(r_ik) P_l(cos theta_jik)``

with ``g_n(r) = rbf_n(r) * fcut(r)`` (Gaussian radial basis times cosine cutoff) and ``P_l`` the
Legendre polynomials (the pair j = k is included, as in SOAP). It is invariant to rotations,
translations and permutations of the neighbours, and equivariant to permutations of the atoms. By
the addition theorem it is the SOAP power spectrum up to a factor (2l+1)/4pi per l.

The double sum over neighbour pairs is not formed: ``cos^k theta_jik = (u_ij . u_ik)^k`` expands
into the monomials ``u^(a,b,c) = ux^a uy^b uz^c`` (a+b+c = k) with multinomial weights, so with the
moments ``M_abc[i, n] = sum_j g_n(r_ij) u_ij^(a,b,c)``,
``q_k[i, n, n'] = sum_{a+b+c=k} k!/(a! b! c!) M_abc[i, n] M_abc[i, n'] = sum_{j,k} g_n g_n' cos^k theta``
costs O(E (k+1)(k+2)/2), and ``P_l = sum_k a_lk q_k`` with the monomial coefficients of P_l.
``power_spectrum_pairs`` is the literal O(sum deg^2) double sum (reference for tests). ``l_max <= 6``.

Other helpers
-------------
``composition_tokens(numbers, batch, n_structures)``: the distinct elements of each structure with
their counts (vectorised), for set/transformer models over compositions.
``mean_pool(x, batch, n)``; ``precision_at_k(latents, labels, k)`` (retrieval by cosine similarity
of z-scored latents, the query itself excluded).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .basis import CosineCutoff, GaussianRBF
from .schnet import edge_vectors, scatter_sum

# monomial coefficients of the Legendre polynomials: P_l(x) = sum_k LEGENDRE[l, k] x^k
LEGENDRE = np.zeros((7, 7))
LEGENDRE[0, 0] = 1.0
LEGENDRE[1, 1] = 1.0
for _l in range(1, 6):  # (l+1) P_{l+1} = (2l+1) x P_l - l P_{l-1}
    LEGENDRE[_l + 1, 1:] += (2 * _l + 1) / (_l + 1) * LEGENDRE[_l, :-1]
    LEGENDRE[_l + 1] -= _l / (_l + 1) * LEGENDRE[_l - 1]


def legendre(x: torch.Tensor, l_max: int) -> torch.Tensor:
    """P_0..P_lmax at x, stacked on a new last axis (Bonnet recursion)."""
    out = [torch.ones_like(x), x]
    for l in range(1, l_max):
        out.append(((2 * l + 1) * x * out[l] - l * out[l - 1]) / (l + 1))
    return torch.stack(out[:l_max + 1], dim=-1)


class PowerSpectrum(nn.Module):
    """Per-atom radial x angular power spectrum (no trainable parameters).

    ``forward(positions, edge_index, shifts) -> (N, n_features)`` with
    ``n_features = n_radial (n_radial + 1) / 2 * (l_max + 1)`` (pairs n <= n').
    Radial basis: ``n_radial`` Gaussians with centres evenly spaced in [r_min, cutoff].
    """

    def __init__(self, n_radial: int = 6, l_max: int = 4, cutoff: float = 5.0, r_min: float = 1.5,
                 width: float | None = None):
        super().__init__()
        if not 0 <= l_max <= 6:
            raise ValueError("l_max must be in 0..6")
        self.n_radial, self.l_max, self.cutoff = int(n_radial), int(l_max), float(cutoff)
        self.rbf = GaussianRBF(n_radial, cutoff, start=r_min, width=width)
        self.fcut = CosineCutoff(cutoff)
        self.register_buffer("coef", torch.tensor(LEGENDRE[:l_max + 1, :l_max + 1], dtype=torch.float64))
        iu = torch.triu_indices(n_radial, n_radial)
        self.register_buffer("iu", iu)
        self.n_features = iu.shape[1] * (l_max + 1)
        # monomials u^(a,b,c) grouped by degree k; within degree k the order is
        # [ux * (degree k-1 list), uy * (degree k-1 monomials with a = 0: its last k), uz * (0, 0, k-1)],
        # so they are built by slicing, without gathers (see ``monomials``)
        expo, weight, self.slices = [(0, 0, 0)], [1.0], [(0, 1)]
        prev = [(0, 0, 0)]
        for k in range(1, l_max + 1):
            cur = [(a + 1, b, c) for a, b, c in prev] + [(0, b + 1, c) for _, b, c in prev[-k:]] + [(0, 0, k)]
            self.slices.append((len(expo), len(expo) + len(cur)))
            expo += cur
            weight += [math.factorial(k) / (math.factorial(a) * math.factorial(b) * math.factorial(c)) for a, b, c in cur]
            prev = cur
        self.expo = expo
        self.register_buffer("mweight", torch.tensor(weight, dtype=torch.float64))

    def radial(self, dist: torch.Tensor) -> torch.Tensor:
        return self.rbf(dist).to(dist.dtype) * self.fcut(dist).unsqueeze(-1)

    def monomials(self, u: torch.Tensor) -> torch.Tensor:
        """(E, n_monomials): ux^a uy^b uz^c for every exponent triple of degree <= l_max (``self.expo``)."""
        ux, uy, uz = u[:, 0:1], u[:, 1:2], u[:, 2:3]
        levels = [torch.ones_like(ux)]
        for k in range(1, self.l_max + 1):
            m = levels[-1]
            levels.append(torch.cat([m * ux, m[:, -k:] * uy, m[:, -1:] * uz], dim=1))
        return torch.cat(levels, dim=1)

    def forward(self, positions, edge_index, shifts=None, n_atoms: int | None = None) -> torch.Tensor:
        n = int(n_atoms) if n_atoms is not None else positions.shape[0]
        vec, dist = edge_vectors(positions, edge_index, shifts)
        keep = dist < self.cutoff
        if not bool(keep.all()):
            vec, dist, edge_index = vec[keep], dist[keep], edge_index[:, keep]
        u = vec / dist.clamp_min(1e-9).unsqueeze(-1)
        g = self.radial(dist)                                                    # (E, R)
        mono = self.monomials(u)                                                 # (E, C)
        m = scatter_sum(g.unsqueeze(-1) * mono.unsqueeze(1), edge_index[0], n)  # (N, R, C)
        mw = m * self.mweight.to(m.dtype)
        q = torch.stack([torch.einsum("iac,ibc->iab", mw[:, :, a:b], m[:, :, a:b]) for a, b in self.slices],
                        dim=-1)                                                  # (N, R, R, K)
        p = q @ self.coef.to(q.dtype).T                                          # P_l = sum_k a_lk q_k
        return p[:, self.iu[0], self.iu[1], :].reshape(n, -1)


def power_spectrum_pairs(ps: PowerSpectrum, positions, edge_index, shifts=None) -> torch.Tensor:
    """The literal double sum over neighbour pairs (O(sum deg^2)); reference for :class:`PowerSpectrum`."""
    n = positions.shape[0]
    vec, dist = edge_vectors(positions, edge_index, shifts)
    keep = dist < ps.cutoff
    vec, dist, centre = vec[keep], dist[keep], edge_index[0][keep]
    g = ps.radial(dist)
    u = vec / dist.unsqueeze(-1)
    out = positions.new_zeros((n, ps.n_radial, ps.n_radial, ps.l_max + 1))
    for i in range(n):
        sel = torch.nonzero(centre == i).flatten()
        if len(sel) == 0:
            continue
        cos = (u[sel] @ u[sel].T).clamp(-1, 1)
        pl = legendre(cos, ps.l_max)                             # (d, d, L)
        out[i] = torch.einsum("ja,kb,jkl->abl", g[sel], g[sel], pl)
    return out[:, ps.iu[0], ps.iu[1], :].reshape(n, -1)


def composition_tokens(numbers: torch.Tensor, batch: torch.Tensor, n_structures: int, n_types: int = 128):
    """Distinct elements of each structure (vectorised; no Python loop over structures).

    Returns ``(z (B, T) int64 padded with 0, counts (B, T) float (0 = padding), valid (B, T) bool,
    atom_token (N,) index of each atom's token within its structure)``; tokens are sorted by Z.
    """
    key = batch * n_types + numbers
    uniq, inv, cnt = torch.unique(key, sorted=True, return_inverse=True, return_counts=True)
    tok_struct = uniq // n_types
    first = torch.full((n_structures,), len(uniq), dtype=torch.long, device=numbers.device)
    first = first.scatter_reduce(0, tok_struct, torch.arange(len(uniq), device=numbers.device), reduce="amin")
    rank = torch.arange(len(uniq), device=numbers.device) - first[tok_struct]
    T = int(rank.max()) + 1 if len(uniq) else 1
    z = numbers.new_zeros((n_structures, T))
    counts = torch.zeros((n_structures, T), dtype=torch.float64, device=numbers.device)
    valid = torch.zeros((n_structures, T), dtype=torch.bool, device=numbers.device)
    z[tok_struct, rank] = uniq % n_types
    counts[tok_struct, rank] = cnt.to(torch.float64)
    valid[tok_struct, rank] = True
    return z, counts, valid, rank[inv]


def mean_pool(x: torch.Tensor, batch: torch.Tensor, n: int) -> torch.Tensor:
    s = scatter_sum(x, batch, n)
    c = torch.bincount(batch, minlength=n).clamp_min(1).to(x.dtype)
    return s / c.unsqueeze(-1)


def precision_at_k(latents, labels, k: int = 5, per_query: bool = False):
    """Mean fraction of each structure's k nearest neighbours (cosine similarity of per-dimension
    z-scored latents, itself excluded) that share its label; ``per_query``: the fraction of each
    structure (an array, the test units of a retrieval claim) instead of their mean."""
    x = np.asarray(latents, dtype=float)
    labels = np.asarray(labels)
    x = (x - x.mean(0)) / (x.std(0) + 1e-8)
    x = x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)
    sim = x @ x.T
    np.fill_diagonal(sim, -np.inf)
    k = min(k, len(x) - 1)
    nn_idx = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    hits = (labels[nn_idx] == labels[:, None]).mean(axis=1)
    return hits if per_query else float(hits.mean())


def sigreg_epps_pulley(z: torch.Tensor, n_slices: int = 64, t_max: float = 3.0, n_points: int = 17,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Sliced isotropic-Gaussian regulariser (LeJEPA's SIGReg): project the embeddings (B, D) on
    random unit directions and average the Epps-Pulley statistic of each projection against N(0, 1)
    (the weighted squared distance between the empirical and the Gaussian characteristic functions)."""
    b, d = z.shape
    a = torch.randn((d, n_slices), generator=generator, dtype=torch.float64).to(z.dtype)
    a = a / a.norm(dim=0, keepdim=True)
    x = z @ a                                                    # (B, S)
    t = torch.linspace(0, t_max, n_points, dtype=z.dtype)
    dt = t_max / (n_points - 1)
    w = torch.full((n_points,), 2 * dt, dtype=z.dtype)
    w[0] = w[-1] = dt
    phi = torch.exp(-0.5 * t * t)
    xt = x.unsqueeze(-1) * t                                     # (B, S, P)
    err = (torch.cos(xt).mean(0) - phi) ** 2 + torch.sin(xt).mean(0) ** 2
    return (err @ (w * phi)).mean() * b


__all__ = ["LEGENDRE", "legendre", "PowerSpectrum", "power_spectrum_pairs", "composition_tokens", "mean_pool",
           "precision_at_k", "sigreg_epps_pulley"]
