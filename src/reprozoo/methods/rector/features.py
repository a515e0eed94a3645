"""EEG features every variant reads: differential entropy (DE) tokens and band-limited connectivity.

Differential entropy. For a band-passed signal that is Gaussian with variance s^2 the differential
entropy is h = 1/2 log(2 pi e s^2) (nats): a log band power. The EEG emotion literature (SEED, and
RECTOR's token input) feeds DE of the classic bands per channel and per 1-s segment; here

    tokens[n, c, t, b] = 1/2 log(2 pi e var(bandpass_b(x[n, c])[segment t]))      (uV^2 inside the log)

The band-pass is mne's zero-phase FIR (mne.filter.filter_data); we only take variances.

Connectivity target (topological structure modelling): the Pearson correlation between channels of
the alpha/mu-band (8-13 Hz) signal over the whole window, a (C, C) matrix per epoch.
"""
from __future__ import annotations

import numpy as np

BANDS = {"delta": (1.0, 4.0), "theta": (4.0, 8.0), "alpha": (8.0, 13.0), "beta": (13.0, 30.0), "gamma": (30.0, 40.0)}


def bandpass(X: np.ndarray, sfreq: float, lo: float, hi: float) -> np.ndarray:
    """Zero-phase FIR band-pass of the last axis (mne's defaults, firwin design)."""
    import mne

    hi = min(hi, 0.49 * sfreq)
    return mne.filter.filter_data(X.astype(np.float64), sfreq, lo, hi, fir_design="firwin", verbose="ERROR")


def differential_entropy(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """DE of a Gaussian with the sample variance of x along axis: 1/2 log(2 pi e var)."""
    return 0.5 * np.log(2 * np.pi * np.e * np.maximum(x.var(axis=axis), 1e-12))


def de_features(X: np.ndarray, sfreq: float, segment_s: float = 1.0, bands: dict = BANDS):
    """DE tokens (N, C, T, B) over T = n_times // (segment_s sfreq) segments, the whole-window DE
    (N, C, B), and the alpha-band correlation matrices (N, C, C)."""
    N, C, L = X.shape
    seg = int(round(segment_s * sfreq))
    T = L // seg
    tokens = np.empty((N, C, T, len(bands)), np.float32)
    whole = np.empty((N, C, len(bands)), np.float32)
    corr = None
    for b, (name, (lo, hi)) in enumerate(bands.items()):
        xb = bandpass(X, sfreq, lo, hi)
        tokens[..., b] = differential_entropy(xb[..., : T * seg].reshape(N, C, T, seg))
        whole[..., b] = differential_entropy(xb)
        if name == "alpha":
            corr = correlation(xb).astype(np.float32)
    return tokens, whole, corr


def correlation(x: np.ndarray) -> np.ndarray:
    """Pearson correlation between the rows of each (C, L) slice: (N, C, L) -> (N, C, C)."""
    z = x - x.mean(-1, keepdims=True)
    z = z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
    return np.einsum("ncl,ndl->ncd", z, z)
