"""The four location encoders compared, all at (about) the same embedding dimension D.

position (lat, lon in degrees) -> unit vector x -> embedding e(x) in R^D -> same classifier head.

- ``slepian`` (the paper): the D best-concentrated Slepian functions of the region's cap at the
  band limit L_S whose Shannon number is D (:func:`slepian_basis.band_limit_for`). Inside the cap
  they resolve detail of about 180°/L_S; outside they are nearly zero.
- ``hybrid`` (the paper): real spherical harmonics up to a low degree L_g ((L_g+1)² functions,
  global context) concatenated with the D - (L_g+1)² best Slepian functions of the same cap (band
  limit again set by the Shannon number of that count).
- ``sh`` (baseline, Rußwurm et al. 2024): all real orthonormal spherical harmonics up to L with
  (L+1)² = D, uniform resolution 180°/L over the globe.
- ``hybrid_sh1`` (control of ``hybrid_global_close_to_sh``, cold review): the hybrid's construction with
  SH to degree 1 only (4 + D - 4 Slepian functions): too little global context, so it must fail.
- ``hybrid_paper`` (the published rule, cold review): SH degrees 0..9 (100) + every Slepian function of
  the cap at the ``slepian`` band limit with λ > 0.05; larger than D, recorded, not claimed.
- ``sinusoidal`` (baseline): raw (lat/90°, lon/180°) plus multi-scale sin/cos of latitude and
  longitude (radians) at K frequencies geometric from 1 to L_S (the Slepian band limit, so the
  finest wavelength matches), 2 + 4K dimensions: the "wrap"/Space2Vec-grid family.

Pole safety: ``sh``, ``slepian`` and ``hybrid`` are finite sums of spherical harmonics, smooth
functions of x, so e is the same at a pole whatever longitude is given; ``sinusoidal`` depends on
longitude there. :func:`pole_gap` measures it.
"""
from __future__ import annotations

import numpy as np

from ...blocks.sphere import lat_lon, real_sph_harm_xyz, sample_sphere, unit_vectors
from .slepian_basis import SlepianCap, band_limit_for


class SHEncoder:
    def __init__(self, L: int):
        self.L, self.dim = L, (L + 1) ** 2

    def __call__(self, lat, lon) -> np.ndarray:
        return real_sph_harm_xyz(self.L, unit_vectors(lat, lon))


class SlepianEncoder:
    def __init__(self, cap: SlepianCap):
        self.cap, self.dim = cap, cap.n_modes

    def __call__(self, lat, lon) -> np.ndarray:
        return self.cap.evaluate(unit_vectors(lat, lon))


class HybridEncoder:
    def __init__(self, L_global: int, cap: SlepianCap):
        self.sh, self.slep = SHEncoder(L_global), SlepianEncoder(cap)
        self.dim = self.sh.dim + self.slep.dim

    def __call__(self, lat, lon) -> np.ndarray:
        return np.concatenate([self.sh(lat, lon), self.slep(lat, lon)], axis=1)


class PaperHybridEncoder(HybridEncoder):
    """The published encoder rule (the paper's released code, its "slepian" method): global real SH of
    degrees 0..L_g - 1 concatenated with every Slepian function of the cap at band limit L whose
    concentration λ exceeds ``lambda_min`` (0.05 there). Its dimension is not D."""

    def __init__(self, n_sh_degrees: int, center_lat: float, center_lon: float, radius_deg: float, L: int,
                 lambda_min: float):
        probe = SlepianCap(center_lat, center_lon, radius_deg, L, 1)
        n = int(np.sum(probe.all_eigenvalues > lambda_min))
        super().__init__(n_sh_degrees - 1, SlepianCap(center_lat, center_lon, radius_deg, L, n))
        self.lambda_min = lambda_min


class SinusoidalEncoder:
    def __init__(self, n_freq: int, k_max: float):
        self.freqs = np.geomspace(1.0, k_max, n_freq)
        self.dim = 2 + 4 * n_freq

    def __call__(self, lat, lon) -> np.ndarray:
        lat, lon = np.asarray(lat, float), np.asarray(lon, float)
        a, b = np.radians(lat)[:, None] * self.freqs, np.radians(lon)[:, None] * self.freqs
        return np.concatenate([lat[:, None] / 90.0, lon[:, None] / 180.0,
                               np.sin(a), np.cos(a), np.sin(b), np.cos(b)], axis=1)


def make_encoder(variant: str, p: dict):
    """The encoder of a variant from the scale config (keys ``region`` and ``encoder``)."""
    r, e = p["region"], p["encoder"]
    D = int(e["dim"])
    L_sh = int(round(np.sqrt(D))) - 1
    if (L_sh + 1) ** 2 != D:
        raise ValueError(f"encoder.dim = {D} must be a square (L+1)^2 for the SH baseline")
    L_s = band_limit_for(D, r["radius_deg"])
    if variant == "sh":
        return SHEncoder(L_sh)
    if variant == "slepian":
        return SlepianEncoder(SlepianCap(r["lat"], r["lon"], r["radius_deg"], L_s, D))
    if variant in ("hybrid", "hybrid_sh1"):
        # hybrid_sh1 (cold review): the control of hybrid_global_close_to_sh, the same construction
        # with SH to degree 1 only (4 functions + D - 4 Slepian), too little global context
        Lg = int(e["hybrid_sh_degree"]) if variant == "hybrid" else int(e.get("control_sh_degree", 1))
        n = D - (Lg + 1) ** 2
        cap = SlepianCap(r["lat"], r["lon"], r["radius_deg"], band_limit_for(n, r["radius_deg"]), n)
        return HybridEncoder(Lg, cap)
    if variant == "sinusoidal":
        return SinusoidalEncoder((D - 2) // 4, float(L_s))
    if variant == "hybrid_paper":
        # the published rule at the Slepian variant's band limit: SH degrees 0..9 + Slepian λ > 0.05
        return PaperHybridEncoder(int(e.get("paper_sh_degrees", 10)), r["lat"], r["lon"], r["radius_deg"], L_s,
                                  float(e.get("paper_lambda_min", 0.05)))
    raise KeyError(f"unknown variant '{variant}': expected slepian, hybrid, sh, sinusoidal, hybrid_sh1 or "
                   "hybrid_paper")


def pole_gap(encoder, n_lon: int = 36) -> float:
    """max over both poles and n_lon longitudes of |e(pole, lon) - e(pole, lon_0)|, relative to the
    RMS embedding norm over the sphere: 0 for a pole-safe encoder, O(1) for one that is not."""
    lon = np.linspace(-180.0, 180.0, n_lon, endpoint=False)
    gaps = []
    for lat in (90.0, -90.0):
        e = encoder(np.full(n_lon, lat), lon)
        gaps.append(np.max(np.linalg.norm(e - e[0], axis=1)))
    ref = encoder(*lat_lon(sample_sphere(2000, np.random.default_rng(0))))
    return float(max(gaps) / np.sqrt(np.mean(np.sum(ref**2, axis=1))))
