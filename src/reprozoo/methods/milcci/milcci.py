"""MILCCI: label-driven multi-trial decomposition (our reimplementation, numpy only).

Model. Trial m (N channels x T time bins) carries one label value l_c(m) per category c.
Category c owns P_c components; their spatial maps have one variant per label value,
A^c_v (N x P_c, non-negative, sparse), and every trial has its own temporal traces
Phi_m (T x P):

    Y_m ~ A_m Phi_m^T,        A_m = [A^1_{l_1(m)} | ... | A^C_{l_C(m)}]        (N x P)

Objective (fixed constants, A >= 0):

    J = 1/2 sum_m ||Y_m - A_m Phi_m^T||_F^2                           data, every trial
      + lam1 sum_{c,v} |A^c_v|_1                                       sparse maps
      + lam_sim/2 sum_c sum_{pairs v,v'} w^c_{vv'} ||A^c_v - A^c_{v'}||_F^2  label similarity
      + lam_s/2 sum_m ||D Phi_m||_F^2                                  smooth traces (D: first difference)

The label similarity w^c (rows sum to 1; uniform over the other values for a nominal category,
Gaussian in |v - v'| for an ordinal one) ties the variants of a component together, so they
differ only where the trials of a label value ask for it: the "subtle label-driven adjustments in
component composition" of the paper. Trials that share category c's value share that category's
maps exactly (the reference code's ``split_A``), so each category's components are estimated from
all trials with that value while the traces stay free per trial.

Fitting: block coordinate descent. (1) For each category c and value v, the maps A^c_v solve a
non-negative lasso against the residual of the other categories' components over the trials
with l_c = v, by FISTA with the exact Lipschitz constant. (2) Each trial's traces solve the
Sylvester equation (A_m^T A_m) X + lam_s X (D^T D) = A_m^T Y_m, X = Phi_m^T, in closed form through
the eigenbases of both sides. After (1) each map column is rescaled to unit mean L2 norm over its
variants (the traces absorb the scale), as the reference normalises A. The fit stops when the
relative change of J falls to ``tol``, and only once at least ``min_iter`` outer iterations have run
and ``reprozoo.claims.plateau`` (the convergence gate's own test) calls the curve flat.

The penalties are given dimensionless: lam1 and lam_sim as fractions of the data term's curvature
in each block (||Y_S||_F^2 / P over the block's trials S), lam_s per unit map norm.

Initialisation uses the labels too. Start 0: category c's maps from the leading left singular
vectors of the label-value contrasts (mean over trials with l_c = v, minus the mean over v),
which carry the components that category c modulates. Start 1 (three stages): a label-blind fit
of the same model (one map per component), each of its components assigned to the category whose
labels explain most of its trace variance (eta^2, P_c slots per category), then the full
label-driven fit from there. Further starts are random non-negative maps. The fit with the lowest
J is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class MilcciFit:
    maps: list[np.ndarray]           # maps[c]: (V_c, N, P_c), non-negative
    Phi: np.ndarray                  # (M, T, P) traces of the fitted trials
    comps: tuple[int, ...]           # P_c
    lam_s: float
    nonneg_traces: bool = True
    objective: list[float] = field(default_factory=list)  # J after each outer iteration

    @property
    def comp_category(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.comps)), self.comps)

    def trial_maps(self, labels: np.ndarray) -> np.ndarray:
        """(M, N, P) maps A_m of trials with the given (M, C) labels."""
        return np.stack([np.concatenate([self.maps[c][lab[c]] for c in range(len(self.comps))], axis=1)
                         for lab in np.atleast_2d(labels)])


def difference_eig(T: int):
    """Eigen-decomposition of D^T D for the first-difference operator D ((T-1) x T)."""
    D = np.diff(np.eye(T), axis=0)
    mu, V = np.linalg.eigh(D.T @ D)
    return np.clip(mu, 0.0, None), V


def smooth_traces(A: np.ndarray, Y: np.ndarray, lam_s: float, eig, ridge: float = 1e-8) -> np.ndarray:
    """argmin_Phi 1/2 ||Y - A Phi^T||^2 + lam_s/2 ||D Phi||^2 for Y of shape (..., N, T): (..., T, P).

    Sylvester equation (A^T A) X + lam_s X D^T D = A^T Y with X = Phi^T, solved in the eigenbases
    U of A^T A (eigenvalues s) and V of D^T D (eigenvalues mu): X = U [(U^T A^T Y V) / (s + lam_s mu)] V^T.
    """
    mu, V = eig
    s, U = np.linalg.eigh(A.T @ A)
    s = np.clip(s, 0.0, None) + ridge
    B = U.T @ (A.T @ Y) @ V
    X = U @ (B / (s[:, None] + lam_s * mu[None, :])) @ V.T
    return np.swapaxes(X, -1, -2)


def nonneg_smooth_traces(A: np.ndarray, Y: np.ndarray, lam_s: float, Phi0: np.ndarray, n_iter: int) -> np.ndarray:
    """FISTA for min_{Phi >= 0} 1/2 ||Y - A Phi^T||^2 + lam_s/2 ||D Phi||^2, Y (..., N, T), Phi0 (..., T, P).

    Gradient in X = Phi^T: (A^T A) X - A^T Y + lam_s X D^T D; Lipschitz constant
    lambda_max(A^T A) + 4 lam_s (||D^T D|| <= 4).
    """
    G, B = A.T @ A, A.T @ Y
    L = float(np.linalg.eigvalsh(G)[-1]) + 4.0 * lam_s + 1e-12
    X = np.swapaxes(Phi0, -1, -2).copy()
    Z, t = X.copy(), 1.0

    def dtd(Xz):  # X D^T D along time without forming D
        d = np.diff(Xz, axis=-1)
        out = np.zeros_like(Xz)
        out[..., :-1] -= d
        out[..., 1:] += d
        return out

    for _ in range(n_iter):
        X_new = np.maximum(0.0, Z - (G @ Z - B + lam_s * dtd(Z)) / L)
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        Z = X_new + ((t - 1.0) / t_new) * (X_new - X)
        X, t = X_new, t_new
    return np.swapaxes(X, -1, -2)


def nonneg_lasso(H: np.ndarray, K: np.ndarray, lam1: float, A0: np.ndarray, n_iter: int) -> np.ndarray:
    """FISTA for min_{A >= 0} 1/2 tr(A H A^T) - tr(A^T K) + lam1 sum(A)  (H symmetric PSD)."""
    L = float(np.linalg.eigvalsh(H)[-1]) + 1e-12
    A, Z, t = A0.copy(), A0.copy(), 1.0
    for _ in range(n_iter):
        A_new = np.maximum(0.0, Z - (Z @ H - K + lam1) / L)
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        Z = A_new + ((t - 1.0) / t_new) * (A_new - A)
        A, t = A_new, t_new
    return A


def similarity_weights(V: int, ordinal: bool, width: float = 1.0) -> np.ndarray:
    """w_{vv'} (V x V), zero diagonal, rows summing to 1 (nominal: uniform; ordinal: Gaussian in |v-v'|)."""
    if V == 1:
        return np.zeros((1, 1))
    d = np.abs(np.arange(V)[:, None] - np.arange(V)[None, :]).astype(float)
    w = np.exp(-0.5 * (d / width) ** 2) if ordinal else np.ones((V, V))
    np.fill_diagonal(w, 0.0)
    return w / w.sum(1, keepdims=True)


def contrast_init(Y: np.ndarray, labels: np.ndarray, n_values, comps) -> list[np.ndarray]:
    """Category c's maps from the leading left singular vectors of its label-value contrasts."""
    maps = []
    for c, (V, Pc) in enumerate(zip(n_values, comps)):
        means = np.stack([Y[labels[:, c] == v].mean(0) for v in range(V)])  # (V, N, T)
        if V > 1:
            means = means - means.mean(0, keepdims=True)
        U, S, _ = np.linalg.svd(np.concatenate(list(means), axis=1), full_matrices=False)
        A = np.abs(U[:, :Pc]) * S[:Pc]
        A /= np.linalg.norm(A, axis=0, keepdims=True) + 1e-12
        maps.append(np.repeat(A[None], V, axis=0))
    return maps


