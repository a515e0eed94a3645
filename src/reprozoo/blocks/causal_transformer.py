"""GPT-style causal transformer over a fixed-length sequence of discrete tokens, for reuse.

Why a block: autoregressive models of discretised data (coordinates binned into tokens, pixels,
quantised time series) all need the same piece: a decoder that returns, for every position i,
the logits of token i given the tokens before it, so that

    log P(t_1..t_L) = Σ_i log softmax(logits_i)[t_i],     logits_i = f(t_<i)

is one forward pass (teacher forcing) and sampling is L sequential passes. The layers are torch's
own ``nn.TransformerEncoderLayer`` (pre-LayerNorm, GELU MLP: the GPT-2 block) under a causal mask;
what this module adds is the decoder wrapper:

    input  = [BOS, t_1, ..., t_{L-1}]                      (shift right by one BOS token)
    h      = tok_embed(input) + pos_embed[0..L-1]           learned absolute positions
    h      = LN(Block_depth(h))                              causal: position i sees inputs <= i
    logits = head(h)                                         (B, L, vocab)

so logits[:, i] depends on t_1..t_{i-1} only. A learned absolute position embedding can represent
any per-position feature (e.g. which particle and which Cartesian axis a coordinate token is).
"""
from __future__ import annotations

import torch
from torch import nn


class CausalTransformer(nn.Module):
    """Decoder over sequences of ``seq_len`` tokens in ``{0..vocab-1}`` (a BOS token is added)."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64, depth: int = 2, heads: int = 4,
                 mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.vocab, self.seq_len = vocab, seq_len
        self.tok = nn.Embedding(vocab + 1, dim)  # index ``vocab`` is BOS
        self.pos = nn.Parameter(torch.zeros(1, seq_len, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, int(mlp_ratio * dim), dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, k) tokens t_1..t_k (k <= seq_len) -> (B, k, vocab): row i holds the logits of t_i
        given t_<i (row 0 from BOS alone), so token i never sees itself or anything after it."""
        b, k = tokens.shape
        bos = torch.full((b, 1), self.vocab, dtype=torch.long, device=tokens.device)
        inp = torch.cat([bos, tokens[:, : k - 1]], dim=1) if k else bos[:, :0]
        return self._run(inp)

    def _run(self, inp: torch.Tensor) -> torch.Tensor:
        k = inp.shape[1]
        h = self.tok(inp) + self.pos[:, :k]
        h = self.blocks(h, mask=self.mask[:k, :k], is_causal=True)
        return self.head(self.norm(h))

    def log_prob(self, tokens: torch.Tensor) -> torch.Tensor:
        """Exact log P(t_1..t_L) of full sequences (B, L) -> (B,)."""
        lp = torch.log_softmax(self.logits(tokens), dim=-1)
        return lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None,
               temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """n sequences by ancestral sampling, token by token; returns (tokens (n, L), log P (n,)).

        ``log P`` is that of the distribution actually sampled (logits / temperature)."""
        device = self.pos.device
        inp = torch.full((n, 1), self.vocab, dtype=torch.long, device=device)
        logp = torch.zeros(n, device=device)
        for i in range(self.seq_len):
            lp = torch.log_softmax(self._run(inp)[:, -1] / temperature, dim=-1)
            t = torch.multinomial(lp.exp(), 1, generator=generator)
            logp += lp.gather(-1, t).squeeze(-1)
            inp = torch.cat([inp, t], dim=1)
        return inp[:, 1:], logp


def _cached_layer_step(layer: nn.TransformerEncoderLayer, h: torch.Tensor, cache: list, i: int) -> torch.Tensor:
    """Position ``i`` through a pre-LayerNorm ``nn.TransformerEncoderLayer`` (GELU, no dropout at
    evaluation) with causal self-attention over the cached keys and values of positions <= i: the
    layer's own weights, the computation of its forward pass for that row. ``h`` (B, E);
    ``cache`` is [keys, values], each (B, heads, L, E / heads), rows < i filled."""
    import torch.nn.functional as F

    att = layer.self_attn
    e, nh = att.embed_dim, att.num_heads
    a = layer.norm1(h)
    q, k, v = F.linear(a, att.in_proj_weight, att.in_proj_bias).split(e, dim=-1)
    keys, vals = cache
    keys[:, :, i] = k.reshape(len(h), nh, e // nh)
    vals[:, :, i] = v.reshape(len(h), nh, e // nh)
    q = q.reshape(len(h), nh, 1, e // nh) * (e // nh) ** -0.5
    w = torch.softmax(q @ keys[:, :, : i + 1].transpose(-1, -2), dim=-1)     # (B, heads, 1, i + 1)
    o = (w @ vals[:, :, : i + 1]).reshape(len(h), e)
    h = h + att.out_proj(o)
    return h + layer.linear2(layer.activation(layer.linear1(layer.norm2(h))))


def draw_categorical(log_p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One exact draw per row from the categorical law exp(log_p) (rows normalised), by inverting
    its CDF at one uniform per row (float64 cumulative sums): the first index whose cumulative
    probability exceeds u. Same law as ``torch.multinomial(p, 1)``, which spends one exponential
    variate per category (256 per coordinate here). Returns (B, 1) indices."""
    cdf = log_p.double().exp().cumsum(-1)
    u = torch.rand(len(log_p), 1, generator=generator, dtype=torch.float64, device=log_p.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=log_p.shape[-1] - 1)


@torch.no_grad()
def cached_ancestral(net: CausalTransformer, n: int, n_new: int, generator: torch.Generator | None = None,
                     prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestral sampling from the block's causal transformer with a key/value cache.

    :meth:`CausalTransformer.sample` runs the whole prefix through the network again for every new token
    (L passes over up to L positions); a causal layer's output at position i depends only on
    positions <= i, so each position's keys and values are computed once and kept. Feeds BOS,
    then ``prefix`` (n, k) tokens if given (held fixed), then draws ``n_new`` tokens, each from
    softmax(logits) of the newest position (:func:`draw_categorical`). Returns
    (tokens (n, k + n_new), log P of the drawn tokens (n,)); ``test_arbg`` checks the cached
    logits against the full forward pass."""
    if net.training and any(m.p > 0 for m in net.modules() if isinstance(m, nn.Dropout)):
        raise RuntimeError("cached sampling has no dropout: call it in evaluation mode")
    if not all(layer.norm_first for layer in net.blocks.layers):
        raise ValueError("cached sampling implements the pre-LayerNorm layer only")
    device, dtype = net.pos.device, net.pos.dtype
    k = 0 if prefix is None else prefix.shape[1]
    length = k + n_new
    caches = []
    for layer in net.blocks.layers:
        e, nh = layer.self_attn.embed_dim, layer.self_attn.num_heads
        caches.append([torch.empty(n, nh, length, e // nh, device=device, dtype=dtype) for _ in range(2)])
    tok = torch.full((n,), net.vocab, dtype=torch.long, device=device)
    out, logp = [], torch.zeros(n, device=device)
    for i in range(length):
        h = net.tok(tok) + net.pos[0, i]
        for layer, cache in zip(net.blocks.layers, caches):
            h = _cached_layer_step(layer, h, cache, i)
        if i < k:                                   # prefix position: its token is given
            tok = prefix[:, i]
        else:
            lp = torch.log_softmax(net.head(net.norm(h)), dim=-1)
            t = draw_categorical(lp, generator)
            logp += lp.gather(-1, t).squeeze(-1)
            tok = t.squeeze(-1)
        out.append(tok)
    return torch.stack(out, dim=1), logp
