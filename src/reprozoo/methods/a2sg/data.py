"""The data set of the miniature, deterministic from the seed.

``mnist1d``: our own procedural 1-D digits in the spirit of Greydanus' MNIST-1D. Each class
  is a fixed 12-point template (the templates below are ours, hand-drawn shapes that differ in
  where their peaks and valleys lie). A sample is the template padded to 36 points, scaled by a
  random factor, circularly shifted (the translation that makes the task need convolutions),
  sheared by a random linear trend, blurred with correlated (Gaussian-smoothed) noise plus white
  noise, and resampled to 40 points. Without the shift a linear model solves it; with it the
  task needs translation-invariant features.

Why not sklearn's 8x8 digits (the earlier second data set): every surrogate reached 0.95-0.98 on
them, a ceiling at which surrogates cannot differ. With a small training set (800 samples at
smoke) the spiking CNN stays well below the ceiling on MNIST-1D, and the generator gives as many
test samples as the per-sample intervals need.
"""
from __future__ import annotations

import numpy as np

# ten 12-point templates (ours); each a distinct arrangement of bumps and dips
TEMPLATES = np.array([
    [0, 3, 5, 5, 3, 0, 0, -3, -5, -5, -3, 0],
    [0, 0, 0, 5, 5, 5, 5, 5, 0, 0, 0, 0],
    [5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -5],
    [0, 5, 0, -5, 0, 5, 0, -5, 0, 5, 0, 0],
    [-5, -3, 0, 3, 5, 5, 5, 3, 0, -3, -5, -5],
    [0, 2, 4, 5, 4, 2, 0, 2, 4, 5, 4, 2],
    [5, 5, 5, 0, -5, -5, -5, 0, 5, 5, 5, 0],
    [0, 1, 2, 3, 4, 5, 5, 0, -5, -5, 0, 0],
    [3, 3, -3, -3, 3, 3, -3, -3, 3, 3, -3, -3],
    [0, 0, 5, 0, 0, 0, 0, 0, -5, 0, 0, 0],
], dtype=np.float64) / 5.0


def _smooth(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian smoothing along the last axis (circular), by FFT."""
    n = x.shape[-1]
    k = np.fft.rfftfreq(n)
    return np.fft.irfft(np.fft.rfft(x, axis=-1) * np.exp(-2 * (np.pi * k * sigma) ** 2), n=n, axis=-1)


def mnist1d(n: int, rng: np.random.Generator, length: int = 40, noise: float = 0.1,
            corr_noise: float = 0.25, shear: float = 0.5, max_shift: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): x (n, length) float32, y (n,) int64 with balanced classes in random order."""
    y = rng.permutation(np.arange(n) % 10)
    base = np.pad(TEMPLATES[y], ((0, 0), (12, 12)))                       # (n, 36)
    base = base * rng.uniform(0.8, 1.2, size=(n, 1))
    shifts = rng.integers(-max_shift, max_shift + 1, size=n)
    base = np.stack([np.roll(b, s) for b, s in zip(base, shifts)])
    ramp = np.linspace(-1, 1, base.shape[1])
    base = base + shear * rng.uniform(-1, 1, size=(n, 1)) * ramp
    base = base + corr_noise * _smooth(rng.standard_normal(base.shape), 2.0) * 3.0
    grid = np.linspace(0, base.shape[1] - 1, length)
    x = np.stack([np.interp(grid, np.arange(base.shape[1]), b) for b in base])
    x = x + noise * rng.standard_normal(x.shape)
    return x.astype(np.float32), y.astype(np.int64)


def split(x: np.ndarray, y: np.ndarray, n_train: int, n_val: int, n_test: int) -> dict[str, np.ndarray]:
    """Train / validation / test arrays from already shuffled data."""
    if n_train + n_val + n_test > len(y):
        raise ValueError(f"split {n_train}+{n_val}+{n_test} exceeds the {len(y)} samples")
    a, b, c = n_train, n_train + n_val, n_train + n_val + n_test
    return {"x_train": x[:a], "y_train": y[:a], "x_val": x[a:b], "y_val": y[a:b],
            "x_test": x[b:c], "y_test": y[b:c]}
