"""Latent dynamics on z = (Q, P), one step of size h, batched over rows.

* HNN (RO-HNN and PSD + HNN): H_theta(Q, P) = |P|^2 / 2 + V_theta(Q), V_theta an MLP. The vector
  field is J grad H = (dH/dP, -dH/dQ) = (P, -grad V_theta(Q)); it is integrated by leapfrog
  (``blocks.symplectic.leapfrog_step``), so the learned latent flow is symplectic and conserves a
  modified H_theta for exponentially long times. Unit latent mass: the reductions keep the
  latent kinetic energy |P|^2 / 2 (orthonormal PSD basis; isometry penalty of the symplectic AE).
* Neural ODE (plain AE baseline): dz/dt = f_theta(z), an MLP, integrated by classical RK4
  (``blocks.ode.rk_increment``): no conserved quantity is built in.
Both are trained on the same windows of encoded training trajectories, by rolling out K steps
and matching the encoded states (latent MSE scaled by the latent spread).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...blocks.ode import RK4, rk_increment
from ...blocks.symplectic import leapfrog_step
from .reductions import _mlp


class LatentHNN(nn.Module):
    def __init__(self, n: int, width: int, s_q: np.ndarray, gen: torch.Generator):
        super().__init__()
        self.net = _mlp(n, width, 1, gen)
        self.register_buffer("s_q", torch.as_tensor(s_q))

    def potential(self, qz):
        return self.net(qz / self.s_q).squeeze(-1)

    def hamiltonian(self, qz, pz):
        return 0.5 * (pz**2).sum(-1) + self.potential(qz)

    def grad_potential(self, qz):
        with torch.enable_grad():
            qz = qz if qz.requires_grad else qz.requires_grad_(True)
            v = self.potential(qz).sum()
            return torch.autograd.grad(v, qz, create_graph=self.training)[0]

    def vector_field(self, qz, pz):
        """J grad H = (dH/dP, -dH/dQ)."""
        return pz, -self.grad_potential(qz)

    def step(self, qz, pz, h: float):
        return leapfrog_step(qz, pz, self.grad_potential, h)


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
    qs, ps = [qz], [pz]
    for _ in range(steps):
        qz, pz = model.step(qz, pz, h)
        qs.append(qz)
        ps.append(pz)
    return torch.stack(qs, 1), torch.stack(ps, 1)
