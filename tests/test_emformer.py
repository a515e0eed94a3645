"""EMFormer numerics: QG invariants and a closed-form Rossby wave, the single-conv block equal to
the multi-branch one (outputs, gradients, parameters, receptive field), the context attention, skill."""
import numpy as np
import pytest
import torch

from reprozoo.data.pde.common import march
from reprozoo.methods.emformer.method import composite_loss, loss_weight
from reprozoo.methods.emformer.model import EMFormerNet, MultiBranchConv, SingleConvMultiScale, rollout
from reprozoo.methods.emformer.qg import QG2D
from reprozoo.methods.emformer.skill import latitude_weights, weighted_acc, weighted_rmse


@pytest.mark.parametrize("nu,tol_e,tol_z", [(0.0, 1e-6, 1e-6), (1e-10, 5e-3, 5e-2)])
def test_qg_conserves_energy_and_enstrophy_at_low_viscosity(nu, tol_e, tol_z):
    """Exactly (to RK4 error) when inviscid; at low hyperviscosity energy nearly, enstrophy (which
    cascades to the dissipation scale) less so, and both only decrease."""
    sim = QG2D(beta=1.0, ld=1.0, mu=0.0, nu=nu, forcing_amp=0.0)
    q = sim.random_q(np.random.default_rng(0), 2, amp=3.0)
    e0, z0 = sim.energy(q), sim.enstrophy(q)
    q, _ = march(q, [5.0], sim.step, 0.01, lambda i, s: None)
    assert np.all(np.abs(sim.energy(q) / e0 - 1) < tol_e)
    assert np.all(np.abs(sim.enstrophy(q) / z0 - 1) < tol_z)
    if nu > 0:
        assert np.all(sim.energy(q) < e0) and np.all(sim.enstrophy(q) < z0)
    assert np.abs(q[..., 0, 0]).max() < 1e-9  # the domain mean of q (its "mass") stays zero
    # and the nonlinear term did something: the field changed
    assert np.abs(sim.to_grid(q) - sim.to_grid(sim.random_q(np.random.default_rng(0), 2, amp=3.0))).max() > 0.1


def test_drag_dissipates_energy():
    sim = QG2D(mu=0.1, nu=0.0, forcing_amp=0.0)
    q = sim.random_q(np.random.default_rng(1), 1, amp=2.0)
    e0 = sim.energy(q)
    q, _ = march(q, [2.0], sim.step, 0.02, lambda i, s: None)
    assert np.all(sim.energy(q) < e0)


def test_rossby_wave_matches_dispersion_relation_and_drag_decay():
    """A single Fourier mode has J(psi, q) = 0: psi = A exp(-r t) cos(kx x + ky y - w t) with
    w = -beta kx / (k^2 + Ld^-2) (westward phase speed) and r = mu k^2 / (k^2 + Ld^-2)."""
    beta, ld, mu = 1.5, 0.8, 0.05
    sim = QG2D(beta=beta, ld=ld, mu=mu, nu=0.0, forcing_amp=0.0)
    yy, xx = np.meshgrid(sim.y, sim.x, indexing="ij")
    kx, ky = 2 * np.pi * 3 / sim.lx, 2 * np.pi * 2 / sim.ly
    k2 = kx**2 + ky**2
    psi0 = np.cos(kx * xx + ky * yy)
    q = (sim.to_hat(psi0) * -(k2 + 1 / ld**2))[None]
    T = 3.0
    q, _ = march(q, [T], sim.step, 0.05, lambda i, s: None)
    w, r = -beta * kx / (k2 + 1 / ld**2), mu * k2 / (k2 + 1 / ld**2)
    exact = np.exp(-r * T) * np.cos(kx * xx + ky * yy - w * T)
    np.testing.assert_allclose(sim.fields(q)[0, 0], exact, atol=1e-8)


def _pair(channels=6, dtype=torch.float64):
    torch.manual_seed(0)
    a = MultiBranchConv(channels).to(dtype)
    b = SingleConvMultiScale(channels).to(dtype)
    b.load_state_dict(a.state_dict())
    return a, b


