"""Spike-HTR in miniature: InkCoder, spiking CNN encoder, CTC-guided length reducer, mixer, CTC head.

Shapes: a line image x is (B, 1, H, W); the spiking path is time-major (T, B, C, H, W).

* InkCoder (coarse-to-fine stream, ``InkCoder``). Step t of T sees the image low-passed by a
  Gaussian of width σ_t, B_t = G_{σ_t} * x, with part d_t of the removed detail added back:
  I_t = B_t + d_t (x - B_t) + b_t. Its response to a spatial frequency ω is
  r_t(ω) = d_t + (1 - d_t) Ĝ_{σ_t}(ω), with 0 < Ĝ <= 1 growing as σ shrinks. ``learned`` (the
  method): σ_1 >= σ_2 >= ... >= σ_T (σ_T = softplus(u_T), σ_t = σ_{t+1} + softplus(u_t), capped at
  σ_cap) and 0 <= d_1 <= d_2 <= ... <= d_T <= 1 (d_t = sigmoid(v + Σ_{s<=t} softplus(w_s))), so that
  r_{t+1}(ω) >= r_t(ω) at every frequency: each step is at least as sharp as the one before, by
  construction; u, v, w, b are trained with the network (init: σ = (σ_max, ..., σ_last), d ≈ 0.02,
  b = 0, i.e. the blur pyramid). ``fixed`` (the ablation, the miniature's former coder):
  σ_t = σ_max (T - t)/(T - 1), I_t = B_t, nothing trained. The paper's InkCoder is learned but its
  parametrisation is not available to us (see README); this one is our reading of "early steps
  cover broad stroke regions, later steps emphasise sharper stroke details". Blurring conserves
  ink (kernel sums to 1).
* Spiking encoder: three 3x3 conv + BatchNorm (statistics over T·B) + LIF layers
  (``blocks.spiking.lif``, run as ``lif_fast``: v_t = β v_{t-1}(1 - s_{t-1}) + I_t, s_t = H(v_t - θ), arctan surrogate),
  max-pooling after the first two (2x2 then 2x1 by default; pooling binary spikes keeps them
  binary); the height is flattened into channels and a linear map gives d-dim features at every
  step at L = W/2 width positions. The ANN CRNN has the same convolutions with ReLU, one step.
* CTC-guided length reducer: an auxiliary CTC head on the encoder features gives, per position,
  p(blank) and the argmax class. A position is kept if its argmax is a character or if it is
  uncertain (p(blank) < τ). The maximal runs of the remaining confident-blank positions are
  compressed the way CTC allows: a run between two kept positions with the same character
  argmax becomes ONE position (the blank that lets CTC emit a doubled character), every other
  run is merged into its kept neighbours (CTC needs no blank between different characters).
  The mixer then sees L' <= L positions. ``reduce="runs"`` (ablation, the former rule) keeps one
  position of every run; ``reduce="drop"`` (a control, never trained) removes the runs, so that
  two equal characters may become adjacent; ``reduce="uniform"`` (a control, never trained)
  pools the line uniformly to the length the reducer chose, ignoring the CTC head;
  ``reduce="off"`` keeps every position (the aux head still runs and is counted).
* Positions: sinusoidal encodings are added to the per-step features BEFORE the reducer (a
  merged run carries the mean of its positions). The reducer runs on the time-mean features and
  pools every step with the same segments.
* Mixer and head: two transformer blocks over the (reduced) sequence, the same sizes in every
  variant: spike-driven blocks (``SpikingBlock``: LIF Q/K/V, spiking self-attention without
  softmax, LIF-MLP) in the SNN variants, torch's pre-LN transformer layer (softmax attention) in
  the ANN; the time-mean of the residual stream feeds a linear CTC head (K+1 classes, 0 = blank).

Costs per line (``costs``): synaptic operations (AC, one per spike per reached synapse,
``blocks.spiking.synaptic_ops``) for spike-driven layers, multiply-accumulates (MAC) for layers
with real-valued input (the first conv on the analog InkCoder stream, the aux head, the mixer and
head, and InkCoder's filters); in the spiking attention Q K^T and (Q K^T) V are counted spike by
spike (``spiking_block_acs``), quadratic in the length. Energy = 0.9 pJ·AC + 4.6 pJ·MAC (45 nm, 32-bit; Horowitz 2014, the usual SNN proxy).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...blocks.spiking import arctan, spike, synaptic_ops


def lif_fast(current: torch.Tensor, beta: float, threshold: float, surrogate, mems: bool = False):
    """``blocks.spiking.lif`` (reset to zero, detached reset) without its work at t = 1 on a zero
    state: there v_1 = β·0·(1 − 0) + I_1 = I_1, so the same spikes, membranes and gradients (up to
    the sign of a zero; tested against ``lif``), for fewer operations per step (round 13, budget).
    Returns the spikes (T, ...), and the membranes before reset too with ``mems``."""
    v = current[0]
    s = spike(v - threshold, surrogate)
    spikes, vs = [s], [v]
    for t in range(1, current.shape[0]):
        v = beta * v * (1 - s.detach()) + current[t]
        s = spike(v - threshold, surrogate)
        spikes.append(s)
        vs.append(v)
    return (torch.stack(spikes), torch.stack(vs)) if mems else torch.stack(spikes)

E_AC_PJ, E_MAC_PJ = 0.9, 4.6  # Horowitz (ISSCC 2014), 45 nm, 32-bit float


# ------------------------------------------------------------------ InkCoder
def gaussian_kernel(sigma, radius: int) -> torch.Tensor:
    """Normalised 1-d Gaussian of length 2·radius + 1 (a delta for sigma = 0); differentiable in a
    tensor ``sigma``."""
    x = torch.arange(-radius, radius + 1, dtype=torch.float32)
    if not torch.is_tensor(sigma) and sigma <= 0:
        return (x == 0).float()
    sigma = torch.as_tensor(sigma, dtype=torch.float32).clamp(min=1e-3)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def blur_matrix(k: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, n) matrix of a 1-d convolution with kernel ``k`` (length 2r + 1) under replicate
    padding: row i sums k over the taps i - r .. i + r, each clamped to 0 .. n - 1 (differentiable
    in ``k``)."""
    r = (k.numel() - 1) // 2
    idx = (torch.arange(n).unsqueeze(1) + torch.arange(-r, r + 1).unsqueeze(0)).clamp(0, n - 1)
    return k.new_zeros(n, n).scatter_add(1, idx, k.expand(n, -1))


