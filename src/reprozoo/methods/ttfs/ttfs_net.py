"""A step-by-step time-to-first-spike (TTFS) convolutional SNN and the paper's four ingredients.

Time runs over discrete steps t = 0..T-1. The input image is TTFS-encoded (``encode``): pixel
x in (0, 1] fires once at t = round((1 - x)(T - 1)), x = 0 never. Each hidden layer l is

    I^l_t = W^l * a^{l-1}_t (+ b^l)          (conv, weights shared over time)
    v^l_t = v^l_{t-1} + I^l_t,   s^l_t = H(v^l_t - θ) while not yet fired   (blocks.spiking.if_single_spike)
    a^l_t = pool(s^l_t)                      (2x2 average or max pooling, per step, after the
                                              layers named in ``pool_after``; else a^l_t = s^l_t)

and the output is a non-spiking integrator of the currents c_t = W^o a^L_t + b^o,
U_t = Σ_{t'<=t} c_{t'}. θ = 1. Every readout is logits = g Σ_τ W_τ c_τ with one learnable gain g
(started at 1, in every variant) and step weights W_τ set by the decoder; the partial readout at
step t is the same sum over τ <= t (its argmax gives the output decision time).

The ingredients (variants switch them on one at a time; see the method's README):

* **init** (``init="ttfs"``): weights ~ N(μ, σ²) chosen in closed form so that the final potential
  V_T = Σ_t I_t of every layer has mean κθ and standard deviation ρθ over independent inputs. With
  fan-in n and input moments m1 = E[a], m2 = E[a²] (a = Σ_t a_t, what an input contributes by T):
      E[V_T] = n μ m1,   Var[V_T] = n σ² m2 + n μ² (m2 - m1²)
  so μ = κθ / (n m1), σ² = (ρ²θ² - n μ²(m2 - m1²)) / (n m2). With κ = 1 about half of the neurons
  fire by T in every layer, so the input moments of the next layer are again known (p = 1/2): the
  signal neither diminishes with depth nor saturates. The default ("plain") is PyTorch's zero-mean
  Kaiming-uniform init, under which V_T has std ~ sqrt(p/3) < θ and deeper layers fall silent.
* **norm** (``norm=True``): weight normalisation with a learnable affine transform (the paper's
  training normalisation). Each output channel c of a spiking conv keeps a raw weight v_c and
  uses the standardised, re-scaled weight
      W_c = γ_c (v_c - mean(v_c)) / std(v_c) + β_c      (mean, std over the channel's fan-in)
  so that the first two moments of every neuron's weights, which set E[V_T] and Std[V_T] through
  the init formula below, are held by two learnable numbers per channel instead of drifting with
  every gradient step. γ_c, β_c start at the channel's std and mean, so the network at step 0 is
  exactly the initialised one (init and init_norm start from the same weights). No batch
  statistics are involved: training and inference compute the same thing.
* **decoder** (``decoder="temporal"``): temporal weighting, logits = Σ_t w_t U_t with weights
  that fall linearly over time, w_t = (T - t) / Σ_s (T - s), on the output potential U_t. A hidden
  spike at step τ enters U_t for every t >= τ, so it weighs Σ_{t>=τ} w_t = (T - τ)(T - τ + 1) /
  (T (T + 1)): evidence that arrives early counts (quadratically) more, and the gradient rewards
  firing early. The baseline decoder reads the final potential U_{T-1} (W_τ = 1), where the timing
  of a spike before the end does not matter. The linear form is ours (the paper's exact weights
  could not be read offline). Because the W_τ are below 1, the raw decoder would start at a lower
  logit scale than the final potential (a temperature effect, not a decoding one); so
  ``calibrate_decoder`` multiplies them by one constant, at construction, that makes the initial
  logit standard deviation equal to the final-potential readout's of the same network, and the
  gain g then learns the temperature in every variant alike.
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


class WNConv2d(nn.Module):
    """3x3 convolution whose weight is per-output-channel standardised and re-scaled by learnable γ, β
    (see module doc): W_c = γ_c (v_c - mean v_c) / std v_c + β_c. Plus an ordinary bias."""

    def __init__(self, conv: nn.Conv2d, eps: float = 1e-8):
        super().__init__()
        self.out_channels, self.padding, self.eps = conv.out_channels, conv.padding, eps
        w = conv.weight.detach().clone()
        self.v = nn.Parameter(w)
        mean, std = w.mean((1, 2, 3)), w.std((1, 2, 3), unbiased=False)
        self.gamma = nn.Parameter(std.clone())
        self.beta = nn.Parameter(mean.clone())
        self.bias = nn.Parameter(conv.bias.detach().clone()) if conv.bias is not None else None

    @property
    def weight(self) -> torch.Tensor:
        v = self.v
        z = (v - v.mean((1, 2, 3), keepdim=True)) / (v.std((1, 2, 3), unbiased=False, keepdim=True) + self.eps)
        return self.gamma.view(-1, 1, 1, 1) * z + self.beta.view(-1, 1, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, padding=self.padding)


def temporal_weights(T: int) -> torch.Tensor:
    """The temporal decoder's weights on U_0..U_{T-1}: linearly falling, summing to 1."""
    w = torch.arange(T, 0, -1, dtype=torch.float32)
    return w / w.sum()


