"""TTFS framework numerics: encoding, the closed-form init, the weight normalisation with learnable
affine, the temporal decoder's time weights, and the single-spike property under average vs max
pooling (max pooling breaks it by construction: a test here, not a claim)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reprozoo.methods.ttfs import data as D
from reprozoo.methods.ttfs import method as M
from reprozoo.methods.ttfs.ttfs_net import (TTFSNet, WNConv2d, encode, pooled_moments, spike_statistics,
                                            temporal_weights, ttfs_init_moments)


def test_encoding_fires_once_bright_first():
    x = torch.tensor([[[[1.0, 0.5, 0.0, 0.25]]]])
    s = encode(x, T=9)  # (T, B, C, H, W)
    assert s.shape == (9, 1, 1, 1, 4)
    assert torch.all(s.sum(0) <= 1)
    t = s[:, 0, 0, 0].argmax(0)
    assert t[0] == 0 and t[1] == 4 and t[3] == 6  # round((1 - x)(T - 1))
    assert s[:, 0, 0, 0, 2].sum() == 0  # a zero pixel never fires


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_init_moments_give_target_final_potential(pool):
    """Monte Carlo of V_T = sum_j w_j a_j with iid N(mu, sd) weights and inputs of moments m1, m2."""
    g = torch.Generator().manual_seed(0)
    n, p, k = 72, 0.5, 4
    m1, m2 = pooled_moments(p, "avg", k) if pool == "avg" else (p, p)
    mu, sd = ttfs_init_moments(n, m1, m2, kappa=1.0, rho=1.0)
    fired = (torch.rand(20000, n, k, generator=g) < p).float()
    a = fired.mean(2) if pool == "avg" else fired[..., 0]
    # empirical input moments match pooled_moments
    assert abs(float(a.mean()) - m1) < 0.01 and abs(float((a**2).mean()) - m2) < 0.01
    w = mu + sd * torch.randn(20000, n, generator=g)
    v = (w * a).sum(1)
    assert abs(float(v.mean()) - 1.0) < 0.03 and abs(float(v.std()) - 1.0) < 0.03


def test_ttfs_init_keeps_deep_layers_firing_default_does_not():
    """Signal diminishing: with PyTorch's default init a 3-block net's last layer is nearly silent."""
    torch.manual_seed(0)
    x = (torch.rand(256, 1, 16, 16) < 0.5).float() * torch.rand(256, 1, 16, 16)
    p_in = float((x > 0).float().mean())
    frac = {}
    for init in ("default", "ttfs"):
        net = TTFSNet((1, 16, 16), (8, 16, 16), T=8, init=init, p_in=p_in)
        with torch.no_grad():
            frac[init] = spike_statistics(net(x), 8)["fire_frac_last"]
    assert frac["ttfs"] > 0.3 and frac["default"] < 0.1, frac


def test_weight_norm_starts_at_the_init_and_holds_the_affine_moments():
    """W_c = γ_c (v_c - mean v_c)/std v_c + β_c: at construction W = the initialised conv weight; after
    any change of v, every channel's weight mean and std are exactly β and γ."""
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(3, 5, 3, padding=1)
    with torch.no_grad():
        conv.weight.normal_(0.2, 0.3)
    wn = WNConv2d(conv)
    x = torch.rand(4, 3, 6, 6)
    np.testing.assert_allclose(wn(x).detach(), conv(x).detach(), atol=1e-5)
    with torch.no_grad():
        wn.v.mul_(torch.rand(5, 1, 1, 1) * 3 + 0.1).add_(torch.randn_like(wn.v))
        wn.gamma.copy_(torch.tensor([0.5, 1.0, 2.0, 0.1, 0.7]))
        wn.beta.copy_(torch.tensor([-0.3, 0.0, 0.4, 1.0, 0.05]))
    w = wn.weight.detach()
    np.testing.assert_allclose(w.mean((1, 2, 3)), wn.beta.detach(), atol=1e-6)
    np.testing.assert_allclose(w.std((1, 2, 3), unbiased=False), wn.gamma.detach(), atol=1e-5)


