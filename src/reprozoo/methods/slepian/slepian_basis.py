"""Spherical Slepian functions: the band-limited functions best concentrated in a region.

The concentration problem (Slepian 1960s; Simons, Dahlen & Wieczorek 2006, SIAM Review 48:504)
--------------------------------------------------------------------------------------------
Among functions band-limited to degree L, g(r) = Σ_{lm} g_lm Y_lm(r) (real orthonormal Y_lm,
``reprozoo.blocks.sphere``), find those that maximise the share of their energy inside a region R:

    λ = ∫_R g² dΩ / ∫_S² g² dΩ  =  gᵀ D g / gᵀ g,     D_{lm,l'm'} = ∫_R Y_lm Y_l'm' dΩ.

The stationary points are the eigenvectors of the (L+1)² x (L+1)² concentration matrix D; the
eigenvalues 1 >= λ_1 >= λ_2 >= ... >= 0 are the concentrations. Their sum is the Shannon number

    N = trace D = Σ_lm ∫_R Y_lm² dΩ = (L+1)² · A / (4π)     (addition theorem: Σ_m Y_lm² = (2l+1)/4π),

about how many eigenfunctions are well concentrated (λ ≈ 1) before the spectrum falls to 0. The
first N Slepian functions span, inside R, what all (L+1)² harmonics span, with N << (L+1)² when the
region is small: this is why they concentrate an encoder's capacity in a region of interest.

Spherical cap (the region used here)
------------------------------------
In a frame whose pole is the cap centre, R = {μ' >= cos Θ} is axisymmetric, so D is block-diagonal
in the order m: for each m = 0..L one (L-m+1) x (L-m+1) block

    D^m_{ll'} = 2π ∫_{cos Θ}^1 λ_l^m(μ) λ_l'^m(μ) dμ,

computed exactly by Gauss-Legendre quadrature with L+1 nodes (the integrand is a polynomial of
degree <= 2L in μ once the sin/cos pair is integrated over φ'). An eigenvector of D^m with m > 0
gives two Slepian functions with the same λ (cos mφ' and sin mφ'). A general region uses the
full matrix, :func:`concentration_matrix`, from any quadrature of R; for a rotated cap it must give
the same eigenvalues (rotation invariance, tested), and pyshtools' ``SHReturnTapers`` (Grünbaum
kernel) must too (cross-checked in the tests and recorded at run time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...blocks.sphere import (azimuthal, cap_frame, gauss_cap_quadrature, legendre_order,
                              real_sph_harm_xyz)


def cap_area_fraction(radius_deg: float) -> float:
    """A / 4π of a spherical cap of angular radius Θ: (1 - cos Θ) / 2."""
    return 0.5 * (1.0 - np.cos(np.radians(radius_deg)))


def shannon_number(L: int, radius_deg: float) -> float:
    """(L+1)² A / 4π: the sum of all concentration eigenvalues of a degree-L basis in the cap."""
    return (L + 1) ** 2 * cap_area_fraction(radius_deg)


def band_limit_for(n_modes: int, radius_deg: float) -> int:
    """Smallest L whose Shannon number in the cap reaches ``n_modes``: the band limit at which the
    first ``n_modes`` Slepian functions are the well-concentrated ones (λ_n around 1/2)."""
    return int(np.ceil(np.sqrt(n_modes / cap_area_fraction(radius_deg)))) - 1


def cap_blocks(L: int, radius_deg: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per order m = 0..L: (eigenvalues, eigenvectors) of the block D^m, eigenvectors as columns
    (coefficients on λ_l^m, l = m..L), both sorted by decreasing concentration."""
    a = np.cos(np.radians(radius_deg))
    t, wt = np.polynomial.legendre.leggauss(L + 1)
    mu, w = 0.5 * (1 - a) * t + 0.5 * (1 + a), 0.5 * (1 - a) * wt
    out = []
    for m in range(L + 1):
        lam = legendre_order(L, m, mu)  # (L-m+1, nq)
        D = 2 * np.pi * (lam * w) @ lam.T
        ev, vec = np.linalg.eigh(D)
        order = np.argsort(ev)[::-1]
        out.append((np.clip(ev[order], 0.0, 1.0), vec[:, order]))
    return out


