"""ANTIC numerics: residual merge = delta forward, byte accounting, selector, interpolation, planted-change recovery."""
import numpy as np
import pytest
import torch

from reprozoo.blocks.neural_field import CoordinateMLP, grid_coordinates
from reprozoo.methods.antic.flow import enstrophy, make_flow, run_insitu
from reprozoo.methods.antic.neural_codec import (ContinualCodec, ScratchCodec, _linears, antic_bytes, delta_size,
                                                 forward_with_delta, lr_at, n_params, scratch_config, scratch_params,
                                                 scratch_width)
from reprozoo.methods.antic.selection import AdaptiveSelector, UniformSelector, interpolate_frames

CFG = dict(width=16, depth=2, n_features=16, sigma=2.0, rank=2, batch=256, lr=1e-2, delta_lr=2e-2, scratch_lr=1e-2,
           lr_floor=0.1, eval_every=5, base_steps=300, delta_steps=150, scratch_steps=50)


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


def test_cached_fourier_features_change_no_number():
    """The codecs compute the grid's Fourier features once (a fixed buffer) instead of at every step:
    the same numbers, so the same fits and reconstructions."""
    n = 16
    x = np.arange(n) / n
    f0 = np.sin(2 * np.pi * x)[:, None] * np.cos(4 * np.pi * x)[None, :] + 0.2
    cfg = {**CFG, "base_steps": 20, "delta_steps": 10, "batch": 64}
    c = ContinualCodec(n, cfg, 3)
    assert torch.equal(c.feat, c.model.features(c.x))
    d = _deltas(c.model, 2, np.random.default_rng(1))
    assert torch.equal(forward_with_delta(c.model, c.x, d), forward_with_delta(c.model, c.x, d, c.feat))
    c.add(0, f0)
    m, s = c.norms[0]
    with torch.no_grad():
        direct = m + s * c.model(c.x).numpy().reshape(n, n).astype(np.float64)
    np.testing.assert_array_equal(c.recon[0], direct)
    b = c.branch(1)
    assert torch.equal(b.feat, b.model.features(b.x))


def test_scratch_width_counts_the_network_exactly():
    for w, f in ((4, 2), (10, 16), (20, 32)):
        m = CoordinateMLP(2, 1, width=w, depth=2, n_features=f, sigma=1.0)
        assert scratch_params(w, 2, f) == n_params(m)
        assert scratch_width(n_params(m), 2, f) == w
        assert scratch_width(n_params(m) - 1, 2, f) < w


def test_scratch_baseline_stores_at_most_antics_bytes_with_antics_encoding():
    """Equal storage by construction: per kept frame, the scratch network (ANTIC's Fourier features)
    plus its normalisation never exceeds ANTIC's bytes, and its codec counts exactly those bytes."""
    n = 16
    x = np.arange(n) / n
    f0 = np.sin(2 * np.pi * x)[:, None] * np.cos(2 * np.pi * x)[None, :]
    for k in (2, 5, 30):
        width, nbytes = scratch_config(CFG, k)
        assert nbytes <= antic_bytes(CFG, k)
        # one more hidden unit would exceed ANTIC's bytes
        assert 2 * (scratch_params(width + 1, 2, CFG["n_features"]) + 2) * k > antic_bytes(CFG, k)
    cfg = {**CFG, "scratch_steps": 5}
    width, nbytes = scratch_config(cfg, 3)
    c = ScratchCodec(n, cfg, 0, width)
    for i in range(3):
        c.add(i, f0 * (1 + 0.1 * i))
    assert c.stored_bytes == nbytes


def test_cosine_rate_stays_above_the_gate_floor():
    peak, floor, steps = 1e-2, 0.1, 150
    lrs = [lr_at(s, steps, peak, floor) for s in range(steps + 1)]
    assert lrs[0] == pytest.approx(peak) and lrs[-1] == pytest.approx(floor * peak)
    assert all(b <= a + 1e-15 for a, b in zip(lrs, lrs[1:]))
    assert min(lrs) >= floor * peak * (1 - 1e-12)  # the convergence gate's rule: >= 0.1 x peak in the tail


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


