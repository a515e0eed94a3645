"""Data of the miniature: a coupled synthetic system with known pairwise laws, and macrodata.

Synthetic system (ours). ``n_drivers`` drivers are stochastic damped oscillators, AR(2)
processes with a random period P and pole radius r (unit variance after scaling):

    d_t = 2 r cos(2 pi / P) d_{t-1} - r^2 d_{t-2} + eps_t,        eps_t ~ N(0, 1)

and each of ``n_drivers`` targets y is driven by one driver (a seed-dependent permutation) through
one coupling law, with observation noise sigma on every channel:

    linear        y_t =  a d_{t - lag}                 (a = 0.9, lag = short_lag)
    delayed       y_t =  d_{t - long_lag}
    sign_flipped  y_t = -d_{t - lag}
    nonlinear     y_t =  (d_{t - lag}^2 - 1) / sqrt(2)  (frequency doubling; zero mean, unit variance)

Channels are ordered [drivers..., targets...]. ``coupling_types`` returns the (N, N) map of the
true law for (query = target i, key = source j), 0 where channel j does not drive channel i: the
map the learned pairwise filters are compared with.

Macrodata (statsmodels, 203 quarters, 12 variables): level series that grow (GDP, consumption,
investment, government spending, income, CPI, M1, population) enter as quarterly log-growth
(x 100, in %), rates (T-bill, unemployment, inflation, real interest) as they are; one row is
lost to the difference. Every channel is standardised with the training segment's mean and std.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

LAWS = ("none", "linear", "delayed", "sign_flipped", "nonlinear")
MACRO_GROWTH = ("realgdp", "realcons", "realinv", "realgovt", "realdpi", "cpi", "m1", "pop")
MACRO_RATES = ("tbilrate", "unemp", "infl", "realint")


def ar2_oscillators(rng: np.random.Generator, n: int, length: int, periods=(12.0, 60.0),
                    radius=(0.95, 0.99), burn: int = 500) -> np.ndarray:
    """(length, n) unit-variance damped stochastic oscillators (AR(2) with complex poles r e^{+-i w})."""
    P = rng.uniform(*periods, size=n)
    r = rng.uniform(*radius, size=n)
    a1, a2 = 2 * r * np.cos(2 * np.pi / P), -r ** 2
    eps = rng.standard_normal((length + burn, n))
    x = np.zeros((length + burn, n))
    for t in range(2, length + burn):
        x[t] = a1 * x[t - 1] + a2 * x[t - 2] + eps[t]
    x = x[burn:]
    return (x - x.mean(0)) / x.std(0)


def coupled_system(rng: np.random.Generator, length: int, n_drivers: int = 4, short_lag: int = 6,
                   long_lag: int = 72, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(length, 2 n_drivers) series and the (N, N) integer map of true coupling laws (index into LAWS)."""
    pad = max(short_lag, long_lag)
    d = ar2_oscillators(rng, n_drivers, length + pad)
    types = [1 + (k % 4) for k in range(n_drivers)]  # linear, delayed, sign_flipped, nonlinear, ...
    source = rng.permutation(n_drivers)
    N = 2 * n_drivers
    y = np.zeros((length, n_drivers))
    cmap = np.zeros((N, N), dtype=int)
    for k, (law, s) in enumerate(zip(types, source)):
        lag = long_lag if LAWS[law] == "delayed" else short_lag
        x = d[pad - lag: pad - lag + length, s]
        y[:, k] = {"linear": 0.9 * x, "delayed": x, "sign_flipped": -x,
                   "nonlinear": (x ** 2 - 1) / np.sqrt(2)}[LAWS[law]]
        cmap[n_drivers + k, s] = law
    series = np.concatenate([d[pad:], y], axis=1)
    series = series + noise * rng.standard_normal(series.shape)
    return series.astype(np.float32), cmap


def load_macrodata(folder: Path | str | None) -> tuple[np.ndarray, list[str]]:
    """(202, 12) macrodata in model units (log-growth in % for levels, rates as they are) and names.

    ``folder``: the processed ``ts_statsmodels`` dataset (macrodata.parquet); None reads the CSV
    bundled in statsmodels directly (tests)."""
    import pandas as pd

    if folder is not None:
        df = pd.read_parquet(Path(folder) / "macrodata.parquet")
    else:
        import statsmodels.api as sm

        df = sm.datasets.macrodata.load_pandas().data
    cols = list(MACRO_GROWTH) + list(MACRO_RATES)
    growth = 100 * np.diff(np.log(df[list(MACRO_GROWTH)].to_numpy(np.float64)), axis=0)
    rates = df[list(MACRO_RATES)].to_numpy(np.float64)[1:]
    return np.concatenate([growth, rates], axis=1).astype(np.float32), cols


def split_standardise(series: np.ndarray, fractions=(0.7, 0.1)) -> tuple[np.ndarray, tuple[int, int]]:
    """Standardise with the training segment's statistics; return the series and the split borders
    (end of train, end of validation) in rows. Test is the rest (chronological, no shuffling)."""
    T = len(series)
    n_tr, n_va = int(fractions[0] * T), int(fractions[1] * T)
    mu, sd = series[:n_tr].mean(0), series[:n_tr].std(0) + 1e-8
    return ((series - mu) / sd).astype(np.float32), (n_tr, n_tr + n_va)


def window_starts(lo: int, hi: int, lookback: int, horizon: int, targets_from: int | None = None,
                  stride: int = 1) -> np.ndarray:
    """Start rows s of windows [s, s + lookback) -> [s + lookback, s + lookback + horizon) whose targets
    lie in rows [targets_from, hi) (TSLib convention: validation and test windows borrow their context
    from the segment before; ``targets_from`` defaults to lo + lookback, i.e. no borrowing)."""
    first = (lo if targets_from is None else targets_from - lookback)
    first = max(first, 0)
    last = hi - lookback - horizon
    if last < first:
        return np.zeros(0, dtype=int)
    return np.arange(first, last + 1, stride)


def windows(series: np.ndarray, starts: np.ndarray, lookback: int, horizon: int):
    """Stack windows: inputs (n, lookback, N) and targets (n, horizon, N)."""
    idx = starts[:, None] + np.arange(lookback + horizon)[None]
    w = series[idx]
    return w[:, :lookback], w[:, lookback:]
