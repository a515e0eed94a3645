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


def _smooth_stack(n_t=24, n=32):
    """A field advected slowly in time: strongly correlated frames (what a 3-D transform can exploit)."""
    x = np.arange(n) * 2 * np.pi / n
    return np.array([np.sin(x[:, None] + 0.05 * t) * np.cos(2 * x[None, :] - 0.03 * t) for t in range(n_t)])


def test_zfp_bytes_count_one_header_and_the_accuracy_bound_holds_in_2d_and_3d():
    zfpy = pytest.importorskip("zfpy")
    from reprozoo.methods.antic.zfp_codec import compress

    f = _smooth_stack()
    tol = 1e-3
    b1, r1 = compress(f[:1], 2, tolerance=tol)
    assert b1 == len(zfpy.compress_numpy(f[0].astype(np.float32), tolerance=tol))  # one frame: exactly zfpy's stream
    b2, r2 = compress(f, 2, tolerance=tol)
    streams = [zfpy.compress_numpy(g.astype(np.float32), tolerance=tol) for g in f]
    assert b2 == sum(len(b) for b in streams) - (len(f) - 1) * 12  # one 96-bit header for the whole store
    assert np.array_equal(r2, np.array([zfpy.decompress_numpy(b) for b in streams]))
    b3, r3 = compress(f, 3, tolerance=tol)
    assert r3.shape == f.shape
    for r in (r1, r2, r3):  # fixed accuracy: max abs error within the tolerance (float32 input rounding aside)
        assert np.max(np.abs(r - f[: len(r)])) <= tol + 1e-6
    assert b3 < 0.8 * b2  # the 3-D transform exploits the correlation in time that per-frame 2-D cannot


def test_zfp_kept_modes_reconstruct_a_linear_in_time_field_through_the_same_interpolation():
    pytest.importorskip("zfpy")
    from reprozoo.methods.antic.zfp_codec import encode, values_compressed

    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 16, 16))
    truth = np.array([a + 0.1 * i * b for i in range(13)])
    kept = [0, 4, 5, 12]
    for v in ("zfp_kept", "zfp_kept_3d"):
        nbytes, rec = encode(truth, kept, v, tolerance=1e-4)
        assert rec.shape == truth.shape
        assert np.max(np.abs(rec - truth)) < 1e-3  # interpolation is exact here; zfp adds <= its tolerance
        assert values_compressed(truth, kept, v) == 4 * 256
        n_all, _ = encode(truth, kept, v.replace("_kept", ""), tolerance=1e-4)
        assert nbytes < n_all  # 4 of 13 frames stored
    # a coarser tolerance stores fewer bytes and loses accuracy
    errs, sizes = [], []
    for tol in (1e-3, 1e-2, 1e-1):
        nbytes, rec = encode(truth, kept, "zfp_kept_3d", tolerance=tol)
        sizes.append(nbytes)
        errs.append(np.linalg.norm(rec - truth) / np.linalg.norm(truth))
    assert sizes[0] > sizes[1] > sizes[2] and errs[0] < errs[1] < errs[2]


def test_loglog_interpolation_is_exact_on_a_power_law_and_refuses_to_extrapolate():
    from reprozoo.methods.antic.zfp_codec import loglog_at

    xs = np.array([100.0, 300.0, 1000.0, 5000.0])
    ys = 7.0 * xs**-1.3
    for q in (150.0, 999.0, 2500.0):
        assert loglog_at(q, xs[::-1], ys[::-1]) == pytest.approx(7.0 * q**-1.3, rel=1e-12)
    assert loglog_at(50.0, xs, ys) is None and loglog_at(6000.0, xs, ys) is None