def _frames(p, seed=0):
    solver, w_hat0, t_save = make_flow(p, seed)
    out = np.empty((len(t_save), p["n"], p["n"]))

    def rec(i, w):
        out[i] = w

    run_insitu(solver, w_hat0, t_save, rec)
    return solver, t_save, out


def test_events_off_is_the_plain_solver_and_on_plants_a_vortex_at_each_scheduled_time():
    p = dict(n=32, nu=0.02, drag=0.1, k_f=4, forcing_amplitude=1.0, t_start=0.0, dt_save=0.025, n_frames=80)
    _, _, plain = _frames(p)
    _, _, off = _frames({**p, "events": {"n": 0}})
    assert np.array_equal(plain, off)  # no events: bit-identical trajectory
    ev = {"n": 3, "sigma_t": 0.05, "radius": 0.6, "strength": 3.0, "skip": 0.2}
    solver, t, on = _frames({**p, "events": ev})
    centres = [e[0] for e in solver.events]
    assert len(centres) == 3 and all(t[0] + 0.2 * (t[-1] - t[0]) < c < t[-1] for c in centres)
    assert centres == sorted(centres)  # one per stretch of the run
    # before the first pulse the trajectory is the plain one
    before = t < centres[0] - 6 * 0.05  # the pulse's Gaussian tail is below 1.5e-8 of its peak there
    assert before.sum() >= 5 and np.allclose(on[before], plain[before], atol=1e-6)
    # each pulse changes the field fast: the frame-to-frame drift peaks within a frame or two of every centre
    def drift(x):
        return np.linalg.norm(np.diff(x, axis=0), axis=(1, 2)) / np.linalg.norm(x[:-1], axis=(1, 2))

    d, d0 = drift(on), drift(plain)
    for c in centres:  # within a frame or two of the centre, against the same frames without the events
        near = np.abs(0.5 * (t[1:] + t[:-1]) - c) <= 2 * 0.025
        assert d[near].max() > 1.5 * d0[near].max()
    # the schedule is the seed's, fixed before anything is measured; a second run restarts the clock
    solver2, _, again = _frames({**p, "events": ev})
    assert [e[0] for e in solver2.events] == centres and np.array_equal(again, on)
    out2 = np.empty_like(on)
    run_insitu(solver, *make_flow({**p, "events": ev}, 0)[1:], lambda i, w: out2.__setitem__(i, w))
    assert np.array_equal(out2, on)
    assert [e[0] for e in make_flow({**p, "events": ev}, 1)[0].events] != centres


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


def test_fit_curve_is_the_decoded_frames_error_and_branches_count_their_bytes():
    """The validation curve each fit records is the whole-grid MSE of what the decoder gets (up to
    float16 rounding); a branch at another rank shares the base and stores exactly antic_bytes."""
    n = 16
    x = np.arange(n) / n
    frames = [np.sin(2 * np.pi * (x[:, None] + 0.05 * i)) * np.cos(2 * np.pi * x[None, :]) + 0.3 for i in range(4)]
    cfg = {**CFG, "base_steps": 100, "delta_steps": 30}
    c = ContinualCodec(n, cfg, 0)
    for i, f in enumerate(frames):
        c.add(i, f)
    for fit, rec, f in zip(c.fits, c.recon, frames):
        s = float(np.float16(f.std()))
        mse = np.mean(((rec - f) / s) ** 2)
        assert fit["y"][-1] == pytest.approx(mse, rel=0.05, abs=1e-5)
        assert fit["x"][-1] == (cfg["base_steps"] if fit["kind"] == "base" else cfg["delta_steps"])
        assert min(fit["lr"]) >= cfg["lr_floor"] * max(fit["lr"]) * (1 - 1e-12)
    assert c.stored_bytes == antic_bytes(cfg, 4)
    sizes = []
    for r in (1, 2, 3):
        b = c.branch(r)
        assert b.recon[0] is c.recon[0] and b.kept_idx == [0]
        for i in range(1, 4):
            b.add(i, frames[i])
        assert b.stored_bytes == antic_bytes(cfg, 4, r)
        sizes.append(b.stored_bytes)
    assert sizes[0] < sizes[1] < sizes[2]


