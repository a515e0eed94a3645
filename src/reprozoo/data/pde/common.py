"""Shared pieces of the PDE datasets: the HDF5 layout, random initial conditions, previews.

Processed layout (one ``.h5`` file per problem, written atomically)::

    /fields/<name>        float32, e.g. (traj, time, x, y); attr ``dims`` = "traj,time,x,y"
    /coords/<name>        float64 grid and time coordinates (x, y, t, ...)
    /diagnostics/<name>   float64 quantities computed by the solver (energy, dissipation, ...)
    /split/{train,val,test}  int64 trajectory indices
    root attrs            equation, parameters, grid and time metadata (scalars/strings; dicts as JSON)

Solvers compute in float64; fields are stored as float32.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import math

import numpy as np

from ...io import atomic_path

LAYOUT_VERSION = "reprozoo-pde-h5-1"


# --- HDF5 layout -----------------------------------------------------------------------------

def _attr_value(v: Any):
    if isinstance(v, (dict, list, tuple)) and not (isinstance(v, (list, tuple)) and v and
                                                    all(isinstance(i, (int, float)) for i in v)):
        return json.dumps(v)
    if v is None:
        return "null"
    return v


def write_h5(path: Path | str, fields: dict[str, tuple[np.ndarray, str]], coords: dict[str, np.ndarray],
             attrs: dict[str, Any], diagnostics: dict[str, np.ndarray] | None = None,
             split: dict[str, np.ndarray] | None = None, dtype=np.float32) -> None:
    """Write one problem. ``fields`` maps name -> (array, "dim,dim,..."); arrays are cast to ``dtype``."""
    import h5py

    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w", track_order=True) as h:
            h.attrs["layout"] = LAYOUT_VERSION
            for k, v in attrs.items():
                h.attrs[k] = _attr_value(v)
            g = h.create_group("fields")
            for name, (arr, dims) in fields.items():
                arr = np.asarray(arr)
                if len(dims.split(",")) != arr.ndim:
                    raise ValueError(f"field {name}: dims '{dims}' do not match shape {arr.shape}")
                chunks = tuple([1] * max(arr.ndim - 2, 0) + list(arr.shape[-2:])) if arr.ndim > 2 else None
                if arr.ndim >= 4 and dims.endswith("component"):
                    chunks = tuple([1] * (arr.ndim - 3) + list(arr.shape[-3:]))
                d = g.create_dataset(name, data=arr.astype(dtype), chunks=chunks, track_times=False)
                d.attrs["dims"] = dims
            c = h.create_group("coords")
            for name, arr in coords.items():
                c.create_dataset(name, data=np.asarray(arr, dtype=np.float64), track_times=False)
            if diagnostics:
                dg = h.create_group("diagnostics")
                for name, arr in diagnostics.items():
                    dg.create_dataset(name, data=np.asarray(arr, dtype=np.float64), track_times=False)
            if split:
                s = h.create_group("split")
                for name, idx in split.items():
                    s.create_dataset(name, data=np.asarray(idx, dtype=np.int64), track_times=False)


@dataclass
class PDEData:
    """What ``load`` returns for one PDE problem (arrays fully read into memory)."""

    fields: dict[str, np.ndarray]
    dims: dict[str, tuple[str, ...]]
    coords: dict[str, np.ndarray]
    attrs: dict[str, Any]
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)
    split: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.fields[name]


def _parse_attr(v):
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        if v[:1] in "[{" or v == "null":
            try:
                return json.loads(v)
            except ValueError:
                return v
        return v
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_h5(path: Path | str, fields: list[str] | None = None) -> PDEData:
    import h5py

    with h5py.File(path, "r") as h:
        names = list(h["fields"]) if fields is None else fields
        out = PDEData(
            fields={n: h["fields"][n][()] for n in names},
            dims={n: tuple(str(h["fields"][n].attrs["dims"]).split(",")) for n in names},
            coords={n: h["coords"][n][()] for n in h["coords"]},
            attrs={k: _parse_attr(v) for k, v in h.attrs.items()},
        )
        if "diagnostics" in h:
            out.diagnostics = {n: h["diagnostics"][n][()] for n in h["diagnostics"]}
        if "split" in h:
            out.split = {n: h["split"][n][()] for n in h["split"]}
    return out


def make_split(n: int, fractions=(0.8, 0.1, 0.1)) -> dict[str, np.ndarray]:
    """Contiguous train/val/test trajectory indices (trajectories are already i.i.d. draws)."""
    n_val = int(round(n * fractions[1])) if n >= 3 else 0
    n_test = int(round(n * fractions[2])) if n >= 3 else 0
    if n >= 3:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
    n_train = n - n_val - n_test
    idx = np.arange(n)
    return {"train": idx[:n_train], "val": idx[n_train:n_train + n_val], "test": idx[n_train + n_val:]}


def copy_processed(raw_file: Path, out_file: Path, split_fractions=(0.8, 0.1, 0.1)) -> PDEData:
    """Raw solver output -> processed file: same arrays, plus the train/val/test split."""
    d = read_h5(raw_file)
    n = next(iter(d.fields.values())).shape[0]
    write_h5(out_file, {k: (v, ",".join(d.dims[k])) for k, v in d.fields.items()}, d.coords,
             {k: v for k, v in d.attrs.items() if k != "layout"}, d.diagnostics, make_split(n, split_fractions))
    return d


def file_sizes(d: PDEData) -> dict[str, Any]:
    return {f"{k}_shape": list(v.shape) for k, v in d.fields.items()}


# --- spectral helpers ------------------------------------------------------------------------

def wavenumbers(n: int, length: float, real: bool = False) -> np.ndarray:
    """Angular wavenumbers 2*pi*m/L of an n-point periodic grid (rfft layout if ``real``)."""
    d = length / n
    return 2 * np.pi * (np.fft.rfftfreq(n, d) if real else np.fft.fftfreq(n, d))


def dealias_mask(n: int, real_last: bool, ndim: int) -> np.ndarray:
    """2/3 rule: keep integer modes |m| < n/3 along every axis (drops the Nyquist mode)."""
    m_full = np.abs(np.fft.fftfreq(n, 1.0 / n))
    m_half = np.abs(np.fft.rfftfreq(n, 1.0 / n))
    axes = [m_full] * (ndim - 1) + [m_half if real_last else m_full]
    grids = np.meshgrid(*axes, indexing="ij")
    mask = np.ones(grids[0].shape, dtype=bool)
    for g in grids:
        mask &= g < n / 3.0
    return mask


def grf_periodic(rng: np.random.Generator, batch: int, n: int, ndim: int, alpha: float = 2.0,
                 tau: float = 3.0, length: float = 2 * np.pi) -> np.ndarray:
    """Zero-mean Gaussian random fields with covariance (-Lap + tau^2)^(-alpha), unit rms per sample.

    White noise is drawn on the grid and filtered in Fourier space, so the result is real and
    deterministic for the generator state.
    """
    shape = (batch,) + (n,) * ndim
    noise = rng.standard_normal(shape)
    ks = [wavenumbers(n, length)] * (ndim - 1) + [wavenumbers(n, length, real=True)]
    k2 = sum(g**2 for g in np.meshgrid(*ks, indexing="ij"))
    spec = (k2 + tau**2) ** (-alpha / 2.0)
    spec.flat[0] = 0.0
    axes = tuple(range(1, ndim + 1))
    f = np.fft.irfftn(np.fft.rfftn(noise, axes=axes) * spec, s=(n,) * ndim, axes=axes)
    rms = np.sqrt(np.mean(f**2, axis=axes, keepdims=True))
    return f / rms


# --- time stepping ---------------------------------------------------------------------------

def lawson_rk4(u_hat, h: float, lin, nonlinear):
    """One integrating-factor (Lawson) RK4 step of u_t = L u + N(u) in spectral space.

    The stiff diagonal linear part ``lin`` (e.g. -nu k^2) is integrated exactly through e^{L h};
    the nonlinear part by classical RK4 on the transformed variable: fourth order, and stable for
    any viscosity at the step the advection allows.
    """
    e_half, e_full = np.exp(lin * h / 2), np.exp(lin * h)
    k1 = nonlinear(u_hat)
    k2 = nonlinear(e_half * (u_hat + h / 2 * k1))
    k3 = nonlinear(e_half * u_hat + h / 2 * k2)
    k4 = nonlinear(e_full * u_hat + h * e_half * k3)
    return e_full * u_hat + h / 6 * (e_full * k1 + 2 * e_half * (k2 + k3) + k4)


def march(state, t_save, step, dt, record, recheck: float | None = None, check=None):
    """Advance ``state`` from t = 0 through the save times with ``step(state, h)``; one loop for all solvers.

    Between two save times (or within each ``recheck``-long piece of a longer span) the step is
    ``dt`` (a number, or ``dt(state)`` evaluated at the piece's start, e.g. a CFL step) shrunk so
    that a whole number of equal steps lands exactly on the save time: the result is deterministic
    and the order of the scheme is not spoiled by a ragged last step. ``record(i, state)`` stores
    frame i; ``check(t, state)`` runs after each interval (blow-up detection). Returns
    (state, number of steps).
    """
    t, steps = 0.0, 0
    for i, ts in enumerate(t_save):
        if ts > t:
            pieces = 1 if recheck is None else max(1, math.ceil((ts - t) / recheck - 1e-9))
            bounds = np.linspace(t, ts, pieces + 1)
            for a, b in zip(bounds[:-1], bounds[1:]):
                h0 = dt(state) if callable(dt) else dt
                m = max(1, math.ceil((b - a) / h0 - 1e-9))
                h = (b - a) / m
                for _ in range(m):
                    state = step(state, h)
                steps += m
            t = ts
            if check is not None:
                check(ts, state)
        record(i, state)
    return state, steps


# --- previews --------------------------------------------------------------------------------

def plt_agg():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