def blur(x: torch.Tensor, sigma, radius: int) -> torch.Tensor:
    """Separable Gaussian blur of (B, 1, H, W) with replicate padding, as two matrix products
    (Kh x Kw^T, the padding folded into the border rows of K): the same sums as the padded
    convolution (until round 10; up to float rounding, tested), ~10x cheaper on CPU for these
    narrow images."""
    k = gaussian_kernel(sigma, radius)
    H, W = x.shape[-2:]
    return blur_matrix(k, H) @ x @ blur_matrix(k, W).transpose(0, 1)


def fixed_sigmas(T: int, sigma_max: float) -> list[float]:
    """The fixed pyramid: σ_t = σ_max (T - t)/(T - 1), t = 1..T (the last step sharp)."""
    return [sigma_max * (T - t) / max(1, T - 1) for t in range(1, T + 1)]


def inkcoder(x: torch.Tensor, T: int, sigma_max: float) -> torch.Tensor:
    """The fixed coarse-to-fine stream (T, B, 1, H, W) (``InkCoder(learned=False)``)."""
    radius = max(1, math.ceil(3 * sigma_max))
    return torch.stack([blur(x, s, radius) for s in fixed_sigmas(T, sigma_max)])


def _inv_softplus(y: float) -> float:
    return math.log(math.expm1(y))


