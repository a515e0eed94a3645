"""AFR-Net (miniature) and the two baselines, all taking a batch of (SC, FC) matrices.

* :class:`AFRNet`: node encoder (transformer whose attention is restricted to SC neighbours, node
  features = FC row, log SC strength, FC absolute row sum, plus a learned ROI embedding) ->
  edge gates a_e = sigmoid(MLP[|h_u - h_v|, h_u * h_v, S_e, F_e]) -> flow routing
  (routing.py) -> information load L_e (z-scored) -> soft mask m_e = sigmoid(tau (L_e - t)) ->
  masked graph transformer (attention bias log m_e on SC edges, -inf elsewhere, 0 on the
  diagonal) -> mean pooling -> classifier. ``learn_gate=False`` fixes a_e = 0: routing by the
  structural conductances alone (ablation).
* :class:`MLPBaseline`: MLP on the concatenated upper triangles of SC and FC.

All three z-score their network inputs element-wise with the training subjects' mean and std (the
MLP's edge features, the node features of AFR-Net's encoder and of the GCN): one engineering trick,
given to every model. AFR-Net's routing itself uses the raw S and F (conductances, demand).
* :class:`GCNBaseline`: two Kipf-Welling graph convolutions on each subject's SC with the FC rows
  as node features, mean pooling, classifier. Dense and batched over subjects: the shared block
  ``blocks/gcn.py`` holds one fixed graph per model (a buffer built in numpy), while here every
  subject has its own SC and the saliency readout needs gradients through the normalisation.

Every model returns logits (b, 2) and a dict of auxiliary tensors (empty for the baselines).
"""
from __future__ import annotations

import torch
from torch import nn

from . import routing


