"""ANTIC numerics: residual merge = delta forward, byte accounting, selector, interpolation, planted-change recovery."""
import numpy as np
import pytest
import torch

from reprozoo.blocks.neural_field import CoordinateMLP, grid_coordinates
from reprozoo.methods.antic.flow import enstrophy, make_flow, run_insitu
from reprozoo.methods.antic.neural_codec import (ContinualCodec, _linears, antic_bytes, delta_size, forward_with_delta,
                                                 n_params, scratch_width)
from reprozoo.methods.antic.selection import AdaptiveSelector, UniformSelector, interpolate_frames

CFG = dict(width=16, depth=2, n_features=16, sigma=2.0, rank=2, batch=256, lr=1e-2, delta_lr=2e-2,
           base_steps=300, delta_steps=150, scratch_steps=50)


def _deltas(model, rank, rng):
    return [(torch.tensor(rng.normal(size=(l.out_features, rank)), dtype=torch.float32),
             torch.tensor(rng.normal(size=(l.in_features, rank)), dtype=torch.float32),
             torch.tensor(rng.normal(size=l.out_features), dtype=torch.float32)) for l in _linears(model)]


def test_merged_residual_equals_delta_forward():
    torch.manual_seed(0)
    m = CoordinateMLP(2, 1, width=8, depth=2, n_features=4, sigma=1.0)
    x = torch.rand(50, 2)
    d = _deltas(m, 2, np.random.default_rng(0))
    assert torch.allclose(forward_with_delta(m, x, None), m(x))
    y = forward_with_delta(m, x, d)
    with torch.no_grad():
        for lin, (u, v, db) in zip(_linears(m), d):
            lin.weight += u @ v.T
            lin.bias += db
    assert torch.allclose(m(x), y, atol=1e-5)
    assert delta_size(m, 2) == sum(u.numel() + v.numel() + b.numel() for u, v, b in d)


def test_scratch_width_counts_the_network_exactly():
    for w in (4, 10, 20):
        m = CoordinateMLP(2, 1, width=w, depth=2, n_features=w // 2, sigma=1.0)
        assert scratch_width(n_params(m), 2) == w
        assert scratch_width(n_params(m) - 1, 2) < w


def test_enstrophy_closed_form():
    x = np.arange(32) * 2 * np.pi / 32
    w = np.sin(x)[:, None] * np.ones(32)[None, :] * 3.0
    assert enstrophy(w) == pytest.approx(0.5 * 9 * 0.5, rel=1e-12)  # Z = A^2 / 4


def test_interpolation_exact_for_linear_in_time_fields_and_keeps_kept_frames():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 5, 5))
    frames = np.array([a + i * b for i in range(11)])
    kept = [0, 3, 4, 10]
    rec = interpolate_frames(kept, frames[kept] + 0.0, 11)
    np.testing.assert_allclose(rec, frames, atol=1e-12)
    noisy = frames[kept] + rng.normal(size=frames[kept].shape)
    np.testing.assert_allclose(interpolate_frames(kept, noisy, 11)[kept], noisy)


def test_adaptive_selector_spends_frames_where_the_field_changes():
    n = 100
    t = np.arange(n)
    # a planted burst: the field rotates fast in 40 <= t < 60, slowly elsewhere
    phase = np.cumsum(np.where((t >= 40) & (t < 60), 0.2, 0.01))
    g = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    frames = [np.sin(g[:, None] + p) * np.ones(16) + 2.0 for p in phase]
    sel = AdaptiveSelector(n, 0.1, 1.0)
    kept = [i for i in range(n) if sel.keep(i, frames[i])]
    assert kept[0] == 0 and kept[-1] == n - 1
    inside = sum(40 <= k < 60 for k in kept)
    assert inside >= 0.6 * (len(kept) - 2)  # most kept frames sit in the burst (20% of the time)
    const = AdaptiveSelector(10, 0.1, 0.1)
    assert [i for i in range(10) if const.keep(i, np.ones((4, 4)))] == [0, 9]
    assert sorted(UniformSelector(100, len(kept)).kept) == sorted(set(np.round(np.linspace(0, 99, len(kept))).astype(int)))


def test_continual_codec_learns_a_planted_change_and_counts_its_bytes():
    n = 16
    x = np.arange(n) / n
    f0 = np.sin(2 * np.pi * x)[:, None] * np.cos(2 * np.pi * x)[None, :]
    f1 = f0 + 0.3 * np.sin(4 * np.pi * x)[:, None] * np.ones(n)[None, :]  # planted residual
    c = ContinualCodec(n, CFG, 0)
    c.add(0, f0)
    err0 = np.linalg.norm(c.recon[0] - f0) / np.linalg.norm(f0)
    stale = np.linalg.norm(c.recon[0] - f1) / np.linalg.norm(f1)  # what the unadapted base gives on frame 1
    c.add(1, f1)
    err1 = np.linalg.norm(c.recon[1] - f1) / np.linalg.norm(f1)
    assert err0 < 0.1
    assert err1 < 0.5 * stale  # the rank-2 residual captured most of the planted change
    assert c.stored_bytes == antic_bytes(CFG, 2)
    assert c.stored_bytes < 2 * 2 * n_params(c.model)  # a delta is smaller than a second network


def test_insitu_callback_sees_every_frame_of_the_solver():
    p = dict(n=16, nu=0.05, drag=0.1, k_f=2, forcing_amplitude=1.0, t_start=0.0, dt_save=0.05, n_frames=5)
    solver, w_hat0, t_save = make_flow(p, 0)
    seen = []
    wall, in_cb = run_insitu(solver, w_hat0, t_save, lambda i, w: seen.append((i, w.shape)))
    assert [s[0] for s in seen] == list(range(5)) and seen[0][1] == (16, 16)
    assert 0 <= in_cb <= wall


def test_zfp_fixed_accuracy_bound():
    zfpy = pytest.importorskip("zfpy")
    w = np.random.default_rng(0).normal(size=(32, 32)).astype(np.float32)
    rec = zfpy.decompress_numpy(zfpy.compress_numpy(w, tolerance=1e-2))
    assert np.max(np.abs(rec - w)) <= 1e-2
