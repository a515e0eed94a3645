"""The three learned imputers, each a torch module mapping (x, m) -> x_hat of shape (B, T, C).

x holds the values with hidden entries set to 0, m is 1 where observed. Every model returns a
dict with ``impute`` (the final estimate) and ``aux`` (extra estimates its own loss also fits).

CBiT (conditional temporal inference with history compression; our reading of the paper)
    The sequence is cut into partitions of ``chunk`` steps and processed forward in time. A
    memory of S latent slots, ``M_k``, compresses the long history (everything before partition k-1);
    the partitioned modelling keeps apart the *historical context* (the compressed memory and the
    observed entries of the previous partition) and the *imputation target* (partition k):

        e_t       = E [x_t * m_t, m_t] + pos(t)        (one positional code across all partitions)
        context_k = e_{k-1} + role_context              (the previous partition, observed entries only)
        tokens_k  = e_k + role_target
        ahead_k   = e_{k+1} + role_ahead                (the next partition, observed entries only)
        H         = Encoder([M_k + role_history ; context_k ; tokens_k ; ahead_k])
        x_hat_k   = W_out H[target]                     (imputation of partition k)
        U         = CrossAttn(queries M_k, keys/values H[target])       (history compression)
        g         = sigmoid(W_g [M_k, U]);  M_{k+1} = LN(g * U + (1 - g) * M_k)

    Each partition costs O((S + 3 chunk)^2 d), there are T / chunk of them, so inference is linear
    in T. ``memory=False`` (variant ``cbit_nomem``, the ablation) never updates the slots: M_k = M_0, a
    learned constant, so partition k sees its raw left context, itself and its look-ahead, and nothing
    older; everything else is the same (and its partitions, independent, run as one batch).
    The look-ahead partition is our assumption (the abstract does not say how right context enters); it
    is observed data only. ``lookback=False`` is the reading of the rounds before the cold review of stop
    50 (no raw left context, the positional code restarted in every partition); the tests keep it to show
    that the boundary-hole test tells the two readings apart; no variant uses it.

BRITS (Cao et al., NeurIPS 2018): two recurrent imputers (forward, backward), each with temporal
    decay gamma = exp(-relu(W delta + b)) of the hidden state and of the input, history regression
    x_h = W h, feature regression z = W_f x_c (zero diagonal), learned combination
    c = a z + (1 - a) x_h; the two directions are averaged and a consistency loss |f - b| is added.

SAITS (Du et al., 2023): two diagonally-masked self-attention (DMSA) blocks over the whole window,
    the second fed with the first's completed series; the final estimate mixes them with weights
    eta = sigmoid(W [m, mean attention]); O(T^2) attention.
"""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F


