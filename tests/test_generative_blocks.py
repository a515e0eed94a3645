"""Shared generative / SBI blocks: Boltzmann targets, MALA, zuko flows, metrics.

Each test checks a closed form, an invariance or a known value, so a wrong energy, a wrong
Metropolis ratio, a missing Jacobian term or a mis-normalised metric fails.
"""
import math

import numpy as np
import pytest
import torch

from reprozoo.blocks import boltzmann as B
from reprozoo.blocks import flows as F
from reprozoo.blocks import gen_metrics as M

torch.set_num_threads(1)
D64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- Boltzmann targets

def test_gmm_energy_is_exact_negative_log_density_of_dataset_mixture():
    from reprozoo.data.synthetic.gmm import make

    gm = make(5, 2.0, 2, np.random.default_rng(3))
    tgt = B.GaussianMixtureTarget.from_dataset(gm)
    x = np.random.default_rng(0).normal(size=(50, 2)) * 2
    np.testing.assert_allclose(-tgt.energy(torch.tensor(x)).numpy(), gm.log_prob(x), rtol=1e-10, atol=1e-10)
    # normalised: the grid integral of exp(-E) is 1
    g = torch.linspace(-5, 5, 401, dtype=D64)
    xx = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    assert abs(float(torch.exp(tgt.log_prob(xx)).sum() * (g[1] - g[0]) ** 2) - 1) < 1e-4
    # exact sampler: mixture mean
    s = tgt.sample_reference(20000, _gen(1))
    mix_mean = (gm.weights[:, None] * gm.means).sum(0)
    assert np.abs(s.mean(0).numpy() - mix_mean).max() < 0.05


def test_gmm_fab_recipe():
    tgt = B.GaussianMixtureTarget.fab()
    assert tgt.means.shape == (40, 2) and tgt.means.abs().max() <= 40
    std = math.log1p(math.e)  # softplus(1)
    # far from all other modes the density at a mode centre is w_k N(0; 0, std^2 I) (+ tiny overlap)
    k = int(torch.cdist(tgt.means, tgt.means).add(torch.eye(40) * 1e9).min(1).values.argmax())
    e = float(tgt.energy(tgt.means[k:k + 1]))
    assert abs(e - (math.log(40) + math.log(2 * math.pi * std**2))) < 1e-3


def _dw_pair(d):
    r = d - 4.0
    return 0.9 * r**4 - 4.0 * r**2


def test_dw4_energy_hand_computed():
    dw = B.DoubleWell4()
    s = 3.0  # square of side 3: four sides d = 3, two diagonals d = 3 sqrt 2
    sq = torch.tensor([[0, 0, s, 0, s, s, 0, s]], dtype=D64)
    expect = 4 * _dw_pair(s) + 2 * _dw_pair(s * math.sqrt(2))
    assert abs(float(dw.energy(sq)) - expect) < 1e-12
    # collinear, spacing 4: pairs at 4, 4, 4, 8, 8, 12
    line = torch.tensor([[0, 0, 4, 0, 8, 0, 12, 0]], dtype=D64)
    assert abs(float(dw.energy(line)) - (3 * _dw_pair(4) + 2 * _dw_pair(8) + _dw_pair(12))) < 1e-10
    assert dw.dim == 8 and dw.n_particles == 4 and dw.spatial_dim == 2
    # the pair minima sit at d0 +- sqrt(-b / 2a)
    dmin = 4 + math.sqrt(4 / 1.8)
    two = B.DoubleWell4(n_particles=2)
    e = [float(two.energy(torch.tensor([[0, 0, d, 0]], dtype=D64))) for d in (dmin - 1e-3, dmin, dmin + 1e-3)]
    assert e[1] < e[0] and e[1] < e[2]