def test_least_converged_fit_is_the_one_the_gate_would_fail():
    from reprozoo.claims import plateau
    from reprozoo.methods.antic.method import least_converged

    xs = list(range(0, 101, 5))
    flat = {"x": xs, "y": [1.0 + 0.5 * np.exp(-s / 5) for s in xs], "lr": [1.0] * len(xs), "frame": 3}
    falling = {"x": xs, "y": [(s + 1.0) ** -0.5 for s in xs], "lr": [1.0] * len(xs), "frame": 7}
    assert plateau(flat["x"], flat["y"]) and not plateau(falling["x"], falling["y"])
    worst, tails = least_converged([flat, falling, flat])
    assert worst is falling and tails[1] == max(tails)


def test_per_frame_errors_at_bytes_interpolate_log_log_and_fall_back_outside():
    from reprozoo.methods.antic.zfp_codec import frame_errors, frame_errors_at, loglog_at

    nbytes = np.array([200.0, 800.0, 3000.0, 9000.0])
    amp = np.array([1.0, 3.0, 0.2])  # three frames, each a power law in the bytes
    per_frame = [amp * b**-0.8 for b in nbytes]
    for q in (250.0, 1000.0, 8000.0):
        fe, case = frame_errors_at(q, nbytes[::-1], per_frame[::-1])
        assert case == "inside"
        np.testing.assert_allclose(fe, amp * q**-0.8, rtol=1e-12)
        assert fe[0] == pytest.approx(loglog_at(q, nbytes, [p[0] for p in per_frame]), rel=1e-12)
    fe, case = frame_errors_at(1e5, nbytes, per_frame)
    assert case == "above" and np.allclose(fe, per_frame[-1])
    fe, case = frame_errors_at(10.0, nbytes, per_frame)
    assert case == "below" and np.all(fe == 1.0)
    rng = np.random.default_rng(0)
    t, r = rng.normal(size=(2, 5, 4, 4))
    np.testing.assert_allclose(frame_errors(t + 0.1 * r, t),
                               [np.linalg.norm(0.1 * r[i]) / np.linalg.norm(t[i]) for i in range(5)])


def test_drift_contrast_sees_a_planted_burst_and_not_a_steady_drift():
    from reprozoo.methods.antic.method import drift_contrast

    g = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    t = np.arange(100)
    steady = np.array([np.sin(g[:, None] + 0.05 * i) * np.cos(g[None, :]) for i in t])
    phase = np.cumsum(np.where(t < 20, 0.3, 0.02))
    burst = np.array([np.sin(g[:, None] + p) * np.cos(g[None, :]) for p in phase])
    assert drift_contrast(steady) == pytest.approx(1.0, rel=1e-6)
    assert drift_contrast(burst) > 10


def test_zfp_targets_are_antics_rate_sweep_and_the_scratch_bytes():
    from reprozoo.methods.antic.method import zfp_targets

    p = {"codec": CFG, "rd_ranks": [1, 2, 4, 8]}
    t = zfp_targets(p, 12)
    assert [t[f"rd{j}"] for j in range(4)] == [antic_bytes(CFG, 12, r) for r in (1, 2, 4, 8)]
    assert t["rd1"] == antic_bytes(CFG, 12)  # the config's own rank (2) is one of the sweep's points
    assert t["scratch"] == scratch_config(CFG, 12)[1] <= t["rd1"]


