"""Two-class Gaussian mixture x = y mu/sqrt(d) + z, z ~ N(0, I_d), ||mu||^2/d = r^2.

Ridge and logistic ERM with an isotropic penalty are rotation-equivariant and the noise is
isotropic, so mu = r sqrt(d) e_1 loses no generality and makes overlaps exact: m = r w_1/sqrt(d).
"""
from __future__ import annotations

import numpy as np


def sample(n: int, d: int, r: float, rng: np.random.Generator):
    y = rng.choice([-1.0, 1.0], size=n)
    X = rng.standard_normal((n, d))
    X[:, 0] += y * r
    return X, y
