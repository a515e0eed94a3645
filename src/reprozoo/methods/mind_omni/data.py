"""The miniature's stimuli, brains and tokenizers: sklearn digits, captions, a synthetic smooth 'fMRI'.

Stimuli: the 1797 8 x 8 sklearn digits (ink 0..16). Captions are three words computed from the
image: the digit's name, its ink ("thin" / "thick": total ink below / above the training median) and
its slant ("left" / "upright" / "right": tertiles over the training set of the ink-weighted
covariance of column with row, which is positive when the strokes lean right as they go up).

Brain ('fMRI'): G x G voxels on a grid. Image features f = z-scored pixels (64). The encoding map
is a random Gaussian tensor W0 (G, G, 64) smoothed over the voxel grid with a Gaussian of width
``smooth`` voxels (neighbouring voxels have similar tuning, as in cortex); each voxel's signal is
scaled to unit variance and spatially smooth Gaussian noise of standard deviation ``noise`` is
added, one fixed 'trial' per image:

    y_v = (W f)_v / sd_v + noise * (smooth ε)_v,        voxel SNR (variance) = 1 / noise^2.

Tokenizers (k-means vector quantisation, fit on the training split only):
  brain: the G x G map cut into P_b x P_b patches, each patch -> the nearest of K_b centroids;
  image: the 8 x 8 image cut into P_i x P_i patches -> K_i centroids.
Decoding a token sequence replaces every token by its centroid patch (``detokenize``).
"""
from __future__ import annotations

import numpy as np

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
INK_WORDS = ["thin", "thick"]
SLANT_WORDS = ["left", "upright", "right"]
CAPTION_WORDS = DIGIT_WORDS + INK_WORDS + SLANT_WORDS
CAPTION_SLOTS = [(0, 10), (10, 12), (12, 15)]   # word-index range of each caption position
# brain question answering: question -> answer from the caption attributes (see ``bqa_answers``)
QUESTIONS = ["which digit is it?", "is it even?", "is it greater than four?", "is the ink thick?"]
ANSWERS = DIGIT_WORDS + ["yes", "no"]


def load_digits_images() -> tuple[np.ndarray, np.ndarray]:
    """(1797, 8, 8) float images with ink in 0..16, (1797,) labels: scikit-learn's digits."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float64), d.target.astype(np.int64)


def slant(images: np.ndarray) -> np.ndarray:
    """Ink-weighted covariance of column with height (row counted upwards), in pixels^2."""
    rows, cols = np.meshgrid(np.arange(8.0), np.arange(8.0), indexing="ij")
    up = 7.0 - rows
    w = images / images.sum((1, 2), keepdims=True)
    mu_u, mu_c = (w * up).sum((1, 2)), (w * cols).sum((1, 2))
    return (w * (up - mu_u[:, None, None]) * (cols - mu_c[:, None, None])).sum((1, 2))


def captions(images: np.ndarray, labels: np.ndarray, train: np.ndarray) -> np.ndarray:
    """(N, 3) word indices into CAPTION_WORDS: digit name, ink, slant (thresholds from ``train``)."""
    ink = images.sum((1, 2))
    s = slant(images)
    ink_thr = np.median(ink[train])
    lo, hi = np.quantile(s[train], [1 / 3, 2 / 3])
    ink_w = (ink > ink_thr).astype(np.int64)
    slant_w = np.digitize(s, [lo, hi])
    return np.stack([labels, 10 + ink_w, 12 + slant_w], 1)


def bqa_answers(caption: np.ndarray) -> np.ndarray:
    """(N, 4) answer indices into ANSWERS for the four QUESTIONS."""
    digit, thick = caption[:, 0], caption[:, 1] == 11
    yes, no = 10, 11
    return np.stack([digit, np.where(digit % 2 == 0, yes, no), np.where(digit > 4, yes, no),
                     np.where(thick, yes, no)], 1)


def smooth_field(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian smoothing of (..., G, G) maps over their last two (voxel-grid) axes."""
    from scipy.ndimage import gaussian_filter

    return gaussian_filter(x, sigma=[0] * (x.ndim - 2) + [sigma, sigma], mode="wrap")


def synthetic_fmri(images: np.ndarray, train: np.ndarray, grid: int, smooth: float, noise: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(N, G, G) voxel responses (z-scored with training statistics) and the noiseless signal."""
    x = images.reshape(len(images), -1)
    mu, sd = x[train].mean(0), x[train].std(0)
    f = np.where(sd > 0, (x - mu) / np.where(sd > 0, sd, 1.0), 0.0)           # z-scored pixels
    w = smooth_field(rng.normal(size=(f.shape[1], grid, grid)), smooth)      # (64, G, G)
    sig = np.einsum("nf,fgh->ngh", f, w)
    sig /= sig[train].std(0, keepdims=True)
    eps = smooth_field(rng.normal(size=sig.shape), smooth)
    eps /= eps.std()
    y = sig + noise * eps
    y = (y - y[train].mean(0)) / y[train].std(0)
    return y, sig


def to_patches(maps: np.ndarray, patch: int) -> np.ndarray:
    """(N, H, W) -> (N, (H/p)(W/p), p*p), patches in row-major order."""
    n, h, w = maps.shape
    x = maps.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch)


def from_patches(patches: np.ndarray, patch: int, side: int) -> np.ndarray:
    """Inverse of ``to_patches`` for square (side x side) maps."""
    n, m = patches.shape[:2]
    k = side // patch
    return patches.reshape(n, k, k, patch, patch).transpose(0, 1, 3, 2, 4).reshape(n, side, side)


class PatchTokenizer:
    """k-means vector quantiser of square maps' patches (one codebook shared by all patch positions)."""

    def __init__(self, patch: int, codes: int, seed: int):
        self.patch, self.codes, self.seed = patch, codes, seed

    def fit(self, maps: np.ndarray) -> "PatchTokenizer":
        from sklearn.cluster import KMeans

        self.side = maps.shape[-1]
        p = to_patches(maps, self.patch).reshape(-1, self.patch ** 2)
        km = KMeans(self.codes, n_init=1, max_iter=100, random_state=self.seed).fit(p)
        self.centroids = km.cluster_centers_
        return self

    def tokenize(self, maps: np.ndarray) -> np.ndarray:
        p = to_patches(maps, self.patch)                                     # (N, T, d)
        d2 = ((p[:, :, None, :] - self.centroids[None, None]) ** 2).sum(-1)
        return d2.argmin(-1)

    def detokenize(self, tokens: np.ndarray) -> np.ndarray:
        return from_patches(self.centroids[tokens], self.patch, self.side)