class InkCoder(nn.Module):
    """Static image (B, 1, H, W) -> coarse-to-fine input stream (T, B, 1, H, W); see the module doc."""

    def __init__(self, T: int, sigma_max: float = 1.0, learned: bool = True, sigma_last: float = 0.3,
                 sigma_cap: float = 2.0, detail_init: float = 0.02):
        super().__init__()
        self.T, self.learned, self.sigma_max, self.sigma_cap = T, learned, sigma_max, sigma_cap
        if learned:
            init = [sigma_max + (sigma_last - sigma_max) * t / max(1, T - 1) for t in range(T)]
            steps = [init[t] - init[t + 1] for t in range(T - 1)] + [init[-1]]
            self.u = nn.Parameter(torch.tensor([_inv_softplus(max(v, 1e-3)) for v in steps]))
            self.v = nn.Parameter(torch.tensor(math.log(detail_init / (1 - detail_init)) - 1e-3))
            self.w = nn.Parameter(torch.full((T,), _inv_softplus(1e-3)))
            self.bias = nn.Parameter(torch.zeros(T))
            self.radius = max(1, math.ceil(3 * sigma_cap))
        else:
            self.radius = max(1, math.ceil(3 * sigma_max))

    def sigmas(self) -> torch.Tensor:
        """σ_1 >= ... >= σ_T (a reversed cumulative sum of positive increments)."""
        if not self.learned:
            return torch.tensor(fixed_sigmas(self.T, self.sigma_max))
        inc = nn.functional.softplus(self.u)
        return inc.flip(0).cumsum(0).flip(0).clamp(max=self.sigma_cap)

    def details(self) -> torch.Tensor:
        """0 <= d_1 <= ... <= d_T <= 1: the share of the high-pass detail each step adds back."""
        if not self.learned:
            return torch.zeros(self.T)
        return torch.sigmoid(self.v + nn.functional.softplus(self.w).cumsum(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sig = self.sigmas()
        if self.learned:
            det = self.details()
        steps = []
        for t in range(self.T):
            low = blur(x, sig[t] if self.learned else float(sig[t]), self.radius)
            if self.learned:
                low = low + det[t] * (x - low) + self.bias[t]
            steps.append(low)
        return torch.stack(steps)

    def macs(self, H: int, W: int) -> float:
        """Multiply-accumulates per image: the separable blur (2 (2r+1) per pixel and step), and
        for the learned coder the mix B + d (x - B) + b (3 per pixel and step)."""
        per_px = 2 * (2 * self.radius + 1) + (3 if self.learned else 0)
        return float(self.T * H * W * per_px)


# ------------------------------------------------------------------ reducer
def ctc_guided_reduce(feat: torch.Tensor, aux_logp: torch.Tensor, tau: float, mode: str = "merge"):
    """Keep likely-character / uncertain positions, compress the confident-blank runs.

    ``feat`` (B, L, d), ``aux_logp`` (B, L, K+1) log-probabilities of the auxiliary CTC head. A
    position is kept if its argmax is a character or p(blank) < τ; the other (confident-blank)
    positions form maximal runs between kept positions. ``mode``:

    * ``"merge"`` (the method, CTC-aware): CTC needs a blank only between two EQUAL characters. A
      run between two kept positions whose argmax is the same character becomes ONE position (the
      mean of its features); every other run is merged into its kept neighbours (each position of
      the run joins the nearer neighbour's segment, ties to the left; a leading run joins the first
      kept position, a trailing run the last). A line with no kept position becomes one position.
      The kept length is then at least n + repeats for a confident head marking each character.
    * ``"runs"`` (ablation, the former rule): every run becomes one position, also between
      different characters (a floor near (2n + 1)/L).
    * ``"drop"`` (a control, never trained): the runs are removed (a line with no kept position
      keeps its first one), so two equal characters may become adjacent.

    Returns (pooled (B, L'max, d), new lengths (B,), keep mask (B, L), segment id (B, L); -1 for a
    dropped position). Segment ids are non-decreasing along the width in every mode."""
    if mode not in ("merge", "runs", "drop"):
        raise ValueError(f"mode must be 'merge', 'runs' or 'drop', got {mode!r}")
    B, L, d = feat.shape
    with torch.no_grad():
        lab = aux_logp.argmax(-1)
        keep = (lab != 0) | (aux_logp[..., 0].exp() < tau)
        member = torch.ones_like(keep)
        if mode == "runs":
            prev_keep = torch.cat([torch.ones_like(keep[:, :1]), keep[:, :-1]], dim=1)
            start = keep | prev_keep                   # a kept position, or the first of a blank run
            seg = start.long().cumsum(1) - 1
        elif mode == "drop":
            keep = keep.clone()
            keep[~keep.any(1), 0] = True
            start = member = keep
            seg = start.long().cumsum(1) - 1
        else:
            idx = torch.arange(L).expand(B, L)
            left = torch.where(keep, idx, torch.full_like(idx, -1)).cummax(1).values       # last kept <= i
            right = torch.where(keep, idx, torch.full_like(idx, L)).flip(1).cummin(1).values.flip(1)
            lab_l = lab.gather(1, left.clamp(0, L - 1))
            lab_r = lab.gather(1, right.clamp(0, L - 1))
            inner = (left >= 0) & (right < L)
            own = ~keep & ((inner & (lab_l != 0) & (lab_l == lab_r)) | ((left < 0) & (right >= L)))
            prev_keep = torch.cat([torch.ones_like(keep[:, :1]), keep[:, :-1]], dim=1)
            start = keep | (own & prev_keep)           # kept positions, first of a kept blank run
            base = start.long().cumsum(1) - 1
            to_left = (right >= L) | (inner & ((idx - left) <= (right - idx)))
            anchor = torch.where(keep | own, idx, torch.where(to_left, left, right))
            seg = base.gather(1, anchor.clamp(0, L - 1))
        n_seg = seg.max(1).values + 1
        seg = torch.where(member, seg, torch.full_like(seg, -1))
    return _pool_segments(feat, seg, member, n_seg) + (keep, seg)


def _pool_segments(feat: torch.Tensor, seg: torch.Tensor, member: torch.Tensor, n_seg: torch.Tensor):
    """Mean of ``feat`` (B, L, d) over each segment id of ``seg`` (B, L) (members only): (B, L'max, d), n_seg."""
    B, L, d = feat.shape
    Lr = int(n_seg.max())
    w = member.unsqueeze(-1).to(feat.dtype)
    idx = seg.clamp(min=0)
    pooled = feat.new_zeros(B, Lr, d).scatter_add(1, idx.unsqueeze(-1).expand(-1, -1, d), feat * w)
    counts = feat.new_zeros(B, Lr, 1).scatter_add(1, idx.unsqueeze(-1), w)
    return pooled / counts.clamp(min=1), n_seg


def uniform_pool(feat: torch.Tensor, lengths: torch.Tensor):
    """The control of ``reducer_cer_margin``: pool each line's L positions uniformly into its given
    length n (segment of position i: floor(i n / L), contiguous and non-empty for n <= L), ignoring
    the CTC head. Returns (pooled (B, n_max, d), lengths, segment id (B, L))."""
    B, L, d = feat.shape
    n = lengths.clamp(1, L).long()
    seg = (torch.arange(L).view(1, L) * n.view(B, 1)) // L
    pooled, n = _pool_segments(feat, seg, torch.ones(B, L, dtype=torch.bool), n)
    return pooled, n, seg


def ink_reduce_lengths(x: torch.Tensor, stride: int, threshold: float = 0.5) -> torch.Tensor:
    """A weak reducer (the control of ``reducer_keeps_half``): a width position is kept when its
    ``stride`` pixel columns hold ink (any pixel above ``threshold``); each run of ink-free
    positions is merged into one, as in ``ctc_guided_reduce``. Returns the kept length per line
    (B,) for images (B, 1, H, W)."""
    B, _, H, W = x.shape
    L = W // stride
    ink = (x[:, 0, :, :L * stride] > threshold).any(1).view(B, L, stride).any(2)     # (B, L)
    prev = torch.cat([torch.ones_like(ink[:, :1]), ink[:, :-1]], dim=1)
    return (ink | prev).sum(1)


# ------------------------------------------------------------------ mixers
def positional_encoding(L: int, d: int) -> torch.Tensor:
    """Sinusoidal positions (L, d) (Vaswani et al. 2017): added to the encoder features BEFORE the
    reducer, so that a merged blank run carries the mean of its positions."""
    pos = torch.arange(L, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float32) / d)
    pe = torch.zeros(L, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: d // 2])
    return pe


class SpikingBlock(nn.Module):
    """One spike-driven transformer block over a time-major sequence x (T, B, L, d), padded
    positions masked by ``valid`` (B, L). Branches start with LIF neurons on the residual stream
    (the membrane shortcut of Spike-driven Transformer, Yao et al. 2023), so every linear map reads
    spikes; spiking self-attention (Spikformer, Zhou et al. 2023) without softmax:

        s = LIF(x);  Q, K, V = LIF(LN(W_q s)), LIF(LN(W_k s)), LIF(LN(W_v s))   (binary)
        A_h = Q_h K_h^T V_h · scale  (per head, keys/values of padded positions zeroed)
        x = x + LN(W_o LIF(A))
        x = x + LN(W_2 LIF(LN(W_1 LIF(x))))

    LayerNorm stands where the papers put BatchNorm: the padded positions of variable-length
    (reduced) lines would otherwise enter the batch statistics."""

    def __init__(self, d: int, heads: int, mlp: int, beta: float, threshold: float, surrogate,
                 attn_threshold: float = 0.5):
        super().__init__()
        self.d, self.heads, self.mlp = d, heads, mlp
        self.beta, self.threshold, self.attn_threshold, self.surrogate = beta, threshold, attn_threshold, surrogate
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.ln_qkv = nn.ModuleList([nn.LayerNorm(d) for _ in range(3)])
        self.out = nn.Linear(d, d, bias=False)
        self.ln_out = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, mlp, bias=False), nn.Linear(mlp, d, bias=False)
        self.ln1, self.ln2 = nn.LayerNorm(mlp), nn.LayerNorm(d)
        self.scale = 1.0 / (d // heads)

    def _lif(self, cur, thr=None):
        return lif_fast(cur, self.beta, self.threshold if thr is None else thr, self.surrogate)

    def forward(self, x: torch.Tensor, valid: torch.Tensor, ops: list | None = None) -> torch.Tensor:
        T, B, L, d = x.shape
        m = valid.view(1, B, L, 1).to(x.dtype)
        s = self._lif(x) * m
        qkv = torch.cat([ln(c) for ln, c in zip(self.ln_qkv, self.qkv(s).chunk(3, dim=-1))], dim=-1)
        q, k, v = (self._lif(qkv) * m).chunk(3, dim=-1)        # one LIF population for Q, K and V
        h, dh = self.heads, d // self.heads
        qh, kh, vh = (z.view(T, B, L, h, dh).transpose(2, 3) for z in (q, k, v))    # (T, B, h, L, dh)
        a = (qh @ kh.transpose(-1, -2)) @ vh * self.scale                           # (T, B, h, L, dh)
        a = a.transpose(2, 3).reshape(T, B, L, d)
        y = self._lif(a, self.attn_threshold) * m
        x = x + self.ln_out(self.out(y))
        s2 = self._lif(x) * m
        z = self._lif(self.ln1(self.fc1(s2))) * m
        x = x + self.ln2(self.fc2(z))
        if ops is not None:   # spike tensors and their fan-outs, for the cost count
            ops.append({"s": s, "q": q, "k": k, "v": v, "y": y, "s2": s2, "z": z, "heads": h})
        return x


def spiking_block_acs(rec: dict, d: int, mlp: int) -> float:
    """Synaptic operations (AC) of one ``SpikingBlock`` over the whole batch, from its spikes:
    linear maps Σ spikes x fan-out; attention spike-driven and quadratic in the length:
    Q K^T costs Σ_c n_Q(c) n_K(c) additions per head and step (n_Q(c): the positions where query
    channel c fired), (Q K^T) V costs L x nnz(V) (each value spike adds one score column per query
    position; L = the line's own length)."""
    ac = synaptic_ops(rec["s"], 3 * d) + synaptic_ops(rec["y"], d) + synaptic_ops(rec["s2"], mlp) \
        + synaptic_ops(rec["z"], d)
    q, k, v = rec["q"], rec["k"], rec["v"]                     # (T, B, L, d) binary, padding zeroed
    ac += float((q.sum(2) * k.sum(2)).sum())                   # Σ_{t,b,c} n_Q n_K (heads split c)
    n_valid = rec["n"].view(1, -1, 1).to(v.dtype)              # (1, B, 1): each line's length
    ac += float((v.sum(2) * n_valid).sum())
    return ac


class ANNBlock(nn.Module):
    """The ANN counterpart: torch's pre-LayerNorm transformer layer (softmax attention, ReLU MLP),
    padded keys masked."""

    def __init__(self, d: int, heads: int, mlp: int):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, mlp, 0.0, activation="relu", batch_first=True,
                                                norm_first=True)

    def forward(self, x: torch.Tensor, valid: torch.Tensor, ops=None) -> torch.Tensor:
        return torch.stack([self.layer(xt, src_key_padding_mask=~valid) for xt in x])


# ------------------------------------------------------------------ networks
class Recognizer(nn.Module):
    """Encoder (spiking or ANN) -> per-step features + positions -> [reducer] -> transformer mixer
    (2 blocks; spiking or ANN) -> CTC head."""

    def __init__(self, height: int, n_classes: int, channels=(16, 32, 48), d_model: int = 64,
                 heads: int = 4, mlp: int = 96, blocks: int = 2, spiking: bool = True, reducer: bool = False,
                 T: int = 2, sigma_max: float = 1.5, beta: float = 0.5, threshold: float = 1.0, tau: float = 0.9,
                 pools=((2, 2), (2, 1), (1, 1)), readout: str = "membrane", coder: str = "learned",
                 sigma_last: float = 0.3, sigma_cap: float = 2.0, max_len: int = 512):
        super().__init__()
        if coder not in ("learned", "fixed", "direct"):
            raise ValueError(f"coder must be 'learned', 'fixed' or 'direct', got {coder!r}")
        c1, c2, c3 = channels
        self.spiking, self.use_reducer, self.T, self.readout = spiking, reducer, T, readout
        self.sigma_max, self.beta, self.threshold, self.tau = sigma_max, beta, threshold, tau
        self.surrogate = arctan(2.0)
        self.coder = (InkCoder(T, sigma_max, learned=coder == "learned", sigma_last=sigma_last,
                               sigma_cap=sigma_cap) if coder != "direct" else None) if spiking else None
        self.convs = nn.ModuleList([nn.Conv2d(1, c1, 3, padding=1, bias=False),
                                    nn.Conv2d(c1, c2, 3, padding=1, bias=False),
                                    nn.Conv2d(c2, c3, 3, padding=1, bias=False)])
        self.bns = nn.ModuleList([nn.BatchNorm2d(c) for c in channels])
        self.pools = [tuple(k) for k in pools]
        self.h_out = height // math.prod(k[0] for k in self.pools)
        self.stride = math.prod(k[1] for k in self.pools)   # pixel columns per width position
        self.proj = nn.Linear(c3 * self.h_out, d_model)
        self.register_buffer("pe", positional_encoding(max_len, d_model), persistent=False)
        self.aux_head = nn.Linear(d_model, n_classes + 1)
        Block = (lambda: SpikingBlock(d_model, heads, mlp, beta, threshold, self.surrogate)) if spiking \
            else (lambda: ANNBlock(d_model, heads, mlp))
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes + 1)
        self.d_model, self.heads, self.mlp, self.n_out = d_model, heads, mlp, n_classes + 1

    def stream(self, x: torch.Tensor) -> torch.Tensor:
        """The T-step input (T, B, 1, H, W): InkCoder's stream, or the same image at every step (direct)."""
        if self.coder is None:
            return x.unsqueeze(0).expand(self.T, *x.shape)
        return self.coder(x)

    # encoder: per-step features (T, B, L, d) and the activations that feed each layer
    def encode(self, x: torch.Tensor):
        acts = []                                      # inputs of convs[1], convs[2], proj
        if self.spiking:
            h = self.stream(x)                         # (T, B, 1, H, W)
            T, B = h.shape[:2]
            for i, (conv, bn, pool) in enumerate(zip(self.convs, self.bns, self.pools)):
                cur = bn(conv(h.flatten(0, 1)))
                last = i == len(self.convs) - 1 and self.readout == "membrane"
                s = lif_fast(cur.view(T, B, *cur.shape[1:]), self.beta, self.threshold, self.surrogate, mems=last)
                if last:
                    s = s[1]                           # last layer read out by its membrane potential
                if pool != (1, 1):
                    s = nn.functional.max_pool2d(s.flatten(0, 1), pool)
                    s = s.view(T, B, *s.shape[1:])
                acts.append(s)
                h = s
        else:
            h = x
            for conv, bn, pool in zip(self.convs, self.bns, self.pools):
                h = torch.relu(bn(conv(h)))
                if pool != (1, 1):
                    h = nn.functional.max_pool2d(h, pool)
                acts.append(h)
            h = h.unsqueeze(0)                         # one step
        feat = self.proj(h.flatten(2, 3).transpose(2, 3))   # (T, B, L, d)
        return feat + self.pe[:feat.shape[2]], acts

    def forward(self, x: torch.Tensor, tau: float | None = None, reduce: str = "merge", ops: list | None = None,
                enc: tuple | None = None):
        """Returns dict: log-probs of the head (B, L', K+1), lengths L', aux log-probs (B, L, K+1),
        keep mask, the encoder activations (for cost counting). ``reduce`` (reducer variants only):
        "merge" (the method, CTC-aware), "runs" (ablation: one position per blank run), "drop"
        (control: blank runs removed), "uniform" (control: uniform pooling to the length "merge"
        gives), "off" (every position kept).
        The reducer runs on the time-mean features (aux head) and pools every step with the same
        segments. ``enc``: the output of ``self.encode(x)`` computed before (eval mode; the test
        passes of one trained network share one encoder pass, round 13), else it is computed here."""
        feat, acts = self.encode(x) if enc is None else enc   # (T, B, L, d), positions added
        T, B, L, d = feat.shape
        aux_logp = self.aux_head(feat.mean(0)).log_softmax(-1)
        if self.use_reducer and reduce != "off":
            flat = feat.permute(1, 2, 0, 3).reshape(B, L, T * d)
            tau_ = self.tau if tau is None else tau
            if reduce == "uniform":
                _, n_red, keep, _ = ctc_guided_reduce(flat[..., :1], aux_logp, tau_, "merge")
                seq, lengths, _ = uniform_pool(flat, n_red)
            else:
                seq, lengths, keep, _ = ctc_guided_reduce(flat, aux_logp, tau_, reduce)
            seq = seq.view(B, -1, T, d).permute(2, 0, 1, 3)
        else:
            seq, lengths = feat, torch.full((B,), L, dtype=torch.long)
            keep = torch.ones(B, L, dtype=torch.bool)
        valid = torch.arange(seq.shape[2]).unsqueeze(0) < lengths.unsqueeze(1)
        out = self.mix(seq, valid, ops)
        return {"logp": self.head(out).log_softmax(-1), "lengths": lengths, "aux_logp": aux_logp,
                "keep": keep, "acts": acts, "L": L, "valid": valid}

    def mix(self, seq: torch.Tensor, valid: torch.Tensor, ops: list | None = None) -> torch.Tensor:
        """The transformer mixer over (T, B, L', d) with padding mask ``valid`` (B, L'): the
        time-mean of the residual stream, LayerNorm-ed, (B, L', d). Positions beyond a line's
        length never change the outputs of its valid positions (tested)."""
        for blk in self.blocks:
            seq = blk(seq, valid, ops)
        return self.norm(seq.mean(0))

    @torch.no_grad()
    def costs(self, x: torch.Tensor, tau: float | None = None, reduce: str = "merge", enc: tuple | None = None) -> dict:
        """Mean operations per line (runs the network): AC (spike-driven), MAC (real-valued),
        energy in nJ, and the mixer's part (what the reducer saves). ``enc``: as in ``forward``."""
        ops: list = []
        out = self(x, tau, reduce, ops=ops, enc=enc)
        B, _, H, W = x.shape
        ac = mac = 0.0
        c1 = self.convs[0].out_channels
        T = self.T if self.spiking else 1
        if self.spiking and self.coder is not None:
            mac += self.coder.macs(H, W)                # InkCoder's filters on the analog image
        mac += T * H * W * c1 * 9                       # first conv reads analog pixels
        fan = [self.convs[1].out_channels * 9, self.convs[2].out_channels * 9, self.d_model]
        for a, f in zip(out["acts"], fan):
            if self.spiking and not (a is out["acts"][-1] and self.readout == "membrane"):
                ac += synaptic_ops(a, f) / B
            elif self.spiking:                         # membrane readout: the projection at every step
                mac += T * a[0, 0].numel() * f
            else:                                      # dense layer: every input x its fan-out
                mac += a[0].numel() * f
        n = out["lengths"].float()
        n_pos = float(n.mean())
        d, m, K1 = self.d_model, self.mlp, self.n_out
        if self.use_reducer:                           # (also with reduce="off": the head still runs)
            mac += out["L"] * d * K1                     # the aux head on the time-mean features
            ac += T * out["L"] * d * 2                   # time-mean for the aux head, run pooling
        if self.spiking:
            mixer_ac = 0.0
            for rec in ops:
                rec["n"] = n
                mixer_ac += spiking_block_acs(rec, d, m) / B
            mixer_mac = 0.0
        else:                                          # per position: Q, K, V, O and the MLP; attention n^2 d twice
            mixer_ac = 0.0
            mixer_mac = len(self.blocks) * (n_pos * (4 * d * d + 2 * d * m) + 2 * float((n ** 2).mean()) * d)
        mac += mixer_mac + n_pos * d * K1               # head on the (real) mixer output
        ac += mixer_ac
        mixer_nj = (E_AC_PJ * mixer_ac + E_MAC_PJ * mixer_mac) * 1e-3
        energy = (E_AC_PJ * ac + E_MAC_PJ * mac) * 1e-3
        return {"ac": ac, "mac": mac, "mixer_ac": mixer_ac, "mixer_mac": mixer_mac, "mixer_nj": mixer_nj,
                "energy_nj": energy, "out": out}
