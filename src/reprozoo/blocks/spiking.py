"""Spiking neurons, surrogate gradients and spike-operation counting, shared by the SNN methods.

Why a block: every spiking method needs the same three things and they are easy to get subtly
wrong (a reset that happens before the spike is read, a surrogate whose scale differs between
variants, SOPs counted on the wrong fan-out).

Neurons, discrete time t = 1..T, input current I_t (already weighted):

* LIF (``lif``):  v_t = β v_{t-1} (1 - s_{t-1})  +  I_t   (reset to zero), or
                  v_t = β v_{t-1} + I_t - θ s_{t-1}        (reset by subtraction)
                  s_t = H(v_t - θ).
  Without spikes and constant I: v_t = I (1 - β^t) / (1 - β)   (closed form, tested).
* Single-spike IF (``if_single_spike``): v_t = v_{t-1} + I_t, s_t = H(v_t - θ) only while the
  neuron has not fired yet; afterwards it is silent for good (time-to-first-spike coding).
  Constant I > 0: the spike time is ⌈θ / I⌉.
* Resonate-and-fire with complex state (``resonate_and_fire``):
                  z_t = λ z_{t-1} + I_t,   λ = exp((-b + iω) Δt),   s_t = H(Re z_t - θ)
  (Izhikevich 2001; the linear part is a damped oscillator). Its impulse response is λ^t, so
  for long sequences the linear part is the causal convolution with ``rf_kernel`` computed by FFT
  in O(L log L) (``causal_fft_conv``) and only the threshold is applied pointwise.
* Harmonic (second-order) RF (``harmonic_rf_kernel``): v'' + 2b v' + ω² v = x, the impulse
  response of the underdamped oscillator, exp(-b t) sin(ω_d t) / ω_d with ω_d = sqrt(ω² - b²).

Surrogates: the forward pass is the Heaviside step; the backward pass uses a smooth pseudo-
derivative g(x) of x = v - θ. All surrogates here integrate to 1 over x (so they differ in shape,
not in overall gradient scale, and a comparison between them is like for like):

    rectangular(w):  1/w on |x| < w/2
    sigmoid(a):      a σ(a x) (1 - σ(a x))
    arctan(a):       (a/2) / (1 + (π a x / 2)²)
    asymmetric(aₗ, aᵣ): a two-sided triangle with half-widths 1/aₗ (below θ) and 1/aᵣ (above);
                     normalised to area 1 and peaked at 0; aᵣ < aₗ puts more mass above threshold.

Counting: ``synaptic_ops(spikes, fan_out)`` = Σ spikes × fan-out, the accumulate (AC) operations a
neuromorphic chip would execute, the usual energy proxy.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

SurrogateFn = Callable[[torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------ surrogate gradients
def rectangular(width: float = 1.0) -> SurrogateFn:
    return lambda x: (x.abs() < width / 2).to(x.dtype) / width


def sigmoid(alpha: float = 4.0) -> SurrogateFn:
    def g(x):
        s = torch.sigmoid(alpha * x)
        return alpha * s * (1 - s)
    return g


def arctan(alpha: float = 2.0) -> SurrogateFn:
    return lambda x: (alpha / 2) / (1 + (math.pi * alpha * x / 2) ** 2)


def asymmetric(a_left: float = 2.0, a_right: float = 1.0) -> SurrogateFn:
    """Triangle with half-width 1/a_left below threshold and 1/a_right above, area 1."""
    wl, wr = 1.0 / a_left, 1.0 / a_right
    peak = 2.0 / (wl + wr)

    def g(x):
        left = peak * (1 + x / wl).clamp(min=0) * (x < 0)
        right = peak * (1 - x / wr).clamp(min=0) * (x >= 0)
        return (left + right).to(x.dtype)
    return g


SURROGATES = {"rectangular": rectangular, "sigmoid": sigmoid, "arctan": arctan,
              "asymmetric": asymmetric}


class _Spike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grad_fn):
        ctx.save_for_backward(x)
        ctx.grad_fn = grad_fn
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * ctx.grad_fn(x), None


def spike(x: torch.Tensor, surrogate: SurrogateFn) -> torch.Tensor:
    """Heaviside H(x) forward, ``surrogate(x)`` as its derivative backward (x = v - θ)."""
    return _Spike.apply(x, surrogate)


# ------------------------------------------------------------------ neurons (time-major: (T, ...))
def lif(current: torch.Tensor, beta: float | torch.Tensor = 0.9, threshold: float = 1.0,
        surrogate: SurrogateFn | None = None, reset: str = "zero",
        detach_reset: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """LIF over time-major ``current`` (T, ...); returns (spikes, membrane before reset)."""
    if reset not in ("zero", "subtract"):
        raise ValueError(f"reset must be 'zero' or 'subtract', got {reset!r}")
    surrogate = surrogate or arctan()
    v = torch.zeros_like(current[0])
    s = torch.zeros_like(current[0])
    spikes, mems = [], []
    for t in range(current.shape[0]):
        s_prev = s.detach() if detach_reset else s
        if reset == "zero":
            v = beta * v * (1 - s_prev) + current[t]
        else:
            v = beta * v + current[t] - threshold * s_prev
        s = spike(v - threshold, surrogate)
        spikes.append(s)
        mems.append(v)
    return torch.stack(spikes), torch.stack(mems)


def if_single_spike(current: torch.Tensor, threshold: float = 1.0,
                    surrogate: SurrogateFn | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Integrate-and-fire that fires at most once (TTFS); returns (spikes, membrane)."""
    surrogate = surrogate or arctan()
    v = torch.zeros_like(current[0])
    fired = torch.zeros_like(current[0])
    spikes, mems = [], []
    for t in range(current.shape[0]):
        v = v + current[t]
        s = spike(v - threshold, surrogate) * (1 - fired)
        fired = fired + s.detach()
        spikes.append(s)
        mems.append(v)
    return torch.stack(spikes), torch.stack(mems)


