"""The bifurcating 2-D SDE whose snapshots the trajectory-inference methods see.

    dX = a ((t - t_b) X - X^3 / w^2) dt + sigma dW_1     (a pitchfork that opens at t = t_b)
    dY = v dt + sigma dW_2                             (steady progress along a "pseudotime" axis)

X_0 ~ N(0, s0^2), Y_0 ~ N(0, s0^2). Before t_b the branch coordinate X is pulled to 0; after t_b
the origin turns unstable and paths commit to X ~ +-w sqrt(t - t_b) (a "Y" in the plane), the
commitment being decided by the noise during (t_b, ~t_b + 0.3). Units: time in [0, 1], positions
dimensionless. Simulated by Euler-Maruyama on a fine step (``dt``), recorded on the path grid.

Snapshots: at each observed time an INDEPENDENT set of particles (destructive measurement), so no
path is ever observed; the held-out time is observed by nobody and scored by W1 afterwards.

Non-Gaussian benchmark laws with a known KL (:func:`euler_chain`, :func:`chain_kl`): the same drift
(with an optional constant ``tilt`` on X) taken as an Euler-Maruyama chain with ONE step per interval
of the path grid, x_{k+1} = x_k + h b(x_k, t_k) + sigma sqrt(h) xi_k. The chain is the law the
estimator sees (no sub-grid dynamics is lost), its transitions are Gaussian with the same covariance
sigma^2 h I under P and Q, so the discrete Girsanov identity is exact::

    KL(P || Q) = E_P sum_k h |b_P(x_k, t_k) - b_Q(x_k, t_k)|^2 / (2 sigma^2),

a Monte-Carlo average over P's chains (a closed form for a constant tilt: tilt^2 T / (2 sigma^2)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BifurcatingSDE:
    a: float = 20.0
    t_b: float = 0.2
    w: float = 1.0
    v: float = 1.0
    sigma: float = 0.3
    s0: float = 0.1
    dt: float = 1.0 / 400
    tilt: float = 0.0  # constant drift added to X (0 in the trajectory-inference SDE)

    def drift(self, x: np.ndarray, t: float) -> np.ndarray:
        b = np.empty_like(x)
        b[:, 0] = self.a * ((t - self.t_b) * x[:, 0] - x[:, 0] ** 3 / self.w**2) + self.tilt
        b[:, 1] = self.v
        return b

    def initial(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.s0 * rng.standard_normal((n, 2))

    def simulate(self, x0: np.ndarray, ts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Paths (n, len(ts), 2) on the grid ts (ts[0] is the time of x0)."""
        x, t, out = x0.copy(), float(ts[0]), [x0.copy()]
        for t_next in ts[1:]:
            k = max(1, int(round((t_next - t) / self.dt)))
            h = (t_next - t) / k
            for _ in range(k):
                x = x + self.drift(x, t) * h + self.sigma * np.sqrt(h) * rng.standard_normal(x.shape)
                t += h
            t = float(t_next)
            out.append(x.copy())
        return np.stack(out, axis=1)

    def snapshots(self, times, n: int, rng: np.random.Generator) -> dict[float, np.ndarray]:
        """n independent particles at each time (each from its own path: no correspondence)."""
        times = np.asarray(sorted(times), float)
        paths = self.simulate(self.initial(n * len(times), rng), np.concatenate([[0.0], times])
                              if times[0] > 0 else times, rng)
        if times[0] > 0:
            paths = paths[:, 1:]
        return {float(t): paths[k * n:(k + 1) * n, k] for k, t in enumerate(times)}


def euler_chain(sde: BifurcatingSDE, ts: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n Euler-Maruyama chains (n, len(ts), 2) with one step per grid interval, from the initial law."""
    x = sde.initial(n, rng)
    out = [x]
    for t, t_next in zip(ts[:-1], ts[1:]):
        h = float(t_next - t)
        x = x + sde.drift(x, float(t)) * h + sde.sigma * np.sqrt(h) * rng.standard_normal(x.shape)
        out.append(x)
    return np.stack(out, axis=1)


def chain_kl(P: BifurcatingSDE, Q: BifurcatingSDE, ts: np.ndarray, n: int, rng: np.random.Generator,
             batch: int = 50_000) -> tuple[float, float]:
    """KL(P || Q) of the two Euler chains on ts (same sigma and initial law): Monte-Carlo mean over n
    chains of P of sum_k h |b_P - b_Q|^2 / (2 sigma^2), and its standard error."""
    if not (np.isclose(P.sigma, Q.sigma) and np.isclose(P.s0, Q.s0)):
        raise ValueError("chain_kl needs the same sigma and initial law for P and Q")
    v = np.concatenate([girsanov_terms(P, Q, ts, euler_chain(P, ts, min(batch, n - start), rng))
                        for start in range(0, n, batch)])
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v)))


def girsanov_terms(P: BifurcatingSDE, Q: BifurcatingSDE, ts: np.ndarray, paths: np.ndarray) -> np.ndarray:
    """Per chain of P (paths (n, len(ts), 2)): sum_k h |b_P - b_Q|^2 / (2 sigma^2); their mean over
    P's chains is KL(P || Q). On the chains an estimator sees, the mean is the sampling floor: the
    KL that an oracle knowing both drifts would report from those chains of P."""
    tot = np.zeros(len(paths))
    for k, (t, t_next) in enumerate(zip(ts[:-1], ts[1:])):
        db = P.drift(paths[:, k], float(t)) - Q.drift(paths[:, k], float(t))
        tot += (t_next - t) * np.sum(db**2, axis=1) / (2.0 * P.sigma**2)
    return tot
