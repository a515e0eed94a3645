"""Latent dynamics on z = (Q, P), one step of size h, batched over rows.

* HNN (RO-HNN and PSD + HNN): H_theta(Q, P) = |P|^2 / 2 + V_theta(Q), V_theta an MLP. The vector
  field is J grad H = (dH/dP, -dH/dQ) = (P, -grad V_theta(Q)); it is integrated by leapfrog
  (velocity Verlet), so the learned latent flow is symplectic and conserves a
  modified H_theta for exponentially long times. Unit latent mass: the reductions keep the
  latent kinetic energy |P|^2 / 2 (orthonormal PSD basis; isometry penalty of the symplectic AE).
* Controls (evaluation only, the trained weights of RO-HNN or of its general-HNN ablation): the same
  vector field integrated by explicit Euler (``ExplicitEuler``) or classical RK4 (``RK4Stepper``).
* Neural ODE (plain AE baseline): dz/dt = f_theta(z), an MLP, integrated by classical RK4
  (``blocks.ode.rk_increment``): no conserved quantity is built in.
* Plain autoencoder + general HNN (baseline): the plain autoencoder's latent halves are not
  canonical and need not carry a separable energy, so its HNN is general: H_theta(Q, P) an MLP of
  both halves (non-separable), integrated by the implicit midpoint rule (symplectic for every H;
  solved by fixed-point iteration from an explicit Euler guess, differentiated through the iterations).
All are trained on the same windows of (encoded) training trajectories, by rolling out K sampling
intervals and matching the (encoded) states (MSE scaled by each coordinate's spread).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...blocks.ode import RK4, rk_increment
from .reductions import _mlp


def _folded_grad(net, scale, mean):
    """The weights of a two-hidden-layer tanh MLP with its input scaling u = (x - mean) / scale folded
    in: W1 u + b1 = (W1 / s) x + (b1 - (W1 / s) mean). Computed once per rollout."""
    lin1, lin2, lin3 = net[0], net[2], net[4]
    w1 = lin1.weight / scale
    return w1, lin1.bias - w1 @ mean, lin2.weight, lin2.bias, lin3.weight[0]


def _mlp_grad(x, w1, b1, w2, b2, w3):
    """d MLP / d x in closed form (the chain rule through the two tanh layers, written out): a plain
    forward computation, so training needs first-order autograd only (no double backward)."""
    h1 = torch.tanh(torch.addmm(b1, x, w1.T))
    h2 = torch.tanh(torch.addmm(b2, h1, w2.T))
    g1 = torch.addcmul(w3, w3, h2 * h2, value=-1) @ w2
    return torch.addcmul(g1, g1, h1 * h1, value=-1) @ w1


class LatentHNN(nn.Module):
    """H = |P|^2 / 2 + V_theta(Q): unit latent mass, as the symplectic reductions' latent is canonical
    with unit mass by construction (orthonormal PSD basis; isometric symplectic autoencoder)."""

    def __init__(self, n: int, width: int, s_q: np.ndarray, gen: torch.Generator, q_mean=None, substeps: int = 1):
        super().__init__()
        self.net = _mlp(n, width, 1, gen)
        self.register_buffer("s_q", torch.as_tensor(s_q))
        self.register_buffer("q_mean", torch.as_tensor(np.zeros(n) if q_mean is None else q_mean))
        self.substeps = int(substeps)

    def potential(self, qz):
        return self.net((qz - self.q_mean) / self.s_q).squeeze(-1)

    def hamiltonian(self, qz, pz):
        return 0.5 * (pz**2).sum(-1) + self.potential(qz)

    def _folded(self):
        return _folded_grad(self.net, self.s_q, self.q_mean)

    _grad = staticmethod(_mlp_grad)

    def grad_potential(self, qz):
        """dV/dQ in closed form (``_mlp_grad``)."""
        shape = qz.shape
        return self._grad(qz.reshape(-1, shape[-1]), *self._folded()).reshape(shape)

    def vector_field(self, qz, pz):
        """J grad H = (dH/dP, -dH/dQ)."""
        return pz, -self.grad_potential(qz)

    def step(self, qz, pz, h: float):
        dt = h / self.substeps
        for _ in range(self.substeps):  # velocity Verlet of H = |P|^2 / 2 + V(Q)
            p_half = pz - 0.5 * dt * self.grad_potential(qz)
            qz = qz + dt * p_half
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
                qz = torch.add(qz, p_half, alpha=dt)
                g = self._grad(qz, *wts)
                if j < self.substeps - 1:
                    p_half = torch.add(p_half, g, alpha=-dt)
            pz = torch.add(p_half, g, alpha=-0.5 * dt)
            qs.append(qz)
            ps.append(pz)
            if i < steps - 1:
                p_half = torch.add(pz, g, alpha=-0.5 * dt)
        return torch.stack(qs, 1), torch.stack(ps, 1)


class ChainHNN(LatentHNN):
    """The full-dimensional HNN (no reduction): H = |p|^2 / 2 + V_theta(q) + (k / 2) sum_i (q_{i+1} - q_i)^2
    on all N site angles (about the reference), k = softplus(kappa) >= 0 learned. The nearest-neighbour
    quadratic term (round 7, the review's proposal) confines the potential in the directions off the
    data manifold that a dense MLP on N inputs leaves unconstrained (the chain's gradient coupling);
    everything else, the on-site and trap terms and the kink's nonlinearity, is the MLP's."""

    def __init__(self, n: int, width: int, s_q: np.ndarray, gen: torch.Generator, q_mean=None, substeps: int = 1):
        super().__init__(n, width, s_q, gen, q_mean, substeps)
        self.kappa = nn.Parameter(torch.zeros((), dtype=torch.float64))
        # the free-end chain Laplacian (symmetric): grad of (1/2) sum (q_{i+1} - q_i)^2 is q @ lap
        d = torch.diff(torch.eye(n, dtype=torch.float64), dim=0)  # [n - 1, n], rows e_{i+1} - e_i
        self.register_buffer("lap", d.T @ d)

    def coupling(self):
        return nn.functional.softplus(self.kappa)

    def potential(self, qz):
        d = qz[..., 1:] - qz[..., :-1]
        return super().potential(qz) + 0.5 * self.coupling() * (d * d).sum(-1)

    def _folded(self):
        return (*_folded_grad(self.net, self.s_q, self.q_mean), self.coupling() * self.lap)

    @staticmethod
    def _grad(x, w1, b1, w2, b2, w3, k_lap):
        """The MLP's gradient (``_mlp_grad``) plus x times k x the free-end chain Laplacian."""
        return torch.addmm(_mlp_grad(x, w1, b1, w2, b2, w3), x, k_lap)


class GeneralHNN(nn.Module):
    """H_theta(Q, P) = MLP((Q, P) scaled): a general, non-separable Hamiltonian on a latent whose halves
    need not be canonical. Vector field J grad H = (dH/dP, -dH/dQ); one step of the implicit midpoint
    rule z1 = z0 + h J grad H((z0 + z1) / 2) (symplectic for every H), solved by ``iters`` fixed-point
    iterations from the explicit Euler guess."""

    def __init__(self, n: int, width: int, s_z: np.ndarray, gen: torch.Generator, z_mean=None, iters: int = 4):
        super().__init__()
        self.net = _mlp(2 * n, width, 1, gen)
        self.register_buffer("s_z", torch.as_tensor(s_z))
        self.register_buffer("z_mean", torch.as_tensor(np.zeros(2 * n) if z_mean is None else z_mean))
        self.n, self.iters = n, int(iters)

    def hamiltonian(self, qz, pz):
        return self.net((torch.cat([qz, pz], -1) - self.z_mean) / self.s_z).squeeze(-1)

    def _field(self, z, wts):
        g = _mlp_grad(z, *wts)
        return torch.cat([g[..., self.n:], -g[..., :self.n]], -1)

    def vector_field(self, qz, pz):
        """J grad H = (dH/dP, -dH/dQ)."""
        shape = qz.shape
        z = torch.cat([qz, pz], -1).reshape(-1, 2 * self.n)
        f = self._field(z, _folded_grad(self.net, self.s_z, self.z_mean))
        return f[:, :self.n].reshape(shape), f[:, self.n:].reshape(shape)

    def integrate(self, qz, pz, h: float, steps: int):
        wts = _folded_grad(self.net, self.s_z, self.z_mean)
        z = torch.cat([qz, pz], -1)
        zs = [z]
        for _ in range(steps):
            z1 = z + h * self._field(z, wts)
            for _ in range(self.iters):
                z1 = z + h * self._field(0.5 * (z + z1), wts)
            z = z1
            zs.append(z)
        zs = torch.stack(zs, 1)
        return zs[..., :self.n], zs[..., self.n:]

    def step(self, qz, pz, h: float):
        q, p = self.integrate(qz, pz, h, 1)
        return q[:, 1], p[:, 1]


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


class ExplicitEuler:
    """A trained latent HNN integrated by explicit (forward) Euler instead of leapfrog or the implicit
    midpoint rule: the same vector field, a non-symplectic first-order integrator (the controls'
    ``*_euler`` metrics)."""

    def __init__(self, model: LatentHNN):
        self.model = model

    def step(self, qz, pz, h: float):
        dq, dp = self.model.vector_field(qz, pz)
        return qz + h * dq, pz + h * dp


class RK4Stepper:
    """A trained latent HNN's vector field J grad H integrated by classical RK4 (``blocks.ode``):
    fourth order but not symplectic (evaluation only: RO-HNN's weights, the integrator swapped)."""

    def __init__(self, model):
        self.model = model

    def _field(self, z, t=0.0):
        n = z.shape[-1] // 2
        dq, dp = self.model.vector_field(z[..., :n], z[..., n:])
        return torch.cat([dq, dp], -1)

    def step(self, qz, pz, h: float):
        z = torch.cat([qz, pz], -1)
        z = z + rk_increment(self._field, z, 0.0, h, RK4)
        n = qz.shape[-1]
        return z[..., :n], z[..., n:]


def rollout(model, qz, pz, h: float, steps: int):
    """States at steps 0..steps, stacked on axis 1: [batch, steps + 1, n] each."""
    if isinstance(model, (LatentHNN, GeneralHNN)):
        return model.integrate(qz, pz, h, steps)
    qs, ps = [qz], [pz]
    for _ in range(steps):
        qz, pz = model.step(qz, pz, h)
        qs.append(qz)
        ps.append(pz)
    return torch.stack(qs, 1), torch.stack(ps, 1)
