"""iterated_erm numerics: solvers at their optimum, exact population error, the fixed point against
closed forms and against Monte-Carlo at finite d (budget split and in-sample selection)."""
import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from reprozoo.methods.iterated_erm import protocols as P
from reprozoo.methods.iterated_erm import theory as T
from reprozoo.methods.iterated_erm.data import sample
from reprozoo.methods.iterated_erm.erm import logistic, ridge, population_error
from reprozoo.methods.iterated_erm.method import _cand_counts, dd_peak, interior_peak, u_ratio, variance_slope

R, LAM = 1.5, 0.1


def test_ridge_primal_dual_and_stationarity():
    rng = np.random.default_rng(0)
    for n in (30, 120):  # dual (n < d) and primal branch
        X, y = sample(n, 60, R, rng)
        w = ridge(X, y, LAM)
        Xs = X / np.sqrt(60)
        grad = -Xs.T @ (y - Xs @ w) + LAM * w
        assert np.max(np.abs(grad)) < 1e-10


def test_logistic_is_stationary_and_matches_finite_differences():
    rng = np.random.default_rng(1)
    X, y = sample(80, 40, R, rng)
    w = logistic(X, y, LAM)
    Xs = X / np.sqrt(40)

    def obj(v):
        return np.sum(np.logaddexp(0.0, -y * (Xs @ v))) + LAM / 2 * v @ v

    h = 1e-6
    fd = np.array([(obj(w + h * e) - obj(w - h * e)) / (2 * h) for e in np.eye(40)])
    assert np.max(np.abs(fd)) < 1e-5
    assert obj(w) <= obj(w + 1e-3 * rng.standard_normal(40))


def test_population_error_matches_a_large_test_set():
    rng = np.random.default_rng(2)
    d = 50
    w = rng.standard_normal(d) + np.eye(d)[0] * 3
    Xt, yt = sample(400_000, d, R, rng)
    emp = np.mean(yt * (Xt @ w) < 0)
    assert abs(emp - population_error(w, R)) < 3e-3


def test_truncated_moments_by_quadrature():
    for a, b in ((-0.7, 1.3), (-np.inf, 0.4), (0.2, np.inf)):
        got = T._trunc_moments(a, b)
        for k in range(3):
            ref = integrate.quad(lambda g: g**k * norm.pdf(g), a, b)[0]
            assert abs(got[k] - ref) < 1e-9


def test_threshold_keeps_the_requested_fraction():
    types = T.active_learning_types(0.3, 4.0, "margin")
    m1, q1, V1 = T.stage1(types, R**2, LAM)
    t = T.selection_threshold(types, 0.7, m1, q1, V1)
    kept = types[1].alpha * T._keep_prob(types[1], t, 0, m1, q1, V1)
    assert kept == pytest.approx(0.7, abs=1e-10)


def test_random_selection_reduces_to_passive_ridge():
    """Random stage-2 labels + the n1 reused = B iid labels: the two-stage fixed point must give the
    single-stage ridge error at alpha = B / d, whatever the split."""
    passive = T.stage1([T.SampleType(1.0, True, "all")], R**2, LAM)
    e_passive = norm.cdf(-passive[0] / np.sqrt(passive[1]))
    for rho in (0.2, 0.6):
        o = T.solve(T.active_learning_types(rho, 4.0, "random"), R**2, LAM, LAM, 1.0 - rho)
        assert o.err2 == pytest.approx(e_passive, rel=1e-8)
        assert abs(o.V21) < 1e-10


def test_same_data_same_loss_reproduces_stage_one():
    """Stage 2 = stage 1 (all samples kept, same lam): w2 = w1, so m2 = m1 and q2 = q12 = q1."""
    o = T.solve(T.reweighting_types(1.5, "all"), R**2, LAM, LAM, 1.5)
    assert (o.m2, o.q2, o.q12) == pytest.approx((o.m1, o.q1, o.q1), rel=1e-8)
    naive = T.solve(T.reweighting_types(1.5, "all"), R**2, LAM, LAM, 1.5, reuse=False)
    assert naive.q12 < 0.99 * naive.q1  # a fresh copy would not be w1 itself


def _mc(fn, reps, seed):
    rng = np.random.default_rng(seed)
    return np.array([fn(rng) for _ in range(reps)])


def test_theory_matches_simulation_active_learning():
    d, rho, pool = 300, 0.3, 4.0
    B, n1 = d, int(rho * d)

    def run(rng):
        X, y = P.pool(int(pool * d), d, R, rng)
        return P.active_learning(X, y, n1, B - n1, R, "square", LAM, LAM, "margin", rng)[1]

    sim = _mc(run, 24, 3)
    types = T.active_learning_types(rho, pool, "margin")
    th = T.solve(types, R**2, LAM, LAM, 1.0 - rho).err2
    naive = T.solve(types, R**2, LAM, LAM, 1.0 - rho, reuse=False).err2
    se = sim.std(ddof=1) / np.sqrt(len(sim))
    assert abs(sim.mean() - th) < 4 * se + 0.004, (sim.mean(), th)
    assert abs(sim.mean() - naive) > 4 * abs(sim.mean() - th)  # reuse correction is visible


def test_theory_matches_simulation_in_sample_selection():
    d, n, a2, lam2 = 300, 2.0, 0.7, 1e-3
    sim = _mc(lambda rng: P.reweighting(*P.pool(int(n * d), d, R, rng), [int(a2 * d)], R, "square",
                                        LAM, lam2, "margin", rng)[0], 16, 4)
    th = T.solve(T.reweighting_types(n, "margin"), R**2, LAM, lam2, a2).err2
    naive = T.solve(T.reweighting_types(n, "margin"), R**2, LAM, lam2, a2, reuse=False).err2
    se = sim.std(ddof=1) / np.sqrt(len(sim))
    assert abs(sim.mean() - th) < 4 * se + 0.004, (sim.mean(), th)
    assert abs(sim.mean() - naive) > 0.05