def test_lj_energy_hand_computed_and_lj13_icosahedron_minimum():
    two = B.LennardJones13(n_particles=2)
    x = torch.tensor([[-0.5, 0, 0, 0.5, 0, 0]], dtype=D64)
    # pair at rm: LJ = -eps; harmonic 1/2 * (0.25 + 0.25)
    assert abs(float(two.energy(x)) - (-1.0 + 0.25)) < 1e-12
    x2 = torch.tensor([[0, 0, 0, 2.0, 0, 0]], dtype=D64)
    assert abs(float(two.lj_energy(x2)) - (2.0**-12 - 2 * 2.0**-6)) < 1e-14
    # LJ13's global minimum is the centred icosahedron, -44.3268 eps (Wales & Doye 1997)
    phi = (1 + 5**0.5) / 2
    v = []
    for a in (-1, 1):
        for b in (-phi, phi):
            v += [(0, a, b), (a, b, 0), (b, 0, a)]
    v = torch.tensor(v, dtype=D64)
    v = v / v.norm(dim=1, keepdim=True)
    lj = B.LennardJones13()
    radii = torch.linspace(0.9, 1.05, 3001, dtype=D64)
    conf = torch.cat([torch.zeros(len(radii), 1, 3, dtype=D64), radii[:, None, None] * v], 1).reshape(len(radii), -1)
    assert abs(float(lj.lj_energy(conf).min()) - (-44.3268)) < 1e-3


def _targets():
    g = _gen(0)
    gmm = B.GaussianMixtureTarget.ring(components=4, radius=1.5, seed=0)
    return [
        (gmm, torch.randn(6, 2, generator=g, dtype=D64)),
        (B.DoubleWell4(), 2 * torch.randn(6, 8, generator=g, dtype=D64)),
        (B.LennardJones13(), B.LennardJones13()._init(6, g, D64)),
    ]


@pytest.mark.parametrize("i", [0, 1, 2])
def test_forces_are_minus_energy_gradient_by_finite_differences(i):
    tgt, x = _targets()[i]
    f = tgt.force(x)
    h = 1e-6
    for k in range(0, tgt.dim, max(1, tgt.dim // 8)):
        e = torch.zeros_like(x)
        e[:, k] = h
        fd = -(tgt.energy(x + e) - tgt.energy(x - e)) / (2 * h)
        np.testing.assert_allclose(f[:, k].numpy(), fd.numpy(), rtol=1e-5, atol=1e-5 * (1 + fd.abs().max().item()))
    assert torch.allclose(tgt.log_prob(x), -tgt.energy(x))


@pytest.mark.parametrize("i", [1, 2])
def test_particle_energies_invariant_to_permutation_rotation_translation(i):
    tgt, x = _targets()[i]
    n, d = tgt.n_particles, tgt.spatial_dim
    xs = x.reshape(-1, n, d)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=_gen(1), dtype=D64))  # rotation or reflection
    perm = torch.randperm(n, generator=_gen(2))
    y = (xs[:, perm] @ q.T + torch.randn(d, generator=_gen(3), dtype=D64)).reshape(x.shape)
    np.testing.assert_allclose(tgt.energy(y).numpy(), tgt.energy(x).numpy(), rtol=1e-10)
    # forces sum to zero (translation invariance) and remove_com projects
    assert tgt.force(x).reshape(-1, n, d).sum(1).abs().max() < 1e-6 * (1 + tgt.force(x).abs().max())
    assert B.remove_com(y, n, d).reshape(-1, n, d).mean(1).abs().max() < 1e-12


def test_lj_soft_clip_equal_below_and_smaller_above():
    exact, soft = B.LennardJones13(), B.LennardJones13(e_max=10.0)
    x = B.LennardJones13()._init(8, _gen(0), D64)
    x[0, 3:6] = x[0, :3] + 0.2  # overlap (d = 0.35): huge energy
    e, es = exact.energy(x), soft.energy(x)
    low = e <= 10
    assert float(e[0]) > 1e3 and low.any()
    assert torch.equal(e[low], es[low]) and (es[~low] < e[~low]).all()
    assert abs(float(es[0]) - (10 + math.log1p(float(e[0]) - 10))) < 1e-9
    assert torch.isfinite(soft.force(x)).all()


