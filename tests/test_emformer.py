"""EMFormer numerics: QG invariants and a closed-form Rossby wave, the single-conv block equal to
the multi-branch one (outputs, gradients, parameters, receptive field), the context attention, skill
scores, the paper's composite loss, the persistence control and the skill window, the placebo context,
the planted short-lead control, the test units and the fine-tuning stop rule."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from reprozoo.data.pde.common import march
from reprozoo.methods.emformer.loss import CompositeLoss
from reprozoo.methods.emformer.method import (anomaly_autocorrelation, block_speed, finetune, forecast_skill,
                                              lookback_gain, make_ar2_data, make_data, observe, placebo_shift,
                                              planted_short_rmse, start_states)
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


def test_context_gate_starts_closed_so_fine_tuning_starts_from_the_pretrained_forecast():
    """The context enters through its own attention and a zero-initialised gate (``Block.ctx_proj``):
    with the gate closed any context, real or placebo, leaves the forecast equal to the Markov one (the
    pretrained forecast); once the gate is open, another step's context changes it. A Markov step never
    reaches the gate (no gradient), and rollout with window 0 is repeated Markov steps."""
    torch.manual_seed(0)
    net = EMFormerNet(dim=8, depth=2, heads=2).double()
    for p in net.head.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 2, 32, 64, dtype=torch.float64)
    y0, kv = net(x)
    _, kv_other = net(torch.randn_like(x))
    torch.testing.assert_close(net(x, [kv_other])[0], y0)
    torch.testing.assert_close(rollout(net, x, 3, 2, history=torch.randn(2, 2, 2, 32, 64, dtype=torch.float64)),
                               rollout(net, x, 3, 0))
    y0.sum().backward()
    assert all(b.ctx_proj.grad is None for b in net.blocks)  # Markov steps do not train the gate
    net.zero_grad()
    yc, _ = net(x, [kv_other])
    yc.sum().backward()  # with a context, the closed gate gets a gradient (it can open)
    assert all(b.ctx_proj.grad.abs().max() > 0 for b in net.blocks)
    with torch.no_grad():
        for b in net.blocks:
            torch.nn.init.normal_(b.ctx_proj, std=0.3)
        assert (net(x, [kv_other])[0] - y0).abs().max() > 1e-6
        torch.testing.assert_close(net(x)[0], y0)  # the open gate leaves Markov steps alone
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


def _loss_pair(seed=0):
    torch.manual_seed(seed)
    pred, target = torch.randn(3, 2, 2, 32, 64, dtype=torch.float64), torch.randn(3, 2, 2, 32, 64, dtype=torch.float64)
    lat = torch.from_numpy(latitude_weights(32))[:, None]
    return pred, target, lat


def test_composite_loss_terms_match_their_definitions():
    """L_gen = mean_c(MSE_c e^-s_c + s_c) (plain grid mean), L_rmse = mean of the per-field latitude-
    weighted RMSE (skill.weighted_rmse); lambda = 0 at the reference's initial theta, 1/2 for the fixed rule."""
    pred, target, lat = _loss_pair()
    sin, fixed = CompositeLoss(2, "sin").double(), CompositeLoss(2, "fixed").double()
    with torch.no_grad():
        sin.logvar.copy_(torch.tensor([0.3, -0.7], dtype=torch.float64))
        gen, rmse = sin.terms(pred, target, lat)
    mse = ((pred - target) ** 2).mean(dim=(0, 1, 3, 4)).numpy()
    s = np.array([0.3, -0.7])
    np.testing.assert_allclose(float(gen), np.mean(mse * np.exp(-s) + s), rtol=1e-12)
    np.testing.assert_allclose(float(rmse), weighted_rmse(pred.numpy(), target.numpy()).mean(), rtol=1e-12)
    assert abs(float(sin.weight().detach())) < 1e-12 and float(fixed.weight()) == 0.5
    with torch.no_grad():
        np.testing.assert_allclose(float(sin(pred, target, lat)), float(gen), rtol=1e-12)
        g0, r0 = fixed.terms(pred, target, lat)
        np.testing.assert_allclose(float(fixed(pred, target, lat)), 0.5 * float(g0 + r0), rtol=1e-12)
    with pytest.raises(ValueError):
        CompositeLoss(2, "cosine")


