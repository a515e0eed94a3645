"""Functions on the sphere (numpy): real orthonormal spherical harmonics, unit vectors, sampling.

Generic building blocks for geographic location encoders (used by slepian); numpy only, so a cell
that needs no network does not import torch.

Real orthonormal spherical harmonics
------------------------------------
With colatitude θ, longitude φ and μ = cos θ, the real harmonics of degree l and order m are

    Y_lm(θ, φ) = λ_l^|m|(μ) · { √2 cos(mφ)   m > 0
                               { 1            m = 0
                               { √2 sin(|m|φ) m < 0

    λ_l^m(μ) = sqrt((2l+1)/(4π) · (l-m)!/(l+m)!) · P_l^m(μ)      (no Condon-Shortley phase)

so that ∫_S² Y_lm Y_l'm' dΩ = δ_ll' δ_mm'. λ is computed by the stable three-term recurrence in l
at fixed m (Holmes & Featherstone 2002):

    λ_m^m     = sqrt((2m+1)/(4π) · Π_{k=1..m} (2k-1)/(2k)) · (1-μ²)^{m/2}
    λ_{m+1}^m = sqrt(2m+3) · μ · λ_m^m
    λ_l^m     = a_lm (μ λ_{l-1}^m - b_lm λ_{l-2}^m),
                a_lm = sqrt((4l²-1)/(l²-m²)),  b_lm = sqrt(((l-1)²-m²)/(4(l-1)²-1)).

Ordering of a degree-L expansion: index l² + l + m (m = -l..l), (L+1)² functions in all, the
ordering of Rußwurm et al.'s spherical-harmonic location encoder.

Geography
---------
Latitude/longitude in degrees; unit vectors x = (cos lat cos lon, cos lat sin lon, sin lat). Every
function here that takes a position goes through μ and φ of a unit vector, so at a pole (where
longitude is undefined) the real harmonics take the same value for every longitude: for m ≠ 0,
λ_l^m(±1) = 0 exactly.
"""
from __future__ import annotations

import numpy as np

FOUR_PI = 4.0 * np.pi


def unit_vectors(lat_deg, lon_deg) -> np.ndarray:
    """(..., 3) unit vectors of geographic positions in degrees."""
    lat, lon = np.radians(np.asarray(lat_deg, float)), np.radians(np.asarray(lon_deg, float))
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=-1)


