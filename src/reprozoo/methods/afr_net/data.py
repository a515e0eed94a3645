"""Synthetic cohort: modular structural connectomes, FC from a gated communication model on SC,
patients made by decoupling the gates of planted pathways from their SC and closing them by ``closing``
(SC's law unchanged; with ``closing = 0`` FC's law is unchanged too).

Why synthetic: the question AFR-Net answers ("which structural routes carry the functional
signal that separates two groups?") needs a ground truth for the routes, which no real cohort has.

Why the disease sits in routing, not in SC: AFR-Net's premise is that FC is not a fixed function of
SC; how strongly a structural edge carries signal (its gate) varies between subjects and states.
If FC were a fixed stochastic model on SC and patients differed in SC, there would be no SC-FC
mismatch for learned gates to capture (routing by SC alone would already be the true model). Here
SC has the same distribution in both groups; what differs is the routing of FC over it.

Generative model (all quantities dimensionless; time in units of the regional time constant):

* Template SC ``W`` (N x N, symmetric, zero diagonal): N regions in ``n_modules`` equal modules;
  an edge exists with probability ``p_in`` inside a module, ``p_out`` between modules; weights are
  log-normal, ``W_e = exp(weight_sigma * z)``, then scaled to mean 1 over the edges.
* Planted pathways: ``n_pathways`` node-disjoint paths ``v0 - v1 - ... - v_L`` that hop between
  modules (every second edge a bridge between two modules), edges added to the template with a
  strong weight (the template's 90th-percentile weight) so that they are real communication
  routes. The set of their edges is the ground truth for pathway recovery.
* Subject SC: ``S = W * exp(sc_noise * xi_e) * exp(global_noise * zeta)`` on the template's
  support (one edge set for the whole cohort, as after group-consensus thresholding). The same
  distribution for patients and controls.
* Communication gates (per subject, per edge): the effective coupling of edge e is
  ``G_e = W_e * exp(sc_noise * xi'_e) * exp(global_noise * zeta) * exp(gate_noise * nu_e)``: every
  subject routes through its SC with its own edge-wise gain (``gate_noise``: the SC-FC mismatch every
  subject has). In controls (and on unplanted edges) ``xi'_e = xi_e``, the edge's own SC deviation, so
  ``G_e = S_e * gain``. A patient (label 1) decouples the gates of the planted edges from their SC:
  ``xi'_e = rho xi_e + sqrt(1 - rho^2) xi''_e`` with a fresh standard normal ``xi''_e`` and
  ``rho = 1 - 2 k``, ``k = s * w_e``, severity ``s ~ U(s_min, s_max)`` per patient (k = 0.5: no
  coupling, k > 0.5: inverted). ``xi'_e`` is standard normal whatever rho is, so the law of the gates,
  and with it the law of FC, is the same in both groups, and so is the law of SC: the disease sits only
  in the SC-FC COUPLING of the planted edges. No model of FC alone or SC alone can beat chance; a
  model must read S_e and F_e jointly (AFR-Net's gate input). ``closing`` (issue 27: the gates change in
  patients while SC stays the same) also lowers a patient's planted gates, ``log G_e -= closing * k``,
  which moves FC itself: part of the disease becomes visible to models that read FC alone (the
  baselines), the coupling part stays for models that read S_e next to F_e. ``closing = 0`` is the
  pure-coupling cohort, where every network sat at chance (README). The share ``w_e`` of the severity that
  a planted edge takes is graded geometrically from 1 down to ``grade`` over the planted edges (order
  drawn at random): some routes are hit hard, others barely (a coupling t-test misses them, so
  pathway recovery is not at its ceiling).
* FC: the stationary covariance of the linear stochastic (Ornstein-Uhlenbeck) model on the gated
  coupling ``G``::

      dx = (-x + g G_hat x) dt + dW,   G_hat = G / lambda_max(G),   0 < g < 1 (stable)

  in closed form: the continuous Lyapunov equation ``A Sigma + Sigma A^T + I = 0`` with the
  symmetric ``A = -I + g G_hat`` gives ``Sigma = (2 (I - g G_hat))^{-1}``. A scan of finite length is
  ``n_samples`` independent draws from ``N(0, Sigma)`` (the sample covariance is Wishart); FC is
  their Pearson correlation, finite-sample noise included. The Euler-Maruyama simulation
  (:func:`ou_functional_connectivity`) gives the same correlation (tests); the closed form costs one
  inverse per subject instead of hundreds of steps, which buys a 1500-subject cohort.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Cohort:
    sc: np.ndarray            # (n, N, N) structural connectivity, zero off the support
    fc: np.ndarray            # (n, N, N) Pearson correlation, unit diagonal
    y: np.ndarray             # (n,) 0 control, 1 patient
    severity: np.ndarray      # (n,) s of each patient (0 for controls)
    edges: np.ndarray         # (E, 2) support edges i < j (shared by all subjects)
    planted: np.ndarray       # (E,) bool: edge belongs to a planted pathway
    modules: np.ndarray       # (N,) module of each region
    pathways: list            # list of node sequences

    def save(self, path) -> None:
        from ...io import save_npz

        lens = np.array([len(p) for p in self.pathways])
        save_npz(path, sc=self.sc.astype(np.float32), fc=self.fc.astype(np.float32), y=self.y,
                 severity=self.severity, edges=self.edges, planted=self.planted, modules=self.modules,
                 pathway_nodes=np.concatenate(self.pathways), pathway_lens=lens)

    @classmethod
    def load(cls, path) -> "Cohort":
        z = np.load(path)
        splits = np.cumsum(z["pathway_lens"])[:-1]
        return cls(z["sc"], z["fc"], z["y"], z["severity"], z["edges"], z["planted"], z["modules"],
                   [p for p in np.split(z["pathway_nodes"], splits)])


def modular_template(n_regions: int, n_modules: int, p_in: float, p_out: float, weight_sigma: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Template SC (symmetric, mean edge weight 1) and the module of each region."""
    modules = np.repeat(np.arange(n_modules), int(np.ceil(n_regions / n_modules)))[:n_regions]
    same = modules[:, None] == modules[None, :]
    prob = np.where(same, p_in, p_out)
    upper = np.triu(rng.random((n_regions, n_regions)) < prob, 1)
    w = np.where(upper, np.exp(weight_sigma * rng.standard_normal((n_regions, n_regions))), 0.0)
    w = w + w.T
    # connect every region at least to one module mate (no isolated nodes: the Laplacian stays rank N-1)
    for i in np.flatnonzero((w > 0).sum(1) == 0):
        j = rng.choice(np.flatnonzero(same[i] & (np.arange(n_regions) != i)))
        w[i, j] = w[j, i] = 1.0
    return w / w[w > 0].mean(), modules


