"""Adaptive flow routing: information load of each structural edge from an electrical-network model.

The physics (AFR-Net's communication model). Regions are nodes, structural edges e = (u, v) are
resistors of conductance

    g_e = exp(-c_e + theta * a_e) = (S_e + eps) * exp(theta * a_e),   c_e = -log(S_e + eps)

where c_e is the structural cost of the edge and a_e in [0, 1] is a learned gate (``theta`` sets how
far learning may re-route). Sending a unit of information from region i to region j is a unit
current injected at i and extracted at j. Kirchhoff's laws give the node potentials

    L_g phi = e_i - e_j,   L_g = B^T diag(g) B      (B: E x N signed incidence matrix)

and the edge currents f_e = g_e (B phi)_e. L_g is singular (constants are in its null space); we
solve with L_g + 11^T / N, which is invertible and gives the same potential differences for any
right-hand side summing to zero (the paper adds a tiny ridge delta*I instead, which in float32 puts
an O(1/delta) constant into phi; this is the well-conditioned form of the same grounding).

How much traffic each pair exchanges is the demand

    M_ij = F_ij * K_ij,   K = sum_{h=2..H} rho^h A^h,   A = D^{-1} S   (row-normalised SC)

FC weighted by the multi-hop (>= 2 steps) walk kernel: direct neighbours are excluded, so the
demand is the functional coupling that must be *routed* through intermediate regions. The
information load of edge e is the demand-weighted magnitude of current

    L_e = sum_{i != j} M_ij |f_e^{(ij)}|     (|x| as the soft sqrt(x^2 + eps^2))

estimated, as in the paper, by drawing P pairs with probability |M_ij| / T (T = sum |M|) and
weighting each with sign(M_ij) T / P (unbiased). Self-pairs carry no current, so the diagonal of
M is dropped before sampling (same expectation, less variance). Loads are z-scored per subject
before they become the soft mask ``m = sigmoid(tau (L - t))``.

The published code (AFR-Net v1.0.1, ``dial/routing.py``) replaced the sampled loads by their closed form
(its "Route A", :func:`edge_energy`), which is what the model now uses: with the task Laplacian
``L_T = diag(T 1) - T`` of ``T = |sym F|`` (zero diagonal) and ``R = (L_g + 11^T/N)^{-1}``, the
energy an edge dissipates when every ordered pair (i, j) sends a unit current weighted by T_ij is

    E_e = sum_{i != j} T_ij (f_e^{(ij)})^2 / g_e = 2 g_e d_e^T R L_T R d_e      (d_e = row e of B)

(one inverse and one product for all pairs, no sampling noise). The published conductance is
``g_e = exp(a_e)`` with ``a_e`` the gate network's raw output (no sigmoid, no SC term: the gate reads
S_e and learns its own use of it). The mask (:func:`mask_from_energy`) is the published log-min-max
form with a structural cost: ``m_e = sigmoid(tau (mm(log E_e) - lambda_cost mm(-log S_e) - t))``,
mm = min-max over the subject's edges. A gate constant over the edges scales every energy by one
factor, which the min-max removes (tests): only the spread of the gates re-routes.
"""
from __future__ import annotations

import torch


def detour_kernel(S: torch.Tensor, hops: int = 5, rho: float = 0.6, eps: float = 1e-8) -> torch.Tensor:
    """K = sum_{h=2..hops} rho^h A^h with A the row-normalised S; S (..., N, N)."""
    A = S / (S.sum(-1, keepdim=True) + eps)
    power = A @ A
    K = torch.zeros_like(S)
    for h in range(2, hops + 1):
        K = K + rho**h * power
        if h < hops:
            power = power @ A
    return K


