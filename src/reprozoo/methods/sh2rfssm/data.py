"""Synthetic long-sequence tasks, generated deterministically from a numpy Generator.

Why these three: the first is built for resonators, the other two are not, so a comparison
averaged over them does not reward a filter bank alone.

* Frequency discrimination (classification, K classes): x_t = A sin(2π f_k t + φ) + σ ε_t,
  t = 0..L-1 (time in steps), class k picks the frequency f_k = f_0 + k Δf (cycles / step), the
  amplitude A ~ U(a_lo, a_hi) and the phase φ ~ U(0, 2π) are nuisance, ε ~ N(0, 1). Because A
  varies by a factor a_hi / a_lo larger than the gain ratio of a low-pass filter between the
  classes, the loudness of a filtered signal does not give the class away: a model needs a bank
  of band-pass filters (resonators tuned to different f), which is exactly what heterogeneous
  ω provides and shared ω or a first-order (LIF) kernel do not.
* Adding problem (regression; Hochreiter & Schmidhuber 1997): two input channels, values
  u_t ~ U(0, 1) (fed standardised, (u - 1/2) √12) and a marker m_t ∈ {0, 1} that is 1 at one random
  step in the first half and one in the second; the target is the sum of the two marked values
  (variance 1/6). The marks are up to
  L steps before the read-out, so memory over the whole sequence is required.
* Sequential digits (classification, 10 classes): scikit-learn's 1797 handwritten 8 x 8 digits
  read pixel by pixel (L = 64, row-major; pixel / 16, one channel), the small offline cousin of
  sequential MNIST. Nothing in it oscillates: the class is in where along the sequence the ink is.
  Train / validation / test split fixed by the seed (``digits_split``).

Arrays are float32, layout (batch, channels, L) as the FFT path wants.
"""
from __future__ import annotations

import functools

import numpy as np


def frequency_discrimination(n: int, length: int, rng: np.random.Generator, f0: float = 0.05,
                             df: float = 0.01, n_classes: int = 4, amp: tuple[float, float] = (0.5, 1.5),
                             noise: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(x (n, 1, L), y (n,) int64): noisy sinusoids of class-dependent frequency."""
    y = rng.integers(0, n_classes, n)
    f = f0 + df * y
    a = rng.uniform(*amp, n)
    phi = rng.uniform(0, 2 * np.pi, n)
    t = np.arange(length)
    x = a[:, None] * np.sin(2 * np.pi * f[:, None] * t[None] + phi[:, None]) + noise * rng.standard_normal((n, length))
    return x[:, None, :].astype(np.float32), y.astype(np.int64)


def periodogram_oracle(x: np.ndarray, f0: float = 0.05, df: float = 0.01, n_classes: int = 4, **_) -> np.ndarray:
    """The fixed (untrained) reference for :func:`frequency_discrimination`: the class whose frequency
    f0 + df k carries the most periodogram power |sum_t x_t exp(-2 pi i f_k t)|^2. x (n, 1, L) -> (n,)
    predicted classes. Its accuracy is the task's practical ceiling at a length L."""
    t = np.arange(x.shape[-1])
    f = f0 + df * np.arange(n_classes)
    basis = np.exp(-2j * np.pi * f[:, None] * t[None])  # (K, L)
    return np.argmax(np.abs(x[:, 0, :].astype(np.float64) @ basis.T) ** 2, axis=1)


def adding_problem(n: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(x (n, 2, L), y (n,) float32): channel 0 the values, channel 1 the two markers."""
    u = rng.uniform(0, 1, (n, length))
    m = np.zeros((n, length))
    half = length // 2
    i1 = rng.integers(0, half, n)
    i2 = rng.integers(half, length, n)
    rows = np.arange(n)
    m[rows, i1] = 1.0
    m[rows, i2] = 1.0
    y = u[rows, i1] + u[rows, i2]
    # the value channel is fed centred and scaled to unit variance (an affine map, no information
    # lost; every model sees the same), so a low-pass kernel does not integrate a DC offset of 0.5
    return np.stack([(u - 0.5) * np.sqrt(12.0), m], axis=1).astype(np.float32), y.astype(np.float32)


@functools.lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(x (1797, 1, 64) float32 in [0, 1], y (1797,) int64): the csv scikit-learn ships, read
    directly (importing sklearn costs seconds of start-up), once per process (every fit of a
    batch job reads the same arrays; they are returned read-only)."""
    import importlib.util
    from pathlib import Path

    path = Path(importlib.util.find_spec("sklearn").origin).parent / "datasets" / "data" / "digits.csv.gz"
    raw = np.loadtxt(path, delimiter=",")
    x, y = (raw[:, :64] / 16.0).astype(np.float32)[:, None, :], raw[:, 64].astype(np.int64)
    x.flags.writeable = y.flags.writeable = False
    return x, y


def standardise_digits(x: np.ndarray) -> np.ndarray:
    """Pixels centred and scaled by the mean and sd over all pixels of all digits (label-free
    constants), the same for every model."""
    return ((x - DIGITS_MEAN) / DIGITS_STD).astype(np.float32)


DIGITS_MEAN, DIGITS_STD = 0.3053, 0.3760  # of digits() pixels (tests/test_sh2rfssm.py checks them)


def digits_split(seed: int, n_val: int, n_test: int) -> dict[str, np.ndarray]:
    """Disjoint index sets train / val / test of the 1797 digits, a permutation drawn from the seed."""
    perm = np.random.default_rng(10_007 * seed + 5).permutation(1797)
    if n_val + n_test >= len(perm):
        raise ValueError(f"digits: n_val + n_test = {n_val + n_test} leaves no training items")
    return {"test": perm[:n_test], "val": perm[n_test:n_test + n_val], "train": perm[n_test + n_val:]}


TASKS = ("freq", "adding", "digits")
N_CLASSES_DIGITS = 10


def make(task: str, n: int, length: int, rng: np.random.Generator, options: dict | None = None):
    if task == "freq":
        return frequency_discrimination(n, length, rng, **(options or {}))
    if task == "adding":
        return adding_problem(n, length, rng)
    raise ValueError(f"sh2rfssm: unknown generated task {task!r}; known: freq, adding (digits: digits())")
