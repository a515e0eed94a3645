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
squares (nested sets: affine, + branch gates, + cubic, + neighbour pairs, see :class:`Features`; one
map for A and B, standardised by the pooled x_s of A and B; ``n_noise`` noise draws per path) for A
and for B,
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

``analytic_affine``: the affine candidate's training moments are replaced by their exact average
over the noise draws (:func:`affine_moments`), which removes the noise-draw part of the fits'
variance (the gate columns stay sampled). ``neural``: an MLP candidate (neural.py) joins the per-node
held-out choice (:func:`estimate`).

Branch gates (issue 25 review: an affine or per-coordinate polynomial regressor cannot express the
denoiser of a law whose paths split into branches, so it returns the KL between the two laws'
moment-matched Gaussians). If the clean whitened paths are a two-component Gaussian mixture with a
shared covariance, pi_k N(mu_k, Sigma), then x_s = a z + s eps is the mixture pi_k N(a mu_k, S),
S = a^2 Sigma + s^2 I, and its noise predictor is exactly::

    eps_s(x) = affine(x) + tanh(l_s(x) / 2) u_s,
    l_s(x) = a (mu_1 - mu_2)^T S^{-1} x + log(pi_1 / pi_2) - a^2 (mu_1^T S^{-1} mu_1 - mu_2^T S^{-1} mu_2) / 2,

(tanh(l/2) = P(branch 1 | x) - P(branch 2 | x)), a fixed vector u_s times the posterior branch
contrast: a sigmoid of one global direction of the path. The ``gate`` feature set adds
tanh(l_s/2) of a two-component tied-covariance mixture fitted by EM (:func:`fit_two_branch`) to
the clean paths of A and, separately, of B (two columns), so the ridge fit can represent both
measures' denoisers exactly when they are such mixtures, and approximately for branching SDEs.

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
    features: tuple = ("affine", "gate", "cubic", "pairs")  # nested candidate feature sets (see Features)
    ridges: tuple = (0.1, 1.0, 10.0)  # candidate ridge penalties alpha (absolute, on standardised features)
    estimator: str = "crossfit"  # "plain": the paper's plug-in square; "crossfit": ours (see module doc)
    neural: dict | None = None  # the MLP candidate's fit settings (neural.py); None: ridge candidates only
    analytic_affine: bool = False  # the affine candidate's training moments averaged over the noise exactly

    @classmethod
    def from_params(cls, p: dict | None) -> "FKLConfig":
        kw = {k: v for k, v in (p or {}).items() if k in cls.__dataclass_fields__}
        for k in ("features", "ridges"):
            if k in kw:
                kw[k] = tuple(kw[k]) if isinstance(kw[k], (list, tuple)) else (kw[k],)
        return cls(**kw)


ESTIMATORS = ("plain", "crossfit")
FAMILIES = ("affine", "gate", "cubic", "pairs")
NEURAL = len(FAMILIES)  # chosen_family code of the MLP candidate (neural.py)
N_GATES = 2  # one branch gate fitted on A's paths, one on B's


