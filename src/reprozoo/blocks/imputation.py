"""Missing-data masks and imputation metrics, shared by the time-series imputation methods.

Why a block: an imputation comparison is only fair if every method sees the same artificial
holes and is scored on exactly those entries. Masks are boolean arrays, True = observed.

* ``random_mask``: each entry missing independently with probability ``rate`` (MCAR).
* ``block_mask``: per channel, contiguous gaps of ``block`` steps placed at random until the
  missing fraction reaches ``rate`` (sensor outages; harder, because neighbours are missing too).
  Both are deterministic given the generator.
* ``masked_mae`` / ``masked_rmse``: errors over the artificially hidden entries only
  (``eval_mask`` True where the truth is known but was hidden from the model).
* ``linear_interpolation`` and ``carry_forward``: the classical baselines, per channel.
"""
from __future__ import annotations

import numpy as np


def random_mask(shape: tuple[int, ...], rate: float, rng: np.random.Generator) -> np.ndarray:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"missing rate must be in [0, 1), got {rate}")
    return rng.random(shape) >= rate


def block_mask(shape: tuple[int, int], rate: float, block: int, rng: np.random.Generator) -> np.ndarray:
    """(T, C) mask with contiguous gaps of length ``block`` per channel, missing fraction ≈ rate."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"missing rate must be in [0, 1), got {rate}")
    T, C = shape
    mask = np.ones(shape, dtype=bool)
    target = int(round(rate * T))
    for c in range(C):
        for _ in range(50 * max(1, target // max(block, 1) + 1)):
            if (~mask[:, c]).sum() >= target:
                break
            start = int(rng.integers(0, max(1, T - block + 1)))
            mask[start:start + block, c] = False
    return mask


def masked_mae(pred: np.ndarray, truth: np.ndarray, eval_mask: np.ndarray) -> float:
    eval_mask = np.asarray(eval_mask, dtype=bool)
    if not eval_mask.any():
        raise ValueError("no entries to evaluate")
    return float(np.abs(pred - truth)[eval_mask].mean())


def masked_rmse(pred: np.ndarray, truth: np.ndarray, eval_mask: np.ndarray) -> float:
    eval_mask = np.asarray(eval_mask, dtype=bool)
    if not eval_mask.any():
        raise ValueError("no entries to evaluate")
    return float(np.sqrt(((pred - truth) ** 2)[eval_mask].mean()))


def linear_interpolation(x: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Per-channel linear interpolation over time of a (T, C) array; ends held at the nearest value."""
    out = np.array(x, dtype=float, copy=True)
    t = np.arange(x.shape[0])
    for c in range(x.shape[1]):
        seen = observed[:, c]
        if seen.any():
            out[~seen, c] = np.interp(t[~seen], t[seen], x[seen, c])
        else:
            out[:, c] = 0.0
    return out


def carry_forward(x: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Last observation carried forward per channel (first observation carried backward)."""
    out = np.array(x, dtype=float, copy=True)
    T = x.shape[0]
    idx = np.where(observed, np.arange(T)[:, None], -1)
    idx = np.maximum.accumulate(idx, axis=0)
    first = np.argmax(observed, axis=0)
    idx = np.where(idx < 0, first[None, :], idx)
    out = np.take_along_axis(out, idx, axis=0)
    out[:, ~observed.any(axis=0)] = 0.0
    return out