def sinusoid(T: int, d: int) -> torch.Tensor:
    """Standard sinusoidal positional encoding (T, d)."""
    pos = torch.arange(T, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(T, d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d // 2])
    return pe


class AttnLayer(nn.Module):
    """Pre-norm multi-head self-attention + feed-forward; returns (out, head-mean attention weights)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, z, block_diag: bool = False, need_weights: bool = True):
        B, T, d = z.shape
        q, k, v = self.qkv(self.n1(z)).view(B, T, 3, self.h, self.dk).permute(2, 0, 3, 1, 4)
        if not need_weights:  # the same attention through the fused kernel (no weights returned)
            mask = ~torch.eye(T, dtype=torch.bool) if block_diag else None
            o, a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None
        else:
            s = q @ k.transpose(-1, -2) / math.sqrt(self.dk)
            if block_diag:  # SAITS: a step may not attend to itself
                s = s.masked_fill(torch.eye(T, dtype=torch.bool), float("-inf"))
            a = s.softmax(-1)
            o, a = a @ v, a.mean(1)
        z = z + self.o(o.transpose(1, 2).reshape(B, T, d))
        return z + self.ff(self.n2(z)), a


class CBiT(nn.Module):
    def __init__(self, C: int, d: int = 32, heads: int = 2, chunk: int = 16, slots: int = 4, layers: int = 1,
                 memory: bool = True, lookback: bool = True):
        super().__init__()
        self.C, self.chunk, self.slots, self.memory, self.lookback = C, chunk, slots, memory, lookback
        self.d = d
        self.embed = nn.Linear(2 * C, d)
        self._pe: dict[int, torch.Tensor] = {}
        # roles: 0 history memory, 1 target, 2 look-ahead, 3 previous partition (left context)
        self.role = nn.Parameter(0.02 * torch.randn(4, d))
        self.mem0 = nn.Parameter(0.02 * torch.randn(slots, d))
        self.enc = nn.ModuleList(AttnLayer(d, heads) for _ in range(layers))
        self.compress = nn.MultiheadAttention(d, heads, batch_first=True)
        self.gate = nn.Linear(2 * d, d)
        self.mem_norm = nn.LayerNorm(d)
        self.out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, C))

    def _compress(self, mem, h):
        """``self.compress(mem, h, h)`` (nn.MultiheadAttention, its own weights) written out: queries the
        slots, keys and values the partition's encoded tokens; the same maths without the module's
        per-call argument handling."""
        mha, B, dk = self.compress, mem.shape[0], mem.shape[-1] // self.compress.num_heads
        w, b = mha.in_proj_weight, mha.in_proj_bias
        d = mem.shape[-1]
        q = F.linear(mem, w[:d], b[:d]).view(B, -1, mha.num_heads, dk).transpose(1, 2)
        k, v = F.linear(h, w[d:], b[d:]).view(B, -1, 2, mha.num_heads, dk).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, -1, d)
        return mha.out_proj(o)

    def _pos(self, n: int) -> torch.Tensor:
        if n not in self._pe:  # one sinusoidal code over the padded sequence, cached per length
            self._pe[n] = sinusoid(n, self.d)
        return self._pe[n]

    def tokens(self, x, m):
        """(B, K + 2, L, d): the embedded partitions with one empty partition in front (partition 0's left
        context: nothing observed) and one after the end (the last look-ahead). With ``lookback`` the
        positional code runs across the partitions (step t of the padded sequence gets pos(t)); without
        it (the earlier reading) it restarts in every partition."""
        B, T, C = x.shape
        L = self.chunk
        K = -(-T // L)
        xm = F.pad(torch.cat([x * m, m], -1), (0, 0, L, K * L - T + L))
        e = self.embed(xm)
        if self.lookback:
            return (e + self._pos((K + 2) * L)).view(B, K + 2, L, -1)
        return e.view(B, K + 2, L, -1) + self._pos(L)

    def _window(self, mem, tok, k):
        """The encoder's input for target partition k (tok: (B, K + 2, L, d), index k + 1 is partition k)."""
        parts = [mem + self.role[0]]
        if self.lookback:
            parts.append(tok[:, k] + self.role[3])
        parts += [tok[:, k + 1] + self.role[1], tok[:, k + 2] + self.role[2]]
        return torch.cat(parts, 1)

    def forward(self, x, m):
        B, T, C = x.shape
        L, S = self.chunk, self.slots
        K = -(-T // L)
        tok = self.tokens(x, m)
        off = S + (L if self.lookback else 0)  # where the target's tokens sit in the encoder's input
        mem = self.mem0.expand(B, S, -1)
        if not self.memory:  # ablation cbit_nomem: the slots stay at their learned initial value, so the
            # partitions are independent: all K encoder calls as one batch (the same maths as the loop)
            z = torch.stack([self._window(mem, tok, k) for k in range(K)], 1).flatten(0, 1)
            for layer in self.enc:
                z, _ = layer(z, need_weights=False)
            h = z[:, off:off + L].reshape(B, K * L, -1)
        else:
            outs = []
            for k in range(K):
                z = self._window(mem, tok, k)
                for layer in self.enc:
                    z, _ = layer(z, need_weights=False)
                h = z[:, off:off + L]
                outs.append(h)
                upd = self._compress(mem, h)
                g = torch.sigmoid(self.gate(torch.cat([mem, upd], -1)))
                mem = self.mem_norm(g * upd + (1 - g) * mem)
            h = torch.cat(outs, 1)
        y = self.out(h[:, :T])  # the output head per step, applied once to all partitions
        return {"impute": y, "aux": []}


class SAITS(nn.Module):
    def __init__(self, C: int, d: int = 32, heads: int = 2, layers: int = 1):
        super().__init__()
        self.in1, self.in2 = nn.Linear(2 * C, d), nn.Linear(2 * C, d)
        self.b1 = nn.ModuleList(AttnLayer(d, heads) for _ in range(layers))
        self.b2 = nn.ModuleList(AttnLayer(d, heads) for _ in range(layers))
        self.out1 = nn.Linear(d, C)
        self.out2 = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, C))
        self.mix = nn.Linear(C + 1, C)  # [m, mean attention received per step] (SAITS uses the full map)
        self.d = d

    def forward(self, x, m):
        B, T, C = x.shape
        pe = sinusoid(T, self.d)
        z = self.in1(torch.cat([x * m, m], -1)) + pe
        for layer in self.b1:
            z, _ = layer(z, block_diag=True, need_weights=False)
        x1 = self.out1(z)
        xc = m * x + (1 - m) * x1
        z = self.in2(torch.cat([xc, m], -1)) + pe
        for i, layer in enumerate(self.b2):  # the mixing weights read the last layer's attention map
            z, a = layer(z, block_diag=True, need_weights=i == len(self.b2) - 1)
        x2 = self.out2(z)
        eta = torch.sigmoid(self.mix(torch.cat([m, a.mean(1, keepdim=True).transpose(1, 2) * T], -1)))
        x3 = (1 - eta) * x2 + eta * x1
        return {"impute": x3, "aux": [x1, x2]}


def time_gaps(m: torch.Tensor) -> torch.Tensor:
    """BRITS' delta: steps since the last observation per channel (delta_0 = 0), (B, T, C).

    The recursion delta_t = 1 + (1 - m_{t-1}) delta_{t-1} has the closed form t - s*(t), with s*(t)
    the last observed step before t (0 if none): a running maximum, no Python loop over T."""
    B, T, C = m.shape
    s = torch.arange(T, dtype=m.dtype, device=m.device)[None, :, None]
    last = torch.cummax(s * (m > 0), 1).values  # last observed step <= t
    d = s - F.pad(last, (0, 0, 1, 0))[:, :T]
    d[:, 0] = 0
    return d


class BRITS(nn.Module):
    """Both RITS directions in one loop over time: every parameter has a leading direction axis
    (0 forward, 1 backward on the time-reversed input) and each step is one batched matrix product
    per layer for both directions, instead of two Python loops. Per direction the maths is
    BRITS' RITS exactly (a GRU cell, ``nn.GRUCell``'s gate equations):

        h    <- gamma_h,t * h                         (temporal decay of the hidden state)
        x_h   = W_hist h + b                          (history regression)
        x_c   = m x + (1 - m) x_h
        z_h   = W_feat x_c + b_f   (zero diagonal)    (feature regression)
        c_h   = alpha z_h + (1 - alpha) x_h,   alpha = sigmoid(W_comb [gamma_x, m] + b)
        h    <- GRU([m x + (1 - m) c_h, m], h)

    ``tests/test_cbit.py`` checks it against a two-``nn.GRUCell`` reference implementation."""

    def __init__(self, C: int, d: int = 32):
        super().__init__()
        self.C, self.d = C, d

        def p(*shape, fan_in):
            k = 1.0 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty(2, *shape).uniform_(-k, k))

        self.w_ih, self.b_ih = p(3 * d, 2 * C, fan_in=d), p(1, 3 * d, fan_in=d)   # GRU (nn.GRUCell's init)
        self.w_hh, self.b_hh = p(3 * d, d, fan_in=d), p(1, 3 * d, fan_in=d)
        self.w_dh, self.b_dh = p(d, C, fan_in=C), p(1, 1, d, fan_in=C)            # decay of h
        self.w_dx, self.b_dx = p(C, fan_in=C), p(1, 1, C, fan_in=C)                # decay of x (diagonal)
        self.w_hist, self.b_hist = p(C, d, fan_in=d), p(1, C, fan_in=d)            # history regression
        self.w_feat, self.b_feat = p(C, C, fan_in=C), p(1, C, fan_in=C)            # feature regression
        self.w_comb, self.b_comb = p(C, 2 * C, fan_in=2 * C), p(1, 1, C, fan_in=2 * C)
        self.register_buffer("offdiag", 1 - torch.eye(C))

    def directions(self, x, m):
        """(y_forward, y_backward), each (B, T, C) in forward time order."""
        B, T, C = x.shape
        d = self.d
        xs = torch.stack([x, x.flip(1)])                     # (2, B, T, C)
        ms = torch.stack([m, m.flip(1)])
        delta = torch.stack([time_gaps(m), time_gaps(m.flip(1))])
        gh = torch.exp(-F.relu(torch.einsum("kbtc,kdc->kbtd", delta, self.w_dh) + self.b_dh))
        gx = torch.exp(-F.relu(delta * self.w_dx[:, None, None] + self.b_dx))
        alpha = torch.sigmoid(torch.einsum("kbtc,koc->kbto", torch.cat([gx, ms], -1), self.w_comb) + self.b_comb)
        w_feat_t = (self.w_feat * self.offdiag).transpose(1, 2)
        # the decayed state feeds the history regression and the GRU's hidden gates: one product for both
        w_h_t = torch.cat([self.w_hist, self.w_hh], 1).transpose(1, 2)      # (2, d, C + 3d)
        b_h = torch.cat([self.b_hist, self.b_hh], -1)
        w_ic_t = self.w_ih[:, :, :C].transpose(1, 2)        # GRU input weights of the completed x
        gi_m = torch.einsum("kbtc,koc->kbto", ms, self.w_ih[:, :, C:]) + self.b_ih[:, None]  # of the mask
        # per-step slices taken once (unbind: one autograd node, not one select per step and tensor)
        steps = zip(*(a.unbind(2) for a in (gh, ms * xs, 1 - ms, alpha, gi_m)))
        h = x.new_zeros(2, B, d)
        out = []
        for gh_t, mx_t, nm_t, a_t, gim_t in steps:
            h = h * gh_t
            hh = torch.baddbmm(b_h, h, w_h_t)
            xh, gg = hh[..., :C], hh[..., C:]
            zh = torch.baddbmm(self.b_feat, torch.addcmul(mx_t, nm_t, xh), w_feat_t)
            ch = torch.lerp(xh, zh, a_t)
            out.append(ch)
            gi = torch.baddbmm(gim_t, torch.addcmul(mx_t, nm_t, ch), w_ic_t)
            r, z = torch.sigmoid(gi[..., :2 * d] + gg[..., :2 * d]).chunk(2, -1)
            n = torch.tanh(torch.addcmul(gi[..., 2 * d:], r, gg[..., 2 * d:]))
            h = torch.lerp(n, h, z)
        y = torch.stack(out, 2)                               # (2, B, T, C)
        return y[0], y[1].flip(1)

    def forward(self, x, m):
        yf, yb = self.directions(x, m)
        return {"impute": (yf + yb) / 2, "aux": [yf, yb], "consistency": (yf - yb).abs().mean()}


def build(variant: str, C: int, p: dict) -> nn.Module:
    d, heads = int(p["d_model"]), int(p["heads"])
    if variant in ("cbit", "cbit_nomem"):
        return CBiT(C, d, heads, int(p["chunk"]), int(p["slots"]), int(p["layers"]), memory=variant == "cbit")
    if variant == "saits":
        return SAITS(C, d, heads, int(p["layers"]))
    if variant == "brits":
        return BRITS(C, d)
    raise KeyError(f"no learned model for variant '{variant}'; known: cbit, cbit_nomem, saits, brits")


def loss_fn(out: dict, x, m_in, m_hidden):
    """SAITS' joint objective, the same for every model: ORT (MAE on the entries the model saw, over
    the final and auxiliary estimates) + MIT (MAE on the artificially hidden entries)."""
    def mae(y, w):
        return (w * (y - x).abs()).sum() / w.sum().clamp_min(1.0)

    ests = [out["impute"]] + list(out["aux"])
    ort = sum(mae(y, m_in) for y in ests) / len(ests)
    loss = ort + mae(out["impute"], m_hidden)
    if "consistency" in out:
        loss = loss + 0.1 * out["consistency"]
    return loss
