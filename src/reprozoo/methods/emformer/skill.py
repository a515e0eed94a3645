"""Forecast skill in the WeatherBench style, on our periodic grid.

The 32 rows of the grid are read as latitudes lat_j = -90 + (j + 1/2) * 180/32 degrees, so the
weights w_j = cos(lat_j) / mean_j cos(lat_j) are those of WeatherBench/FourCastNet (the reference
code's ``weighted_rmse_torch``); on a beta-plane this is a convention ("latitude-weighted-style"),
not geometry. For a forecast f and truth t of one variable at one lead:

    RMSE = mean over forecasts of sqrt( mean_{j,i} w_j (f - t)^2 )
    ACC  = mean over forecasts of  sum w f' t' / sqrt( sum w f'^2  sum w t'^2 ),   f' = f - c, t' = t - c

with c the climatology (time mean per grid point of the training trajectories).
"""
from __future__ import annotations

import numpy as np


def latitude_weights(ny: int) -> np.ndarray:
    lat = -90.0 + (np.arange(ny) + 0.5) * 180.0 / ny
    w = np.cos(np.deg2rad(lat))
    return w / w.mean()


def weighted_rmse(f: np.ndarray, t: np.ndarray) -> np.ndarray:
    """f, t (..., ny, nx) -> (...): per-field latitude-weighted RMSE."""
    w = latitude_weights(f.shape[-2])[:, None]
    return np.sqrt(np.mean(w * (f - t) ** 2, axis=(-2, -1)))


def weighted_acc(f: np.ndarray, t: np.ndarray, clim: np.ndarray) -> np.ndarray:
    w = latitude_weights(f.shape[-2])[:, None]
    fa, ta = f - clim, t - clim
    num = np.sum(w * fa * ta, axis=(-2, -1))
    den = np.sqrt(np.sum(w * fa**2, axis=(-2, -1)) * np.sum(w * ta**2, axis=(-2, -1)))
    return num / np.maximum(den, 1e-30)