def label_variance_share(Phi: np.ndarray, labels: np.ndarray, n_values) -> np.ndarray:
    """eta^2[p, c]: share of component p's cross-trial trace variance (about the mean trace over
    all trials) explained by the mean trace of each value of category c."""
    M, T, P = Phi.shape
    eta = np.zeros((P, len(n_values)))
    grand = Phi.mean(0, keepdims=True)
    total = np.sum((Phi - grand) ** 2, axis=(0, 1)) + 1e-300
    for c, V in enumerate(n_values):
        fitted = np.zeros_like(Phi)
        for v in range(V):
            sel = labels[:, c] == v
            fitted[sel] = Phi[sel].mean(0, keepdims=True)
        eta[:, c] = np.sum((fitted - grand) ** 2, axis=(0, 1)) / total
    return eta


def blind_init(Y: np.ndarray, labels: np.ndarray, n_values, comps, lam1, lam_s, n_iter, inner_iter, tol,
               nonneg_traces, min_iter: int = 20) -> list[np.ndarray]:
    """Label-blind fit (one map per component), then each component to the category whose labels
    explain most of its trace variance (assignment with P_c slots per category)."""
    from scipy.optimize import linear_sum_assignment

    P = int(sum(comps))
    ones = np.zeros((len(Y), 1), dtype=int)
    A0 = contrast_init(Y, ones, (1,), (P,))
    blind = _fit_once(Y, ones, (1,), (P,), A0, lam1, 0.0, lam_s, n_iter, inner_iter, (False,), tol, nonneg_traces,
                      min_iter)
    eta = label_variance_share(blind.Phi, labels, n_values)
    slot_category = np.repeat(np.arange(len(comps)), comps)
    rows, cols = linear_sum_assignment(-eta[:, slot_category])        # component row -> slot col
    order = rows[np.argsort(cols)]                                     # component in each slot
    A = blind.maps[0][0][:, order]
    bounds = np.concatenate([[0], np.cumsum(comps)])
    return [np.repeat(A[None, :, bounds[c]:bounds[c + 1]], V, axis=0) for c, V in enumerate(n_values)]


