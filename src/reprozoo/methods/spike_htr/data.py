"""Text lines for the miniature: handwritten digits from scikit-learn concatenated along the width.

Why this generator: a text-line recogniser trained with CTC needs (image, string) pairs whose
character boundaries are NOT given, with blank stretches between and around characters, which is
exactly the imbalance the length reducer exploits. A line is rendered as

    x(h, w) = clip( Σ_k g_k(h - dy_k, w - x_k) + ε(h, w), 0, 1 ),   ε ~ N(0, σ²),

where g_k is the k-th glyph (an 8 x 8 sklearn digit, values 0..16, scaled to [0, 1], optionally
upsampled, and cropped to its inked columns so that widths vary like handwriting), x_k its
left edge (previous right edge + a random gap, so glyphs may touch but never overlap), dy_k a
vertical jitter of ±1 px. The line starts at a random left margin and is padded with blank
columns to a fixed width W. Train / validation / test lines draw glyphs from DISJOINT parts of
the 1797 sklearn samples (half / a quarter / a quarter: ~450 test glyphs, each reused ~60 times
over 3000 test lines): test glyphs were never seen in training, but the 1797 samples are the test
part of UCI optdigits and come from only 13 writers, so the splits are NOT writer-independent.

The paper's data (IAM, READ2016, LAM) cannot be downloaded here; ``load_iam_lines`` reads the
IAM line images from a user-supplied folder for the ``paper`` scale.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

DIGITS = "0123456789"


def glyph_bank(upsample: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """All sklearn digits as (8·upsample)² images in [0, 1] (nearest-neighbour upsampling).

    Read from the csv that ships inside scikit-learn (the file ``load_digits`` parses) without
    importing sklearn itself, which costs ~4 s of job start-up."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    table = np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    imgs = table[:, :64].reshape(-1, 8, 8).astype(np.float32) / 16.0
    return np.kron(imgs, np.ones((1, upsample, upsample), np.float32)), table[:, 64].astype(np.int64)


def _crop_columns(g: np.ndarray) -> np.ndarray:
    cols = np.where(g.max(axis=0) > 0.05)[0]
    return g[:, cols.min():cols.max() + 1] if cols.size else g


def render_lines(n: int, rng: np.random.Generator, glyphs: np.ndarray, labels: np.ndarray,
                 width: int, n_chars: tuple[int, int], gap: tuple[int, int], margin: int,
                 noise: float) -> tuple[np.ndarray, list[list[int]]]:
    """``n`` lines (n, glyph height, width) float32 and their digit strings (lists of ints 0..9)."""
    H = glyphs.shape[1]
    X = np.zeros((n, H + 2, width), np.float32)          # +2 rows for the vertical jitter
    texts: list[list[int]] = []
    for i in range(n):
        k = int(rng.integers(n_chars[0], n_chars[1] + 1))
        x = int(rng.integers(0, margin + 1))
        text = []
        for _ in range(k):
            j = int(rng.integers(len(glyphs)))
            g = _crop_columns(glyphs[j])
            if x + g.shape[1] > width:
                break
            dy = int(rng.integers(0, 3))
            X[i, dy:dy + H, x:x + g.shape[1]] = np.maximum(X[i, dy:dy + H, x:x + g.shape[1]], g)
            text.append(int(labels[j]))
            x += g.shape[1] + int(rng.integers(gap[0], gap[1] + 1))
        texts.append(text)
    X = X[:, 1:H + 1]
    X = np.clip(X + noise * rng.standard_normal(X.shape).astype(np.float32), 0.0, 1.0)
    return X, texts


def make_splits(p: dict, rng: np.random.Generator) -> dict:
    """Train / val / test lines from disjoint glyph pools (deterministic in ``rng``)."""
    d = p["data"]
    glyphs, labels = glyph_bank(d.get("upsample", 1))
    perm = rng.permutation(len(glyphs))
    half = len(glyphs) // 2
    pools = {"train": perm[:half], "val": perm[half:half + half // 2], "test": perm[half + half // 2:]}
    out = {}
    for split in ("train", "val", "test"):
        idx = pools[split]
        X, texts = render_lines(d[f"n_{split}"], rng, glyphs[idx], labels[idx], d["width"],
                                tuple(d["n_chars"]), tuple(d["gap"]), d["margin"], d["noise"])
        out[split] = (X, texts)
    return out


def pack(texts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated targets with classes 1..K (0 is the CTC blank) and their lengths."""
    lens = np.array([len(t) for t in texts], np.int64)
    flat = np.array([c + 1 for t in texts for c in t], np.int64)
    return flat, lens


def load_iam_lines(root: str | Path, split_file: str | Path, height: int, width: int,
                   alphabet: str) -> tuple[np.ndarray, list[list[int]]]:
    """IAM line images (``root/lines/a01/a01-000u/a01-000u-00.png``) and their transcriptions
    from ``root/ascii/lines.txt`` ('|' = space), for the ids listed in ``split_file``; ink is
    mapped to 1, background to 0, each line resized to ``height`` and right-padded to ``width``."""
    from PIL import Image

    root = Path(root)
    ids = set(Path(split_file).read_text().split())
    X, texts = [], []
    for line in (root / "ascii" / "lines.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        parts = line.split(" ")
        if parts[0] not in ids or parts[1] != "ok":
            continue
        a, b = parts[0].split("-")[:2]
        img = Image.open(root / "lines" / a / f"{a}-{b}" / f"{parts[0]}.png").convert("L")
        w = min(width, max(1, round(img.width * height / img.height)))
        arr = 1.0 - np.asarray(img.resize((w, height)), np.float32) / 255.0
        canvas = np.zeros((height, width), np.float32)
        canvas[:, :w] = arr
        X.append(canvas)
        texts.append([alphabet.index(c) for c in " ".join(parts[8:]).replace("|", " ") if c in alphabet])
    if not X:
        raise FileNotFoundError(f"no IAM lines from {split_file} under {root}: expected ascii/lines.txt and lines/")
    return np.stack(X), texts