# ---------------------------------------------------------------- MALA

def test_mala_gaussian_moments_within_mc_error_and_accept_rate():
    mu = torch.tensor([1.0, -2.0], dtype=D64)
    cov = torch.tensor([[1.0, 0.8], [0.8, 2.0]], dtype=D64)
    prec = torch.linalg.inv(cov)

    def log_prob(x):
        d = x - mu
        return -0.5 * torch.einsum("ni,ij,nj->n", d, prec, d)

    n_chains = 200
    res = B.mala(log_prob, torch.zeros(n_chains, 2, dtype=D64), 0.1, 300, burn_in=300, thin=2, generator=_gen(0))
    assert res.samples.shape == (150, n_chains, 2)
    assert abs(res.accept_rate - 0.574) < 0.08, res.accept_rate
    chain_means = res.samples.mean(0)
    se = chain_means.std(0) / math.sqrt(n_chains)  # chains independent: honest MC error with autocorrelation
    assert ((chain_means.mean(0) - mu).abs() < 4 * se).all(), (chain_means.mean(0), se)
    flat = res.samples.reshape(-1, 2)
    emp = torch.cov(flat.T)
    assert (emp - cov).abs().max() < 0.12, emp


def test_mala_rejects_non_finite_and_dw4_reference_is_com_free():
    dw = B.DoubleWell4()
    x, acc = dw.sample_reference(128, _gen(0), n_chains=64, burn_in=200, thin=2, return_accept=True)
    assert x.shape == (128, 8) and 0.35 < acc < 0.8
    assert x.reshape(-1, 4, 2).mean(1).abs().max() < 1e-10
    e = dw.energy(x)
    assert torch.isfinite(e).all() and float(e.mean()) < float(dw.energy(dw.project(dw._init(64, _gen(9), D64))).mean())
    # a target that is -inf on half the space: chains never enter it
    res = B.mala(lambda z: torch.where(z[:, 0] > 0, -0.5 * z.pow(2).sum(-1), torch.tensor(-math.inf, dtype=D64)),
                 torch.ones(32, 2, dtype=D64), 0.5, 50, generator=_gen(1))
    assert (res.samples[..., 0] > 0).all()


# ---------------------------------------------------------------- flows

def _zero_last_layers(flow):
    for m in flow.net.modules():
        if isinstance(m, torch.nn.Sequential) or m.__class__.__name__ == "MaskedMLP":
            lin = [c for c in m if isinstance(c, torch.nn.Linear)]
            if not lin:
                continue
            last = lin[-1]
            torch.nn.init.zeros_(last.weight)
            torch.nn.init.zeros_(last.bias)


def test_identity_flow_with_standardisation_is_the_known_gaussian():
    loc, scale = torch.tensor([1.0, -3.0]), torch.tensor([0.5, 2.0])
    flow = F.make_flow("maf", 2, hidden=(16,), transforms=2, loc=loc, scale=scale)
    _zero_last_layers(flow)
    x = torch.randn(100, 2, generator=_gen(0)) * 3
    torch.testing.assert_close(flow.log_prob(x), F.gaussian_log_prob(x, loc, scale), rtol=1e-5, atol=1e-5)
    s = flow.sample(20000)
    assert (s.mean(0) - loc).abs().max() < 0.05 and (s.std(0) / scale - 1).abs().max() < 0.03


