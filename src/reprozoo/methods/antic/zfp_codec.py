"""The classical baseline: zfp (zfpy 1.0.1), in the four ways a fair comparison with ANTIC needs.

ANTIC is temporal selection (it keeps K of N frames and interpolates the rest) plus spatial
compression. zfp compressing every frame on its own is spatial compression alone, so each baseline
below adds one of the two things ANTIC does in time:

    zfp          every frame, 2-D (x, y)                     spatial only
    zfp_kept     the adaptive selector's K kept frames, 2-D, linear interpolation in time as ANTIC
    zfp_3d       every frame, zfp's 3-D mode over (t, x, y)  zfp's own transform in time
    zfp_kept_3d  the K kept frames stacked as (t, x, y), 3-D, then the same interpolation

zfp's 3-D blocks are 4 x 4 x 4, so the 3-D modes need a buffer of only 4 frames in situ
(compressing the whole stack is the same up to stream headers).

Bytes: every stream's length less all but one zfp header (96 bits: shape and mode): a store holding
many frames needs the header once, and ANTIC is not charged for one.

Rate-distortion: each variant is swept over fixed-accuracy tolerances fixed in advance
(``tol = 2^k * std(first frame)``, powers of two because zfp's fixed-accuracy mode acts on
floor(log2 tol) only), giving a (bytes, error) curve per frame. Its errors *at a given number of
bytes* (each point of ANTIC's rate sweep, the scratch baseline's bytes) are every frame's error
interpolated log-log in the sweep's bytes (``frame_errors_at``): per-frame values, so the claims'
intervals resample frames. zfp's fixed-rate mode (exact bytes) is not used:
zfpy 1.0.1 corrupts the heap in 2-D fixed-rate mode below about 1 bit per value.
"""
from __future__ import annotations

import numpy as np

from .selection import interpolate_frames

HEADER_BYTES = 12  # zfp's full header: 32-bit magic + 52-bit field metadata + 12-bit short mode

MODES = {  # variant: (which frames, zfp dimensionality)
    "zfp": ("all", 2),
    "zfp_kept": ("kept", 2),
    "zfp_3d": ("all", 3),
    "zfp_kept_3d": ("kept", 3),
}


def compress(frames: np.ndarray, dims: int, **mode) -> tuple[int, np.ndarray]:
    """zfp on ``frames`` (K, n, n) as K 2-D fields or one 3-D (t, x, y) field; ``mode`` is zfpy's
    ``tolerance=``. Returns stored bytes (payloads + one header) and the decoded frames."""
    import zfpy

    a = np.ascontiguousarray(frames, dtype=np.float32)
    fields = [a] if dims == 3 else list(a)
    bufs = [zfpy.compress_numpy(f, **mode) for f in fields]
    # zfpy 1.0.1's headerless decoder (_decompress) corrupts the heap, so every stream carries its header
    # and all but one are deducted (the header is 96 bits; each stream keeps its 64-bit word padding)
    rec = np.array([zfpy.decompress_numpy(b) for b in bufs])
    return sum(len(b) for b in bufs) - (len(bufs) - 1) * HEADER_BYTES, (rec[0] if dims == 3 else rec).astype(np.float64)


def encode(truth: np.ndarray, kept: list[int], variant: str, **mode) -> tuple[int, np.ndarray]:
    """The variant's stored bytes and its reconstruction of all frames of ``truth`` (N, n, n)."""
    which, dims = MODES[variant]
    idx = list(range(len(truth))) if which == "all" else list(kept)
    nbytes, rec = compress(truth[idx], dims, **mode)
    return nbytes, (rec if which == "all" else interpolate_frames(idx, rec, len(truth)))


def loglog_at(x_query: float, xs, ys) -> float | None:
    """y at ``x_query`` by linear interpolation in (log x, log y); None outside the sampled x range."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]
    if not xs[0] <= x_query <= xs[-1]:
        return None
    return float(np.exp(np.interp(np.log(x_query), np.log(xs), np.log(ys))))


def frame_errors(rec: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Relative L2 error of every frame (the per-unit values of the claims)."""
    axes = tuple(range(1, truth.ndim))
    return np.sqrt(np.sum((rec - truth) ** 2, axis=axes) / np.sum(truth**2, axis=axes))


def frame_errors_at(budget: float, nbytes, per_frame) -> tuple[np.ndarray, str]:
    """Every frame's error at ``budget`` stored bytes, from a sweep (``nbytes[j]``, ``per_frame[j]``):
    each frame's error interpolated log-log in the sweep's bytes (as ``loglog_at``). Outside the
    sweep: its most accurate point (budget above its largest stream) or 1, the error of storing
    nothing (below its smallest). Returns the errors and which case applied."""
    nb = np.asarray(nbytes, dtype=float)
    pf = np.maximum(np.asarray(per_frame, dtype=float), 1e-300)
    order = np.argsort(nb)
    nb, pf = nb[order], pf[order]
    if budget > nb[-1]:
        return pf[int(np.argmin(pf.mean(axis=1)))].copy(), "above"
    if budget < nb[0]:
        return np.ones(pf.shape[1]), "below"
    j = int(np.clip(np.searchsorted(nb, budget, side="right") - 1, 0, len(nb) - 2))
    s = 0.0 if nb[j + 1] == nb[j] else (np.log(budget) - np.log(nb[j])) / (np.log(nb[j + 1]) - np.log(nb[j]))
    return np.exp((1 - s) * np.log(pf[j]) + s * np.log(pf[j + 1])), "inside"


def values_compressed(truth: np.ndarray, kept: list[int], variant: str) -> int:
    return (len(truth) if MODES[variant][0] == "all" else len(kept)) * truth[0].size
