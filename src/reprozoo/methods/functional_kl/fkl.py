"""The functional KL estimator (FKL): KL between path measures from samples, by flow matching.

Paths are functions x: [0, T] -> R^D observed on a grid t_1..t_M, i.e. vectors in R^{M D}. A
Gaussian reference measure N(0, C) on path space, C = K (x) I_D with K a Matern-1/2 kernel on the
grid (the paper uses trace-class Matern covariances), defines the flow-matching interpolant::

    x_s = s x_1 + (1 - s) x_0,   x_1 ~ nu (a path measure),  x_0 ~ N(0, C),  s in [0, 1].

For two path measures nu^A, nu^B with velocity fields v^A_s, v^B_s of that interpolant::

    KL(nu^A || nu^B) = int_0^1 s / (1 - s) E_{x ~ mu^A_s} || v^A_s(x) - v^B_s(x) ||^2_{C^{-1}} ds

(the paper's Eq.; ||.||_{C^{-1}} is the Cameron-Martin norm of C). Equivalently, with the
denoiser D_s(x) = E[x_1 | x_s = x] (v = (D - x)/(1 - s)) and the signal-to-noise ratio
SNR = s^2/(1 - s)^2, lambda = log SNR, and the noise predictor eps_s(x) = E[x_0 | x_s = x]::

    KL = 1/2 int SNR(lambda) E_{mu^A} || D^A - D^B ||^2_{C^{-1}} d lambda
       = 1/2 int E_{mu^A} || eps^A - eps^B ||^2 d lambda          (whitened coordinates).

Implementation (ours; the paper trains neural-operator velocity fields): whiten paths with the
Cholesky factor of C (z = L^{-1} x makes the Cameron-Martin norm Euclidean and the noise N(0, I));
at each Gauss-Legendre node in lambda, regress the noise x_0 on features phi(x_s) by ridge least
squares (nested sets: affine, + cubic, + neighbour pairs, see :class:`Features`; one map for A and
B, standardised by the pooled x_s of A and B; ``n_noise`` noise draws per path) for A and for B,
and average the difference of the two predictors over fresh interpolants of A. Everything the
estimate needs is a set of second moments per node (:class:`NodeStats`): the Gram matrices and
noise cross-moments of each half of each measure's training rows, and the feature Gram of the
evaluation interpolants of A and of B.

Regressor choice (one rule for every estimator, every benchmark case and every TI method): at each
node, the feature set (``features``, nested) and the ridge strength (``ridges``: alpha added to the
Gram of the standardised features, intercept unpenalised) minimise the two-fold held-out
denoising loss, fit on one half of each measure's paths and scored on the other half, summed over A
and B. The chosen regressor is then used by both estimators:

* ``plain`` (the paper's plug-in estimate): one fit per measure on all its paths,
  1/2 E || eps^A - eps^B ||^2. Its square adds the variance of both fits (about d p / n per unit
  lambda: d path dimension, p features, n paths), so it is biased upwards, also at KL = 0.
* ``crossfit`` (ours, not in the paper): fits on the two halves, 1/2 E <eps^A_1 - eps^B_1,
  eps^A_2 - eps^B_2>; the halves' regression errors are independent, so that variance term cancels.

The s-range is truncated to [s_min, s_max] = [0.01, 0.99] as in the paper's uniform scheme; the
truncation makes the estimate the KL between the two path measures smoothed by Gaussian noise of
Cameron-Martin scale (1 - s_max)/s_max, which stays finite even when one measure is singular.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def matern12_kernel(ts: np.ndarray, length: float, variance: float, jitter: float = 1e-9) -> np.ndarray:
    """k(s, t) = variance * exp(-|s - t| / length): Matern nu = 1/2, Brownian-rough like SDE paths."""
    K = variance * np.exp(-np.abs(ts[:, None] - ts[None, :]) / length)
    return K + jitter * variance * np.eye(len(ts))


@dataclass
class Whitener:
    """z = (L^{-1} (x)) per output dimension, C = L L^T (x) I_D: the Cameron-Martin isometry."""
    L: np.ndarray  # (M, M)

    @classmethod
    def from_grid(cls, ts, length: float, variance: float) -> "Whitener":
        return cls(np.linalg.cholesky(matern12_kernel(np.asarray(ts, float), length, variance)))

    def __call__(self, paths: np.ndarray) -> np.ndarray:
        """(n, M, D) paths -> (n, M*D) whitened vectors."""
        n, M, D = paths.shape
        z = np.linalg.solve(self.L, paths.transpose(1, 0, 2).reshape(M, n * D))
        return z.reshape(M, n, D).transpose(1, 0, 2).reshape(n, M * D)


@dataclass
class FKLConfig:
    n_nodes: int = 24          # Gauss-Legendre nodes in lambda = log SNR
    s_min: float = 0.01        # paper's uniform scheme: s in [0.01, 0.99]
    s_max: float = 0.99
    n_noise: int = 8           # noise draws per path in each regression
    n_eval_noise: int = 2      # noise draws per path in the evaluation interpolants
    features: tuple = ("affine", "cubic", "pairs")  # nested candidate feature sets (see Features)
    ridges: tuple = (0.1, 1.0, 10.0)  # candidate ridge penalties alpha (absolute, on standardised features)
    estimator: str = "crossfit"  # "plain": the paper's plug-in square; "crossfit": ours (see module doc)

    @classmethod
    def from_params(cls, p: dict | None) -> "FKLConfig":
        kw = {k: v for k, v in (p or {}).items() if k in cls.__dataclass_fields__}
        for k in ("features", "ridges"):
            if k in kw:
                kw[k] = tuple(kw[k]) if isinstance(kw[k], (list, tuple)) else (kw[k],)
        return cls(**kw)


ESTIMATORS = ("plain", "crossfit")
FAMILIES = ("affine", "cubic", "pairs")


def lambda_nodes(cfg: FKLConfig) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights in lambda = 2 log(s / (1 - s)) over [s_min, s_max]."""
    lo, hi = (2 * np.log(s / (1 - s)) for s in (cfg.s_min, cfg.s_max))
    x, w = np.polynomial.legendre.leggauss(cfg.n_nodes)
    return 0.5 * (hi - lo) * x + 0.5 * (hi + lo), 0.5 * (hi - lo) * w