def test_weight_norm_is_invariant_to_affine_changes_of_v_and_its_gradient_is_orthogonal():
    """W depends on v only through its standardisation, so scaling or shifting a channel's v changes
    nothing, and the gradient wrt v has zero sum and is orthogonal to v - mean(v) per channel."""
    torch.manual_seed(2)
    wn = WNConv2d(torch.nn.Conv2d(2, 3, 3, padding=1))
    x = torch.rand(3, 2, 5, 5)
    y0 = wn(x).detach()
    with torch.no_grad():
        wn.v.mul_(4.0).add_(0.7)
    np.testing.assert_allclose(wn(x).detach(), y0, atol=1e-5)
    (wn(x) ** 2).sum().backward()
    g, v = wn.v.grad, wn.v.detach()
    vc = v - v.mean((1, 2, 3), keepdim=True)
    assert float(g.sum((1, 2, 3)).abs().max()) < 1e-4
    assert float((g * vc).sum((1, 2, 3)).abs().max()) < 1e-3 * float(g.abs().sum())
    assert float(wn.gamma.grad.abs().sum()) > 0 and float(wn.beta.grad.abs().sum()) > 0


def test_temporal_decoder_weights_early_spikes_more():
    """logits = Σ_t w_t U_t with w_t = (T - t)/Σ(T - s): a current at step τ weighs
    W_τ = (T - τ)(T - τ + 1)/(T (T + 1)), strictly falling; the final decoder weighs every step 1."""
    torch.manual_seed(2)
    T = 8
    w = temporal_weights(T)
    assert abs(float(w.sum()) - 1) < 1e-6 and torch.all(w[1:] < w[:-1])
    net = TTFSNet((1, 8, 8), (4, 8), T=T, init="ttfs", decoder="temporal", p_in=0.5)
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        out = net(x)
        c = net.fc(out["sent"][-1].flatten(2))  # (T, B, K) per-step output current
        tau = torch.arange(T, dtype=torch.float32)
        W = (T - tau) * (T - tau + 1) / (T * (T + 1))
        np.testing.assert_allclose(out["logits"], (W.view(T, 1, 1) * c).sum(0), atol=1e-5)
        np.testing.assert_allclose(out["U"][-1], c.sum(0), atol=1e-5)
    assert torch.all(W[1:] < W[:-1])


def test_avg_pooling_keeps_single_spike_max_pooling_breaks_it():
    """The paper's pooling argument, which holds by construction (so it is a test, not a claim):
    every IF neuron fires at most once, average pooling is linear so its sending units are those
    neurons, while a max-pooled unit sends a spike whenever any neuron of its window fires."""
    torch.manual_seed(3)
    x, _ = D.glyphs(64, np.random.default_rng(0))
    x = torch.from_numpy(x)
    stats = {}
    for pool in ("avg", "max"):
        net = TTFSNet((1, 8, 8), (8, 16), T=8, init="ttfs", norm=True, decoder="temporal", pool=pool, p_in=0.5)
        with torch.no_grad():
            out = net(x)
        assert all(torch.all(s.sum(0) <= 1) for s in out["spikes"])  # IF neurons fire at most once
        stats[pool] = spike_statistics(out, 8)
    assert stats["avg"]["max_spikes_per_unit"] <= 1.0 and stats["avg"]["frac_multi_spike"] == 0.0
    assert stats["max"]["max_spikes_per_unit"] > 1.0 and stats["max"]["frac_multi_spike"] > 0.0
    # closed case: four neurons of one window firing at steps 0..3 -> the max-pooled unit spikes 4 times
    s = torch.zeros(4, 1, 2, 2)
    s[0, 0, 0, 0] = s[1, 0, 0, 1] = s[2, 0, 1, 0] = s[3, 0, 1, 1] = 1
    assert float(F.max_pool2d(s, 2).sum()) == 4.0 and float(F.avg_pool2d(s, 2).sum()) == 1.0


def test_frac_multi_spike_is_measured_not_assumed():
    """spike_statistics counts the sending units' spikes: a planted double spike in an avg-pooled
    network's senders is found (the 0.0 of a real avg-pooled network is a measurement)."""
    torch.manual_seed(5)
    net = TTFSNet((1, 8, 8), (4, 8), T=6, init="ttfs", pool="avg", p_in=0.5)
    with torch.no_grad():
        out = net(torch.rand(8, 1, 8, 8))
    base = spike_statistics(out, 6)
    planted = dict(out)
    s0 = out["senders"][0].clone()
    s0[:, 0, 0, 0, 0] = 0
    s0[1, 0, 0, 0, 0] = s0[4, 0, 0, 0, 0] = 1  # one unit, one example: two spikes
    planted["senders"] = [s0] + list(out["senders"][1:])
    st = spike_statistics(planted, 6)
    n_pairs = 8 * sum(a[0, 0].numel() for a in out["senders"])
    assert base["frac_multi_spike"] == 0.0
    assert st["max_spikes_per_unit"] == 2.0 and abs(st["frac_multi_spike"] - 1.0 / n_pairs) < 1e-9