def test_single_conv_equals_multibranch_outputs_and_gradients():
    a, b = _pair()
    x = torch.randn(3, 6, 8, 16, dtype=torch.float64, requires_grad=True)
    ya, yb = a(x), b(x)
    torch.testing.assert_close(ya, yb, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ya)
    ga = torch.autograd.grad(ya, [x, *a.parameters()], g)
    gb = torch.autograd.grad(yb, [x, *b.parameters()], g)
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


def test_single_conv_parameters_and_receptive_field_match_multibranch():
    a, b = _pair()
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(a) == n(b) == 6 * (1 + 9 + 25)
    for m in (a, b):  # response to a delta: a 5 x 5 footprint around it (circular padding)
        x = torch.zeros(1, 6, 12, 12, dtype=torch.float64)
        x[0, :, 6, 6] = 1.0
        with torch.no_grad():
            nz = torch.nonzero(m(x)[0].abs().sum(0) > 0)
        assert nz[:, 0].min() == 4 and nz[:, 0].max() == 8 and nz[:, 1].min() == 4 and nz[:, 1].max() == 8
    # the merged kernel is the centred, zero-padded sum of the three
    w = b.merged_kernel()
    w1, w3, w5 = b.weights
    torch.testing.assert_close(w[:, :, 2, 2], w1[:, :, 0, 0] + w3[:, :, 1, 1] + w5[:, :, 2, 2])
    torch.testing.assert_close(w[:, :, 0, 0], w5[:, :, 0, 0])


def test_multiscale_conv_is_periodic():
    _, b = _pair()
    x = torch.randn(1, 6, 8, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(b(torch.roll(x, (3, 5), (2, 3))), torch.roll(b(x), (3, 5), (2, 3)))


def test_context_of_the_same_step_changes_nothing():
    """Attention over keys/values duplicated from the same step gives the same weighted average, so a
    context made of the current step's own (k, v) leaves the forecast unchanged; another step's does not."""
    torch.manual_seed(0)
    net = EMFormerNet(dim=8, depth=2, heads=2).double()
    for p in net.head.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 2, 32, 64, dtype=torch.float64)
    y0, kv = net(x)
    y1, _ = net(x, [kv])
    torch.testing.assert_close(y0, y1)
    _, kv_other = net(torch.randn_like(x))
    y2, _ = net(x, [kv_other])
    assert (y2 - y0).abs().max() > 1e-6
    # rollout with window 0 is repeated Markov steps
    r = rollout(net, x, 3, 0)
    z = x
    for i in range(3):
        z, _ = net(z)
        torch.testing.assert_close(r[i], z)


def test_skill_scores_closed_forms():
    w = latitude_weights(32)
    assert abs(w.mean() - 1) < 1e-12 and np.allclose(w, w[::-1])
    rng = np.random.default_rng(0)
    t, clim = rng.normal(size=(4, 32, 64)), rng.normal(size=(32, 64))
    np.testing.assert_allclose(weighted_rmse(t + 0.3, t), 0.3)
    np.testing.assert_allclose(weighted_acc(t, t, clim), 1.0)
    np.testing.assert_allclose(weighted_acc(2 * (t - clim) + clim, t, clim), 1.0)  # scale-free
    np.testing.assert_allclose(weighted_acc(-(t - clim) + clim, t, clim), -1.0)


def test_sinusoidal_weight_has_the_fixed_weight_as_mean_and_gradient_term_ignores_offsets():
    S = 1000
    ws = np.array([loss_weight("sin", s, S) for s in range(S)])
    assert ws[0] == 0.0 and abs(ws.mean() - loss_weight("fixed", 0, S)) < 1e-3 and ws.max() <= 1.0
    lat = torch.ones(32, 1)
    t = torch.randn(2, 2, 32, 64)
    # a constant offset has zero gradient error: only the field term sees it
    assert float(composite_loss(t + 1.0, t, 1.0, lat)) < 1e-10
    assert abs(float(composite_loss(t + 1.0, t, 0.0, lat)) - 1.0) < 1e-6
