"""The Nguyen benchmarks (Uy et al., Genet. Program. Evolvable Mach. 2011), as used by DSR.

Each task: a target expression in x, the sampling domain and the number of training points
(20 points drawn uniformly, DSR's protocol). The data of a task is drawn from the seed, so every
variant of a seed sees the same 20 points. ``min_depth`` is the SPBT depth (edges) of our shortest
construction of the target in the Koza library {+, -, *, /, sin, cos, exp, log, x} without
constants (1 = x/x, 2 = x/x + x/x), e.g. Nguyen-4 = (x^3 + x^2 + x)(x^3 + x/x) at depth 4 and
Nguyen-8 = exp(log(x) / (x/x + x/x)) at depth 4; a scaffold must be at least that deep.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Task:
    name: str
    truth: str            # sympy-parsable, variable x
    domain: tuple[float, float]
    n_points: int
    min_depth: int

    def target(self, x: np.ndarray) -> np.ndarray:
        import sympy as sp

        xs = sp.Symbol("x")
        return np.asarray(sp.lambdify(xs, sp.sympify(self.truth, locals={"x": xs}), "numpy")(x), dtype=float)

    def data(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(self.domain[0], self.domain[1], self.n_points)
        return x, self.target(x)


NGUYEN = {
    # name: target, domain (U[a, b], 20 points), depth of our shortest construction (tests check them)
    "nguyen1": Task("nguyen1", "x**3 + x**2 + x", (-1.0, 1.0), 20, 3),
    "nguyen2": Task("nguyen2", "x**4 + x**3 + x**2 + x", (-1.0, 1.0), 20, 4),
    "nguyen3": Task("nguyen3", "x**5 + x**4 + x**3 + x**2 + x", (-1.0, 1.0), 20, 5),
    "nguyen4": Task("nguyen4", "x**6 + x**5 + x**4 + x**3 + x**2 + x", (-1.0, 1.0), 20, 4),
    "nguyen5": Task("nguyen5", "sin(x**2)*cos(x) - 1", (-1.0, 1.0), 20, 4),
    "nguyen6": Task("nguyen6", "sin(x) + sin(x + x**2)", (-1.0, 1.0), 20, 4),
    "nguyen7": Task("nguyen7", "log(x + 1) + log(x**2 + 1)", (0.0, 2.0), 20, 4),
    "nguyen8": Task("nguyen8", "sqrt(x)", (0.0, 4.0), 20, 4),
}


def task_data(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training points of task ``name`` for ``seed`` (identical for every variant)."""
    idx = list(NGUYEN).index(name)
    return NGUYEN[name].data(np.random.default_rng([seed, 7919, idx]))