@pytest.mark.parametrize("kind", F.KINDS)
def test_change_of_variables_matches_autograd_jacobian(kind):
    torch.manual_seed(0)
    flow = F.make_flow(kind, 2, hidden=(16,), transforms=2, loc=torch.tensor([0.3, -0.2]),
                       scale=torch.tensor([1.5, 0.7])).double()
    x, lq = flow.rsample_and_log_prob(5)
    torch.testing.assert_close(lq, flow.log_prob(x), rtol=1e-6, atol=1e-6)
    dist = flow.net()
    z = dist.transform(((x - flow.loc) / flow.scale)).detach()
    for zi, lqi in zip(z, flow.log_prob(x)):
        jac = torch.autograd.functional.jacobian(lambda v: dist.transform.inv(v) * flow.scale + flow.loc, zi)
        expect = F.gaussian_log_prob(zi, torch.zeros(2, dtype=D64), torch.ones(2, dtype=D64)) - torch.slogdet(jac)[1]
        assert abs(float((lqi - expect).detach())) < 1e-8


@pytest.mark.parametrize("kind", ["nsf", "realnvp"])
def test_flow_density_integrates_to_one(kind):
    torch.manual_seed(1)
    flow = F.make_flow(kind, 2, hidden=(16,), transforms=2, scale=torch.tensor([1.0, 1.0]))
    with torch.no_grad():  # a visibly non-Gaussian random flow
        for p in flow.net.parameters():
            p.add_(0.3 * torch.randn_like(p))
        g = torch.linspace(-9, 9, 241)
        xx = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
        mass = float(flow.log_prob(xx).exp().sum() * (g[1] - g[0]) ** 2)
    assert abs(mass - 1) < 0.01, mass


def test_conditional_flow_shapes_and_importance_normalisation():
    torch.manual_seed(2)
    flow = F.make_flow("nsf", 1, context=2, hidden=(16,), transforms=2)
    c = torch.tensor([0.5, -1.0])
    assert flow.sample(7, c).shape == (7, 1) and flow.sample(3, torch.randn(4, 2)).shape == (3, 4, 1)
    with torch.no_grad():  # E_{p}[q/p] = 1 with a broad Gaussian proposal p
        z = torch.randn(40000, 1, generator=_gen(0)) * 3
        w = torch.exp(flow.log_prob(z, c.expand(len(z), 2)) - F.gaussian_log_prob(z, torch.zeros(1), torch.full((1,), 3.0)))
    se = float(w.std() / math.sqrt(len(w)))
    assert abs(float(w.mean()) - 1) < 4 * se + 1e-3
    with pytest.raises(ValueError):
        flow.log_prob(z[:2])


def test_fit_ml_recovers_gaussian_entropy():
    torch.manual_seed(3)
    cov = torch.tensor([[1.0, 0.6], [0.6, 0.5]])
    x = torch.randn(2000, 2, generator=_gen(4)) @ torch.linalg.cholesky(cov).T + torch.tensor([2.0, 0.0])
    flow = F.make_flow("maf", 2, hidden=(16,), transforms=2).set_standardization(x)
    losses = F.fit_ml(flow, x, steps=300, batch_size=256, lr=1e-2, generator=_gen(5))
    entropy = 0.5 * (2 * (1 + math.log(2 * math.pi)) + float(torch.logdet(cov)))
    x_test = torch.randn(4000, 2, generator=_gen(6)) @ torch.linalg.cholesky(cov).T + torch.tensor([2.0, 0.0])
    assert abs(M.nll(flow.log_prob, x_test) - entropy) < 0.05 and losses[-1] < losses[0]


