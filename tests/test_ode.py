"""Shared ODE blocks: RK orders, exact algebraic reversibility, linear stability."""
import numpy as np
import pytest

from reprozoo.blocks.ode import TABLEAUS, Reversible, ode_increment, rk_solve, stability_interval


def f(y, t):  # y' = cos(t) y, non-autonomous, solution exp(sin t)
    return np.cos(t) * y


def exact(t, y0=1.0):
    return y0 * np.exp(np.sin(t))


@pytest.mark.parametrize("name", ["euler", "midpoint", "heun", "rk3", "rk4"])
def test_rk_order(name):
    tab = TABLEAUS[name]
    errs = [abs(rk_solve(f, np.array([1.0]), np.linspace(0, 2, n + 1), tab)[0] - exact(2.0)) for n in (20, 40, 80, 160)]
    slopes = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert abs(slopes[-1] - tab.order) < 0.2, slopes


@pytest.mark.parametrize("zeta", [0.999, 0.5])
@pytest.mark.parametrize("name", ["euler", "midpoint", "rk4"])
def test_reversible_keeps_order_and_inverts_exactly(name, zeta):
    tab = TABLEAUS[name]
    rev = Reversible(ode_increment(f, tab), zeta=zeta)
    errs = []
    for n in (40, 80, 160):
        ts = np.linspace(0, 2, n + 1)
        y, z = rev.solve(np.array([1.0]), np.array([1.0]), ts)
        errs.append(abs(y[0] - exact(2.0)))
        y0, z0 = rev.invert(y, z, ts)
        if zeta > 0.99:  # the inverse divides by zeta each step: zeta = 0.5 amplifies round-off 2^n
            assert abs(y0[0] - 1.0) < 1e-13 and abs(z0[0] - 1.0) < 1e-13
    slope = np.log2(errs[0] / errs[-1]) / 2
    assert abs(slope - tab.order) < 0.3, (errs, slope)  # two-sided: a higher order is a bug too


def test_stability_interval_matches_theory():
    zeta = 0.99
    rev = Reversible(ode_increment(lambda y, t: y, TABLEAUS["euler"]), zeta)

    def step(vec, z):
        r = Reversible(ode_increment(lambda y, t: z * y, TABLEAUS["euler"]), zeta)
        return np.concatenate(r.step(vec[:1], vec[1:], 0.0, 1.0))

    # Euler base: contracting exactly on (-(1 - zeta), 0) on the negative real axis
    r = stability_interval(step, 2, n=2000)
    assert 0.9 * (1 - zeta) < r <= (1 - zeta)
    assert rev.zeta == zeta
    with pytest.raises(ValueError):
        Reversible(lambda *a: 0, zeta=0.0)
