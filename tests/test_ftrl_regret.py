"""ftrl_regret numerics: discounted VAW in closed form, Newton-FTRL recovery, mixture bound,
exact path lengths, the clip-free Adam bound, slope fits."""
import numpy as np
import pytest

from reprozoo.methods.ftrl_regret import learners as L
from reprozoo.methods.ftrl_regret.adam_toy import adam_bound, run_adam_grid, subgradient
from reprozoo.methods.ftrl_regret.method import dynamic_regret, loglog_slope
from reprozoo.methods.ftrl_regret.streams import make_stream, path_length, switching_path

LIN = {"radius": 1.0, "jump": 1.0, "noise": 0.5}
LOGIT = {"radius": 2.0, "jump": 1.0}


@pytest.mark.parametrize("beta", [1.0, 0.9])
def test_discounted_vaw_matches_weighted_ridge(beta):
    """w_t = argmin sum_{s<t} beta^{t-s} (y_s - <w,x_s>)^2 + lam||w||^2 + beta^0 <w,x_t>^2 (VAW)."""
    rng = np.random.default_rng(0)
    s = make_stream("linear", 40, 3, 2.0, LIN, rng)
    lam = 0.7
    pred = L.run_discounted_ftrl("linear", s, [beta], lam, bound=1e9)[:, 0]
    x, y = s["x"], s["y"]
    for t in (0, 5, 39):
        wts = beta ** (t - np.arange(t + 1))
        A = lam * np.eye(3) + (x[: t + 1] * wts[:, None]).T @ x[: t + 1]
        b = (x[:t] * (wts[:t] * y[:t])[:, None]).sum(0)
        assert pred[t] == pytest.approx(x[t] @ np.linalg.solve(A, b), rel=1e-10, abs=1e-12)