def test_learned_log_variance_is_optimal_at_the_log_mse():
    """dL_gen/ds_c = (1 - MSE_c e^-s_c) / C vanishes at s_c = log MSE_c, where L_gen = mean(1 + log MSE_c)."""
    pred, target, lat = _loss_pair(1)
    loss = CompositeLoss(2, "sin").double()
    mse = ((pred - target) ** 2).mean(dim=(0, 1, 3, 4))
    with torch.no_grad():
        loss.logvar.copy_(torch.log(mse))
    gen, _ = loss.terms(pred, target, lat)
    (g,) = torch.autograd.grad(gen, [loss.logvar])
    assert g.abs().max() < 1e-12
    np.testing.assert_allclose(float(gen.detach()), float((1 + torch.log(mse)).mean()), rtol=1e-12)


def test_sinusoidal_weight_gradient_and_its_stationary_point():
    """dL/dtheta = cos(theta) (L_rmse - L_gen) / 2 (autograd against the closed form); it vanishes at the
    reference's initial theta = -pi/2, and the fixed rule has no weight parameter to learn."""
    pred, target, lat = _loss_pair(2)
    loss = CompositeLoss(2, "sin").double()
    for theta in (0.4, -1.1, -math.pi / 2):
        with torch.no_grad():
            loss.theta.fill_(theta)
        (g,) = torch.autograd.grad(loss(pred, target, lat), [loss.theta])
        gen, rmse = loss.terms(pred, target, lat)
        np.testing.assert_allclose(float(g), math.cos(theta) * float((rmse - gen).detach()) / 2, atol=1e-12)
    assert abs(float(g)) < 1e-12
    assert [n for n, _ in CompositeLoss(2, "fixed").named_parameters()] == ["logvar"]


def _toy_data(rng, n_traj=2, n_frames=12):
    test = rng.normal(size=(n_traj, n_frames, 2, 32, 64)).astype(np.float32)
    return {"test": test, "clim": rng.normal(size=(2, 32, 64)).astype(np.float32) * 0.1}


def test_persistence_skill_is_the_lagged_self_comparison_and_units_are_the_start_states():
    rng = np.random.default_rng(0)
    data = _toy_data(rng)
    starts = start_states(2, 12, 4, 3)
    assert starts == [(0, 0), (0, 3), (0, 6), (1, 0), (1, 3), (1, 6)]  # every start has 4 leads inside
    rmse, acc, f0, t0 = forecast_skill(None, data, 4, 0, starts)
    assert rmse.shape == acc.shape == (6, 4, 2)
    a, b = starts[4]
    for k in range(1, 5):
        x0, xk = data["test"][a, b], data["test"][a, b + k]
        np.testing.assert_allclose(rmse[4, k - 1], weighted_rmse(x0, xk), rtol=1e-5)
        np.testing.assert_allclose(acc[4, k - 1], weighted_acc(x0, xk, data["clim"]), rtol=1e-5)
    np.testing.assert_array_equal(f0[2], data["test"][0, 0])
    np.testing.assert_array_equal(t0[2], data["test"][0, 3])
    # a forecaster that returns its input is persistence: same scores through the network path
    net = EMFormerNet(dim=8, depth=1, heads=2)  # zero head: x_{t+1} = x_t
    rmse_n, acc_n, _, _ = forecast_skill(net, data, 4, 0, starts)
    np.testing.assert_allclose(rmse_n, rmse, rtol=1e-5)
    np.testing.assert_allclose(acc_n, acc, rtol=1e-4, atol=1e-6)


def test_skill_window_sits_where_the_anomaly_autocorrelation_decays():
    """The claims' window (smoke config, leads 4-8) is where persistence loses its skill on the simulated
    atmosphere: psi autocorrelation about 1/2 at the first lead of the window, near 0 at the last."""
    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/smoke.yaml").read_text())
    lo, hi = p["eval"]["window"]
    assert (lo, hi) == (4, 8) and p["eval"]["leads"] == hi
    p["sim"].update(n_traj=4, n_val=1, n_test=1, n_frames=30)
    data = make_data(p, np.random.default_rng(0))
    ac = anomaly_autocorrelation(data["train"], data["clim"], hi)[:, 0]
    assert np.all(np.diff(ac[:lo]) < 0)
    assert ac[lo - 2] > 0.55 and 0.3 < ac[lo - 1] < 0.7 and abs(ac[hi - 1]) < 0.2


@pytest.mark.parametrize("padding", ["circular", "zeros"])
def test_single_conv_equals_multibranch_for_both_paddings(padding):
    """The timed blocks: the reference code's zero padding and our periodic one compute the same
    function in the merged and the multi-branch form (and the two paddings differ at the edges)."""
    torch.manual_seed(0)
    a, b = MultiBranchConv(3, padding).double(), SingleConvMultiScale(3, padding).double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    torch.testing.assert_close(b(x), a(x))
    other = MultiBranchConv(3, "zeros" if padding == "circular" else "circular").double()
    other.load_state_dict(a.state_dict())
    assert (other(x) - a(x))[..., 0, :].abs().max() > 1e-3
    torch.testing.assert_close(other(x)[..., 2:-2, 2:-2], a(x)[..., 2:-2, 2:-2])  # same in the interior


