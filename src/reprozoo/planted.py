"""Planted tables with a known answer, for checking the verdict rules (tests and benchmarks).

Like sbibm's tasks with reference solutions: a rule is trusted only after it recovers an effect
that was put there on purpose, at its stated rate.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def unit_table(rng: np.random.Generator, delta: float, seeds: int = 3, units: int = 200,
               seed_sd: float = 0.06, noise: float = 0.5) -> pd.DataFrame:
    """Variants ``a`` (effect ``delta``) and ``b`` scored on the same ``units`` test items per seed:
    a per-item difficulty both variants see (it cancels in a paired difference), a per-seed
    training effect of spread ``seed_sd`` per variant, and per-item noise. Metric ``acc`` (the
    per-seed mean) and its units ``acc#unit``, in the long-table format of ``metrics.parquet``."""
    difficulty = rng.normal(0, 1, units)
    rows = []
    for s in range(seeds):
        for v, mu in (("a", delta), ("b", 0.0)):
            y = mu + difficulty + rng.normal(0, seed_sd) + rng.normal(0, noise, units)
            rows.append(dict(method="m", variant=v, seed=s, metric="acc", x=float("nan"), value=float(y.mean())))
            rows += [dict(method="m", variant=v, seed=s, metric="acc#unit", x=float(i), value=float(val))
                     for i, val in enumerate(y)]
    return pd.DataFrame(rows)
