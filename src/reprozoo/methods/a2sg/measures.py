"""What is measured on a trained network, identically for every variant.

* **accuracy per test sample** (``correct``: 1/0 per sample, the platform's test units).
* **synaptic operations per test sample** (the paper's energy measure): every spike of conv
  layer 1 reaches c2 x k synapses of conv layer 2, every spike of layer 2 reaches the 10 read-out
  units (after pooling); SOPs = Σ spikes x fan-out, per sample. The first layer's multiply-
  accumulates on the real-valued input are the same for every variant and not counted.
* **sharpness** (loss-landscape curvature proxy, forward passes only, so independent of the
  surrogate): for K random directions d, each weight tensor's slice d_W ~ N(0, I) rescaled to
  ρ ‖W‖ (layer-wise relative norm, so that BN's scale invariance does not favour any variant),
  sharpness = mean_k L(w + d_k) - L(w), the cross-entropy on a fixed training subset, BN in eval
  mode. For a quadratic basin L(w + d) - L(w) = ½ dᵀHd on average.
* **cross-time-step consistency of the weight gradient**: the weights are shared over time, so
  dL/dW = Σ_t g_t; g_t = dL/dδ_t (see ``snn``) over all conv and read-out weights, concatenated;
  the mean cosine over pairs t < t'. Measured with each variant's own surrogate (the directions
  its training follows).
* **local-gradient statistics** (the paper's quantities), δ^l[t] = ∂L/∂v^l[t] with each variant's
  own surrogate: ``sgv`` = Var/Mean|.| of δ^l[T], ``cv`` = std/Mean|.| of δ^l[T] (scale-free,
  Theorem 4.2's coefficient of variation), ``tgc`` = cos(δ^l[t], δ^l[t+1]); means over layers (and
  t for tgc).
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ...blocks.spiking import firing_rate
from .snn import WEIGHTS
from .surrogates import cosine, sgv

E_MAC, E_AC = 4.6, 0.9   # pJ per multiply-accumulate / accumulate (45 nm, as in the paper's energy estimate)


@torch.no_grad()
def loss_on(model, surrogate, x, y) -> float:
    return float(F.cross_entropy(model(x, surrogate), y))


@torch.no_grad()
def loss_acc(model, surrogate, x, y) -> tuple[float, float]:
    """Cross-entropy and accuracy, BN in eval mode (the validation curve)."""
    model.eval()
    logits = model(x, surrogate)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())


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


def local_gradients(model, surrogate, x, y) -> list[list[torch.Tensor]]:
    """δ^l[t] = ∂L/∂v^l[t] (flattened over batch and neurons), per layer and step, BN in eval mode."""
    model.eval()
    trace: dict = {}
    loss = F.cross_entropy(model(x, surrogate, trace=trace), y)
    vs = [v for layer in trace["v"] for v in layer]
    grads = torch.autograd.grad(loss, vs)
    T = model.T
    return [[grads[l * T + t].reshape(-1) for t in range(T)] for l in range(len(trace["v"]))]


def local_gradient_stats(deltas: list[list[torch.Tensor]]) -> dict:
    """The paper's SGV (final step), the coefficient of variation there, and TGC (adjacent steps)."""
    sg, cv, tg = [], [], []
    for d in deltas:
        last = d[-1]
        m = float(last.abs().mean())
        if m > 0:
            sg.append(float(sgv(last)))
            cv.append(float(last.std(unbiased=False)) / m)
        for t in range(len(d) - 1):
            c = cosine(d[t], d[t + 1])
            if torch.isfinite(c):
                tg.append(float(c))
    nan = float("nan")
    mean = lambda v: sum(v) / len(v) if v else nan  # noqa: E731
    return {"sgv": mean(sg), "cv": mean(cv), "tgc": mean(tg)}


