"""RO-HNN numerics: the kink-chain reference (forces, energy, topological charge, kink kinematics),
the reductions' symplectic structure, the latent HNN (closed-form force, J grad H, leapfrog),
the bounded energy of a decoded 1-dof Hamiltonian rollout, the intrusive PSD-Galerkin baseline,
the controls' integrator swaps (explicit Euler, RK4), the full HNN's identity reduction, and the
error metrics (state error, valid-prediction time, energy drift against the decoded reference)."""
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from reprozoo.methods.ro_hnn.latent_dynamics import ExplicitEuler, GeneralHNN, LatentHNN, RK4Stepper, rollout
from reprozoo.methods.ro_hnn.method import (PSDGalerkin, energy_drift, long_horizon_metrics, relative_state_error,
                                            valid_prediction_time)
from reprozoo.methods.ro_hnn.reductions import (FullState, LinearPSD, SymplecticAE, poisson_matrix,
                                                psd_cotangent_lift, symplectic_lift_matrix)
from reprozoo.methods.ro_hnn.sine_gordon import KinkChain

CONFIGS = Path(__file__).resolve().parents[1] / "src/reprozoo/methods/ro_hnn/configs"


def _smoke():
    return yaml.safe_load((CONFIGS / "smoke.yaml").read_text())


def _chain(n=32, a=0.7, ell=6.0):
    return KinkChain(n, a, ell, 6, 1.0)


def _traj(chain, dt, t_end, every, count=3, seed=0, x0=2.0):
    q0, p0 = chain.initial_states(count, x0, (0.1, 0.3), np.random.default_rng(seed))
    return chain.simulate(q0, p0, dt, every, int(round(t_end / (dt * every))))


def test_grad_potential_matches_finite_differences():
    chain = _chain(10)
    q = np.random.default_rng(0).normal(size=(3, 10)) * 2
    g, eps = chain.grad_potential(q), 1e-6
    for i in range(10):
        e = np.zeros(10)
        e[i] = eps
        fd = (chain.potential(q + e) - chain.potential(q - e)) / (2 * eps)
        np.testing.assert_allclose(g[:, i], fd, rtol=1e-6, atol=1e-8)


def test_reference_energy_error_is_bounded_and_second_order():
    chain = _chain()
    errs = []
    for dt in (0.2, 0.1):
        q, p = _traj(chain, dt, 400.0, int(round(2 / dt)))
        e = chain.energy(q, p)
        rel = np.abs(e / e[:, :1] - 1)
        errs.append(rel.max())
        half = rel.shape[1] // 2
        assert rel[:, half:].max() < 2.0 * rel[:, :half].max() + 1e-12  # bounded, no drift
    assert errs[0] < 1e-3
    assert 3.0 < errs[0] / errs[1] < 5.0  # O(dt^2)


def test_generator_conserves_topological_charge_and_keeps_the_kink_in_the_trap():
    chain = KinkChain.from_config(_smoke()["system"])
    q, p = _traj(chain, 0.1, 1280.0, 20, count=4, x0=4.0)
    np.testing.assert_allclose(chain.charge(q), 1.0, atol=0.05)
    x = chain.position(q)
    assert np.abs(x).max() < 8.0  # the walls turn every kink around, far from the chain's ends (16.45)
    assert (np.diff(np.sign(chain.velocity(q, p)), axis=1) != 0).sum(1).min() >= 10  # it bounces many times


def test_free_kink_travels_at_its_speed_in_the_continuum_limit():
    """Homogeneous chain (no trap): the boosted kink is an exact travelling wave of the continuum
    equation, so its position read off the state moves at v; the lattice's correction to the speed
    shrinks as a^2 (second-order finite differences)."""
    v, gaps = 0.3, []
    for a in (0.2, 0.1):
        chain = KinkChain(int(round(40 / a)), a, 1e9, 6)
        q0, p0 = chain.kink(np.array([-6.0]), np.array([v]))
        q, p = chain.simulate(q0, p0, a / 4, int(round(4 / a)), 40)  # t = 0, 1, .., 40
        t = np.arange(41.0)
        x = chain.position(q[0])
        slope, icpt = np.polyfit(t, x, 1)
        assert np.abs(x - (slope * t + icpt)).max() < 2e-3  # uniform motion
        np.testing.assert_allclose(chain.velocity(q[0], p[0]), v, atol=2e-3)
        gaps.append(abs(slope - v))
    assert gaps[0] < 1e-3
    assert 3.0 < gaps[0] / gaps[1] < 5.0


