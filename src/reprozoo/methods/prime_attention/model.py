"""iTransformer-style channel-token forecaster with standard or prime (pairwise-primed) attention.

Tokens are channels (Liu et al., iTransformer, ICLR 2024): each channel's whole lookback window,
normalised per window (mean mu_j and std s_j over the lookback, as iTransformer's ``use_norm``), is
embedded by one linear map, e_j = W_e x_j + b_e in R^d. ``n_layers`` post-LN encoder layers mix
the N tokens; a linear head maps each token to its H future values, which are de-normalised.

Standard attention (head h, per-head width d_h = d / n_heads):

    s_ij = <q_i, k_j> / sqrt(d_h),   a_ij = softmax_j s_ij,   o_i = sum_j a_ij v_j

Prime attention (dynamic relational priming, ICML 2026): the key and the value of token j are
primed for the pair (i, j) by a relation-specific filter before they meet query i,

    k_ij = k_j * F^K_ij,   v_ij = v_j * F^V_ij,     (* elementwise, F_ij in R^d)
    s_ij = <q_i, k_ij> / sqrt(d_h),                  o_i = sum_j a_ij v_ij

so every channel pair gets its own view of j (a gain, a sign flip, a re-weighting of the embedding
directions that carry a delay or a nonlinearity). F_ij = 1 + P_ij with P initialised at 0: prime
attention starts as standard attention. P is a free (N, N, d) table per layer (``filter_rank`` =
None) or low-rank, P_ij = sum_r U_ir V_jr W_r (CP form, rank r), for many channels.
Separable control (``separable=True``, variant ``prime_sep``, round 6): F_ij = (1 + a_i)(1 + b_j), a
per-query-channel times a per-key-channel gain, i.e. the same filters without a pair term (every
separable table obeys F_11 F_22 = F_12 F_21, which a per-pair table need not).
Our assumption: the filter is an elementwise (diagonal) modulation of the projected keys and values,
learned per pair and per layer, input-independent. The paper describes learnable pair-wise
modulations of the keys and values (arXiv:2509.12196); its code (github.com/timlee0131/Prime-Attention)
could not be fetched here, so the exact parameterisation (and any sparsity of the filter table) is
not checked against it.

The prime scores are computed by broadcasting over (batch, i, j, head, channel): at the few
channels of the miniature this is several times faster than a three-operand einsum (same values;
``test_prime_matches_pairwise_definition``).
"""
from __future__ import annotations

import math

import torch
from torch import nn


