"""Exact game solvers: the persuasion LP, concavification, receiver best responses, meta-games.

Notation. pi[s, a] = P(recommend a | state s) (rows sum to one); the joint is
J[s, a] = mu0[s] pi[s, a]. With an obedient receiver the sender gets U_s(pi) = sum J * u_s.
The receiver's gain from a deviation rule phi: A -> A (do phi(a) when told a) is
    D(pi, phi) = sum_{s,a} J[s, a] (u_r[s, phi(a)] - u_r[s, a]),
and pi is *obedient* iff max_phi D(pi, phi) = 0, i.e. the linear constraints
    sum_s mu0[s] pi[s, a] (u_r[s, a'] - u_r[s, a]) <= 0    for all a, a'.            (obedience)
Optimal persuasion = max_pi U_s(pi) s.t. obedience (an LP, Dughmi & Xu 2016).

Mediator-augmented game (Zhang & Sandholm 2022; Zhang, Farina & Sandholm 2023): the same optimum is
the value of the zero-sum game  max_pi min_phi L(pi, phi),  L = U_s(pi) - lam * D(pi, phi), for a
penalty lam above the LP's multipliers (exact penalty). L is linear in pi and in a mixture over phi,
so PSRO on populations of schemes and deviation rules has a matrix meta-game solved by one LP.
"""
from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import linprog

from .games import BPGame

TIE_TOL = 1e-6  # receiver follows a recommendation that is within this of its best (sender-preferred ties)


def lp_optimum(game: BPGame) -> tuple[float, np.ndarray]:
    """Sender-optimal obedient scheme by linear programming over pi (HiGHS)."""
    mu0, us, ur = game.mu0, game.us, game.ur
    n_s, n_a = us.shape
    c = -(mu0[:, None] * us).ravel()
    rows = []
    for a, b in itertools.permutations(range(n_a), 2):
        row = np.zeros((n_s, n_a))
        row[:, a] = mu0 * (ur[:, b] - ur[:, a])
        rows.append(row.ravel())
    a_eq = np.zeros((n_s, n_s * n_a))
    for s in range(n_s):
        a_eq[s, s * n_a:(s + 1) * n_a] = 1.0
    res = linprog(c, A_ub=np.array(rows), b_ub=np.zeros(len(rows)), A_eq=a_eq, b_eq=np.ones(n_s),
                  bounds=(0, 1), method="highs")
    if res.status != 0:
        raise RuntimeError(f"persuasion LP of {game.name} failed: {res.message}")
    return -res.fun, res.x.reshape(n_s, n_a)


def receiver_best_action(game: BPGame, belief: np.ndarray, preferred: int | None = None) -> int:
    """Receiver's expected-utility maximiser at a belief; ties (TIE_TOL) go to ``preferred``."""
    eu = belief @ game.ur
    if preferred is not None and eu[preferred] >= eu.max() - TIE_TOL:
        return preferred
    return int(np.argmax(eu))


def sender_value_at(game: BPGame, belief: np.ndarray) -> float:
    """v(mu): sender's utility when the receiver acts on belief mu, ties broken for the sender."""
    eu = belief @ game.ur
    best = np.flatnonzero(eu >= eu.max() - TIE_TOL)
    return float(max(belief @ game.us[:, a] for a in best))


def concavify_binary(game: BPGame) -> float:
    """Concave envelope of v(p) at the prior, p = P(first state): Kamenica & Gentzkow's value.

    v is piecewise constant with jumps only where the receiver is indifferent between two
    actions, so the envelope is attained on {0, 1, indifference points}; we take the best chord
    through the prior among those points (and v(prior) itself).
    """
    if len(game.states) != 2:
        raise ValueError("concavify_binary needs a two-state game")
    ur = game.ur
    pts = {0.0, 1.0}
    for a, b in itertools.combinations(range(ur.shape[1]), 2):
        # p ur[0,a] + (1-p) ur[1,a] = p ur[0,b] + (1-p) ur[1,b]
        d0, d1 = ur[0, a] - ur[0, b], ur[1, a] - ur[1, b]
        if abs(d0 - d1) > 1e-15:
            p = -d1 / (d0 - d1)
            if 0.0 <= p <= 1.0:
                pts.add(float(p))
    p0 = float(game.mu0[0])
    v = {p: sender_value_at(game, np.array([p, 1 - p])) for p in pts}
    best = sender_value_at(game, game.mu0)
    for lo, hi in itertools.product(pts, pts):
        if lo <= p0 <= hi and hi > lo:
            w = (p0 - lo) / (hi - lo)
            best = max(best, (1 - w) * v[lo] + w * v[hi])
    return best


