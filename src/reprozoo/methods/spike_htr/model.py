"""Spike-HTR in miniature: InkCoder, spiking CNN encoder, CTC-guided length reducer, mixer, CTC head.

Shapes: a line image x is (B, 1, H, W); the spiking path is time-major (T, B, C, H, W).

* InkCoder (coarse-to-fine stream). Step t of T sees the image blurred by a Gaussian of width
  σ_t = σ_max (T - t) / (T - 1), t = 1..T: the first step carries only broad stroke regions,
  the last step the sharp image (σ_T = 0). Blurring conserves ink (kernel sums to 1) and removes
  high spatial frequencies, so the steps differ in detail, not in brightness. The paper's InkCoder
  is learned; ours is this fixed pyramid (see README).
* Spiking encoder: three 3x3 conv + BatchNorm (statistics over T·B) + LIF layers
  (``blocks.spiking.lif``, v_t = β v_{t-1}(1 - s_{t-1}) + I_t, s_t = H(v_t - θ), arctan surrogate),
  max-pooling after the first two (2x2 then 2x1 by default; pooling binary spikes keeps them
  binary); the height is flattened into channels, the spike counts are averaged over T, and a
  linear map gives d-dim features at L = W/2 width positions. The ANN CRNN has the same convolutions with ReLU, one step.
* CTC-guided length reducer: an auxiliary CTC head on the encoder features gives, per position,
  p(blank) and the argmax class. A position is kept if its argmax is a character or if it is
  uncertain (p(blank) < τ); each maximal run of the remaining confident-blank positions is
  averaged into ONE position (so that the blank separating two equal characters survives).
  The mixer then sees L' <= L positions.
* Mixer and head: one bidirectional LSTM over the (reduced) sequence and a linear CTC head
  (K+1 classes, 0 = blank), the same in every variant.

Costs per line (``costs``): synaptic operations (AC, one per spike per reached synapse,
``blocks.spiking.synaptic_ops``) for spike-driven layers, multiply-accumulates (MAC) for layers
with real-valued input (the first conv on the analog InkCoder stream, the aux head, the mixer and
head). Energy = 0.9 pJ·AC + 4.6 pJ·MAC (45 nm, 32-bit; Horowitz 2014, the usual SNN proxy).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...blocks.spiking import arctan, lif, synaptic_ops

E_AC_PJ, E_MAC_PJ = 0.9, 4.6  # Horowitz (ISSCC 2014), 45 nm, 32-bit float


# ------------------------------------------------------------------ InkCoder
def gaussian_kernel(sigma: float, radius: int) -> torch.Tensor:
    """Normalised 1-d Gaussian of length 2·radius + 1 (a delta for sigma = 0)."""
    x = torch.arange(-radius, radius + 1, dtype=torch.float32)
    if sigma <= 0:
        return (x == 0).float()
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def inkcoder(x: torch.Tensor, T: int, sigma_max: float) -> torch.Tensor:
    """Coarse-to-fine stream (T, B, 1, H, W): step t blurred with σ_t = σ_max (T-t)/(T-1)."""
    radius = max(1, math.ceil(3 * sigma_max))
    steps = []
    for t in range(1, T + 1):
        sigma = sigma_max * (T - t) / max(1, T - 1)
        k = gaussian_kernel(sigma, radius)
        y = nn.functional.pad(x, (radius, radius, radius, radius), mode="replicate")
        y = nn.functional.conv2d(y, k.view(1, 1, 1, -1))
        y = nn.functional.conv2d(y, k.view(1, 1, -1, 1))
        steps.append(y)
    return torch.stack(steps)


# ------------------------------------------------------------------ reducer
def ctc_guided_reduce(feat: torch.Tensor, aux_logp: torch.Tensor, tau: float):
    """Keep likely-character / uncertain positions, merge each confident-blank run into one.

    ``feat`` (B, L, d), ``aux_logp`` (B, L, K+1) log-probabilities of the auxiliary CTC head.
    Returns (pooled (B, L'max, d), new lengths (B,), keep mask (B, L), segment id (B, L))."""
    B, L, d = feat.shape
    with torch.no_grad():
        keep = (aux_logp.argmax(-1) != 0) | (aux_logp[..., 0].exp() < tau)
        prev_keep = torch.cat([torch.ones_like(keep[:, :1]), keep[:, :-1]], dim=1)
        start = keep | prev_keep                       # a kept position, or the first of a blank run
        seg = start.long().cumsum(1) - 1
        n_seg = seg[:, -1] + 1
    Lr = int(n_seg.max())
    idx = seg.unsqueeze(-1).expand(-1, -1, d)
    pooled = feat.new_zeros(B, Lr, d).scatter_add(1, idx, feat)
    counts = feat.new_zeros(B, Lr, 1).scatter_add(1, seg.unsqueeze(-1), torch.ones_like(feat[..., :1]))
    return pooled / counts.clamp(min=1), n_seg, keep, seg


# ------------------------------------------------------------------ networks
class Recognizer(nn.Module):
    """Encoder (spiking or ANN) -> features -> [reducer] -> BiLSTM -> CTC head."""

    def __init__(self, height: int, n_classes: int, channels=(16, 32, 48), d_model: int = 64,
                 hidden: int = 64, spiking: bool = True, reducer: bool = False, T: int = 2,
                 sigma_max: float = 1.5, beta: float = 0.5, threshold: float = 1.0, tau: float = 0.9,
                 pools=((2, 2), (2, 1), (1, 1)), readout: str = "spikes"):
        super().__init__()
        c1, c2, c3 = channels
        self.spiking, self.use_reducer, self.T, self.readout = spiking, reducer, T, readout
        self.sigma_max, self.beta, self.threshold, self.tau = sigma_max, beta, threshold, tau
        self.surrogate = arctan(2.0)
        self.convs = nn.ModuleList([nn.Conv2d(1, c1, 3, padding=1, bias=False),
                                    nn.Conv2d(c1, c2, 3, padding=1, bias=False),
                                    nn.Conv2d(c2, c3, 3, padding=1, bias=False)])
        self.bns = nn.ModuleList([nn.BatchNorm2d(c) for c in channels])
        self.pools = [tuple(k) for k in pools]
        self.h_out = height // math.prod(k[0] for k in self.pools)
        self.stride = math.prod(k[1] for k in self.pools)   # pixel columns per width position
        self.proj = nn.Linear(c3 * self.h_out, d_model)
        self.aux_head = nn.Linear(d_model, n_classes + 1)
        self.mixer = nn.LSTM(d_model, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, n_classes + 1)
        self.d_model, self.hidden, self.n_out = d_model, hidden, n_classes + 1

    # encoder: returns features (B, L, d) and the spike tensors / activations that feed each layer
    def encode(self, x: torch.Tensor):
        acts = []                                      # inputs of convs[1], convs[2], proj
        if self.spiking:
            h = inkcoder(x, self.T, self.sigma_max)    # (T, B, 1, H, W)
            T, B = h.shape[:2]
            for i, (conv, bn, pool) in enumerate(zip(self.convs, self.bns, self.pools)):
                cur = bn(conv(h.flatten(0, 1)))
                s, v = lif(cur.view(T, B, *cur.shape[1:]), self.beta, self.threshold, self.surrogate)
                if i == len(self.convs) - 1 and self.readout == "membrane":
                    s = v                              # last layer read out by its membrane potential
                if pool != (1, 1):
                    s = nn.functional.max_pool2d(s.flatten(0, 1), pool)
                    s = s.view(T, B, *s.shape[1:])
                acts.append(s)
                h = s
            rate = h.mean(0)                           # (B, C, H/4, W/4) spike counts / T
        else:
            h = x
            for conv, bn, pool in zip(self.convs, self.bns, self.pools):
                h = torch.relu(bn(conv(h)))
                if pool != (1, 1):
                    h = nn.functional.max_pool2d(h, pool)
                acts.append(h)
            rate = h
        feat = self.proj(rate.flatten(1, 2).transpose(1, 2))   # (B, L, d)
        return feat, acts

    def forward(self, x: torch.Tensor, tau: float | None = None):
        """Returns dict: log-probs of the head (B, L', K+1), lengths L', aux log-probs (B, L, K+1),
        keep mask, the encoder activations (for cost counting)."""
        feat, acts = self.encode(x)
        aux_logp = self.aux_head(feat).log_softmax(-1)
        B, L, _ = feat.shape
        if self.use_reducer:
            seq, lengths, keep, _ = ctc_guided_reduce(feat, aux_logp, self.tau if tau is None else tau)
        else:
            seq, lengths = feat, torch.full((B,), L, dtype=torch.long)
            keep = torch.ones(B, L, dtype=torch.bool)
        packed = nn.utils.rnn.pack_padded_sequence(seq, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.mixer(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=seq.shape[1])
        return {"logp": self.head(out).log_softmax(-1), "lengths": lengths, "aux_logp": aux_logp,
                "keep": keep, "acts": acts, "L": L}

    @torch.no_grad()
    def costs(self, x: torch.Tensor, out: dict) -> dict:
        """Mean operations per line: AC (spike-driven), MAC (real-valued), energy in nJ, and the
        mixer's share (what the reducer saves)."""
        B, _, H, W = x.shape
        ac = mac = 0.0
        c1 = self.convs[0].out_channels
        T = self.T if self.spiking else 1
        mac += T * H * W * c1 * 9                       # first conv reads analog pixels
        fan = [self.convs[1].out_channels * 9, self.convs[2].out_channels * 9, self.d_model]
        for a, f in zip(out["acts"], fan):
            if self.spiking and not (a is out["acts"][-1] and self.readout == "membrane"):
                ac += synaptic_ops(a, f) / B
            elif self.spiking:                         # membrane readout: real-valued, T steps
                mac += a[:, 0].numel() * f
            else:                                      # dense layer: every input x its fan-out
                mac += a[0].numel() * f
        n_pos = float(out["lengths"].float().mean())
        mixer_mac = n_pos * (2 * 4 * self.hidden * (self.d_model + self.hidden) + 2 * self.hidden * self.n_out)
        if self.use_reducer:
            mac += out["L"] * self.d_model * self.n_out  # the aux CTC head runs on every position
            ac += out["L"] * self.d_model                # pooling adds
        mac += mixer_mac
        return {"ac": ac, "mac": mac, "mixer_mac": mixer_mac,
                "energy_nj": (E_AC_PJ * ac + E_MAC_PJ * mac) * 1e-3}