def test_ode_sample_uses_shared_rk():
    x = F.ode_sample(lambda y, t: -y * (1 + t), torch.ones(3, 2), n_steps=20)
    torch.testing.assert_close(x, torch.full((3, 2), math.exp(-1.5)), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- metrics

def test_kish_ess_limits():
    n = 100
    assert M.kish_ess(np.zeros(n) + 7.3) == pytest.approx(1.0)
    one_hot = np.full(n, -np.inf)
    one_hot[3] = 0.0
    assert M.kish_ess(one_hot) == pytest.approx(1 / n)
    lw = np.log(np.r_[np.ones(50), 3 * np.ones(50)])  # (Σw)^2/(nΣw^2) = 200^2/(100*500) = 0.8
    assert M.kish_ess(lw) == pytest.approx(0.8)
    assert M.kish_ess(torch.tensor(lw) + 1000) == pytest.approx(0.8)


def test_energy_w2_and_sample_w2():
    rng = np.random.default_rng(0)
    e = rng.normal(size=500)
    assert M.energy_w2(e, e) == pytest.approx(0.0, abs=1e-12)
    assert M.energy_w2(e + 2.5, e) == pytest.approx(2.5, rel=1e-9)
    # unequal sizes: W2(N(0,1), N(0,4)) = 1 for Gaussians (|σ1 - σ2|)
    assert M.energy_w2(rng.normal(size=20000), 2 * rng.normal(size=30000)) == pytest.approx(1.0, abs=0.03)
    # weights: all mass on the first half == W2 of that half
    w = np.r_[np.ones(250), np.zeros(250)]
    assert M.energy_w2(e, e[:250], weights=w) == pytest.approx(0.0, abs=1e-9)
    assert M.energy_w2(np.r_[e, np.inf], e) == pytest.approx(0.0, abs=1e-12)
    x = rng.normal(size=(200, 3))
    shift = np.array([1.0, -2.0, 2.0])
    assert M.sample_w2(x, x + shift) == pytest.approx(3.0, rel=1e-9)
    assert M.sample_w2(torch.tensor(x), torch.tensor(x[::-1].copy())) == pytest.approx(0.0, abs=1e-6)


def test_c2st_same_and_separated():
    g = _gen(0)
    x, y = torch.randn(400, 2, generator=g), torch.randn(400, 2, generator=g)
    kw = dict(classifier_kwargs={"n_estimators": 50})
    assert abs(M.c2st(x, y, **kw) - 0.5) < 0.07
    assert M.c2st(x, y + 6.0, **kw) > 0.98


def test_sbc_conjugate_gaussian_uniform_and_overconfident_detected():
    rng = np.random.default_rng(1)
    n_sim, n_draws, d, sigma, n_obs = 400, 99, 2, 0.7, 3
    theta = rng.normal(size=(n_sim, d))  # prior N(0, I)
    x = theta[:, None, :] + sigma * rng.normal(size=(n_sim, n_obs, d))
    post_var = 1 / (1 + n_obs / sigma**2)
    post_mean = post_var * x.sum(1) / sigma**2
    draws = post_mean[:, None] + math.sqrt(post_var) * rng.normal(size=(n_sim, n_draws, d))
    ranks = M.sbc_ranks(theta, draws)
    assert ranks.shape == (n_sim, d) and ranks.min() >= 0 and ranks.max() <= n_draws
    assert (M.sbc_uniformity_pvalue(ranks, n_draws) > 0.01).all()
    levels, cov = M.expected_coverage(ranks, n_draws)
    assert np.abs(cov - levels[:, None]).max() < 0.08
    narrow = post_mean[:, None] + 0.5 * math.sqrt(post_var) * rng.normal(size=(n_sim, n_draws, d))
    r2 = M.sbc_ranks(theta, narrow)
    assert (M.sbc_uniformity_pvalue(r2, n_draws) < 1e-3).all()
    assert (M.expected_coverage(r2, n_draws)[1][9] < levels[9] - 0.15).all()  # below the diagonal at 50 %


def test_nll_helper():
    x = torch.randn(1000, 2, generator=_gen(7), dtype=D64)
    lp = F.gaussian_log_prob(x, torch.zeros(2, dtype=D64), torch.ones(2, dtype=D64))
    assert M.nll(lp) == pytest.approx(M.nll(lambda z: F.gaussian_log_prob(z, torch.zeros(2, dtype=D64),
                                                                           torch.ones(2, dtype=D64)), x, batch_size=64))
    assert M.nll(lp) == pytest.approx(1 + math.log(2 * math.pi), abs=0.1)
