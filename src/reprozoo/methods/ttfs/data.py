"""Data of the TTFS miniature: sklearn digits (8x8), procedural glyphs (8x8), and MNIST idx files.

Every image is a float array in [0, 1], shape (N, 1, H, W), labels int64 in 0..9. The time-to-
first-spike encoding itself lives in ``ttfs_net.encode``: pixel intensity x > 0 fires once at
step round((1 - x)(T - 1)) (bright pixels first), x = 0 never fires.

Glyphs (ours, procedural): ten stroke patterns (horizontal, vertical, two diagonals, plus, X,
ring, filled block, L corner, T) drawn on a 6x6 canvas, shifted by up to one pixel in each
direction inside the 8x8 image, with a per-image stroke intensity in [0.4, 1] (so that spike
timing, not only presence, carries contrast) and clipped Gaussian noise. Deterministic from the rng.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def _templates() -> np.ndarray:
    t = np.zeros((10, 6, 6), dtype=np.float32)
    t[0, 2:4, :] = 1                      # horizontal bar
    t[1, :, 2:4] = 1                      # vertical bar
    t[2][np.eye(6, dtype=bool)] = 1       # diagonal
    t[3][np.eye(6, dtype=bool)[::-1]] = 1  # anti-diagonal
    t[4, 2:4, :] = 1
    t[4, :, 2:4] = 1                      # plus
    t[5] = np.maximum(t[2], t[3])         # X
    t[6, [0, 5], :] = 1
    t[6, :, [0, 5]] = 1                   # ring
    t[7, 1:5, 1:5] = 1                    # filled block
    t[8, :, 0] = 1
    t[8, 5, :] = 1                        # L corner
    t[9, 0, :] = 1
    t[9, :, 2:4] = 1                      # T
    return t


def glyphs(n: int, rng: np.random.Generator, noise: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """n procedural 8x8 glyph images (see module docstring) and their labels."""
    temp = _templates()
    y = rng.integers(0, 10, size=n)
    x = np.zeros((n, 8, 8), dtype=np.float32)
    shifts = rng.integers(0, 3, size=(n, 2))
    amp = rng.uniform(0.4, 1.0, size=n).astype(np.float32)
    for i in range(n):
        r, c = shifts[i]
        x[i, r:r + 6, c:c + 6] = amp[i] * temp[y[i]]
    x = np.clip(x + noise * rng.standard_normal(x.shape).astype(np.float32), 0.0, 1.0)
    return x[:, None], y.astype(np.int64)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's 1797 8x8 handwritten digits, intensities 0..16 scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32)[:, None], d.target.astype(np.int64)


def split(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, fractions=(0.6, 0.2)) -> dict:
    """Random train / val / test split (val: the training curve; test: the reported accuracy)."""
    idx = rng.permutation(len(x))
    a = int(fractions[0] * len(x))
    b = a + int(fractions[1] * len(x))
    parts = {"train": idx[:a], "val": idx[a:b], "test": idx[b:]}
    return {f"{k}_{s}": arr[i] for s, i in parts.items() for k, arr in (("x", x), ("y", y))}


def mnist_idx(root: str | Path, kind: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """MNIST / Fashion-MNIST from the original idx files (``{kind}-images-idx3-ubyte.gz``) in root
    (the `paper` scale; nothing can be downloaded here, so the files must be put there first)."""
    root = Path(root)
    prefix = "t10k" if kind == "test" else "train"
    img, lab = root / f"{prefix}-images-idx3-ubyte.gz", root / f"{prefix}-labels-idx1-ubyte.gz"
    if not img.exists():
        raise FileNotFoundError(f"ttfs paper scale needs {img} (MNIST / Fashion-MNIST idx files; "
                                "download them from the dataset's site into data_root)")
    with gzip.open(img) as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(lab) as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    return (x / 255.0).astype(np.float32), y.astype(np.int64)
