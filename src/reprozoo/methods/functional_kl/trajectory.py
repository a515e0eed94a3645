"""Trajectory-inference methods: paths on a time grid from snapshot particles only.

Every method starts from the n particles observed at the first time and returns n paths on the
path grid ``grid`` (which contains the observed times and the held-out one). Between two
consecutive OBSERVED times t_k < t_{k+1} (the held-out time lies inside one such gap):

* ``true_sde``       oracle: simulate the true SDE from the first snapshot (the law the data came from).
* ``linear_interp``  independent (random) pairing of consecutive snapshots, straight lines in time.
* ``ot_linear``      exact optimal-transport pairing (POT's network simplex, squared Euclidean cost,
                     uniform weights: a permutation), straight lines in time = McCann interpolation.
* ``indep_bridge``   independent (random) pairing of consecutive snapshots, Brownian bridges of the SDE's
                     sigma in between: absolutely continuous like ``ot_bridge``, without the coupling.
* ``ot_bridge``      entropic OT pairing with eps = sigma^2 (t_{k+1} - t_k) (POT Sinkhorn on the cost
                     |x - y|^2 / 2): the static Schrodinger bridge w.r.t. Brownian motion of the SDE's
                     sigma; partners are drawn from the plan's rows, the grid times in between are
                     filled with Brownian bridges of the same sigma.
* ``flow_matching``  a small MLP velocity field v(x, t) (torch) trained by conditional flow matching
                     on pairs drawn from the full OT plans of consecutive snapshots (OT-CFM for
                     trajectory inference, Tong et al. 2024), integrated with RK4 (blocks/flows.ode_sample).

The couplings are chained: the partner at t_{k+1} of a particle's partner at t_k, so each path is
a Markov chain through the snapshots.
"""
from __future__ import annotations

import numpy as np


def _segments(grid: np.ndarray, observed: list[float]):
    """(t_k, t_{k+1}, grid indices strictly inside) for consecutive observed times."""
    for t0, t1 in zip(observed[:-1], observed[1:]):
        inside = [i for i, t in enumerate(grid) if t0 < t < t1]
        yield t0, t1, inside


def _index(grid: np.ndarray, t: float) -> int:
    k = int(np.argmin(np.abs(grid - t)))
    if not np.isclose(grid[k], t):
        raise ValueError(f"time {t} is not on the path grid {grid}")
    return k