def truthful_scheme(game: BPGame) -> np.ndarray:
    """Full revelation: recommend the receiver's best action in each state."""
    pi = np.zeros(game.us.shape)
    for s in range(len(game.states)):
        pi[s, int(np.argmax(game.ur[s]))] = 1.0
    return pi


def babbling_scheme(game: BPGame) -> np.ndarray:
    """No information: the same recommendation mixture in every state (here: 50 / 50)."""
    return np.full(game.us.shape, 1.0 / game.us.shape[1])


def deviation_gain(game: BPGame, pi: np.ndarray, phi: tuple[int, ...]) -> float:
    j = game.mu0[:, None] * pi
    ur = game.ur
    return float(sum(j[:, a] @ (ur[:, phi[a]] - ur[:, a]) for a in range(ur.shape[1])))


def receiver_response(game: BPGame, pi: np.ndarray) -> tuple[int, ...]:
    """Bayesian receiver's rule under a committed scheme: for each recommendation, act on its posterior."""
    j = game.mu0[:, None] * pi
    rule = []
    for a in range(pi.shape[1]):
        mass = j[:, a].sum()
        belief = j[:, a] / mass if mass > 1e-12 else game.mu0
        rule.append(receiver_best_action(game, belief, preferred=a))
    return tuple(rule)


def max_violation(game: BPGame, pi: np.ndarray) -> float:
    """Largest receiver gain from disobeying (0 iff pi is obedient)."""
    j = game.mu0[:, None] * pi
    ur = game.ur
    return float(sum(max(0.0, (j[:, a] @ ur).max() - j[:, a] @ ur[:, a]) for a in range(ur.shape[1])))


def realized_sender_utility(game: BPGame, pi: np.ndarray) -> float:
    """Sender's expected utility when the receiver best-responds to the committed pi (not obeys)."""
    rule = receiver_response(game, pi)
    j = game.mu0[:, None] * pi
    return float(sum(j[:, a] @ game.us[:, rule[a]] for a in range(pi.shape[1])))


def lagrangian(game: BPGame, pi: np.ndarray, phi: tuple[int, ...], lam: float) -> float:
    """Mediator-augmented payoff L = U_s(pi) - lam * D(pi, phi) (sender maximises, deviator minimises)."""
    return float((game.mu0[:, None] * pi * game.us).sum()) - lam * deviation_gain(game, pi, phi)