@dataclass
class SlepianCap:
    """The ``n_modes`` best-concentrated degree-L Slepian functions of a cap, evaluated anywhere.

    ``eigenvalues[k]``, ``orders[k]`` (signed m: +m the cos mφ' member, -m the sin member) and
    ``coeffs[k]`` (on λ_l^|m|, l = |m|..L) describe function k, in decreasing concentration.
    """

    center_lat: float
    center_lon: float
    radius_deg: float
    L: int
    n_modes: int

    def __post_init__(self):
        blocks = cap_blocks(self.L, self.radius_deg)
        modes = []
        for m, (ev, _) in enumerate(blocks):
            for j in range(len(ev)):
                for sign in ((1, -1) if m > 0 else (1,)):
                    modes.append((-ev[j], m, -sign, j))  # sort key: λ desc, then m, cos before sin
        modes.sort()
        keep = modes[: self.n_modes]
        self.eigenvalues = np.array([-k[0] for k in keep])
        self.orders = np.array([k[1] * -k[2] for k in keep], int)
        self.coeffs = [blocks[k[1]][1][:, k[3]] for k in keep]
        self.all_eigenvalues = np.sort(np.concatenate(
            [np.repeat(ev, 2 if m > 0 else 1) for m, (ev, _) in enumerate(blocks)]))[::-1]
        self.frame = cap_frame(self.center_lat, self.center_lon)

    @property
    def shannon(self) -> float:
        return shannon_number(self.L, self.radius_deg)

    def cap_coordinates(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(μ', φ') of unit vectors x (N, 3) about the cap centre."""
        loc = x @ self.frame.T
        return np.clip(loc[:, 2], -1.0, 1.0), np.arctan2(loc[:, 1], loc[:, 0])

    def evaluate(self, x: np.ndarray) -> np.ndarray:
        """(N, n_modes) values of the Slepian functions (unit L2 norm on the sphere) at x (N, 3)."""
        mu, phi = self.cap_coordinates(x)
        out = np.empty((self.n_modes, len(x)))
        absm = np.abs(self.orders)
        for am in np.unique(absm):
            ks = np.flatnonzero(absm == am)
            G = np.stack([self.coeffs[k] for k in ks])  # (k_m, L-|m|+1)
            vals = G @ legendre_order(self.L, int(am), mu)  # one product per order
            for row, k in enumerate(ks):
                out[k] = vals[row] * azimuthal(int(self.orders[k]), phi)
        return out.T

    def sh_coefficients_cap_frame(self) -> np.ndarray:
        """(n_modes, (L+1)²): each Slepian function on the real harmonics of the cap frame."""
        C = np.zeros((self.n_modes, (self.L + 1) ** 2))
        for k, (m, g) in enumerate(zip(self.orders, self.coeffs)):
            ls = np.arange(abs(m), self.L + 1)
            C[k, ls * ls + ls + m] = g
        return C


def concentration_matrix(L: int, Y_nodes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """D = Yᵀ diag(w) Y for harmonics Y (n, (L+1)²) at quadrature nodes of any region R."""
    return (Y_nodes * weights[:, None]).T @ Y_nodes


def rotated_cap_concentration(L: int, center_lat: float, center_lon: float, radius_deg: float):
    """The full concentration matrix of a cap centred anywhere, built in the GEOGRAPHIC frame:
    the exact cap rule of ``gauss_cap_quadrature`` rotated to the centre, harmonics evaluated there."""
    mu, phi, w = gauss_cap_quadrature(L, radius_deg)
    s = np.sqrt(np.clip(1 - mu**2, 0, None))
    local = np.stack([s * np.cos(phi), s * np.sin(phi), mu], axis=1)
    x = local @ cap_frame(center_lat, center_lon)
    return concentration_matrix(L, real_sph_harm_xyz(L, x), w)


def pyshtools_cap_eigenvalues(L: int, radius_deg: float) -> np.ndarray:
    """Concentration eigenvalues of the same cap from pyshtools (SHTOOLS' SHReturnTapers), sorted."""
    from pyshtools.spectralanalysis import SHReturnTapers

    _, ev, _ = SHReturnTapers(np.radians(radius_deg), L)
    return np.sort(np.asarray(ev))[::-1]
