"""Numerics of the coupling PINN: Jacobian bound of the coupling blocks (and the derivative band it
implies, a property by construction), spectral normalisation, Taylor-mode jets against autograd and
finite differences, the fused tanh-jet backward (gradcheck), per-member Adam against torch's Adam,
PDE residuals on exact solutions, and the training rule (learns Poisson, stops on the gate's plateau)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.methods.coupling_pinn.differential_profile import band_decades, hidden_profile  # noqa: E402
from reprozoo.methods.coupling_pinn.method import MemberAdam, fit  # noqa: E402
from reprozoo.methods.coupling_pinn.networks import (  # noqa: E402
    PINNTrunk, StackedSpectralWeights, _TanhJet, coupling_rho)
from reprozoo.methods.coupling_pinn.pdes import make_problem  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def test_spectral_weights_have_unit_norm():
    torch.manual_seed(0)
    sw = StackedSpectralWeights((2, 5), 8, 4)
    w = sw().detach()
    s = torch.linalg.matrix_norm(w, ord=2)
    assert torch.allclose(s, torch.ones(2, 5), atol=1e-4)


def _block(stack, l, c, member=0):
    U, cV = stack.U().detach()[member, l], c * stack.V().detach()[member, l]
    beta = stack.beta.detach()[member, l, 0]
    half = U.shape[1]

    def f(h):
        a, b = h[:half], h[half:]
        return torch.cat([b + cV @ torch.tanh(U @ a + beta), a])
    return f


@pytest.mark.parametrize("c", [0.5, 2.0])
def test_coupling_block_jacobian_singular_values_in_band(c):
    """Each block's Jacobian P [[I,0],[A,I]] with ||A|| <= c: sigma in [1/rho, rho], |det| = 1."""
    torch.manual_seed(1)
    net = PINNTrunk("coupling", 1, 8, 3, coupling_c=c, members=2).eval()
    with torch.no_grad():
        net.blocks.beta.normal_()
    rho = coupling_rho(c)
    for l in range(3):
        block = _block(net.blocks, l, c, member=1)
        for _ in range(5):
            J = torch.autograd.functional.jacobian(block, torch.randn(8) * 2)
            sv = torch.linalg.svdvals(J)
            assert sv.max() <= rho + 1e-5 and sv.min() >= 1 / rho - 1e-5
            assert abs(abs(torch.linalg.det(J)) - 1) < 1e-4
    assert math.isclose(coupling_rho(1.0), (1 + math.sqrt(5)) / 2)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_coupling_first_derivative_band_bounded_by_construction(scale):
    """By construction (not a claim): |dh_l/dx| changes by at most rho per block, so the profile of the
    deepest trunk spans at most L log10(rho) decades (1.71 at L = 16, c = 0.5), whatever the weights;
    the plain MLP has no such bound."""
    torch.manual_seed(3)
    prob = make_problem("poisson")
    X = np.linspace(0, 1, 64)[:, None]
    net = PINNTrunk("coupling", 1, 16, 16, coupling_c=0.5)
    with torch.no_grad():  # spectral normalisation divides any scale out of U and V
        net.blocks.U.weight.mul_(scale), net.blocks.V.weight.mul_(scale), net.blocks.beta.normal_()
        net.blocks.U.refresh(50), net.blocks.V.refresh(50)
    d1, _ = hidden_profile(net, prob, X)
    bound = 16 * math.log10(coupling_rho(0.5))
    # per point, |dh_l/dx| / |dh_0/dx| lies in [rho^-l, rho^l]; so does the ratio of the means
    ratios = np.log10(d1[1:] / d1[0])
    assert np.all(np.abs(ratios) <= np.arange(1, 17) * math.log10(coupling_rho(0.5)) + 1e-6)
    assert band_decades(d1) <= bound + 1e-6