class Features:
    """Nested feature sets of a noisy whitened path x (M times x D coordinates, time-major), one map
    for A and B, every column standardised by the pooled rows of A and B at the node:

    * ``affine``: [1, x] (exact for Gaussian path laws: the denoiser is then affine);
    * ``cubic``:  + v^2 and v^3 of every value v of the noisy path in its own coordinates, y = L x;
    * ``pairs``:  + v_k v_{k+1}, products of time neighbours of each coordinate.

    The cubic and pair terms follow the structure of SDE paths: the score of a Markov chain with a
    polynomial drift is a sum of low-order polynomials of neighbouring values. Candidate q (columns)
    is a prefix: 1 + d, 1 + 3 d, 1 + 3 d + (M - 1) D, with d = M D."""

    def __init__(self, L: np.ndarray, D: int, families=FAMILIES):
        families = tuple(families)
        if families != FAMILIES[:len(families)] or not families:
            raise ValueError(f"features must be a prefix of {FAMILIES}, got {families}")
        self.L, self.D, self.M, self.families = np.asarray(L), int(D), len(L), families
        self.dim = self.M * self.D
        sizes = {"affine": self.dim, "cubic": 2 * self.dim, "pairs": (self.M - 1) * self.D}
        self.sizes = [1 + int(np.sum([sizes[f] for f in families[:i + 1]])) for i in range(len(families))]
        self.p = self.sizes[-1]
        self._unwhiten_T = np.kron(self.L, np.eye(self.D)).T

    def candidates(self, ridges) -> list[tuple[int, float]]:
        return [(q, float(r)) for q in self.sizes for r in ridges]

    def family_of(self, q: int) -> int:
        """0 for affine, 1 for + cubic, 2 for + pairs."""
        return self.sizes.index(q)

    def _path_values(self, x: np.ndarray) -> np.ndarray:
        """y = (L (x) I_D) x: the noisy path in its own coordinates (time-major)."""
        return x @ self._unwhiten_T

    def _raw(self, x: np.ndarray, v: np.ndarray | None) -> np.ndarray:
        """[1, x, v^2, v^3, v_k v_{k+1}] (the sets in ``families``), unstandardised, one array."""
        n, d = x.shape
        out = np.empty((n, self.p))
        out[:, 0] = 1.0
        out[:, 1:1 + d] = x
        if v is not None:
            sq = out[:, 1 + d:1 + 2 * d]
            np.multiply(v, v, out=sq)
            np.multiply(sq, v, out=out[:, 1 + 2 * d:1 + 3 * d])
            if "pairs" in self.families:
                V = v.reshape(n, self.M, self.D)
                out[:, 1 + 3 * d:].reshape(n, self.M - 1, self.D)[:] = V[:, :-1] * V[:, 1:]
        return out

    def transform(self, train: list[np.ndarray], evaluate: list[np.ndarray]):
        """Feature matrices [1, (raw - mu) / sd] of every block, mu and sd (and the scale of the path
        values inside the cubic and pair terms) from the pooled training blocks."""
        blocks = list(train) + list(evaluate)
        n_train = sum(len(x) for x in train)

        def pooled_scale(arrays):
            s1 = sum(a.sum(0) for a in arrays[:len(train)])
            s2 = sum(np.einsum("ij,ij->j", a, a) for a in arrays[:len(train)])
            mu = s1 / n_train
            return mu, np.sqrt(np.maximum(s2 / n_train - mu**2, 0.0)) + 1e-12

        vs = [None] * len(blocks)
        if len(self.families) > 1:
            ys = [self._path_values(x) for x in blocks]
            vloc, vscale = pooled_scale(ys)
            vs = [(y - vloc) / vscale for y in ys]
        phis = [self._raw(x, v) for x, v in zip(blocks, vs)]
        mu, sd = pooled_scale([P[:, 1:] for P in phis])
        for P in phis:
            P[:, 1:] -= mu
            P[:, 1:] /= sd
        return phis[:len(train)], phis[len(train):]


