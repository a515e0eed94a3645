"""Rex numerics: exact round trips in float64, SDE reversal by replayed increments, orders, stability."""
import numpy as np
import pytest

from reprozoo.data.synthetic.gmm import make
from reprozoo.methods.rex.method import empirical_order, reference_solution, roundtrip_error
from reprozoo.methods.rex.samplers import make_sampler, rho_grid

PARAMS = {"zeta": 0.999, "edict_p": 0.93, "rho_max": 80.0, "rho_min": 0.002}


@pytest.fixture(scope="module")
def gmm():
    return make(components=6, radius=2.0, dim=2, rng=np.random.default_rng(3))


def test_exact_score_matches_finite_differences(gmm):
    y = np.random.default_rng(0).normal(size=(5, 2))
    rho, h = 0.7, 1e-6
    for i in range(2):
        e = np.zeros(2)
        e[i] = h
        fd = (gmm.log_prob(y + e, rho) - gmm.log_prob(y - e, rho)) / (2 * h)
        np.testing.assert_allclose(gmm.score(y, rho)[:, i], fd, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gmm.denoise(y, rho), y + rho**2 * gmm.score(y, rho))


@pytest.mark.parametrize("variant", ["rex_euler", "rex_midpoint", "rex_rk4", "rex_sde", "reversible_heun"])
@pytest.mark.parametrize("n", [5, 25, 100])
def test_reversible_round_trip_is_float64_exact(gmm, variant, n):
    x0 = gmm.sample(64, np.random.default_rng(1))
    err = roundtrip_error(variant, gmm.denoise, x0, rho_grid(80.0, 0.002, n), PARAMS, np.random.default_rng(2))
    assert err <= 1e-10


def test_ddim_inversion_is_not_exact(gmm):
    x0 = gmm.sample(64, np.random.default_rng(1))
    err = roundtrip_error("ddim", gmm.denoise, x0, rho_grid(80.0, 0.002, 25), PARAMS, np.random.default_rng(2))
    assert err > 1e-3


def test_sde_reversal_needs_the_stored_increments(gmm):
    s = make_sampler("rex_sde", gmm.denoise, PARAMS)
    rhos = rho_grid(80.0, 0.002, 30)
    rng = np.random.default_rng(0)
    noise = 80.0 * rng.standard_normal((32, 2))
    dws = s.brownian(rhos, noise.shape, rng)
    state = s.decode(s.init(noise), rhos, dws)
    back = s.encode_state(state, rhos, dws)
    again = s.decode(back, rhos, dws)
    assert np.max(np.abs(again[0] - state[0])) < 1e-12
    other = s.brownian(rhos, noise.shape, np.random.default_rng(99))
    wrong = s.decode(s.encode_state(state, rhos, other), rhos, dws)
    assert np.max(np.abs(wrong[0] - state[0])) > 1e-3  # replaying other increments does not invert
    # samples land on the data: mean log-likelihood close to that of true samples
    x = s.output(state)
    assert gmm.log_prob(x, 0.002).mean() > gmm.log_prob(gmm.sample(2000, rng), 0.002).mean() - 1.0


@pytest.mark.parametrize("variant,order", [("rex_midpoint", 2), ("rex_rk4", 4), ("ddim", 1), ("reversible_heun", 2)])
def test_empirical_order(gmm, variant, order):
    rng = np.random.default_rng(5)
    noise = 80.0 * rng.standard_normal((16, 2))
    ref = reference_solution(gmm.eps, noise, 80.0, 0.002)
    s = make_sampler(variant, gmm.denoise, PARAMS)
    steps = [64, 128, 256, 512]
    errs = [np.mean(np.linalg.norm(s.output(s.decode(s.init(noise), rho_grid(80.0, 0.002, n))) - ref, axis=1))
            for n in steps]
    assert abs(empirical_order(steps, errs, 1e-10) - order) <= 0.35, errs


def test_rex_euler_coupling_bias_scales_with_one_minus_zeta(gmm):
    """Rex-Euler's error has an O(1 - zeta) plateau over practical step counts (see README)."""
    rng = np.random.default_rng(5)
    noise = 80.0 * rng.standard_normal((16, 2))
    ref = reference_solution(gmm.eps, noise, 80.0, 0.002)
    errs = {}
    for zeta in (0.999, 0.9999):
        s = make_sampler("rex_euler", gmm.denoise, {"zeta": zeta})
        errs[zeta] = np.mean(np.linalg.norm(s.output(s.decode(s.init(noise), rho_grid(80.0, 0.002, 512))) - ref, axis=1))
    assert errs[0.999] > 5 * errs[0.9999]


def test_linear_stability_rex_vs_reversible_heun(gmm):
    from reprozoo.blocks.ode import stability_interval

    rex = make_sampler("rex_euler", gmm.denoise, PARAMS)
    heun = make_sampler("reversible_heun", gmm.denoise, PARAMS)
    assert stability_interval(rex.linear_step, rex.state_dim) > 0
    assert stability_interval(heun.linear_step, heun.state_dim) == 0.0