def lat_lon(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latitude and longitude in degrees (longitude in [-180, 180]) of unit vectors (..., 3)."""
    lat = np.degrees(np.arcsin(np.clip(x[..., 2], -1.0, 1.0)))
    lon = np.degrees(np.arctan2(x[..., 1], x[..., 0]))
    return lat, lon


def angular_distance_deg(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Great-circle distance in degrees (atan2 form: accurate at 0 and 180 degrees)."""
    a, b = unit_vectors(lat1, lon1), unit_vectors(lat2, lon2)
    return np.degrees(np.arctan2(np.linalg.norm(np.cross(a, b), axis=-1), np.sum(a * b, axis=-1)))


def cap_frame(center_lat: float, center_lon: float) -> np.ndarray:
    """Rows (e1, e2, c): an orthonormal frame with c at the cap centre and e1 pointing north there.

    Coordinates in this frame, μ' = x·c and φ' = atan2(x·e2, x·e1), are the colatitude cosine and
    azimuth about the cap centre, so a cap centred there becomes a polar cap (μ' >= cos Θ).
    """
    c = unit_vectors(center_lat, center_lon)
    lat, lon = np.radians(center_lat), np.radians(center_lon)
    e1 = np.array([-np.sin(lat) * np.cos(lon), -np.sin(lat) * np.sin(lon), np.cos(lat)])  # north
    e2 = np.cross(c, e1)  # east
    return np.stack([e1, e2, c])


def sample_sphere(n: int, rng: np.random.Generator) -> np.ndarray:
    """n unit vectors uniform on the sphere (normalised Gaussians)."""
    x = rng.standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sample_cap(n: int, center_lat: float, center_lon: float, radius_deg: float,
               rng: np.random.Generator) -> np.ndarray:
    """n unit vectors uniform (in area) on the spherical cap of angular radius ``radius_deg``.

    Area is uniform in μ' = cos θ' ∈ [cos Θ, 1] and φ' ∈ [0, 2π) (Archimedes), then rotated.
    """
    mu = rng.uniform(np.cos(np.radians(radius_deg)), 1.0, n)
    phi = rng.uniform(0.0, 2 * np.pi, n)
    s = np.sqrt(np.clip(1 - mu**2, 0, None))
    local = np.stack([s * np.cos(phi), s * np.sin(phi), mu], axis=1)
    return local @ cap_frame(center_lat, center_lon)


def legendre_order(L: int, m: int, mu: np.ndarray) -> np.ndarray:
    """λ_l^m(μ) for l = m..L at fixed order m >= 0: array (L-m+1, *mu.shape) (module docstring)."""
    mu = np.asarray(mu, float)
    if m > L:
        return np.zeros((0,) + mu.shape)
    out = np.empty((L - m + 1,) + mu.shape)
    k = np.arange(1, m + 1)
    pmm = np.sqrt((2 * m + 1) / FOUR_PI * np.prod((2 * k - 1) / (2 * k)))
    out[0] = pmm * np.clip(1 - mu**2, 0, None) ** (m / 2)
    if L > m:
        out[1] = np.sqrt(2 * m + 3) * mu * out[0]
    for i, l in enumerate(range(m + 2, L + 1), start=2):
        a = np.sqrt((4 * l * l - 1) / (l * l - m * m))
        b = np.sqrt(((l - 1) ** 2 - m * m) / (4 * (l - 1) ** 2 - 1))
        out[i] = a * (mu * out[i - 1] - b * out[i - 2])
    return out


def azimuthal(m: int, phi: np.ndarray) -> np.ndarray:
    """The azimuthal factor of the real harmonic of signed order m (module docstring)."""
    if m > 0:
        return np.sqrt(2.0) * np.cos(m * phi)
    if m < 0:
        return np.sqrt(2.0) * np.sin(-m * phi)
    return np.ones_like(phi)


def real_sph_harm(L: int, mu: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """All real orthonormal Y_lm, l <= L, at (μ, φ): array (N, (L+1)²), column l² + l + m."""
    mu, phi = np.asarray(mu, float).ravel(), np.asarray(phi, float).ravel()
    out = np.empty((mu.size, (L + 1) ** 2))
    for m in range(L + 1):
        lam = legendre_order(L, m, mu)  # (L-m+1, N)
        ls = np.arange(m, L + 1)
        for sign in ((1, -1) if m > 0 else (0,)):
            out[:, ls * ls + ls + sign * m] = (lam * azimuthal(sign * m, phi)).T
    return out


def real_sph_harm_xyz(L: int, x: np.ndarray) -> np.ndarray:
    """Real orthonormal Y_lm at unit vectors x (N, 3) in the geographic frame."""
    return real_sph_harm(L, x[:, 2], np.arctan2(x[:, 1], x[:, 0]))


def gauss_cap_quadrature(L: int, radius_deg: float, n_phi: int | None = None):
    """Nodes (μ', φ') and weights of a product rule on the polar cap μ' >= cos Θ.

    Gauss-Legendre in μ' with L+1 nodes and the trapezoid rule in φ' with n_phi > 2L nodes integrate
    any product of two degree-<=L harmonics over the cap exactly: the φ' rule kills every order
    |M| <= 2L except M = 0, and what is left is a polynomial of degree <= 2L in μ'.
    Returns (mu (n,), phi (n,), w (n,)) with sum(w) = cap area 2π(1 - cos Θ).
    """
    n_phi = n_phi or 2 * L + 2
    a = np.cos(np.radians(radius_deg))
    t, wt = np.polynomial.legendre.leggauss(L + 1)
    mu = 0.5 * (1 - a) * t + 0.5 * (1 + a)
    wmu = 0.5 * (1 - a) * wt
    phi = 2 * np.pi * np.arange(n_phi) / n_phi
    M, P = np.meshgrid(mu, phi, indexing="ij")
    W = np.repeat(wmu[:, None] * (2 * np.pi / n_phi), n_phi, axis=1)
    return M.ravel(), P.ravel(), W.ravel()