def test_position_and_velocity_functionals_recover_planted_kinks():
    chain = _chain(64, 0.5, 10.0)
    X, v = np.array([-3.0, 0.4, 5.0]), np.array([0.25, -0.1, 0.0])
    q, p = chain.kink(X, v)
    np.testing.assert_allclose(chain.position(q), X, atol=1e-3)
    np.testing.assert_allclose(chain.velocity(q, p), v, atol=5e-3)


def test_manifold_r2_on_planted_data():
    chain = _chain(64, 0.5, 10.0)
    rng = np.random.default_rng(0)
    X, v = rng.uniform(-5, 5, 300), rng.uniform(-0.3, 0.3, 300)
    q, p = chain.kink(X, v)
    assert chain.manifold_r2(q, p) > 0.999
    noise_q, noise_p = rng.normal(size=q.shape) * q.std(), rng.normal(size=p.shape) * p.std()
    assert chain.manifold_r2(q + noise_q, p + noise_p) < 0.6  # off the manifold: variance unexplained


def test_psd_lift_is_symplectic_and_reproduces_its_span():
    chain = _chain()
    q, p = _traj(chain, 0.1, 60.0, 10)
    q, p = q.reshape(-1, 32), p.reshape(-1, 32)
    q_ref = q.mean(0)
    phi = psd_cotangent_lift(q - q_ref, p, 3)
    a = symplectic_lift_matrix(phi)
    np.testing.assert_allclose(a.T @ poisson_matrix(32) @ a, poisson_matrix(3), atol=1e-12)
    np.testing.assert_allclose(a.T @ a, np.eye(6), atol=1e-12)
    lin = LinearPSD(phi, q_ref)
    z = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    back = lin.encode(*lin.decode(*z))
    torch.testing.assert_close(back[0], z[0])
    torch.testing.assert_close(back[1], z[1])


@pytest.fixture
def sae():
    gen = torch.Generator().manual_seed(0)
    phi = np.linalg.qr(np.random.default_rng(1).normal(size=(8, 2)))[0]
    m = SymplecticAE(phi, np.linspace(0, 1, 8), 6, 1.0, np.ones(2), gen)
    with torch.no_grad():  # a strongly curved embedding, far from the linear initialisation
        m.V.copy_(torch.randn(m.V.shape, generator=gen, dtype=torch.float64))
        m.C.copy_(0.3 * torch.randn(m.C.shape, generator=gen, dtype=torch.float64))
    return m


def test_symplectic_decoder_preserves_the_symplectic_form(sae):
    for z in torch.randn(4, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64):
        jac = torch.autograd.functional.jacobian(lambda z: torch.cat(sae.decode(z[:2], z[2:])), z).numpy()
        np.testing.assert_allclose(jac.T @ poisson_matrix(8) @ jac, poisson_matrix(2), atol=1e-9)


def test_closed_form_jacobian_and_momentum_left_inverse(sae):
    qz = torch.randn(3, 2, dtype=torch.float64)
    auto = torch.stack([torch.autograd.functional.jacobian(sae.phi, z) for z in qz])
    torch.testing.assert_close(sae.jacobian(qz), auto)
    pz = torch.randn(3, 2, dtype=torch.float64)
    q, p = sae.decode(qz, pz)
    torch.testing.assert_close(torch.einsum("bnk,bn->bk", sae.jacobian(qz), p), pz)  # P = J^T p


