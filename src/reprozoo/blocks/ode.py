"""Explicit Runge-Kutta schemes and the algebraically reversible wrapper built on them.

Shared by every method that integrates ODEs/SDEs (Rex, Hamiltonian and neural-ODE models).
Arrays may be numpy or torch: only +, * and the user's vector field are used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

VectorField = Callable[[object, float], object]  # f(y, t)


@dataclass(frozen=True)
class Tableau:
    name: str
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    c: tuple[float, ...]
    order: int

    @property
    def stages(self) -> int:
        return len(self.b)


EULER = Tableau("euler", ((),), (1.0,), (0.0,), 1)
MIDPOINT = Tableau("midpoint", ((), (0.5,)), (0.0, 1.0), (0.0, 0.5), 2)
HEUN = Tableau("heun", ((), (1.0,)), (0.5, 0.5), (0.0, 1.0), 2)
RK3 = Tableau("rk3", ((), (0.5,), (-1.0, 2.0)), (1 / 6, 2 / 3, 1 / 6), (0.0, 0.5, 1.0), 3)
RK4 = Tableau("rk4", ((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), (1 / 6, 1 / 3, 1 / 3, 1 / 6),
              (0.0, 0.5, 0.5, 1.0), 4)
TABLEAUS = {t.name: t for t in (EULER, MIDPOINT, HEUN, RK3, RK4)}


def rk_increment(f: VectorField, y, t: float, h: float, tab: Tableau):
    """Phi(y, t, h) = y_next - y for one explicit RK step."""
    ks = []
    for i in range(tab.stages):
        yi = y
        for aij, kj in zip(tab.a[i], ks):
            if aij:
                yi = yi + (h * aij) * kj
        ks.append(f(yi, t + tab.c[i] * h))
    inc = 0
    for bi, ki in zip(tab.b, ks):
        if bi:
            inc = inc + (h * bi) * ki
    return inc


def rk_solve(f: VectorField, y0, ts: Sequence[float], tab: Tableau):
    y = y0
    for t0, t1 in zip(ts[:-1], ts[1:]):
        y = y + rk_increment(f, y, t0, t1 - t0, tab)
    return y


Increment = Callable[[object, float, float, object], object]  # Phi(y, t, h, dW)


class Reversible:
    """McCallum-Foster algebraically reversible scheme around any increment Phi.

    State (y, z); one step t_n -> t_{n+1} = t_n + h with coupling zeta in (0, 1]:
        y' = zeta*y + (1 - zeta)*z + Phi(z, t_n, h, dW)
        z' = z - Phi(y', t_{n+1}, -h, -dW)
    and its exact algebraic inverse. zeta < 1 gives a non-zero linear stability region; the
    inverse divides by zeta, so zeta close to 1 keeps round-off growth bounded. Passing the same
    Brownian increments dW to forward and inverse makes the stochastic version exactly invertible.
    """

    def __init__(self, phi: Increment, zeta: float = 0.999):
        if not 0.0 < zeta <= 1.0:
            raise ValueError(f"zeta must lie in (0, 1], got {zeta}")
        self.phi, self.zeta = phi, zeta

    def step(self, y, z, t: float, h: float, dw=None):
        y1 = self.zeta * y + (1 - self.zeta) * z + self.phi(z, t, h, dw)
        z1 = z - self.phi(y1, t + h, -h, None if dw is None else -dw)
        return y1, z1

    def unstep(self, y1, z1, t: float, h: float, dw=None):
        """Invert :meth:`step` taken from time t with step h."""
        z = z1 + self.phi(y1, t + h, -h, None if dw is None else -dw)
        y = (y1 - (1 - self.zeta) * z - self.phi(z, t, h, dw)) / self.zeta
        return y, z

    def solve(self, y, z, ts: Sequence[float], dws=None):
        for n, (t0, t1) in enumerate(zip(ts[:-1], ts[1:])):
            y, z = self.step(y, z, t0, t1 - t0, None if dws is None else dws[n])
        return y, z

    def invert(self, y, z, ts: Sequence[float], dws=None):
        """From the state at ts[-1] back to the state at ts[0]."""
        for n in range(len(ts) - 2, -1, -1):
            y, z = self.unstep(y, z, ts[n], ts[n + 1] - ts[n], None if dws is None else dws[n])
        return y, z


def ode_increment(f: VectorField, tab: Tableau) -> Increment:
    return lambda y, t, h, dw=None: rk_increment(f, y, t, h, tab)


def linear_step_matrix(step: Callable, dim_state: int, z: complex) -> np.ndarray:
    """Matrix of a linear one-step map on the test equation y' = lambda*y with lambda*h = z."""
    cols = []
    for i in range(dim_state):
        e = np.zeros(dim_state, dtype=complex)
        e[i] = 1.0
        cols.append(np.asarray(step(e, z), dtype=complex))
    return np.stack(cols, axis=1)


def stability_interval(step: Callable, dim_state: int, r_max: float = 10.0, n: int = 400) -> float:
    """Length r of the real interval (-r, 0) on which the step map is strictly contracting.

    Scanned on a log grid from 1e-8 to r_max; 0 means no such interval (e.g. symmetric schemes such
    as reversible Heun, whose step maps have unit spectral radius).
    """
    best = 0.0
    for r in np.logspace(-8, np.log10(r_max), n):
        rho = max(abs(np.linalg.eigvals(linear_step_matrix(step, dim_state, -r))))
        if rho < 1 - 1e-12:
            best = r
        else:
            break
    return float(best)
