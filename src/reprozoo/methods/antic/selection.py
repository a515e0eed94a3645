"""Temporal selection: which snapshots a single streaming pass keeps.

Adaptive (ANTIC's selector, our reading of it): frame i is kept when it has drifted from the last
kept frame w_k by more than a relative bound in either the field or its enstrophy Z = 1/2 <w^2>,

    ||w_i - w_k|| / ||w_k|| > tau_field     or     |Z_i - Z_k| / Z_k > tau_enstrophy,

and the first and last frames are always kept (the decoder interpolates between kept frames). The
decision uses only the current and the last kept frame, so it runs in situ in O(1) memory.
Pearson (the reference code's selector, ``PearsonSelector``): correlation to the last kept frame
below 0.9, or a forced keep every ``window`` frames; a selection-only variant, ours is the
enstrophy / field-drift bound above.
Uniform: the same number of kept frames at equal spacing (the baseline at equal budget).
Frames that are not kept are reconstructed by linear interpolation in time between the two
neighbouring kept reconstructions.
"""
from __future__ import annotations

import numpy as np


class AdaptiveSelector:
    def __init__(self, n_frames: int, tau_field: float, tau_enstrophy: float):
        self.n, self.tau_f, self.tau_z = n_frames, float(tau_field), float(tau_enstrophy)
        self.last = None

    def keep(self, i: int, w: np.ndarray) -> bool:
        if self.last is not None and i != self.n - 1:
            ref = self.last
            drift = np.linalg.norm(w - ref) / np.linalg.norm(ref)
            z, z_ref = np.mean(w**2), np.mean(ref**2)
            if drift <= self.tau_f and abs(z - z_ref) / z_ref <= self.tau_z:
                return False
        self.last = w.copy()
        return True


class PearsonSelector:
    """The reference code's selector (AndreiB137/ANTIC, our reading): frame i is kept when its
    Pearson correlation with the last kept frame drops below ``rho`` (0.9), and in any case once
    ``window`` (5) frames have passed since the last kept one; the first and last frames are kept."""

    def __init__(self, n_frames: int, rho: float = 0.9, window: int = 5):
        self.n, self.rho, self.window = n_frames, float(rho), int(window)
        self.last, self.last_i = None, None

    def keep(self, i: int, w: np.ndarray) -> bool:
        if self.last is not None and i != self.n - 1 and i - self.last_i < self.window:
            a, b = w.ravel() - w.mean(), self.last.ravel() - self.last.mean()
            if float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) >= self.rho:
                return False
        self.last, self.last_i = w.copy(), i
        return True


class UniformSelector:
    def __init__(self, n_frames: int, n_keep: int):
        self.kept = set(np.unique(np.round(np.linspace(0, n_frames - 1, max(2, n_keep))).astype(int)).tolist())

    def keep(self, i: int, w: np.ndarray) -> bool:
        return i in self.kept


def interpolate_frames(kept_idx, kept_frames, n_frames: int) -> np.ndarray:
    """Linear interpolation in time between kept frames (indices sorted, first 0 and last n-1)."""
    kept_idx = np.asarray(kept_idx)
    kept = np.asarray(kept_frames)
    out = np.empty((n_frames,) + kept.shape[1:])
    j = np.clip(np.searchsorted(kept_idx, np.arange(n_frames), side="right") - 1, 0, len(kept_idx) - 2)
    for i in range(n_frames):
        a, b = kept_idx[j[i]], kept_idx[j[i] + 1]
        s = (i - a) / (b - a)
        out[i] = (1 - s) * kept[j[i]] + s * kept[j[i] + 1]
    return out
