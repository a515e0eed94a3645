"""Fourier features beat raw coordinates on a high-frequency target; attention blocks are
permutation-equivariant over points (the property a point-set simulator relies on)."""
import math

import torch

from reprozoo.blocks.neural_field import (CoordinateMLP, FourierFeatures, PointAttention, SliceAttention,
                                          grid_coordinates)


def _fit(model, x, y, steps=300):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return float(loss.detach())


def test_fourier_features_fit_high_frequencies_that_raw_coordinates_cannot():
    torch.manual_seed(0)
    x = grid_coordinates(256)
    y = torch.sin(2 * math.pi * 12 * x)
    ff = _fit(CoordinateMLP(1, 1, width=64, depth=2, n_features=32, sigma=10.0), x, y)
    raw = _fit(CoordinateMLP(1, 1, width=64, depth=2, sigma=0.0), x, y)
    assert ff < 0.05 and raw > 0.3   # raw MLP stays near the variance 0.5 (spectral bias)


def test_features_are_deterministic_buffers():
    a, b = FourierFeatures(2, 8, 3.0, seed=1), FourierFeatures(2, 8, 3.0, seed=1)
    assert torch.equal(a.B, b.B) and "B" in a.state_dict() and not list(a.parameters())


def test_grid_coordinates_layout():
    c = grid_coordinates(2, 3)
    assert c.shape == (6, 2) and torch.allclose(c[1], torch.tensor([0.0, 1 / 3]))


def test_point_attention_is_permutation_equivariant():
    torch.manual_seed(0)
    x = torch.randn(2, 10, 16)
    perm = torch.randperm(10)
    for block in (PointAttention(16), SliceAttention(16, slices=4)):
        block.eval()
        torch.testing.assert_close(block(x)[:, perm], block(x[:, perm]), rtol=1e-5, atol=1e-5)


def test_cross_attention_output_follows_queries_and_ignores_context_order():
    torch.manual_seed(0)
    q, ctx = torch.randn(1, 5, 16), torch.randn(1, 12, 16)
    block = PointAttention(16).eval()
    out = block(q, ctx)
    assert out.shape == (1, 5, 16)
    torch.testing.assert_close(out, block(q, ctx[:, torch.randperm(12)]), rtol=1e-5, atol=1e-5)
