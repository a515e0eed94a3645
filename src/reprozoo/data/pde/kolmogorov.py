"""2-D Kolmogorov flow: pseudo-spectral vorticity solver on the periodic square.

    d_t w + u . grad w = nu Lap w - alpha w + curl f,     u = (d_y psi, -d_x psi),  -Lap psi = w

with the Kolmogorov forcing f = (A sin(k_f y), 0), i.e. curl f = -A k_f cos(k_f y). Nonlinear
products are dealiased with the 2/3 rule (the state is kept band-limited, so the truncated system
conserves energy and enstrophy exactly in the nonlinear term) and time is advanced with the
integrating-factor (Lawson) RK4 scheme: the linear viscous/drag part is integrated exactly.

Energy budget (E = 1/2 <|u|^2>, <.> = domain mean) for this truncated system:

    dE/dt = <u . f> - nu <w^2> - alpha <|u|^2>          (injection - viscous dissipation - drag)

which ``energy_budget`` evaluates from saved fields and the tests check against dE/dt.
The same solver (with an arbitrary forcing field and an optional passive scalar) produces the
offline stand-in for PDEBench's 2-D incompressible Navier-Stokes files (``pdebench``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .common import (copy_processed, dealias_mask, march, file_sizes, grf_periodic, plt_agg, read_h5, wavenumbers,
                     write_h5)
from reprozoo.figures import save_figure


class Vorticity2D:
    """Batched 2-D periodic vorticity solver, arrays (batch, x, y), rfft over (x, y)."""

    def __init__(self, n: int, length: float = 2 * np.pi, nu: float = 1e-3, drag: float = 0.0,
                 curl_forcing: np.ndarray | None = None, scalar_diffusivity: float | None = None,
                 scalar_force: np.ndarray | None = None):
        self.n, self.length, self.nu, self.drag = n, float(length), float(nu), float(drag)
        kx = wavenumbers(n, length)
        ky = wavenumbers(n, length, real=True)
        self.kx, self.ky = np.meshgrid(kx, ky, indexing="ij")
        self.k2 = self.kx**2 + self.ky**2
        self.k2inv = np.where(self.k2 > 0, 1.0 / np.where(self.k2 > 0, self.k2, 1.0), 0.0)
        self.mask = dealias_mask(n, real_last=True, ndim=2)
        self.lin = -self.nu * self.k2 - self.drag
        self.kappa = scalar_diffusivity
        self.lin_c = None if scalar_diffusivity is None else -float(scalar_diffusivity) * self.k2
        self.f_hat = None
        if curl_forcing is not None:
            self.f_hat = self.mask * np.fft.rfft2(np.asarray(curl_forcing, dtype=np.float64), axes=(-2, -1))
        # body force proportional to the passive scalar, c * F (batch, x, y, 2), as in PDEBench's NS runs
        self.scalar_force = None if scalar_force is None else np.asarray(scalar_force, dtype=np.float64)
        self.x = np.arange(n) * self.length / n

    # transforms
    def to_hat(self, w: np.ndarray) -> np.ndarray:
        return self.mask * np.fft.rfft2(w, axes=(-2, -1))

    def to_grid(self, w_hat: np.ndarray) -> np.ndarray:
        return np.fft.irfft2(w_hat, s=(self.n, self.n), axes=(-2, -1))

    def velocity_hat(self, w_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        psi = w_hat * self.k2inv
        return 1j * self.ky * psi, -1j * self.kx * psi

    def velocity(self, w_hat: np.ndarray) -> np.ndarray:
        u_hat, v_hat = self.velocity_hat(w_hat)
        return np.stack([self.to_grid(u_hat), self.to_grid(v_hat)], axis=-1)

    def _advect(self, q_hat, u, v):
        qx = self.to_grid(1j * self.kx * q_hat)
        qy = self.to_grid(1j * self.ky * q_hat)
        return -(self.mask * np.fft.rfft2(u * qx + v * qy, axes=(-2, -1)))

    def rhs(self, state):
        """Nonlinear + forcing part of the right-hand side (the linear part is in the integrating factor)."""
        w_hat, c_hat = state
        u_hat, v_hat = self.velocity_hat(w_hat)
        u, v = self.to_grid(u_hat), self.to_grid(v_hat)
        nw = self._advect(w_hat, u, v)
        if self.f_hat is not None:
            nw = nw + self.f_hat
        nc = None
        if c_hat is not None:
            nc = self._advect(c_hat, u, v)
            if self.scalar_force is not None:
                c = self.to_grid(c_hat)
                fx = np.fft.rfft2(c * self.scalar_force[..., 0], axes=(-2, -1))
                fy = np.fft.rfft2(c * self.scalar_force[..., 1], axes=(-2, -1))
                nw = nw + self.mask * (1j * self.kx * fy - 1j * self.ky * fx)
        return nw, nc

    def step(self, state, dt: float):
        """One Lawson (integrating-factor) RK4 step."""
        e2w, ew = np.exp(self.lin * dt / 2), np.exp(self.lin * dt)
        has_c = state[1] is not None
        e2c = np.exp(self.lin_c * dt / 2) if has_c else None
        ec = np.exp(self.lin_c * dt) if has_c else None

        def comb(a, b, fa, fb, h):  # fa * a + h * fb * b, on both components
            w = fa[0] * a[0] + h * (fb[0] * b[0] if fb[0] is not None else b[0])
            c = None if not has_c else fa[1] * a[1] + h * (fb[1] * b[1] if fb[1] is not None else b[1])
            return w, c

        one = (None, None)
        half = (e2w, e2c)
        full = (ew, ec)
        k1 = self.rhs(state)
        k2 = self.rhs(comb(state, k1, half, half, dt / 2))
        k3 = self.rhs(comb(state, k2, half, one, dt / 2))
        k4 = self.rhs(comb(state, k3, full, half, dt))
        w = ew * state[0] + dt / 6 * (ew * k1[0] + 2 * e2w * (k2[0] + k3[0]) + k4[0])
        c = None
        if has_c:
            c = ec * state[1] + dt / 6 * (ec * k1[1] + 2 * e2c * (k2[1] + k3[1]) + k4[1])
        return w, c

    def stable_dt(self, w_hat: np.ndarray, cfl: float, dt_max: float) -> float:
        u_hat, v_hat = self.velocity_hat(w_hat)
        umax = max(np.abs(self.to_grid(u_hat)).max(), np.abs(self.to_grid(v_hat)).max(), 1e-12)
        return min(dt_max, cfl * (self.length / self.n) / umax)

    def run(self, w0: np.ndarray, t_save: np.ndarray, c0: np.ndarray | None = None, cfl: float = 0.5,
            dt_max: float = 0.05, progress=None, recheck: float = 0.5):
        """Integrate from t=0 and return (w, c) at the times ``t_save`` (grid values, float64).

        Inside each save interval (or each ``recheck`` piece of a longer one) the step is the CFL step
        at the piece's start, shrunk so that a whole number of steps lands exactly on the save time
        (deterministic for given inputs).
        """
        w_hat = self.to_hat(w0)
        c_hat = None if c0 is None else self.to_hat(c0)
        out_w = np.empty((w0.shape[0], len(t_save), self.n, self.n))
        out_c = None if c0 is None else np.empty_like(out_w)

        def record(i, state):
            out_w[:, i] = self.to_grid(state[0])
            if state[1] is not None:
                out_c[:, i] = self.to_grid(state[1])
            if progress and (i % max(1, len(t_save) // 5) == 0):
                progress(f"t={t_save[i]:.3f}")

        def check(ts, state):
            if not np.all(np.isfinite(state[0])):
                raise FloatingPointError(f"vorticity solver blew up before t={ts}")

        _, steps = march((w_hat, c_hat), t_save, self.step, lambda st: self.stable_dt(st[0], cfl, dt_max),
                         record, recheck=recheck, check=check)
        self.steps = steps
        return out_w, out_c


def kolmogorov_curl(n: int, length: float, k_f: int, amplitude: float) -> np.ndarray:
    y = np.arange(n) * length / n
    return np.broadcast_to(-amplitude * k_f * np.cos(k_f * 2 * np.pi / length * y)[None, :], (n, n)).copy()


def energy_budget(w: np.ndarray, vel: np.ndarray, y: np.ndarray, nu: float, drag: float, k_f: int,
                  amplitude: float, length: float) -> dict[str, np.ndarray]:
    """Domain-mean energy, injection, viscous dissipation and drag loss of fields (..., x, y)."""
    u, v = vel[..., 0].astype(np.float64), vel[..., 1].astype(np.float64)
    w = w.astype(np.float64)
    forcing = amplitude * np.sin(k_f * 2 * np.pi / length * y)
    energy = 0.5 * np.mean(u**2 + v**2, axis=(-2, -1))
    injection = np.mean(u * forcing, axis=(-2, -1))
    dissipation = nu * np.mean(w**2, axis=(-2, -1))
    drag_loss = drag * np.mean(u**2 + v**2, axis=(-2, -1))
    return {"energy": energy, "injection": injection, "dissipation": dissipation, "drag_loss": drag_loss}


def simulate(params: dict, seed: int, progress=print) -> dict:
    """Run the batch of trajectories described by ``params``; float64 arrays."""
    n, length = int(params["n"]), float(params.get("length", 2 * np.pi))
    nu, drag = float(params["nu"]), float(params.get("drag", 0.1))
    k_f, amp = int(params.get("k_f", 4)), float(params.get("forcing_amplitude", 1.0))
    n_traj = int(params["n_traj"])
    rng = np.random.default_rng(seed)
    w0 = grf_periodic(rng, n_traj, n, 2, alpha=float(params.get("ic_alpha", 4.0)),
                      tau=float(params.get("ic_tau", 3.0)), length=length)
    solver = Vorticity2D(n, length, nu, drag, kolmogorov_curl(n, length, k_f, amp))
    # scale the initial vorticity to the requested rms velocity
    vel0 = solver.velocity(solver.to_hat(w0))
    urms = np.sqrt(np.mean(np.sum(vel0**2, -1), axis=(1, 2)))
    w0 = w0 * (float(params.get("ic_velocity_rms", 1.0)) / urms)[:, None, None]
    t_burn, t_end, dt_save = float(params.get("t_burn", 0.0)), float(params["t_end"]), float(params["dt_save"])
    n_save = int(round(t_end / dt_save)) + 1
    t_rel = np.arange(n_save) * dt_save
    t_all = (t_burn + t_rel) if t_burn > 0 else t_rel
    w, _ = solver.run(w0, t_all, cfl=float(params.get("cfl", 0.5)), dt_max=float(params.get("dt_max", 0.05)),
                      progress=progress)
    vel = solver.velocity(solver.to_hat(w.reshape(-1, n, n))).reshape(w.shape + (2,))
    return {"vorticity": w, "velocity": vel, "t": t_all, "x": solver.x, "y": solver.x, "steps": solver.steps,
            "attrs": {"nu": nu, "drag": drag, "forcing_k": k_f, "forcing_amplitude": amp, "length": length,
                      "n": n, "t_burn": t_burn, "dt_save": dt_save}}


# --- dataset hooks -----------------------------------------------------------------------------

RAW = "kolmogorov2d_raw.h5"
OUT = "kolmogorov2d.h5"


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    sim = simulate(params, seed)
    a = sim["attrs"]
    write_h5(Path(raw_dir) / RAW,
             {"vorticity": (sim["vorticity"], "traj,time,x,y"),
              "velocity": (sim["velocity"], "traj,time,x,y,component")},
             {"x": sim["x"], "y": sim["y"], "t": sim["t"]},
             {"equation": "d_t w + u.grad w = nu Lap w - drag w - A k_f cos(k_f y); u = (d_y psi, -d_x psi), "
                          "-Lap psi = w (Kolmogorov forcing f = (A sin(k_f y), 0))",
              "domain": f"[0, {a['length']:.6g})^2 periodic", "grid": "uniform, x_i = i L / n",
              "time": "t = t_burn + k dt_save (t is absolute solver time)",
              "solver": "pseudo-spectral, 2/3 dealiasing, integrating-factor RK4, CFL-limited step",
              "seed": seed, **a, "total_steps": sim["steps"]},
             diagnostics=energy_budget(sim["vorticity"], sim["velocity"], sim["y"], a["nu"], a["drag"],
                                       a["forcing_k"], a["forcing_amplitude"], a["length"]))
    return {"version": "solver-1", "generator": "reprozoo.data.pde.kolmogorov.simulate", "solver_steps": sim["steps"]}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    d = copy_processed(Path(raw_dir) / RAW, Path(out_dir) / OUT)
    return {"files": [OUT], "sizes": {"n_traj": d.fields["vorticity"].shape[0], **file_sizes(d)},
            "grid": {"n": d.attrs["n"], "length": d.attrs["length"], "dims": "traj,time,x,y"},
            "time": {"t0": float(d.coords["t"][0]), "t1": float(d.coords["t"][-1]), "dt_save": d.attrs["dt_save"],
                     "n_t": len(d.coords["t"])}}


def preview(out_dir: Path, png: Path) -> None:
    plt = plt_agg()
    d = read_h5(Path(out_dir) / OUT, fields=["vorticity"])
    w = d.fields["vorticity"]
    nt = w.shape[1]
    picks = sorted({0, nt // 3, 2 * nt // 3, nt - 1})
    fig, axes = plt.subplots(1, len(picks) + 1, figsize=(3.2 * (len(picks) + 1), 3))
    vmax = np.abs(w[0]).max()
    for ax, i in zip(axes, picks):
        ax.imshow(w[0, i].T, origin="lower", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_title(f"traj 0, t={d.coords['t'][i]:.2f}")
        ax.set_xticks([]), ax.set_yticks([])
    diag = d.diagnostics
    for j in range(min(4, w.shape[0])):
        axes[-1].plot(d.coords["t"], diag["energy"][j], lw=1)
    axes[-1].set_title("energy per trajectory")
    axes[-1].set_xlabel("t")
    fig.suptitle(f"Kolmogorov flow vorticity, n={d.attrs['n']}, nu={d.attrs['nu']}, k_f={d.attrs['forcing_k']}")
    save_figure(fig, png, dpi=90)


def load(out_dir: Path):
    """PDEData with fields vorticity (traj,time,x,y) and velocity (traj,time,x,y,2)."""
    return read_h5(Path(out_dir) / OUT)
