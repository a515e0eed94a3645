"""TFMPE numerics: analytic posterior, exact call counting, token masks, equivariance, CFM target, LF recovery."""
import numpy as np
import pytest
import torch

from reprozoo.blocks.gen_metrics import expected_coverage, sbc_ranks
from reprozoo.methods.tfmpe.simulators import HierarchicalGaussian, HierarchicalSIR
from reprozoo.methods.tfmpe.tokenised_fm import (SIGMA_MIN, Layout, TokenVelocityField, cfm_loss, fit_cfm,
                                                 sample_cfm)


def test_analytic_posterior_equals_gaussian_conditioning():
    """Closed form (precision) vs conditioning the joint Gaussian of (z, x) directly."""
    m = HierarchicalGaussian(s_mu=1.3, tau=0.7, sigma=0.4, replicates=3)
    s, k = 4, 3
    x = np.random.default_rng(0).normal(size=(s, k))
    mean, cov = m.posterior(x)
    czz = m.prior_cov(s)
    h = np.kron(np.eye(s), np.ones((k, 1)))             # x_sk = theta_s + noise
    a = np.hstack([np.zeros((s * k, 1)), h])
    cxx = a @ czz @ a.T + m.sigma**2 * np.eye(s * k)
    czx = czz @ a.T
    np.testing.assert_allclose(mean, czx @ np.linalg.solve(cxx, x.ravel()), rtol=1e-10)
    np.testing.assert_allclose(cov, czz - czx @ np.linalg.solve(cxx, czx.T), atol=1e-12)


@pytest.mark.parametrize("model", [HierarchicalGaussian(), HierarchicalSIR()])
def test_simulator_calls_are_counted_per_site(model):
    rng = np.random.default_rng(1)
    model.sample_prior(50, 7, rng)                       # prior draws are free
    assert model.calls == 0
    g, l, x = model.sample_joint(6, 7, rng)
    assert model.calls == 42 and x.shape == (6, 7, model.X)
    model.simulate(g[:2], l[:2, :1], rng)
    assert model.calls == 44


def test_site_simulations_are_independent_of_grouping():
    """Likelihood factorisation: the same site parameters give the same site law alone or in a group."""
    m = HierarchicalSIR()
    g = np.tile([[-0.2, -1.1]], (4000, 1))
    l = np.full((4000, 1, 1), 0.1)
    solo = m.simulate(g, l, np.random.default_rng(2))[:, 0]
    grouped = m.simulate(g[:800], np.full((800, 5, 1), 0.1), np.random.default_rng(3)).reshape(-1, m.X)
    np.testing.assert_allclose(solo.mean(0), grouped.mean(0), atol=0.06)


def test_sbc_coverage_separates_exact_from_overconfident_posterior():
    m, rng = HierarchicalGaussian(), np.random.default_rng(4)
    g, l, x = m.sample_joint(300, 3, rng)
    truth = np.concatenate([g, l[..., 0]], 1)
    exact, narrow = [], []
    for xi in x:
        mean, cov = m.posterior(xi)
        d = rng.standard_normal((50, 4)) @ np.linalg.cholesky(cov).T
        exact.append(mean + d)
        narrow.append(mean + 0.5 * d)
    errs = []
    for draws in (exact, narrow):
        lv, cov = expected_coverage(sbc_ranks(truth, np.array(draws)), 50)
        errs.append(np.abs(cov - lv[:, None]).mean())
    assert errs[0] < 0.04 < 0.1 < errs[1]


def test_layout_masks_and_round_trip():
    lay = Layout(G=2, Lp=1, X=3)
    g, l, x = torch.randn(5, 2), torch.randn(5, 4, 1), torch.randn(5, 4, 3)
    tok = lay.pack(g, l, x)
    assert tok.shape == (5, 5, 4)
    for a, b in zip(lay.unpack(tok), (g, l, x)):
        torch.testing.assert_close(a, b)
    pres, gen = lay.masks(4, "posterior")
    assert gen.sum() == 2 + 4 and pres.sum() == 2 + 4 * 4
    pres, gen = lay.masks(1, "likelihood")
    assert gen.sum() == 3 and gen[0].sum() == 0 and (gen <= pres).all()


def test_velocity_field_is_site_permutation_equivariant_and_masked():
    torch.manual_seed(0)
    lay = Layout(1, 1, 2)
    net = TokenVelocityField(lay.D, dim=16, depth=2, heads=2).eval()
    for s in (3, 6):                                      # one network, any number of sites
        pres, gen = lay.masks(s, "posterior")
        x, t = torch.randn(4, 1 + s, lay.D), torch.rand(4)
        perm = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(s)])
        with torch.no_grad():
            v, vp = net(x, t, pres, gen), net(x[:, perm], t, pres, gen)
        torch.testing.assert_close(vp, v[:, perm], atol=1e-5, rtol=1e-5)
        assert torch.all(v[gen.expand_as(v) == 0] == 0)


def test_cfm_loss_vanishes_at_exact_velocity_of_a_point_target():
    """For x1 = c fixed, the conditional path is deterministic given z: u = c - (1 - sigma_min) z,
    and the field v(x, t) = (c - (1 - sigma_min) x) / (1 - (1 - sigma_min) t) reproduces it exactly."""
    lay = Layout(1, 1, 2)
    pres, gen = lay.masks(3, "posterior")
    c = torch.randn(1, 4, lay.D).expand(32, -1, -1)

    class Exact(torch.nn.Module):
        def forward(self, x, t, present, g):
            return (c - (1 - SIGMA_MIN) * x) / (1 - (1 - SIGMA_MIN) * t[:, None, None]) * g

    z, t = torch.randn(32, 4, lay.D), torch.rand(32)
    assert float(cfm_loss(Exact(), c, pres, gen, z, t)) < 1e-10
    assert float(cfm_loss(Exact(), c + 0.1 * gen, pres, gen, z, t)) > 1e-3


def test_learned_site_likelihood_recovers_the_gaussian_site_model():
    """Planted signal: x | theta ~ N(theta, 0.5^2 I_2); the tokenised likelihood must learn slope 1, sd 0.5,
    and sampling must leave the conditioning entries untouched."""
    torch.manual_seed(0)
    m, rng, gen = HierarchicalGaussian(), np.random.default_rng(5), torch.Generator().manual_seed(5)
    lay = Layout(1, 1, 2)
    g, l, x = m.sample_joint(800, 1, rng)
    tok = lay.pack(*(torch.as_tensor(a, dtype=torch.float32) for a in (g, l, x)))
    pres, genm = lay.masks(1, "likelihood")
    net = TokenVelocityField(lay.D, dim=32, depth=1, heads=2)
    fit_cfm(net, tok, pres, genm, steps=350, batch=64, lr=3e-3, val_frac=0.1, eval_every=50, generator=gen)
    g2, l2 = m.sample_prior(2000, 1, rng)
    ctx = lay.pack(torch.as_tensor(g2).float(), torch.as_tensor(l2).float(), torch.zeros(2000, 1, 2))
    out = sample_cfm(net, ctx, pres, genm, 8, gen)
    torch.testing.assert_close(out[:, :, :2][..., :1], ctx[:, :, :2][..., :1])
    xs = lay.unpack(out)[2][:, 0].double().numpy()
    slope = np.polyfit(l2[:, 0, 0], xs.mean(1), 1)[0]
    resid = xs - l2[:, 0]
    assert abs(slope - 1) < 0.1
    assert np.all(np.abs(resid.std(0) - 0.5) < 0.08) and np.all(np.abs(resid.mean(0)) < 0.1)