def plant_pathways(w: np.ndarray, modules: np.ndarray, n_pathways: int, path_edges: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, list]:
    """Add ``n_pathways`` node-disjoint inter-module paths of ``path_edges`` edges to ``w``.

    Path nodes go two per module (v0, v1 in module a; v2, v3 in module b; ...), so edges alternate
    within-module / bridge; the modules visited are distinct and drawn at random. Planted edges get
    the template's 90th-percentile weight (strong routes).
    """
    w = w.copy()
    n_mod = int(modules.max()) + 1
    strong = float(np.quantile(w[w > 0], 0.9))
    used: set[int] = set()
    pathways = []
    for _ in range(n_pathways):
        n_nodes = path_edges + 1
        mods = rng.permutation(n_mod)[: int(np.ceil(n_nodes / 2))]
        if len(mods) * 2 < n_nodes:
            raise ValueError(f"{n_mod} modules cannot host a pathway of {path_edges} edges (two nodes per module)")
        nodes = []
        for k in range(n_nodes):
            free = [i for i in np.flatnonzero(modules == mods[k // 2]) if i not in used]
            v = int(rng.choice(free))
            used.add(v)
            nodes.append(v)
        for a, b in zip(nodes[:-1], nodes[1:]):
            w[a, b] = w[b, a] = strong
        pathways.append(np.array(nodes))
    return w, pathways


def ou_functional_connectivity(sc: np.ndarray, coupling: float, dt: float, n_steps: int, burn_in: int,
                               rng: np.random.Generator) -> np.ndarray:
    """Pearson FC of the linear stochastic model on each coupling matrix in the batch ``sc`` (n, N, N)
    (the gated coupling ``G`` in :func:`make_cohort`)."""
    n, N, _ = sc.shape
    lam = np.linalg.eigvalsh(sc)[:, -1]                       # spectral radius (SC is non-negative)
    a = coupling * sc / lam[:, None, None]
    x = rng.standard_normal((n, N))
    traj = np.empty((n, n_steps, N))
    drift = np.eye(N)[None] * (1.0 - dt) + dt * a             # x_{t+dt} = drift x_t + sqrt(dt) eta
    drift_t = drift.transpose(0, 2, 1).copy()
    sq = np.sqrt(dt)
    for t in range(burn_in + n_steps):
        x = np.matmul(x[:, None, :], drift_t)[:, 0] + sq * rng.standard_normal((n, N))
        if t >= burn_in:
            traj[:, t - burn_in] = x
    traj -= traj.mean(1, keepdims=True)
    cov = np.matmul(traj.transpose(0, 2, 1), traj) / n_steps
    sd = np.sqrt(np.einsum("bii->bi", cov))
    fc = cov / (sd[:, :, None] * sd[:, None, :])
    fc[:, np.arange(N), np.arange(N)] = 1.0
    return fc


def stationary_covariance(G: np.ndarray, coupling: float) -> np.ndarray:
    """Sigma = (2 (I - g G / lambda_max(G)))^{-1}, the OU model's stationary covariance, batch (n, N, N)."""
    import torch

    Gt = torch.as_tensor(G, dtype=torch.float64)
    lam = torch.linalg.eigvalsh(Gt)[:, -1]
    eye = torch.eye(Gt.shape[-1], dtype=torch.float64)
    return torch.linalg.inv(2.0 * (eye - coupling * Gt / lam[:, None, None])).numpy()


def lyapunov_wishart_fc(G: np.ndarray, coupling: float, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Pearson FC of ``n_samples`` independent draws from the stationary covariance of the OU model on
    each gated coupling in the batch ``G`` (n, N, N)."""
    import torch

    L = torch.linalg.cholesky(torch.as_tensor(stationary_covariance(G, coupling)))
    n, N, _ = G.shape
    out = np.empty((n, N, N))
    for s in range(0, n, 250):                                        # bounded memory
        Z = torch.as_tensor(rng.standard_normal((min(250, n - s), n_samples, N)))
        X = Z @ L[s:s + 250].transpose(1, 2)
        X = X - X.mean(1, keepdim=True)
        C = X.transpose(1, 2) @ X
        sd = torch.sqrt(torch.diagonal(C, dim1=1, dim2=2))
        out[s:s + 250] = (C / (sd[:, :, None] * sd[:, None, :])).numpy()
    out[:, np.arange(N), np.arange(N)] = 1.0
    return out


def couple(xi: np.ndarray, rho, rng: np.random.Generator) -> np.ndarray:
    """``rho xi + sqrt(1 - rho^2) xi''`` with a fresh standard normal ``xi''``: for standard normal ``xi``
    a standard normal whatever ``rho`` in [-1, 1] is (the marginal is kept), with correlation ``rho`` to
    ``xi`` (the coupling moves)."""
    rho = np.broadcast_to(np.asarray(rho, float), xi.shape)
    if np.any(np.abs(rho) > 1):
        raise ValueError("coupling rho must lie in [-1, 1] (severity x share <= 1)")
    return rho * xi + np.sqrt(1.0 - rho ** 2) * rng.standard_normal(xi.shape)


def make_cohort(rng: np.random.Generator, n_subjects: int, n_regions: int, n_modules: int, p_in: float,
                p_out: float, weight_sigma: float, n_pathways: int, path_edges: int, sc_noise: float,
                global_noise: float, gate_noise: float, severity: tuple, coupling: float, n_samples: int,
                grade: float = 1.0, closing: float = 0.0) -> Cohort:
    """Draw the whole cohort (half controls, half patients, label order shuffled)."""
    w0, modules = modular_template(n_regions, n_modules, p_in, p_out, weight_sigma, rng)
    w, pathways = plant_pathways(w0, modules, n_pathways, path_edges, rng)
    iu = np.triu_indices(n_regions, 1)
    on = w[iu] > 0
    edges = np.stack([iu[0][on], iu[1][on]], 1)
    planted_set = {tuple(sorted((int(a), int(b)))) for p in pathways for a, b in zip(p[:-1], p[1:])}
    planted = np.array([(int(i), int(j)) in planted_set for i, j in edges])

    y = rng.permutation(np.arange(n_subjects) % 2)
    sev = np.where(y == 1, rng.uniform(severity[0], severity[1], n_subjects), 0.0)
    we = w[edges[:, 0], edges[:, 1]]
    xi = rng.standard_normal((n_subjects, len(edges)))               # edge-wise SC deviation (z units)
    glob = np.exp(global_noise * rng.standard_normal((n_subjects, 1)))
    s_e = we[None] * np.exp(sc_noise * xi) * glob                    # SC: no group difference
    gain = np.exp(gate_noise * rng.standard_normal((n_subjects, len(edges))))
    share = np.zeros(len(edges))
    share[np.flatnonzero(planted)] = rng.permutation(np.geomspace(1.0, grade, int(planted.sum())))
    # SC-FC coupling of each edge: the gate follows the edge's own SC deviation with correlation
    # rho = 1 - 2 k, k = severity x share (controls and unplanted edges: rho = 1, G_e = S_e x gain);
    # the rest is a fresh deviation of the same size, so the gate's marginal (and the joint law of all
    # gates, hence of FC) is the same in both groups: only the pairing of S_e with G_e differs
    xi_g = couple(xi, 1.0 - 2.0 * sev[:, None] * share[None], rng)
    # the patient's planted gates also close: log G_e drops by closing x k (0 in controls and on unplanted
    # edges), which moves FC itself, so that the disease is visible to FC-reading models (issue 27: the
    # gates change in patients while SC stays the same; closing = 0 keeps the pure-coupling cohort)
    g_e = we[None] * np.exp(sc_noise * xi_g - closing * sev[:, None] * share[None]) * glob * gain
    sc = np.zeros((n_subjects, n_regions, n_regions))
    sc[:, edges[:, 0], edges[:, 1]] = s_e
    sc = sc + sc.transpose(0, 2, 1)
    G = np.zeros_like(sc)
    G[:, edges[:, 0], edges[:, 1]] = g_e
    G = G + G.transpose(0, 2, 1)
    fc = lyapunov_wishart_fc(G, coupling, n_samples, rng)
    return Cohort(sc, fc, y, sev, edges, planted, modules, pathways)


def split_indices(y: np.ndarray, fractions: tuple, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Stratified train / val / test split (fractions of each class)."""
    out = {"train": [], "val": [], "test": []}
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_tr = int(round(fractions[0] * len(idx)))
        n_va = int(round(fractions[1] * len(idx)))
        out["train"].append(idx[:n_tr])
        out["val"].append(idx[n_tr:n_tr + n_va])
        out["test"].append(idx[n_tr + n_va:])
    return {k: np.sort(np.concatenate(v)) for k, v in out.items()}


def load_cohort_file(path, consensus: float = 0.5) -> Cohort:
    """A real cohort from an .npz with ``sc`` (n, N, N), ``fc`` (n, N, N) and ``y`` (n,).

    Edges: the group-consensus support (SC > 0 in at least ``consensus`` of the subjects); SC off
    that support is set to 0 so that every subject shares one edge list. No planted pathways.
    """
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"cohort file {path} not found: point the paper config's source.path at an .npz "
                                "with sc (n, N, N), fc (n, N, N) and y (n,) (e.g. HCP / ABIDE connectomes)")
    z = np.load(path)
    sc, fc, y = np.asarray(z["sc"], float), np.asarray(z["fc"], float), np.asarray(z["y"]).astype(int)
    sc = 0.5 * (sc + sc.transpose(0, 2, 1))
    n, N, _ = sc.shape
    keep = np.triu((sc > 0).mean(0) >= consensus, 1)
    sc = np.where((keep | keep.T)[None], sc, 0.0)
    sc = sc / sc[:, keep].mean()                                      # mean edge weight 1, as drawn
    edges = np.argwhere(keep)
    return Cohort(sc, fc, y, np.zeros(n), edges, np.zeros(len(edges), bool), np.zeros(N, int), [])