def temporal_step_weights(T: int) -> torch.Tensor:
    """The temporal decoder's weight on the output current of step τ: W_τ = Σ_{t>=τ} w_t =
    (T - τ)(T - τ + 1)/(T (T + 1)) (before the calibration constant)."""
    return torch.flip(torch.cumsum(torch.flip(temporal_weights(T), [0]), 0), [0])


class TTFSNet(nn.Module):
    """conv3x3-IF blocks, 2x2 pooling after the layers named in ``pool_after`` (default: after every
    layer), then a non-spiking linear integrator and the decoder (see module docstring)."""

    def __init__(self, in_shape=(1, 8, 8), channels=(8, 16), n_classes: int = 10, T: int = 8,
                 init: str = "default", norm: bool = False, decoder: str = "final", pool: str = "avg",
                 p_in: float = 0.5, kappa: float = 1.0, rho: float = 1.0, surrogate_alpha: float = 2.0,
                 pool_after=None):
        super().__init__()
        if init not in ("default", "ttfs") or decoder not in ("final", "temporal") or pool not in ("avg", "max"):
            raise ValueError(f"unknown option: init={init!r}, decoder={decoder!r}, pool={pool!r}")
        self.T, self.decoder, self.pool, self.surrogate = T, decoder, pool, arctan(surrogate_alpha)
        self.pool_after = set(range(len(channels)) if pool_after is None else (int(i) for i in pool_after))
        c_prev, hw = in_shape[0], in_shape[1]
        self.convs = nn.ModuleList()
        m1 = m2 = p_in  # a TTFS input spike: a in {0, 1}
        for i, c in enumerate(channels):
            conv = nn.Conv2d(c_prev, c, 3, padding=1)
            if init == "ttfs":
                mu, sd = ttfs_init_moments(c_prev * 9, m1, m2, kappa, rho)
                with torch.no_grad():
                    conv.weight.normal_(mu, sd)
                    if conv.bias is not None:
                        conv.bias.zero_()
            self.convs.append(WNConv2d(conv) if norm else conv)
            if i in self.pool_after:  # κ = 1: half the neurons fire by T
                m1, m2 = pooled_moments(0.5, pool)
                hw //= 2
            else:
                m1 = m2 = 0.5
            c_prev = c
        self.fc = nn.Linear(c_prev * hw * hw, n_classes)
        if init == "ttfs":
            with torch.no_grad():
                self.fc.weight.normal_(0.0, 1.0 / math.sqrt(self.fc.in_features * m2))
                self.fc.bias.zero_()
        # the readout's weight on the output current of step τ (1 for the final potential; the
        # temporal decoder's W_τ times a calibration constant, see ``calibrate_decoder``)
        w = torch.ones(T) if decoder == "final" else temporal_step_weights(T)
        self.register_buffer("step_weight", w)
        # one learnable output gain (temperature) for every variant, started at 1
        self.gain = nn.Parameter(torch.ones(()))

    @torch.no_grad()
    def calibrate_decoder(self, x: torch.Tensor) -> float:
        """Scale-neutral readout: rescale the temporal decoder's step weights by one constant so that
        the logits' standard deviation over the batch ``x`` equals that of the final-potential readout
        of the same network (at initialisation: both decoders then start at the same temperature).
        A no-op for the final-potential decoder. Returns the constant."""
        if self.decoder == "final":
            return 1.0
        c = self.currents(x)
        ref = float(c.sum(0).std())
        got = float((self.step_weight.view(-1, 1, 1) * c).sum(0).std())
        k = ref / got if got > 0 and ref > 0 else 1.0
        self.step_weight.mul_(k)
        return k

    def currents(self, x: torch.Tensor) -> torch.Tensor:
        """Per-step output currents c_τ = W^o a^L_τ + b^o, (T, B, K)."""
        return self(x)["current"]

    def forward(self, x: torch.Tensor) -> dict:
        """x: images (B, C, H, W) in [0, 1]. Returns logits, output potentials U (T, B, K), the
        per-step output currents, the partial readouts (T, B, K: the logits from the currents up to
        step t, whose last entry is the logits), the IF spikes of each layer (T, B, C, H, W), the
        signals sent on (T, B, C, H', W') and the sending units' spikes (the IF spikes with average
        pooling or none, the pooled spikes with max)."""
        a = encode(x, self.T)
        spikes, sent, senders = [a], [], []
        for i, conv in enumerate(self.convs):
            T, B = a.shape[:2]
            cur = conv(a.flatten(0, 1)).unflatten(0, (T, B))
            s, _ = if_single_spike(cur, THETA, self.surrogate)
            if i in self.pool_after:
                pool = F.avg_pool2d if self.pool == "avg" else F.max_pool2d
                a = pool(s.flatten(0, 1), 2).unflatten(0, (T, B))
            else:
                a = s
            spikes.append(s)
            sent.append(a)
            senders.append(a if (i in self.pool_after and self.pool == "max") else s)
        T, B = a.shape[:2]
        c = self.fc(a.flatten(2))  # (T, B, K) output current per step
        U = torch.cumsum(c, dim=0)
        partial = self.gain * torch.cumsum(self.step_weight.view(T, 1, 1) * c, dim=0)
        return {"logits": partial[-1], "U": U, "current": c, "partial": partial, "spikes": spikes[1:],
                "input": spikes[0], "sent": sent, "senders": senders}


