"""The running simulation the compressor sits in: 2-D Kolmogorov flow from the shared solver.

    d_t w + u . grad w = nu Lap w - drag w - A k_f cos(k_f y),   -Lap psi = w,  u = (d_y psi, -d_x psi)

on [0, 2 pi)^2, started from a Gaussian random field scaled to unit rms velocity, so a trajectory
holds the decay of the initial transient (fast change) and then the forced, slower regime: an
adaptive temporal selector has something to adapt to. The solver is driven from our own loop with
``common.march`` and a ``record(i, state)`` callback (the in-situ hook); the data module is not
edited. Frames are grid vorticity, float64; raw storage is counted as float32.
"""
from __future__ import annotations

import time

import numpy as np

from ...data.pde.common import grf_periodic, march
from ...data.pde.kolmogorov import Vorticity2D, kolmogorov_curl


def make_flow(p: dict, seed: int):
    """Solver, initial spectral state and save times for one seed's trajectory."""
    n, length = int(p["n"]), 2 * np.pi
    solver = Vorticity2D(n, length, float(p["nu"]), float(p["drag"]),
                         kolmogorov_curl(n, length, int(p["k_f"]), float(p["forcing_amplitude"])))
    w0 = grf_periodic(np.random.default_rng(seed), 1, n, 2, alpha=4.0, tau=3.0, length=length)
    vel = solver.velocity(solver.to_hat(w0))
    w0 = w0 / np.sqrt(np.mean(np.sum(vel**2, -1)))
    t_save = float(p["t_start"]) + np.arange(int(p["n_frames"])) * float(p["dt_save"])
    return solver, solver.to_hat(w0), t_save


def run_insitu(solver, w_hat0, t_save, on_frame=None, cfl: float = 0.5, dt_max: float = 0.05):
    """March the solver through ``t_save``; ``on_frame(i, w)`` sees each grid frame (float64, (n, n)).

    Returns the wall seconds of the whole run (solver + callback) and the seconds spent inside the
    callback, so the in-situ overhead is read from one run; ``.cpu_s`` of the function holds the
    process CPU seconds of the last run (robust to other jobs on a shared machine).
    """
    spent = [0.0]
    c0 = time.process_time()

    def record(i, state):
        if on_frame is None:
            return
        t0 = time.perf_counter()
        on_frame(i, solver.to_grid(state[0])[0])
        spent[0] += time.perf_counter() - t0

    t0 = time.perf_counter()
    march((w_hat0, None), t_save, solver.step, lambda st: solver.stable_dt(st[0], cfl, dt_max), record,
          recheck=0.5)
    run_insitu.cpu_s = time.process_time() - c0
    return time.perf_counter() - t0, spent[0]


def enstrophy(w: np.ndarray) -> np.ndarray:
    """Domain-mean enstrophy Z = 1/2 <w^2> of frames (..., x, y)."""
    return 0.5 * np.mean(np.asarray(w, dtype=np.float64) ** 2, axis=(-2, -1))