def exact_ot_partner(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """partner[i] = index j of y that x_i is sent to by the exact OT plan (equal sizes: a permutation)."""
    import ot

    n = len(x)
    plan = ot.emd(np.full(n, 1 / n), np.full(len(y), 1 / len(y)), ot.dist(x, y), numItermax=10_000_000)
    return np.asarray(plan.argmax(axis=1))


def entropic_partner(x: np.ndarray, y: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """Partners drawn from the rows of the entropic OT plan (Sinkhorn, cost |x - y|^2 / 2, reg eps)."""
    import ot

    n, m = len(x), len(y)
    cost = 0.5 * ot.dist(x, y)
    # plain Sinkhorn (fast) unless exp(-cost/eps) would underflow; then the log-domain version
    method = "sinkhorn" if cost.max() / eps < 500 else "sinkhorn_log"
    plan = ot.sinkhorn(np.full(n, 1 / n), np.full(m, 1 / m), cost, eps, method=method,
                       numItermax=2000, stopThr=1e-8)
    rows = plan / plan.sum(axis=1, keepdims=True)
    u = rng.random(n)[:, None]
    return np.minimum((rows.cumsum(axis=1) < u).sum(axis=1), m - 1)


def coupled_paths(snaps: dict[float, np.ndarray], grid: np.ndarray, observed: list[float], kind: str,
                  sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Paths from chained pairwise couplings of snapshots; ``kind`` in
    linear_interp|ot_linear|indep_bridge|ot_bridge."""
    n = len(snaps[observed[0]])
    paths = np.zeros((n, len(grid), 2))
    cur = snaps[observed[0]]
    paths[:, _index(grid, observed[0])] = cur
    for t0, t1, inside in _segments(grid, observed):
        y = snaps[t1]
        if kind in ("linear_interp", "indep_bridge"):
            nxt = y[rng.permutation(len(y))[:n]]
        elif kind == "ot_linear":
            nxt = y[exact_ot_partner(cur, y)]
        elif kind == "ot_bridge":
            nxt = y[entropic_partner(cur, y, sigma**2 * (t1 - t0), rng)]
        else:
            raise ValueError(f"unknown coupling '{kind}'")
        if kind in ("ot_bridge", "indep_bridge"):  # Brownian bridge from (t0, cur) to (t1, nxt), sequentially
            x, tp = cur, t0
            for i in inside:
                t = grid[i]
                mean = x + (t - tp) / (t1 - tp) * (nxt - x)
                var = sigma**2 * (t - tp) * (t1 - t) / (t1 - tp)
                x, tp = mean + np.sqrt(var) * rng.standard_normal(x.shape), t
                paths[:, i] = x
        else:
            for i in inside:
                r = (grid[i] - t0) / (t1 - t0)
                paths[:, i] = (1 - r) * cur + r * nxt
        paths[:, _index(grid, t1)] = nxt
        cur = nxt
    return paths


# --- flow matching ---------------------------------------------------------------------------

def ot_pairs(snaps: dict[float, np.ndarray], observed: list[float]) -> list[tuple[float, float, np.ndarray, np.ndarray]]:
    """(t_k, t_{k+1}, x_k, its OT partner) for each consecutive pair of observed snapshots."""
    out = []
    for t0, t1 in zip(observed[:-1], observed[1:]):
        x, y = snaps[t0], snaps[t1]
        out.append((t0, t1, x, y[exact_ot_partner(x, y)]))
    return out


def train_flow_matching(pairs, cfg: dict, seed: int, progress=print):
    """OT-CFM: x_t = (1 - r) x_k + r x_{k+1}, r = (t - t_k)/(t_{k+1} - t_k), target (x_{k+1} - x_k)/dt.

    Segments are drawn in proportion to their duration (t uniform on the observed span). A held-out
    10 % of the pairs gives the validation loss (one fixed batch of 2048 interpolants). Training is
    the platform's shared rule, :func:`reprozoo.blocks.fitting.fit_to_plateau`, its keys in ``cfg``:
    every rate of ``lr_grid`` piloted for ``pilot_steps`` from the same initial weights, the rate with
    the best validation loss continued at that constant rate until the gate's plateau test holds at
    ``flat_tol`` (after ``min_steps``) or ``max_steps``; the best-validation weights are kept.
    Returns (net, record) with the record of fit_to_plateau (steps, vals, lrs, lr, stop, plateau, ...)."""
    import torch

    from ...blocks.fitting import fit_to_plateau

    gen = torch.Generator().manual_seed(seed)
    width, depth = int(cfg["width"]), int(cfg["depth"])

    def build(g):
        torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=g)))
        layers, d_in = [], 3
        for _ in range(depth):
            layers += [torch.nn.Linear(d_in, width), torch.nn.SiLU()]
            d_in = width
        return torch.nn.Sequential(*layers, torch.nn.Linear(d_in, 2))

    segs = []
    for t0, t1, x, y in pairs:
        n = len(x)
        perm = torch.randperm(n, generator=gen)
        n_val = max(1, n // 10)
        segs.append((t0, t1, torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32),
                     perm[n_val:], perm[:n_val]))
    durations = torch.tensor([s[1] - s[0] for s in segs])
    probs = durations / durations.sum()

    def batch(size, split, g):
        k = torch.multinomial(probs, size, replacement=True, generator=g)
        xs, ts, targets = [], [], []
        for j, (t0, t1, x, y, tr, va) in enumerate(segs):
            m = int((k == j).sum())
            if m == 0:
                continue
            pool = tr if split == "train" else va
            idx = pool[torch.randint(len(pool), (m,), generator=g)]
            r = torch.rand(m, 1, generator=g)
            xs.append((1 - r) * x[idx] + r * y[idx])
            ts.append(t0 + r * (t1 - t0))
            targets.append((y[idx] - x[idx]) / (t1 - t0))
        return torch.cat(xs), torch.cat(ts), torch.cat(targets)

    def cfm_loss(net, xb, tb, vb):
        return ((net(torch.cat([xb, tb], 1)) - vb) ** 2).sum(1).mean()

    val_batch = batch(2048, "val", gen)
    size = int(cfg["batch"])

    def train_loss(net, g):
        return cfm_loss(net, *batch(size, "train", g))

    def val_loss(net):
        with torch.no_grad():
            return float(cfm_loss(net, *val_batch))

    return fit_to_plateau(build, train_loss, val_loss, cfg, seed, label="flow matching", progress=progress)


def plateau(steps, vals, tol: float, tail: float = 0.3, min_points: int = 5) -> bool:
    """Is a loss curve flat? A Theil-Sen line through its last ``tail`` of steps (at least
    ``min_points`` evaluations) improves over that stretch by at most ``tol`` of its median there:
    the convergence gate's own test, :func:`reprozoo.claims.plateau`."""
    from ...claims import plateau as gate_plateau

    return gate_plateau(steps, vals, tol, tail=tail, min_points=min_points)


def flow_matching_paths(net, x0: np.ndarray, grid: np.ndarray, steps_per_interval: int) -> np.ndarray:
    """Integrate dx/dt = v(x, t) through the grid with RK4 (blocks/flows.ode_sample)."""
    import torch

    from ...blocks.flows import ode_sample

    def velocity(x, t):
        return net(torch.cat([x, torch.full((len(x), 1), float(t))], 1))

    x = torch.as_tensor(x0, dtype=torch.float32)
    out = [x.numpy().copy()]
    for t0, t1 in zip(grid[:-1], grid[1:]):
        x = ode_sample(velocity, x, float(t0), float(t1), steps_per_interval, scheme="rk4")
        out.append(x.numpy().copy())
    return np.stack(out, axis=1).astype(np.float64)
