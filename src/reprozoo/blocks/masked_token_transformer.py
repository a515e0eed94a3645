"""Bidirectional masked-token transformer and its discrete-diffusion training / decoding, for reuse.

Why a block: masked (absorbing-state) discrete diffusion (MaskGIT, Chang et al. 2022; MDLM, Sahoo
et al. 2024; the unified multimodal models built on them) needs one piece the causal decoder in
``causal_transformer.py`` cannot give: every position sees every other position, and a special
[MASK] token marks what is still to be generated. The forward (noising) process replaces each
target token independently by [MASK] with probability t ~ U(0, 1); the network learns

    p_theta(x_i | x_masked)   for every masked position i,     loss = E_t E_mask [ CE over masked i ]

(the MaskGIT objective: plain mean over masked tokens; MDLM's 1/t weighting is a per-example factor
``weight`` the caller may pass). Generation runs the reverse process greedily in K steps: all
targets start as [MASK]; at step k the model predicts every masked position, and the most confident
predictions are kept so that after step k a fraction 1 - cos(pi/2 * k/K) of the targets is fixed
(MaskGIT's cosine schedule); visible tokens are never changed.

Layers are those of ``causal_transformer.CausalTransformer`` (torch's pre-LayerNorm
``nn.TransformerEncoderLayer``), run with no attention mask; token id ``vocab`` is [MASK]. ``logit_bias`` (L, vocab) lets a caller restrict a position to its own
modality's sub-vocabulary (0 allowed, -inf forbidden) in training and decoding alike.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .causal_transformer import CausalTransformer


class MaskedTokenTransformer(CausalTransformer):
    """Bidirectional encoder over ``seq_len`` tokens in ``{0..vocab-1}`` plus [MASK] (= ``vocab``).

    The layers, embeddings and head are those of ``CausalTransformer`` (its extra embedding row,
    BOS there, is [MASK] here); only the forward pass differs: no causal mask, no shift."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64, depth: int = 2, heads: int = 4,
                 mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__(vocab, seq_len, dim, depth, heads, mlp_ratio, dropout)
        self.mask_id = vocab

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L) tokens (``mask_id`` where masked) -> (B, L, vocab) logits; no causal mask."""
        h = self.tok(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.norm(self.blocks(h)))


def mask_targets(tokens: torch.Tensor, target: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward process: per example t ~ U(0, 1); each target position -> [MASK] with probability t.

    At least one target per example is masked (else the example teaches nothing). Returns the noised
    tokens, the boolean mask of masked positions and t (B,)."""
    b, length = tokens.shape
    t = torch.rand(b, 1, generator=generator)
    u = torch.rand(b, length, generator=generator)
    masked = (u < t) & target
    # force one masked target where none was drawn: the target position with the smallest u
    none = ~masked.any(1) & target.any(1)
    if none.any():
        u_t = torch.where(target, u, torch.full_like(u, 2.0))
        first = u_t.argmin(1)
        masked[none, first[none]] = True
    noised = torch.where(masked, torch.full_like(tokens, mask_id), tokens)
    return noised, masked, t.squeeze(1)


def masked_token_loss(model: MaskedTokenTransformer, tokens: torch.Tensor, target: torch.Tensor,
                      logit_bias: torch.Tensor | None = None, generator: torch.Generator | None = None,
                      ) -> torch.Tensor:
    """Mean cross-entropy (nats per masked token) of the clean tokens at the masked target positions."""
    noised, masked, _ = mask_targets(tokens, target, model.mask_id, generator)
    logits = model(noised)
    if logit_bias is not None:
        logits = logits + logit_bias
    return nn.functional.cross_entropy(logits[masked], tokens[masked])


@torch.no_grad()
def decode_greedy(model: MaskedTokenTransformer, tokens: torch.Tensor, target: torch.Tensor, steps: int,
                  logit_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reverse process, greedy (temperature 0): fill every target position of ``tokens`` in ``steps``
    passes, keeping the most confident argmax predictions on MaskGIT's cosine schedule. Non-target
    positions are returned unchanged."""
    x = torch.where(target, torch.full_like(tokens, model.mask_id), tokens)
    n_target = target.sum(1)                                       # (B,)
    for k in range(1, steps + 1):
        still = x == model.mask_id
        if not still.any():
            break
        logits = model(x)
        if logit_bias is not None:
            logits = logits + logit_bias
        prob, pred = logits.softmax(-1).max(-1)
        frac_fixed = 1.0 - math.cos(math.pi / 2 * k / steps)
        n_fixed_after = torch.ceil(frac_fixed * n_target - 1e-6).long() if k < steps else n_target
        n_new = (n_fixed_after - (target & ~still).sum(1)).clamp(min=0)
        conf = torch.where(still, prob, torch.full_like(prob, -1.0))
        order = conf.argsort(1, descending=True)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(x.shape[1]).expand_as(order))
        take = still & (rank < n_new[:, None])
        x = torch.where(take, pred, x)
    return x