class ChannelAttention(nn.Module):
    """Multi-head attention over channel tokens; ``prime=True`` adds the per-pair filters."""

    def __init__(self, n_channels: int, dim: int, n_heads: int, prime: bool, filter_rank: int | None = None,
                 pair_bias: bool = False, separable: bool = False):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"width {dim} is not divisible by {n_heads} heads")
        self.N, self.d, self.h = n_channels, dim, n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.prime, self.rank, self.separable = prime, filter_rank, bool(separable) and prime
        # a learned per-pair, per-head attention bias b_hij added to the scores (zero at init): routing per pair
        # without priming the keys or values (``standard_id_bias``, the review of round 4)
        self.bias = nn.Parameter(torch.zeros(n_heads, n_channels, n_channels)) if pair_bias else None
        if prime and self.separable:
            # per-channel filters, no pair term (``prime_sep``, the cold review of round 5): F_ij = (1 + a_i) * (1 + b_j),
            # a per-query-channel times a per-key-channel gain (4 N d parameters per layer, zero at init)
            for name in ("ak", "bk", "av", "bv"):
                setattr(self, name, nn.Parameter(torch.zeros(n_channels, dim)))
        elif prime:
            if filter_rank is None:
                self.pk = nn.Parameter(torch.zeros(n_channels, n_channels, dim))
                self.pv = nn.Parameter(torch.zeros(n_channels, n_channels, dim))
            else:  # CP form: U and V random, W zero, so P = 0 at start and all three get gradients
                self.u = nn.Parameter(torch.randn(2, n_channels, filter_rank) / math.sqrt(filter_rank))
                self.w = nn.Parameter(torch.randn(2, n_channels, filter_rank) / math.sqrt(filter_rank))
                self.c = nn.Parameter(torch.zeros(2, filter_rank, dim))

    def filters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(F^K, F^V), each (N, N, d); ones for standard attention."""
        if not self.prime:
            one = torch.ones(self.N, self.N, self.d, device=self.q.weight.device)
            return one, one
        if self.separable:
            return (1 + self.ak)[:, None] * (1 + self.bk)[None], (1 + self.av)[:, None] * (1 + self.bv)[None]
        if self.rank is None:
            return 1 + self.pk, 1 + self.pv
        p = torch.einsum("sir,sjr,srd->sijd", self.u, self.w, self.c)
        return 1 + p[0], 1 + p[1]

    def forward(self, e: torch.Tensor, return_attention: bool = False):
        B, N, d = e.shape
        h, dh = self.h, d // self.h
        q = self.q(e).view(B, N, h, dh)
        k = self.k(e).view(B, N, h, dh)
        v = self.v(e).view(B, N, h, dh)
        if self.separable:
            # F_ij = (1 + a_i)(1 + b_j) factorises: s_bij = sum_c (q_bic (1 + a_i)_c)(k_bjc (1 + b_j)_c) and
            # o_bi = (1 + a_i) * sum_j att_bij (1 + b_j) v_bj, i.e. standard attention on rescaled q, k, v and
            # output: the same function as the broadcast form below at a third less compute per step
            q, k, v = q * (1 + self.ak).view(N, h, dh), k * (1 + self.bk).view(N, h, dh), v * (1 + self.bv).view(N, h, dh)
        if self.prime and not self.separable:  # broadcast over (b, i, j, h, c): a few times faster than a 3-operand einsum at small N
            fk, fv = (f.view(N, N, h, dh) for f in self.filters())
            s = (q[:, :, None] * k[:, None] * fk).sum(-1) / math.sqrt(dh)  # (b, i, j, h)
            if self.bias is not None:
                s = s + self.bias.permute(1, 2, 0)
            a = s.softmax(2)
            o = (a[..., None] * v[:, None] * fv).sum(2)  # (b, i, h, c)
            a = a.permute(0, 3, 1, 2)
        else:
            s = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / math.sqrt(dh)  # (b, h, i, j)
            if self.bias is not None:
                s = s + self.bias
            a = s.softmax(-1)
            o = (a @ v.transpose(1, 2)).transpose(1, 2)  # (b, i, h, c)
            if self.separable:
                o = o * (1 + self.av).view(N, h, dh)
        out = self.o(o.reshape(B, N, d))
        return (out, a) if return_attention else out


class EncoderLayer(nn.Module):
    """Post-LN encoder layer (iTransformer's): e = LN(e + Attn(e)); e = LN(e + FFN(e))."""

    def __init__(self, n_channels, dim, n_heads, d_ff, prime, filter_rank=None, dropout=0.0, pair_bias=False,
                 separable=False):
        super().__init__()
        self.attn = ChannelAttention(n_channels, dim, n_heads, prime, filter_rank, pair_bias, separable)
        self.ff = nn.Sequential(nn.Linear(dim, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, dim))
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, e):
        e = self.n1(e + self.drop(self.attn(e)))
        return self.n2(e + self.drop(self.ff(e)))


