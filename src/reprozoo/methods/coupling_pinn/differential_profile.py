"""Per-layer differential propagation profile: how dh_l/dx and d^2h_l/dx^2 scale with the layer l.

For hidden states h_l(X) (l = 0..L, width w) and the spatial coordinate x,

    D1_l = mean_points || d h_l / dx ||_2,     D2_l = mean_points || d^2 h_l / dx^2 ||_2

are read from the trunk's Taylor-mode jets (networks.PINNTrunk.jet: exact derivatives, layer by
layer, no finite differences). A trunk whose D1_l decays geometrically in l has *vanishing
differentials*: the PDE residual, built from u_x and u_xx, then sees an almost constant function
of x, whatever the weights. The band of a profile is log10(max_l D_l / min_l D_l), in decades.
"""
from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def hidden_profile(model, problem, X: np.ndarray, member: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(D1, D2), each of length L + 1, for member ``member`` of the trunk ``model`` on points X (N, d)."""
    was_training = model.training
    model.eval()  # no power-iteration update while profiling
    try:
        _, hs = model.jet(problem.feature_jet(X), problem.n_dirs, True, return_hidden=True)
    finally:
        model.train(was_training)
    n1 = np.array([float(h[1, member].norm(dim=-1).mean()) for h in hs])    # d/dx: direction 0
    n2 = np.array([float(h[-1, member].norm(dim=-1).mean()) for h in hs])   # d2/dx2
    return n1, n2


def band_decades(profile: np.ndarray) -> float:
    """log10(max / min) of a positive profile: how many decades the derivative norms span."""
    p = np.asarray(profile, dtype=np.float64)
    return float(np.log10(p.max() / max(p.min(), 1e-300)))
