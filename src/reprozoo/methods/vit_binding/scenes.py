"""Procedural colour x shape scenes and their binding labels (numpy only, deterministic from a seed).

Features and conjunctions. A scene holds objects, each one colour c (of ``N_COLOURS``) and one
shape s (of ``N_SHAPES``). Its *features* F are which colours and which shapes occur (multi-hot,
``N_COLOURS + N_SHAPES`` bits); its *conjunctions* Y are which (colour, shape) pairs occur
(multi-hot over ``N_COLOURS * N_SHAPES``, index ``c * N_SHAPES + s``). F is a function of Y, so
H(Y) = H(F) + H(Y|F), and H(Y|F) is exactly the information "which feature goes with which":
binding. A representation Z carries binding information I(Y; Z | F) = I(Y; Z) - I(F; Z).

Balanced binding conditions (the probes' data; following the paper's BalancedColorShape design:
draw F uniformly from a fixed-size support, then Y uniformly among the conjunction sets that cover
exactly F, so H(Y|F) is known in closed form):

* ``distinct``: 3 objects, 3 distinct colours and 3 distinct shapes, no overlap; Y is one of the
  3! pairings: H(Y|F) = log2 6 bits;
* ``shared``: 3 objects over 2 colours x 2 shapes (two objects share a colour, two share a shape),
  no overlap; Y is 3 of the 4 cells of the 2 x 2 grid: H(Y|F) = log2 4 = 2 bits;
* ``occluded``: as ``distinct`` but every object overlaps the one drawn before it (later objects
  hide parts of earlier ones): H(Y|F) = log2 6 bits;
* ``straddle``: as ``distinct`` (no overlap) but the objects are placed anywhere in the image,
  not in the ViT's patch cells, so most objects straddle patch borders and no single patch holds a
  whole object: locality alone no longer binds colour and shape in one token. H(Y|F) = log2 6 bits.

Recognition data (what the ViT is trained on): 1-3 objects of i.i.d. distinct colour-shape
classes, in patch cells, overlapping in a chain, or placed freely across patch borders (fractions
set by the config); the label is the multi-hot set of classes present.

Images are H x W x 3 in [0, 1] (channels first on return), drawn at 2x resolution and averaged
(anti-aliased edges), on a dark background with pixel noise; object size and position jitter.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

COLOURS = {  # RGB in [0, 1]
    "red": (0.95, 0.15, 0.12),
    "green": (0.15, 0.85, 0.20),
    "blue": (0.20, 0.35, 1.00),
    "yellow": (0.98, 0.88, 0.15),
}
SHAPES = ("circle", "square", "triangle", "cross")
N_COLOURS, N_SHAPES = len(COLOURS), len(SHAPES)
N_FEATURES, N_CONJ = N_COLOURS + N_SHAPES, N_COLOURS * N_SHAPES
CONDITIONS = ("distinct", "shared", "occluded", "straddle")
# (colours, shapes, objects) drawn per scene in each balanced condition
_LAYOUT = {"distinct": (3, 3, 3), "shared": (2, 2, 3), "occluded": (3, 3, 3), "straddle": (3, 3, 3)}
_PLACEMENT = {"distinct": "cells", "shared": "cells", "occluded": "chain", "straddle": "free"}
# image side, grid cell (= ViT patch), object size, position jitter (px); pixel noise std
GEOMETRY = {"img": 24, "cell": 8, "obj_size": 7.0, "jitter": 1.0, "noise": 0.03}


def shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inside-test of a shape in coordinates normalised to its half-size (u right, v down)."""
    if shape == "circle":
        return u**2 + v**2 <= 1.0
    if shape == "square":
        return (np.abs(u) <= 0.82) & (np.abs(v) <= 0.82)
    if shape == "triangle":  # apex up, base at v = 0.9
        return (v <= 0.9) & (np.abs(u) <= (v + 1.0) / 1.9)
    if shape == "cross":
        return ((np.abs(u) <= 0.33) & (np.abs(v) <= 1.0)) | ((np.abs(v) <= 0.33) & (np.abs(u) <= 1.0))
    raise ValueError(f"unknown shape '{shape}', known: {SHAPES}")