def _blocks(labels: np.ndarray, n_values):
    return [[np.flatnonzero(labels[:, c] == v) for v in range(V)] for c, V in enumerate(n_values)]


def objective(Y, labels, fit: MilcciFit, lam1_blocks, lam_sim_blocks, weights, D) -> float:
    A_m = fit.trial_maps(labels)
    r = Y - np.einsum("mnp,mtp->mnt", A_m, fit.Phi)
    J = 0.5 * float(np.sum(r**2)) + 0.5 * fit.lam_s * float(np.sum((D @ fit.Phi) ** 2))
    for c, Ac in enumerate(fit.maps):
        for v in range(len(Ac)):
            J += lam1_blocks[c][v] * float(Ac[v].sum())
            for u in range(len(Ac)):
                J += 0.25 * lam_sim_blocks[c][v] * weights[c][v, u] * float(np.sum((Ac[v] - Ac[u]) ** 2))
    return J


def _fit_once(Y, labels, n_values, comps, maps, lam1, lam_sim, lam_s, n_iter, inner_iter, ordinal, tol,
              nonneg_traces, min_iter: int = 20):
    from reprozoo.claims import plateau

    M, N, T = Y.shape
    C = len(comps)
    slots = np.split(np.arange(sum(comps)), np.cumsum(comps)[:-1])
    eig = difference_eig(T)
    D = np.diff(np.eye(T), axis=0)
    blocks = _blocks(labels, n_values)
    P = sum(comps)
    h = [[float(np.sum(Y[S] ** 2)) / P for S in bl] for bl in blocks]  # data curvature scale per block
    lam1_b = [[lam1 * x for x in hc] for hc in h]
    lam_sim_b = [[lam_sim * x for x in hc] for hc in h]
    weights = [similarity_weights(V, bool(ordinal[c])) for c, V in enumerate(n_values)]
    fit = MilcciFit([a.copy() for a in maps], np.zeros((M, T, P)), tuple(comps), lam_s, nonneg_traces)

    def update_traces(first=False):
        A_m = fit.trial_maps(labels)
        for k in np.unique(labels, axis=0):
            idx = np.flatnonzero((labels == k).all(1))
            if first or not nonneg_traces:
                fit.Phi[idx] = smooth_traces(A_m[idx[0]], Y[idx], lam_s, eig)
                if nonneg_traces:
                    fit.Phi[idx] = np.maximum(fit.Phi[idx], 0.0)
            else:
                fit.Phi[idx] = nonneg_smooth_traces(A_m[idx[0]], Y[idx], lam_s, fit.Phi[idx], inner_iter)

    update_traces(first=True)
    for it in range(n_iter):
        for c in range(C):
            sl = slots[c]
            others = np.setdiff1d(np.arange(P), sl)
            A_m = fit.trial_maps(labels)
            R = Y - np.einsum("mnp,mtp->mnt", A_m[:, :, others], fit.Phi[:, :, others])
            for v, S in enumerate(blocks[c]):
                Ph = fit.Phi[S][:, :, sl]                       # (|S|, T, P_c)
                H = np.einsum("mtp,mtq->pq", Ph, Ph)
                K = np.einsum("mnt,mtp->np", R[S], Ph)
                pull = lam_sim_b[c][v] * weights[c][v].sum()
                if pull > 0:
                    H = H + pull * np.eye(len(sl))
                    K = K + lam_sim_b[c][v] * np.einsum("u,unp->np", weights[c][v], fit.maps[c])
                fit.maps[c][v] = nonneg_lasso(H, K, lam1_b[c][v], fit.maps[c][v], inner_iter)
            # unit mean L2 norm per component over its variants; the traces take the scale
            scale = np.linalg.norm(fit.maps[c], axis=1).mean(0) + 1e-12   # (P_c,)
            fit.maps[c] /= scale[None, None, :]
            fit.Phi[:, :, sl] *= scale[None, None, :]
        update_traces()
        fit.objective.append(objective(Y, labels, fit, lam1_b, lam_sim_b, weights, D))
        # stop on the tolerance, but only once the platform's own plateau test (the convergence
        # gate's: flat over the last 30 % of at least min_iter >= 17 iterations) agrees
        if (it + 1 >= min_iter and abs(fit.objective[-2] - fit.objective[-1]) <= tol * abs(fit.objective[-1])
                and plateau(np.arange(1, it + 2), fit.objective)):
            break
    return fit