def _alpha_sigma(lam: float) -> tuple[float, float]:
    s = 1.0 / (1.0 + np.exp(-lam / 2.0))  # SNR = s^2/(1-s)^2 = e^lambda
    return s, 1.0 - s


@dataclass
class NodeStats:
    """Second moments at one lambda node for measures m = 0 (A) and 1 (B), halves h = 0, 1.

    G[m, h] = Phi^T Phi and c[m, h] = Phi^T eps over the training rows of that half, e[m, h] =
    sum eps^2, N[m, h] = rows; M[m] = mean phi phi^T over the evaluation interpolants of measure m."""
    G: np.ndarray  # (2, 2, p, p)
    c: np.ndarray  # (2, 2, p, d)
    e: np.ndarray  # (2, 2)
    N: np.ndarray  # (2, 2)
    M: np.ndarray  # (2, p, p)


def _rows(z: np.ndarray, a: float, s: float, reps: int, rng: np.random.Generator):
    zz = np.repeat(z, reps, axis=0)
    eps = rng.standard_normal(zz.shape)
    return a * zz + s * eps, eps


def pair_stats(za: np.ndarray, zb: np.ndarray, cfg: FKLConfig, feats: Features,
               rng_a: np.random.Generator, rng_b: np.random.Generator) -> list[NodeStats]:
    """The moments of every node for whitened paths za (n_a, d) of A and zb (n_b, d) of B.

    Each measure's paths are split into halves (first, second); noise for A comes from rng_a and for
    B from rng_b, so a fixed A with its own generator sees the same draws against every B."""
    lams, _ = lambda_nodes(cfg)
    halves = [(z[: len(z) // 2], z[len(z) // 2: 2 * (len(z) // 2)]) for z in (za, zb)]
    rngs = (rng_a, rng_b)
    out = []
    for lam in lams:
        a, s = _alpha_sigma(lam)
        train = [_rows(halves[m][h], a, s, cfg.n_noise, rngs[m]) for m in (0, 1) for h in (0, 1)]
        ev = [_rows(z, a, s, cfg.n_eval_noise, rngs[m])[0] for m, z in enumerate((za, zb))]
        phis, phis_ev = feats.transform([x for x, _ in train], ev)
        p, d = phis[0].shape[1], za.shape[1]
        G, c = np.empty((2, 2, p, p)), np.empty((2, 2, p, d))
        e, N = np.empty((2, 2)), np.empty((2, 2))
        for i, (Phi, (_, eps)) in enumerate(zip(phis, train)):
            m, h = divmod(i, 2)
            G[m, h], c[m, h] = Phi.T @ Phi, Phi.T @ eps
            e[m, h], N[m, h] = float(np.sum(eps**2)), len(eps)
        M = np.stack([Phi.T @ Phi / len(Phi) for Phi in phis_ev])
        out.append(NodeStats(G, c, e, N, M))
    return out


def _solve(G: np.ndarray, c: np.ndarray, q: int, ridge: float) -> np.ndarray:
    """Ridge weights on the first q feature columns: (G + alpha I')^{-1} c, intercept unpenalised.

    alpha is absolute (a fixed number of pseudo-observations), so the shrinkage, and the downward
    bias it puts on the KL integrand, vanish as the number of rows grows; a penalty proportional to
    the rows would keep a fixed shrinkage at any sample size."""
    pen = np.full(q, float(ridge))
    pen[0] = 0.0
    return np.linalg.solve(G[:q, :q] + np.diag(pen), c[:q])


def heldout_loss(st: NodeStats, q: int, ridge: float) -> float:
    """Two-fold held-out denoising loss (mean over rows of ||eps - eps_hat||^2), summed over A and B."""
    total = 0.0
    for m in (0, 1):
        for h in (0, 1):
            W, o = _solve(st.G[m, h], st.c[m, h], q, ridge), 1 - h
            sse = st.e[m, o] - 2.0 * np.sum(W * st.c[m, o, :q]) + np.sum(W * (st.G[m, o, :q, :q] @ W))
            total += sse / st.N[m, o]
    return float(total)


def select(st: NodeStats, cands: list[tuple[int, float]]) -> tuple[int, float]:
    """The candidate (q, ridge) with the lowest two-fold held-out loss at this node."""
    losses = [heldout_loss(st, q, r) for q, r in cands]
    return cands[int(np.argmin(losses))]


def node_kl(st: NodeStats, q: int, ridge: float, estimator: str) -> tuple[float, float]:
    """(forward, reverse) integrands 1/2 E ||eps^A - eps^B||^2 under A and under B at one node."""
    if estimator == "plain":
        D = (_solve(st.G[0, 0] + st.G[0, 1], st.c[0, 0] + st.c[0, 1], q, ridge)
             - _solve(st.G[1, 0] + st.G[1, 1], st.c[1, 0] + st.c[1, 1], q, ridge))
        D1 = D2 = D
    elif estimator == "crossfit":
        D1 = _solve(st.G[0, 0], st.c[0, 0], q, ridge) - _solve(st.G[1, 0], st.c[1, 0], q, ridge)
        D2 = _solve(st.G[0, 1], st.c[0, 1], q, ridge) - _solve(st.G[1, 1], st.c[1, 1], q, ridge)
    else:
        raise ValueError(f"unknown estimator '{estimator}' ({' | '.join(ESTIMATORS)})")
    return tuple(0.5 * float(np.sum(D1 * (st.M[m, :q, :q] @ D2))) for m in (0, 1))


def estimate(stats: list[NodeStats], cfg: FKLConfig, sizes: list[int], estimator: str | None = None) -> dict:
    """KL(A || B) and KL(B || A) from the node moments, with the regressor chosen per node by held-out loss.

    ``sizes``: the candidate column counts (Features.sizes). Returns forward, reverse, their
    integrands per node (nats per unit lambda), and per node the chosen feature set (index into the
    nested sets, 0 = affine) and ridge."""
    estimator = estimator or cfg.estimator
    _, wts = lambda_nodes(cfg)
    cands = [(int(q), float(r)) for q in sizes for r in cfg.ridges]
    fwd, rev, feats, ridges = [], [], [], []
    for st in stats:
        q, r = select(st, cands)
        f, b = node_kl(st, q, r, estimator)
        fwd.append(f)
        rev.append(b)
        feats.append(list(sizes).index(q))
        ridges.append(r)
    fwd, rev = np.array(fwd), np.array(rev)
    return {"forward": float(np.sum(wts * fwd)), "reverse": float(np.sum(wts * rev)),
            "integrand_forward": fwd, "integrand_reverse": rev,
            "chosen_family": np.array(feats), "chosen_ridge": np.array(ridges)}


def stack_stats(stats: list[NodeStats]) -> dict[str, np.ndarray]:
    """Arrays (one leading axis over nodes) for saving; :func:`unstack_stats` reverses it."""
    return {k: np.stack([getattr(s, k) for s in stats]) for k in ("G", "c", "e", "N", "M")}


def unstack_stats(arrays: dict[str, np.ndarray]) -> list[NodeStats]:
    return [NodeStats(*(arrays[k][i] for k in ("G", "c", "e", "N", "M"))) for i in range(len(arrays["G"]))]


class FKL:
    """FKL between a fixed path measure P and any number of measures Q.

    P's noise draws come from one generator seeded once, so every Q is scored against the same
    interpolants of P (a paired comparison of the Qs); ``kl(paths_q)`` returns KL(P || Q), KL(Q || P),
    the integrands and the regressor chosen at each node."""

    def __init__(self, paths_p: np.ndarray, whiten: Whitener, cfg: FKLConfig, rng: np.random.Generator):
        self.whiten, self.cfg, self.rng = whiten, cfg, rng
        self.zp = whiten(paths_p)
        self.feats = Features(whiten.L, paths_p.shape[2], cfg.features)
        self.seed_p = int(rng.integers(2**62))

    def stats(self, paths_q: np.ndarray) -> list[NodeStats]:
        return pair_stats(self.zp, self.whiten(paths_q), self.cfg, self.feats,
                          np.random.default_rng(self.seed_p), self.rng)

    def kl(self, paths_q: np.ndarray, estimator: str | None = None) -> dict:
        return estimate(self.stats(paths_q), self.cfg, self.feats.sizes, estimator)


def functional_kl(paths_p: np.ndarray, paths_q: np.ndarray, whiten: Whitener, cfg: FKLConfig,
                  rng: np.random.Generator, both: bool = False):
    """FKL(P || Q) (and FKL(Q || P) if ``both``) from sample paths (n, M, D) of each measure."""
    out = FKL(paths_p, whiten, cfg, rng).kl(paths_q)
    return (out["forward"], out["reverse"]) if both else out["forward"]