def test_tanh_jet_backward_gradcheck():
    torch.manual_seed(0)
    for n_comp, n_dirs, second in [(3, 1, True), (4, 2, True), (2, 1, False), (3, 2, False)]:
        z = torch.randn(2, n_comp * 5, 4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(2, 1, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda z, b: _TanhJet.apply(z, b, n_comp, n_dirs, second), (z, b))


@pytest.mark.parametrize("pde", ["poisson", "helmholtz", "burgers", "allen_cahn"])
def test_jet_residual_matches_autograd(pde, float64):
    """The training route (Taylor-mode jets, product rule by hand) equals nested autograd, per member."""
    prob = make_problem(pde)
    X = prob.collocation(np.random.default_rng(0), 16)
    Xt = torch.tensor(X, requires_grad=True)
    for arch in ("mlp", "resnet", "coupling"):
        torch.manual_seed(0)
        net = PINNTrunk(arch, prob.n_features, 8, 3, members=2).eval()
        with torch.no_grad():
            net.w_out[1] *= 1.7  # members differ
        rj = prob.residual_jet(X, net.jet(prob.feature_jet(X), prob.n_dirs, True))
        for k in range(2):
            ra = prob.residual(lambda Z, k=k: prob.ansatz(Z, net(prob.features(Z))[k]), Xt)[:, 0]
            np.testing.assert_allclose(rj[k].detach().numpy(), ra.detach().numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pde", ["helmholtz", "burgers"])
def test_loss_gradient_through_fused_jets_matches_autograd(pde, float64):
    """The gradient the optimiser sees (hand-written backward of the fused dense + tanh jet) equals
    the gradient of the same loss built by nested autograd, for every trunk and member."""
    prob = make_problem(pde)
    X = prob.collocation(np.random.default_rng(1), 12)
    Xt = torch.tensor(X, requires_grad=True)
    for arch in ("mlp", "resnet", "coupling"):
        torch.manual_seed(4)
        net = PINNTrunk(arch, prob.n_features, 6, 3, members=2).eval()
        with torch.no_grad():
            for q in net.parameters():
                q.add_(0.1 * torch.randn_like(q))  # nonzero biases, members differ
        net.zero_grad()
        prob.residual_jet(X, net.jet(prob.feature_jet(X), prob.n_dirs, True)).pow(2).mean(-1).sum().backward()
        g_jet = [q.grad.clone() for q in net.parameters()]
        net.zero_grad()
        loss = sum(prob.residual(lambda Z, k=k: prob.ansatz(Z, net(prob.features(Z))[k]), Xt).pow(2).mean()
                   for k in range(2))
        loss.backward()
        for a, b in zip(g_jet, (q.grad for q in net.parameters())):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("arch", ["mlp", "resnet", "coupling"])
def test_profile_matches_finite_differences(arch, float64):
    torch.manual_seed(2)
    net = PINNTrunk(arch, 1, 8, 4).eval()
    prob = make_problem("poisson")
    X = np.random.default_rng(0).uniform(0.05, 0.95, (16, 1))
    d1, d2 = hidden_profile(net, prob, X)
    h = 1e-4

    def hs(Xin):
        f = prob.features(torch.as_tensor(Xin)).unsqueeze(0)
        return torch.stack(net.jet(f, 0, False, return_hidden=True)[1])[:, 0, 0].detach()  # (L + 1, N, w)
    fd1 = (hs(X + h) - hs(X - h)) / (2 * h)
    fd2 = (hs(X + h) - 2 * hs(X) + hs(X - h)) / h**2
    np.testing.assert_allclose(d1, fd1.norm(dim=-1).mean(dim=-1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(d2, fd2.norm(dim=-1).mean(dim=-1).numpy(), rtol=1e-3)
    assert band_decades(np.array([1.0, 10.0, 0.1])) == pytest.approx(2.0)


def test_member_adam_equals_torch_adam_per_member():
    """K members with K rates in one batched trunk take exactly the steps of K separate torch Adams."""
    torch.manual_seed(0)
    lrs = [1e-3, 1e-2, 1e-1]
    prob = make_problem("helmholtz")
    X = prob.collocation(np.random.default_rng(1), 12)
    fj = prob.feature_jet(X)
    big = PINNTrunk("mlp", 1, 6, 2, members=3)
    singles = []
    for k in range(3):
        s = PINNTrunk("mlp", 1, 6, 2, members=1)
        with torch.no_grad():
            for a, b in zip(s.parameters(), big.parameters()):
                a.copy_(b[k:k + 1])
        singles.append((s, torch.optim.Adam(s.parameters(), lr=lrs[k])))
    opt = MemberAdam(big.parameters(), lrs)
    for _ in range(5):
        opt.zero_grad()
        prob.residual_jet(X, big.jet(fj, 1, True)).pow(2).mean(-1).sum().backward()
        opt.step()
        for s, o in singles:
            o.zero_grad()
            prob.residual_jet(X, s.jet(fj, 1, True)).pow(2).mean().backward()
            o.step()
    for k, (s, _) in enumerate(singles):
        for a, b in zip(s.parameters(), big.parameters()):
            torch.testing.assert_close(a[0], b[k], rtol=1e-5, atol=1e-6)


def _exact_residual(name, cfg, u_exact, X):
    return make_problem(name, cfg).residual(u_exact, X)


def test_residuals_vanish_on_exact_solutions(float64):
    X1 = torch.rand(32, 1, requires_grad=True)
    r = _exact_residual("poisson", {"amp2": 0.25, "m2": 8},
                        lambda X: torch.sin(2 * math.pi * X) + 0.25 * torch.sin(8 * math.pi * X), X1)
    assert r.abs().max() < 1e-9
    r = _exact_residual("helmholtz", {"k": 6.0, "m": 4}, lambda X: torch.sin(4 * math.pi * X), X1)
    assert r.abs().max() < 1e-9
    # Burgers: Cole-Hopf of phi = a + exp(-nu t) cos x (phi_t = nu phi_xx)
    nu, a = 0.05, 1.5
    X2 = torch.rand(32, 2, requires_grad=True)

    def burgers(X):
        x, t = X[:, :1], X[:, 1:2]
        e = torch.exp(-nu * t)
        return 2 * nu * e * torch.sin(x) / (a + e * torch.cos(x))
    assert _exact_residual("burgers", {"nu": nu}, burgers, X2).abs().max() < 1e-9
    # Allen-Cahn: the steady interface tanh(x / (sqrt(2) eps))
    eps = 0.3
    r = _exact_residual("allen_cahn", {"eps": eps}, lambda X: torch.tanh((X[:, :1] - 3) / (math.sqrt(2) * eps)), X2)
    assert r.abs().max() < 1e-9
    # a wrong solution must not pass; nor the near-resonant mode sin(2 pi x) at a small cost
    r = _exact_residual("helmholtz", {"k": 6.0, "m": 4}, lambda X: torch.sin(3 * math.pi * X), X1)
    assert r.abs().max() > 1.0
    r0 = _exact_residual("helmholtz", {"k": 6.0, "m": 4},
                         lambda X: torch.sin(4 * math.pi * X) + 0.1 * torch.sin(2 * math.pi * X), X1)
    assert 0.0 < r0.abs().max() < 0.1 * abs(36 - 4 * math.pi**2) * 1.01  # the "challenging" direction


def test_references_from_project_solvers():
    b = make_problem("burgers", {"nu": 0.1, "n_ref": 64, "n_eval_t": 3})
    x, t, u = b.reference_grid()
    np.testing.assert_allclose(u[0], -np.sin(x), atol=1e-8)
    assert np.abs(u[-1]).max() < 1.0  # viscous decay
    ac = make_problem("allen_cahn", {"eps": 0.2, "t_end": 0.2, "n_ref": 64, "n_eval_t": 3, "dt_ref": 1e-3})
    x, t, u = ac.reference_grid()
    np.testing.assert_allclose(u[0], ac.u0_np(x), atol=1e-12)
    assert np.all(np.abs(u) <= 1.0)


def test_hard_constraints():
    prob = make_problem("poisson")
    net = PINNTrunk("coupling", 1, 8, 2, members=2)
    u = prob.u(net, torch.tensor([[0.0], [1.0]]))
    assert u.shape == (2, 2) and torch.allclose(u, torch.zeros_like(u))
    bur = make_problem("burgers")
    x = torch.linspace(0, 6, 7)[:, None]
    X = torch.cat([x, torch.zeros_like(x)], 1)
    net = PINNTrunk("mlp", 3, 8, 2)
    assert torch.allclose(bur.u(net, X)[0], -torch.sin(x[:, 0]), atol=1e-6)
    # periodic features: x and x + 2 pi give the same prediction
    X2 = torch.cat([x + 2 * math.pi, torch.full_like(x, 0.5)], 1)
    X1 = torch.cat([x, torch.full_like(x, 0.5)], 1)
    assert torch.allclose(bur.u(net, X1), bur.u(net, X2), atol=1e-5)


def _task(name, cfg, seed=0, n=32, n_val=32):
    prob = make_problem(name, cfg)
    Xt, ut = prob.reference()
    Xv = prob.collocation(np.random.default_rng(seed + 1), n_val)
    return dict(problem=prob, colloc=prob.collocation(np.random.default_rng(seed), n), X_val=Xv,
                u_val=prob.exact_at(Xv), X_test=Xt, u_test=ut)


def test_fit_learns_poisson_and_stops_on_the_gates_plateau():
    """The training rule: a divergent rate in the grid is never chosen, the trunk learns one-mode
    problems (u = sin(pi x)) to < 1e-3, and a trunk stopped as flat has a validation curve the
    convergence gate accepts, after min_steps, with its rate still at its peak."""
    from reprozoo.claims import plateau

    p = {"width": 8, "coupling_c": 0.5, "n_profile": 16, "lr_grid": [1e-2, 30.0], "eval_every": 10,
         "min_steps": 300, "max_steps": 1500, "flat_tol": 0.01}
    tasks = [_task("helmholtz", {"k": 2.0, "m": 1, "n_eval": 64}), _task("helmholtz", {"k": 1.0, "m": 1, "n_eval": 64})]
    out = fit("mlp", tasks, 2, p, 0)
    for r in out:
        assert r["lr"] == 1e-2
        assert r["err"] < 1e-3
        assert r["best_val"][0] < r["best_val"][1]
        assert r["flat"] and r["steps"] >= 300
        assert plateau(*r["val"], tol=0.02)


def test_tasks_in_one_trunk_train_as_if_alone():
    """Batching PDEs as members changes nothing: each task's curve equals its curve when trained alone."""
    p = {"width": 8, "coupling_c": 0.5, "n_profile": 8, "lr_grid": [1e-2], "eval_every": 5,
         "min_steps": 30, "max_steps": 30, "flat_tol": 0.01}
    a = _task("poisson", {"n_eval": 32}, n=16, n_val=16)
    b = _task("helmholtz", {"n_eval": 32}, n=16, n_val=16)
    both = fit("coupling", [a, b], 3, p, 0)
    alone = [fit("coupling", [t], 3, p, 0)[0] for t in (a, b)]
    for x, y in zip(both, alone):
        np.testing.assert_allclose(x["val"][1], y["val"][1], rtol=1e-4)
        assert x["err"] == pytest.approx(y["err"], rel=1e-4)
