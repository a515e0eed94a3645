"""Vision Transformer (ViT) encoder built on torch's own transformer layers, for reuse.

Why a block: several methods need a small ViT trained from scratch (binding probes, masked image
models, vision-language toys). The layers themselves are torch's ``nn.TransformerEncoderLayer``
(pre-LayerNorm, GELU MLP: the ViT block of Dosovitskiy et al. 2021); what this module adds is the
ViT wrapper around them:

    x (B, C, H, W) --patchify (P x P, row-major)--> (B, N, C P^2) --linear--> (B, N, d)
    tokens = [cls; patches] + pos          (B, 1 + N, d), N = (H / P) (W / P)
    tokens = LN(Encoder_L(tokens))         L pre-LN blocks: t += MHSA(LN t); t += MLP(LN t)
    out    = head(tokens[:, 0])            optional linear head on [CLS]

Token 0 is [CLS]; token 1 + (r * W / P + c) is the patch in row r, column c. ``forward_tokens``
returns every token after the final LayerNorm (the representation probes read; as in timm's
``forward_features``); ``forward`` the head's output on [CLS].
"""
from __future__ import annotations

import torch
from torch import nn


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C * patch**2), patches in row-major order, pixels (c, i, j) inside."""
    b, c, h, w = x.shape
    if h % patch or w % patch:
        raise ValueError(f"image {h}x{w} is not divisible into {patch}x{patch} patches")
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


class VisionTransformer(nn.Module):
    def __init__(self, img_size: int, patch: int, dim: int, depth: int, heads: int, mlp_ratio: float = 2.0,
                 in_channels: int = 3, n_out: int | None = None, dropout: float = 0.0,
                 pos_embedding: bool = True):
        super().__init__()
        self.patch, self.dim = patch, dim
        self.n_patches = (img_size // patch) ** 2
        self.embed = nn.Linear(in_channels * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, 1 + self.n_patches, dim)) if pos_embedding else None
        layer = nn.TransformerEncoderLayer(dim, heads, int(mlp_ratio * dim), dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_out) if n_out else None
        nn.init.trunc_normal_(self.cls, std=0.02)
        if self.pos is not None:
            nn.init.trunc_normal_(self.pos, std=0.02)

    def embed_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Input tokens of the encoder: [CLS] and the linearly embedded patches, plus positions."""
        t = self.embed(patchify(x, self.patch))
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], dim=1)
        return t + self.pos if self.pos is not None else t

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """All tokens after the final LayerNorm: (B, 1 + N, dim), [CLS] first."""
        return self.norm(self.encoder(self.embed_tokens(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cls = self.forward_tokens(x)[:, 0]
        return self.head(cls) if self.head is not None else cls
