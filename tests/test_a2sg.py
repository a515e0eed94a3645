"""A2SG numerics: area-1 asymmetric windows, the adaptive window tracking membrane spread, the
batched LIF CNN equal to the step-by-step recursion, per-step gradients summing to the full one."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reprozoo.blocks.spiking import lif, spike
from reprozoo.methods.a2sg import data as D
from reprozoo.methods.a2sg.measures import gradient_cosine, per_step_gradients, sharpness
from reprozoo.methods.a2sg.snn import WEIGHTS, SpikingCNN
from reprozoo.methods.a2sg.surrogates import AdaptiveWindow, FixedSurrogate, asymmetric_window

X = torch.linspace(-6, 6, 240001, dtype=torch.float64)
DX = float(X[1] - X[0])


@pytest.mark.parametrize("width,ratio", [(1.0, 1.0), (0.7, 2.0), (1.3, 3.0)])
def test_asymmetric_window_area_support_and_mass_split(width, ratio):
    g = asymmetric_window(width, ratio)(X)
    assert abs(float(g.sum()) * DX - 1.0) < 1e-4                      # area 1, like the baselines
    support = X[g > 0]
    w_below = 2 * width / (1 + ratio)
    assert abs(float(-support.min()) - w_below) < 1e-3
    assert abs(float(support.max()) - ratio * w_below) < 1e-3
    # a two-sided triangle with a common peak puts mass r / (1 + r) above threshold
    assert abs(float(g[X >= 0].sum()) * DX - ratio / (1 + ratio)) < 1e-3


def test_symmetric_window_is_the_triangle():
    g = asymmetric_window(0.8, 1.0)(X)
    np.testing.assert_allclose(g, (1 - X.abs() / 0.8).clamp(min=0) / 0.8, atol=1e-12)


def test_adaptive_window_tracks_membrane_spread_and_anneals():
    w = AdaptiveWindow(2, 3, ratio=2.0, kappa_start=1.5, kappa_end=0.5, momentum=0.5, w_min=0.01, w_max=10)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        w(0, 1, 0.3 * torch.randn(20000, generator=gen))
        w(1, 2, 2.0 * torch.randn(20000, generator=gen))
    assert abs(w.width(0, 1) - 1.5 * 0.3) < 0.02
    assert abs(w.width(1, 2) - 1.5 * 2.0) < 0.1
    w.progress = 1.0
    assert abs(w.width(1, 2) - 0.5 * 2.0) < 0.05
    assert w.width(0, 0) == pytest.approx(0.5)                     # never observed: σ = 1
    w.training = False                                             # evaluation does not move σ
    before = w.width(0, 1)
    w(0, 1, 100 * torch.randn(1000, generator=gen))
    assert w.width(0, 1) == before
    w2 = AdaptiveWindow(1, 1, w_min=0.2, w_max=0.4)
    w2(0, 0, 10 * torch.randn(1000, generator=gen))
    assert w2.width(0, 0) == 0.4


def test_spike_backward_is_the_window():
    u = torch.linspace(-1.5, 1.5, 301, requires_grad=True)
    g = asymmetric_window(0.6, 2.0)
    spike(u, g).sum().backward()
    np.testing.assert_allclose(u.grad, g(u.detach()), atol=1e-7)
    assert float(u.grad[u.detach() > 0.5].sum()) > float(u.grad[u.detach() < -0.3].sum())


@pytest.mark.parametrize("dim,size,kernel", [(2, 8, 3), (1, 16, 5)])
def test_layer1_spikes_equal_the_block_lif(dim, size, kernel):
    torch.manual_seed(0)
    m = SpikingCNN(dim, size, (4, 6), kernel, T=4, beta=0.5).eval()
    with torch.no_grad():
        m.bn1.running_var.fill_(0.05)                                   # make layer 1 fire
    x = torch.rand(5, *([size] * dim))
    sur = FixedSurrogate("arctan", alpha=2.0)
    _, spikes = m(x, sur, record=True)
    with torch.no_grad():
        cur = m.bn1(m.conv(x.unsqueeze(1), m.conv1.weight, padding=kernel // 2))
    ref, _ = lif(cur.unsqueeze(0).expand(4, *cur.shape), beta=0.5, threshold=1.0)
    assert 0.05 < float(ref.mean()) < 0.95
    assert torch.equal(spikes[0], ref)


def test_per_step_gradients_sum_to_the_full_gradient():
    torch.manual_seed(1)
    m = SpikingCNN(2, 8, (4, 6), 3, T=4).to("cpu").eval()           # .to: nn.Module's own _apply intact
    with torch.no_grad():
        m.bn1.running_var.fill_(0.05)
        m.bn2.running_var.fill_(0.05)
    sur = AdaptiveWindow(2, 4)
    sur.training = False
    x, y = torch.rand(16, 8, 8), torch.randint(10, (16,))
    g = per_step_gradients(m, sur, x, y)
    assert g.shape[0] == 4
    m.zero_grad()
    F.cross_entropy(m(x, sur), y).backward()
    full = torch.cat([m.get_parameter(n).grad.flatten() for n in WEIGHTS])
    assert float(full.abs().max()) > 0
    torch.testing.assert_close(g.sum(0), full, rtol=1e-4, atol=1e-6)


def test_gradient_cosine_closed_forms():
    e = torch.eye(3)
    assert gradient_cosine(e) == pytest.approx(0.0)
    assert gradient_cosine(torch.ones(4, 5) * torch.arange(1, 5.0)[:, None]) == pytest.approx(1.0)
    assert gradient_cosine(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(-1.0)


def test_sharpness_is_zero_at_rho_zero_and_restores_weights():
    torch.manual_seed(2)
    m = SpikingCNN(1, 16, (4, 6), 5, T=4)
    x, y = torch.randn(32, 16), torch.randint(10, (32,))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    sur = FixedSurrogate("sigmoid")
    assert sharpness(m, sur, x, y, 0.0, 3, torch.Generator().manual_seed(0)) == pytest.approx(0.0, abs=1e-7)
    assert sharpness(m, sur, x, y, 0.5, 3, torch.Generator().manual_seed(0)) != 0.0
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k])


def test_mnist1d_is_deterministic_balanced_and_shift_dependent():
    a = D.mnist1d(200, np.random.default_rng(3))
    b = D.mnist1d(200, np.random.default_rng(3))
    np.testing.assert_array_equal(a[0], b[0])
    assert a[0].shape == (200, 40) and np.bincount(a[1]).tolist() == [20] * 10
    # without noise and shift, nearest class mean is perfect; with the shifts it is far from it
    kw = dict(noise=0.0, corr_noise=0.0, shear=0.0)
    for shift, lo, hi in ((0, 0.99, 1.01), (12, 0.0, 0.7)):
        x, y = D.mnist1d(400, np.random.default_rng(4), max_shift=shift, **kw)
        means = np.stack([x[y == c].mean(0) for c in range(10)])
        acc = np.mean(np.argmin(((x[:, None] - means[None]) ** 2).sum(-1), 1) == y)
        assert lo <= acc <= hi, (shift, acc)


def test_a2sg_trains_digits_above_chance():
    torch.manual_seed(0)
    x, y = D.digits(np.random.default_rng(0))
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    m = SpikingCNN(2, 8, (8, 16), 3, T=4)
    sur = AdaptiveWindow(2, 4)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for step in range(80):
        idx = torch.randint(1200, (32,))
        loss = F.cross_entropy(m(x[idx], sur), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    sur.training = False
    with torch.no_grad():
        acc = float((m(x[1200:], sur).argmax(1) == y[1200:]).float().mean())
    assert acc > 0.6, acc
