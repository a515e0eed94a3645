"""The paper's composite loss, as its public code defines it (read, not copied: the reference
``EMTransformerCast.forward`` with ``L2_LOSS(learn_log_variance=...)`` and ``weighted_rmse_torch``).

For a forecast f and target t with C variables (any leading batch / lead axes):

    L_gen  = mean_c [ MSE_c / exp(s_c) + s_c ]        MSE_c: plain grid mean of (f - t)^2 of variable c,
                                                       s_c: a learned log-variance per variable (init 0)
    L_rmse = mean_c  RMSE_c,  RMSE_c = sqrt( mean_{j,i} w_j (f - t)^2 )   (latitude weights w_j)
    L      = (1 - lambda) L_gen + lambda L_rmse

Sinusoidal weighting (the paper's): lambda = (sin(theta) + 1) / 2 with theta a *learned* scalar,
initialised at -pi/2 (lambda = 0), trained with the network by the same optimiser through pretraining
and fine-tuning. Fixed weighting (the ablation): lambda a constant (1/2, the sinusoid's centre,
sin theta = 0), everything else the same, the learned log-variances included.

Note what the rule implies: dL/dtheta = cos(theta) (L_rmse - L_gen) / 2, and theta = -pi/2 is a
stationary point; while L_rmse > L_gen (errors below one standard deviation, and s_c falling
towards log MSE_c makes L_gen negative) gradient descent keeps theta at -pi/2, i.e. lambda near 0.
The training records lambda so that the page shows where it went.
"""
from __future__ import annotations

import math

import torch
from torch import nn

THETA0 = -math.pi / 2  # the reference initialises theta at -1.5708: lambda = 0


class CompositeLoss(nn.Module):
    def __init__(self, channels: int, weighting: str = "sin", fixed_weight: float = 0.5):
        super().__init__()
        if weighting not in ("sin", "fixed"):
            raise ValueError(f"loss weighting '{weighting}': expected 'sin' or 'fixed'")
        self.weighting = weighting
        self.logvar = nn.Parameter(torch.zeros(channels))
        if weighting == "sin":
            self.theta = nn.Parameter(torch.tensor(THETA0))
        else:
            self.register_buffer("fixed", torch.tensor(float(fixed_weight)))

    def weight(self) -> torch.Tensor:
        """lambda, the weight of the RMSE term."""
        if self.weighting == "sin":
            return 0.5 * (torch.sin(self.theta) + 1.0)
        return self.fixed

    def terms(self, pred: torch.Tensor, target: torch.Tensor, lat_w: torch.Tensor):
        """(L_gen, L_rmse); pred, target (..., C, H, W); lat_w (H, 1) with mean 1."""
        err2 = (pred - target) ** 2
        mse = err2.mean(dim=(-2, -1))  # (..., C)
        gen = (mse * torch.exp(-self.logvar) + self.logvar).mean()
        rmse = torch.sqrt((lat_w * err2).mean(dim=(-2, -1))).mean()
        return gen, rmse

    def forward(self, pred: torch.Tensor, target: torch.Tensor, lat_w: torch.Tensor) -> torch.Tensor:
        gen, rmse = self.terms(pred, target, lat_w)
        w = self.weight()
        return (1.0 - w) * gen + w * rmse
