"""Conditioned probes and the binding ratio (the paper's information-theoretic estimator).

A probe q(Y | Z) for a multi-hot label Y = (y_1..y_K) factorises by the chain rule,

    log q(Y | Z) = sum_k log q(y_k | y_<k, Z),

with head k fed the earlier labels (teacher forcing: ``masked_labels`` gives head k the centred
y_i - 1/2 for i < k and 0 otherwise). Its test cross-entropy CE(Y) = -E log2 q(Y | Z) is an upper
bound on H(Y | Z) (bits per scene), and likewise CE(F) >= H(F | Z) for the features F. Since F is
a function of Y,

    I(Y; Z | F) = I(Y; Z) - I(F; Z) = H(Y | F) - [H(Y | Z) - H(F | Z)],

so the binding information is estimated as  B = H(Y|F) - (CE(Y) - CE(F))  and the binding ratio
as  B / H(Y|F): 1 when Z says which features go together, 0 when it holds only the features.

Probe families (same Y / F conditioning; every fit by the shared rule ``blocks.fitting.fit_to_plateau``):

* ``linear``: logit_k = w_k . z + u_k . ymask_k + b_k on one vector z ([CLS]);
* ``quadratic``: x_k = [z, ymask_k], logit_k = w_k . x_k + <A_k x_k, C_k x_k> / sqrt(dim x) + b_k
  (low-rank quadratic form: lets the earlier labels gate how z is read);
* ``attention``: one query per head, q_k = W_q (e_k + sum_i ymask_ik u_i), softmax attention over
  the spatial tokens (never [CLS]), pooled_k = sum_n a_kn t_n, then the quadratic readout on
  [pooled_k, ymask_k]: the head looks up the object its conjunction is about.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

LN2 = math.log(2.0)


def masked_labels(y: torch.Tensor) -> torch.Tensor:
    """(B, K) in {0, 1} -> (B, K, K) with [b, i, k] = y[b, i] - 1/2 if i < k else 0."""
    k = y.shape[-1]
    mask = torch.triu(torch.ones(k, k, dtype=y.dtype, device=y.device), diagonal=1)
    return (y - 0.5).unsqueeze(-1) * mask


class _Quadratic(nn.Module):
    """Per-head linear + low-rank quadratic readout of x (B, K, D) -> logits (B, K)."""

    def __init__(self, in_dim: int, heads: int, rank: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(heads, in_dim) * 0.02)
        self.a = nn.Parameter(torch.randn(heads, rank, in_dim) / math.sqrt(in_dim))
        self.c = nn.Parameter(torch.randn(heads, rank, in_dim) * 0.02)
        self.b = nn.Parameter(torch.zeros(heads))
        self.scale = 1.0 / math.sqrt(in_dim)

    def forward(self, x):
        quad = (torch.einsum("bkd,krd->bkr", x, self.a) * torch.einsum("bkd,krd->bkr", x, self.c)).sum(-1)
        return (x * self.w).sum(-1) + self.scale * quad + self.b


class LinearProbe(nn.Module):
    def __init__(self, z_dim: int, heads: int, rank: int = 0):
        super().__init__()
        self.wz = nn.Linear(z_dim, heads)
        self.wy = nn.Parameter(torch.zeros(heads, heads))  # [k, i], used where i < k

    def forward(self, z, y):
        return self.wz(z) + torch.einsum("bik,ki->bk", masked_labels(y), self.wy)


class QuadraticProbe(nn.Module):
    def __init__(self, z_dim: int, heads: int, rank: int = 8):
        super().__init__()
        self.readout = _Quadratic(z_dim + heads, heads, rank)

    def forward(self, z, y):
        ym = masked_labels(y).transpose(1, 2)  # (B, K, K): row k = head k's conditioning
        x = torch.cat([z.unsqueeze(1).expand(-1, ym.shape[1], -1), ym], dim=-1)
        return self.readout(x)


class AttentionProbe(nn.Module):
    def __init__(self, token_dim: int, heads: int, rank: int = 8):
        super().__init__()
        self.query = nn.Parameter(torch.randn(heads, token_dim) * 0.1)
        self.query_from_y = nn.Parameter(torch.randn(heads, token_dim) * 0.1)
        self.wq = nn.Linear(token_dim, token_dim, bias=False)
        self.readout = _Quadratic(token_dim + heads, heads, rank)
        self.scale = 1.0 / math.sqrt(token_dim)

    def attention(self, tokens, y):
        """Attention weights (B, K, N) of each head over the spatial tokens (B, N, d)."""
        ym = masked_labels(y)  # (B, i, k)
        q = self.wq(self.query + torch.einsum("bik,id->bkd", ym, self.query_from_y))
        return torch.softmax(torch.einsum("bkd,bnd->bkn", q, tokens) * self.scale, dim=-1)

    def forward(self, tokens, y):
        pooled = torch.einsum("bkn,bnd->bkd", self.attention(tokens, y), tokens)
        return self.readout(torch.cat([pooled, masked_labels(y).transpose(1, 2)], dim=-1))


PROBES = {"linear": LinearProbe, "quadratic": QuadraticProbe, "attention": AttentionProbe}


def cross_entropy_bits(probe, z, y, batch: int = 1024) -> np.ndarray:
    """-log2 q(y | z) per scene (sum over heads), teacher-forced on y itself."""
    out = []
    with torch.no_grad():
        for i in range(0, len(z), batch):
            logits = probe(z[i:i + batch], y[i:i + batch])
            nll = nn.functional.binary_cross_entropy_with_logits(logits, y[i:i + batch], reduction="none")
            out.append(nll.sum(-1) / LN2)
    return torch.cat(out).numpy()


def fit_probe(kind: str, z_train, y_train, z_val, y_val, cfg: dict, seed: int, progress=None):
    """Train a probe by the shared rule ``blocks.fitting.fit_to_plateau`` (Adam at every rate of
    ``cfg["fit"]["lr_grid"]`` for a pilot, the best on validation continued at that constant rate until
    the validation cross-entropy passes the platform's plateau test, best-validation weights kept);
    minibatches of ``cfg["batch"]`` scenes. Returns (probe, fit record: ``steps``, ``vals`` (bits per
    scene), ``lrs``, ``lr``, ``stop``, ``plateau``)."""
    from ...blocks.fitting import fit_to_plateau

    def build(gen):
        torch.manual_seed(seed)
        return PROBES[kind](z_train.shape[-1], y_train.shape[-1], cfg.get("rank", 8))

    def train_loss(probe, gen):
        idx = torch.randint(len(z_train), (cfg["batch"],), generator=gen)
        logits = probe(z_train[idx], y_train[idx])
        return nn.functional.binary_cross_entropy_with_logits(logits, y_train[idx], reduction="sum") / len(idx)

    def val_loss(probe):
        return float(cross_entropy_bits(probe, z_val, y_val).mean())

    probe, rec = fit_to_plateau(build, train_loss, val_loss, cfg["fit"], seed, label=f"{kind} probe",
                                progress=progress or (lambda *_: None))
    return probe.eval(), rec


def candidate_accuracy(probe, z, candidates: list[torch.Tensor], truth: torch.Tensor) -> float:
    """Fraction of scenes whose true Y has the highest q(Y | z) among the label sets consistent
    with the true features (the probe's binding choice; chance = 1 / number of candidates)."""
    hits = []
    with torch.no_grad():
        for zi, cand, yt in zip(z, candidates, truth):
            zz = zi.unsqueeze(0).expand(len(cand), *zi.shape)
            nll = nn.functional.binary_cross_entropy_with_logits(probe(zz, cand), cand, reduction="none").sum(-1)
            hits.append(bool(torch.equal(cand[int(nll.argmin())], yt)))
    return float(np.mean(hits))


def binding_ratio(h_y_given_f: float, ce_y: float, ce_f: float) -> tuple[float, float]:
    """(binding information in bits, binding ratio) from H(Y|F) and the two probe cross-entropies."""
    info = h_y_given_f - (ce_y - ce_f)
    return info, info / h_y_given_f
