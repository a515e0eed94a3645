"""Latent dynamics on z = (Q, P), one step of size h, batched over rows.

* HNN (RO-HNN and PSD + HNN): H_theta(Q, P) = |P|^2 / 2 + V_theta(Q), V_theta an MLP. The vector
  field is J grad H = (dH/dP, -dH/dQ) = (P, -grad V_theta(Q)); it is integrated by leapfrog
  (velocity Verlet), so the learned latent flow is symplectic and conserves a
  modified H_theta for exponentially long times. Unit latent mass: the reductions keep the
  latent kinetic energy |P|^2 / 2 (orthonormal PSD basis; isometry penalty of the symplectic AE).
* Neural ODE (plain AE baseline): dz/dt = f_theta(z), an MLP, integrated by classical RK4
  (``blocks.ode.rk_increment``): no conserved quantity is built in.
* Plain autoencoder + HNN (ablation): the same latent HNN with a learned diagonal inverse mass
  (initialised by least squares on dQ/dt = minv P of the encoded training trajectories), leapfrog.
All are trained on the same windows of (encoded) training trajectories, by rolling out K sampling
intervals and matching the (encoded) states (MSE scaled by each coordinate's spread).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...blocks.ode import RK4, rk_increment
from .reductions import _mlp


class LatentHNN(nn.Module):
    """H = P^T diag(minv) P / 2 + V_theta(Q). ``minv`` (the inverse latent mass) is fixed at 1 for
    the symplectic reductions (their latent is canonical with unit mass by construction); given an
    initial value it is learned (the plain autoencoder + HNN baseline, whose latent halves are not
    canonical: the data-fitted inverse mass, possibly negative, lets the HNN match dQ/dt = minv P)."""

    def __init__(self, n: int, width: int, s_q: np.ndarray, gen: torch.Generator, q_mean=None, substeps: int = 1,
                 minv=None):
        super().__init__()
        self.net = _mlp(n, width, 1, gen)
        self.register_buffer("s_q", torch.as_tensor(s_q))
        self.register_buffer("q_mean", torch.as_tensor(np.zeros(n) if q_mean is None else q_mean))
        if minv is None:
            self.register_buffer("minv", torch.ones(n, dtype=torch.float64))
        else:
            self.minv = nn.Parameter(torch.as_tensor(np.asarray(minv, float)).clone())
        self.substeps = int(substeps)

    def potential(self, qz):
        return self.net((qz - self.q_mean) / self.s_q).squeeze(-1)

    def hamiltonian(self, qz, pz):
        return 0.5 * (self.minv * pz**2).sum(-1) + self.potential(qz)

    def _folded(self):
        """The weights with the input scaling folded in: u = (Q - mean) / s, so
        W1 u + b1 = (W1 / s) Q + (b1 - (W1 / s) mean). Computed once per rollout."""
        lin1, lin2, lin3 = self.net[0], self.net[2], self.net[4]
        w1 = lin1.weight / self.s_q
        return w1, lin1.bias - w1 @ self.q_mean, lin2.weight, lin2.bias, lin3.weight[0]

    @staticmethod
    def _grad(qz, w1, b1, w2, b2, w3):
        h1 = torch.tanh(torch.addmm(b1, qz, w1.T))
        h2 = torch.tanh(torch.addmm(b2, h1, w2.T))
        g1 = torch.addcmul(w3, w3, h2 * h2, value=-1) @ w2
        return torch.addcmul(g1, g1, h1 * h1, value=-1) @ w1

    def grad_potential(self, qz):
        """dV/dQ in closed form (the chain rule through the two tanh layers, written out): a plain
        forward computation, so training needs first-order autograd only (no double backward)."""
        shape = qz.shape
        return self._grad(qz.reshape(-1, shape[-1]), *self._folded()).reshape(shape)

    def vector_field(self, qz, pz):
        """J grad H = (dH/dP, -dH/dQ)."""
        return self.minv * pz, -self.grad_potential(qz)

    def step(self, qz, pz, h: float):
        dt = h / self.substeps
        for _ in range(self.substeps):  # velocity Verlet of H = P minv P / 2 + V(Q)
            p_half = pz - 0.5 * dt * self.grad_potential(qz)
            qz = qz + dt * (self.minv * p_half)
            pz = p_half - 0.5 * dt * self.grad_potential(qz)
        return qz, pz

    def integrate(self, qz, pz, h: float, steps: int):
        """``steps`` calls of :meth:`step` on [batch, n] states, with the force at the end of one
        leapfrog step reused at the start of the next and the two half kicks between sub-steps
        merged (the same numbers, one force evaluation per sub-step)."""
        dt = h / self.substeps
        wts = self._folded()
        qs, ps = [qz], [pz]
        p_half = torch.add(pz, self._grad(qz, *wts), alpha=-0.5 * dt)
        for i in range(steps):
            for j in range(self.substeps):
                qz = torch.add(qz, self.minv * p_half, alpha=dt)
                g = self._grad(qz, *wts)
                if j < self.substeps - 1:
                    p_half = torch.add(p_half, g, alpha=-dt)
            pz = torch.add(p_half, g, alpha=-0.5 * dt)
            qs.append(qz)
            ps.append(pz)
            if i < steps - 1:
                p_half = torch.add(pz, g, alpha=-0.5 * dt)
        return torch.stack(qs, 1), torch.stack(ps, 1)


class LatentNODE(nn.Module):
    def __init__(self, n: int, width: int, s_z: np.ndarray, gen: torch.Generator):
        super().__init__()
        self.net = _mlp(2 * n, width, 2 * n, gen, last_scale=0.1)
        self.register_buffer("s_z", torch.as_tensor(s_z))
        self.n = n

    def field(self, z, t=0.0):
        return self.net(z / self.s_z) * self.s_z

    def step(self, qz, pz, h: float):
        z = torch.cat([qz, pz], -1)
        z = z + rk_increment(self.field, z, 0.0, h, RK4)
        return z[..., :self.n], z[..., self.n:]


def rollout(model, qz, pz, h: float, steps: int):
    """States at steps 0..steps, stacked on axis 1: [batch, steps + 1, n] each."""
    if isinstance(model, LatentHNN):
        return model.integrate(qz, pz, h, steps)
    qs, ps = [qz], [pz]
    for _ in range(steps):
        qz, pz = model.step(qz, pz, h)
        qs.append(qz)
        ps.append(pz)
    return torch.stack(qs, 1), torch.stack(ps, 1)
