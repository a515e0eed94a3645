"""LDR numerics: the COM-free chart, the log-dispersion measures (closed forms, shift invariance,
gradients), off-policy recovery of a target by LDR alone, the sample-efficiency read-off, and the
sign conventions of the ESS evaluation (an exact model has ESS 1)."""
import math

import numpy as np
import pytest
import torch

from reprozoo.blocks.boltzmann import make_target, pair_distances, remove_com
from reprozoo.methods.ldr.coords import ComFreeChart, helmert
from reprozoo.methods.ldr.dispersion import CachedLogProb, Objective, log_dispersion
from reprozoo.methods.ldr.efficiency import sample_efficiency, samples_to_reach
from reprozoo.methods.ldr.method import evaluate


# --- chart ---------------------------------------------------------------------------------------

def test_helmert_is_an_orthonormal_basis_of_the_zero_com_subspace():
    h = helmert(5)
    torch.testing.assert_close(h @ h.T, torch.eye(4, dtype=h.dtype))
    torch.testing.assert_close(h @ torch.ones(5, dtype=h.dtype), torch.zeros(4, dtype=h.dtype))


def test_chart_round_trip_is_the_com_projection_and_an_isometry():
    t = make_target("dw4")
    chart = ComFreeChart.for_target(t)
    x = torch.randn(20, 8, dtype=torch.float64) + 3.0  # off-centre on purpose
    y = chart.to_internal(x)
    assert y.shape == (20, 6)
    torch.testing.assert_close(chart.to_cartesian(y), remove_com(x, 4, 2))
    # energies are translation invariant, so the chart loses nothing
    torch.testing.assert_close(t.energy(chart.to_cartesian(y)), t.energy(x))
    torch.testing.assert_close(pair_distances(chart.to_cartesian(y), 4, 2), pair_distances(x, 4, 2))
    # isometry on the subspace: distances between COM-free configurations are kept
    xc = remove_com(x, 4, 2)
    torch.testing.assert_close(torch.cdist(y, y), torch.cdist(xc, xc))


def test_chart_is_identity_without_particles():
    chart = ComFreeChart.for_target(make_target("gmm"))
    x = torch.randn(7, 2)
    assert chart.dim == 2 and torch.equal(chart.to_internal(x), x) and torch.equal(chart.to_cartesian(x), x)


# --- dispersion measures ---------------------------------------------------------------------------

@pytest.mark.parametrize("measure", ["variance", "mad"])
def test_dispersion_is_shift_invariant_and_zero_iff_q_equals_p(measure):
    g = torch.Generator().manual_seed(0)
    lq, e = torch.randn(64, generator=g, dtype=torch.float64), torch.randn(64, generator=g, dtype=torch.float64)
    d = log_dispersion(lq, e, measure)
    assert d > 0
    torch.testing.assert_close(log_dispersion(lq + 17.3, e, measure), d)  # unknown log Z cancels
    assert float(log_dispersion(-e + 2.5, e, measure)) == pytest.approx(0.0, abs=1e-12)  # q ∝ p


def test_closed_form_for_a_shifted_gaussian_model():
    """q = N(mu, 1), p ∝ exp(-x^2/2): ℓ = mu x - mu^2/2 + const, so Var ℓ = mu^2 Var x and
    MAD ℓ = |mu| mean|x - median x| on any off-policy sample x."""
    x = torch.linspace(-2.0, 3.0, 41, dtype=torch.float64) ** 3 / 4  # any points (odd count: exact median)
    mu = -0.7
    lq = -0.5 * (x - mu) ** 2 - 0.5 * math.log(2 * math.pi)
    e = 0.5 * x**2
    assert float(log_dispersion(lq, e, "variance")) == pytest.approx(mu**2 * float(x.var(unbiased=False)), rel=1e-12)
    assert float(log_dispersion(lq, e, "mad")) == pytest.approx(abs(mu) * float((x - x.median()).abs().mean()),
                                                                rel=1e-12)


@pytest.mark.parametrize("measure", ["variance", "mad"])
def test_dispersion_gradient_matches_finite_differences(measure):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(33, generator=g, dtype=torch.float64)
    e = 0.5 * x**2

    def f(theta):  # q = N(mu, s^2), theta = (mu, log s)
        mu, log_s = theta[0], theta[1]
        lq = -0.5 * ((x - mu) / torch.exp(log_s)) ** 2 - log_s
        return log_dispersion(lq, e, measure)

    assert torch.autograd.gradcheck(f, (torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True),))


class DiagonalGaussian(torch.nn.Module):
    """q = N(mu, diag(exp(log_s))^2): contains the target, so LDR's optimum is the target itself."""

    def __init__(self, dim):
        super().__init__()
        self.mu = torch.nn.Parameter(torch.zeros(dim, dtype=torch.float64))
        self.log_s = torch.nn.Parameter(torch.zeros(dim, dtype=torch.float64))

    def log_prob(self, x):
        z = (x - self.mu) / torch.exp(self.log_s)
        return (-0.5 * z**2 - self.log_s - 0.5 * math.log(2 * math.pi)).sum(-1)