def test_training_stops_at_a_plateau_the_gate_accepts():
    """Every variant trains by the shared rule (blocks.fitting.fit_to_plateau): the recorded validation
    curve is flat by the gate's test where the run stopped before max_steps, the rate was dropped once
    after the first plateau, and the speed metric reads the fixed speed_window."""
    from reprozoo.claims import plateau

    class Collect:
        def __init__(self):
            self.s, self.c = {}, {}

        def scalar(self, k, v):
            self.s[k] = v

        def units(self, k, v):
            self.s[k] = float(np.mean(v))

        def curve(self, k, x, y):
            self.c[k] = (x, y)

    x, y = D.glyphs(300, np.random.default_rng(1), noise=0.1)
    arrays = D.split(x, y, np.random.default_rng(2))
    params = dict(T=4, channels=[4, 4, 8], pool_after=[1, 2], kappa=1.0, rho=1.0, surrogate_alpha=2.0, batch=32,
                  fit=dict(lr_grid=[1e-2, 3e-2], pilot_steps=20, eval_every=4, min_steps=40, max_steps=1000,
                           flat_tol=0.02), speed_window=20)
    m = Collect()
    M.fit_and_measure("glyphs", arrays, M.VARIANTS["full"], params, 0, m, lambda s: None)
    steps, vl = m.c["val_loss_glyphs"]
    lrs = m.c["lr_glyphs"][1]
    assert m.s["steps_glyphs"] == steps[-1] and steps[-1] < 1000  # it stopped early
    assert plateau(steps, vl, 0.02)  # the gate accepts the stop
    assert min(lrs) == pytest.approx(0.1 * max(lrs)) and lrs[0] == max(lrs)  # one drop to a tenth
    assert m.s["lr_peak_glyphs"] in (1e-2, 3e-2)
    va = m.c["val_acc_glyphs"][1]
    assert m.s["mean_val_acc_glyphs"] == pytest.approx(np.mean([a for s_, a in zip(steps, va) if s_ <= 20]))
    assert m.s["acc_glyphs"] > 0.3
    assert 0 <= m.s["decision_glyphs"] <= 3 and m.s["latency_all_glyphs"] >= m.s["latency_fired_glyphs"] - 1e-9
    # the decision floor (the last hidden layer's first spike) and the grid's record
    assert 0 <= m.s["decision_floor_glyphs"] <= 4 and 0 <= m.s["frac_decided_before_onset_glyphs"] <= 1
    assert m.s["lr_edge_glyphs"] in (-1.0, 0.0, 1.0)
    xs, ys = m.c["lr_pilot_glyphs"]
    assert xs == pytest.approx([-2.0, np.log10(3e-2)]) and len(ys) == 2


def test_fixed_rate_comes_from_the_selection_grid_and_reports_its_edge():
    """lr_fixed replaces the grid by one rate that must be in the selection grid (fit.lr_grid); its place
    there is reported (bottom / top / inside); without an entry the grid runs unchanged."""
    params = dict(fit=dict(lr_grid=[1e-3, 3e-3, 1e-2], pilot_steps=5, eval_every=1, min_steps=5, max_steps=9,
                           flat_tol=0.01),
                  lr_fixed={"digits": {"full": 1e-3, "init": 3e-3, "plain": 1e-2}})
    for v, edge in (("full", "bottom"), ("init", None), ("plain", "top")):
        f = M.fit_config(params, "digits", v)
        assert f["lr_grid"] == [params["lr_fixed"]["digits"][v]] and f["_edge"] == edge and f["_fixed"]
    f = M.fit_config(params, "glyphs", "full")
    assert f["lr_grid"] == [1e-3, 3e-3, 1e-2] and not f["_fixed"]
    with pytest.raises(ValueError):
        M.fit_config(dict(params, lr_fixed={"digits": {"full": 5e-3}}), "digits", "full")


def test_shallow_references_train_on_digits_only():
    """The depth precondition reads digits only, so the 2-layer references train nothing else."""
    for v in ("plain_shallow", "init_shallow"):
        assert M.VARIANTS[v]["datasets"] == ("digits",) and M.VARIANTS[v]["shallow"]
    assert M.VARIANTS["init_shallow"]["init"] == "ttfs" and M.VARIANTS["plain_shallow"]["init"] == "default"


def test_decision_time_is_the_step_from_which_the_readout_stays_on_its_final_class():
    """decision_time: the earliest t with argmax(partial_t') = final prediction for every t' >= t."""
    from reprozoo.methods.ttfs.ttfs_net import decision_time

    p = torch.zeros(4, 3, 2)  # T = 4, three examples, two classes
    p[:, 0, 0] = 1.0                            # always class 0: decided at 0
    p[:, 1, 1] = torch.tensor([1., -1, 1, 1])    # class 1 at t = 0, 2, 3: decided at 2
    p[:, 2, 0] = torch.tensor([-1., -1, -1, 1])  # class 0 only at the last step: 3
    assert decision_time(p).tolist() == [0.0, 2.0, 3.0]


