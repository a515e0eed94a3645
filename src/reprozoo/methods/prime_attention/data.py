"""Data of the miniature: a coupled seasonal system with known pairwise laws, and macrodata.

Synthetic system (ours). A *system* (:func:`draw_system`, drawn once per seed) fixes everything
but the noise; :func:`simulate` then draws independent realisations (episodes) of it, so the
training series, the validation episodes and the test episodes are independent draws of one
stationary process and every test episode is an independent test unit.

``n_drivers`` drivers, each the sum of two unit-variance parts (weights ``season_share`` and
1 - ``season_share`` of the variance):

* a *seasonal* part with a long period P (``season_period``, longer than the short lookback):
  s_t = phi s_{t-P} + sqrt(1 - phi^2) e_t, with e a moving average of white noise over
  ``season_smooth`` steps (unit variance). The season's shape is random and drifts from cycle to
  cycle, so it cannot be memorised by the weights: the only way to forecast s_{t+h} is to read
  s_{t+h-P} from the input, which a lookback L sees only when P - h <= L - 1;
* a stochastic damped oscillator, an AR(2) process with a random period and pole radius r:
  o_t = 2 r cos(2 pi / period) o_{t-1} - r^2 o_{t-2} + eps_t (scaled by its stationary std).

Each of ``n_drivers`` targets y *echoes* one driver (a seed-dependent permutation) through one
coupling law at its own lag (drawn per target from ``lags`` = [lo, hi], seed-dependent), with
observation noise sigma on every channel:

    linear        y_t =  a d_{t - lag}                 (a = 0.9)
    delayed       y_t =  d_{t - lag}                   (a plain delayed copy)
    sign_flipped  y_t = -d_{t - lag}
    nonlinear     y_t =  d_{t - lag} |d_{t - lag}| / sqrt(3)  (a signed square: invertible, so the echo
                                                        keeps the driver's sign; unit variance)

With lags near 40 a short window still holds last cycle of every driver, but only on its echo: a
lookback L sees d_{t+h-P} on the driver itself when P - h <= L - 1, and on the echo (row
t + h - P + lag) when P - h - lag <= L - 1 (and P - h - lag >= 0). For P = 90, lags 34-42 and
L = 58 that is every h <= 48 on the echo and none on the driver; L = 96 sees it on both. So the
short lookback can reach last cycle only across channels, through the pair (driver, its echo):
the relation prime attention is built to model (``test_last_cycle_reachable_only_across_channels``).

Channels are ordered [drivers..., targets...]. The (N, N) map of the true law for (query = target
i, key = source j) is 0 where channel j does not drive channel i: the map the learned pairwise
filters are compared with. The *homogeneous* system (``homogeneous=True``) is the same but for one
law (a delayed copy) and one lag for every pair: the control on which priming per pair has nothing to
add over a standard model that knows which channel is which.
The *unpaired* system (``unpaired=True``, the must-fail control since round 5) keeps every law, lag and
marginal but makes each target echo a hidden, independent realisation of its driver's process: no
channel carries information about another, so a per-pair table has nothing to learn.

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


def ar2_variance(a1: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """Stationary variance of x_t = a1 x_{t-1} + a2 x_{t-2} + eps_t with unit-variance eps."""
    return (1 - a2) / ((1 + a2) * ((1 - a2) ** 2 - a1 ** 2))


def ar2_oscillators(rng: np.random.Generator, a1: np.ndarray, a2: np.ndarray, n_episodes: int, length: int,
                    burn: int = 500) -> np.ndarray:
    """(n_episodes, length, n) unit-variance AR(2) processes, one column per coefficient pair."""
    n = len(a1)
    eps = rng.standard_normal((n_episodes, length + burn, n))
    x = np.zeros_like(eps)
    for t in range(2, length + burn):
        x[:, t] = a1 * x[:, t - 1] + a2 * x[:, t - 2] + eps[:, t]
    return x[:, burn:] / np.sqrt(ar2_variance(a1, a2))


def seasonal_ar(rng: np.random.Generator, n_episodes: int, length: int, n: int, period: int, phi: float,
                smooth: int) -> np.ndarray:
    """(n_episodes, length, n) stationary seasonal AR: s_t = phi s_{t-P} + sqrt(1 - phi^2) e_t.

    e is a moving average of white noise over ``smooth`` steps (unit variance); the first period is
    e itself, so the process starts in its stationary distribution (variance 1, no burn-in)."""
    w = rng.standard_normal((n_episodes, length + smooth - 1, n))
    c = np.cumsum(np.concatenate([np.zeros((n_episodes, 1, n)), w], axis=1), axis=1)
    e = (c[:, smooth:] - c[:, :-smooth]) / np.sqrt(smooth)
    s = e.copy()
    k = np.sqrt(1 - phi ** 2)
    for start in range(period, length, period):
        stop = min(start + period, length)
        s[:, start:stop] = phi * s[:, start - period:stop - period] + k * e[:, start:stop]
    return s


def draw_system(rng: np.random.Generator, n_drivers: int = 4, lags=(34, 42), noise: float = 0.1,
                season_period: int = 90, season_phi: float = 0.9, season_smooth: int = 5,
                season_share: float = 0.5, osc_periods=(12.0, 60.0), osc_radius=(0.95, 0.99),
                homogeneous: bool = False, unpaired: bool = False) -> dict:
    """Everything that defines one coupled system except the noise realisation.

    ``homogeneous``: every (driver, echo) pair has the same law (a delayed copy) and the same lag (one
    draw from ``lags``): the control system, where one static value per key serves every pair.
    ``unpaired``: every target echoes (through its own law and lag, as before) a *hidden* copy of its
    driver, an independent realisation of the same process that is not among the channels: every channel
    keeps its marginal law, and no channel carries information about another (the must-fail control
    without pair structure; its coupling map is all zero)."""
    P = rng.uniform(*osc_periods, size=n_drivers)
    r = rng.uniform(*osc_radius, size=n_drivers)
    types = [1 + (k % 4) for k in range(n_drivers)]  # linear, delayed, sign_flipped, nonlinear, ...
    source = rng.permutation(n_drivers)
    lag = rng.integers(int(lags[0]), int(lags[1]) + 1, size=n_drivers)
    if homogeneous:
        types = [LAWS.index("delayed")] * n_drivers
        lag = np.full(n_drivers, lag[0])
    N = 2 * n_drivers
    cmap = np.zeros((N, N), dtype=int)
    for k, (law, s) in enumerate(zip(types, source)):
        if not unpaired:
            cmap[n_drivers + k, s] = law
    return {"unpaired": bool(unpaired), "a1": 2 * r * np.cos(2 * np.pi / P), "a2": -r ** 2, "types": types,
            "source": source, "cmap": cmap,
            "lag": [int(x) for x in lag], "noise": float(noise),
            "season_period": int(season_period), "season_phi": float(season_phi),
            "season_smooth": int(season_smooth), "season_share": float(season_share)}


def simulate(system: dict, rng: np.random.Generator, n_episodes: int, length: int) -> np.ndarray:
    """(n_episodes, length, 2 n_drivers) float32 independent realisations of ``system``."""
    n = len(system["a1"])
    pad = max(system["lag"])
    w = system["season_share"]
    s = seasonal_ar(rng, n_episodes, length + pad, n, system["season_period"], system["season_phi"],
                    system["season_smooth"])
    o = ar2_oscillators(rng, system["a1"], system["a2"], n_episodes, length + pad)
    d = np.sqrt(w) * s + np.sqrt(1 - w) * o
    src_of = d
    if system.get("unpaired"):  # the echoes read an independent hidden realisation of the same drivers
        s2 = seasonal_ar(rng, n_episodes, length + pad, n, system["season_period"], system["season_phi"],
                         system["season_smooth"])
        o2 = ar2_oscillators(rng, system["a1"], system["a2"], n_episodes, length + pad)
        src_of = np.sqrt(w) * s2 + np.sqrt(1 - w) * o2
    y = np.zeros((n_episodes, length, n))
    for k, (law, src, lag) in enumerate(zip(system["types"], system["source"], system["lag"])):
        x = src_of[:, pad - lag: pad - lag + length, src]
        y[:, :, k] = {"linear": 0.9 * x, "delayed": x, "sign_flipped": -x,
                      "nonlinear": x * np.abs(x) / np.sqrt(3)}[LAWS[law]]
    series = np.concatenate([d[:, pad:], y], axis=2)
    series = series + system["noise"] * rng.standard_normal(series.shape)
    return series.astype(np.float32)


def coupled_system(rng: np.random.Generator, length: int, n_drivers: int = 4, lags=(34, 42), noise: float = 0.1,
                   **season) -> tuple[np.ndarray, dict]:
    """One (length, 2 n_drivers) series of a freshly drawn system, and the system."""
    system = draw_system(rng, n_drivers, lags, noise, **season)
    return simulate(system, rng, 1, length)[0], system


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


def episode_windows(episodes: np.ndarray, max_lookback: int, lookback: int, horizon: int):
    """Inputs (E, lookback, N) and targets (E, horizon, N) of independent episodes whose forecast
    origin is row ``max_lookback``: every lookback and horizon forecasts the same future."""
    return episodes[:, max_lookback - lookback:max_lookback], episodes[:, max_lookback:max_lookback + horizon]
