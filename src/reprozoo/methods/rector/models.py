"""The networks: RECTOR (hierarchical region-channel-temporal attention with adaptive functional
partitioning), the dense transformer of the same width, and an EEGNet-style CNN.

Token grid. An epoch is a grid of tokens h[c, t] (channel c, 1-s segment t), each the linear
embedding of its DE features plus a channel embedding computed from the electrode's 3-D position
(so the network is defined for any montage) and a learned segment embedding.

RECTOR-SA (one block, pre-LayerNorm residual updates):
1. within-region channel attention at each segment: attention logits between channels i, j get the
   additive bias log(S_ij + eps), S = P P^T, where P (C x R) is the soft assignment of channels to
   regions. With a one-hot P this is exactly block-sparse attention inside anatomical regions;
2. across-region attention: region tokens r_k = sum_c w_ck h_c / sum_c w_ck (w = P restricted to the
   channels present) attend to each other, and each channel receives its regions' update P_c. r';
3. temporal attention of each channel over its segments;
4. an MLP.
Adaptive Functional Partitioning: P = softmax(L) row-wise, L initialised at ``anat_logit`` x
one-hot(anatomical region) and learned with everything else, so the regions can move from the
anatomical definition to functional groups (the learned P is recorded as ``partition``). P gets its
own learning rate through the parametrisation L = ``part_lr_mult`` x theta: Adam's step on theta is
about the learning rate whatever the gradient's size, so L moves ``part_lr_mult`` times faster than
an ordinary weight (weight decay acts on theta, i.e. on L, at the shared rate). With
``fixed_partition`` P is the hard anatomical one-hot, a buffer never learned: exactly block-sparse
attention inside the anatomical regions (the hard fixed-P ablation). With ``learn_partition=False``
P is frozen at RECTOR's own soft start softmax(``anat_logit`` x one-hot) (the soft-frozen ablation:
the same sparsity as RECTOR's start, nothing learned). RECTOR starts near it (``anat_logit``
6 at smoke: about 0.99 own-region probability, >90 % of the attention mass inside the region at
initialisation) and moves P with its x``part_lr_mult`` rate.

Readout: each channel's state averaged over segments, concatenated over channels, linear head (the
same for RECTOR and the dense transformer). Missing channels: a channel that is absent is excluded
as a key (bias -1e4), from the region pooling and from the readout (zeros); its own tokens never
reach a present one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NEG = -1.0e4  # additive logit for excluded keys (finite: a row with every key excluded stays finite)


class Attention(nn.Module):
    """Multi-head self-attention with an additive logit bias (broadcast to (N, heads, L, L))."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        n, L, d = x.shape
        q, k, v = self.qkv(x).reshape(n, L, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.out(o.transpose(1, 2).reshape(n, L, d))


def mlp(dim: int, ratio: float) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, int(ratio * dim)), nn.GELU(), nn.Linear(int(ratio * dim), dim))


