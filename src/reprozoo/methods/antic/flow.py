"""The running simulation the compressor sits in: 2-D Kolmogorov flow from the shared solver.

    d_t w + u . grad w = nu Lap w - drag w - A k_f cos(k_f y),   -Lap psi = w,  u = (d_y psi, -d_x psi)

on [0, 2 pi)^2, started from a Gaussian random field scaled to unit rms velocity, so a trajectory
holds the decay of the initial transient (fast change) and then the forced, slower regime. With the
config's ``events`` the forcing also carries intermittent pulses (``PulsedVorticity2D``): short
bursts that each stir a localized vortex at a seeded time and place, sharp changes in time that
uniform sampling can straddle: an adaptive temporal selector has something to adapt to. The solver is driven from our own loop with
``common.march`` and a ``record(i, state)`` callback (the in-situ hook); the data module is not
edited. Frames are grid vorticity, float64; raw storage is counted as float32.
"""
from __future__ import annotations

import time

import numpy as np

from ...data.pde.common import grf_periodic, march
from ...data.pde.kolmogorov import Vorticity2D, kolmogorov_curl


class PulsedVorticity2D(Vorticity2D):
    """The Kolmogorov solver with intermittent events: on top of the steady forcing, short forcing
    pulses (Gaussian in time, width ``sigma_t``) that each stir a Gaussian vortex of radius ``radius``
    at a seeded place, with a seeded sign. The pulse enters as a forcing held constant over each
    step (evaluated at the step's midpoint time); the clock restarts with ``reset()`` (every run)."""

    def __init__(self, *args, events=(), **kw):
        super().__init__(*args, **kw)
        self.base_f_hat = None if self.f_hat is None else self.f_hat.copy()
        self.events = list(events)  # (t_centre, sigma_t, pattern_hat)
        self.t = 0.0

    def reset(self) -> None:
        self.t = 0.0

    def pulse(self, t: float):
        f = self.base_f_hat
        for tc, sig, pat in self.events:
            g = float(np.exp(-0.5 * ((t - tc) / sig) ** 2))
            if g > 1e-8:
                f = pat * g if f is None else f + pat * g
        return f

    def step(self, state, dt: float):
        self.f_hat = self.pulse(self.t + dt / 2)
        out = super().step(state, dt)
        self.t += dt
        return out


def event_schedule(p: dict, seed: int, t_save: np.ndarray, w_rms: float, n: int, length: float):
    """The events of one seed's run, drawn before anything is measured: ``n`` pulses, the j-th
    centred in the j-th of ``n`` equal stretches of the run between the fractions ``skip`` and ``end``
    (default 1) of its length (uniform within the middle 60 % of its stretch), each a Gaussian vortex
    forcing at a uniform random place with a random sign, scaled so that the vorticity it injects peaks at ``strength`` x the initial field's rms."""
    ev = p.get("events") or {}
    k = int(ev.get("n", 0))
    if k <= 0:
        return []
    rng = np.random.default_rng(50_021 + seed)
    sig, rad, strength = float(ev["sigma_t"]), float(ev["radius"]), float(ev["strength"])
    t0, t1 = float(t_save[0]), float(t_save[-1])
    a = t0 + float(ev.get("skip", 0.2)) * (t1 - t0)
    b = t0 + float(ev.get("end", 1.0)) * (t1 - t0)
    edges = np.linspace(a, b, k + 1)
    x = np.arange(n) * length / n
    out = []
    for j in range(k):
        lo, hi = edges[j], edges[j + 1]
        tc = lo + (0.2 + 0.6 * rng.random()) * (hi - lo)
        cx, cy = rng.random(2) * length
        dx = (x[:, None] - cx + length / 2) % length - length / 2
        dy = (x[None, :] - cy + length / 2) % length - length / 2
        blob = np.exp(-(dx**2 + dy**2) / (2 * rad**2))
        blob -= blob.mean()
        sign = 1.0 if rng.random() < 0.5 else -1.0
        # a pulse of peak rate A over a Gaussian of width sig injects A sqrt(2 pi) sig of vorticity
        amp = sign * strength * w_rms / (np.sqrt(2 * np.pi) * sig) / np.abs(blob).max()
        out.append((float(tc), sig, amp * blob))
    return out


def make_flow(p: dict, seed: int):
    """Solver, initial spectral state and save times for one seed's trajectory (with the config's
    ``events``: intermittent forcing pulses, ``event_schedule``)."""
    n, length = int(p["n"]), 2 * np.pi
    curl = kolmogorov_curl(n, length, int(p["k_f"]), float(p["forcing_amplitude"]))
    w0 = grf_periodic(np.random.default_rng(seed), 1, n, 2, alpha=4.0, tau=3.0, length=length)
    plain = Vorticity2D(n, length, float(p["nu"]), float(p["drag"]), curl)
    vel = plain.velocity(plain.to_hat(w0))
    w0 = w0 / np.sqrt(np.mean(np.sum(vel**2, -1)))
    t_save = float(p["t_start"]) + np.arange(int(p["n_frames"])) * float(p["dt_save"])
    events = event_schedule(p, seed, t_save, float(np.sqrt(np.mean(w0**2))), n, length)
    if not events:
        return plain, plain.to_hat(w0), t_save
    solver = PulsedVorticity2D(n, length, float(p["nu"]), float(p["drag"]), curl,
                               events=[(tc, sig, plain.to_hat(pat[None])) for tc, sig, pat in events])
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

    if hasattr(solver, "reset"):  # a pulsed solver's clock starts with the run
        solver.reset()
    t0 = time.perf_counter()
    march((w_hat0, None), t_save, solver.step, lambda st: solver.stable_dt(st[0], cfl, dt_max), record,
          recheck=0.5)
    run_insitu.cpu_s = time.process_time() - c0
    return time.perf_counter() - t0, spent[0]


def enstrophy(w: np.ndarray) -> np.ndarray:
    """Domain-mean enstrophy Z = 1/2 <w^2> of frames (..., x, y)."""
    return 0.5 * np.mean(np.asarray(w, dtype=np.float64) ** 2, axis=(-2, -1))
