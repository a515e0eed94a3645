"""The spiking CNN every variant trains: two conv-BN-LIF stages and a linear read-out, T steps.

Direct (current) encoding: the static input is the input current of the first layer at every
step t = 1..T. Per layer l and step t

    I_{l,t} = BN_l(W_l * s_{l-1,t}),   v_{l,t} = β v_{l,t-1} (1 - s_{l,t-1}) + I_{l,t},
    s_{l,t} = H(v_{l,t} - θ)  (forward),   ∂s/∂v = g_{l,t}(v - θ)  (backward, the surrogate),

followed by 2x average pooling; the read-out is logits = (1/T) Σ_t W_out s_{2,t} (non-spiking),
loss = cross-entropy of the time-averaged logits. Reset to zero, the reset path detached (as in
``blocks.spiking.lif``). The time loop is written here rather than calling ``lif`` because A2SG
needs a different surrogate at each (layer, time step) and ``lif`` takes one for all steps.

Computed layer by layer over all T steps at once (the multi-step mode of SNN libraries): layer 1's
current is the same at every step and there is no feedback, so this equals the step-by-step
recursion, at one batched convolution per layer.

``deltas``: optional per-time-step zero tensors added to the weights at step t. Since the weights
are shared over time, dL/dW = Σ_t dL/dδ_t, and dL/dδ_t is the gradient contributed by step t: the
per-time-step gradients whose cosine measures cross-time-step consistency.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...blocks.spiking import spike

WEIGHTS = ("conv1.weight", "conv2.weight", "fc.weight")


class SpikingCNN(nn.Module):
    def __init__(self, dim: int, in_size: int, channels=(16, 32), kernel: int = 3,
                 n_classes: int = 10, T: int = 4, beta: float = 0.5, threshold: float = 1.0):
        super().__init__()
        Conv, BN = (nn.Conv2d, nn.BatchNorm2d) if dim == 2 else (nn.Conv1d, nn.BatchNorm1d)
        self.dim, self.T, self.beta, self.threshold = dim, T, beta, threshold
        self.conv1 = Conv(1, channels[0], kernel, padding=kernel // 2, bias=False)
        self.bn1 = BN(channels[0])
        self.conv2 = Conv(channels[0], channels[1], kernel, padding=kernel // 2, bias=False)
        self.bn2 = BN(channels[1])
        out = in_size // 4
        self.fc = nn.Linear(channels[1] * out ** dim, n_classes)
        self.conv = F.conv2d if dim == 2 else F.conv1d
        self.pool = F.avg_pool2d if dim == 2 else F.avg_pool1d

    def _lif(self, cur: torch.Tensor, layer: int, surrogate, trace: dict | None = None) -> torch.Tensor:
        """LIF over time-major input current (T, B, ...), surrogate per (layer, t). With ``trace``,
        the per-step membrane potentials v_t and spikes s_t (graph tensors) are appended to
        ``trace["v"]`` / ``trace["s"]`` (one list per layer): ∂L/∂v_t is the local gradient δ_t."""
        v = s = None
        out, vs = [], []
        for t in range(cur.shape[0]):
            v = cur[t] if v is None else self.beta * v * (1 - s.detach()) + cur[t]
            u = v - self.threshold
            s = spike(u, surrogate(layer, t, u))
            out.append(s)
            vs.append(v)
        if trace is not None:
            trace.setdefault("v", []).append(vs)
            trace.setdefault("s", []).append(out)
        return torch.stack(out)

    def _per_step(self, fn, h: torch.Tensor, name: str, deltas, **kw) -> torch.Tensor:
        """fn(h_t, W (+ δ_t)) for time-major h: one batched call without deltas, T calls with."""
        W = self.get_parameter(name)
        if deltas is None:
            T, B = h.shape[:2]
            y = fn(h.flatten(0, 1), W, **kw)
            return y.view(T, B, *y.shape[1:])
        return torch.stack([fn(h[t], W + deltas[name][t], **kw) for t in range(h.shape[0])])

    def forward(self, x: torch.Tensor, surrogate, deltas: dict | None = None, record: bool = False,
                trace: dict | None = None):
        """x: (B, *spatial) or (B, 1, *spatial). Returns logits (B, classes) and, with ``record``,
        the spike tensors (T, B, ...) of both layers. Layer by layer over all steps at once
        (no feedback from layer 2 to layer 1, so this equals the step-by-step recursion); BN sees
        the T x B currents of a layer together (threshold-dependent BN, as in tdBN). ``trace``: a
        dict that receives the per-step membrane potentials and spikes of every layer (``_lif``)."""
        x = x.unsqueeze(1) if x.dim() == self.dim + 1 else x
        pad = self.conv1.kernel_size[0] // 2
        h = x.unsqueeze(0).expand(self.T, *x.shape)          # direct encoding: same input each step
        spikes = []
        for l, bn in enumerate((self.bn1, self.bn2)):
            cur = self._per_step(self.conv, h, f"conv{l + 1}.weight", deltas, padding=pad)
            T, B = cur.shape[:2]
            cur = bn(cur.flatten(0, 1)).view(cur.shape)
            s = self._lif(cur, l, surrogate, trace)
            spikes.append(s.detach())
            h = self.pool(s.flatten(0, 1), 2).view(T, B, *s.shape[2:-self.dim], *[n // 2 for n in s.shape[-self.dim:]])
        logits = self._per_step(F.linear, h.flatten(2), "fc.weight", deltas) + self.fc.bias
        logits = logits.mean(0)
        return (logits, spikes) if record else logits
