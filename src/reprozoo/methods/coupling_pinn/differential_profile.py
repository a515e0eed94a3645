"""Per-layer differential propagation profile: how dh_l/dx and d^2h_l/dx^2 scale with the layer l.

For hidden states h_l(X) (l = 0..L, width w) and the direction e along the spatial coordinate x,

    D1_l = mean_points || d h_l / dx ||_2,     D2_l = mean_points || d^2 h_l / dx^2 ||_2

are computed in forward mode (``torch.func.jvp`` nested twice: exact directional first and
second derivatives, one pass each, no finite differences). A trunk whose D1_l decays
geometrically in l has *vanishing differentials*: the PDE residual, built from u_x and u_xx,
then sees an almost constant function of x, whatever the weights. The band of a profile is
log10(max_l D_l / min_l D_l), in decades.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.func import jvp


def hidden_profile(model, problem, X: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(D1, D2), each of length L + 1, for the trunk ``model`` on points X (N, d)."""
    was_training = model.training
    model.eval()  # no power-iteration update inside the functional transforms
    e = torch.zeros_like(X)
    e[:, problem.profile_col] = 1.0

    def hidden(Xin):
        _, hs = model(problem.features(Xin), return_hidden=True)
        return torch.stack(hs)  # (L + 1, N, w)

    def first(Xin):
        return jvp(hidden, (Xin,), (e,))[1]

    try:
        d1, d2 = jvp(first, (X,), (e,))
    finally:
        model.train(was_training)
    n1 = d1.detach().norm(dim=-1).mean(dim=-1).numpy()
    n2 = d2.detach().norm(dim=-1).mean(dim=-1).numpy()
    return n1.astype(np.float64), n2.astype(np.float64)


def band_decades(profile: np.ndarray) -> float:
    """log10(max / min) of a positive profile: how many decades the derivative norms span."""
    p = np.asarray(profile, dtype=np.float64)
    return float(np.log10(p.max() / max(p.min(), 1e-300)))
