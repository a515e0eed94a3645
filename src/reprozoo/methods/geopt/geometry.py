"""2-D shapes and the geometric targets of pre-training (numpy only).

A shape is a closed polygon of K vertices in counter-clockwise order, inside |x| < 0.5 of the
domain box [-1, 1]^2. Two families, drawn at random:

* star polygons  r(θ) = R (1 + Σ_{m=2..4} a_m cos(mθ + φ_m)), stretched and rotated;
* NACA 4-digit airfoils (thickness t, camber m at p = 0.4) at an angle of attack α.

Geometric queries, all vectorised over (queries × segments):

* ``ray_cast``: distance t ≥ 0 along a unit direction d from x to the first boundary crossing
  (solve x + t d = a + u (b − a), t > 0, 0 ≤ u ≤ 1), +inf if none;
* ``nearest_on_boundary``: the closest boundary point (projection clamped to each segment);
* ``sdf``: signed distance, negative inside (inside by the even-odd crossing rule);
* ``lifted_targets``: GeoPT's lifting, as in the authors' data generator
  (``data_generation/GeoPT_PreTraining_Data.py``, ``multi_step_constrained_walk_with_surface``).
  A query point x gets a direction d and a step length s, both fixed for its whole walk. The
  supervision at step k = 0 .. T-1 is the vector p_k − c(p_k) from the nearest surface point
  c(p_k) to the walker p_k (k = 0: the static nearest-surface vector at x itself). Between two
  supervisions the walker moves by s along d; a move that would cross the surface is shortened to
  0.99 of the ray-cast hit distance (the walker stops just short of the wall and creeps along d
  towards it afterwards). The target depends on (x, d, s) and on the geometry, so the network has
  to learn how geometry is seen *along a motion*, not only where the surface is.
"""
from __future__ import annotations

import numpy as np


def star_polygon(rng: np.random.Generator, k: int) -> np.ndarray:
    th = np.linspace(0, 2 * np.pi, k, endpoint=False)
    r = np.ones(k)
    for m in (2, 3, 4):
        r += rng.uniform(-0.12, 0.12) * np.cos(m * th + rng.uniform(0, 2 * np.pi))
    pts = np.stack([np.cos(th), np.sin(th)], 1) * r[:, None]
    pts *= np.array([rng.uniform(0.6, 1.0), rng.uniform(0.3, 0.6)])  # aspect ratio
    return _rotate(pts * 0.45, rng.uniform(0, np.pi))


