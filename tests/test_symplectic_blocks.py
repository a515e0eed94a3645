"""Leapfrog: energy bounded over 10^4 steps (RK4 drifts), second order, time reversible."""
import numpy as np
import pytest

from reprozoo.blocks.ode import RK4, rk_increment
from reprozoo.blocks.symplectic import leapfrog, leapfrog_step, strang


def pendulum_grad(q):
    return np.sin(q)


def pendulum_energy(q, p):
    return 0.5 * p ** 2 - np.cos(q)


def test_energy_error_stays_bounded_over_ten_thousand_steps():
    q0, p0, h = np.array([2.0]), np.array([0.0]), 0.1  # large amplitude: strongly nonlinear
    qs, ps = leapfrog(q0, p0, pendulum_grad, h, 10_000)
    err = np.abs(pendulum_energy(qs, ps) - pendulum_energy(q0, p0)).ravel()
    first, last = err[:1000].max(), err[-1000:].max()
    assert err.max() < 5e-3           # O(h^2) with a modest constant
    assert last < 1.5 * first         # no secular drift: the late error is no larger than the early one


def test_rk4_drifts_where_leapfrog_does_not():
    """The bound above is a real test: a non-symplectic scheme of higher order fails it."""
    h, n = 0.5, 4000
    f = lambda y, t: np.array([y[1], -np.sin(y[0])])
    ys = [np.array([2.0, 0.0])]
    for i in range(n):
        ys.append(ys[-1] + rk_increment(f, ys[-1], i * h, h, RK4))
    ys = np.array(ys)
    e_rk = np.abs(pendulum_energy(ys[:, 0], ys[:, 1]) - pendulum_energy(2.0, 0.0))
    qs, ps = leapfrog(np.array([2.0]), np.array([0.0]), pendulum_grad, h, n)
    e_lf = np.abs(pendulum_energy(qs, ps) - pendulum_energy(2.0, 0.0)).ravel()
    assert e_rk[-500:].mean() > 3 * e_rk[:500].mean()   # RK4 energy drifts secularly
    assert e_lf[-500:].max() < 1.5 * e_lf[:500].max()


def test_second_order_convergence_on_the_harmonic_oscillator():
    t_end, errs = 2.0, []
    for n in (50, 100, 200):
        q, p = leapfrog(np.array([1.0]), np.array([0.0]), lambda q: q, t_end / n, n)
        errs.append(abs(q[-1, 0] - np.cos(t_end)))
    rates = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert rates == pytest.approx([2.0, 2.0], abs=0.1)


def test_time_reversible():
    q, p = np.array([0.3, -1.0]), np.array([0.5, 0.2])
    for _ in range(100):
        q, p = leapfrog_step(q, p, pendulum_grad, 0.05)
    for _ in range(100):
        q, p = leapfrog_step(q, p, pendulum_grad, -0.05)
    np.testing.assert_allclose(q, [0.3, -1.0], atol=1e-12)
    np.testing.assert_allclose(p, [0.5, 0.2], atol=1e-12)


def test_strang_of_drift_and_kick_is_leapfrog():
    drift = lambda s, h: (s[0] + h * s[1], s[1])
    kick = lambda s, h: (s[0], s[1] - h * np.sin(s[0]))
    a = strang((np.array([1.0]), np.array([0.5])), 0.1, drift, kick)
    b = leapfrog_step(np.array([1.0]), np.array([0.5]), pendulum_grad, 0.1)
    np.testing.assert_allclose(a, b, rtol=1e-14)


def test_works_on_torch_tensors_with_autograd():
    torch = pytest.importorskip("torch")
    q = torch.tensor([1.0], requires_grad=True)
    qs, ps = leapfrog(q, torch.zeros(1), lambda x: x, 0.1, 10, stack=torch.stack)
    qs[-1].sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