def test_helpers_on_planted_curves():
    dims = np.array([100, 200, 400])
    assert variance_slope(dims, 3.0 / dims) == pytest.approx(-1.0)
    xs = [0.3, 0.5, 0.7, 0.9, 1.0, 1.2, 2.0]
    assert dd_peak(xs, [0.4, 0.3, 0.2, 0.25, 0.35, 0.3, 0.15]) == pytest.approx((1.0, 1.75))
    assert dd_peak(xs, [0.4, 0.3, 0.2, 0.15, 0.1, 0.09, 0.08])[1] == 1.0
    assert dd_peak(xs, [0.2, 0.25, 0.3, 0.35, 0.4, 0.3, 0.15]) == pytest.approx((1.0, 2.0))
    assert u_ratio([0.1, 0.3, 0.5, 1.0], [0.3, 0.2, 0.2, 0.25], [0.2, 0.5]) == pytest.approx(1.25)


def test_sample_wise_peak_sits_at_n2_equal_d():
    """Varying n2 through d with n fixed (the sample-wise sweep) peaks at the stage-2 interpolation
    threshold n2 = d whatever the rule: ordinary sample-wise double descent, not a selection effect."""
    grid = [0.5, 0.7, 0.9, 0.95, 1.0, 1.05, 1.1, 1.3, 1.7]
    for rule in ("margin", "random"):
        errs = [T.solve(T.reweighting_types(2.0, rule), R**2, LAM, 1e-3, a2).err2 for a2 in grid]
        assert grid[int(np.argmax(errs))] == 1.0, (rule, errs)


def test_selection_strength_endpoints_in_theory():
    """kappa = 1 keeps every candidate: margin = random selection; random selection is flat in kappa;
    kappa = n / n2 is margin selection on the whole set (the reweighting protocol)."""
    n, n2, lam2 = 4.0, 0.7, 1e-3
    e_rand = [T.solve(T.candidate_types(n, k * n2, "random"), R**2, LAM, lam2, n2).err2 for k in (1.0, 2.0, n / n2)]
    assert np.ptp(e_rand) < 1e-9
    e1 = T.solve(T.candidate_types(n, n2, "margin"), R**2, LAM, lam2, n2).err2
    assert e1 == pytest.approx(e_rand[0], rel=1e-6)
    full = T.solve(T.candidate_types(n, n, "margin"), R**2, LAM, lam2, n2).err2
    assert full == pytest.approx(T.solve(T.reweighting_types(n, "margin"), R**2, LAM, lam2, n2).err2, rel=1e-12)
    mid = T.solve(T.candidate_types(n, 2 * n2, "margin"), R**2, LAM, lam2, n2).err2
    assert mid < e1 - 0.02  # moderate selection helps at fixed n2 (the curve is not flat)


def test_candidate_selection_keeps_n2_from_nested_candidates():
    rng = np.random.default_rng(5)
    fs = {"n": 4.0, "n2": 0.7, "kappa": [1.0, 2.0, 5.7143]}
    n, n2, cands = _cand_counts(fs, 50)
    assert (n, n2, cands) == (200, 35, [35, 70, 200])
    X, y = P.pool(n, 50, R, rng)
    errs = P.candidate_selection(X, y, n2, cands, R, "square", LAM, 1e-3, "margin", rng)
    assert len(errs) == 3 and all(0 < e < 0.5 for e in errs)


def test_theory_matches_simulation_at_fixed_n2():
    d, n, a2, kappa, lam2 = 300, 4.0, 0.7, 2.0, 1e-3
    n_, n2 = int(n * d), int(a2 * d)

    def run(rng):
        X, y = P.pool(n_, d, R, rng)
        return P.candidate_selection(X, y, n2, [int(kappa * n2)], R, "square", LAM, lam2, "margin", rng)[0]

    sim = _mc(run, 16, 6)
    types = T.candidate_types(n, kappa * a2, "margin")
    th = T.solve(types, R**2, LAM, lam2, a2).err2
    naive = T.solve(types, R**2, LAM, lam2, a2, reuse=False).err2
    se = sim.std(ddof=1) / np.sqrt(len(sim))
    assert abs(sim.mean() - th) < 4 * se + 0.004, (sim.mean(), th)
    assert abs(sim.mean() - naive) > 0.02, (sim.mean(), naive)


def test_interior_peak_on_planted_curves():
    xs = [1, 2, 3, 4, 5, 6]
    x, prom = interior_peak(xs, [0.3, 0.2, 0.25, 0.3, 0.35, 0.4])  # U: below 1, continuous
    assert np.isnan(x) and prom == pytest.approx(0.35 / 0.4)  # the flattest two-sided point
    x, prom = interior_peak(xs, [0.5, 0.4, 0.3, 0.2, 0.15, 0.1])  # monotone
    assert np.isnan(x) and prom == pytest.approx(0.4 / 0.5)
    _, prom_flat = interior_peak(xs, [0.3, 0.3, 0.3, 0.3, 0.3, 0.3])
    assert prom_flat == pytest.approx(1.0)  # a flat curve sits on the boundary, not above it
    x, prom = interior_peak(xs, [0.3, 0.2, 0.3, 0.24, 0.1, 0.12])  # rise, then a second descent
    assert x == 3 and prom == pytest.approx(1.5)  # min(0.3 / 0.2, 0.3 / 0.1)
