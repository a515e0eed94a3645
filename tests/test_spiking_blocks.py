"""Spiking neurons against their closed-form trajectories; surrogates; the FFT path of RF neurons."""
import math

import numpy as np
import pytest
import torch

from reprozoo.blocks import spiking as sp


def test_lif_membrane_matches_closed_form_below_threshold():
    beta, current, T = 0.8, 0.15, 30  # steady state 0.75 < θ = 1: never fires
    s, v = sp.lif(torch.full((T, 1), current), beta=beta)
    t = np.arange(1, T + 1)
    np.testing.assert_allclose(v[:, 0].numpy(), current * (1 - beta ** t) / (1 - beta), rtol=1e-5)
    assert s.sum() == 0


def test_lif_fires_where_the_closed_form_crosses_threshold_and_resets():
    beta, current = 0.9, 0.3
    s, v = sp.lif(torch.full((20, 1), current), beta=beta, reset="zero")
    t_cross = next(t for t in range(1, 50) if current * (1 - beta ** t) / (1 - beta) >= 1.0)
    assert int(s[:, 0].nonzero()[0]) == t_cross - 1
    # after a zero reset the trajectory restarts: the same interval between spikes
    times = s[:, 0].nonzero().flatten().tolist()
    assert len(times) >= 2 and all(b - a == t_cross for a, b in zip(times, times[1:]))


def test_subtractive_reset_keeps_the_residual():
    s, v = sp.lif(torch.full((3, 1), 0.7), beta=1.0, reset="subtract")
    # v: 0.7, 1.4 (spike), 1.4 - 1 + 0.7 = 1.1 (spike)
    np.testing.assert_allclose(v[:, 0].numpy(), [0.7, 1.4, 1.1], rtol=1e-6)
    assert s[:, 0].tolist() == [0.0, 1.0, 1.0]


@pytest.mark.parametrize("current", [0.3, 0.26, 0.5, 1.2])
def test_single_spike_if_fires_once_at_ceil_theta_over_i(current):
    s, _ = sp.if_single_spike(torch.full((12, 1), current))
    assert s.sum() == 1
    assert sp.first_spike_time(s)[0] == math.ceil(1.0 / current - 1e-9) - 1


def test_first_spike_time_is_T_for_silent_neurons():
    s = torch.zeros(5, 2)
    s[3, 1] = 1
    assert sp.first_spike_time(s).tolist() == [5.0, 3.0]


@pytest.mark.parametrize("name", sorted(sp.SURROGATES))
def test_surrogates_integrate_to_one(name):
    x = torch.linspace(-2000, 2000, 2_000_001, dtype=torch.float64)
    area = torch.trapezoid(sp.SURROGATES[name]()(x), x)
    assert float(area) == pytest.approx(1.0, abs=2e-3)


def test_asymmetric_surrogate_puts_more_mass_above_threshold():
    g = sp.asymmetric(a_left=3.0, a_right=1.0)
    x = torch.linspace(-5, 5, 100001)
    y = g(x)
    above = torch.trapezoid(y[x >= 0], x[x >= 0])
    assert float(above) == pytest.approx(0.75, abs=1e-3)  # widths 1/3 and 1: mass 3/4 above


def test_spike_forward_is_heaviside_backward_is_the_surrogate():
    x = torch.tensor([-0.3, 0.0, 0.4], requires_grad=True)
    g = sp.sigmoid(4.0)
    y = sp.spike(x, g)
    assert y.tolist() == [0.0, 1.0, 1.0]
    y.sum().backward()
    torch.testing.assert_close(x.grad, g(x.detach()))


def test_resonate_and_fire_impulse_response_is_lambda_to_the_t():
    omega, b, T = 0.7, 0.05, 40
    current = torch.zeros(T, 1)
    current[0] = 1.0
    _, z = sp.resonate_and_fire(current, omega, b, threshold=10.0)
    t = torch.arange(T)
    expected = torch.exp(torch.complex(-b * t.float(), omega * t.float()))
    torch.testing.assert_close(z[:, 0], expected.to(torch.complex64), rtol=1e-5, atol=1e-5)


def test_fft_path_equals_the_recurrence():
    torch.manual_seed(0)
    C, L = 3, 257
    omega, b = torch.tensor([0.2, 0.9, 2.0]), torch.tensor([0.01, 0.1, 0.3])
    x = torch.randn(2, C, L)
    _, z = sp.resonate_and_fire(x.permute(2, 0, 1), omega, b, threshold=1e9)   # (L, 2, C)
    y = sp.causal_fft_conv(x, sp.rf_kernel(omega, b, L))                      # (2, C, L)
    torch.testing.assert_close(y, z.permute(1, 2, 0), rtol=1e-4, atol=1e-4)


def test_harmonic_kernel_solves_the_damped_oscillator():
    """Convolving a step input with the kernel approaches the static response x/ω²."""
    omega, b, dt, L = torch.tensor([1.5]), torch.tensor([0.4]), 0.01, 4000
    y = sp.causal_fft_conv(torch.ones(1, L), sp.harmonic_rf_kernel(omega, b, L, dt))
    assert float(y[0, -1]) == pytest.approx(1 / 1.5 ** 2, rel=1e-2)


def test_synaptic_ops_count_spikes_times_fan_out():
    s = torch.zeros(4, 10)
    s[0, :3] = 1
    s[2, 5] = 1
    assert sp.synaptic_ops(s, fan_out=7) == 28.0
    assert sp.firing_rate(s) == pytest.approx(4 / 40)