def final_step_local(model, surrogate, x, y) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (δ^l[T], u^l[T]) flattened over batch and neurons: the final step's local gradient
    ∂L/∂v^l[T] under ``surrogate`` and the membrane potential minus the threshold, BN in eval mode.
    The forward pass (so u) does not depend on the surrogate; δ does."""
    model.eval()
    trace: dict = {}
    loss = F.cross_entropy(model(x, surrogate, trace=trace), y)
    last = [layer[-1] for layer in trace["v"]]
    grads = torch.autograd.grad(loss, last)
    return [(g.reshape(-1), (v.detach() - model.threshold).reshape(-1)) for g, v in zip(grads, last)]


def window_cv(delta: torch.Tensor, u: torch.Tensor, beta: float) -> float:
    """The coefficient of variation std/Mean|.| of δ over the entries inside the window |u| <= β only
    (outside it every window shape gives δ = 0 at the final step, and those zeros would dominate the
    CV: cold review after the budget round, item 3). NaN when no entry is inside."""
    d = delta[u.abs() <= beta]
    m = float(d.abs().mean()) if d.numel() else 0.0
    return float(d.std(unbiased=False)) / m if m > 0 else float("nan")


def theorem_condition(u: torch.Tensor, beta: float) -> dict:
    """Theorem 4.2's precondition as it applies to the shapes here, from the membrane distribution
    alone. For δ = a g_β(u) with a independent of u (the theorem's setting), CV(δ)² + 1 =
    (E a² / (E|a|)²) · E g² / (E g)², so on the in-window entries ASY's CV is below TRI's exactly when
    R(ASY) < R(TRI), R(g) = E g(u)² / (E g(u))² over the in-window membrane potentials. ``margin`` =
    R(TRI) - R(ASY) > 0 is the condition (for a density linear in the window, p(u) ∝ 1 + c u / β, it
    holds iff c > 0: more neurons just above threshold than just below; a uniform density ties).
    ``mean_x`` = E[u / β] over the window (c / 3 for the linear density), ``frac`` the share of entries
    inside the window."""
    from .surrogates import asy, tri

    inside = u[u.abs() <= beta]
    if inside.numel() < 2:
        return {"margin": float("nan"), "mean_x": float("nan"), "frac": 0.0}
    r = lambda g: float((g ** 2).mean() / g.mean() ** 2)  # noqa: E731
    return {"margin": r(tri(inside, beta)) - r(asy(inside, beta, 0.5)), "mean_x": float((inside / beta).mean()),
            "frac": float(inside.numel() / u.numel())}


@torch.no_grad()
def evaluate(model, surrogate, x, y) -> dict:
    """Accuracy and SOPs per sample (test units), loss, firing rate per layer and per step."""
    model.eval()
    logits, spikes = model(x, surrogate, record=True)
    correct = (logits.argmax(1) == y).float()
    out = {"acc": float(correct.mean()), "correct": correct.tolist(),
           "loss": float(F.cross_entropy(logits, y))}
    fan_out = [model.conv2.weight.shape[0] * model.conv2.weight[0, 0].numel(), model.fc.out_features]
    sops = torch.zeros(len(y), device=y.device)
    for l, s in enumerate(spikes):
        out[f"fr_l{l + 1}"] = firing_rate(s)
        out[f"fr_l{l + 1}_t"] = [firing_rate(s[t]) for t in range(s.shape[0])]
        # per sample: spikes summed over steps and neurons, times the synapses each reaches
        sops += s.transpose(0, 1).reshape(len(y), -1).sum(1) * fan_out[l]
    out["sops_units"] = sops.tolist()
    out["sops"] = float(sops.mean())
    # energy per sample, the paper's convention: the first layer's multiply-accumulates on the real
    # input (computed at every step) at E_MAC = 4.6 pJ, every synaptic operation at E_AC = 0.9 pJ
    # (45 nm); the first layer's MACs are the same for every variant
    w1 = model.conv1.weight
    out["macs_l1"] = float(model.T * w1.shape[0] * w1[0].numel() * x.shape[-1] ** model.dim)
    energy = E_MAC * out["macs_l1"] + E_AC * sops
    out["energy_units"] = energy.tolist()
    out["energy_pj"] = float(energy.mean())
    out["fr"] = (out["fr_l1"] + out["fr_l2"]) / 2
    return out