def test_trained_symplectic_autoencoder_learns_the_kink_manifold_that_psd_misses():
    """Planted curved manifold: kink states at random (X, v). With one degree of freedom the
    symplectic autoencoder, trained briefly, reconstructs them far better than PSD at n = 1, and its
    encoder-decoder pair is then the identity on the latent space (rho o phi = id: the latent
    symplectic form is the pulled-back one)."""
    chain = _chain(32, 0.7, 10.0)
    rng = np.random.default_rng(0)
    q, p = chain.kink(rng.uniform(-5, 5, 400), rng.uniform(-0.3, 0.3, 400))
    q_ref = q.mean(0)
    phi = psd_cotangent_lift(q - q_ref, p, 1)
    lin = LinearPSD(phi, q_ref)
    qt, pt = torch.as_tensor(q), torch.as_tensor(p)
    s_q, s_p = float((q - q_ref).std()), float(p.std())
    m = SymplecticAE(phi, q_ref, 32, s_q, ((q - q_ref) @ phi).std(0), torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(600):
        idx = torch.randint(400, (64,), generator=gen)
        qz, pz = m.encode(qt[idx], pt[idx])
        qh, ph = m.decode(qz, pz)
        loss = ((qh - qt[idx]) ** 2).mean() / s_q**2 + ((ph - pt[idx]) ** 2).mean() / s_p**2 \
            + 0.1 * m.isometry_penalty(qz)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def err(red):
        with torch.no_grad():
            qh, ph = red.decode(*red.encode(qt, pt))
        return np.sqrt(((qh.numpy() - q) ** 2).sum() / ((q - q_ref) ** 2).sum())

    assert err(m) < 0.1 < 0.3 < err(lin)
    with torch.no_grad():
        z = m.encode(qt[:50], pt[:50])
        back = m.encode(*m.decode(*z))
    scale = float(z[0].std())
    assert float((back[0] - z[0]).abs().max()) < 0.05 * scale


def test_latent_hnn_force_is_the_gradient_of_its_potential():
    hnn = LatentHNN(5, 16, np.full(5, 0.7), torch.Generator().manual_seed(0), np.full(5, 0.3)).eval()
    q = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    auto = torch.autograd.grad(hnn.potential(q).sum(), q)[0]
    torch.testing.assert_close(hnn.grad_potential(q.detach()), auto)


def test_chain_hnn_force_is_the_gradient_of_its_potential_and_its_rollout_is_leapfrog():
    """full_hnn's model (round 7): MLP + (k/2) sum (q_{i+1} - q_i)^2; the closed-form force (MLP gradient +
    k x the free-end chain Laplacian) is the autograd gradient of the potential, the fused rollout equals
    repeated leapfrog steps, and with the MLP silenced the potential is exactly the chain's coupling."""
    from reprozoo.methods.ro_hnn.latent_dynamics import ChainHNN

    hnn = ChainHNN(7, 16, np.full(7, 0.7), torch.Generator().manual_seed(0), np.full(7, 0.3), substeps=2).eval()
    with torch.no_grad():
        hnn.kappa.fill_(1.3)
    q = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    auto = torch.autograd.grad(hnn.potential(q).sum(), q)[0]
    torch.testing.assert_close(hnn.grad_potential(q.detach()), auto)
    qs, ps = rollout(hnn, q.detach(), torch.randn(4, 7, dtype=torch.float64), 0.5, 3)
    qk, pk = qs[:, 0], ps[:, 0]
    for k in range(3):
        qk, pk = hnn.step(qk, pk, 0.5)
        torch.testing.assert_close(qs[:, k + 1], qk)
    with torch.no_grad():
        hnn.net[-1].weight.zero_()
        hnn.net[-1].bias.zero_()
        x = q.detach()
        k = float(torch.nn.functional.softplus(torch.tensor(1.3)))
        torch.testing.assert_close(hnn.potential(x), 0.5 * k * ((x[:, 1:] - x[:, :-1]) ** 2).sum(-1))


def _assert_vector_field_is_j_grad_h(hnn, q, p, eps=1e-6):
    """dQ = dH/dP and dP = -dH/dQ, by central finite differences of the model's own H."""
    with torch.no_grad():
        dq, dp = hnn.vector_field(q, p)
        for i in range(q.shape[1]):
            e = torch.zeros(q.shape[1], dtype=torch.float64)
            e[i] = eps
            dh_dq = (hnn.hamiltonian(q + e, p) - hnn.hamiltonian(q - e, p)) / (2 * eps)
            dh_dp = (hnn.hamiltonian(q, p + e) - hnn.hamiltonian(q, p - e)) / (2 * eps)
            torch.testing.assert_close(dq[:, i], dh_dp, rtol=1e-6, atol=1e-8)
            torch.testing.assert_close(dp[:, i], -dh_dq, rtol=1e-6, atol=1e-8)
    return dq


def test_hnn_vector_field_is_j_grad_h_by_finite_differences():
    hnn = LatentHNN(3, 16, np.ones(3), torch.Generator().manual_seed(0)).eval()
    qz, pz = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    _assert_vector_field_is_j_grad_h(hnn, qz, pz)


def test_fused_rollout_equals_repeated_leapfrog_steps():
    hnn = LatentHNN(6, 16, np.full(6, 0.7), torch.Generator().manual_seed(0), np.full(6, 0.3), substeps=3).eval()
    q, p = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    qs, ps = rollout(hnn, q, p, 0.5, 5)
    for k in range(5):
        q, p = hnn.step(q, p, 0.5)
        torch.testing.assert_close(qs[:, k + 1], q)
        torch.testing.assert_close(ps[:, k + 1], p)


def _confined_hnn(n=2, seed=0):
    """A random latent HNN plus |Q|^2 / 2 (so every orbit is bounded), for :meth:`LatentHNN.step`."""
    hnn = LatentHNN(n, 16, np.ones(n), torch.Generator().manual_seed(seed)).eval()
    hnn.potential = lambda qz, f=hnn.potential: f(qz) + 0.5 * (qz**2).sum(-1)
    hnn.grad_potential = lambda qz, g=hnn.grad_potential: g(qz) + qz
    return hnn


def test_latent_leapfrog_conserves_learned_hamiltonian():
    hnn = _confined_hnn()
    q0, p0 = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    energies = []
    for h in (0.1, 0.05):
        qs, ps = [q0], [p0]
        q, p = q0, p0
        for _ in range(int(100 / h)):
            q, p = hnn.step(q, p, h)
            qs.append(q)
            ps.append(p)
        with torch.no_grad():
            e = hnn.hamiltonian(torch.stack(qs, 1), torch.stack(ps, 1))
        rel = (e / e[:, :1] - 1).abs()
        energies.append(float(rel.max()))
        half = rel.shape[1] // 2
        assert float(rel[:, half:].max()) < 2.0 * float(rel[:, :half].max())
    assert 3.0 < energies[0] / energies[1] < 5.0


def test_decoded_one_dof_hamiltonian_rollout_has_bounded_true_energy_error():
    """RO-HNN's 'energy stays bounded' holds by construction with n = 1: leapfrog keeps the latent
    state on a closed level set of the (modified) learned Hamiltonian, so the decoded state, and any
    function of it such as the true chain energy, is periodic in time: the error over the last
    window repeats that over the first. A property of the architecture, hence a test, not a claim."""
    chain = _chain(32, 0.7, 10.0)
    rng = np.random.default_rng(0)
    q, p = chain.kink(rng.uniform(-5, 5, 200), rng.uniform(-0.3, 0.3, 200))
    q_ref = q.mean(0)
    phi = psd_cotangent_lift(q - q_ref, p, 1)
    sae = SymplecticAE(phi, q_ref, 8, 1.0, np.ones(1), torch.Generator().manual_seed(3))
    with torch.no_grad():
        sae.V.mul_(300.0)  # curved
    hnn = _confined_hnn(1, seed=1)
    with torch.no_grad():
        qz, pz = sae.encode(torch.as_tensor(q[:4]), torch.as_tensor(p[:4]))
        qs, ps = [qz], [pz]
        for _ in range(10000):  # ~300 latent periods
            qz, pz = hnn.step(qz, pz, 0.2)
            qs.append(qz)
            ps.append(pz)
        qh, ph = sae.decode(torch.stack(qs, 1), torch.stack(ps, 1))
    e = chain.energy(qh.numpy(), ph.numpy())
    err = np.abs(e - e[:, :1])
    window = 1000  # > 3 latent periods
    np.testing.assert_array_less(err[:, -window:].max(1), 1.05 * err[:, :window].max(1) + 1e-9)
    np.testing.assert_array_less(0.95 * err[:, :window].max(1), err[:, -window:].max(1) + 1e-9)


def test_state_error_scale():
    chain = _chain()
    q, p = _traj(chain, 0.1, 60.0, 10)
    mean_pred = relative_state_error(q, p, np.broadcast_to(q.mean(1, keepdims=True), q.shape),
                                     np.broadcast_to(p.mean(1, keepdims=True), p.shape))
    np.testing.assert_allclose(np.sqrt((mean_pred**2).mean(-1)), 1.0)  # time-mean prediction: 1
    assert relative_state_error(q, p, q, p).max() == 0.0


def test_general_hnn_vector_field_is_j_grad_h_by_finite_differences():
    """The ae_hnn baseline's HNN: a non-separable H(Q, P) (an MLP of both halves); its closed-form
    vector field is J grad H, and H really couples Q and P (d2H/dQdP != 0)."""
    hnn = GeneralHNN(2, 16, np.array([0.7, 1.3, 0.5, 2.0]), torch.Generator().manual_seed(1),
                     np.array([0.1, -0.2, 0.3, 0.0])).eval()
    q, p = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    dq = _assert_vector_field_is_j_grad_h(hnn, q, p)
    with torch.no_grad():
        shifted, _ = hnn.vector_field(q + 0.3, p)
    assert (shifted - dq).abs().max() > 1e-3  # dH/dP depends on Q: not separable


def test_general_hnn_implicit_midpoint_is_symplectic_and_solves_its_equation():
    """One step of the implicit midpoint rule: the fixed point solves z1 = z0 + h J grad H((z0 + z1)/2),
    and the step's Jacobian M satisfies M^T J M = J (symplectic for a non-separable H)."""
    hnn = GeneralHNN(1, 16, np.ones(2), torch.Generator().manual_seed(2), iters=40).eval()
    z0 = torch.randn(3, 2, dtype=torch.float64)
    h = 0.1
    q1, p1 = hnn.step(z0[:, :1], z0[:, 1:], h)
    with torch.no_grad():
        mq, mp = hnn.vector_field(0.5 * (z0[:, :1] + q1), 0.5 * (z0[:, 1:] + p1))
    torch.testing.assert_close(q1, z0[:, :1] + h * mq, rtol=0, atol=1e-12)
    torch.testing.assert_close(p1, z0[:, 1:] + h * mp, rtol=0, atol=1e-12)
    jmat = torch.as_tensor(poisson_matrix(1))
    for z in z0:
        m = torch.autograd.functional.jacobian(lambda x: torch.cat(hnn.step(x[None, :1], x[None, 1:], h), -1)[0], z)
        torch.testing.assert_close(m.T @ jmat @ m, jmat, rtol=0, atol=1e-10)


def test_general_hnn_rollout_keeps_its_hamiltonian_bounded():
    """Long implicit-midpoint rollouts of a confined general HNN (random MLP + |z|^2 / 2): the learned
    H oscillates without secular drift, and its error falls as h^2."""
    hnn = GeneralHNN(1, 16, np.ones(2), torch.Generator().manual_seed(0), iters=20).eval()
    h0 = hnn.hamiltonian  # s_z = 1, mean 0: the MLP's input is z itself
    hnn.hamiltonian = lambda q, p: h0(q, p) + 0.5 * (q**2 + p**2).sum(-1)
    gen_field = hnn._field
    hnn._field = lambda z, wts: gen_field(z, wts) + torch.cat([z[..., 1:], -z[..., :1]], -1)
    z0 = torch.randn(4, 2, dtype=torch.float64)
    errs = []
    with torch.no_grad():
        for h in (0.1, 0.05):
            qs, ps = hnn.integrate(z0[:, :1], z0[:, 1:], h, int(60 / h))
            e = hnn.hamiltonian(qs, ps)
            rel = (e / e[:, :1] - 1).abs()
            half = rel.shape[1] // 2
            assert float(rel[:, half:].max()) < 2.0 * float(rel[:, :half].max())
            errs.append(float(rel.max()))
    assert 3.0 < errs[0] / errs[1] < 5.0


def test_euler_control_uses_the_same_field_and_drifts_where_leapfrog_does_not():
    """The controls' ``*_euler`` evaluations: the same latent HNN's vector field stepped by explicit Euler. One step is
    z + h J grad H(z); on a confined HNN its learned energy grows secularly (Euler is not
    symplectic), while leapfrog's stays bounded: the control differs from RO-HNN in exactly that."""
    hnn = _confined_hnn(1, seed=4)
    euler = ExplicitEuler(hnn)
    q0, p0 = torch.randn(4, 1, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    with torch.no_grad():
        dq, dp = hnn.vector_field(q0, p0)
        q1, p1 = euler.step(q0, p0, 0.1)
        torch.testing.assert_close(q1, q0 + 0.1 * dq)
        torch.testing.assert_close(p1, p0 + 0.1 * dp)
        out = {}
        for name, model in (("euler", euler), ("leapfrog", hnn)):
            q, p, es = q0, p0, []
            for _ in range(2000):
                q, p = model.step(q, p, 0.1)
                es.append(hnn.hamiltonian(q, p))
            e = torch.stack(es, 1)
            out[name] = (e[:, -200:].mean(1) - e[:, :200].mean(1)) / e[:, :200].mean(1).abs()
    assert bool((out["euler"] > 0.1).all())          # secular growth
    assert bool((out["leapfrog"].abs() < 0.01).all())  # bounded


def test_psd_galerkin_with_all_modes_reproduces_the_full_chain():
    """With a complete basis (Phi = I: every mode) the intrusive Galerkin system is the chain itself:
    its leapfrog rollout equals the reference; with 8 modes it conserves the reduced Hamiltonian
    (leapfrog at the reference step: bounded, no drift) and stays on the 8-mode subspace."""
    chain = _chain(16, 0.7, 4.0)
    q, p = _traj(chain, 0.1, 20.0, 5, count=2, x0=1.0)
    q_ref = np.zeros(chain.n)
    full = PSDGalerkin(chain, np.eye(chain.n), q_ref, 5)
    qs, ps = full.integrate(q[:, 0], p[:, 0], 0.5, q.shape[1] - 1)
    np.testing.assert_allclose(qs, q, atol=1e-9)
    np.testing.assert_allclose(ps, p, atol=1e-9)

    q_ref = q.reshape(-1, chain.n).mean(0)
    phi = psd_cotangent_lift(q.reshape(-1, chain.n) - q_ref, p.reshape(-1, chain.n), 8)
    gal = PSDGalerkin(chain, phi, q_ref, 5)
    qz, pz = (q[:, 0] - q_ref) @ phi, p[:, 0] @ phi
    zq, zp = gal.integrate(qz, pz, 0.5, 400)
    h = gal.hamiltonian(zq, zp)
    rel = np.abs(h / h[:, :1] - 1)
    assert rel.max() < 1e-2
    assert rel[:, 200:].max() < 2.0 * rel[:, :200].max() + 1e-12  # bounded oscillation, no secular drift
    # the reduced force is the projected chain force
    np.testing.assert_allclose(gal.force(qz), -chain.grad_potential(q_ref + qz @ phi.T) @ phi)


def test_valid_prediction_time():
    err = np.array([[0.1, 0.2, 0.6, 0.1, 0.9],     # first exceeds 0.5 at index 2
                    [0.1, 0.1, 0.1, 0.1, 0.1],     # never: the rollout's length
                    [0.7, 0.1, 0.1, 0.1, 0.1]])    # at t = 0
    np.testing.assert_allclose(valid_prediction_time(err, 0.5, 2.0, 4.0), [1.0, 2.0, 0.0])


def test_rk4_evaluation_uses_the_same_field_at_fourth_order():
    """ro_hnn's ``*_rk4`` metrics: the trained HNN's own field J grad H stepped by classical RK4;
    one step's error against a fine leapfrog solution falls ~16x when h halves (fourth order)."""
    hnn = _confined_hnn(2, seed=5)
    rk = RK4Stepper(hnn)
    q0, p0 = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    with torch.no_grad():
        errs = []
        for h in (0.2, 0.1):
            qr, pr = q0, p0
            for _ in range(int(round(1.0 / h))):
                qr, pr = rk.step(qr, pr, h)
            qf, pf = q0, p0
            for _ in range(4000):
                qf, pf = hnn.step(qf, pf, 1.0 / 4000)
            errs.append(float(torch.cat([qr - qf, pr - pf], -1).abs().max()))
    assert 10.0 < errs[0] / errs[1] < 40.0  # 2^4 = 16, pre-asymptotic spread


def test_energy_drift_sees_drift_not_phase_or_decoder_offset():
    """The energy drift is measured against the decoded reference's mean energy, window by window:
    (a) the reference itself scores ~0 (leapfrog's O(dt^2) oscillation), (b) so does a dephased copy
    (the same orbits, shifted in time: conserving, out of phase), (c) a decoder with a constant energy
    offset (momenta scaled: both the prediction and the decoded reference) scores well below the same
    prediction's error against H(x0) (what is left: the window mean of the offset's oscillation along
    the orbit), and (d) a
    prediction whose energy grows scores more in the last window than in the first."""
    chain = _chain(32, 0.7, 6.0)
    q, p = _traj(chain, 0.1, 400.0, 20, count=4, x0=2.0)   # 201 points, windows of 20 (k = 20)
    e0 = chain.energy(q[:, 0], p[:, 0])
    e_rest = float(chain.energy(*chain.kink(0.0, 0.0)))
    k = 20
    base = energy_drift(chain, e0, e_rest, q, p, q, p, k)["windows"]
    assert base.shape == (4, 10) and base.max() < 2e-3
    shifted = energy_drift(chain, e0, e_rest, np.roll(q, 37, 1), np.roll(p, 37, 1), q, p, k)["windows"]
    assert shifted.max() < 2e-3
    offset = energy_drift(chain, e0, e_rest, q, 1.3 * p, q, 1.3 * p, k)["windows"]
    naive = np.abs(chain.energy(q, 1.3 * p) - e0[:, None]) / (e0 - e_rest)[:, None]  # against H(x0)
    assert offset.mean() < 0.25 * naive.mean()  # the offset is gone; the oscillation's window residual stays
    grow = (1 + 0.3 * np.linspace(0, 1, q.shape[1]))[None, :, None]
    up = energy_drift(chain, e0, e_rest, q, grow * p, q, p, k)["windows"]
    assert (up[:, -1] > 2 * up[:, 0]).all()
    m = long_horizon_metrics(chain, q, p, q, grow * p, e_rest, k, 0.5, 20.0)
    np.testing.assert_allclose(m["energy_err_last"], up[:, -1])
    np.testing.assert_allclose(m["energy_err_long"], up.mean(1))
    np.testing.assert_allclose(m["energy_growth"], np.log10(up[:, -1] / up[:, 0]))


def test_energy_growth_is_the_per_trajectory_log_ratio_and_bounds_a_blow_up():
    """energy_growth (node_energy_drifts' unit): log10(last window / first window) per trajectory: 0 for
    a constant drift, log10 2 for a doubling; a trajectory clipped at 1e3 (a blow-up) shifts the mean
    over 64 trajectories by at most log10(1e3 / first) / 64, where the ratio of the windows' means
    follows it (the design change of round 7)."""
    from reprozoo.methods.ro_hnn.method import energy_growth

    flat = np.full((4, 10), 0.05)
    np.testing.assert_allclose(energy_growth(flat), 0.0, atol=1e-15)
    double = np.stack([np.linspace(0.1, 0.2, 10)] * 3)
    np.testing.assert_allclose(energy_growth(double), np.log10(2.0))
    w = np.tile(np.linspace(0.1, 0.2, 10), (64, 1))
    w[0, -1] = 1e3
    assert energy_growth(w).mean() - np.log10(2.0) < np.log10(1e3 / 0.1) / 64 + 1e-12
    assert w[:, -1].mean() / w[:, 0].mean() > 100  # the old statistic: one trajectory decides it
    assert np.isfinite(energy_growth(np.zeros((2, 3)))).all()  # a zero window is floored, not -inf


def test_full_state_reduction_is_the_identity_up_to_the_reference():
    q_ref = np.linspace(0, 1, 5)
    red = FullState(q_ref)
    q, p = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    qz, pz = red.encode(q, p)
    torch.testing.assert_close(qz, q - torch.as_tensor(q_ref))
    qh, ph = red.decode(qz, pz)
    torch.testing.assert_close(qh, q)
    torch.testing.assert_close(ph, p)


def _shared_reductions(tmp_path):
    """A small chain's data, the ci model config, and its reductions fitted once into ``tmp_path``."""
    from reprozoo.methods.ro_hnn.method import fit_shared_reductions

    ci = yaml.safe_load((CONFIGS / "ci.yaml").read_text())
    chain = _chain(16, 0.7, 4.0)
    q, p = _traj(chain, 0.1, 16.0, 20, count=3, x0=1.0)
    d = {"q_train": q[:2], "p_train": p[:2], "q_val": q[2:], "p_val": p[2:]}
    cfg = dict(ci["model"], ae_width=8)
    fit_shared_reductions(d, cfg, ci["fit"], 0, tmp_path, progress=lambda *a: None)
    return ci, q, p, d, cfg


def test_shared_reductions_load_the_weights_a_per_variant_fit_gives(tmp_path):
    """The learned reductions are fitted once per seed in train_shared and loaded by the variants that
    use them: the loaded model equals a fit of its own (same data, seed and rule), and its record is
    the fit's (what the convergence gate reads as val_ae)."""
    from reprozoo.methods.ro_hnn.method import fit_reduction, load_reduction

    ci, q, p, d, cfg = _shared_reductions(tmp_path)
    x = (torch.as_tensor(q[2]), torch.as_tensor(p[2]))
    for variant in ("ro_hnn", "sae_ghnn", "sae_node", "ae_node", "ae_hnn"):
        own, rec = fit_reduction(variant, d, cfg, ci["fit"], 0, progress=lambda *a: None)
        loaded, shared_rec = load_reduction(variant, d, cfg, 0, tmp_path)
        with torch.no_grad():
            for a, b in zip(own.encode(*x), loaded.encode(*x)):
                torch.testing.assert_close(a, b)
        assert shared_rec["vals"] == rec["vals"] and shared_rec["steps"] == rec["steps"]
    red, none = load_reduction("full_hnn", d, cfg, 0, tmp_path)
    assert none is None and isinstance(red, FullState)


def test_sae_node_control_is_ro_hnns_reduction_with_the_neural_ode_of_ae_node(tmp_path):
    """sae_node (the control of beats_node and energy_below_node) loads RO-HNN's symplectic autoencoder
    (the same weights) and fits ae_node's latent neural ODE, stepped by RK4: only the latent model differs
    from ro_hnn, only the reduction from ae_node."""
    from reprozoo.methods.ro_hnn.latent_dynamics import LatentNODE
    from reprozoo.methods.ro_hnn.method import fit_dynamics, load_reduction

    ci, q, p, d, cfg = _shared_reductions(tmp_path)
    sae, _ = load_reduction("sae_node", d, cfg, 0, tmp_path)
    ro, _ = load_reduction("ro_hnn", d, cfg, 0, tmp_path)
    assert isinstance(sae, SymplecticAE)
    for a, b in zip(sae.state_dict().values(), ro.state_dict().values()):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        z = [a.detach().numpy() for a in sae.encode(torch.as_tensor(q[:2]), torch.as_tensor(p[:2]))]
        zv = [a.detach().numpy() for a in sae.encode(torch.as_tensor(q[2:]), torch.as_tensor(p[2:]))]
    f = dict(ci["fit"], max_steps=10, min_steps=5, pilot_steps=2)
    dyn, _ = fit_dynamics("sae_node", z, zv, cfg, f, 2.0, 0, progress=lambda *a: None)
    node, _ = fit_dynamics("ae_node", z, zv, cfg, f, 2.0, 0, progress=lambda *a: None)
    assert isinstance(dyn, LatentNODE) and type(dyn) is type(node)
    # one step is classical RK4 of the learned field (fourth order: halving h cuts the one-step error ~32x)
    z0 = torch.as_tensor(np.concatenate(z, -1)[0, :1])
    n = z0.shape[-1] // 2

    def step_err(h):
        with torch.no_grad():
            qs, ps = dyn.step(z0[:, :n], z0[:, n:], h)
            # reference: RK4 with 64 sub-steps (accurate to far below the one-step error at h)
            ref = z0.clone()
            for _ in range(64):
                qr, pr = dyn.step(ref[:, :n], ref[:, n:], h / 64)
                ref = torch.cat([qr, pr], -1)
        return float((torch.cat([qs, ps], -1) - ref).abs().max())

    e1, e2 = step_err(1.0), step_err(0.5)
    assert e2 < e1 / 12 or e1 < 1e-10