def test_full_batch_constant_rate_fit_is_deterministic_gradient_descent_on_the_whole_grid():
    """batch >= grid points: every step sees the whole grid (no sampling noise: two codecs with
    different generators give the same network) and lr_floor 1 keeps the recorded rate constant."""
    n = 16
    x = np.arange(n) / n
    f0 = np.sin(2 * np.pi * x)[:, None] * np.cos(2 * np.pi * x)[None, :]
    cfg = {**CFG, "batch": n * n, "lr_floor": 1.0, "base_steps": 40}
    a, b = ContinualCodec(n, cfg, 0), ContinualCodec(n, cfg, 0)
    b.gen.manual_seed(123)  # a different minibatch stream: must not matter at full batch
    a.add(0, f0), b.add(0, f0)
    np.testing.assert_array_equal(a.recon[0], b.recon[0])
    assert set(a.fits[0]["lr"]) == {cfg["lr"]}
    assert a.fits[0]["y"][-1] < 0.5 * a.fits[0]["y"][0]


def test_stale_base_is_the_base_network_on_every_frame_with_its_own_normalisation():
    n = 16
    x = np.arange(n) / n
    f0 = np.sin(2 * np.pi * x)[:, None] * np.cos(2 * np.pi * x)[None, :]
    f1 = 3.0 * f0 + 2.0 + 0.5 * np.sin(4 * np.pi * x)[:, None]
    c = ContinualCodec(n, {**CFG, "base_steps": 100, "delta_steps": 60}, 0)
    c.add(0, f0), c.add(1, f1)
    st = c.stale_recon()
    np.testing.assert_allclose(st[0], c.recon[0], rtol=0, atol=1e-12)  # the base frame is its own stale frame
    (m0, s0), (m1, s1) = c.norms
    np.testing.assert_allclose((st[1] - m1) / s1, (st[0] - m0) / s0, atol=1e-9)  # same network, rescaled
    err = lambda r: np.linalg.norm(r - f1) / np.linalg.norm(f1)
    assert err(c.recon[1]) < err(st[1])  # the residual adds what the stale base cannot


def test_random_control_selection_keeps_k_frames_with_both_ends_and_is_seeded():
    from reprozoo.methods.antic.method import random_kept

    k = random_kept(200, 37, 1)
    assert len(k) == 37 and k[0] == 0 and k[-1] == 199 and k == sorted(set(k))
    assert k == random_kept(200, 37, 1) and k != random_kept(200, 37, 2)


def test_ratio_at_target_error_reads_the_rate_sweep_log_log_and_is_conservative_outside():
    from reprozoo.methods.antic.method import ratio_at_error

    errs = np.array([0.08, 0.04, 0.02, 0.01])  # ranks 1, 2, 4, 8: more bytes, less error
    ratios = 3.0 * errs**-1.5
    r, case = ratio_at_error(0.05, errs, ratios)
    assert case == "inside" and r == pytest.approx(3.0 * 0.05**-1.5, rel=1e-12)
    assert ratio_at_error(0.05, errs / 10, ratios) == (pytest.approx(ratios.max()), "below")
    assert ratio_at_error(0.05, errs * 10, ratios) == (0.0, "above")


def test_pearson_reference_selector_keeps_on_decorrelation_and_every_window_frames():
    from reprozoo.methods.antic.selection import PearsonSelector

    rng = np.random.default_rng(0)
    base = rng.normal(size=(8, 8))
    steady = PearsonSelector(23, 0.9, 5)
    assert [i for i in range(23) if steady.keep(i, base * (1 + 0.01 * i))] == [0, 5, 10, 15, 20, 22]
    jumpy = PearsonSelector(10, 0.9, 5)
    frames = [base] * 3 + [rng.normal(size=(8, 8))] * 7  # decorrelated at frame 3
    assert [i for i in range(10) if jumpy.keep(i, frames[i])] == [0, 3, 8, 9]
