"""A step-by-step time-to-first-spike (TTFS) convolutional SNN and the paper's four ingredients.

Time runs over discrete steps t = 0..T-1. The input image is TTFS-encoded (``encode``): pixel
x in (0, 1] fires once at t = round((1 - x)(T - 1)), x = 0 never. Each hidden layer l is

    I^l_t = W^l * a^{l-1}_t (+ b^l)          (conv, weights shared over time)
    v^l_t = v^l_{t-1} + I^l_t,   s^l_t = H(v^l_t - θ) while not yet fired   (blocks.spiking.if_single_spike)
    a^l_t = pool(s^l_t)                      (2x2 average or max pooling, per step)

and the output is a non-spiking integrator U_t = Σ_{t'<=t} (W^o a^L_{t'} + b^o). θ = 1.

The ingredients (variants switch them on one at a time; see the method's README):

* **init** (``init="ttfs"``): weights ~ N(μ, σ²) chosen in closed form so that the final potential
  V_T = Σ_t I_t of every layer has mean κθ and standard deviation ρθ over independent inputs. With
  fan-in n and input moments m1 = E[a], m2 = E[a²] (a = Σ_t a_t, what an input contributes by T):
      E[V_T] = n μ m1,   Var[V_T] = n σ² m2 + n μ² (m2 - m1²)
  so μ = κθ / (n m1), σ² = (ρ²θ² - n μ²(m2 - m1²)) / (n m2). With κ = 1 about half of the neurons
  fire by T in every layer, so the input moments of the next layer are again known (p = 1/2): the
  signal neither diminishes with depth nor saturates. The default ("plain") is PyTorch's zero-mean
  Kaiming-uniform init, under which V_T has std ~ sqrt(p/3) < θ and deeper layers fall silent.
* **norm** (``norm=True``): batch normalisation of the final potential, folded into the per-step
  current so that it stays causal and linear in the spikes:
      I'_t = (γ/σ_B) I_t + (β - γ μ_B/σ_B) / T,   μ_B, σ_B² = batch mean / variance of V_T per channel,
  hence V'_T = γ (V_T - μ_B)/σ_B + β. Running statistics are used at evaluation, where the whole
  thing is a rescaled weight plus a constant bias current. γ, β start at ρθ, κθ.
* **decoder** (``decoder="temporal"``): logits = (1/T) Σ_t U_t, the output aggregated over time, so
  a hidden spike at step t weighs (T - t)/T: earlier spikes count more, and the gradient rewards
  firing early. The baseline decoder reads the final potential U_{T-1}, where the timing of a
  spike before the end does not matter.
* **pool** (``pool="avg"`` vs ``"max"``): average pooling is linear, so it merges into the next
  layer's synapses and each IF neuron still sends one spike. Max pooling per step emits a spike
  at every step at which any neuron of its window fires, up to 4 spikes from one pooled unit:
  it breaks the single-spike constraint.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...blocks.spiking import arctan, first_spike_time, if_single_spike

THETA = 1.0


def encode(x: torch.Tensor, T: int) -> torch.Tensor:
    """TTFS input spikes (T, B, C, H, W) from intensities in [0, 1] (bright pixels fire first)."""
    t_fire = torch.round((1.0 - x.clamp(0, 1)) * (T - 1)).long()
    steps = torch.arange(T, device=x.device).view(T, *([1] * x.dim()))
    return ((steps == t_fire.unsqueeze(0)) & (x > 0).unsqueeze(0)).to(torch.float32)


def ttfs_init_moments(n: int, m1: float, m2: float, kappa: float = 1.0, rho: float = 1.0,
                      theta: float = THETA) -> tuple[float, float]:
    """(μ, σ) of iid weights giving E[V_T] = κθ and Std[V_T] = ρθ for n inputs with moments m1, m2."""
    mu = kappa * theta / (n * m1)
    var = (rho**2 * theta**2 - n * mu**2 * (m2 - m1**2)) / (n * m2)
    return mu, math.sqrt(max(var, 1e-6 / n))


def pooled_moments(p: float, pool: str, k: int = 4) -> tuple[float, float]:
    """Moments of what a pooled unit delivers by T when its k inputs fire independently with prob p.

    avg: a = (1/k) Σ f_j, m1 = p, m2 = p/k + (1 - 1/k) p². max: at most one spike per step; with the
    inputs' spike times spread out, a ~ number of fired inputs (an upper bound), m1 = k p,
    m2 = k p (1 - p) + (k p)²."""
    if pool == "avg":
        return p, p / k + (1 - 1 / k) * p**2
    return k * p, k * p * (1 - p) + (k * p) ** 2


class FinalPotentialNorm(nn.Module):
    """Batch-normalise V_T = Σ_t I_t per channel, applied to every step's current (see module doc)."""

    def __init__(self, channels: int, T: int, gamma0: float, beta0: float, momentum: float = 0.1):
        super().__init__()
        self.T, self.momentum = T, momentum
        self.gamma = nn.Parameter(torch.full((channels,), gamma0))
        self.beta = nn.Parameter(torch.full((channels,), beta0))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, current: torch.Tensor) -> torch.Tensor:  # (T, B, C, H, W)
        if self.training:
            vT = current.sum(0)
            mean, var = vT.mean((0, 2, 3)), vT.var((0, 2, 3), unbiased=False)
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var, self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        scale = self.gamma / torch.sqrt(var + 1e-5)
        shift = (self.beta - scale * mean) / self.T
        return current * scale.view(1, 1, -1, 1, 1) + shift.view(1, 1, -1, 1, 1)