def naca_airfoil(rng: np.random.Generator, k: int) -> np.ndarray:
    """NACA 4-digit section, chord 0.9, cosine-spaced, CCW from the trailing edge."""
    t, m, p = rng.uniform(0.10, 0.22), rng.uniform(0.0, 0.06), 0.4
    beta = np.linspace(0, np.pi, k // 2 + 1)
    xc = 0.5 * (1 - np.cos(beta))
    yt = 5 * t * (0.2969 * np.sqrt(xc) - 0.1260 * xc - 0.3516 * xc**2 + 0.2843 * xc**3 - 0.1036 * xc**4)
    yc = np.where(xc < p, m / p**2 * (2 * p * xc - xc**2), m / (1 - p) ** 2 * (1 - 2 * p + 2 * p * xc - xc**2))
    upper = np.stack([xc, yc + yt], 1)[::-1]          # TE -> LE over the top
    lower = np.stack([xc, yc - yt], 1)[1:-1]          # LE -> TE underneath (no duplicate ends)
    pts = np.concatenate([upper, lower])              # k points, CCW
    pts = (pts - np.array([0.5, 0.0])) * 0.9
    pts = pts[::-1] if polygon_area(pts) < 0 else pts
    return _rotate(pts, -np.deg2rad(rng.uniform(-15, 15)))


def _rotate(pts: np.ndarray, a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return pts @ np.array([[c, s], [-s, c]])


def polygon_area(pts: np.ndarray) -> float:
    x, y = pts[:, 0], pts[:, 1]
    return 0.5 * float(np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y))


def random_shape(rng: np.random.Generator, k: int, airfoil_fraction: float = 0.5) -> np.ndarray:
    pts = naca_airfoil(rng, k) if rng.random() < airfoil_fraction else star_polygon(rng, k)
    assert len(pts) == k and polygon_area(pts) > 0
    return pts


def segments(poly: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return poly, np.roll(poly, -1, axis=0)


def outward_normals(poly: np.ndarray) -> np.ndarray:
    """Unit outward normal of each panel (CCW polygon: the tangent turned clockwise)."""
    a, b = segments(poly)
    t = b - a
    n = np.stack([t[:, 1], -t[:, 0]], 1)
    return n / np.linalg.norm(n, axis=1, keepdims=True)


def inside(poly: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Even-odd rule: count crossings of the ray from x towards +x̂."""
    a, b = segments(poly)
    ya, yb = a[None, :, 1], b[None, :, 1]
    px, py = x[:, None, 0], x[:, None, 1]
    straddle = (ya > py) != (yb > py)
    with np.errstate(divide="ignore", invalid="ignore"):
        xcross = a[None, :, 0] + (py - ya) * (b[None, :, 0] - a[None, :, 0]) / (yb - ya)
    return (np.sum(straddle & (xcross > px), axis=1) % 2) == 1


def nearest_on_boundary(poly: np.ndarray, x: np.ndarray) -> np.ndarray:
    a, b = segments(poly)
    ab = b - a
    u = np.einsum("mkd,kd->mk", x[:, None, :] - a[None], ab) / np.sum(ab * ab, 1)
    proj = a[None] + np.clip(u, 0, 1)[..., None] * ab[None]
    d2 = np.sum((proj - x[:, None, :]) ** 2, -1)
    return proj[np.arange(len(x)), np.argmin(d2, 1)]


def sdf(poly: np.ndarray, x: np.ndarray) -> np.ndarray:
    d = np.linalg.norm(nearest_on_boundary(poly, x) - x, axis=1)
    return np.where(inside(poly, x), -d, d)


def ray_cast(poly: np.ndarray, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """First t > 0 with x + t d on the boundary (d unit, one per query); +inf if the ray misses."""
    a, b = segments(poly)
    e = (b - a)[None]                                   # (1, K, 2)
    w = a[None] - x[:, None, :]                         # (M, K, 2)
    dd = d[:, None, :]
    den = dd[..., 0] * (-e[..., 1]) - dd[..., 1] * (-e[..., 0])   # det[d, -e]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (w[..., 0] * (-e[..., 1]) - w[..., 1] * (-e[..., 0])) / den
        u = (dd[..., 0] * w[..., 1] - dd[..., 1] * w[..., 0]) / den
    ok = (np.abs(den) > 1e-12) & (t > 1e-9) & (u >= 0) & (u <= 1)
    return np.min(np.where(ok, t, np.inf), axis=1)


def sample_outside(poly: np.ndarray, rng: np.random.Generator, m: int, box: float = 1.0,
                   margin: float = 0.0) -> np.ndarray:
    """m points uniform in [-box, box]^2 at distance > margin outside the body (rejection sampling)."""
    out = np.empty((0, 2))
    while len(out) < m:
        x = rng.uniform(-box, box, size=(2 * m, 2))
        out = np.concatenate([out, x[sdf(poly, x) > margin]])
    return out[:m]


def walk_positions(poly: np.ndarray, x: np.ndarray, d: np.ndarray, s: np.ndarray, steps: int) -> list[np.ndarray]:
    """Walker positions p_0 = x, ..., p_{steps-1}: each move is s along d, cut to 0.99 of the
    distance to the first surface crossing (the authors' collision rule)."""
    p = [np.array(x, dtype=float)]
    for _ in range(steps - 1):
        t_hit = ray_cast(poly, p[-1], d)
        p.append(p[-1] + np.where(t_hit < s, 0.99 * t_hit, s)[:, None] * d)
    return p


def lifted_targets(poly: np.ndarray, x: np.ndarray, d: np.ndarray, s: np.ndarray, steps: int) -> np.ndarray:
    """(M, 2*steps): p_k − c(p_k) at the walker positions (``walk_positions``), c the nearest
    surface point. Column block 0 (p_0 = x) is the static nearest-surface vector."""
    return np.concatenate([p - nearest_on_boundary(poly, p) for p in walk_positions(poly, x, d, s, steps)], axis=1)
