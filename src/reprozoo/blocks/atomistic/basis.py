"""Radial bases, cutoff envelopes and the shifted softplus (torch modules, any dtype/device)."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

LOG2 = math.log(2.0)
EXP_FLOOR = -80.0  # Gaussian basis exponent floor (values below ~2e-35 are treated as 2e-35)


def shifted_softplus(x: torch.Tensor) -> torch.Tensor:
    """ssp(x) = softplus(x) - log 2 (SchNet's activation; ssp(0) = 0, ssp'(x) = sigmoid(x))."""
    return F.softplus(x) - LOG2


class ShiftedSoftplus(nn.Module):
    def forward(self, x):
        return shifted_softplus(x)


class GaussianRBF(nn.Module):
    """exp(-gamma (d - mu_k)^2), centres mu_k evenly spaced in [start, cutoff], gamma = 1/(2 width^2).

    ``width`` defaults to the centre spacing (SchNet). Output (..., n_rbf).
    """

    def __init__(self, n_rbf: int = 20, cutoff: float = 5.0, start: float = 0.0, width: float | None = None,
                 trainable: bool = False):
        super().__init__()
        centers = torch.linspace(start, cutoff, n_rbf, dtype=torch.float64)
        w = float(width) if width is not None else float(centers[1] - centers[0]) if n_rbf > 1 else 1.0
        gamma = torch.full((n_rbf,), 0.5 / w**2, dtype=torch.float64)
        if trainable:
            self.centers, self.gamma = nn.Parameter(centers.float()), nn.Parameter(gamma.float())
        else:
            self.register_buffer("centers", centers.float())
            self.register_buffer("gamma", gamma.float())
        self.n_rbf, self.cutoff = n_rbf, float(cutoff)

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        diff = d.unsqueeze(-1) - self.centers
        # clamp: exp of very negative arguments (underflow) is ~5x slower on CPU; exp(-80) ~ 2e-35
        return torch.exp((-self.gamma * diff * diff).clamp(min=EXP_FLOOR))

    def derivative(self, d: torch.Tensor, rbf: torch.Tensor | None = None) -> torch.Tensor:
        """d rbf / d d, for hand-written backward passes (same shape as forward)."""
        rbf = self.forward(d) if rbf is None else rbf
        return -2.0 * self.gamma * (d.unsqueeze(-1) - self.centers) * rbf


class BesselRBF(nn.Module):
    """sqrt(2/c) sin(k pi d / c) / d, k = 1..n (DimeNet/NequIP); finite limit at d -> 0."""

    def __init__(self, n_rbf: int = 8, cutoff: float = 5.0, trainable: bool = False):
        super().__init__()
        freqs = torch.arange(1, n_rbf + 1, dtype=torch.float32) * math.pi / cutoff
        if trainable:
            self.freqs = nn.Parameter(freqs)
        else:
            self.register_buffer("freqs", freqs)
        self.n_rbf, self.cutoff = n_rbf, float(cutoff)
        self.prefactor = math.sqrt(2.0 / cutoff)

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        d = d.unsqueeze(-1)
        x = self.freqs * d
        safe = torch.where(d.abs() < 1e-9, torch.ones_like(d), d)
        return self.prefactor * torch.where(d.abs() < 1e-9, self.freqs.expand_as(x), torch.sin(x) / safe)

    def derivative(self, d: torch.Tensor, rbf: torch.Tensor | None = None) -> torch.Tensor:
        d = d.unsqueeze(-1)
        x = self.freqs * d
        safe = torch.where(d.abs() < 1e-9, torch.ones_like(d), d)
        val = (self.freqs * torch.cos(x) * safe - torch.sin(x)) / (safe * safe)
        return self.prefactor * torch.where(d.abs() < 1e-9, torch.zeros_like(x), val)


class CosineCutoff(nn.Module):
    """f(d) = 0.5 (cos(pi d / c) + 1) for d < c, else 0 (smooth, f(c) = f'(c) = 0)."""

    def __init__(self, cutoff: float = 5.0):
        super().__init__()
        self.cutoff = float(cutoff)

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        return 0.5 * (torch.cos(d * (math.pi / self.cutoff)) + 1.0) * (d < self.cutoff).to(d.dtype)

    def derivative(self, d: torch.Tensor) -> torch.Tensor:
        k = math.pi / self.cutoff
        return -0.5 * k * torch.sin(d * k) * (d < self.cutoff).to(d.dtype)


class PolynomialCutoff(nn.Module):
    """DimeNet envelope 1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2), x = d / c."""

    def __init__(self, cutoff: float = 5.0, p: int = 6):
        super().__init__()
        self.cutoff, self.p = float(cutoff), int(p)

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        p, x = self.p, d / self.cutoff
        out = 1 - (p + 1) * (p + 2) / 2 * x**p + p * (p + 2) * x ** (p + 1) - p * (p + 1) / 2 * x ** (p + 2)
        return out * (x < 1).to(d.dtype)


def make_rbf(kind: str, n_rbf: int, cutoff: float) -> nn.Module:
    kinds = {"gaussian": GaussianRBF, "bessel": BesselRBF}
    if kind not in kinds:
        raise ValueError(f"unknown radial basis '{kind}'; allowed: {sorted(kinds)}")
    return kinds[kind](n_rbf=n_rbf, cutoff=cutoff)
