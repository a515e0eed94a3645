"""EMFormer in miniature: multi-scale token mixing by ONE convolution, in a small patch transformer.

Multi-scale block. The multi-branch form (the paper's "conventional" module, and the reference
code's ``TripleConv2``) runs three depthwise convolutions of sizes 1, 3 and 5 on the same input and
sums them:

    y = w1 * x + w3 * x + w5 * x          (* : depthwise convolution, circular padding)

Convolution is linear in its kernel, so the sum equals ONE 5 x 5 convolution with the merged kernel
W = pad(w1) + pad(w3) + w5 (zero-padded to 5 x 5 and centred). ``SingleConvMultiScale`` keeps the
three kernels as parameters (same parameter count: 1 + 9 + 25 per channel) and builds W on every
call, so training (autograd through the merge) and inference both run a single convolution; the
reference code fuses the same three kernels in one CUDA kernel. Receptive field: 5 x 5 for both.

Forecaster (``EMFormerNet``). A field x of shape (B, C_var, 32, 64) is embedded by p x p patches
into (B, D, 32/p, 64/p), plus a learned position embedding; each block is pre-norm residual:

    x += Proj(Attention(MS(QKV(LN x))))     the multi-scale conv aggregates q, k, v (reference: MultiConvAttention)
    x += Linear(GELU(MS(LN x)))             multi-scale conv MLP (reference: MultiConvMlp)

then a transposed patch projection returns the increment: x_{t+1} = x_t + Net(x_t).

Accumulative context (``rollout(..., window > 0)``): each forecast step's attention also sees the
keys and values of up to ``window`` earlier steps of the same forecast (the reference code's KV
caches, ``add_kv``), the first of them observed frames before the start (``history``); window 0 is
the Markov forecaster of standard rollout fine-tuning. The context enters through its OWN attention
(the step's queries over the context keys/values only) and a zero-initialised output projection, the
context gate (``Block.ctx_proj``, ours, as in gated cross-attention / zero-initialised adapters):

    x += Proj(Attention(q, k, v)) + G (Attention(q, k_ctx + age, v_ctx)),   G = 0 at start

so a context, real or placebo, changes nothing until fine-tuning opens the gate: the accumulative
fine-tuning starts from the pretrained forecast, and G can take differences (x(t) - x(t-1)), which a
softmax average over present and past alone cannot. The context keys carry a learned context-age
embedding (ours, zero at start; ``Block.age``) so that a head can weigh the context entries by age.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

KERNELS = (1, 3, 5)


def _circular(x: torch.Tensor, p: int) -> torch.Tensor:
    return F.pad(x, (p, p, p, p), mode="circular") if p else x


PADDINGS = ("circular", "zeros")


def _conv(x: torch.Tensor, w: torch.Tensor, groups: int, padding: str) -> torch.Tensor:
    """Depthwise 'same' convolution; ``padding`` 'circular' (our periodic fields: an explicit pad,
    then a valid convolution) or 'zeros' (the reference code's ``nn.Conv2d(..., padding=k // 2)``:
    the padding inside the convolution call)."""
    p = w.shape[-1] // 2
    if padding == "circular":
        xp = _circular(x, p)
        if p and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            # the model's token maps are channels-last views of (B, N, C) tokens; the circular pad
            # returns NCHW, which would send the depthwise convolution (and its backward) through
            # two layout copies: keep the input's layout (same maths, other rounding; the block
            # timing's NCHW inputs are untouched)
            xp = xp.contiguous(memory_format=torch.channels_last)
        return F.conv2d(xp, w, groups=groups)
    if padding == "zeros":
        return F.conv2d(x, w, padding=p, groups=groups)
    raise ValueError(f"padding '{padding}': expected one of {PADDINGS}")


class MultiBranchConv(nn.Module):
    """Sum of depthwise convolutions of sizes 1, 3, 5: three kernels launched, three outputs summed."""

    def __init__(self, channels: int, padding: str = "circular"):
        super().__init__()
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.randn(channels, 1, k, k) / k) for k in KERNELS])
        self.channels, self.padding = channels, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = 0
        for w in self.weights:
            out = out + _conv(x, w, self.channels, self.padding)
        return out


class SingleConvMultiScale(MultiBranchConv):
    """The same three kernels (same parameters) merged into one 5 x 5 depthwise kernel: one
    convolution per call."""

    def merged_kernel(self) -> torch.Tensor:
        kmax = max(KERNELS)
        w = 0
        for wk in self.weights:
            p = (kmax - wk.shape[-1]) // 2
            w = w + F.pad(wk, (p, p, p, p))
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _conv(x, self.merged_kernel(), self.channels, self.padding)


def multiscale(kind: str, channels: int) -> nn.Module:
    if kind == "single":
        return SingleConvMultiScale(channels)
    if kind == "multibranch":
        return MultiBranchConv(channels)
    raise ValueError(f"multi-scale block '{kind}': expected 'single' or 'multibranch'")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(E)) v by ``F.scaled_dot_product_attention`` on contiguous q, k, v, which
    routes torch to its fused CPU kernel (flash attention: the same maths in blocks with an online
    softmax, other rounding: outputs and gradients within 1e-5 relative of ``attention_math``,
    tests/test_emformer.py); the strided layout of the model's q, k, v until this round sent it to the
    reference-math path at about twice the cost."""
    return F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())


def attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The reference: the operations of torch's reference-math path of
    ``F.scaled_dot_product_attention`` (q and k each scaled by E^(-1/4), matmul, softmax, matmul;
    no mask, so its guard for fully masked rows never acts), which the model used until this round."""
    sf = math.sqrt(1.0 / math.sqrt(q.shape[-1]))
    return torch.matmul(torch.softmax(torch.matmul(q * sf, k.transpose(-2, -1) * sf), -1), v)


MAX_AGE = 8  # context entries older than this share the last age embedding


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kind: str, mlp_ratio: int = 2):
        super().__init__()
        self.heads = heads
        # context-age embedding of the context keys (ours): row a is added to the keys of the step a
        # steps back (row 0, the current step, is unused since the context has its own attention), so
        # a head can weigh the context entries by age. Zero at start; a Markov step never uses it.
        self.age = nn.Parameter(torch.zeros(MAX_AGE + 1, dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.ms_qkv = multiscale(kind, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        # the context gate (ours): the context attention's output projection, zero at start, so the
        # forecast with any context equals the Markov (pretrained) one until fine-tuning opens it;
        # a Markov step never uses it (no context: no gradient), so pretraining leaves it at zero
        # (a plain zero tensor: creating it draws no random numbers, so the other weights start as
        # they did before the gate existed)
        self.ctx_proj = nn.Parameter(torch.zeros(dim, dim))
        self.ms_mlp = multiscale(kind, dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, h: int, w: int, cache: list | None = None, kv_only: bool = False):
        """``cache``: (k, v) of earlier forecast steps; the queries of this step attend to them too
        (the accumulated context). Returns the block output and this step's (k, v); ``kv_only``:
        (None, (k, v)), the rest of the block skipped (an observed frame that only opens the context:
        the same k, v, by the same operations)."""
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).transpose(1, 2).reshape(b, 3 * d, h, w)
        qkv = self.ms_qkv(qkv).reshape(b, 3 * d, n).transpose(1, 2)
        # one copy to contiguous (3, B, heads, N, E): q, k, v and the context's cached k, v are then
        # contiguous, which sends attention to torch's fused CPU kernel (``attention``)
        q, k, v = qkv.reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).contiguous()
        if kv_only:
            return None, (k, v)
        age = self.age.reshape(MAX_AGE + 1, self.heads, 1, d // self.heads)
        # age[0] shifts all of a query's keys alike (softmax-invariant); kept so that the Markov step
        # computes exactly what it did before the gate existed
        a = attention(q, k + age[0], v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(a)
        if cache:  # the context's own attention, through the zero-initialised gate
            n_c = len(cache)
            kc = torch.cat([c[0] + age[min(n_c - i, MAX_AGE)] for i, c in enumerate(cache)], dim=2)
            vc = torch.cat([c[1] for c in cache], dim=2)
            ac = attention(q, kc, vc).transpose(1, 2).reshape(b, n, d)
            x = x + F.linear(ac, self.ctx_proj)
        y = self.norm2(x).transpose(1, 2).reshape(b, d, h, w)
        y = self.ms_mlp(y).reshape(b, d, n).transpose(1, 2)
        return x + self.fc(F.gelu(y)), (k, v)


class EMFormerNet(nn.Module):
    def __init__(self, channels: int = 2, dim: int = 32, depth: int = 2, heads: int = 4, patch: int = 2,
                 kind: str = "single", grid: tuple[int, int] = (32, 64)):
        super().__init__()
        self.patch = patch
        self.embed = nn.Conv2d(channels, dim, patch, stride=patch)
        # learned absolute position embedding, zero at start (the reference's ``pos_embed``): the
        # forcing and the latitude weighting are fixed in space, which a translation-equivariant
        # network could not otherwise place
        self.pos_embed = nn.Parameter(torch.zeros(1, dim, grid[0] // patch, grid[1] // patch))
        self.blocks = nn.ModuleList([Block(dim, heads, kind) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.ConvTranspose2d(dim, channels, patch, stride=patch)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor, context: list | None = None, kv_only: bool = False):
        """One forecast step. ``context``: per earlier step, the list of per-block (k, v), or None
        (Markov step). Returns x_{t+1} and this step's per-block (k, v). ``kv_only``: returns
        (None, per-block (k, v)) without the last block's attention, MLP and the head, whose outputs
        a frame that only opens the context discards (same k, v, same operations: exact)."""
        z = self.embed(x) + self.pos_embed
        b, d, h, w = z.shape
        z = z.flatten(2).transpose(1, 2)
        kv = []
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            z, kv_i = blk(z, h, w, None if context is None else [c[i] for c in context],
                          kv_only=kv_only and i == last)
            kv.append(kv_i)
        if kv_only:
            return None, kv
        z = self.norm(z).transpose(1, 2).reshape(b, d, h, w)
        return x + self.head(z), kv


def rollout(net: EMFormerNet, x0: torch.Tensor, steps: int, window: int = 0, detach_inputs: bool = True,
            placebo_shift: int = 0, history: torch.Tensor | None = None):
    """Autoregressive forecast x_1..x_steps from x_0: (steps, B, C, H, W).

    window = 0: Markov steps (each sees only its input state). window > 0: accumulative context,
    each step also attends to the keys/values of up to ``window`` earlier steps of this forecast.
    ``detach_inputs``: the next step's input is the detached forecast (the reference training loop's
    ``inp = gen.detach()``); the context keeps its graph, so the loss teaches how to use it.
    ``placebo_shift`` (evaluation control): the context of forecast b is that of forecast
    b - placebo_shift of the batch (another start's earlier steps: context with the right statistics
    and the wrong content).
    ``history`` (B, H, C, H, W): OBSERVED frames x_{-H}..x_{-1} before the start; with window > 0
    the network first runs on them (outputs discarded) so that their keys/values open the context,
    the same keys/values a forecast step of that input would leave. Our reading of the paper's
    accumulative context on partially observed data: the only information a Markov forecaster lacks.
    """
    outs, ctx, x = [], [], x0

    def remember(kv):
        if window > 0:
            ctx.append([(torch.roll(k, placebo_shift, 0), torch.roll(v, placebo_shift, 0)) for k, v in kv]
                       if placebo_shift else kv)

    if history is not None and window > 0:  # observed frames before x_0 enter the context first
        for j in range(history.shape[1]):
            _, kv = net(history[:, j], ctx[-window:] or None, kv_only=True)  # outputs discarded
            remember(kv)
    for _ in range(steps):
        x, kv = net(x, (ctx[-window:] or None) if window > 0 else None)
        outs.append(x)
        remember(kv)
        if detach_inputs:
            x = x.detach()
    return torch.stack(outs)
