"""PDEBench 1-D Burgers (``1D_Burgers_Sols_Nu*.hdf5``) mapped to the reprozoo layout.

PDEBench layout (raw): ``tensor`` (sample, time, x) float32, ``x-coordinate`` (x,) cell centres of
[0, 1], ``t-coordinate`` (time + 1,) -- PDEBench stores one more time stamp than frames (t = k * 0.01,
k = 0..201 for 201 frames); the extra last entry is dropped. The equation PDEBench solves is
u_t + (u^2/2)_x = (nu / pi) u_xx, periodic on [0, 1], t in [0, 2].

source=remote   the real PDEBench file from DaRUS (MD5-verified; ~8 GB, downloaded whole).
source=offline  a stand-in written in the *same raw layout* by the reprozoo Burgers solver with
                PDEBench's conventions (domain [0,1], cell-centred grid, diffusion nu/pi, sine-sum
                initial conditions). It is NOT PDEBench data; the card says so (``origin``).

Processed: ``pdebench_burgers1d.h5`` with field u (traj, time, x), coords x, t; parameters ``n_traj``,
``nx`` (output grid, a divisor of the raw one) and ``dt_save`` (a multiple of the raw frame step) select
a subset of the raw file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import pdebench
from .burgers import Burgers1D, random_sines, spacetime_preview
from .common import make_split, read_h5, write_h5

OUT = "pdebench_burgers1d.h5"
STANDIN_ORIGIN = "reprozoo Burgers solver in PDEBench layout (offline stand-in, not PDEBench data)"


def write_standin(params: dict, raw_dir: Path, seed: int) -> Path:
    """Generate a PDEBench-layout file with our solver (float32 tensor, PDEBench's coordinate conventions)."""
    import h5py

    from ...io import atomic_path

    name = params["file"]
    nu = pdebench.nu_from_name(name)
    off = params.get("offline", {})
    nx, n_traj = int(off.get("nx", params.get("nx", 1024))), int(off.get("n_traj", params.get("n_traj", 16)))
    dt_save, t_end = float(off.get("dt_save", 0.01)), float(off.get("t_end", 2.0))
    xc = (np.arange(nx) + 0.5) / nx
    solver = Burgers1D(nx, 1.0, nu / np.pi)
    rng = np.random.default_rng(seed)
    u0 = random_sines(rng, n_traj, xc, 1.0, int(off.get("n_waves", 2)), int(off.get("k_max", 4)), 1.0)
    n_t = int(round(t_end / dt_save)) + 1
    t = np.arange(n_t) * dt_save
    u = solver.run(u0, t, cfl=float(off.get("cfl", 0.4)))
    path = Path(raw_dir) / name
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as h:
            h.create_dataset("tensor", data=u.astype(np.float32), track_times=False)
            h.create_dataset("x-coordinate", data=xc.astype(np.float32), track_times=False)
            h.create_dataset("t-coordinate", data=(np.arange(n_t + 1) * dt_save).astype(np.float32),
                             track_times=False)  # PDEBench's extra trailing stamp
            h.attrs["reprozoo_origin"] = STANDIN_ORIGIN
            h.attrs["seed"] = seed
            h.attrs["solver_steps"] = solver.steps
    return path


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    if source == "remote":
        return pdebench.acquire_remote(params, raw_dir)
    write_standin(params, raw_dir, seed)
    return {"version": "standin-1", "origin": STANDIN_ORIGIN, "mimics": params["file"],
            "generator": "reprozoo.data.pde.pdebench_burgers.write_standin"}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    import h5py

    name = params["file"]
    with h5py.File(Path(raw_dir) / name, "r") as h:
        for key in ("tensor", "x-coordinate", "t-coordinate"):
            if key not in h:
                raise KeyError(f"{name}: PDEBench key '{key}' missing (keys: {list(h)})")
        ds = h["tensor"]
        n_all, nt_raw, nx_raw = ds.shape
        x_raw = h["x-coordinate"][()].astype(np.float64)
        t_raw = h["t-coordinate"][()].astype(np.float64)
        origin = h.attrs.get("reprozoo_origin", "PDEBench (DaRUS)")
        if isinstance(origin, bytes):
            origin = origin.decode()
        dt_raw = float(t_raw[1] - t_raw[0])
        sx = pdebench.stride_for(nx_raw, params.get("nx"), "nx")
        st = max(1, int(round(float(params.get("dt_save", dt_raw)) / dt_raw)))
        n = min(int(params.get("n_traj", n_all)), n_all)
        block = max(1, int(2e8 // (nt_raw * nx_raw * 4)))  # read ~200 MB at a time
        u = np.concatenate([ds[i:min(i + block, n), ::st, ::sx] for i in range(0, n, block)], axis=0)
    t_note = "t-coordinate had one entry more than the frames; the last was dropped" if len(t_raw) == nt_raw + 1 else ""
    t = t_raw[:nt_raw][::st]
    x = x_raw[::sx]
    nu = pdebench.nu_from_name(name)
    write_h5(Path(out_dir) / OUT, {"u": (u, "traj,time,x")}, {"x": x, "t": t},
             {"equation": "u_t + (u^2/2)_x = (nu/pi) u_xx (PDEBench convention)", "nu": nu,
              "diffusion_coefficient": nu / np.pi if nu is not None else None,
              "domain": "[0, 1] periodic", "grid": "cell centres x_i = (i + 1/2)/nx_raw, subsampled",
              "source_file": name, "origin": origin, "x_stride": sx, "t_stride": st,
              "raw_shape": [n_all, nt_raw, nx_raw], "t_coordinate_note": t_note,
              "n": len(x), "dt_save": float(t[1] - t[0]) if len(t) > 1 else 0.0},
             split=make_split(n))
    return {"files": [OUT], "sizes": {"n_traj": n, "u_shape": list(u.shape), "raw_shape": [n_all, nt_raw, nx_raw]},
            "origin": origin, "grid": {"nx": len(x), "x_stride": sx, "domain": "[0,1] periodic"},
            "time": {"t0": float(t[0]), "t1": float(t[-1]), "n_t": len(t), "t_stride": st}}


def preview(out_dir: Path, png: Path) -> None:
    d = read_h5(Path(out_dir) / OUT)
    spacetime_preview(d.fields["u"], d.coords["x"], d.coords["t"], png,
                      f"PDEBench 1-D Burgers nu={d.attrs['nu']} ({'stand-in' if 'stand-in' in d.attrs['origin'] else 'PDEBench'})")


def load(out_dir: Path):
    """PDEData with field u (traj, time, x), coords x, t; attrs['origin'] tells PDEBench from the stand-in."""
    return read_h5(Path(out_dir) / OUT)