def incidence_matrix(edges: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """Signed incidence B (E, N): +1 at the edge's first node, -1 at its second."""
    E = len(edges)
    B = torch.zeros(E, n_nodes)
    B[torch.arange(E), edges[:, 0]] = 1.0
    B[torch.arange(E), edges[:, 1]] = -1.0
    return B


def grounded_laplacian(B: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """L_g + 11^T / N for conductances g (..., E): invertible on a connected graph."""
    n = B.shape[1]
    L = torch.einsum("en,...e,em->...nm", B, g, B)
    return L + 1.0 / n


def unit_flows(B: torch.Tensor, g: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Signed edge currents (..., E, P) for a unit current from pairs[..., 0, p] to pairs[..., 1, p].

    With R = (L_g + 11^T/N)^{-1}, the potentials of pair (i, j) are R[:, i] - R[:, j], so all
    pairs need one inverse and one product D = B R (E x N); the currents are g_e (D[e, i] - D[e, j]).
    """
    B64, g64 = B.to(torch.float64), g.to(torch.float64)                         # as in edge_energy
    D = B64 @ torch.linalg.inv(grounded_laplacian(B64, g64))                   # (..., E, N)
    E = D.shape[-2]
    take = lambda k: torch.gather(D, -1, pairs[..., k, :].unsqueeze(-2).expand(*D.shape[:-2], E, -1))
    return (g64.unsqueeze(-1) * (take(0) - take(1))).to(g.dtype)


def demand(S: torch.Tensor, F: torch.Tensor, hops: int = 5, rho: float = 0.6) -> torch.Tensor:
    """M = F * K with the diagonal removed (self-pairs route nothing)."""
    M = F * detour_kernel(S, hops, rho)
    return M * (1.0 - torch.eye(S.shape[-1], dtype=M.dtype, device=M.device))


def sample_pairs(M: torch.Tensor, n_pairs: int, generator: torch.Generator | None = None):
    """Pairs (b, 2, P) drawn with probability |M_ij| / T and their weights sign(M_ij) T / P."""
    b, n, _ = M.shape
    W = M.abs().reshape(b, -1)
    T = W.sum(-1, keepdim=True)
    idx = torch.multinomial(W / T, n_pairs, replacement=True, generator=generator)
    i, j = idx // n, idx % n
    alpha = torch.sign(torch.gather(M.reshape(b, -1), 1, idx)) * T / n_pairs
    return torch.stack([i, j], 1), alpha


def edge_loads(B: torch.Tensor, g: torch.Tensor, pairs: torch.Tensor, alpha: torch.Tensor,
               eps: float = 1e-6) -> torch.Tensor:
    """Raw loads (b, E): sum_p alpha_p * soft|f_e^{(p)}|."""
    f = unit_flows(B, g, pairs)
    return (torch.sqrt(f**2 + eps**2) * alpha.unsqueeze(-2)).sum(-1)


def exact_edge_loads(B: torch.Tensor, g: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """Every pair at once (for tests and small graphs): sum_{i,j} M_ij |f_e^{(ij)}|, shape (b, E)."""
    b, n, _ = M.shape
    ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    pairs = torch.stack([ii.reshape(-1), jj.reshape(-1)]).expand(b, 2, n * n)
    f = unit_flows(B, g, pairs)
    return (f.abs() * M.reshape(b, 1, -1)).sum(-1)


def standardize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """z-score along the last axis (per subject)."""
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps)


def task_laplacian(F: torch.Tensor) -> torch.Tensor:
    """L_T = diag(T 1) - T for T = |(F + F^T) / 2| with zero diagonal; F (..., N, N)."""
    T = (0.5 * (F + F.transpose(-1, -2))).abs()
    T = T * (1.0 - torch.eye(F.shape[-1], dtype=F.dtype, device=F.device))
    return torch.diag_embed(T.sum(-1)) - T


def edge_energy(B: torch.Tensor, g: torch.Tensor, F: torch.Tensor, scale: float = 100.0) -> torch.Tensor:
    """Closed-form routing energy per edge (..., E): 2 g_e d_e^T R L_T R d_e (times ``scale``, the
    published code's factor 100, which only sets the energies against the log's eps)."""
    # in float64 whatever the model's dtype: gates spread over e^+-20 (models.LOG_G_BOUND) leave L_g too
    # ill-conditioned for a float32 inverse (the 3-seed smoke at 940ef68 stopped on an exactly singular
    # float32 matrix once gates underflowed); the result returns in g's dtype
    B64, g64 = B.to(torch.float64), g.to(torch.float64)
    D = B64 @ torch.linalg.inv(grounded_laplacian(B64, g64))                    # (..., E, N): rows d_e^T R
    return (2.0 * scale * g64 * ((D @ task_laplacian(F.to(torch.float64))) * D).sum(-1)).to(g.dtype)


def minmax(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(x - min) / (max - min + eps) along the last axis (per subject)."""
    lo, hi = x.min(-1, keepdim=True).values, x.max(-1, keepdim=True).values
    return (x - lo) / (hi - lo + eps)


def mask_from_energy(E: torch.Tensor, S_e: torch.Tensor, tau: float, lambda_cost: float,
                     threshold: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """m_e = sigmoid(tau (mm(log E_e) - lambda_cost mm(-log S_e) - t)): high-energy, low-cost edges open."""
    e_norm = minmax(torch.log(E + eps), eps)
    c_norm = minmax(-torch.log(S_e + eps), eps)
    return torch.sigmoid(tau * (e_norm - lambda_cost * c_norm - threshold))
