"""Paper-style multi-trial generator with planted, label-driven components.

Why a generator of our own: MILCCI's synthetic example (Mudrik et al. 2026, and the public
reference's ``generate_synthetic_data``) plants components whose spatial maps depend on the
label of ONE category each and whose temporal traces vary from trial to trial. We rebuild that
setting so every recovered quantity has a ground truth.

Model (trial m, N channels x T time bins, C label categories, category c with V_c values and
P_c components, P = sum_c P_c):

    Y_m = sum_c A^c_{l_c(m)} Phi^c_m^T + sigma * E_m,      E_m ~ N(0, 1) iid

- ``A^c_v`` (N x P_c, non-negative, sparse): the maps of category c's components when the trial
  has value v in category c. Each component has a base map (random support of ``support * N``
  channels, weights U(0.5, 1.5)); each label value swaps a fraction ``variant_swap`` of that
  support for other channels and jitters the weights by ``variant_jitter`` (the "subtle
  label-driven adjustment in component composition").
- ``Phi^c_m`` (T x P_c): softplus(1.5 g), g = GP_v(t) + ``gp_sigma`` GP_m(t), squared-exponential
  Gaussian processes of length scale ``gp_length`` (time in [0, 1]): trials sharing category c's
  value share the mean trace, and every trial varies around it (cross-trial variability).

Trials are ordered by condition (one condition = one tuple of label values; all tuples present,
``trials_per_condition`` each).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


@dataclass
class MultiTrialData:
    Y: np.ndarray              # (M, N, T) observations
    labels: np.ndarray         # (M, C) label value per category
    cond: np.ndarray           # (M,) condition index into `conditions`
    conditions: np.ndarray     # (K, C) label tuple of each condition
    A_true: np.ndarray         # (K, N, P) planted maps per condition
    Phi_true: np.ndarray       # (M, T, P) planted traces per trial
    comp_category: np.ndarray  # (P,) category that drives each planted component
    n_values: tuple[int, ...]  # V_c per category

    def subset(self, trials: np.ndarray) -> "MultiTrialData":
        return MultiTrialData(self.Y[trials], self.labels[trials], self.cond[trials], self.conditions,
                              self.A_true, self.Phi_true[trials], self.comp_category, self.n_values)

    def save(self, path) -> None:
        np.savez(path, Y=self.Y, labels=self.labels, cond=self.cond, conditions=self.conditions,
                 A_true=self.A_true, Phi_true=self.Phi_true, comp_category=self.comp_category,
                 n_values=np.asarray(self.n_values))

    @classmethod
    def load(cls, path) -> "MultiTrialData":
        z = np.load(path)
        return cls(z["Y"], z["labels"], z["cond"], z["conditions"], z["A_true"], z["Phi_true"],
                   z["comp_category"], tuple(int(v) for v in z["n_values"]))


def gp_samples(rng: np.random.Generator, n: int, t: np.ndarray, length: float) -> np.ndarray:
    """n draws (n, T) of a zero-mean unit-variance squared-exponential GP on the grid t."""
    K = np.exp(-0.5 * (t[:, None] - t[None, :]) ** 2 / length**2)
    L = np.linalg.cholesky(K + 1e-6 * np.eye(len(t)))
    return rng.standard_normal((n, len(t))) @ L.T


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _variant_map(rng, base: np.ndarray, swap: float, jitter: float) -> np.ndarray:
    """Label-value variant of a sparse map: swap part of the support, jitter the weights."""
    on = np.flatnonzero(base > 0)
    off = np.flatnonzero(base == 0)
    n_swap = int(round(swap * len(on)))
    a = base.copy()
    if n_swap and len(off) >= n_swap:
        drop = rng.choice(on, n_swap, replace=False)
        add = rng.choice(off, n_swap, replace=False)
        a[add] = a[drop]
        a[drop] = 0.0
    return np.where(a > 0, a * np.clip(1.0 + jitter * rng.standard_normal(a.shape), 0.3, None), 0.0)


def make_dataset(rng: np.random.Generator, n_channels: int = 30, n_time: int = 80,
                 n_values=(3, 2), comps_per_category=(2, 2), trials_per_condition: int = 4,
                 support: float = 0.3, variant_swap: float = 0.2, variant_jitter: float = 0.2,
                 gp_length: float = 0.15, gp_sigma: float = 0.25, noise_std: float = 0.2) -> MultiTrialData:
    n_values, comps_per_category = tuple(n_values), tuple(comps_per_category)
    C, P = len(n_values), int(sum(comps_per_category))
    comp_category = np.repeat(np.arange(C), comps_per_category)
    t = np.linspace(0.0, 1.0, n_time)
    k_on = max(2, int(round(support * n_channels)))

    maps = []  # maps[p][v]: (N,) map of component p at value v of its category
    mean_traces = []  # mean_traces[p][v]: (T,) GP mean trace of component p at value v
    for p in range(P):
        base = np.zeros(n_channels)
        base[rng.choice(n_channels, k_on, replace=False)] = rng.uniform(0.5, 1.5, k_on)
        V = n_values[comp_category[p]]
        maps.append([_variant_map(rng, base, variant_swap, variant_jitter) for _ in range(V)])
        mean_traces.append(gp_samples(rng, V, t, gp_length))

    conditions = np.array(list(itertools.product(*[range(v) for v in n_values])), dtype=int)
    K = len(conditions)
    A_true = np.zeros((K, n_channels, P))
    for k, tup in enumerate(conditions):
        for p in range(P):
            A_true[k, :, p] = maps[p][tup[comp_category[p]]]

    cond = np.repeat(np.arange(K), trials_per_condition)
    labels = conditions[cond]
    M = len(cond)
    Phi = np.zeros((M, n_time, P))
    for p in range(P):
        dev = gp_samples(rng, M, t, gp_length)
        for m in range(M):
            g = mean_traces[p][labels[m, comp_category[p]]] + gp_sigma * dev[m]
            Phi[m, :, p] = softplus(1.5 * g)
    clean = np.einsum("mnp,mtp->mnt", A_true[cond], Phi)
    Y = clean + noise_std * rng.standard_normal(clean.shape)
    return MultiTrialData(Y, labels, cond, conditions, A_true, Phi, comp_category, n_values)
