"""PDEBench 2-D incompressible Navier-Stokes (``ns_incom_inhom_2d_512-<k>.h5``) mapped to the reprozoo layout.

PDEBench layout (raw, written by its phiflow generator): ``velocity`` (batch, time, x, y, 2),
``particles`` (batch, time, x, y, 1) -- a passive density that also scales the body force --,
``force`` (batch, x, y, 2), ``t`` (batch, time). PDEBench's runs use no-slip walls, viscosity 0.01,
512 x 512 cells and 1000 frames 0.005 apart (~10 GB per file, a few samples each).

source=remote   the real file from DaRUS (MD5-verified, downloaded whole).
source=offline  a stand-in in the same raw layout from the reprozoo pseudo-spectral vorticity solver:
                u_t + u.grad u = -grad p + nu Lap u + c F,  c_t + u.grad c = kappa Lap c, on the
                PERIODIC unit square (not PDEBench's walls), random smooth velocity, density and
                force. It is NOT PDEBench data; the card says so (``origin``).

Processed: ``pdebench_ns2d.h5`` with fields velocity (traj,time,x,y,component), particles
(traj,time,x,y), force (traj,x,y,component); coords x, y (cell centres of [0,1]^2) and t.
``n`` (a divisor of the raw grid), ``dt_save`` (a multiple of the raw frame step), ``t_end`` and
``n_traj`` select a subset of the raw file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import pdebench
from .common import grf_periodic, make_split, plt_agg, read_h5, write_h5
from .kolmogorov import Vorticity2D
from reprozoo.figures import save_figure

OUT = "pdebench_ns2d.h5"
STANDIN_ORIGIN = ("reprozoo periodic vorticity solver in PDEBench NS layout "
                  "(offline stand-in, not PDEBench data)")


def write_standin(params: dict, raw_dir: Path, seed: int) -> Path:
    import h5py

    from ...io import atomic_path

    off = params.get("offline", {})
    n, n_traj = int(off.get("n", params.get("n", 64))), int(off.get("n_traj", params.get("n_traj", 2)))
    nu, kappa = float(off.get("nu", 2e-3)), float(off.get("kappa", 2e-3))
    dt_save, t_end = float(off.get("dt_save", params.get("dt_save", 0.05))), float(off.get("t_end", params.get("t_end", 2.0)))
    rng = np.random.default_rng(seed)
    ic = lambda a: grf_periodic(rng, n_traj, n, 2, alpha=a, tau=2 * np.pi * 2, length=1.0)  # noqa: E731
    w0 = ic(float(off.get("ic_alpha", 4.0)))
    c0 = 0.5 + 0.25 * ic(4.0)  # smooth positive-ish density
    force = np.stack([ic(5.0), ic(5.0)], axis=-1) * float(off.get("force_scale", 0.5))
    solver = Vorticity2D(n, 1.0, nu, 0.0, None, scalar_diffusivity=kappa, scalar_force=force)
    vel0 = solver.velocity(solver.to_hat(w0))
    w0 *= (float(off.get("ic_velocity_rms", 0.4)) / np.sqrt(np.mean(np.sum(vel0**2, -1), axis=(1, 2))))[:, None, None]
    n_t = int(round(t_end / dt_save)) + 1
    t = np.arange(n_t) * dt_save
    w, c = solver.run(w0, t, c0=c0, cfl=float(off.get("cfl", 0.5)), dt_max=float(off.get("dt_max", 0.02)))
    vel = solver.velocity(solver.to_hat(w.reshape(-1, n, n))).reshape(w.shape + (2,))
    path = Path(raw_dir) / params["file"]
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as h:
            h.create_dataset("velocity", data=vel.astype(np.float32), chunks=(1, 1, n, n, 2), track_times=False)
            h.create_dataset("particles", data=c[..., None].astype(np.float32), chunks=(1, 1, n, n, 1),
                             track_times=False)
            h.create_dataset("force", data=force.astype(np.float32), track_times=False)
            h.create_dataset("t", data=np.broadcast_to(t, (n_traj, n_t)).astype(np.float32), track_times=False)
            h.attrs["reprozoo_origin"] = STANDIN_ORIGIN
            h.attrs["config"] = (f"periodic unit square, n={n}, nu={nu}, kappa={kappa}, dt_save={dt_save}, "
                                 f"t_end={t_end}, seed={seed}, solver steps={solver.steps}")
    return path


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    if source == "remote":
        return pdebench.acquire_remote(params, raw_dir)
    write_standin(params, raw_dir, seed)
    return {"version": "standin-1", "origin": STANDIN_ORIGIN, "mimics": params["file"],
            "generator": "reprozoo.data.pde.pdebench_ns.write_standin"}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    import h5py

    name = params["file"]
    with h5py.File(Path(raw_dir) / name, "r") as h:
        for key in ("velocity", "particles", "force", "t"):
            if key not in h:
                raise KeyError(f"{name}: PDEBench key '{key}' missing (keys: {list(h)})")
        vd, pd_, fd = h["velocity"], h["particles"], h["force"]
        b_all, nt_raw, nx_raw = vd.shape[:3]
        t_raw = h["t"][0].astype(np.float64)
        origin = h.attrs.get("reprozoo_origin", "PDEBench (DaRUS)")
        if isinstance(origin, bytes):
            origin = origin.decode()
        config = h.attrs.get("config", "")
        if isinstance(config, bytes):
            config = config.decode()
        dt_raw = float(t_raw[1] - t_raw[0]) if nt_raw > 1 else 1.0
        sx = pdebench.stride_for(nx_raw, params.get("n"), "n")
        st = max(1, int(round(float(params.get("dt_save", dt_raw)) / dt_raw)))
        t_end = float(params.get("t_end", t_raw[-1]))
        nt_keep = int(np.searchsorted(t_raw, t_end + 1e-9 * max(1.0, abs(t_end)), side="right"))
        n = min(int(params.get("n_traj", b_all)), b_all)
        vel = np.stack([vd[i, :nt_keep:st, ::sx, ::sx, :] for i in range(n)])
        par = np.stack([pd_[i, :nt_keep:st, ::sx, ::sx, 0] for i in range(n)])
        force = np.stack([fd[i, ::sx, ::sx, :] for i in range(n)])
    t = t_raw[:nt_keep:st]
    x = (np.arange(nx_raw)[::sx] + 0.5) / nx_raw
    write_h5(Path(out_dir) / OUT,
             {"velocity": (vel, "traj,time,x,y,component"), "particles": (par, "traj,time,x,y"),
              "force": (force, "traj,x,y,component")},
             {"x": x, "y": x, "t": t},
             {"equation": "u_t + u.grad u = -grad p + nu Lap u + c F, div u = 0; c passive density",
              "domain": "[0, 1]^2 (PDEBench: no-slip walls; offline stand-in: periodic)",
              "grid": "cell centres, subsampled", "source_file": name, "origin": origin, "raw_config": config,
              "x_stride": sx, "t_stride": st, "raw_shape": [b_all, nt_raw, nx_raw, nx_raw], "n": len(x),
              "dt_save": float(t[1] - t[0]) if len(t) > 1 else 0.0},
             split=make_split(n))
    return {"files": [OUT], "sizes": {"n_traj": n, "velocity_shape": list(vel.shape),
                                      "raw_shape": [b_all, nt_raw, nx_raw, nx_raw]},
            "origin": origin, "grid": {"n": len(x), "x_stride": sx},
            "time": {"t0": float(t[0]), "t1": float(t[-1]), "n_t": len(t), "t_stride": st}}


def preview(out_dir: Path, png: Path) -> None:
    plt = plt_agg()
    d = read_h5(Path(out_dir) / OUT)
    vel, par, t = d.fields["velocity"], d.fields["particles"], d.coords["t"]
    picks = [0, len(t) // 2, len(t) - 1]
    fig, axes = plt.subplots(2, 3, figsize=(10, 6.4))
    for j, i in enumerate(picks):
        speed = np.sqrt(np.sum(vel[0, i] ** 2, -1))
        axes[0, j].imshow(speed.T, origin="lower", cmap="magma", extent=[0, 1, 0, 1])
        axes[0, j].set_title(f"|u|, t={t[i]:.2f}")
        axes[1, j].imshow(par[0, i].T, origin="lower", cmap="viridis", extent=[0, 1, 0, 1])
        axes[1, j].set_title(f"particles, t={t[i]:.2f}")
    kind = "stand-in" if "stand-in" in d.attrs["origin"] else "PDEBench"
    fig.suptitle(f"PDEBench 2-D incompressible NS ({kind}), n={d.attrs['n']}")
    save_figure(fig, png, dpi=90)


def load(out_dir: Path):
    """PDEData with velocity (traj,time,x,y,2), particles (traj,time,x,y), force (traj,x,y,2)."""
    return read_h5(Path(out_dir) / OUT)
