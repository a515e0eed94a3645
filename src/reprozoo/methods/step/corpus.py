"""Text that ships with the interpreter: the Python standard library's own source, as bytes.

Why this corpus: nothing can be downloaded, yet a language model needs real text with real
structure (keywords, indentation, docstrings in English, identifiers). The ``*.py`` files at the
top of ``sysconfig.get_paths()['stdlib']`` are several MB of such text on every machine.

Tokens are bytes (vocabulary 256): no tokenizer to download, and a byte-level perplexity is
``exp(nats per byte)``. Train / calibration and held-out text come from DISJOINT files (every
``heldout_every``-th file of the sorted list is held out), so held-out perplexity measures
generalisation to unseen modules, not memorisation of windows the model trained on.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np


def stdlib_files(max_files: int | None = None) -> list[Path]:
    """Sorted top-level ``*.py`` files of the running interpreter's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"no *.py files under the stdlib path {root}; the corpus needs the "
                                "interpreter's standard library source (install python3 with its .py files)")
    return files[:max_files] if max_files else files


def byte_split(max_files: int | None, heldout_every: int, max_bytes: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(train, heldout) byte streams as uint8 arrays from disjoint files, each capped at max_bytes."""
    train, held = bytearray(), bytearray()
    for i, f in enumerate(stdlib_files(max_files)):
        (held if i % heldout_every == heldout_every - 1 else train).extend(f.read_bytes() + b"\n")
    cap = (lambda b: b[:max_bytes]) if max_bytes else (lambda b: b)
    return np.frombuffer(bytes(cap(train)), np.uint8), np.frombuffer(bytes(cap(held)), np.uint8)


def windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator | None) -> np.ndarray:
    """n windows of ``length`` tokens: random starts (rng given) or evenly spaced (rng None: a fixed
    evaluation set, identical for every variant of a seed)."""
    hi = len(stream) - length
    if hi <= 0:
        raise ValueError(f"stream of {len(stream)} tokens is shorter than one window of {length}")
    starts = rng.integers(0, hi, n) if rng is not None else np.linspace(0, hi, n).astype(np.int64)
    return np.stack([stream[s:s + length] for s in starts]).astype(np.int64)
