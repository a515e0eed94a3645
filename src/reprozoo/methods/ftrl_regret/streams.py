"""Online regression streams whose comparator drifts with an exactly controlled path length.

The comparator u_t is piecewise constant on a sphere of radius ``radius`` in R^d: S switches at
evenly spaced rounds, each a rotation of u by the angle whose chord is ``jump`` (so every switch
adds exactly ``jump`` to the path length P_T = sum_t ||u_t - u_{t-1}||, and P_T = S * jump);
``jump = 2 radius`` is an antipodal flip u -> -u (the smoke logistic T sweep: one flip of 4).
Switching comparators are the construction of the general-convex sqrt(T (1 + P_T)) lower bound;
for the curved (exp-concave) losses here they are a convenient drift model, not a proven worst
case. A learner with one fixed discount pays ~ 1/(1-beta) after each switch and ~ (1-beta) per
round for forgetting, which is the trade-off the discounted-to-dynamic reduction balances.

Features x_t are uniform on the unit sphere (||x_t|| = 1, E[x x^T] = I/d).
linear:   y_t = <u_t, x_t> + sigma * eps_t,              loss 1/2 (y - <w, x>)^2
logistic: y_t in {-1, +1}, P(y_t = 1) = sigmoid(<u_t, x_t>), loss log(1 + exp(-y <w, x>))
"""
from __future__ import annotations

import numpy as np


def switching_path(T: int, d: int, path_length: float, radius: float, jump: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Comparators u_1..u_T (shape (T, d)), ||u_t|| = radius, path length exactly path_length."""
    if jump > 2 * radius:
        raise ValueError(f"a chord of {jump} does not fit on a sphere of radius {radius}")
    n_switch = int(round(path_length / jump))
    theta = 2.0 * np.arcsin(jump / (2.0 * radius))  # chord 2 r sin(theta/2) = jump
    u = rng.standard_normal(d)
    u *= radius / np.linalg.norm(u)
    us = np.empty((T, d))
    switches = sorted(set(int(s) for s in np.linspace(0, T, n_switch + 2)[1:-1].round()) - {0})
    start = 0
    for sw in switches + [T]:
        us[start:sw] = u
        if sw < T:
            v = rng.standard_normal(d)
            v -= (v @ u) / radius**2 * u
            v *= radius / np.linalg.norm(v)
            u = np.cos(theta) * u + np.sin(theta) * v
        start = sw
    return us


def path_length(us: np.ndarray) -> float:
    return float(np.linalg.norm(np.diff(us, axis=0), axis=1).sum())


def unit_features(T: int, d: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((T, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_stream(task: str, T: int, d: int, P: float, cfg: dict, rng: np.random.Generator) -> dict:
    """One stream: features, labels and the planted comparator sequence."""
    us = switching_path(T, d, P, cfg["radius"], cfg["jump"], rng)
    x = unit_features(T, d, rng)
    z = np.einsum("td,td->t", x, us)
    if task == "linear":
        y = z + cfg["noise"] * rng.standard_normal(T)
    elif task == "logistic":
        y = np.where(rng.random(T) < 1.0 / (1.0 + np.exp(-z)), 1.0, -1.0)
    else:
        raise ValueError(f"unknown task '{task}' (linear, logistic)")
    return {"x": x, "y": y, "u": us}
