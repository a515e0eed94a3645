"""Numerics of the sh2rfssm method: the IMEX kernel, the FFT path, the layers and the tasks."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.blocks.spiking import causal_fft_conv, harmonic_rf_kernel  # noqa: E402
from reprozoo.methods.sh2rfssm import data as D  # noqa: E402
from reprozoo.methods.sh2rfssm.model import (SpikingSSM, SpikingSSMLayer, imex_kernel,  # noqa: E402
                                             imex_recurrence, lif_kernel)


def test_fft_path_equals_imex_recurrence():
    """The FFT convolution with the closed-form kernel reproduces the step-by-step recurrence."""
    torch.manual_seed(0)
    omega = torch.tensor([0.05, 0.3, 1.0, 1.8], dtype=torch.float64)
    b = torch.tensor([0.001, 0.01, 0.2, 0.05], dtype=torch.float64)
    x = torch.randn(3, 4, 600, dtype=torch.float64)
    ref = imex_recurrence(x, omega, b)
    fft = causal_fft_conv(x.float(), imex_kernel(omega.float(), b.float(), 600)).double()
    # the kernel is float32 (rf_kernel): ϑ = acos(tr / 2r) near cos ϑ = 1 (ω = 0.05) limits it to ~1e-4
    assert (fft - ref).abs().max() / ref.abs().max() < 1e-3


def test_imex_kernel_closed_form_first_terms():
    """h_0 = aΔt², h_1 = aΔt² tr(A): the impulse response's first two steps by hand."""
    omega, b, dt = 0.7, 0.1, 0.5
    a = 1 / (1 + 2 * b * dt)
    tr = 1 + a - a * (dt * omega) ** 2
    h = imex_kernel(torch.tensor([omega]), torch.tensor([b]), 3, dt)[0]
    assert h[0].item() == pytest.approx(a * dt ** 2, rel=1e-5)
    assert h[1].item() == pytest.approx(a * dt ** 2 * tr, rel=1e-5)


def test_imex_converges_to_continuous_impulse_response():
    """As Δt -> 0 the IMEX kernel (per unit time, h/Δt) approaches e^{-bt} sin(ω_d t)/ω_d, first order."""
    omega, b, T = 1.0, 0.1, 10.0
    errs = []
    for dt in (0.1, 0.05, 0.025):
        n = int(T / dt)
        h = imex_kernel(torch.tensor([omega]), torch.tensor([b]), n, dt)[0] / dt
        t = (torch.arange(n) + 1) * dt  # h_k is the membrane after the (k+1)-th update
        wd = math.sqrt(omega ** 2 - b ** 2)
        exact = torch.exp(-b * t) * torch.sin(wd * t) / wd
        errs.append(float((h - exact).abs().max()))
    order = np.polyfit(np.log([0.1, 0.05, 0.025]), np.log(errs), 1)[0]
    assert 0.8 < order < 1.3, (errs, order)
    # and the block's sampled kernel is that same function at t = kΔt, scaled by Δt
    hs = harmonic_rf_kernel(torch.tensor([omega]), torch.tensor([b]), 5, 0.1)[0]
    t = torch.arange(5) * 0.1
    assert torch.allclose(hs, torch.exp(-b * t) * torch.sin(wd * t) / wd * 0.1, atol=1e-6)


def test_resonance_peak_at_natural_frequency():
    """The harmonic layer is a band-pass filter: the steady-state gain of the kernel peaks near ω."""
    omega, b = 0.6, 0.01
    h = imex_kernel(torch.tensor([omega]), torch.tensor([b]), 4096)[0].double().numpy()
    freqs = np.linspace(0.2, 1.0, 801)
    gain = np.abs(np.exp(-1j * np.outer(freqs, np.arange(len(h)))) @ h)
    assert abs(freqs[np.argmax(gain)] - omega) < 0.02
    # a first-order kernel has no interior peak: its gain falls monotonically with frequency
    g1 = np.abs(np.exp(-1j * np.outer(freqs, np.arange(512))) @ lif_kernel(torch.tensor([0.9]), 512)[0].double().numpy())
    assert np.all(np.diff(g1) < 0)


def test_gradient_through_kernel_matches_finite_difference():
    """d/dω of a loss through the FFT path equals the central finite difference (float64)."""
    torch.manual_seed(1)
    x = torch.randn(2, 1, 128, dtype=torch.float64)

    def loss(w):
        h = imex_kernel(w.float(), torch.tensor([0.05]), 128).double()
        return (causal_fft_conv(x, h) ** 2).mean()

    w = torch.tensor([0.4], dtype=torch.float64, requires_grad=True)
    loss(w).backward()
    eps = 1e-3
    fd = (loss(torch.tensor([0.4 + eps])) - loss(torch.tensor([0.4 - eps]))) / (2 * eps)
    assert w.grad.item() == pytest.approx(fd.item(), rel=2e-2)


def test_homogeneous_layer_shares_one_filter():
    het = SpikingSSMLayer(8, kernel="imex", shared=False)
    hom = SpikingSSMLayer(8, kernel="imex", shared=True)
    assert het.log_omega.numel() == 8 and hom.log_omega.numel() == 1
    h = hom.impulse_response(64)
    assert torch.allclose(h, h[:1].expand_as(h))
    assert not torch.allclose(het.impulse_response(64)[0], het.impulse_response(64)[-1])


def test_network_is_causal_and_spikes_are_binary():
    """Changing the input after step t leaves the spikes up to t unchanged."""
    torch.manual_seed(0)
    net = SpikingSSM(1, 4, channels=8, kernel="imex")
    x = torch.randn(2, 1, 200) * 3
    x2 = x.clone()
    x2[..., 120:] += 5.0
    _, (s1, s2) = net(x)
    _, (t1, t2) = net(x2)
    assert set(torch.unique(s1).tolist()) <= {0.0, 1.0}
    assert torch.equal(s1[..., :120], t1[..., :120]) and torch.equal(s2[..., :120], t2[..., :120])


def test_tasks_are_planted_as_stated():
    rng = np.random.default_rng(0)
    x, y = D.frequency_discrimination(64, 1024, rng, noise=0.0)
    spectrum = np.abs(np.fft.rfft(x[:, 0], axis=1))
    f_peak = np.argmax(spectrum, axis=1) / 1024
    assert np.allclose(f_peak, 0.05 + 0.01 * y, atol=1.5 / 1024)
    x, y = D.adding_problem(32, 100, rng)
    assert np.all(x[:, 1].sum(1) == 2) and np.allclose((x[:, 0] * x[:, 1]).sum(1), y, atol=1e-6)
    assert np.all(x[:, 1, :50].sum(1) == 1)


def test_heterogeneous_layer_separates_frequencies_at_init():
    """Planted signal: without training, the channel of largest response tracks the input's frequency
    (the bank of resonators), while a shared-ω layer gives every channel the same response."""
    layer = SpikingSSMLayer(16, kernel="imex", omega_range=(0.2, 1.0), zeta_range=(0.01, 0.02))
    t = torch.arange(2048, dtype=torch.float32)
    best = []
    for w in (0.3, 0.6, 0.9):
        _, v = layer(torch.sin(w * t)[None, None].expand(1, 16, -1).contiguous())
        best.append(int(v[0, :, 1024:].abs().amax(-1).argmax()))
    assert best[0] < best[1] < best[2]