def test_every_readout_starts_at_the_same_logit_scale():
    """Scale-neutral readout: the temporal decoder is rescaled at construction so that its initial logit
    std equals the final-potential readout's of the same network; every variant has one learnable output
    gain started at 1; the partial readout's last step is the logits."""
    x, _ = D.glyphs(256, np.random.default_rng(3))
    x = torch.from_numpy(x)
    std = {}
    for dec in ("final", "temporal"):
        torch.manual_seed(6)
        net = TTFSNet((1, 8, 8), (4, 4, 8), T=6, init="ttfs", decoder=dec, p_in=0.5, pool_after=[1, 2])
        k = net.calibrate_decoder(x)
        assert (k == 1.0) if dec == "final" else (k > 1.0)  # late spikes weigh less: the decoder is scaled up
        assert isinstance(net.gain, torch.nn.Parameter) and float(net.gain.detach()) == 1.0
        with torch.no_grad():
            out = net(x)
        np.testing.assert_allclose(out["partial"][-1], out["logits"])
        std[dec] = float(out["logits"].std())
    assert abs(std["temporal"] / std["final"] - 1) < 1e-4, std


def test_pool_placement_and_init_keep_a_deep_stack_firing():
    """Pooling after chosen layers only (8x8 -> 8x8 -> 4x4 -> 4x4 -> 2x2); the TTFS init keeps the
    fourth layer firing, the default init leaves layers 2-4 (nearly) silent: the deep miniature has the
    signal-diminishing problem the paper addresses."""
    x, _ = D.digits()
    x = torch.from_numpy(x[:256])
    p_in = float((x > 0).float().mean())
    frac = {}
    for init in ("default", "ttfs"):
        torch.manual_seed(0)
        net = TTFSNet((1, 8, 8), (8, 8, 16, 16), T=6, init=init, p_in=p_in, pool_after=[1, 3])
        with torch.no_grad():
            out = net(x)
        assert [tuple(s.shape[-2:]) for s in out["spikes"]] == [(8, 8), (8, 8), (4, 4), (4, 4)]
        assert [tuple(a.shape[-2:]) for a in out["sent"]] == [(8, 8), (4, 4), (4, 4), (2, 2)]
        assert net.fc.in_features == 16 * 2 * 2
        frac[init] = spike_statistics(out, 6)["fire_frac_last"]
    assert frac["ttfs"] > 0.15 and frac["default"] < 0.02, frac


def test_single_spike_neuron_gets_surrogate_gradient_before_firing():
    """Training signal reaches a silent layer through the surrogate (no vanishing to exactly 0)."""
    torch.manual_seed(4)
    net = TTFSNet((1, 8, 8), (4, 8), T=6, init="ttfs", p_in=0.5)
    x = torch.rand(16, 1, 8, 8)
    loss = F.cross_entropy(net(x)["logits"], torch.randint(0, 10, (16,)))
    loss.backward()
    assert all(float(c.weight.grad.abs().sum()) > 0 for c in net.convs)


def test_glyphs_are_deterministic_and_separable():
    a, ya = D.glyphs(600, np.random.default_rng(5))
    b, yb = D.glyphs(600, np.random.default_rng(5))
    assert np.array_equal(a, b) and np.array_equal(ya, yb) and a.min() >= 0 and a.max() <= 1
    # nearest class mean on half the set classifies the other half well: the classes can answer
    xa, xb = a[:300].reshape(300, -1), a[300:].reshape(300, -1)
    means = np.stack([xa[ya[:300] == k].mean(0) for k in range(10)])
    pred = np.argmin(((xb[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == ya[300:]).mean() > 0.6


def test_rates_are_piloted_on_a_seed_no_claim_reads():
    """Cold review of 706c67a (F2): the fixed rates come from the pilot seed (pilot.py), not a claim
    seed; the piloted rates are rates of the selection grid, and every fixed rate is one of them."""
    import yaml
    from pathlib import Path

    p = yaml.safe_load((Path(M.__file__).parent / "configs" / "smoke.yaml").read_text())
    assert p["pilot_seed"] not in p["seeds"]
    assert set(p["pilot_grid"]) <= set(p["fit"]["lr_grid"])
    for rates in p["lr_fixed"].values():
        assert set(rates.values()) <= set(p["pilot_grid"])
