"""Scores against the planted components: matched correlation, label structure, held-out R^2.

Matching. A component is a map and its traces. For estimated component p and planted q,
S_map[p, q] = mean over conditions k of |corr(A_hat_k[:, p], A_k[:, q])| and
S_trace[p, q] = mean over trials m of |corr(Phi_hat_m[:, p], Phi_m[:, q])|; one permutation,
the Hungarian assignment maximising S_map + S_trace, pairs them for all conditions and trials.
A method with one map per component (PCA, NMF, CP, the label-blind ablation) is scored with
that map in every condition.

``map_corr_percond``: the same map score with a separate matching in each condition (the maps
alone), generous to methods whose conditions were fitted separately (per-condition NMF).

Per-category structure (MILCCI variants only). ``category_acc``: the fraction of matched pairs
whose estimated component sits in the category that drives the planted one. ``label_effect_corr``:
for an estimated component of category c matched to a planted component of category c, the
correlation between its label-driven map adjustments a_hat_v - mean_v a_hat_v (maps scaled to unit
sum) and the planted ones, over all channels and label values of c; a pair whose categories
differ scores 0. Mean over components.

Held-out R^2: 1 - SS_res / SS_tot on the channels the held-out trials' traces were NOT fitted on
(SS_tot about each channel's mean over time in that trial).
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def abs_corr(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """|Pearson correlation| between the columns of X (n, p) and Y (n, q); 0 for a constant column."""
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    nx, ny = np.linalg.norm(Xc, axis=0), np.linalg.norm(Yc, axis=0)
    C = (Xc.T @ Yc) / np.maximum(np.outer(nx, ny), 1e-300)
    C[nx < 1e-12, :] = 0.0
    C[:, ny < 1e-12] = 0.0
    return np.abs(C)


def match(maps_hat: np.ndarray, A_true: np.ndarray, Phi_hat: np.ndarray, Phi_true: np.ndarray):
    """maps_hat, A_true: (K, N, P); Phi_hat, Phi_true: (M, T, P). Returns perm (estimated index of
    each planted component), matched map correlation, matched trace correlation."""
    S_map = np.mean([abs_corr(maps_hat[k], A_true[k]) for k in range(len(A_true))], axis=0)
    S_tr = np.mean([abs_corr(Phi_hat[m], Phi_true[m]) for m in range(len(Phi_true))], axis=0)
    rows, cols = linear_sum_assignment(-(S_map + S_tr))
    perm = np.empty(A_true.shape[2], dtype=int)
    perm[cols] = rows
    q = np.arange(A_true.shape[2])
    return perm, float(S_map[perm, q].mean()), float(S_tr[perm, q].mean())


def map_corr_per_condition(maps_hat: np.ndarray, A_true: np.ndarray) -> float:
    """Mean over conditions k of the matched |corr| of the maps with condition k's own Hungarian
    matching (maps only): no common component order across conditions is asked for. Scores the
    per-condition NMF, whose separate fits have no common order, and every other method the same way."""
    vals = []
    for k in range(len(A_true)):
        S = abs_corr(maps_hat[k], A_true[k])
        rows, cols = linear_sum_assignment(-S)
        vals.append(S[rows, cols].mean())
    return float(np.mean(vals))


def per_category_structure(maps_by_value: list[np.ndarray], comp_category_hat: np.ndarray, perm: np.ndarray,
                           A_true: np.ndarray, conditions: np.ndarray, comp_category: np.ndarray):
    """maps_by_value[c]: (V_c, N, P_c) estimated variants. Returns (category_acc, label_effect_corr)."""
    offsets = np.concatenate([[0], np.cumsum([m.shape[2] for m in maps_by_value])])
    hits, effects = [], []
    for q, p in enumerate(perm):
        c_hat, c_true = int(comp_category_hat[p]), int(comp_category[q])
        hits.append(c_hat == c_true)
        if c_hat != c_true:
            effects.append(0.0)
            continue
        V = maps_by_value[c_hat].shape[0]
        est = maps_by_value[c_hat][:, :, p - offsets[c_hat]]                       # (V, N)
        tru = np.stack([A_true[np.flatnonzero(conditions[:, c_true] == v)[0], :, q] for v in range(V)])
        est = est / np.maximum(est.sum(1, keepdims=True), 1e-12)
        tru = tru / np.maximum(tru.sum(1, keepdims=True), 1e-12)
        d_est, d_tru = (est - est.mean(0)).ravel(), (tru - tru.mean(0)).ravel()
        if np.linalg.norm(d_est) < 1e-12 or np.linalg.norm(d_tru) < 1e-12:
            effects.append(0.0)
        else:
            effects.append(float(np.corrcoef(d_est, d_tru)[0, 1]))
    return float(np.mean(hits)), float(np.mean(effects))


def heldout_r2(Y: np.ndarray, Y_hat: np.ndarray, hidden: np.ndarray) -> float:
    y, yh = Y[:, hidden], Y_hat[:, hidden]
    ss_res = float(np.sum((y - yh) ** 2))
    ss_tot = float(np.sum((y - y.mean(2, keepdims=True)) ** 2))
    return 1.0 - ss_res / ss_tot