def lambda_nodes(cfg: FKLConfig) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights in lambda = 2 log(s / (1 - s)) over [s_min, s_max]."""
    lo, hi = (2 * np.log(s / (1 - s)) for s in (cfg.s_min, cfg.s_max))
    x, w = np.polynomial.legendre.leggauss(cfg.n_nodes)
    return 0.5 * (hi - lo) * x + 0.5 * (hi + lo), 0.5 * (hi - lo) * w


class Features:
    """Nested feature sets of a noisy whitened path x (M times x D coordinates, time-major), one map
    for A and B, every column standardised by the pooled rows of A and B at the node:

    * ``affine``: [1, x] (exact for Gaussian path laws: the denoiser is then affine);
    * ``gate``:   + tanh(l_s(x)/2) of the two-branch mixtures fitted to A and to B (module doc:
      exact, with the affine part, for two-component tied-covariance Gaussian mixtures);
    * ``cubic``:  + v^2 and v^3 of every value v of the noisy path in its own coordinates, y = L x;
    * ``pairs``:  + v_k v_{k+1}, products of time neighbours of each coordinate.

    The cubic and pair terms follow the structure of SDE paths: the score of a Markov chain with a
    polynomial drift is a sum of low-order polynomials of neighbouring values. Candidate q (columns)
    is a prefix: 1 + d, + 2, + 2 d, + (M - 1) D, with d = M D."""

    def __init__(self, L: np.ndarray, D: int, families=FAMILIES):
        families = tuple(families)
        if families != FAMILIES[:len(families)] or not families:
            raise ValueError(f"features must be a prefix of {FAMILIES}, got {families}")
        self.L, self.D, self.M, self.families = np.asarray(L), int(D), len(L), families
        self.dim = self.M * self.D
        sizes = {"affine": self.dim, "gate": N_GATES, "cubic": 2 * self.dim, "pairs": (self.M - 1) * self.D}
        self.sizes = [1 + int(np.sum([sizes[f] for f in families[:i + 1]])) for i in range(len(families))]
        self.p = self.sizes[-1]
        self._unwhiten_T = np.kron(self.L, np.eye(self.D)).T

    @property
    def gated(self) -> bool:
        return "gate" in self.families

    def candidates(self, ridges) -> list[tuple[int, float]]:
        return [(q, float(r)) for q in self.sizes for r in ridges]

    def family_of(self, q: int) -> int:
        """0 for affine, 1 for + gate, 2 for + cubic, 3 for + pairs."""
        return self.sizes.index(q)

    def _path_values(self, x: np.ndarray) -> np.ndarray:
        """y = (L (x) I_D) x: the noisy path in its own coordinates (time-major)."""
        return x @ self._unwhiten_T

    def _raw(self, x: np.ndarray, v: np.ndarray | None, gates) -> np.ndarray:
        """[1, x, gates, v^2, v^3, v_k v_{k+1}] (the sets in ``families``), unstandardised, one array."""
        n, d = x.shape
        out = np.empty((n, self.p))
        out[:, 0] = 1.0
        out[:, 1:1 + d] = x
        k = 1 + d
        if self.gated:
            for j, (w, c) in enumerate(gates):
                out[:, k + j] = np.tanh(0.5 * (x @ w + c))
            k += N_GATES
        if v is not None:
            sq = out[:, k:k + d]
            np.multiply(v, v, out=sq)
            np.multiply(sq, v, out=out[:, k + d:k + 2 * d])
            if "pairs" in self.families:
                V = v.reshape(n, self.M, self.D)
                out[:, k + 2 * d:].reshape(n, self.M - 1, self.D)[:] = V[:, :-1] * V[:, 1:]
        return out

    def transform(self, train: list[np.ndarray], evaluate: list[np.ndarray], gates=None):
        """Feature matrices [1, (raw - mu) / sd] of every block, mu and sd (and the scale of the path
        values inside the cubic and pair terms) from the pooled training blocks. ``gates``: the
        (w, c) of each measure's branch gate at this node (:meth:`TwoBranch.gate`), if gated."""
        if self.gated and (gates is None or len(gates) != N_GATES):
            raise ValueError(f"the gate features need {N_GATES} (w, c) gates, got {gates!r}")
        blocks = list(train) + list(evaluate)
        n_train = sum(len(x) for x in train)

        def pooled_scale(arrays):
            s1 = sum(a.sum(0) for a in arrays[:len(train)])
            s2 = sum(np.einsum("ij,ij->j", a, a) for a in arrays[:len(train)])
            mu = s1 / n_train
            return mu, np.sqrt(np.maximum(s2 / n_train - mu**2, 0.0)) + 1e-12

        vs = [None] * len(blocks)
        if {"cubic", "pairs"} & set(self.families):
            ys = [self._path_values(x) for x in blocks]
            vloc, vscale = pooled_scale(ys)
            vs = [(y - vloc) / vscale for y in ys]
        phis = [self._raw(x, v, gates) for x, v in zip(blocks, vs)]
        mu, sd = pooled_scale([P[:, 1:] for P in phis])
        for P in phis:
            P[:, 1:] -= mu
            P[:, 1:] /= sd
        return phis[:len(train)], phis[len(train):]


