"""AFR-Net (miniature) and the two baselines, all taking a batch of (SC, FC) matrices.

* :class:`AFRNet`: the published architecture (reference code v1.0.1): node encoder (transformer
  whose attention is restricted to SC neighbours, node features = FC row, log SC strength, FC
  absolute row sum, plus a learned ROI embedding) -> edge gates a_e = MLP[|h_u - h_v|, h_u * h_v,
  S_e, F_e] -> conductance g_e = exp(a_e) -> closed-form routing energy (routing.py) -> log-min-max
  soft mask with structural cost -> masked graph transformer (attention bias log m_e on SC edges,
  -inf elsewhere, 0 on the diagonal) -> mean pooling -> classifier. ``learn_gate=False`` sets
  g_e = S_e: routing by the structural conductances alone (ablation).
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

from contextlib import contextmanager

import torch
from torch import nn

from . import routing

# log-conductances are held within +-20 before exp: beyond that a gate is numerically closed or shorted
# (e^-20 ~ 2e-9 against O(1) gates) and the grounded Laplacian's inverse stops being meaningful even in
# float64 (routing.edge_energy); the 3-seed smoke at 940ef68 stopped on gates that underflowed to 0
LOG_G_BOUND = 20.0


@contextmanager
def slow_attention_path():
    """Run ``nn.TransformerEncoderLayer`` on its reference path. In eval mode without autograd, torch
    (2.13 here) takes a fused "fast path" that mis-applies a per-sample float attention mask of shape
    (batch * heads, N, N): its output differs from the training-mode computation with the same mask
    (tests/test_afr_net.py::test_evaluation_applies_the_same_attention_mask_as_training). Every
    evaluation of AFR-Net (validation loss, test AUC, the readouts, gate_effect) would otherwise use a
    different network from the one trained."""
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


class AFRNet(nn.Module):
    """The published architecture (AFR-Net v1.0.1), reduced in depth and width.

    node encoder -> gate a_e = MLP[|h_u - h_v|, h_u * h_v, S_e, F_e] (raw output) -> conductance
    g_e = exp(a_e) -> closed-form routing energy E_e (routing.edge_energy: every pair, FC-weighted)
    -> mask m_e = sigmoid(tau (mm(log E) - lambda_cost mm(-log S) - t)) -> masked graph transformer
    (attention bias log m_e on SC edges, -inf elsewhere, 0 on the diagonal) -> LayerNorm -> mean
    pooling -> classifier. ``pooling="mask"`` (not in the reference code; README, "Why the gates do not
    reach the output") weights each node's output by its summed mask instead of 1/N. The gates reach the output only through the mask, as in the paper; the
    min-max of log E spreads every subject's energies over [0, 1], so with tau = 8 the mask spans
    sigmoid(-8) .. sigmoid(8) and the attention biases span about 8 nats whatever the gates' scale.

    ``gate_mode``: ``learned`` (the method), ``structural`` (ablation: g_e = S_e, routing by structural
    conductance alone, the gate network unused) or ``uniform`` (g_e = 1, for tests).
    """

    def __init__(self, n_regions: int, edges: torch.Tensor, d: int = 32, heads: int = 2, dropout: float = 0.1,
                 tau: float = 8.0, lambda_cost: float = 1.0, energy_scale: float = 100.0, learn_gate: bool = True,
                 graph_layers: int = 1, eps: float = 1e-6, feat_mean: torch.Tensor | None = None, feat_std: torch.Tensor | None = None,
                 pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "mask"):
            raise ValueError(f"pooling '{pooling}': expected mean (published) or mask")
        self.pooling = pooling
        self.n, self.heads, self.tau, self.lambda_cost = n_regions, heads, tau, lambda_cost
        self.energy_scale, self.eps = energy_scale, eps
        self.gate_mode = "learned" if learn_gate else "structural"
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
        self.encoder = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout, activation="gelu", batch_first=True)
        self.encoder_norm = nn.LayerNorm(d)
        self.gate = nn.Sequential(nn.Linear(2 * d + 2, d), nn.SiLU(), nn.Dropout(dropout), nn.Linear(d, 1))
        self.threshold = nn.Parameter(torch.zeros(()))
        self.graph = nn.ModuleList([nn.TransformerEncoderLayer(d, heads, 2 * d, dropout, activation="gelu",
                                                          batch_first=True) for _ in range(graph_layers)])
        self.graph_norm = nn.LayerNorm(d)
        self.head = nn.Sequential(nn.Dropout(dropout / 2), nn.Linear(d, d), nn.ReLU(), nn.Dropout(dropout),
                                  nn.Linear(d, 2))

    @property
    def learn_gate(self) -> bool:
        return self.gate_mode == "learned"

    @learn_gate.setter
    def learn_gate(self, value: bool) -> None:
        self.gate_mode = "learned" if value else "structural"

    @staticmethod
    def node_features(S: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
        """Raw node features (b, N, N + 2): FC row, log SC strength, mean |FC| of the row."""
        strength = torch.log1p(S.sum(-1, keepdim=True))
        return torch.cat([F, strength, F.abs().mean(-1, keepdim=True)], -1)

    def encode(self, S: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
        X = (self.node_features(S, F) - self.feat_mean) / self.feat_std
        H = self.embed(X) + self.roi.weight
        with slow_attention_path():
            return self.encoder_norm(self.encoder(H, src_mask=self.encoder_mask))

    def log_conductance(self, H: torch.Tensor, S_e: torch.Tensor, F_e: torch.Tensor) -> torch.Tensor:
        """a_e = log g_e for the current gate mode."""
        if self.gate_mode == "learned":
            u, v = self.edges[:, 0], self.edges[:, 1]
            hu, hv = H[:, u], H[:, v]
            feats = torch.cat([(hu - hv).abs(), hu * hv, S_e.unsqueeze(-1), F_e.unsqueeze(-1)], -1)
            return self.gate(feats).squeeze(-1)
        if self.gate_mode == "structural":
            return torch.log(S_e + self.eps)
        return torch.zeros_like(S_e)

    def route(self, S: torch.Tensor, F: torch.Tensor):
        """Node embeddings -> gates -> energies -> mask; returns (H, E, m, a, S_e)."""
        H = self.encode(S, F)
        u, v = self.edges[:, 0], self.edges[:, 1]
        S_e, F_e = S[:, u, v], F[:, u, v]
        a = self.log_conductance(H, S_e, F_e).clamp(-LOG_G_BOUND, LOG_G_BOUND)
        E = routing.edge_energy(self.B, torch.exp(a), F, self.energy_scale)
        m = routing.mask_from_energy(E, S_e, self.tau, self.lambda_cost, self.threshold, self.eps)
        return H, E, m, a, S_e

    def readout(self, H: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Masked graph transformer on H with attention bias log m_e on the SC edges -> logits."""
        b = len(H)
        bias = torch.full((b, self.n, self.n), float("-inf"), device=H.device)
        u, v = self.edges[:, 0], self.edges[:, 1]
        logm = torch.log(m + 1e-9)
        bias[:, u, v] = logm
        bias[:, v, u] = logm
        bias[:, torch.arange(self.n), torch.arange(self.n)] = 0.0  # self-loops kept
        bias = bias.repeat_interleave(self.heads, 0)
        Z = H
        with slow_attention_path():
            for layer in self.graph:
                Z = layer(Z, src_mask=bias)
        Z = self.graph_norm(Z)
        return self.head((self.pool_weights(m).unsqueeze(-1) * Z).sum(1))

    def pool_weights(self, m: torch.Tensor) -> torch.Tensor:
        """Node weights of the graph readout (b, N), summing to 1: ``mean`` (published) 1/N each; ``mask``
        (not in the reference code) each node's summed mask over its SC edges, normalised."""
        if self.pooling == "mean":
            return torch.full((len(m), self.n), 1.0 / self.n, dtype=m.dtype, device=m.device)
        u, v = self.edges[:, 0], self.edges[:, 1]
        w = torch.zeros(len(m), self.n, dtype=m.dtype, device=m.device).index_add(1, u, m).index_add(1, v, m)
        return w / (w.sum(-1, keepdim=True) + self.eps)

    def forward(self, S, F, M=None, generator=None):
        with slow_attention_path():
            H, E, m, a, S_e = self.route(S, F)
            return self.readout(H, m), {"E": E, "m": m, "a": a, "S_e": S_e}


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