@pytest.mark.parametrize("padding", ["circular", "zeros"])
def test_block_speed_reports_the_ratios_and_an_aa_control(padding):
    sp = block_speed(6, 4, 8, 2, repeats=1, target_s=0.002, padding=padding)
    for m in ("fwd", "fwdbwd"):
        np.testing.assert_allclose(sp[f"speedup_{m}"], sp[f"multibranch_{m}_ms"] / sp[f"single_{m}_ms"])
        np.testing.assert_allclose(sp[f"speedup_{m}_aa"], sp[f"multibranch_copy_{m}_ms"] / sp[f"multibranch_{m}_ms"])
        assert sp[f"speedup_{m}_aa"] > 0



def _small_net(seed):
    """A one-block double-precision EMFormer whose zero-initialised output head is made nonzero, so
    that a forecast depends on its inputs and context (the tests compare forecasts)."""
    torch.manual_seed(seed)
    net = EMFormerNet(dim=8, depth=1, heads=2).double()
    for p in net.head.parameters():
        torch.nn.init.normal_(p, std=0.1)
    for b in net.blocks:  # the context gate opened, so that a context changes the forecast
        torch.nn.init.normal_(b.ctx_proj, std=0.3)
    return net

def test_placebo_context_is_another_starts_context():
    """placebo_shift s: forecast b attends to the earlier steps of forecast b - s; shift 0 (or the batch
    size) is the true context."""
    net = _small_net(1)
    x = torch.randn(3, 2, 32, 64, dtype=torch.float64)
    with torch.no_grad():
        true = rollout(net, x, 2, 1)
        torch.testing.assert_close(rollout(net, x, 2, 1, placebo_shift=3), true)
        plac = rollout(net, x, 2, 1, placebo_shift=1)
        torch.testing.assert_close(plac[0], true[0])  # the first step has no context
        _, kv = net(x)
        kv_other = [(torch.roll(k, 1, 0), torch.roll(v, 1, 0)) for k, v in kv]
        want, _ = net(true[0], [kv_other])
        torch.testing.assert_close(plac[1], want)
        assert (plac[1] - true[1]).abs().max() > 1e-6


def test_test_units_are_independent_flows_and_the_placebo_crosses_trajectories():
    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/smoke.yaml").read_text())
    s, e, H = p["sim"], p["eval"], p["finetune"]["history"]
    starts = start_states(s["n_test"], s["n_frames"], e["leads"], e["stride"], H)
    assert s["n_test"] >= 16 and e["stride"] >= e["leads"] and len(starts) >= 64
    assert min(b for _, b in starts) >= H  # the observed history of every start is in its trajectory
    shift = placebo_shift(s["n_frames"], e["leads"], e["stride"], H)
    rolled = [starts[(i - shift) % len(starts)] for i in range(len(starts))]
    assert all(a != b[0] and t == b[1] for (a, t), b in zip(starts, rolled))  # same time, other flow


def test_planted_control_is_the_stated_factor_worse_at_lead_one():
    rng = np.random.default_rng(0)
    data = _toy_data(rng, n_traj=4, n_frames=30)
    net = EMFormerNet(dim=8, depth=1, heads=2)  # persistence through the network path
    starts = start_states(4, 30, 1, 1)
    rmse, _, _, _ = forecast_skill(net, data, 1, 0, starts)
    planted = planted_short_rmse(data, net, starts, 1.075, 0)
    ratio = planted / rmse[:, 0].mean(axis=1)
    assert abs(ratio.mean() - 1.075) < 0.005 and ratio.std() < 0.02