@dataclass
class TwoBranch:
    """A two-component Gaussian mixture with a shared covariance, pi_k N(mu_k, Sigma), of clean
    whitened paths: the branch model behind the ``gate`` features (module doc)."""
    pi: np.ndarray     # (2,)
    mu: np.ndarray     # (2, d)
    Sigma: np.ndarray  # (d, d)

    def gate(self, a: float, s: float) -> tuple[np.ndarray, float]:
        """(w, c) with l_s(x) = x @ w + c the log-odds of branch 1 given x_s = a z + s eps = x."""
        S = a**2 * self.Sigma + s**2 * np.eye(len(self.Sigma))
        Si_mu = np.linalg.solve(S, self.mu.T).T          # (2, d)
        w = a * (Si_mu[0] - Si_mu[1])
        c = (np.log(self.pi[0] / self.pi[1])
             - 0.5 * a**2 * (self.mu[0] @ Si_mu[0] - self.mu[1] @ Si_mu[1]))
        return w, float(c)


def fit_two_branch(z: np.ndarray, iters: int = 100, tol: float = 1e-8) -> TwoBranch:
    """EM for a two-component tied-covariance Gaussian mixture on the rows of z (n, d).

    Deterministic: initialised by splitting the rows at the median of their projection on the
    first principal component; the responsibilities' weights are floored at 1 % so a component never
    empties; a 1e-6 relative ridge keeps Sigma invertible."""
    n, d = z.shape
    zc = z - z.mean(0)
    _, _, vt = np.linalg.svd(zc, full_matrices=False)
    proj = zc @ vt[0]
    r = (proj > np.median(proj)).astype(float)
    ll_old = -np.inf
    for _ in range(iters):
        R = np.stack([r, 1 - r], 1)                       # (n, 2) responsibilities
        Nk = np.maximum(R.sum(0), 0.01 * n)
        pi = Nk / Nk.sum()
        mu = (R.T @ z) / Nk[:, None]
        diff0, diff1 = z - mu[0], z - mu[1]
        Sigma = (diff0.T @ (diff0 * R[:, :1]) + diff1.T @ (diff1 * R[:, 1:])) / n
        Sigma += 1e-6 * np.trace(Sigma) / d * np.eye(d)
        Lc = np.linalg.cholesky(Sigma)
        m0, m1 = (np.linalg.solve(Lc, (z - m).T) for m in mu)
        logp = np.stack([np.log(pi[0]) - 0.5 * np.sum(m0**2, 0), np.log(pi[1]) - 0.5 * np.sum(m1**2, 0)], 1)
        top = logp.max(1, keepdims=True)
        ll = float(np.mean(top[:, 0] + np.log(np.exp(logp - top).sum(1))))
        r = 1.0 / (1.0 + np.exp(np.clip(logp[:, 1] - logp[:, 0], -50, 50)))
        if ll - ll_old < tol:
            break
        ll_old = ll
    return TwoBranch(pi, mu, Sigma)


def _alpha_sigma(lam: float) -> tuple[float, float]:
    s = 1.0 / (1.0 + np.exp(-lam / 2.0))  # SNR = s^2/(1-s)^2 = e^lambda
    return s, 1.0 - s


@dataclass
class NodeStats:
    """Second moments at one lambda node for measures m = 0 (A) and 1 (B), halves h = 0, 1.

    G[m, h] = Phi^T Phi and c[m, h] = Phi^T eps over the training rows of that half, e[m, h] =
    sum eps^2, N[m, h] = rows; M[m] = mean phi phi^T over the evaluation interpolants of measure m.
    R (kept only on request, never saved): the evaluation feature rows of A, path-major
    (``n_eval_noise`` rows per path of A), for the per-path contributions to KL(A || B)."""
    G: np.ndarray  # (2, 2, p, p)
    c: np.ndarray  # (2, 2, p, d)
    e: np.ndarray  # (2, 2)
    N: np.ndarray  # (2, 2)
    M: np.ndarray  # (2, p, p)
    R: np.ndarray | None = None  # (n_A * n_eval_noise, p)
    # the affine block's training moments with the noise averaged out exactly (analytic_affine):
    # Ga (2, 2, 1 + d, 1 + d), ca (2, 2, 1 + d, d), ea (2, 2); None: the sampled ones are used
    Ga: np.ndarray | None = None
    ca: np.ndarray | None = None
    ea: np.ndarray | None = None

    def moments(self, m: int, h: int, q: int):
        """(G, c, e) of measure m, half h on the first q columns: the exact noise average for the
        affine candidate when it was computed, the sampled moments otherwise."""
        if self.Ga is not None and q == self.Ga.shape[-1]:
            return self.Ga[m, h], self.ca[m, h], self.ea[m, h]
        return self.G[m, h, :q, :q], self.c[m, h, :q], self.e[m, h]