def first_spike_time(spikes: torch.Tensor) -> torch.Tensor:
    """Index of the first spike along time (dim 0), T where a neuron never fires."""
    T = spikes.shape[0]
    t = torch.arange(T, dtype=torch.float32).view(-1, *([1] * (spikes.dim() - 1)))
    masked = torch.where(spikes > 0, t.expand_as(spikes), torch.full_like(spikes, float(T)))
    return masked.min(dim=0).values


def resonate_and_fire(current: torch.Tensor, omega: torch.Tensor | float, damping: torch.Tensor | float,
                      dt: float = 1.0, threshold: float = 1.0, surrogate: SurrogateFn | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Complex-state RF neurons by recurrence; (spikes, complex state). No reset: the linear
    part stays a convolution (the SSM view), which is what the FFT path relies on."""
    surrogate = surrogate or arctan()
    lam = torch.exp(torch.complex(-torch.as_tensor(damping, dtype=torch.float32) * dt,
                                  torch.as_tensor(omega, dtype=torch.float32) * dt))
    z = torch.zeros_like(current[0], dtype=torch.complex64)
    states = []
    for t in range(current.shape[0]):
        z = lam * z + current[t]
        states.append(z)
    z = torch.stack(states)
    return spike(z.real - threshold, surrogate), z


def rf_kernel(omega: torch.Tensor, damping: torch.Tensor, length: int, dt: float = 1.0) -> torch.Tensor:
    """Impulse response λ^t (t = 0..L-1) per channel: complex (channels, L)."""
    t = torch.arange(length, dtype=torch.float32)
    omega = torch.as_tensor(omega, dtype=torch.float32).reshape(-1, 1)
    damping = torch.as_tensor(damping, dtype=torch.float32).reshape(-1, 1)
    return torch.exp(torch.complex(-damping * dt * t, omega * dt * t))


def harmonic_rf_kernel(omega: torch.Tensor, damping: torch.Tensor, length: int, dt: float = 1.0) -> torch.Tensor:
    """Impulse response of v'' + 2b v' + ω² v = x sampled at t = kΔt (real, (channels, L)).

    Underdamped (ω > b): exp(-b t) sin(ω_d t) / ω_d, ω_d = sqrt(ω² - b²); the kernel is scaled by
    Δt so that the discrete convolution approximates the integral."""
    t = torch.arange(length, dtype=torch.float32) * dt
    omega = torch.as_tensor(omega, dtype=torch.float32).reshape(-1, 1)
    b = torch.as_tensor(damping, dtype=torch.float32).reshape(-1, 1)
    wd = torch.sqrt((omega ** 2 - b ** 2).clamp(min=1e-8))
    return torch.exp(-b * t) * torch.sin(wd * t) / wd * dt


def causal_fft_conv(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """y[..., c, t] = Σ_{k<=t} kernel[c, k] x[..., c, t-k], in O(L log L) by zero-padded FFT.

    ``x``: (..., C, L) real; ``kernel``: (C, L) real or complex (then the result is complex)."""
    L = x.shape[-1]
    n = 1 << (2 * L - 1).bit_length()
    if torch.is_complex(kernel):
        y = torch.fft.ifft(torch.fft.fft(x.to(kernel.dtype), n=n) * torch.fft.fft(kernel, n=n), n=n)
    else:
        y = torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(kernel, n=n), n=n)
    return y[..., :L]


# ------------------------------------------------------------------ counting
def synaptic_ops(spikes: torch.Tensor, fan_out: int) -> float:
    """Accumulate operations triggered by ``spikes``: each spike reaches ``fan_out`` synapses."""
    return float(spikes.detach().sum()) * fan_out


def firing_rate(spikes: torch.Tensor) -> float:
    """Mean spikes per neuron per time step."""
    return float(spikes.detach().float().mean())