class AFRNet(nn.Module):
    def __init__(self, n_regions: int, edges: torch.Tensor, d: int = 32, heads: int = 2, dropout: float = 0.1,
                 theta: float = 2.0, n_pairs: int = 128, tau: float = 8.0, learn_gate: bool = True,
                 eps: float = 1e-6, feat_mean: torch.Tensor | None = None, feat_std: torch.Tensor | None = None):
        super().__init__()
        self.n, self.heads, self.theta, self.n_pairs, self.tau = n_regions, heads, theta, n_pairs, tau
        self.learn_gate, self.eps = learn_gate, eps
        self.register_buffer("edges", edges.long())
        self.register_buffer("B", routing.incidence_matrix(edges.long(), n_regions))
        adj = torch.zeros(n_regions, n_regions, dtype=torch.bool)
        adj[edges[:, 0], edges[:, 1]] = True
        adj = adj | adj.T | torch.eye(n_regions, dtype=torch.bool)
        self.register_buffer("encoder_mask", ~adj)                    # True = attention not allowed
        self.register_buffer("feat_mean", torch.zeros(n_regions, n_regions + 2) if feat_mean is None else feat_mean)
        self.register_buffer("feat_std", torch.ones(n_regions, n_regions + 2) if feat_std is None else feat_std.clamp_min(1e-6))
        self.embed = nn.Linear(n_regions + 2, d)
        self.roi = nn.Embedding(n_regions, d)
        self.encoder = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout, batch_first=True)
        self.gate = nn.Sequential(nn.Linear(2 * d + 2, d), nn.SiLU(), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, 1))
        self.threshold = nn.Parameter(torch.zeros(()))
        self.graph = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout, batch_first=True)
        self.head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d, 2))

    @staticmethod
    def node_features(S: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
        """Raw node features (b, N, N + 2): FC row, log SC strength, mean |FC| of the row."""
        strength = torch.log1p(S.sum(-1, keepdim=True))
        return torch.cat([F, strength, F.abs().mean(-1, keepdim=True)], -1)

    def route(self, S: torch.Tensor, F: torch.Tensor, M: torch.Tensor, generator=None):
        """Node embeddings -> gates -> loads; returns (H, L (z-scored), L_raw, a, S_e)."""
        X = (self.node_features(S, F) - self.feat_mean) / self.feat_std
        H = self.embed(X) + self.roi.weight
        H = self.encoder(H, src_mask=self.encoder_mask)
        u, v = self.edges[:, 0], self.edges[:, 1]
        S_e, F_e = S[:, u, v], F[:, u, v]
        if self.learn_gate:
            hu, hv = H[:, u], H[:, v]
            feats = torch.cat([(hu - hv).abs(), hu * hv, S_e.unsqueeze(-1), F_e.unsqueeze(-1)], -1)
            a = torch.sigmoid(self.gate(feats)).squeeze(-1)
        else:
            a = torch.zeros_like(S_e)
        g = (S_e + self.eps) * torch.exp(self.theta * a)               # = exp(-c_e + theta a_e)
        pairs, alpha = routing.sample_pairs(M, self.n_pairs, generator)
        L_raw = routing.edge_loads(self.B, g, pairs, alpha, self.eps)
        return H, routing.standardize(L_raw), L_raw, a, S_e

    def forward(self, S, F, M, generator=None):
        H, L, L_raw, a, S_e = self.route(S, F, M, generator)
        m = torch.sigmoid(self.tau * (L - self.threshold))
        b = len(S)
        bias = torch.full((b, self.n, self.n), float("-inf"), device=S.device)
        u, v = self.edges[:, 0], self.edges[:, 1]
        logm = torch.log(m + 1e-9)
        bias[:, u, v] = logm
        bias[:, v, u] = logm
        bias[:, torch.arange(self.n), torch.arange(self.n)] = 0.0  # self-loops kept
        Z = self.graph(H, src_mask=bias.repeat_interleave(self.heads, 0))
        return self.head(Z.mean(1)), {"L": L, "m": m, "a": a, "S_e": S_e}


def afr_regularisers(aux: dict, eps: float = 1e-6) -> dict[str, torch.Tensor]:
    """The paper's auxiliary losses: load-mask alignment KL(softmax L || sg softmax log m), the
    structural budget mean(c_e m_e) with c_e = -log(S_e + eps), and gate sparsity mean(a_e)."""
    p = torch.log_softmax(aux["L"], -1)
    q = torch.log_softmax(torch.log(aux["m"] + eps), -1).detach()
    align = (p.exp() * (p - q)).sum(-1).mean()
    budget = (-torch.log(aux["S_e"] + eps) * aux["m"]).mean()
    return {"align": align, "budget": budget, "gate": aux["a"].abs().mean()}


def upper_triangle(X: torch.Tensor) -> torch.Tensor:
    n = X.shape[-1]
    iu = torch.triu_indices(n, n, 1, device=X.device)
    return X[..., iu[0], iu[1]]


class MLPBaseline(nn.Module):
    def __init__(self, n_regions: int, mean: torch.Tensor, std: torch.Tensor, hidden: int = 64,
                 dropout: float = 0.1):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std.clamp_min(1e-6))
        n_in = n_regions * (n_regions - 1)                               # two upper triangles
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 2))

    @staticmethod
    def features(S, F):
        return torch.cat([upper_triangle(S), upper_triangle(F)], -1)

    def forward(self, S, F, M=None, generator=None):
        return self.net((self.features(S, F) - self.mean) / self.std), {}


def gcn_normalize(S: torch.Tensor) -> torch.Tensor:
    """D^{-1/2} (S + I) D^{-1/2} for a batch of weighted adjacency matrices (Kipf & Welling Eq. 2)."""
    A = S + torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
    inv = A.sum(-1).rsqrt()
    return inv.unsqueeze(-1) * A * inv.unsqueeze(-2)


class GCNBaseline(nn.Module):
    def __init__(self, n_regions: int, hidden: int = 32, dropout: float = 0.1,
                 feat_mean: torch.Tensor | None = None, feat_std: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("feat_mean", torch.zeros(n_regions, n_regions) if feat_mean is None else feat_mean)
        self.register_buffer("feat_std", torch.ones(n_regions, n_regions) if feat_std is None else feat_std.clamp_min(1e-6))
        self.lin1 = nn.Linear(n_regions, hidden)
        self.lin2 = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 2))

    def forward(self, S, F, M=None, generator=None):
        A = gcn_normalize(S)
        h = self.drop(torch.relu(A @ self.lin1((F - self.feat_mean) / self.feat_std)))
        h = torch.relu(A @ self.lin2(h))
        return self.head(h.mean(1)), {}