def affine_moments(z: np.ndarray, a: float, s: float, reps: int, mu: np.ndarray, sd: np.ndarray):
    """Noise-averaged moments of the standardised affine features phi = [1, (x - mu) / sd] and the
    noise eps, x = a z + s eps, over ``reps`` draws per clean path z (the expectation of what
    :func:`_rows` + Features.transform + Phi^T Phi give): E[x] = a z, Cov[x | z] = s^2 I,
    E[x eps^T | z] = s I. Returns (G, c, e) for len(z) * reps rows."""
    n, d = z.shape
    u = (a * z - mu) / sd
    phi = np.concatenate([np.ones((n, 1)), u], axis=1)
    G = phi.T @ phi
    G[1:, 1:] += n * np.diag(s**2 / sd**2)
    c = np.zeros((1 + d, d))
    c[1:] = n * np.diag(s / sd)
    return reps * G, reps * c, float(reps * n * d)


def _rows(z: np.ndarray, a: float, s: float, reps: int, rng: np.random.Generator):
    zz = np.repeat(z, reps, axis=0)
    eps = rng.standard_normal(zz.shape)
    return a * zz + s * eps, eps


def pair_stats(za: np.ndarray, zb: np.ndarray, cfg: FKLConfig, feats: Features,
               rng_a: np.random.Generator, rng_b: np.random.Generator, keep_rows: bool = False,
               branches: tuple | None = None) -> list[NodeStats]:
    """The moments of every node for whitened paths za (n_a, d) of A and zb (n_b, d) of B.

    Each measure's paths are split into halves (first, second); noise for A comes from rng_a and for
    B from rng_b, so a fixed A with its own generator sees the same draws against every B. With the
    gate features, each measure's two-branch mixture is fitted to all its clean paths (``branches``:
    already fitted ones, (A's, B's), to reuse). ``keep_rows``: keep A's evaluation rows (NodeStats.R)."""
    lams, _ = lambda_nodes(cfg)
    halves = [(z[: len(z) // 2], z[len(z) // 2: 2 * (len(z) // 2)]) for z in (za, zb)]
    rngs = (rng_a, rng_b)
    if feats.gated and branches is None:
        branches = (fit_two_branch(za), fit_two_branch(zb))
    out = []
    for lam in lams:
        a, s = _alpha_sigma(lam)
        train = [_rows(halves[m][h], a, s, cfg.n_noise, rngs[m]) for m in (0, 1) for h in (0, 1)]
        ev = [_rows(z, a, s, cfg.n_eval_noise, rngs[m])[0] for m, z in enumerate((za, zb))]
        gates = [b.gate(a, s) for b in branches] if feats.gated else None
        phis, phis_ev = feats.transform([x for x, _ in train], ev, gates)
        p, d = phis[0].shape[1], za.shape[1]
        extra = {}
        if cfg.analytic_affine:  # in the same standardised coordinates as the sampled features
            xs = [x for x, _ in train]
            n_rows = sum(len(x) for x in xs)
            mu = sum(x.sum(0) for x in xs) / n_rows
            sd = np.sqrt(np.maximum(sum(np.einsum("ij,ij->j", x, x) for x in xs) / n_rows - mu**2, 0.0)) + 1e-12
            mom = [affine_moments(halves[m][h], a, s, cfg.n_noise, mu, sd) for m in (0, 1) for h in (0, 1)]
            extra = {"Ga": np.stack([g for g, _, _ in mom]).reshape(2, 2, 1 + d, 1 + d),
                     "ca": np.stack([c for _, c, _ in mom]).reshape(2, 2, 1 + d, d),
                     "ea": np.array([e for _, _, e in mom]).reshape(2, 2)}
        G, c = np.empty((2, 2, p, p)), np.empty((2, 2, p, d))
        e, N = np.empty((2, 2)), np.empty((2, 2))
        for i, (Phi, (_, eps)) in enumerate(zip(phis, train)):
            m, h = divmod(i, 2)
            G[m, h], c[m, h] = Phi.T @ Phi, Phi.T @ eps
            e[m, h], N[m, h] = float(np.sum(eps**2)), len(eps)
        M = np.stack([Phi.T @ Phi / len(Phi) for Phi in phis_ev])
        out.append(NodeStats(G, c, e, N, M, phis_ev[0] if keep_rows else None, **extra))
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
            G, c, _ = st.moments(m, h, q)
            W, o = _solve(G, c, q, ridge), 1 - h
            Go, co, eo = st.moments(m, o, q)
            sse = eo - 2.0 * np.sum(W * co) + np.sum(W * (Go @ W))
            total += sse / st.N[m, o]
    return float(total)


def select(st: NodeStats, cands: list[tuple[int, float]]) -> tuple[int, float]:
    """The candidate (q, ridge) with the lowest two-fold held-out loss at this node."""
    losses = [heldout_loss(st, q, r) for q, r in cands]
    return cands[int(np.argmin(losses))]


def _differences(st: NodeStats, q: int, ridge: float, estimator: str) -> tuple[np.ndarray, np.ndarray]:
    """The two weight differences (A minus B) whose inner product under a measure is the integrand."""
    mo = {(m, h): st.moments(m, h, q)[:2] for m in (0, 1) for h in (0, 1)}
    if estimator == "plain":
        D = (_solve(mo[0, 0][0] + mo[0, 1][0], mo[0, 0][1] + mo[0, 1][1], q, ridge)
             - _solve(mo[1, 0][0] + mo[1, 1][0], mo[1, 0][1] + mo[1, 1][1], q, ridge))
        return D, D
    if estimator == "crossfit":
        return (_solve(*mo[0, 0], q, ridge) - _solve(*mo[1, 0], q, ridge),
                _solve(*mo[0, 1], q, ridge) - _solve(*mo[1, 1], q, ridge))
    raise ValueError(f"unknown estimator '{estimator}' ({' | '.join(ESTIMATORS)})")


def node_kl(st: NodeStats, q: int, ridge: float, estimator: str) -> tuple[float, float]:
    """(forward, reverse) integrands 1/2 E ||eps^A - eps^B||^2 under A and under B at one node."""
    D1, D2 = _differences(st, q, ridge, estimator)
    return tuple(0.5 * float(np.sum(D1 * (st.M[m, :q, :q] @ D2))) for m in (0, 1))


def node_units(st: NodeStats, q: int, ridge: float, estimator: str, reps: int) -> np.ndarray:
    """Per path of A, its share of the forward integrand (their mean is node_kl's forward value)."""
    D1, D2 = _differences(st, q, ridge, estimator)
    R = st.R[:, :q]
    vals = 0.5 * np.sum((R @ D1) * (R @ D2), axis=1)
    return vals.reshape(-1, reps).mean(axis=1)


def estimate(stats: list[NodeStats], cfg: FKLConfig, sizes: list[int], estimator: str | None = None,
             neural: dict | None = None) -> dict:
    """KL(A || B) and KL(B || A) from the node moments, with the regressor chosen per node by held-out loss.

    ``sizes``: the candidate column counts (Features.sizes). Returns forward, reverse, their
    integrands per node (nats per unit lambda), and per node the chosen feature set (index into the
    nested sets, 0 = affine) and ridge; with A's evaluation rows kept (NodeStats.R), also the
    per-path contributions of A to the forward KL (``units_forward``, their mean is ``forward``).

    ``neural``: the MLP candidate's per-node held-out loss and integrands (neural.neural_pair); at a
    node where its held-out loss is below the best ridge candidate's, its integrand is used
    (chosen_family NEURAL, chosen_ridge nan): the same held-out rule over all candidates."""
    estimator = estimator or cfg.estimator
    _, wts = lambda_nodes(cfg)
    cands = [(int(q), float(r)) for q in sizes for r in cfg.ridges]
    fwd, rev, feats, ridges, units = [], [], [], [], 0.0
    with_units = all(st.R is not None for st in stats)
    for i, (st, w) in enumerate(zip(stats, wts)):
        q, r = select(st, cands)
        if neural is not None and neural["heldout"][i] < heldout_loss(st, q, r):
            fwd.append(float(neural[f"forward_{estimator}"][i]))
            rev.append(float(neural[f"reverse_{estimator}"][i]))
            feats.append(NEURAL)
            ridges.append(np.nan)
            if with_units:
                units = units + w * neural[f"units_{estimator}"][i]
            continue
        f, b = node_kl(st, q, r, estimator)
        fwd.append(f)
        rev.append(b)
        feats.append(list(sizes).index(q))
        ridges.append(r)
        if with_units:
            units = units + w * node_units(st, q, r, estimator, cfg.n_eval_noise)
    fwd, rev = np.array(fwd), np.array(rev)
    out = {"forward": float(np.sum(wts * fwd)), "reverse": float(np.sum(wts * rev)),
           "integrand_forward": fwd, "integrand_reverse": rev,
           "chosen_family": np.array(feats), "chosen_ridge": np.array(ridges)}
    if with_units:
        out["units_forward"] = units  # per path of A; mean = forward
    return out


def stack_stats(stats: list[NodeStats]) -> dict[str, np.ndarray]:
    """Arrays (one leading axis over nodes) for saving; :func:`unstack_stats` reverses it."""
    keys = ("G", "c", "e", "N", "M") + (("Ga", "ca", "ea") if stats[0].Ga is not None else ())
    return {k: np.stack([getattr(s, k) for s in stats]) for k in keys}


def unstack_stats(arrays: dict[str, np.ndarray]) -> list[NodeStats]:
    extra = [k for k in ("Ga", "ca", "ea") if k in arrays]
    return [NodeStats(*(arrays[k][i] for k in ("G", "c", "e", "N", "M")), **{k: arrays[k][i] for k in extra})
            for i in range(len(arrays["G"]))]


class FKL:
    """FKL between a fixed path measure P and any number of measures Q.

    P's noise draws come from one generator seeded once, so every Q is scored against the same
    interpolants of P (a paired comparison of the Qs); ``kl(paths_q)`` returns KL(P || Q), KL(Q || P),
    the integrands, the regressor chosen at each node and, per path of P, its contribution to
    KL(P || Q) (``units_forward``: the same paths of P for every Q, so per-path values pair)."""

    def __init__(self, paths_p: np.ndarray, whiten: Whitener, cfg: FKLConfig, rng: np.random.Generator):
        self.whiten, self.cfg, self.rng = whiten, cfg, rng
        self.zp = whiten(paths_p)
        self.feats = Features(whiten.L, paths_p.shape[2], cfg.features)
        self.seed_p = int(rng.integers(2**62))
        self.branch_p = fit_two_branch(self.zp) if self.feats.gated else None

    def stats(self, paths_q: np.ndarray, keep_rows: bool = True) -> list[NodeStats]:
        zq = self.whiten(paths_q)
        branches = (self.branch_p, fit_two_branch(zq)) if self.feats.gated else None
        return pair_stats(self.zp, zq, self.cfg, self.feats, np.random.default_rng(self.seed_p), self.rng,
                          keep_rows=keep_rows, branches=branches)

    def kl(self, paths_q: np.ndarray, estimator: str | None = None) -> dict:
        nn = None
        if self.cfg.neural:
            from .neural import neural_pair

            nn = neural_pair(self.zp, self.whiten(paths_q), self.cfg, self.cfg.neural,
                             int(self.rng.integers(2**31)), progress=lambda *_: None)
        return estimate(self.stats(paths_q), self.cfg, self.feats.sizes, estimator, neural=nn)


def functional_kl(paths_p: np.ndarray, paths_q: np.ndarray, whiten: Whitener, cfg: FKLConfig,
                  rng: np.random.Generator, both: bool = False):
    """FKL(P || Q) (and FKL(Q || P) if ``both``) from sample paths (n, M, D) of each measure."""
    out = FKL(paths_p, whiten, cfg, rng).kl(paths_q)
    return (out["forward"], out["reverse"]) if both else out["forward"]