def decision_time(partial: torch.Tensor) -> torch.Tensor:
    """Output decision time per example: the earliest step t from which on the argmax of the partial
    readout equals the final prediction (at every step t' >= t). partial: (T, B, K) -> (B,) in 0..T-1."""
    T = partial.shape[0]
    agree = partial.argmax(2) == partial[-1].argmax(1).unsqueeze(0)  # (T, B)
    # last step at which it disagrees, + 1 (0 where it always agrees)
    t = torch.arange(1, T + 1, device=partial.device).view(T, 1)
    return torch.where(agree, torch.zeros_like(t), t).max(0).values.float()


@torch.no_grad()
def spike_statistics(out: dict, T: int) -> dict:
    """Counts behind the paper's metrics, over a batch.

    latency: mean first-spike step of the hidden IF neurons that fire; fire_frac: fraction of hidden
    neurons that fire at all; spikes_per_neuron: mean spikes per IF neuron per example.
    The single-spike rule is measured on the *sending* units of each layer, the units whose spikes
    travel to the next layer: with average pooling those are the IF neurons themselves (the pool is
    linear and folds into the next layer's synapses, weight 1/4 each); with max pooling they are the
    pooled units, which emit a spike at every step at which any neuron of their window fires.
    The network names them (``out["senders"]``).
    max_spikes_per_unit: most spikes one sending unit sent for one example; frac_multi_spike:
    fraction of (sending unit, example) pairs with more than one spike; count_hist: histogram of
    spikes per (sending unit, example), 0..4."""
    out = {k: ([a.cpu() for a in v] if isinstance(v, list) else v.cpu()) for k, v in out.items()}
    hidden = torch.cat([s.flatten(2) for s in out["spikes"]], dim=2)  # (T, B, N)
    t_first = first_spike_time(hidden)
    fired = t_first < T
    count = hidden.sum(0)
    units = torch.cat([a.flatten(2) for a in out["senders"]], dim=2).sum(0)  # (B, units): spikes per example
    hist = torch.bincount(t_first[fired].long(), minlength=T)[:T].float()
    layer_fire = [float((first_spike_time(s.flatten(2)) < T).float().mean()) for s in out["spikes"]]
    return {
        "latency": float(t_first[fired].mean()) if fired.any() else float(T),
        "fire_frac": float(fired.float().mean()),
        "fire_frac_last": layer_fire[-1],
        "spikes_per_neuron": float(count.mean()),
        "max_spikes_per_unit": float(units.max()),
        "frac_multi_spike": float((units > 1).float().mean()),
        "latency_hist": (hist / hist.sum().clamp(min=1)).tolist(),
        "count_hist": (torch.bincount(units.long().clamp(max=4).flatten(), minlength=5)[:5].float()
                       / units.numel()).tolist(),
    }