class ChannelTokenForecaster(nn.Module):
    """x (B, L, N) -> forecast (B, H, N)."""

    def __init__(self, n_channels, lookback, horizon, dim, n_heads, n_layers, d_ff, prime,
                 filter_rank=None, dropout=0.0, norm: bool = True, channel_id: bool = False,
                 pair_bias: bool = False, separable: bool = False):
        super().__init__()
        self.norm = bool(norm)
        self.embed = nn.Linear(lookback, dim)
        # a learned per-channel embedding added to every token (N x d parameters): without it the channels
        # are interchangeable to standard attention (one shared embedding, value projection and head)
        self.chan = nn.Parameter(0.02 * torch.randn(n_channels, dim)) if channel_id else None
        self.layers = nn.ModuleList(EncoderLayer(n_channels, dim, n_heads, d_ff, prime, filter_rank, dropout,
                                                 pair_bias, separable) for _ in range(n_layers))
        self.head = nn.Linear(dim, horizon)

    def forward(self, x):
        if not self.norm:  # stationary, already standardised series: the window's mean is noise, not level
            e = self._tokens(x.transpose(1, 2))
            for layer in self.layers:
                e = layer(e)
            return self.head(e).transpose(1, 2)
        mu = x.mean(1, keepdim=True)
        sd = (x.var(1, keepdim=True, unbiased=False) + 1e-5).sqrt()
        e = self._tokens(((x - mu) / sd).transpose(1, 2))  # (B, N, d)
        for layer in self.layers:
            e = layer(e)
        return self.head(e).transpose(1, 2) * sd + mu

    def _tokens(self, xt):
        e = self.embed(xt)
        return e if self.chan is None else e + self.chan

    def filter_deviation(self) -> torch.Tensor:
        """(N, N): mean over layers of ||F^K_ij - 1|| + ||F^V_ij - 1|| / sqrt(d), the learned pair map."""
        devs = []
        for layer in self.layers:
            fk, fv = layer.attn.filters()
            d = fk.shape[-1]
            devs.append(((fk - 1).norm(dim=-1) + (fv - 1).norm(dim=-1)) / math.sqrt(d))
        return torch.stack(devs).mean(0)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build(n_channels, lookback, horizon, dim, n_heads, n_layers, ff_mult, prime, filter_rank=None,
          d_ff: int | None = None, dropout: float = 0.0, norm: bool = True, channel_id: bool = False,
          pair_bias: bool = False, separable: bool = False):
    """The forecaster; FFN width ``d_ff`` (default ff_mult * dim); ``norm``: iTransformer's per-window
    normalisation (``use_norm``); ``channel_id``: a learned per-channel embedding added to the tokens;
    ``pair_bias``: a learned per-pair, per-head attention-score bias (zero at init); ``separable`` (with
    ``prime``): per-channel filters F_ij = (1 + a_i)(1 + b_j) instead of the per-pair table (no pair term)."""
    return ChannelTokenForecaster(n_channels, lookback, horizon, dim, n_heads, n_layers,
                                  int(d_ff) if d_ff is not None else int(ff_mult * dim), prime, filter_rank,
                                  dropout, norm, channel_id, pair_bias, separable)


def matched_width(n_channels, lookback, horizon, prime_dim, n_heads, n_layers, ff_mult, filter_rank=None,
                  max_dim: int = 1024) -> tuple[tuple[int, int], int, int]:
    """Standard model with the prime model's parameter count (prime at width ``prime_dim``).

    The width d is the largest multiple of n_heads whose count at d_ff = ff_mult * d does not exceed
    the prime count; then d_ff is raised to close the gap (each FFN unit adds 2 d + 1 parameters per
    layer), so the counts differ by less than n_layers (2 d + 1). Returns ((d, d_ff), prime count,
    standard count)."""
    def count(d, dff):
        return n_params(build(n_channels, lookback, horizon, d, n_heads, n_layers, ff_mult, False, d_ff=dff))

    target = n_params(build(n_channels, lookback, horizon, prime_dim, n_heads, n_layers, ff_mult, True, filter_rank))
    d = n_heads
    while d + n_heads <= max_dim and count(d + n_heads, int(ff_mult * (d + n_heads))) <= target:
        d += n_heads
    dff = int(ff_mult * d)
    per_unit = n_layers * (2 * d + 1)
    dff += int(round((target - count(d, dff)) / per_unit))
    return (d, dff), target, count(d, dff)