def zero_sum_nash(m: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Nash of the zero-sum matrix game m (row player maximises): value, row mixture, column mixture."""
    n, k = m.shape
    c = np.zeros(n + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-m.T, np.ones((k, 1))])  # v - sigma^T m[:, j] <= 0
    a_eq = np.hstack([np.ones((1, n)), np.zeros((1, 1))])
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(k), A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0, None)] * n + [(None, None)], method="highs")
    if res.status != 0:
        raise RuntimeError(f"meta-game LP failed: {res.message}")
    sigma = np.clip(res.x[:n], 0, None)
    rho = np.clip(-res.ineqlin.marginals, 0, None)
    rho = rho / rho.sum() if rho.sum() > 0 else np.full(k, 1.0 / k)
    return -res.fun, sigma / sigma.sum(), rho


def all_deviation_rules(n_actions: int) -> list[tuple[int, ...]]:
    return list(itertools.product(range(n_actions), repeat=n_actions))


# --- a receiver that misreads: exact values under the NoisyReader's model (references only) ------
# The loop never calls these: they give the evaluator the best a sender can do against the receiver
# it actually faces, which only an oracle that knows the receiver's noise model can compute.

def channel_follow(game: BPGame, belief: np.ndarray, rec: int, noise: float) -> np.ndarray:
    """P(each action | posterior ``belief`` of recommendation ``rec``) for a receiver whose perceived
    log-odds of the first state are the true ones plus noise * N(0, 1) (two states; ties obey)."""
    from scipy.special import ndtr

    ur = game.ur
    if len(game.states) != 2 or ur.shape[1] != 2:
        raise ValueError("channel_follow needs a two-state, two-action game")
    if noise <= 0:
        p = np.zeros(2)
        p[receiver_best_action(game, belief, preferred=rec)] = 1.0
        return p
    # action 0 is best iff p (ur00 - ur01) + (1 - p)(ur10 - ur11) >= 0, i.e. p >= t (d0 > 0 > d1)
    d0, d1 = ur[0, 0] - ur[0, 1], ur[1, 0] - ur[1, 1]
    if not (d0 > 0 > d1):
        raise ValueError("channel_follow expects action 0 to be best in state 0 only")
    t = -d1 / (d0 - d1)
    with np.errstate(divide="ignore"):
        lq = np.log(belief[0]) - np.log(belief[1])
    p0 = float(lq > -np.inf) if not np.isfinite(lq) else float(ndtr((lq - np.log(t / (1 - t))) / noise))
    return np.array([p0, 1.0 - p0])


def channel_value(game: BPGame, pi: np.ndarray, noise: float) -> tuple[float, float]:
    """(sender utility, obedience rate) of committed scheme ``pi`` against the noisy reader, exactly."""
    j = game.mu0[:, None] * pi
    u, obey = 0.0, 0.0
    for a in range(pi.shape[1]):
        mass = j[:, a].sum()
        if mass <= 1e-12:
            continue
        belief = j[:, a] / mass
        follow = channel_follow(game, belief, a, noise)
        u += float(sum(j[:, a] @ game.us[:, b] * follow[b] for b in range(len(follow))))
        obey += mass * follow[a]
    return u, obey


def channel_oracle(game: BPGame, noise: float, grid: float) -> tuple[float, np.ndarray]:
    """Best obedient single scheme on the verbal grid against the noisy reader (exhaustive search,
    vectorised over the grid; ``channel_value`` is the per-scheme reference it must agree with)."""
    from scipy.special import ndtr

    mu0, us, ur = game.mu0, game.us, game.ur
    if len(game.states) != 2 or ur.shape[1] != 2:
        raise ValueError("channel_oracle needs a two-state, two-action game")
    qs = np.round(np.arange(0.0, 1.0 + 1e-9, grid), 10)
    x0, x1 = (a.ravel() for a in np.meshgrid(qs, qs, indexing="ij"))
    pi = np.stack([np.stack([x0, 1 - x0], -1), np.stack([x1, 1 - x1], -1)], axis=1)  # [k, s, a]
    j = mu0[None, :, None] * pi
    # exact obedience (max_violation == 0): following each recommendation is a best response
    eu = np.einsum("ksa,sb->kab", j, ur)  # [k, recommendation a, action b]
    follow_eu = np.take_along_axis(eu, np.arange(2)[None, :, None].repeat(len(pi), 0), axis=2)[..., 0]
    viol = np.clip(eu.max(axis=2) - follow_eu, 0, None).sum(axis=1)
    d0, d1 = ur[0, 0] - ur[0, 1], ur[1, 0] - ur[1, 1]
    if not (d0 > 0 > d1):
        raise ValueError("channel_oracle expects action 0 to be best in state 0 only")
    lt = np.log(-d1 / (d0 - d1)) - np.log(1 + d1 / (d0 - d1))
    value = np.zeros(len(pi))
    for a in range(2):
        mass = j[:, :, a].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            lq = np.log(j[:, 0, a]) - np.log(j[:, 1, a])
            if noise > 0:
                p0 = np.where(np.isfinite(lq), ndtr((lq - lt) / noise), (lq > 0).astype(float))
            else:
                p0 = np.where(lq >= lt - 1e-9, 1.0, 0.0) if a == 0 else np.where(lq > lt + 1e-9, 1.0, 0.0)
        p0 = np.where(mass > 1e-12, np.nan_to_num(p0), 0.0)
        value += (j[:, :, a] * (us[None, :, 0] * p0[:, None] + us[None, :, 1] * (1 - p0[:, None]))).sum(axis=1)
    value = np.where(viol <= 1e-9, value, -np.inf)
    k = int(np.argmax(value))
    return float(value[k]), pi[k]