def conj_index(colour: int, shape: int) -> int:
    return colour * N_SHAPES + shape


def features_of(y: np.ndarray) -> np.ndarray:
    """F = (colours present, shapes present) from the conjunction multi-hot Y (..., N_CONJ)."""
    grid = y.reshape(*y.shape[:-1], N_COLOURS, N_SHAPES)
    return np.concatenate([grid.max(-1), grid.max(-2)], axis=-1)


def covering_sets(colours, shapes, n_objects: int) -> list[tuple[int, ...]]:
    """All sets of ``n_objects`` distinct conjunctions over colours x shapes that use every colour
    and every shape: the support of Y given F in the balanced conditions."""
    cells = [conj_index(c, s) for c in colours for s in shapes]
    out = []
    for sub in itertools.combinations(cells, n_objects):
        if {i // N_SHAPES for i in sub} == set(colours) and {i % N_SHAPES for i in sub} == set(shapes):
            out.append(sub)
    return out


def conditional_entropy_bits(condition: str) -> float:
    """H(Y|F) in bits: Y is uniform over the covering sets, whose number is the same for every F."""
    n_c, n_s, n_obj = _LAYOUT[condition]
    return math.log2(len(covering_sets(range(n_c), range(n_s), n_obj)))


def candidates_given_features(f: np.ndarray, condition: str) -> np.ndarray:
    """All Y (multi-hot, (M, N_CONJ)) consistent with the features f in this condition."""
    colours = np.flatnonzero(f[:N_COLOURS])
    shapes = np.flatnonzero(f[N_COLOURS:])
    sets = covering_sets(colours, shapes, _LAYOUT[condition][2])
    out = np.zeros((len(sets), N_CONJ), dtype=np.float32)
    for j, sub in enumerate(sets):
        out[j, list(sub)] = 1.0
    return out


# --- drawing -------------------------------------------------------------------------------------

def _positions(n: int, size: float, img: int, cell: int, placement: str, rng: np.random.Generator,
               jitter: float = 1.0, tries: int = 200) -> np.ndarray:
    """Object centres (x, y) in pixels.

    ``cells``: n distinct cells of the (img / cell)^2 grid, centre +- ``jitter`` px: one object per
    ViT patch when ``cell`` is the patch size (see the README: a from-scratch ViT learns shapes
    inside a patch in seconds, across patch borders only after many epochs).
    ``chain``: the first object in a cell, each next one offset from the previous one by 60-80 %
    of its size in a random direction (it hides part of it: occlusion), kept inside the image.
    ``free``: centres uniform in the image (objects inside it), at least one object size apart (no
    overlap), ignoring the patch grid: most objects straddle patch borders.
    """
    g = img // cell
    if placement == "free":
        lo, hi = size / 2, img - size / 2
        for _ in range(tries):
            pts = rng.uniform(lo, hi, (n, 2))
            d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)[~np.eye(n, dtype=bool)]
            if n < 2 or d.min() >= size:
                return pts
        raise RuntimeError(f"could not place {n} objects of size {size} apart in {img} px")
    if placement == "cells":
        idx = rng.choice(g * g, n, replace=False)
        centres = np.stack([idx % g, idx // g], 1) * cell + cell / 2
        return centres + rng.uniform(-jitter, jitter, centres.shape)
    if placement != "chain":
        raise ValueError(f"unknown placement '{placement}' (cells, chain, free)")
    lo, hi = size / 2, img - size / 2
    for _ in range(tries):
        pts = [(rng.integers(g, size=2) + 0.5) * cell]
        for _k in range(n - 1):
            ang = rng.uniform(0, 2 * np.pi)
            p = pts[-1] + size * rng.uniform(0.60, 0.80) * np.array([np.cos(ang), np.sin(ang)])
            if not (np.all(p >= lo) and np.all(p <= hi)):
                break
            pts.append(p)
        if len(pts) == n:
            return np.array(pts)
    raise RuntimeError(f"could not chain {n} objects of size {size} in {img} px; lower the object size")


def render(objects, centres, sizes, img: int, rng: np.random.Generator, noise: float = 0.03,
           supersample: int = 2) -> np.ndarray:
    """Draw (colour, shape) objects in order (later ones on top); returns (3, img, img) float32."""
    n = img * supersample
    coords = (np.arange(n) + 0.5) / supersample
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    canvas = np.empty((n, n, 3))
    canvas[:] = 0.08
    colour_rgb = np.array(list(COLOURS.values()))
    for (c, s), (cx, cy), size in zip(objects, centres, sizes):
        m = shape_mask(SHAPES[s], (xx - cx) / (size / 2), (yy - cy) / (size / 2))
        canvas[m] = colour_rgb[c] * rng.uniform(0.85, 1.0)
    canvas = canvas.reshape(img, supersample, img, supersample, 3).mean((1, 3))
    canvas += noise * rng.standard_normal(canvas.shape)
    return np.clip(canvas, 0.0, 1.0).transpose(2, 0, 1).astype(np.float32)


def _draw_scene(objects, geometry: dict, placement: str, rng) -> np.ndarray:
    g = {**GEOMETRY, **(geometry or {})}
    sizes = g["obj_size"] * rng.uniform(0.92, 1.08, len(objects))
    centres = _positions(len(objects), float(sizes.max()), g["img"], g["cell"], placement, rng, g["jitter"])
    return render(objects, centres, sizes, g["img"], rng, g["noise"])


def balanced_labels(condition: str, n: int, rng: np.random.Generator):
    """Y (n, N_CONJ) of a balanced condition and each scene's objects in drawing order: F uniform
    over its support, then Y uniform over the covering sets of F."""
    if condition not in _LAYOUT:
        raise ValueError(f"unknown condition '{condition}', known: {CONDITIONS}")
    n_c, n_s, n_obj = _LAYOUT[condition]
    Y = np.zeros((n, N_CONJ), dtype=np.float32)
    orders = []
    for i in range(n):
        colours = np.sort(rng.choice(N_COLOURS, n_c, replace=False))
        shapes = np.sort(rng.choice(N_SHAPES, n_s, replace=False))
        sets = covering_sets(colours, shapes, n_obj)
        chosen = list(sets[rng.integers(len(sets))])
        rng.shuffle(chosen)  # drawing order (depth) is random
        Y[i, chosen] = 1.0
        orders.append([(k // N_SHAPES, k % N_SHAPES) for k in chosen])
    return Y, orders


def balanced_scenes(condition: str, n: int, rng: np.random.Generator, geometry: dict | None = None):
    """n scenes of a balanced condition: images (n, 3, img, img), Y (n, N_CONJ), F (n, N_FEATURES)."""
    Y, orders = balanced_labels(condition, n, rng)
    placement = _PLACEMENT[condition]
    img = {**GEOMETRY, **(geometry or {})}["img"]
    X = np.empty((n, 3, img, img), dtype=np.float32)
    for i, objects in enumerate(orders):
        X[i] = _draw_scene(objects, geometry, placement, rng)
    return X, Y, features_of(Y)


def recognition_scenes(n: int, rng: np.random.Generator, geometry: dict | None = None, max_objects: int = 3,
                       p_chain: float = 0.5, p_free: float = 0.0):
    """n recognition scenes: 1..max_objects distinct colour-shape classes drawn i.i.d.; a fraction
    ``p_chain`` of scenes (with >= 2 objects) overlap in a chain, a fraction ``p_free`` of the others
    are placed freely across patch borders (no overlap), the rest sit in grid cells.
    Returns images and the multi-hot class labels (n, N_CONJ)."""
    img = {**GEOMETRY, **(geometry or {})}["img"]
    X = np.empty((n, 3, img, img), dtype=np.float32)
    Y = np.zeros((n, N_CONJ), dtype=np.float32)
    for i in range(n):
        k = int(rng.integers(1, max_objects + 1))
        classes = rng.choice(N_CONJ, k, replace=False)
        Y[i, classes] = 1.0
        placement = "chain" if k > 1 and rng.random() < p_chain else ("free" if rng.random() < p_free else "cells")
        X[i] = _draw_scene([(int(c) // N_SHAPES, int(c) % N_SHAPES) for c in classes], geometry, placement, rng)
    return X, Y
