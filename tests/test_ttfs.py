"""TTFS framework numerics: encoding, the closed-form init, the folded normalisation, the temporal
decoder's time weights, and the single-spike property under average vs max pooling."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reprozoo.methods.ttfs import data as D
from reprozoo.methods.ttfs.ttfs_net import (FinalPotentialNorm, TTFSNet, encode, pooled_moments,
                                            spike_statistics, ttfs_init_moments)


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


def test_final_potential_norm_standardises_V_T_and_is_causal():
    torch.manual_seed(1)
    T, C = 6, 3
    norm = FinalPotentialNorm(C, T, gamma0=0.7, beta0=1.3)
    cur = torch.randn(T, 32, C, 4, 4) * 3 + 2
    out = norm(cur)
    vT = out.sum(0)
    np.testing.assert_allclose(vT.mean((0, 2, 3)).detach(), 1.3, atol=1e-5)
    np.testing.assert_allclose(vT.std((0, 2, 3), unbiased=False).detach(), 0.7, atol=1e-3)
    # causal: changing the current at step t only changes outputs at step t
    cur2 = cur.clone()
    cur2[4] += 1.0
    norm.eval()
    d = (norm(cur2) - norm(cur)).abs().sum((1, 2, 3, 4))
    assert torch.all(d[:4] == 0) and d[4] > 0 and d[5] == 0


def test_temporal_decoder_weights_early_spikes_more():
    """mean_t U_t = sum_t c_t (T - t)/T, c_t the per-step output current; final decoder: weights 1."""
    torch.manual_seed(2)
    T = 8
    net = TTFSNet((1, 8, 8), (4, 8), T=T, init="ttfs", decoder="temporal", p_in=0.5)
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        out = net(x)
        c = net.fc(out["sent"][-1].flatten(2))  # (T, B, K)
        w = (T - torch.arange(T, dtype=torch.float32)) / T
        np.testing.assert_allclose(out["logits"], (w.view(T, 1, 1) * c).sum(0), atol=1e-5)
        np.testing.assert_allclose(out["U"][-1], c.sum(0), atol=1e-5)


def test_avg_pooling_keeps_single_spike_max_pooling_breaks_it():
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