class TTFSNet(nn.Module):
    """conv3x3-IF-pool2 blocks, then a non-spiking linear integrator (see module docstring)."""

    def __init__(self, in_shape=(1, 8, 8), channels=(8, 16), n_classes: int = 10, T: int = 8,
                 init: str = "default", norm: bool = False, decoder: str = "final", pool: str = "avg",
                 p_in: float = 0.5, kappa: float = 1.0, rho: float = 1.0, surrogate_alpha: float = 2.0):
        super().__init__()
        if init not in ("default", "ttfs") or decoder not in ("final", "temporal") or pool not in ("avg", "max"):
            raise ValueError(f"unknown option: init={init!r}, decoder={decoder!r}, pool={pool!r}")
        self.T, self.decoder, self.pool, self.surrogate = T, decoder, pool, arctan(surrogate_alpha)
        c_prev, hw = in_shape[0], in_shape[1]
        self.convs, self.norms = nn.ModuleList(), nn.ModuleList()
        m1 = m2 = p_in  # a TTFS input spike: a in {0, 1}
        for c in channels:
            conv = nn.Conv2d(c_prev, c, 3, padding=1, bias=not norm)
            if init == "ttfs":
                mu, sd = ttfs_init_moments(c_prev * 9, m1, m2, kappa, rho)
                with torch.no_grad():
                    conv.weight.normal_(mu, sd)
                    if conv.bias is not None:
                        conv.bias.zero_()
            self.convs.append(conv)
            self.norms.append(FinalPotentialNorm(c, T, rho * THETA, kappa * THETA) if norm else nn.Identity())
            m1, m2 = pooled_moments(0.5, pool)  # κ = 1: half the neurons fire by T
            c_prev, hw = c, hw // 2
        self.fc = nn.Linear(c_prev * hw * hw, n_classes)
        if init == "ttfs":
            with torch.no_grad():
                self.fc.weight.normal_(0.0, 1.0 / math.sqrt(self.fc.in_features * m2))
                self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> dict:
        """x: images (B, C, H, W) in [0, 1]. Returns logits, output potentials U (T, B, K), the IF
        spikes of each layer (T, B, C, H, W) and the pooled signals sent on (T, B, C, H/2, W/2)."""
        a = encode(x, self.T)
        spikes, sent = [a], []
        for conv, norm in zip(self.convs, self.norms):
            T, B = a.shape[:2]
            cur = conv(a.flatten(0, 1)).unflatten(0, (T, B))
            s, _ = if_single_spike(norm(cur), THETA, self.surrogate)
            pool = F.avg_pool2d if self.pool == "avg" else F.max_pool2d
            a = pool(s.flatten(0, 1), 2).unflatten(0, (T, B))
            spikes.append(s)
            sent.append(a)
        T, B = a.shape[:2]
        U = torch.cumsum(self.fc(a.flatten(2)), dim=0)  # (T, B, K)
        logits = U[-1] if self.decoder == "final" else U.mean(0)
        return {"logits": logits, "U": U, "spikes": spikes[1:], "input": spikes[0], "sent": sent}


@torch.no_grad()
def spike_statistics(out: dict, T: int) -> dict:
    """Counts behind the paper's metrics, over a batch (hidden IF neurons and pooled units).

    latency: mean first-spike step of the hidden neurons that fire; fire_frac: fraction of hidden
    neurons that fire at all; spikes_per_neuron: mean spikes per IF neuron per example;
    max_spikes_per_unit: most spikes any spike-emitting unit sent for one example (IF neurons, and
    the max-pooled units, which emit spikes of their own; avg-pooled signals are part of the next
    layer's synapses); frac_multi_spike: fraction of those units (per example) with > 1 spike."""
    out = {k: ([a.cpu() for a in v] if isinstance(v, list) else v.cpu()) for k, v in out.items()}
    hidden = torch.cat([s.flatten(2) for s in out["spikes"]], dim=2)  # (T, B, N)
    t_first = first_spike_time(hidden)
    fired = t_first < T
    count = hidden.sum(0)
    emit = [count]
    if any(((a > 0) & (a < 1)).any() for a in out["sent"]):  # avg pooling: fractional, not spikes
        pooled = None
    else:
        pooled = torch.cat([a.flatten(2) for a in out["sent"]], dim=2).sum(0)
        emit.append(pooled)
    units = torch.cat(emit, dim=1)
    hist = torch.bincount(t_first[fired].long(), minlength=T)[:T].float()
    layer_fire = [float((first_spike_time(s.flatten(2)) < T).float().mean()) for s in out["spikes"]]
    return {
        "latency": float(t_first[fired].mean()) if fired.any() else float(T),
        "fire_frac": float(fired.float().mean()),
        "fire_frac_last": layer_fire[-1],
        "spikes_per_neuron": float(count.mean()),
        "max_spikes_per_unit": float(units.max()),
        "frac_multi_spike": float((pooled > 1).float().mean()) if pooled is not None else 0.0,
        "latency_hist": (hist / hist.sum().clamp(min=1)).tolist(),
        "count_hist": (torch.bincount(units.long().clamp(max=4).flatten(), minlength=5)[:5].float()
                       / units.numel()).tolist(),
    }
