"""The reductions of the 2N-dim phase space x = (q, p) to a 2n-dim latent z = (Q, P).

Every reduction is taken about the training snapshots' mean configuration q_ref (a translation of
q, itself symplectic), so the linear and nonlinear reductions start from the same place.

* PSD, cotangent lift (Peng & Mohseni 2016): Phi [N, n] = the n leading left singular vectors of
  the snapshot matrix [q_1 - q_ref .. q_M - q_ref, p_1 .. p_M]. A = blockdiag(Phi, Phi) has
  orthonormal columns and A^T J_2N A = J_2n, so x = (q_ref, 0) + A z is a linear symplectic
  embedding; z = A^T (x - (q_ref, 0)).
* Symplectic autoencoder (RO-HNN's geometric constraint, our construction): a nonlinear point
  embedding q = phi(Q) = q_ref + U Q + V tanh(W Q / s + b) and its cotangent lift
      p = J (J^T J)^{-1} P,      P = J^T p,        J = d phi / dQ  [N, n].
  The lift pulls the tautological form back exactly: p . dq = P^T (J^T J)^{-1} J^T J dQ = P . dQ,
  hence dq ^ dp = dQ ^ dP for every weight value: the decoder is symplectic by construction, not
  by a penalty. The encoder Q = psi(q) = U^T (q - q_ref) + C tanh(D (q - q_ref) / s_q + e) is
  learned (reconstruction); its momentum half P = J(psi(q))^T p is the exact left inverse of the
  lift on the manifold. A penalty |J^T J - I|^2 keeps the embedding near-isometric (Q measured in
  arc length), so the latent kinetic energy P^T (J^T J)^{-1} P / 2 stays |P|^2 / 2 and the
  separable latent HNN is consistent with it.
* Plain autoencoder (baseline): x_hat = ((q - q_ref)/s_q, p/s_p), z = L^T x_hat + MLP(x_hat),
  x_hat = L z + MLP(z), L initialised by POD; no structure.
Both autoencoders start from their linear counterpart (U = Phi, L = POD basis), so the nonlinear
part has to learn the curvature the linear basis misses. The hidden units of the symplectic
decoder start with their switch points -b/W spread uniformly over twice the latent data range
(slopes W ~ 3 N(0, 1) on the scaled latent): a generic initialisation of a one-hidden-layer tanh
network, which lets every unit take part from the first step.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


def psd_cotangent_lift(q: np.ndarray, p: np.ndarray, n: int) -> np.ndarray:
    """Phi [N, n] from (centred) snapshots q, p [M, N] (cotangent lift: one basis for q and p)."""
    u, _, _ = np.linalg.svd(np.concatenate([q, p], axis=0).T, full_matrices=False)
    return u[:, :n]


def symplectic_lift_matrix(phi: np.ndarray) -> np.ndarray:
    """A = blockdiag(Phi, Phi) [2N, 2n]."""
    big, small = phi.shape
    a = np.zeros((2 * big, 2 * small))
    a[:big, :small] = phi
    a[big:, small:] = phi
    return a


def poisson_matrix(n: int) -> np.ndarray:
    """J_2n = [[0, I], [-I, 0]]."""
    return np.block([[np.zeros((n, n)), np.eye(n)], [-np.eye(n), np.zeros((n, n))]])


class LinearPSD:
    """Fixed linear symplectic reduction about q_ref (no trainable parameters)."""

    def __init__(self, phi: np.ndarray, q_ref: np.ndarray):
        self.phi, self.q_ref = torch.as_tensor(phi), torch.as_tensor(q_ref)

    def parameters(self):
        return []

    def encode(self, q, p):
        return (q - self.q_ref) @ self.phi, p @ self.phi

    def decode(self, qz, pz):
        return self.q_ref + qz @ self.phi.T, pz @ self.phi.T


class FullState:
    """No reduction (the full-dimensional HNN): z = (q - q_ref, p), the identity up to a translation
    of q (symplectic)."""

    def __init__(self, q_ref: np.ndarray):
        self.q_ref = torch.as_tensor(q_ref)

    def parameters(self):
        return []

    def encode(self, q, p):
        return q - self.q_ref, p.clone()

    def decode(self, qz, pz):
        return self.q_ref + qz, pz.clone()


class SymplecticAE(nn.Module):
    def __init__(self, phi: np.ndarray, q_ref: np.ndarray, width: int, s_q: float, s_latent: np.ndarray,
                 gen: torch.Generator):
        super().__init__()
        big, n = phi.shape
        f64 = torch.float64
        self.U = nn.Parameter(torch.as_tensor(phi).clone())
        w = 3.0 * torch.randn(width, n, generator=gen, dtype=f64)
        centres = (2 * torch.rand(width, n, generator=gen, dtype=f64) - 1) * 2.0  # +-2 latent std
        self.W = nn.Parameter(w)
        self.b = nn.Parameter(-(w * centres).sum(-1))
        self.V = nn.Parameter(1e-3 * torch.randn(big, width, generator=gen, dtype=f64))
        self.D = nn.Parameter(torch.randn(width, big, generator=gen, dtype=f64) / np.sqrt(big))
        self.e = nn.Parameter(0.1 * torch.randn(width, generator=gen, dtype=f64))
        self.C = nn.Parameter(torch.zeros(n, width, dtype=f64))
        self.s_q = s_q
        self.register_buffer("q_ref", torch.as_tensor(q_ref))
        self.register_buffer("s_z", torch.as_tensor(s_latent))

    def phi(self, qz):
        return self.q_ref + qz @ self.U.T + torch.tanh((qz / self.s_z) @ self.W.T + self.b) @ self.V.T

    def jacobian(self, qz):
        """d phi / dQ, [..., N, n], in closed form."""
        sech2 = 1 - torch.tanh((qz / self.s_z) @ self.W.T + self.b) ** 2
        return self.U + torch.einsum("nh,...h,hk->...nk", self.V, sech2, self.W / self.s_z)

    def encode(self, q, p):
        dq = q - self.q_ref
        qz = dq @ self.U + torch.tanh(dq @ self.D.T / self.s_q + self.e) @ self.C.T
        return qz, torch.einsum("...nk,...n->...k", self.jacobian(qz), p)

    def decode(self, qz, pz):
        jac = self.jacobian(qz)
        gram = jac.transpose(-1, -2) @ jac
        return self.phi(qz), torch.einsum("...nk,...k->...n", jac, torch.linalg.solve(gram, pz))

    def isometry_penalty(self, qz):
        jac = self.jacobian(qz)
        eye = torch.eye(jac.shape[-1], dtype=jac.dtype)
        return ((jac.transpose(-1, -2) @ jac - eye) ** 2).sum((-1, -2)).mean()


def _mlp(d_in: int, width: int, d_out: int, gen: torch.Generator, last_scale: float = 1.0):
    net = nn.Sequential(nn.Linear(d_in, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                        nn.Linear(width, d_out)).double()
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen, dtype=torch.float64) / np.sqrt(m.in_features))
                m.bias.zero_()
        net[-1].weight.mul_(last_scale)
    return net


class PlainAE(nn.Module):
    """Unstructured autoencoder on the scaled, centred state; latent halves are just z[:n], z[n:]."""

    def __init__(self, pod: np.ndarray, q_ref: np.ndarray, width: int, s_q: float, s_p: float,
                 gen: torch.Generator):
        super().__init__()
        self.L = nn.Parameter(torch.as_tensor(pod).clone())
        two_big, two_n = pod.shape
        self.enc = _mlp(two_big, width, two_n, gen, last_scale=1e-3)
        self.dec = _mlp(two_n, width, two_big, gen, last_scale=1e-3)
        self.n, self.s_q, self.s_p = two_n // 2, s_q, s_p
        self.register_buffer("q_ref", torch.as_tensor(q_ref))

    def encode(self, q, p):
        x = torch.cat([(q - self.q_ref) / self.s_q, p / self.s_p], -1)
        z = x @ self.L + self.enc(x)
        return z[..., :self.n], z[..., self.n:]

    def decode(self, qz, pz):
        z = torch.cat([qz, pz], -1)
        x = z @ self.L.T + self.dec(z)
        big = x.shape[-1] // 2
        return self.q_ref + x[..., :big] * self.s_q, x[..., big:] * self.s_p