def fit_milcci(Y: np.ndarray, labels: np.ndarray, n_values, comps, *, lam1: float = 0.001,
               lam_sim: float = 0.01, lam_s: float = 1.0, n_iter: int = 100, inner_iter: int = 30,
               n_restarts: int = 3, ordinal=None, tol: float = 1e-6, seed: int = 0,
               use_labels: bool = True, nonneg_traces: bool = True, min_iter: int = 20) -> MilcciFit:
    """Fit MILCCI to Y (M, N, T) with labels (M, C); ``use_labels=False`` is the label-blind
    ablation (one category with one value: every trial shares the same P maps)."""
    labels = np.asarray(labels, dtype=int)
    if not use_labels:
        labels, n_values, comps = np.zeros((len(Y), 1), dtype=int), (1,), (int(sum(comps)),)
    n_values, comps = tuple(int(v) for v in n_values), tuple(int(p) for p in comps)
    ordinal = tuple(ordinal) if ordinal is not None else (False,) * len(comps)
    rng = np.random.default_rng(seed)
    N = Y.shape[1]
    best = None
    for r in range(n_restarts):
        if r == 0:
            maps = contrast_init(Y, labels, n_values, comps)
        elif r == 1 and len(comps) > 1:
            maps = blind_init(Y, labels, n_values, comps, lam1, lam_s, n_iter, inner_iter, tol, nonneg_traces,
                              min_iter)
        else:
            maps = []
            for V, Pc in zip(n_values, comps):
                A = rng.uniform(0.0, 1.0, (N, Pc))
                A /= np.linalg.norm(A, axis=0, keepdims=True)
                maps.append(np.repeat(A[None], V, axis=0))
        fit = _fit_once(Y, labels, n_values, comps, maps, lam1, lam_sim, lam_s, n_iter, inner_iter,
                        ordinal, tol, nonneg_traces, min_iter)
        if best is None or fit.objective[-1] < best.objective[-1]:
            best = fit
    return best


def predict_heldout(fit: MilcciFit, Y: np.ndarray, labels: np.ndarray, observed: np.ndarray,
                    use_labels: bool = True) -> np.ndarray:
    """Held-out trials (M', N, T): traces from the observed channels only (fixed maps of each
    trial's labels), prediction of every channel."""
    labels = np.asarray(labels, dtype=int) if use_labels else np.zeros((len(Y), 1), dtype=int)
    eig = difference_eig(Y.shape[2])
    A_m = fit.trial_maps(labels)
    out = np.empty_like(Y)
    for m in range(len(Y)):
        Phi = smooth_traces(A_m[m][observed], Y[m][observed], fit.lam_s, eig)
        if fit.nonneg_traces:
            Phi = nonneg_smooth_traces(A_m[m][observed], Y[m][observed], fit.lam_s, np.maximum(Phi, 0.0), 200)
        out[m] = A_m[m] @ Phi.T
    return out