def region_bias(P: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Channel-channel logit bias (B, C, C): log of the probability that i and j share a region,
    log (P P^T)_ij (floored at 1e-4), and NEG for absent keys. One-hot P: block-sparse attention
    inside regions; uniform P: a constant, i.e. dense attention."""
    return torch.log(P @ P.T + 1e-4)[None] + torch.where(present, 0.0, NEG)[:, None, :]


class HierBlock(nn.Module):
    """One RECTOR-SA block on h (B, C, T, d)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.ln_c, self.att_c = nn.LayerNorm(dim), Attention(dim, heads)
        self.ln_r, self.att_r = nn.LayerNorm(dim), Attention(dim, heads)
        self.ln_t, self.att_t = nn.LayerNorm(dim), Attention(dim, heads)
        self.mlp = mlp(dim, mlp_ratio)

    def forward(self, h: torch.Tensor, P: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        B, C, T, d = h.shape
        R = P.shape[1]
        # 1. channels attend within (soft) regions, at each segment
        bias = region_bias(P, present)[:, None, None].expand(B, T, 1, C, C).reshape(B * T, 1, C, C)
        x = h.transpose(1, 2).reshape(B * T, C, d)
        x = x + self.att_c(self.ln_c(x), bias)
        # 2. region tokens from the present channels, attention across regions, broadcast back
        w = P[None] * present[..., None].float()  # (B, C, R)
        mass = w.sum(1)  # (B, R)
        w = w / (mass[:, None] + 1e-6)
        x = x.reshape(B, T, C, d)
        r = torch.einsum("bcr,btcd->btrd", w, x).reshape(B * T, R, d)
        rbias = torch.where(mass > 1e-3, 0.0, NEG)[:, None, None, None].expand(B, T, 1, 1, R).reshape(B * T, 1, 1, R)
        dr = self.att_r(self.ln_r(r), rbias).reshape(B, T, R, d)
        x = x + torch.einsum("cr,btrd->btcd", P, dr)
        # 3. each channel attends over its own segments (no mask: the channel's tokens only)
        x = x.transpose(1, 2).reshape(B * C, T, d)
        x = x + self.att_t(self.ln_t(x))
        x = x + self.mlp(x)
        return x.reshape(B, C, T, d)


class DenseBlock(nn.Module):
    """A standard pre-LN transformer block over all C*T tokens (full attention)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.ln, self.att = nn.LayerNorm(dim), Attention(dim, heads)
        self.mlp = mlp(dim, mlp_ratio)

    def forward(self, h: torch.Tensor, P: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        B, C, T, d = h.shape
        keymask = torch.where(present, 0.0, NEG)[:, None, :, None].expand(B, 1, C, T).reshape(B, 1, 1, C * T)
        x = h.reshape(B, C * T, d)
        x = x + self.att(self.ln(x), keymask)
        x = x + self.mlp(x)
        return x.reshape(B, C, T, d)


class TokenTransformer(nn.Module):
    """Encoder on DE tokens (B, C, T, F) -> token states (B, C, T, d); ``kind`` 'rector' | 'dense'."""

    def __init__(self, kind: str, n_feat: int, n_times: int, pos: torch.Tensor, region_ids: torch.Tensor,
                 n_regions: int, dim: int, depth: int, heads: int, mlp_ratio: float = 2.0,
                 anat_logit: float = 4.0, n_classes: int = 3, part_lr_mult: float = 1.0,
                 fixed_partition: bool = False, learn_partition: bool = True):
        super().__init__()
        self.kind = kind
        self.register_buffer("pos", pos.float())
        self.embed = nn.Linear(n_feat, dim)
        self.pos_mlp = nn.Sequential(nn.Linear(3, dim), nn.GELU(), nn.Linear(dim, dim))
        self.time = nn.Parameter(0.02 * torch.randn(1, 1, n_times, dim))
        self.mask_token = nn.Parameter(torch.zeros(dim))
        # adaptive functional partitioning: logits start at the anatomical one-hot
        # (the dense transformer has no regions: its blocks ignore P)
        onehot = F.one_hot(region_ids.long(), n_regions).float()
        learned = kind == "rector" and not fixed_partition and learn_partition
        self.part_lr_mult = float(part_lr_mult) if learned else 1.0
        self.fixed_partition = bool(fixed_partition) and kind == "rector"
        if learned:
            self.part_theta = nn.Parameter(anat_logit * onehot / self.part_lr_mult)
        else:
            # the hard fixed partition is the anatomical one-hot (block-sparse attention, the paper's
            # anatomical start); learn_partition=False keeps P frozen at RECTOR's soft start
            # softmax(anat_logit x one-hot) (the soft-frozen ablation); the logits are unused by the
            # dense model
            self.register_buffer("part_theta", anat_logit * onehot)
        self.register_buffer("part_onehot", onehot)
        block = HierBlock if kind == "rector" else DenseBlock
        self.blocks = nn.ModuleList(block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        # readout: each channel's state averaged over segments, concatenated over channels (an absent
        # channel contributes zeros), so the classifier keeps which electrode said what
        self.head = nn.Sequential(nn.LayerNorm(len(pos) * dim), nn.Dropout(0.25), nn.Linear(len(pos) * dim, n_classes))

    @property
    def part_logits(self) -> torch.Tensor:
        return self.part_lr_mult * self.part_theta

    @property
    def partition(self) -> torch.Tensor:
        if self.fixed_partition:
            return self.part_onehot
        return torch.softmax(self.part_logits, dim=1)

    def encode(self, x: torch.Tensor, present: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C, T, F) standardised DE, present (B, C) bool, token_mask (B, C, T) bool (masked
        tokens are replaced by the learned mask token)."""
        h = self.embed(x * present[..., None, None])
        if token_mask is not None:
            h = torch.where(token_mask[..., None], self.mask_token.expand_as(h), h)
        h = h + self.pos_mlp(self.pos)[None, :, None] + self.time
        P = self.partition
        for blk in self.blocks:
            h = blk(h, P, present)
        return self.norm(h)

    def pool(self, h: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        w = present.float()[..., None, None]
        return (h * w).sum((1, 2)) / (w.sum((1, 2)) * h.shape[2])

    def forward(self, x: torch.Tensor, present: torch.Tensor, fill: bool = False) -> torch.Tensor:
        """Logits. fill=False: absent channels are excluded (see above). fill=True: they are kept as
        mask tokens, as in masked predictive pre-training, and the network infers their states."""
        if fill:
            m = (~present)[..., None].expand(*present.shape, x.shape[2])
            h = self.encode(x * present[..., None, None], torch.ones_like(present), m).mean(2)
            return self.head(h.flatten(1))
        h = self.encode(x, present).mean(2) * present[..., None].float()
        return self.head(h.flatten(1))


class EEGNet(nn.Module):
    """EEGNet-style CNN (Lawhern et al. 2018, EEGNet-8,2) on raw epochs (B, C, L):
    temporal conv (F1 kernels of ``kern`` samples) -> depthwise spatial conv (D per kernel) -> BN,
    ELU, avg-pool 4, dropout -> separable conv (F2, 16) -> BN, ELU, avg-pool 8, dropout -> linear."""

    def __init__(self, n_ch: int, n_times: int, n_classes: int = 3, F1: int = 8, D: int = 2, F2: int = 16,
                 kern: int = 32, dropout: float = 0.25):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, F1, (1, kern), padding=(0, kern // 2), bias=False), nn.BatchNorm2d(F1),
            nn.Conv2d(F1, F1 * D, (n_ch, 1), groups=F1, bias=False), nn.BatchNorm2d(F1 * D), nn.ELU(),
            nn.AvgPool2d((1, 4)), nn.Dropout(dropout),
            nn.Conv2d(F1 * D, F1 * D, (1, 16), padding=(0, 8), groups=F1 * D, bias=False),
            nn.Conv2d(F1 * D, F2, 1, bias=False), nn.BatchNorm2d(F2), nn.ELU(),
            nn.AvgPool2d((1, 8)), nn.Dropout(dropout), nn.Flatten())
        self.n_times = n_times
        with torch.no_grad():
            n_flat = self.net(torch.zeros(1, 1, n_ch, n_times)).shape[1]
        self.head = nn.Linear(n_flat, n_classes)

    def forward(self, x: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        x = x * present[..., None]
        if not self.training:  # the same function, the spatial sum taken first (see fused_spatial)
            return self.head(self.net[3:](self.fused_spatial(x)))
        return self.head(self.net(x[:, None]))

    def fused_spatial(self, x: torch.Tensor) -> torch.Tensor:
        """Temporal conv -> BatchNorm (eval: an affine map per kernel) -> depthwise spatial conv, in eval
        mode, with the channel sum taken before the temporal convolution: all three are linear, so
        sum_c w_oc (a_f conv_f(x_c) + b_f) = a_f conv_f(sum_c w_oc x_c) + b_f sum_c w_oc for output map
        o of kernel f = o // D. The temporal convolution then runs on F1 x D maps instead of F1 x C
        (the validation pass of every fit and the test pass; about 10x less work at 19 channels).
        Exact up to rounding (test_eegnet_fused_eval_path_equals_the_layer_by_layer_one)."""
        conv_t, bn, conv_s = self.net[0], self.net[1], self.net[2]
        D = conv_s.out_channels // conv_t.out_channels
        w_s = conv_s.weight[:, 0, :, 0]  # (F1 D, C)
        a = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        b = bn.bias - bn.running_mean * a
        z = torch.einsum("oc,bcl->bol", w_s, x)
        kern = conv_t.weight[:, 0, 0, :].repeat_interleave(D, 0)[:, None]  # (F1 D, 1, k)
        h = F.conv1d(z, kern, padding=conv_t.padding[1], groups=z.shape[1])
        h = h * a.repeat_interleave(D)[:, None] + (b.repeat_interleave(D) * w_s.sum(1))[:, None]
        return h[:, :, None]

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        """The temporal convolution and its BatchNorm (B, F1, C, L'): per channel, so in eval mode a
        zero-filled channel's rows are the stem of zeros whatever the other channels hold."""
        return self.net[:2](x[:, None])

    def from_stem(self, h: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """Logits from the intact epochs' stem with the absent channels' rows set to the stem of a
        zero input: the same as ``forward`` with those channels zero-filled (eval mode), at a
        fraction of the cost (the drop test reuses one stem for every drop set)."""
        z = self.net[:2](torch.zeros(1, 1, *h.shape[2:3], self.n_times, dtype=h.dtype))
        h = torch.where(present[:, None, :, None], h, z)
        return self.head(self.net[2:](h))


# --- self-supervised objectives (Masked Topology and Representation Learning) ------------------

class PretrainHeads(nn.Module):
    """Decoders of the three objectives: DE of masked tokens, channel connectivity, pooled projection."""

    def __init__(self, dim: int, n_feat: int, proj: int = 32):
        super().__init__()
        self.decode = nn.Linear(dim, n_feat)
        self.topo = nn.Linear(dim, proj)
        self.project = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, proj))


def draw_masks(B: int, C: int, T: int, token_frac: float, channel_frac: float, gen: torch.Generator):
    """A view's corruption: random tokens masked (token_frac) and whole channels masked (channel_frac)."""
    tok = torch.rand(B, C, T, generator=gen) < token_frac
    ch = torch.rand(B, C, generator=gen).argsort(1) < int(round(channel_frac * C))
    return tok | ch[..., None]


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
    """InfoNCE over a batch of positive pairs (z1_i, z2_i), both directions (SimCLR's NT-Xent)."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / tau
    n = len(z1)
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(sim, target)


def pretrain_losses(model: TokenTransformer, heads: PretrainHeads, x: torch.Tensor, corr: torch.Tensor,
                    gen: torch.Generator, token_frac: float, channel_frac: float, tau: float) -> dict:
    """The three objectives on two independently masked views of the same windows:
    mpm: MSE of the decoded DE at masked tokens; tsm: MSE between cos(z_i, z_j) of the channel
    embeddings and the alpha-band correlation (upper triangle); cvc: NT-Xent between the views'
    pooled projections."""
    B, C, T, _ = x.shape
    present = torch.ones(B, C, dtype=torch.bool)
    iu = torch.triu_indices(C, C, 1)
    mpm, tsm, zs = 0.0, 0.0, []
    for _ in range(2):
        m = draw_masks(B, C, T, token_frac, channel_frac, gen)
        h = model.encode(x, present, m)
        err = ((heads.decode(h) - x) ** 2).mean(-1)
        mpm = mpm + (err * m).sum() / m.sum().clamp(min=1) / 2
        z = F.normalize(heads.topo(h.mean(2)), dim=-1)
        cz = z @ z.transpose(1, 2)
        tsm = tsm + ((cz - corr)[:, iu[0], iu[1]] ** 2).mean() / 2
        zs.append(heads.project(model.pool(h, present)))
    return {"mpm": mpm, "tsm": tsm, "cvc": nt_xent(zs[0], zs[1], tau)}


class PretrainModel(nn.Module):
    """The encoder and its pre-training decoders as one module (one optimiser, one state to keep)."""

    def __init__(self, net: TokenTransformer, heads: PretrainHeads):
        super().__init__()
        self.net, self.heads = net, heads


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
