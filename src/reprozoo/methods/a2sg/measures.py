"""What is measured on a trained network, identically for every variant.

* **sharpness** (loss-landscape curvature proxy, forward passes only, so independent of the
  surrogate): for K random directions d, each weight tensor's slice d_W ~ N(0, I) rescaled to
  ρ ‖W‖ (layer-wise relative norm, so that BN's scale invariance does not favour any variant),
  sharpness = mean_k L(w + d_k) - L(w), the cross-entropy on a fixed training subset, BN in eval
  mode. For a quadratic basin L(w + d) - L(w) = ½ dᵀHd on average, ∝ ρ² tr(H)-weighted.
* **cross-time-step gradient consistency**: the per-step gradients g_t = dL/dδ_t (see ``snn``)
  over all conv and read-out weights, concatenated; the mean cosine over pairs t < t'. Measured with
  each variant's own surrogate, since these are the directions its training follows.
* **firing rate** per layer: spikes per neuron per time step on the test set (the energy proxy,
  with synaptic operations = Σ spikes x fan-out).
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ...blocks.spiking import firing_rate, synaptic_ops
from .snn import WEIGHTS


@torch.no_grad()
def loss_on(model, surrogate, x, y) -> float:
    return float(F.cross_entropy(model(x, surrogate), y))


@torch.no_grad()
def sharpness(model, surrogate, x, y, rho: float, n_dirs: int, gen: torch.Generator) -> float:
    model.eval()
    base = loss_on(model, surrogate, x, y)
    params = [p for n, p in model.named_parameters() if p.dim() > 1]
    saved = [p.clone() for p in params]
    rises = []
    for _ in range(n_dirs):
        for p, p0 in zip(params, saved):
            d = torch.randn(p.shape, generator=gen).to(p.device)
            p.copy_(p0 + rho * p0.norm() * d / d.norm())
        rises.append(loss_on(model, surrogate, x, y) - base)
    for p, p0 in zip(params, saved):
        p.copy_(p0)
    return float(sum(rises) / len(rises))


def per_step_gradients(model, surrogate, x, y) -> torch.Tensor:
    """(T, n_weights): g_t = dL/dδ_t for the conv and read-out weights."""
    model.eval()
    deltas = {n: [torch.zeros_like(model.get_parameter(n), requires_grad=True) for _ in range(model.T)]
              for n in WEIGHTS}
    loss = F.cross_entropy(model(x, surrogate, deltas=deltas), y)
    flat = [d for n in WEIGHTS for d in deltas[n]]
    grads = torch.autograd.grad(loss, flat)
    per = len(WEIGHTS)
    return torch.stack([torch.cat([grads[i * model.T + t].flatten() for i in range(per)])
                        for t in range(model.T)])


def gradient_cosine(g: torch.Tensor) -> float:
    """Mean cosine similarity over pairs of rows (time steps)."""
    g = g / g.norm(dim=1, keepdim=True).clamp(min=1e-30)
    pairs = list(itertools.combinations(range(g.shape[0]), 2))
    return float(sum(float(g[i] @ g[j]) for i, j in pairs) / len(pairs))


@torch.no_grad()
def evaluate(model, surrogate, x, y) -> dict:
    """Accuracy, loss, firing rate per layer and per step, synaptic operations per sample."""
    model.eval()
    logits, spikes = model(x, surrogate, record=True)
    out = {"acc": float((logits.argmax(1) == y).float().mean()), "loss": float(F.cross_entropy(logits, y))}
    fan_out = [model.conv2.weight.shape[0] * model.conv2.weight[0, 0].numel(), model.fc.out_features]
    sops = 0.0
    for l, s in enumerate(spikes):
        st = s
        out[f"fr_l{l + 1}"] = firing_rate(st)
        out[f"fr_l{l + 1}_t"] = [firing_rate(st[t]) for t in range(st.shape[0])]
        # each spike of layer 1 reaches c2 x k^d synapses; layer 2's pooled spikes reach the read-out
        sops += synaptic_ops(st, fan_out[l])
    out["sops"] = sops / len(y)
    out["fr"] = (out["fr_l1"] + out["fr_l2"]) / 2
    return out
