"""RO-HNN numerics: FPU reference conserves energy, PSD and the symplectic AE are symplectic,
the latent HNN's field is J grad H, latent leapfrog conserves the learned Hamiltonian."""
import numpy as np
import pytest
import torch

from reprozoo.methods.ro_hnn import fpu
from reprozoo.methods.ro_hnn.latent_dynamics import LatentHNN, rollout
from reprozoo.methods.ro_hnn.method import relative_state_error, slaving_r2
from reprozoo.methods.ro_hnn.reductions import (SymplecticAE, poisson_matrix, psd_cotangent_lift,
                                                symplectic_lift_matrix)


def _traj(dt, steps, every=1, n=20, seed=0):
    q0, p0 = fpu.initial_states(3, n, [1, 2], (2.0, 4.0), np.random.default_rng(seed))
    return fpu.simulate(q0, p0, 1.0, dt, every, steps)


def test_grad_potential_matches_finite_differences():
    q = np.random.default_rng(0).normal(size=(3, 10))
    g, eps = fpu.grad_potential(q, 0.7), 1e-6
    for i in range(10):
        e = np.zeros(10)
        e[i] = eps
        fd = (fpu.potential(q + e, 0.7) - fpu.potential(q - e, 0.7)) / (2 * eps)
        np.testing.assert_allclose(g[:, i], fd, rtol=1e-6, atol=1e-8)


def test_reference_conserves_energy_with_bounded_second_order_error():
    errs = []
    for dt in (0.2, 0.1):
        q, p = _traj(dt, int(200 / dt), every=int(1 / dt))
        e = fpu.energy(q, p, 1.0)
        rel = np.abs(e / e[:, :1] - 1)
        errs.append(rel.max())
        half = rel.shape[1] // 2
        assert rel[:, half:].max() < 2.0 * rel[:, :half].max() + 1e-12  # bounded, no drift
    assert errs[0] < 1e-2
    assert 3.0 < errs[0] / errs[1] < 5.0  # O(dt^2)


def test_normal_modes_diagonalise_the_linear_chain():
    s, w = fpu.normal_modes(12)
    np.testing.assert_allclose(s.T @ s, np.eye(12), atol=1e-12)
    k = np.diag(np.full(12, 2.0)) - np.diag(np.ones(11), 1) - np.diag(np.ones(11), -1)
    np.testing.assert_allclose(s.T @ k @ s, np.diag(w**2), atol=1e-12)


def test_psd_basis_is_symplectic_and_recovers_planted_modes():
    q, p = _traj(0.1, 300, every=10)
    phi = psd_cotangent_lift(q.reshape(-1, 20), p.reshape(-1, 20), 2)
    a = symplectic_lift_matrix(phi)
    np.testing.assert_allclose(a.T @ poisson_matrix(20) @ a, poisson_matrix(2), atol=1e-12)
    np.testing.assert_allclose(a.T @ a, np.eye(4), atol=1e-12)
    s, _ = fpu.normal_modes(20)
    # weak nonlinearity: the leading PSD subspace is (nearly) the excited modes 1 and 2
    assert np.linalg.svd(s[:, :2].T @ phi, compute_uv=False).min() > 0.99


@pytest.fixture
def sae():
    gen = torch.Generator().manual_seed(0)
    phi = np.linalg.qr(np.random.default_rng(1).normal(size=(8, 2)))[0]
    m = SymplecticAE(phi, 6, 1.0, np.ones(2), gen)
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


def test_hnn_vector_field_is_j_grad_h_by_finite_differences():
    hnn = LatentHNN(3, 16, np.ones(3), torch.Generator().manual_seed(0)).eval()
    qz, pz = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    dq, dp = hnn.vector_field(qz, pz)
    eps = 1e-6
    with torch.no_grad():
        for i in range(3):
            e = torch.zeros(3, dtype=torch.float64)
            e[i] = eps
            dh_dq = (hnn.hamiltonian(qz + e, pz) - hnn.hamiltonian(qz - e, pz)) / (2 * eps)
            dh_dp = (hnn.hamiltonian(qz, pz + e) - hnn.hamiltonian(qz, pz - e)) / (2 * eps)
            torch.testing.assert_close(dq[:, i], dh_dp, rtol=1e-6, atol=1e-8)
            torch.testing.assert_close(dp[:, i], -dh_dq, rtol=1e-6, atol=1e-8)


def test_latent_leapfrog_conserves_learned_hamiltonian():
    hnn = LatentHNN(2, 16, np.ones(2), torch.Generator().manual_seed(0)).eval()
    hnn.potential = lambda qz, f=hnn.potential: f(qz) + 0.5 * (qz**2).sum(-1)
    q0, p0 = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    energies = []
    for h in (0.1, 0.05):
        qs, ps = rollout(hnn, q0, p0, h, int(100 / h))
        with torch.no_grad():
            e = hnn.hamiltonian(qs, ps)
        rel = (e / e[:, :1] - 1).abs()
        energies.append(float(rel.max()))
        half = rel.shape[1] // 2
        assert float(rel[:, half:].max()) < 2.0 * float(rel[:, :half].max())
    assert 3.0 < energies[0] / energies[1] < 5.0


def test_state_error_scale_and_slaving_diagnostic():
    q, p = _traj(0.1, 200, every=10)
    err0 = relative_state_error(q, p, 0 * q, 0 * p)  # zero prediction: 1 in the time-RMS
    np.testing.assert_allclose(np.sqrt((err0**2).mean(-1)), 1.0)
    assert relative_state_error(q, p, q, p).max() == 0.0
    # planted slaving: mode-3 amplitude an exact cubic of the mode-1 amplitude
    s, _ = fpu.normal_modes(20)
    a1 = np.linspace(-1, 1, 200)
    assert slaving_r2(np.outer(a1, s[:, 0]) + np.outer(0.3 * a1**3, s[:, 2]), [1]) > 1 - 1e-10
    assert slaving_r2(np.outer(a1, s[:, 0]) + np.outer(np.random.default_rng(0).normal(size=200), s[:, 2]), [1]) < 0.1