@pytest.mark.parametrize("measure", ["variance", "mad"])
def test_ldr_alone_recovers_the_target_from_off_policy_samples(measure):
    """Purely off-policy: samples from a broad r = N(0, 3^2 I), target N((1, -2), diag(0.5, 2)^2),
    loss = D_r(log q + E) only. The model lands on the target's mean and standard deviations,
    although the data have neither, and the unknown normaliser of exp(-E) never enters."""
    g = torch.Generator().manual_seed(0)
    mean = torch.tensor([1.0, -2.0], dtype=torch.float64)
    std = torch.tensor([0.5, 2.0], dtype=torch.float64)

    def energy(x):  # unnormalised on purpose (+ 5)
        return 0.5 * (((x - mean) / std) ** 2).sum(-1) + 5.0

    r = 3.0 * torch.randn(2048, 2, generator=g, dtype=torch.float64)
    model = DiagonalGaussian(2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(600):
        loss = log_dispersion(model.log_prob(r), energy(r), measure)
        opt.zero_grad()
        loss.backward()
        opt.step()
    tol = 2e-3 if measure == "variance" else 1e-2  # |.| is not smooth: Adam jitters around the optimum
    torch.testing.assert_close(model.mu.detach(), mean, atol=tol, rtol=0)
    torch.testing.assert_close(torch.exp(model.log_s.detach()), std, atol=tol, rtol=0)
    # and maximum likelihood on the same samples recovers r instead (what LDR adds is the energy)
    model = DiagonalGaussian(2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(600):
        loss = -model.log_prob(r).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.all(torch.exp(model.log_s.detach()) > 2.7)


def test_cached_log_prob_reuses_the_ml_graph_and_objective_adds_lambda_d():
    from reprozoo.blocks.flows import make_flow

    torch.manual_seed(0)
    flow = make_flow("maf", 2, hidden=(8,), transforms=1)
    wrapped = CachedLogProb(flow)
    xb = torch.randn(16, 2)
    lq = wrapped.log_prob(xb)
    assert wrapped.pop(xb.clone()) is lq  # same values: the very same graph node
    assert wrapped.pop(xb) is not lq  # consumed once: a fresh evaluation afterwards

    def energy(x):
        return 0.5 * x.pow(2).sum(-1)

    obj = Objective(energy, "variance", 0.5, 1.0, xb, val_every=1)
    lq = wrapped.log_prob(xb)
    term = obj(wrapped, xb, None)
    torch.testing.assert_close(term, 0.5 * log_dispersion(lq, energy(xb), "variance"))
    assert obj.val_steps == [1] and len(obj.train_nll) == 1
    base = Objective(energy, None, 1.0, 1.0, xb, val_every=10)
    wrapped.log_prob(xb)
    assert float(base(wrapped, xb, None)) == 0.0 and base.train_dispersion[0] > 0  # monitored only


# --- sample-efficiency read-off -------------------------------------------------------------------

def test_sample_efficiency_recovers_a_planted_shift_in_log_n():
    ns = [64, 128, 256, 512, 1024, 2048, 4096]
    base = [0.1 * math.log2(n / 32) for n in ns]  # linear in log N, best at 4096
    method = [0.1 * math.log2(4 * n / 32) for n in ns]  # the same curve with 4x the data
    ratio, censored = sample_efficiency(ns, base, method)
    assert ratio == pytest.approx(4.0, rel=1e-12) and not censored
    assert sample_efficiency(ns, base, base) == (1.0, False)
    assert sample_efficiency(ns, base, [0.0] * len(ns))[0] == 0.0  # never reaches ESS*
    ratio, censored = sample_efficiency(ns, base, [1.0] * len(ns))
    assert ratio == pytest.approx(4096 / 64) and censored  # only a lower bound
    assert samples_to_reach(ns, base, 0.25) == pytest.approx(32 * 2**2.5)
    assert math.isinf(samples_to_reach(ns, base, 2.0))


# --- evaluation conventions -------------------------------------------------------------------------

class ExactModel:
    """A 'flow' that is the target itself (optionally broadened), for sign checks."""

    def __init__(self, target, widen=1.0):
        self.t, self.widen = target, widen

    def rsample_and_log_prob(self, n):
        x = self.t.sample_reference(n, torch.Generator().manual_seed(3))
        m = self.t.means.mean(0)
        y = m + self.widen * (x - m)
        return y, self.log_prob(y)

    def log_prob(self, y):
        m = self.t.means.mean(0)
        return -self.t.energy(m + (y - m) / self.widen) - 2 * math.log(self.widen)


def test_exact_model_has_unit_ess_and_the_entropy_as_nll():
    t = make_target("gmm")
    chart = ComFreeChart.for_target(t)
    test = t.sample_reference(2000, torch.Generator().manual_seed(4))
    e_test = t.energy(test)
    res = evaluate(ExactModel(t), t, chart, test, e_test, 2000, seed=0)
    assert res["ess"] == pytest.approx(1.0, abs=1e-9)
    assert res["nll"] == pytest.approx(float(e_test.mean()), abs=1e-9)  # energy = -log p exactly
    assert res["ew2"] < 0.15
    worse = evaluate(ExactModel(t, widen=1.3), t, chart, test, e_test, 2000, seed=0)
    assert worse["ess"] < 0.9 and worse["nll"] > res["nll"]
    assert np.isfinite(worse["energies"]).all()
