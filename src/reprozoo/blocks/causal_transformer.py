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