def test_finetune_stops_at_the_gates_plateau_relative_to_its_gain():
    """The fine-tuning rule (shared PlateauRun) stops where the gate's range-scaled test holds, keeps
    the best-validation weights, pilots every rate of the grid from the same pretrained weights and
    continues the one with the best pilot score (the shared rule's tail mean), flagging a grid edge."""
    from reprozoo.claims import plateau
    from reprozoo.methods.emformer.loss import CompositeLoss as CL

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/ci.yaml").read_text())
    p["finetune"]["fit"].update(min_steps=8, max_steps=30, pilot_steps=2, eval_every=1)
    data = make_data(p, np.random.default_rng(0))
    torch.manual_seed(0)
    net = EMFormerNet(dim=8, depth=1, heads=2, patch=4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    out, loss, rec = finetune(net, CL(2), p, data, True, 0, progress=lambda *_: None)
    for k, v in net.state_dict().items():  # the pretrained network itself is left untouched
        torch.testing.assert_close(v, before[k])
    assert set(rec["pilot_best"]) == set(p["finetune"]["fit"]["lr_grid"])
    # the shared rule's ranking: the chosen rate has the lowest pilot score (mean of the second half)
    assert rec["lr"] == min(rec["pilot_best"], key=rec["pilot_best"].get)
    grid = sorted(p["finetune"]["fit"]["lr_grid"])
    assert rec["lr_edge"] == ("top" if rec["lr"] == grid[-1] else "bottom" if rec["lr"] == grid[0] else None)
    assert min(rec["vals"]) <= rec["vals"][0]
    if rec["plateau"]:
        assert plateau(rec["steps"], rec["vals"], p["finetune"]["fit"]["flat_tol"], scale="range")
        assert rec["stop"] >= 8
    else:
        assert rec["stop"] == 30


def test_observation_keeps_the_large_scales_and_drops_the_rest():
    ny, nx = 32, 64
    y, x = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    low = np.cos(2 * np.pi * (2 * y / ny + 5 * x / nx))
    high = np.sin(2 * np.pi * (9 * y / ny + 3 * x / nx)) + np.cos(2 * np.pi * (1 * y / ny + 20 * x / nx))
    f = (low + high)[None, None, None].astype(np.float32)
    obs = observe(f, (3, 6))
    np.testing.assert_allclose(obs[0, 0, 0], low, atol=1e-5)
    np.testing.assert_allclose(observe(obs, (3, 6)), obs, atol=1e-5)  # a projection


def _ar_fields(coef, n_traj, n_frames, seed):
    """psi = a(t) cos(2 pi x / nx) + b(t) sin(...), (a, b) a linear AR process with lag coefficients coef."""
    rng = np.random.default_rng(seed)
    z = np.zeros((n_traj, n_frames + 50, 2))
    for t in range(2, z.shape[1]):
        z[:, t] = sum(c * z[:, t - 1 - i] for i, c in enumerate(coef)) + rng.standard_normal((n_traj, 2))
    z = z[:, 50:]
    x = np.arange(16)
    cx, sx = np.cos(2 * np.pi * x / 16), np.sin(2 * np.pi * x / 16)
    psi = z[..., 0, None] * cx + z[..., 1, None] * sx
    psi = np.broadcast_to(psi[..., None, :], (*psi.shape[:2], 8, 16))
    return np.stack([psi, psi], axis=2).astype(np.float32)


@pytest.mark.parametrize("coef,markov", [((0.8,), True), ((1.2, -0.5), False)])
def test_lookback_gain_sees_a_second_lag_and_not_a_markov_process(coef, markov):
    data = {k: _ar_fields(coef, n, 200, i) for i, (k, n) in enumerate((("train", 6), ("val", 2), ("test", 4)))}
    g = lookback_gain(data, (1, 2))
    assert g.shape == (4,)
    if markov:
        assert abs(g.mean()) < 0.02
    else:
        assert g.min() > 0.1


def test_observed_history_opens_the_context_and_is_ignored_without_one():
    net = _small_net(2)
    x, h = torch.randn(2, 2, 32, 64, dtype=torch.float64), torch.randn(2, 2, 2, 32, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(rollout(net, x, 2, 0, history=h), rollout(net, x, 2, 0))
        with_h = rollout(net, x, 2, 2, history=h)
        # the history's keys/values are those a forecast step on each observed frame leaves
        _, kv0 = net(h[:, 0])
        _, kv1 = net(h[:, 1], [kv0])
        want, _ = net(x, [kv0, kv1])
        torch.testing.assert_close(with_h[0], want)
        assert (with_h[0] - rollout(net, x, 2, 2)[0]).abs().max() > 1e-6


def test_context_age_embedding_leaves_markov_steps_alone_and_reweights_the_context_by_age():
    """The context keys' age embedding: a Markov step never reads it, so the pretrained (Markov)
    forecaster does not depend on it; with a context of two earlier steps, a nonzero embedding shifts
    each query's attention between the older and the newer entry, so the forecast changes."""
    net = _small_net(3)
    x = torch.randn(2, 2, 32, 64, dtype=torch.float64)
    with torch.no_grad():
        y0, _ = net(x)
        _, kv_a = net(x + 0.5 * torch.randn_like(x))
        _, kv_b = net(x + 0.5 * torch.randn_like(x))
        y_ctx0, _ = net(x, [kv_a, kv_b])
        torch.nn.init.normal_(net.blocks[0].age, std=1.0)
        y_markov, _ = net(x)
        torch.testing.assert_close(y_markov, y0)
        y_ctx, _ = net(x, [kv_a, kv_b])
        assert (y_ctx - y_ctx0).abs().max() > 1e-6


def test_ar2_positive_control_field_is_not_markov_and_forecastable():
    """The planted field of the positive control (the smoke config's AR(2) parameters): a 2-frame linear
    forecaster beats a 1-frame one by a wide margin (the oscillation's phase is in the frame before),
    and persistence loses its skill within the skill window (the oscillation turns), so a Markov
    forecaster has little to offer there and the observed history a lot."""
    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/smoke.yaml").read_text())
    c = {**p["planted"], "n_traj": 12, "n_val": 2, "n_test": 4, "n_frames": 60}
    data = make_ar2_data(c, np.random.default_rng(0))
    shape = (60, 2, c["ny"], c["nx"])
    assert data["train"].shape == (6, *shape) and data["test"].shape == (4, *shape)
    assert abs(float(data["train"].std()) - 1.0) < 0.05
    g = lookback_gain(data, (2, 3))
    assert g.min() > 0.3
    ac = anomaly_autocorrelation(data["train"], data["clim"], 8)[:, 0]
    assert ac[0] > 0.8 and ac[3:].min() < 0.5


def test_linear_window_acc_sees_the_planted_history_and_the_placebo_removes_it():
    """The positive control's description of its data (``linear_window_acc``): on the planted AR(2)
    field (the smoke config's parameters) a 2-frame linear forecaster of the whole field keeps skill in
    the window (leads 4-8) that the Markov 1-frame one lacks, and feeding it another trajectory's frame
    before the start (the placebo) takes that skill away again; on a Markov AR(1) field the second frame
    adds nothing (to fitting noise)."""
    from reprozoo.methods.emformer.method import linear_window_acc

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/smoke.yaml").read_text())
    c = {**p["planted"], "n_traj": 16, "n_val": 2, "n_test": 6, "n_frames": 52}
    data = make_ar2_data(c, np.random.default_rng(0))
    starts = start_states(6, 52, 8, 8, 2)
    shift = placebo_shift(52, 8, 8, 2)
    one, two = linear_window_acc(data, 1, starts, 8, (4, 8)), linear_window_acc(data, 2, starts, 8, (4, 8))
    plac = linear_window_acc(data, 2, starts, 8, (4, 8), shift)
    assert one.shape == two.shape == plac.shape == (len(starts),)
    assert two.mean() > 0.5 and one.mean() < 0.1 and plac.mean() < two.mean() - 0.4
    # a Markov field: x(t+1) = 0.9 x(t) + noise per grid value; the second frame cannot help
    rng = np.random.default_rng(1)
    x = np.zeros((30, 52 + 20, 2, 4, 8))
    for t in range(1, x.shape[1]):
        x[:, t] = 0.9 * x[:, t - 1] + rng.standard_normal(x[:, t].shape)
    from reprozoo.methods.emformer.method import split_standardise

    m = split_standardise(x[:, 20:], 2, 6)
    d1, d2 = linear_window_acc(m, 1, starts, 8, (4, 8)), linear_window_acc(m, 2, starts, 8, (4, 8))
    assert d2.mean() < d1.mean() + 0.02  # no gain from the second frame (ridge noise can only cost)


def test_context_pretraining_reads_the_history_and_plain_pretraining_leaves_the_gate_closed(monkeypatch):
    """``pretrain(..., context=True)`` (the positive control's context-from-scratch reference) trains on
    windows whose observed frames before the input open the context: its gate opens and its forecast
    depends on the history; the plain pretraining never reads a context, so its gate stays exactly 0."""
    from reprozoo.methods.emformer import method as M

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/ci.yaml").read_text())
    c = p["planted"]
    p["sim"] = {**p["sim"], "ny": c["ny"], "nx": c["nx"]}
    p["pretrain"]["fit"] = {**p["pretrain"]["fit"], "lr_grid": [1e-2], "min_steps": 6, "max_steps": 8}
    data = make_ar2_data(c, np.random.default_rng(0))
    seen = []
    real = rollout

    def spy(net, x0, steps, window=0, **kw):
        seen.append((window, None if kw.get("history") is None else tuple(kw["history"].shape)))
        return real(net, x0, steps, window, **kw)

    monkeypatch.setattr("reprozoo.methods.emformer.model.rollout", spy)
    net_c, _, _ = M.pretrain(p, data, "sin", 0, lambda s: None, context=True)
    H, w = p["finetune"]["history"], p["finetune"]["window"]
    assert seen and all(win == w and h is not None and h[1] == H for win, h in seen)
    seen.clear()
    net_m, _, _ = M.pretrain(p, data, "sin", 0, lambda s: None)
    assert seen and all(win == 0 and h is None for win, h in seen)
    assert float(net_m.blocks[0].ctx_proj.abs().max()) == 0.0
    assert float(net_c.blocks[0].ctx_proj.abs().max()) > 0.0
    x0 = torch.from_numpy(data["test"][:, H])
    hist = torch.from_numpy(data["test"][:, :H])
    with torch.no_grad():
        a = real(net_c, x0, 1, w, history=hist)
        b = real(net_c, x0, 1, w, history=torch.flip(hist, dims=[1]) + 1.0)
    assert (a - b).abs().max() > 1e-6


def _record_plateau_runs(monkeypatch) -> list:
    """The learning rate of every ``blocks.fitting.PlateauRun`` built from now on (pilots included)."""
    import reprozoo.blocks.fitting as fitting

    made = []
    real = fitting.PlateauRun

    class Spy(real):
        def __init__(self, model, lr, *a, **k):
            made.append(float(lr))
            super().__init__(model, lr, *a, **k)

    monkeypatch.setattr(fitting, "PlateauRun", Spy)
    return made


def test_finetune_table_rate_trains_without_pilots_and_the_grid_still_pilots(monkeypatch):
    """A variant named in ``finetune.lr`` trains at the table's rate with one PlateauRun (no pilots),
    the same run the grid path continues when the grid holds that rate alone (same batches, stop and
    best weights); a variant the table does not name, or no table, pilots every rate of the grid; a
    table giving the trained placebo another rate than emformer's is refused."""
    from reprozoo.methods.emformer.loss import CompositeLoss as CL
    from reprozoo.methods.emformer.method import finetune_table_rate

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/ci.yaml").read_text())
    p["finetune"]["fit"].update(min_steps=4, max_steps=6, pilot_steps=2, eval_every=1, lr_grid=[3e-4, 1e-3])
    p["finetune"]["lr"] = {"emformer": 3e-4, "placebo_ft": 3e-4}  # 3e-4: not the grid's last rate
    data = make_data(p, np.random.default_rng(0))
    made = _record_plateau_runs(monkeypatch)
    torch.manual_seed(0)
    net = EMFormerNet(dim=8, depth=1, heads=2, patch=4)
    quiet = lambda *_: None  # noqa: E731
    _, _, rec = finetune(net, CL(2), p, data, True, 0, progress=quiet, variant="emformer")
    # the table's rate still records where it sits on the grid it was chosen from (3e-4: the bottom)
    assert made == [3e-4] and rec["lr_source"] == "table" and rec["pilot_best"] == {} and rec["lr_edge"] == "bottom"
    assert rec["lr"] == 3e-4 and set(rec["lrs"]) == {3e-4} and rec["steps"][0] == 0
    # the same rule: equal to the grid path's continued run when the grid holds the table's rate alone
    q = {**p, "finetune": {**p["finetune"], "lr": {}, "fit": {**p["finetune"]["fit"], "lr_grid": [3e-4]}}}
    made.clear()
    _, _, one = finetune(net, CL(2), q, data, True, 0, progress=quiet, variant="emformer")
    assert made == [3e-4] and one["lr_source"] == "grid"
    assert one["vals"] == rec["vals"] and one["stop"] == rec["stop"] and one["plateau"] == rec["plateau"]
    # a variant the table does not name, and no table at all: the grid's pilots, as before
    for variant, cfg in (("rollout_ft", p), ("emformer", {**p, "finetune": {k: v for k, v in p["finetune"].items()
                                                                            if k != "lr"}})):
        made.clear()
        _, _, g = finetune(net, CL(2), cfg, data, variant != "rollout_ft", 0, progress=quiet, variant=variant)
        assert made == [3e-4, 1e-3] and g["lr_source"] == "grid" and set(g["pilot_best"]) == {3e-4, 1e-3}
    made.clear()
    _, _, g = finetune(net, CL(2), p, data, True, 0, progress=quiet)  # no variant given: the grid
    assert made == [3e-4, 1e-3] and g["lr_source"] == "grid"
    with pytest.raises(ValueError, match="placebo"):
        finetune_table_rate({"lr": {"emformer": 1e-3, "placebo_ft": 3e-4}}, "rollout_ft")
    # the committed smoke and ci tables: every fine-tuned variant named, the placebo at emformer's rate
    for scale in ("smoke", "ci"):
        c = yaml.safe_load((Path(__file__).parents[1] / f"src/reprozoo/methods/emformer/configs/{scale}.yaml").read_text())
        t = c["finetune"]["lr"]
        assert set(t) == {"emformer", "placebo_ft", "rollout_ft", "context_ar2"} and t["placebo_ft"] == t["emformer"]
        assert all(float(r) in [float(x) for x in c["finetune"]["fit"]["lr_grid"]] for r in t.values())


def test_trained_placebo_finetune_attends_to_another_samples_context(monkeypatch):
    """placebo=True: the fine-tuning's forecasts read the context of the next sample of the batch
    (placebo_shift 1) in training and validation; the real accumulative fine-tuning reads its own."""
    import reprozoo.methods.emformer.model as model_mod
    from reprozoo.methods.emformer.loss import CompositeLoss as CL

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/ci.yaml").read_text())
    p["finetune"]["fit"].update(min_steps=2, max_steps=2, pilot_steps=1, eval_every=1, lr_grid=[1e-3])
    data = make_data(p, np.random.default_rng(0))
    seen = []
    real_rollout = model_mod.rollout

    def spy(*a, **k):
        seen.append(k.get("placebo_shift", 0))
        return real_rollout(*a, **k)

    monkeypatch.setattr(model_mod, "rollout", spy)
    net = EMFormerNet(dim=8, depth=1, heads=2, patch=4)
    finetune(net, CL(2), p, data, True, 0, progress=lambda *_: None, placebo=True)
    assert seen and set(seen) == {1}
    seen.clear()
    finetune(net, CL(2), p, data, True, 0, progress=lambda *_: None)
    assert seen and set(seen) == {0}


def _opened_net(depth: int):
    """A small forecaster whose zero-initialised head, context gate and age embedding are drawn away
    from zero (so context, placebo and every gradient matter), with a batch of starts and history."""
    torch.manual_seed(depth)
    net = EMFormerNet(dim=8, depth=depth, heads=2)
    for p in net.head.parameters():
        torch.nn.init.normal_(p, std=0.1)
    for b in net.blocks:
        torch.nn.init.normal_(b.ctx_proj, std=0.3)
        torch.nn.init.normal_(b.age, std=0.3)
    return net, torch.randn(3, 2, 32, 64), torch.randn(3, 2, 2, 32, 64)


@pytest.mark.parametrize("depth", [1, 2])
def test_context_opening_frames_skip_only_discarded_work(depth):
    """The observed frames that open the context run only up to their keys/values (``kv_only``): the
    forecast and every gradient are bitwise those of running the whole network on them and discarding
    its output (the committed path until af91adb), real and placebo context."""
    net, x, h = _opened_net(depth)
    full = EMFormerNet.forward

    def run(shift, whole):
        net.zero_grad()
        if whole:
            net.forward = lambda x, c=None, kv_only=False: full(net, x, c)
        try:
            r = rollout(net, x, 3, 2, history=h, placebo_shift=shift)
        finally:
            net.__dict__.pop("forward", None)
        r.square().mean().backward()
        return r.detach(), [p.grad.clone() for p in net.parameters()]

    for shift in (0, 1):
        (a, ga), (b, gb) = run(shift, False), run(shift, True)
        assert torch.equal(a, b)
        assert all(torch.equal(u, v) for u, v in zip(ga, gb))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (norm-wise relative difference)."""
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("n_keys", [128, 256])
def test_attention_fused_kernel_within_1e5_of_reference_math_path(n_keys):
    """``model.attention_math`` (the reference-math operations of ``F.scaled_dot_product_attention``
    without its fully-masked-row guard) is bitwise ``F.scaled_dot_product_attention`` on the block's
    old strided q, k, v layout (which routed torch to that path on CPU; the model's attention until
    this round), and ``model.attention`` (contiguous q, k, v: torch's fused CPU kernel, other rounding)
    gives outputs and gradients within 1e-5 relative of it, for the step's own keys and for a two-entry
    context."""
    import torch.nn.functional as F

    from reprozoo.methods.emformer.model import attention, attention_math

    b, n, d, heads = 4, 128, 16, 2
    assert torch._fused_sdp_choice(*(torch.randn(3, b, heads, n, d // heads).requires_grad_(True))) != 0
    res = []
    for fn in (F.scaled_dot_product_attention, attention_math, attention):
        x = torch.randn(b, 3 * d, n, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
        y = torch.randn(b, 3 * d, n_keys, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
        q = x.transpose(1, 2).reshape(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)[0]
        k, v = y.transpose(1, 2).reshape(b, n_keys, 3, heads, d // heads).permute(2, 0, 3, 1, 4)[1:]
        out = fn(q, k + 0.1, v)
        out.square().sum().backward()
        res.append((out.detach(), x.grad, y.grad))
    assert all(torch.equal(u, v) for u, v in zip(res[0], res[1]))
    assert max(_rel(u, v) for u, v in zip(res[2], res[1])) < 1e-5


@pytest.mark.parametrize("depth", [1, 2])
def test_network_within_1e5_of_reference_math_and_nchw_path(depth, monkeypatch):
    """The whole forecaster (fused attention kernel on contiguous q, k, v, channels-last depthwise
    convolutions: same maths, other rounding) gives forecasts and every gradient within 1e-5 relative
    of the path used until this round (reference-math attention, NCHW convolutions), for context
    rollouts (real and placebo, with observed history) and Markov rollouts."""
    from reprozoo.methods.emformer import model as mdl

    net, x, h = _opened_net(depth)
    conv = mdl._conv

    def run(window, shift, ref):
        if ref:
            monkeypatch.setattr(mdl, "attention", mdl.attention_math)
            monkeypatch.setattr(mdl, "_conv", lambda x, w, g, pad: conv(x.contiguous(), w, g, pad))
        net.zero_grad()
        r = rollout(net, x, 3, window, history=h if window else None, placebo_shift=shift)
        r.square().mean().backward()
        monkeypatch.undo()
        grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
        # row 0 of each age embedding shifts all of a query's keys alike: its gradient is zero in exact
        # arithmetic (rounding noise, about 1e-10 here), compared in absolute terms below
        age0 = [grads.pop(n)[0] for n in list(grads) if n.endswith(".age")]
        return [r.detach()] + list(grads.values()), age0

    for window, shift in ((2, 0), (2, 1), (0, 0)):
        (new, new0), (ref, ref0) = run(window, shift, False), run(window, shift, True)
        assert len(new) == len(ref) == len(net.state_dict()) - depth + 1 - (window == 0) * depth
        assert max(float(a.abs().max()) for a in new0 + ref0) < 1e-7
        assert max(_rel(u, v) for u, v in zip(new, ref)) < 1e-5


def test_pretrain_table_rate_trains_without_pilots_and_matches_the_grids_continued_run(monkeypatch):
    """``pretrain.lr`` (the smoke's per-field table): the named field trains at the table's rate in one
    PlateauRun, the very run the grid path continues when it chooses that rate (same initial weights,
    batches, stop and validation curve: the pilots of the other rates only cost); no ``field`` or no
    entry pilots every rate of the grid, and a table rate records its place on the grid."""
    from reprozoo.methods.emformer.method import pretrain

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/emformer/configs/ci.yaml").read_text())
    p["pretrain"]["fit"].update(min_steps=4, max_steps=6, pilot_steps=2, eval_every=1, lr_grid=[3e-3, 1e-2])
    p["pretrain"]["lr"] = {"qg": 1e-2}
    data = make_data(p, np.random.default_rng(0))
    made = _record_plateau_runs(monkeypatch)
    quiet = lambda *_: None  # noqa: E731
    _, _, rec = pretrain(p, data, "sin", 0, quiet, field="qg")
    # one run (its "pilot" is its own first steps) at the table's rate, the grid's top
    assert made == [1e-2] and rec["lr_source"] == "table" and set(rec["pilot_best"]) == {1e-2} and rec["lr_edge"] == "top"
    made.clear()
    _, _, grid = pretrain(p, data, "sin", 0, quiet)  # no field: the grid's pilots
    assert made == [3e-3, 1e-2] and grid["lr_source"] == "grid" and set(grid["pilot_best"]) == {3e-3, 1e-2}
    made.clear()
    _, _, other = pretrain(p, data, "sin", 0, quiet, field="ar2")  # a field the table does not name
    assert made == [3e-3, 1e-2] and other["lr_source"] == "grid"
    if grid["lr"] == 1e-2:  # the grid chose the table's rate: the continued run is the table's run
        assert grid["vals"] == rec["vals"] and grid["stop"] == rec["stop"]
    one = {**p, "pretrain": {**p["pretrain"], "lr": {}, "fit": {**p["pretrain"]["fit"], "lr_grid": [1e-2]}}}
    made.clear()
    _, _, same = pretrain(one, data, "sin", 0, quiet)
    assert made == [1e-2] and same["vals"] == rec["vals"] and same["stop"] == rec["stop"]
