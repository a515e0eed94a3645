"""Constant-strength source panel method for 2-D potential flow past a closed body (numpy).

Physics. Incompressible, irrotational flow u = U∞ + ∇φ with ∇²φ = 0 outside the body and no
flow through the wall, u·n = 0. The body's polygon carries K straight panels with source
strength σ_j (constant on panel j). In panel j's local frame (origin at its start, ξ along the
panel of length L, η along its left normal), a unit source sheet induces at (ξ, η)

    u_ξ = ln(r₁ / r₂) / 2π,     u_η = (θ₂ − θ₁) / 2π,

r₁, r₂ the distances to the panel's ends and θ₁ = atan2(η, ξ), θ₂ = atan2(η, ξ − L). On the
panel itself, approached from the fluid side, the normal velocity is σ/2 along the outward
normal. Collocation at the K panel midpoints gives the K × K system

    Σ_j σ_j V_j(c_i)·n_i = −U∞·n_i,

and the velocity anywhere outside is U∞ + Σ_j σ_j V_j(x). Source panels carry no circulation:
the flow is the non-lifting one (no Kutta condition), which is exact for the circle and a
smooth Laplace field around any shape. Checked in tests against the closed form for a cylinder,
u = U(1 − R² cos 2θ / r²), v = −U R² sin 2θ / r².
"""
from __future__ import annotations

import numpy as np

from .geometry import outward_normals, segments


def source_panel_velocity(poly: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(M, K, 2): velocity at x induced by each panel with unit source strength."""
    a, b = segments(poly)
    tvec = b - a
    length = np.linalg.norm(tvec, axis=1)
    t = tvec / length[:, None]
    nl = np.stack([-t[:, 1], t[:, 0]], 1)                          # left normal (inward for CCW)
    r = x[:, None, :] - a[None]                                    # (M, K, 2)
    xi = np.einsum("mkd,kd->mk", r, t)
    eta = np.einsum("mkd,kd->mk", r, nl)
    r1 = np.hypot(xi, eta)
    r2 = np.hypot(xi - length, eta)
    u_xi = np.log(r1 / r2) / (2 * np.pi)
    u_eta = (np.arctan2(eta, xi - length) - np.arctan2(eta, xi)) / (2 * np.pi)
    return u_xi[..., None] * t[None] + u_eta[..., None] * nl[None]


def solve_source_panels(poly: np.ndarray, u_inf: np.ndarray) -> np.ndarray:
    """Panel source strengths σ (K,) for free stream u_inf."""
    a, b = segments(poly)
    mid = 0.5 * (a + b)
    n = outward_normals(poly)
    v = source_panel_velocity(poly, mid)                            # (K, K, 2)
    A = np.einsum("ikd,id->ik", v, n)
    np.fill_diagonal(A, 0.5)                                        # fluid-side limit on the panel itself
    return np.linalg.solve(A, -n @ u_inf)


def flow_velocity(poly: np.ndarray, sigma: np.ndarray, u_inf: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(M, 2) velocity U∞ + Σ σ_j V_j(x) at points outside the body."""
    return u_inf[None] + np.einsum("mkd,k->md", source_panel_velocity(poly, x), sigma)
