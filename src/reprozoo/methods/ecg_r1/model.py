"""Modality-decoupled report generator: signal encoder + image encoder -> GRU report decoder.

Architecture (ECG-R1's modality-decoupled design, in miniature):

    z_sig = E_sig(signal)       1-D CNN over 1000 samples (125 Hz, first stride 4), mean/max/std pooled -> R^d
    z_img = E_img(image)        2-D CNN over the 40 x 200 px printed trace, pooled       -> R^d
    z     = (m_s z_sig + m_i z_img) / (m_s + m_i) + e[m_s, m_i]

m_s, m_i in {0, 1} say which modality is present and e is a learned embedding of the presence
pattern, so a missing modality is *absent* from z rather than a zero image the encoder must
interpret. The decoder is a GRU started from z that emits the six report statements in the
protocol's order; statement k is a categorical over field k's bins, conditioned on z and on the
statements already written (the diagnosis is written after, and conditioned on, its evidence).

Training
* SFT: teacher-forced cross-entropy of the protocol report, summed over the six statements.
* RL: group-relative policy gradient as in the paper's GRPO run (no KL term, beta 0; one update
  per batch; groups with no reward spread dropped, DAPO's dynamic sampling): for each ECG draw G
  reports from the policy at temperature 1, r = the reward, advantage A = (r - mean_G r) /
  (std_G r + eps), loss = -mean(A * log pi(report)) over the informative groups. The group mean
  is a baseline, so the estimator stays unbiased.
* Interleaved modality dropout: each example of a batch independently keeps both modalities
  (prob 1 - 2 p), only the signal (p) or only the image (p).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .protocol import VOCAB_SIZES


class SignalEncoder(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(1, 8, 9, stride=4, padding=4), nn.GELU(),      # 125 Hz -> 31 Hz features
            nn.Conv1d(8, 16, 7, stride=2, padding=3), nn.GELU(),
            nn.Conv1d(16, 32, 5, stride=2, padding=2), nn.GELU(),
            nn.Conv1d(32, 32, 5, dilation=3, padding=6), nn.GELU())  # receptive field ~2 s: RR pairs
        self.out = nn.Linear(96, d)

    def forward(self, x):                       # x: (B, T)
        h = self.conv(x[:, None, :])
        return self.out(torch.cat([h.mean(-1), h.amax(-1), h.std(-1)], dim=-1))


class ImageEncoder(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 8, (5, 3), stride=(4, 2), padding=(2, 1)), nn.GELU(),  # 40x200 -> 10x100
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(32, 32, (1, 5), dilation=(1, 3), padding=(0, 6)), nn.GELU())
        self.out = nn.Linear(96, d)

    def forward(self, x):                       # x: (B, H, W)
        h = self.conv(x[:, None]).mean(2)        # pool over amplitude rows -> (B, C, W')
        return self.out(torch.cat([h.mean(-1), h.amax(-1), h.std(-1)], dim=-1))


class ReportModel(nn.Module):
    def __init__(self, d: int = 64):
        super().__init__()
        self.sig, self.img = SignalEncoder(d), ImageEncoder(d)
        self.presence = nn.Embedding(4, d)       # index 2*m_s + m_i (0 = none, unused)
        self.tok = nn.ModuleList(nn.Embedding(n + 1, d) for n in VOCAB_SIZES)  # tok[0] row n: start
        self.gru = nn.GRUCell(2 * d, d)
        self.init = nn.Linear(d, d)
        self.heads = nn.ModuleList(nn.Linear(d, n) for n in VOCAB_SIZES)

    def encode(self, sig, img, m_sig, m_img):
        """Fuse the present modalities; m_sig, m_img are float (B,) masks."""
        ms, mi = m_sig[:, None], m_img[:, None]
        z = (ms * self.sig(sig) + mi * self.img(img)) / (ms + mi).clamp(min=1.0)
        return z + self.presence((2 * m_sig + m_img).long())

    def _steps(self, z, choose):
        """Run the decoder; choose(k, logits) returns statement k's indices. Yields logits, tokens."""
        h = torch.tanh(self.init(z))
        prev = self.tok[0](torch.full((len(z),), VOCAB_SIZES[0], dtype=torch.long))
        logits, toks = [], []
        for k, head in enumerate(self.heads):
            h = self.gru(torch.cat([prev, z], dim=-1), h)
            lg = head(h)
            t = choose(k, lg)
            logits.append(lg)
            toks.append(t)
            prev = self.tok[k](t)               # statement k, embedded with field k's table
        return logits, torch.stack(toks, dim=1)

    def sft_loss(self, z, target):
        logits, _ = self._steps(z, lambda k, lg: target[:, k])
        return sum(nn.functional.cross_entropy(lg, target[:, k]) for k, lg in enumerate(logits))

    def generate(self, z, greedy: bool = True, gen: torch.Generator | None = None):
        """Reports (B, 6) and their log-probabilities under the policy (B,)."""
        def choose(k, lg):
            if greedy:
                return lg.argmax(-1)
            return torch.multinomial(torch.softmax(lg, -1), 1, generator=gen)[:, 0]
        logits, toks = self._steps(z, choose)
        logp = sum(torch.log_softmax(lg, -1).gather(1, toks[:, k:k + 1])[:, 0] for k, lg in enumerate(logits))
        return toks, logp


def group_policy_loss(logp: torch.Tensor, reward: torch.Tensor, group: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO surrogate as the paper's RL run sets it (ms-swift ``rlhf_type grpo``, ``beta 0``: no KL
    term; ``num_iterations 1``: one update per batch of samples, so the PPO ratio is 1 and its clip is
    inert; ``dynamic_sample``: groups whose samples all score the same carry no signal and are left
    out). A = (r - mean_G r) / (std_G r + eps) within each group of ``group`` samples; the loss is
    -mean(A * logp) over the samples of the informative groups (the reports have a fixed length, so
    this is also the token-level ``bnpo`` mean). 0 (with a gradient) if no group is informative.

    logp and reward are (B * group,) with the G samples of one ECG contiguous.
    """
    r = reward.view(-1, group)
    sd = r.std(1, keepdim=True)
    adv = ((r - r.mean(1, keepdim=True)) / (sd + eps)).detach()
    keep = (sd > eps).expand_as(r).reshape(-1)
    if not bool(keep.any()):
        return 0.0 * logp.sum()
    return -(adv.reshape(-1)[keep] * logp[keep]).mean()


def dropout_masks(n: int, p_single: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved modality dropout: per example, both (1 - 2p), signal only (p), image only (p)."""
    u = rng.random(n)
    m_sig = (u >= p_single).astype(np.float32)            # u < p: image only
    m_img = ~((u >= p_single) & (u < 2 * p_single))       # p <= u < 2p: signal only
    return m_sig, m_img.astype(np.float32)