def test_logistic_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    w, x, y, h = rng.normal(size=4), rng.normal(size=4), -1.0, 1e-6
    f = lambda w: np.logaddexp(0.0, -y * w @ x)  # noqa: E731
    g = -y * L.sigmoid(-y * w @ x) * x  # the gradient run_discounted_ftrl uses
    fd = [(f(w + h * e) - f(w - h * e)) / (2 * h) for e in np.eye(4)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    p = L.sigmoid(w @ x)
    assert L.loss("logistic", p, y) == pytest.approx(f(w))


def test_newton_ftrl_recovers_a_planted_logistic_model():
    """Static comparator (P_T = 0): undiscounted Newton-FTRL learns sigmoid(<u, x>)."""
    rng = np.random.default_rng(2)
    s = make_stream("logistic", 3000, 3, 0.0, LOGIT, rng)
    p = L.run_discounted_ftrl("logistic", s, [1.0], 1.0, bound=2.0)[:, 0]
    truth = L.sigmoid(np.einsum("td,td->t", s["x"], s["u"]))
    assert np.mean(np.abs(p[-500:] - truth[-500:])) < 0.03
    assert dynamic_regret("logistic", p, s)[-1] < 40  # static regret O(d log T), not linear


def test_switching_path_has_exact_length_and_norm():
    us = switching_path(1000, 4, 7.0, 2.0, 1.0, np.random.default_rng(3))
    assert path_length(us) == pytest.approx(7.0, rel=1e-12)
    np.testing.assert_allclose(np.linalg.norm(us, axis=1), 2.0)
    assert len(np.unique(us, axis=0)) == 8


def test_fixed_share_without_share_obeys_the_mixture_bound():
    """Log loss is 1-mixable: Bayes mixture total loss <= best expert's + log K, exactly."""
    rng = np.random.default_rng(4)
    T, K = 500, 6
    y = np.where(rng.random(T) < 0.7, 1.0, -1.0)
    preds = rng.uniform(0.05, 0.95, size=(T, K))
    preds[:, 2] = 0.7
    mix = L.fixed_share("logistic", preds, y, lr=1.0, share=0.0)
    total = L.loss("logistic", mix, y).sum()
    best = L.loss("logistic", preds, y[:, None]).sum(0).min()
    assert total <= best + np.log(K) + 1e-9


def test_discounting_tracks_a_switch_that_ftrl_does_not():
    rng = np.random.default_rng(5)
    s = make_stream("linear", 2000, 3, 1.0, LIN, rng)
    beta = L.tuned_discount(2000, 3, 1.0)
    p = L.run_discounted_ftrl("linear", s, [beta, 1.0], 1.0, bound=1.0)
    r_disc, r_ftrl = (dynamic_regret("linear", p[:, k], s)[-1] for k in range(2))
    assert r_disc < 0.5 * r_ftrl


def test_tuned_steps_and_grids():
    assert 1 - L.tuned_discount(5000, 5, 4.0) == pytest.approx(np.sqrt(4 / 25000))
    g = L.discount_grid(1000)
    assert 1 - g[0] == 0.5 and 1 - g[-1] <= 1 / 1000
    eta = L.ogd_step_grid(1000, 2.0, 3.0)
    assert eta[0] == pytest.approx(L.tuned_ogd_step(1000, 0.0, 2.0, 3.0))
    assert eta[-1] >= L.tuned_ogd_step(1000, 2000.0, 2.0, 3.0)


def test_clip_free_adam_ratio_bound():
    """|m_t| / sqrt(v_t) <= (1-b1)/sqrt((1-b2)(1-b1^2/b2)) for any gradients when b1^2 < b2."""
    rng = np.random.default_rng(6)
    for b1, b2 in [(0.9, 0.999), (0.5, 0.9), (0.0, 0.99)]:
        m = v = 0.0
        worst = 0.0
        for g in rng.standard_cauchy(3000):  # heavy tails: the worst case of the ratio
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g**2
            worst = max(worst, abs(m) / np.sqrt(v))
        assert worst <= adam_bound(b1, b2) * (1 + 1e-12)
    assert adam_bound(0.99, 0.9) == np.inf


def test_adam_converges_without_noise_or_drift():
    cfg = {"T": 400, "d": 3, "lr": 0.05, "noise": 0.0, "amplitude": 1.0}
    err = run_adam_grid([0.9], [0.999], True, 0.0, cfg, np.random.default_rng(7))
    assert err[0, 0] < 0.03  # from F(0) ~ 0.4 to the step-size floor
    assert subgradient(np.array([1.0]), np.array([0.0]))[0] == pytest.approx(0.5)


def test_loglog_slope_recovers_a_power_law():
    xs = np.array([10, 20, 40, 80.0])
    assert loglog_slope(xs, 3 * xs**0.5) == pytest.approx(0.5)
    assert np.isnan(loglog_slope(xs, [1, -1, 2, 3]))


def test_static_sweep_is_prefixes_of_one_static_stream():
    """The P_T = 0 sweep: every horizon reads the first T rounds of the static streams, and adding
    it leaves the drifting streams as they were (drawn after them); replicates stack on axis 0 and
    a task's own P_sweep / T_fix override the global ones."""
    from reprozoo.methods.ftrl_regret.method import _static_prefixes, _streams

    p = {"d": 3, "T_sweep": [50, 100], "P_fix": 2, "T_fix": 80, "P_sweep": [1, 2], "replicates": 3,
         "linear": LIN, "logistic": {**LOGIT, "P_sweep": [2, 4], "T_fix": 120}}
    before = list(_streams(p, np.random.default_rng(0)))
    after = list(_streams({**p, "static_tasks": ["linear"]}, np.random.default_rng(0)))
    assert len(after) == len(before) + 1
    for (t0, s0, v0, a), (t1, s1, v1, b) in zip(before, after):
        assert (t0, s0, v0) == (t1, s1, v1)
        np.testing.assert_array_equal(a["y"], b["y"])
    logit_P = [(v, s["x"].shape) for t, sw, v, s in before if t == "logistic" and sw == "P"]
    assert logit_P == [(2, (3, 120, 3)), (4, (3, 120, 3))]
    lin_P = [s for t, sw, v, s in before if t == "linear" and sw == "P"]
    assert [path_length(u) for u in lin_P[1]["u"]] == pytest.approx([2.0] * 3)
    assert not np.allclose(lin_P[1]["x"][0], lin_P[1]["x"][1])  # independent replicates
    task, sweep, T, full = after[-1]
    assert (task, sweep, T) == ("linear", "T0", 100)
    assert full["x"].shape == (3, 100, 3)
    assert all(path_length(u) == 0.0 for u in full["u"])
    got = list(_static_prefixes(p, full))
    assert [g[0] for g in got] == [50, 100]
    np.testing.assert_array_equal(got[0][1]["x"], full["x"][:, :50])


def test_batched_learners_match_one_stream_runs():
    """Batching N streams (each with its own discounts / steps) changes nothing per stream."""
    rng = np.random.default_rng(3)
    ss = [make_stream("logistic", 60, 3, 2.0, LOGIT, rng) for _ in range(2)]
    x = np.stack([s["x"] for s in ss]); y = np.stack([s["y"] for s in ss])
    for task in ("linear", "logistic"):
        betas = np.array([[0.9, 1.0], [0.8, 0.95]])
        got = L.run_discounted_ftrl_batch(task, x, y, betas, 1.0, 2.0)
        etas = np.array([[0.1, 0.3], [0.2, 0.05]])
        got_ogd = L.run_ogd_batch(task, x, y, etas, 2.0, 2.0)
        for n, s in enumerate(ss):
            np.testing.assert_allclose(got[n], L.run_discounted_ftrl(task, s, betas[n], 1.0, 2.0), rtol=1e-12)
            np.testing.assert_allclose(got_ogd[n], L.run_ogd(task, s, etas[n], 2.0, 2.0), rtol=1e-12)
        mix = L.fixed_share_batch(task, got, y if task == "logistic" else y, lr=0.5, share=0.01)
        np.testing.assert_allclose(mix[1], L.fixed_share(task, got[1], y[1], lr=0.5, share=0.01), rtol=1e-12)


def test_static_regret_vaw_logarithmic_ogd_sqrt():
    """P_T = 0: VAW's regret against the planted static u grows like d log T (the tuned discount
    is 1 - 1/T); OGD with Zinkevich's step ~ 1/sqrt(T) grows like sqrt(T). Regret from T = 500
    to 4000 (8x), summed over 3 seeds: log T gives a factor ln(800)/ln(100) ~ 1.45, sqrt T 2.83."""
    cfg = {"ridge": 1.0, "linear": {**LIN, "bound": 1.0, "kappa": 1.0, "grad_bound": 3.0, "meta_lr": 0.1}}
    from reprozoo.methods.ftrl_regret.method import predictions

    tot = {v: np.zeros(2) for v in ("dftrl_tuned", "ogd_tuned")}
    for seed in range(3):
        s = make_stream("linear", 4000, 5, 0.0, cfg["linear"], np.random.default_rng(10 + seed))
        for i, T in enumerate((500, 4000)):
            pre = {k: a[:T] for k, a in s.items()}
            for v in tot:
                tot[v][i] += dynamic_regret("linear", predictions(v, "linear", pre, cfg)[0], pre)[-1]
    growth = {v: r[1] / r[0] for v, r in tot.items()}
    assert growth["dftrl_tuned"] < 8 ** 0.25, growth
    assert growth["ogd_tuned"] > 8 ** 0.4, growth


def test_fixed_discount_costs_more_as_the_path_grows():
    """The reduction's tracking cost: at one fixed discount, the dynamic regret on switching streams
    rises with the number of switches (each switch costs ~ 1/(1-beta) rounds of re-locking).
    Same horizon and noise, 4 streams per path length."""
    d, T, beta = 3, 1200, 1 - 1 / 40
    regs = []
    for P in (1.0, 4.0, 16.0):
        rng = np.random.default_rng(7)
        tot = 0.0
        for _ in range(4):
            s = make_stream("linear", T, d, P, LIN, rng)
            tot += dynamic_regret("linear", L.run_discounted_ftrl("linear", s, [beta], 1.0, 1.0)[:, 0], s)[-1]
        regs.append(tot)
    assert regs[0] < regs[1] < regs[2], regs
    assert regs[2] > 2 * regs[0], regs


def test_ensemble_tracks_a_switch():
    """The fixed-share ensemble over discounts (P_T unknown) re-locks after a switch: over the last
    quarter of a stream with one switch at the middle its per-round regret is far below undiscounted
    FTRL's (which keeps averaging the old comparator) and close to the best single discount's."""
    rng = np.random.default_rng(11)
    d, T = 3, 2000
    s = make_stream("linear", T, d, 1.0, LIN, rng)
    grid = L.discount_grid(T)
    experts = L.run_discounted_ftrl("linear", s, grid, 1.0, 1.0)
    mix = L.fixed_share("linear", experts, s["y"], lr=0.1, share=1.0 / T)
    ftrl = L.run_discounted_ftrl("linear", s, [1.0], 1.0, 1.0)[:, 0]
    tail = slice(3 * T // 4, T)
    r = lambda pred: (L.loss("linear", pred, s["y"]) - L.comparator_losses("linear", s))[tail].sum()
    best = min(r(experts[:, k]) for k in range(len(grid)))
    assert r(mix) < 0.5 * r(ftrl), (r(mix), r(ftrl))
    assert r(mix) < best + 0.05 * (T // 4), (r(mix), best)


def test_tuned_logistic_discount_scales_with_kappa():
    """1 - beta = sqrt(kappa P_T / (d T)): the curvature factor enters under the square root (a 4x
    smaller kappa halves the discount, i.e. doubles the window), and predictions_batch uses it."""
    from reprozoo.methods.ftrl_regret.method import predictions_batch

    T, d, P = 8000, 5, 16.0
    a, b = 1 - L.tuned_discount(T, d, 0.4 * P), 1 - L.tuned_discount(T, d, 0.1 * P)
    assert a / b == pytest.approx(2.0)
    s = make_stream("logistic", 400, d, 2.0, LOGIT, np.random.default_rng(0))
    cfg = {"ridge": 1.0, "logistic": {**LOGIT, "bound": 2.0, "kappa": 0.105, "grad_bound": 1.0, "meta_lr": 1.0}}
    _, chosen = predictions_batch("dftrl_tuned", "logistic", {k: s[k][None] for k in ("x", "y", "u")}, cfg)
    assert chosen["one_minus_beta"] == pytest.approx(np.sqrt(0.105 * 2.0 / (d * 400)))


def test_unit_jumps_make_norm_and_squared_norm_paths_equal():
    """With jump = 1 every switch moves u by exactly 1, so sum ||u_t - u_{t-1}|| and
    sum ||u_t - u_{t-1}||^2 coincide (both = number of switches); with jump = 2 they differ by 2x."""
    for jump, ratio in ((1.0, 1.0), (2.0, 2.0)):
        us = switching_path(500, 4, 6 * jump, 2.0, jump, np.random.default_rng(1))
        steps = np.linalg.norm(np.diff(us, axis=0), axis=1)
        assert (steps**2).sum() == pytest.approx(ratio * steps.sum())
        assert steps.sum() == pytest.approx(6 * jump)


def test_fixed_discounts_are_tuned_once_at_every_sweep_point():
    """dftrl_fixed: 2n + 3 columns on an n-point sweep (extended one sweep step beyond each end),
    column 2k + 2 the theory's discount tuned at the sweep's k-th point, odd columns at the geometric
    midpoints, each kept over the whole sweep; at its own point column 2k + 2 is exactly
    dftrl_tuned, at a 4x longer horizon it keeps the short window (never retuned)."""
    from reprozoo.methods.ftrl_regret.method import fixed_tuning_points, predictions_batch

    p = {"d": 3, "ridge": 1.0, "T_sweep": [200, 800, 3200], "P_fix": 2, "T_fix": 400, "P_sweep": [1, 4, 16],
         "linear": {**LIN, "bound": 1.0, "kappa": 1.0, "grad_bound": 3.0, "meta_lr": 0.1},
         "logistic": {**LOGIT, "bound": 2.0, "kappa": 0.105, "grad_bound": 1.0, "meta_lr": 1.0,
                      "P_sweep": [2, 8, 32], "T_fix": 600}}
    pts = lambda task, sw: np.array(fixed_tuning_points(p, task, sw))  # noqa: E731
    Ts = [50, 100, 200, 400, 800, 1600, 3200, 6400, 12800]
    np.testing.assert_allclose(pts("linear", "T"), [(T, 2.0) for T in Ts])
    np.testing.assert_allclose(pts("linear", "P"), [(400, x) for x in (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)])
    np.testing.assert_allclose(pts("logistic", "P"), [(600, x) for x in (0.5, 1, 2, 4, 8, 16, 32, 64, 128)])
    rng = np.random.default_rng(4)
    for T, P in ((200, 2.0), (800, 2.0)):
        s = make_stream("linear", T, 3, P, LIN, rng)
        st = {kk: s[kk][None] for kk in ("x", "y", "u")}
        fixed, cf = predictions_batch("dftrl_fixed", "linear", st, p, sweep="T")
        tuned, ct = predictions_batch("dftrl_tuned", "linear", st, p)
        assert fixed.shape == (1, T, 9)
        np.testing.assert_allclose(cf["one_minus_beta"], np.sqrt(2.0 / (3 * np.array(Ts))))
        own = 2 if T == 200 else 4
        np.testing.assert_allclose(fixed[..., own], tuned, rtol=1e-12)
        if T == 800:  # the column tuned at T = 200 keeps its window: twice the tuned 1 - beta
            assert cf["one_minus_beta"][2] == pytest.approx(2 * ct["one_minus_beta"])
    with pytest.raises(ValueError):
        predictions_batch("dftrl_fixed", "linear", st, p)


def test_best_fixed_reads_the_hindsight_best_and_the_best_kept_column():
    """The level claims divide by the best fixed discount at each sweep point (``oracle``); their
    control is the single column whose worst-case ratio to it is smallest (``level``). Columns of the
    reduction's bound A/W + B W with W fixed at a factor-2 grid: the oracle is the column tuned at
    each point, and the middle column's worst case is (r + 1/r)/2 = 2.125 at r = 4."""
    from reprozoo.methods.ftrl_regret.method import best_fixed

    xs = np.array([1.0, 4.0, 16.0, 64.0, 256.0])        # P_T: the optimal window W* ~ x^(-1/2)
    W = 1.0 / np.sqrt(xs)                               # column k: the window tuned at xs[k]
    bound = lambda x, w: 1.0 / w + x * w                # forgetting ~ 1/W, tracking ~ P_T W  # noqa: E731
    ys = np.array([[bound(x, w) for w in W] for x in xs])
    b = best_fixed(xs, ys)
    np.testing.assert_allclose(b["oracle"], np.diag(ys))
    assert b["k"] == 2 and b["level"] == pytest.approx(2.125)
    assert b["levels"][0] == pytest.approx((16 + 1 / 16) / 2)
    # the retuned discount (the diagonal) is the oracle itself: ratio 1, far inside c = 1.5
    assert np.max(np.diag(ys) / b["oracle"]) == pytest.approx(1.0)


def test_vertex_min_is_the_continuum_minimum_of_a_log_parabola():
    """The level claims' hindsight best over the window continuum: exact for a log-parabola on the
    grid, never above the best column, the end value at an edge."""
    from reprozoo.methods.ftrl_regret.method import vertex_min

    k = np.arange(9, dtype=float)
    for k0, y0 in ((3.3, 2.0), (5.0, 7.0), (6.6, 0.5)):
        ys = y0 * np.exp(0.3 * (k - k0) ** 2)
        assert vertex_min(ys) == pytest.approx(y0)
        assert vertex_min(ys) <= ys.min()
    assert vertex_min(np.exp(k)) == pytest.approx(1.0)
    assert vertex_min([2.0, 2.0, 2.0]) == pytest.approx(2.0)


def test_batches_concatenate_a_p_sweep_in_order():
    """_batches learns a P sweep's points (one horizon) in one batch, replicates per point in sweep
    order, the same streams as _streams; per_point averages them back."""
    from reprozoo.methods.ftrl_regret.method import _batches, _streams, per_point

    p = {"d": 3, "T_sweep": [50, 100], "P_fix": 2, "T_fix": 80, "P_sweep": [1, 2], "replicates": 3,
         "static_tasks": ["linear"], "linear": LIN, "logistic": {**LOGIT, "P_sweep": [2, 4], "T_fix": 120}}
    one = list(_streams(p, np.random.default_rng(0)))
    bat = list(_batches(p, np.random.default_rng(0)))
    assert [(t, s, v) for t, s, v, _ in bat] == [
        ("linear", "T", [50]), ("linear", "T", [100]), ("linear", "P", [1, 2]),
        ("logistic", "T", [50]), ("logistic", "T", [100]), ("logistic", "P", [2, 4]), ("linear", "T0", [100])]
    lin_P = bat[2][3]
    assert lin_P["x"].shape == (6, 80, 3)
    np.testing.assert_array_equal(lin_P["y"][3:], [s for t, sw, v, s in one if (t, sw, v) == ("linear", "P", 2)][0]["y"])
    assert [path_length(u) for u in lin_P["u"]] == pytest.approx([1.0] * 3 + [2.0] * 3)
    np.testing.assert_allclose(per_point(np.arange(6.0), 2), [1.0, 4.0])
    np.testing.assert_allclose(per_point(np.arange(12.0).reshape(2, 6), 2), [[1.0, 4.0], [7.0, 10.0]])


def test_retuned_discount_beats_a_discount_fixed_far_from_its_point():
    """What the level claims need from the miniature: on a 256x P_T sweep (1 vs 256 switches at one
    horizon), the discount tuned for P_T = 1 kept at P_T = 256 pays far more than the retuned one
    (its window is 16x too long), and vice versa; one stream per point, 3 seeds summed."""
    T, d = 4000, 3
    tot = np.zeros((2, 2))                           # rows: P_T = 1, 256; columns: W tuned at 1, 256
    for seed in range(3):
        rng = np.random.default_rng(20 + seed)
        for i, P in enumerate((1.0, 256.0)):
            s = make_stream("linear", T, d, P, LIN, rng)
            betas = [L.tuned_discount(T, d, 1.0), L.tuned_discount(T, d, 256.0)]
            pr = L.run_discounted_ftrl("linear", s, betas, 1.0, 1.0)
            tot[i] += [dynamic_regret("linear", pr[:, k], s)[-1] for k in range(2)]
    assert tot[0, 0] < tot[0, 1] and tot[1, 1] < tot[1, 0], tot
    assert tot[1, 0] > 1.5 * tot[1, 1] and tot[0, 1] > 1.5 * tot[0, 0], tot


def test_half_slopes_separate_a_fixed_discount_from_a_power_law():
    """The rate claims read the slopes over both halves of a sweep. A power law x^(1/2) has 1/2 on
    both; the regret of a discount fixed once, a x + b with b/a at the middle of a 16x range, has a
    full-range slope of ~ 1/2 (what the band alone cannot tell apart) but halves on either side of
    1/2 by more than the 0.15 band."""
    from reprozoo.methods.ftrl_regret.method import half_slopes

    xs = [1000, 2000, 4000, 8000, 16000]
    lo, hi = half_slopes(xs, [3 * x**0.5 for x in xs])
    assert lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    ys = [x + 4000.0 for x in xs]
    assert abs(loglog_slope(xs, ys) - 0.5) < 0.05
    lo, hi = half_slopes(xs, ys)
    assert lo < 0.35 and hi > 0.65, (lo, hi)


def test_subgrid_argmin_finds_the_vertex():
    """The Adam claim's optimum below the grid step: the vertex of the parabola in log error through
    the discrete argmin and its neighbours; exact for a log-parabola, the end point at an edge."""
    from reprozoo.methods.ftrl_regret.method import subgrid_argmin

    k = np.arange(11, dtype=float)
    for k0 in (3.3, 5.0, 7.6):
        assert subgrid_argmin(np.exp(0.2 * (k - k0) ** 2)) == pytest.approx(k0)
    assert subgrid_argmin(np.exp(k)) == 0.0
    assert subgrid_argmin(np.exp(-k)) == 10.0


def test_antipodal_switch_flips_the_comparator_with_path_exactly_the_diameter():
    """jump = 2 radius: one switch at T/2 maps u to -u (a 180-degree turn), P_T = 4 on the radius-2
    sphere, squared-norm path 16 = 4x the norm path."""
    us = switching_path(1000, 5, 4.0, 2.0, 4.0, np.random.default_rng(3))
    steps = np.linalg.norm(np.diff(us, axis=0), axis=1)
    assert np.count_nonzero(steps > 1e-12) == 1 and np.argmax(steps) + 1 == 500
    np.testing.assert_allclose(us[500], -us[0], atol=1e-12)
    assert steps.sum() == pytest.approx(4.0) and (steps**2).sum() == pytest.approx(16.0)
    np.testing.assert_allclose(np.linalg.norm(us, axis=1), 2.0)


def test_smoke_logistic_sweeps_use_one_antipodal_switch_on_T_and_switches_of_2_on_P():
    """The smoke design of this round: the logistic T sweep's P_T = 4 is one antipodal flip at T/2
    (the control of the logistic T claims held with 2 switches of 2, README), the logistic P sweep
    keeps switches of 2 (P_jump), the linear sweeps switches of 1."""
    from pathlib import Path

    import yaml

    from reprozoo.methods.ftrl_regret.method import _streams

    cfg = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/ftrl_regret/configs/smoke.yaml").read_text())
    p = {**cfg, "replicates": 1, "T_sweep": [250, 1000], "T_fix": 600, "static_tasks": [],
         "logistic": {**cfg["logistic"], "P_sweep": [2, 8]}}
    for task, sweep, val, st in _streams(p, np.random.default_rng(0)):
        u = st["u"][0]
        steps = np.linalg.norm(np.diff(u, axis=0), axis=1)
        moves = steps[steps > 1e-12]
        P = p["P_fix"] if sweep == "T" else val
        assert moves.sum() == pytest.approx(P)
        if task == "logistic" and sweep == "T":
            assert len(moves) == 1 and np.argmax(steps) + 1 == val // 2
            np.testing.assert_allclose(u[-1], -u[0], atol=1e-12)
        else:
            jump = 1.0 if task == "linear" else 2.0
            np.testing.assert_allclose(moves, jump)
