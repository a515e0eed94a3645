"""Symplectic integrators for separable Hamiltonians, for reuse (numpy or torch arrays alike).

Why a block: long-horizon claims about energy ("bounded error, no drift") are only meaningful if
the reference and the learned latent dynamics are integrated by a scheme that is itself
symplectic. For H(q, p) = T(p) + V(q) with T = |p|² / 2m:

    leapfrog (velocity Verlet, Störmer):   p_{1/2} = p - (h/2) ∇V(q)
                                           q'      = q + h p_{1/2} / m
                                           p'      = p_{1/2} - (h/2) ∇V(q')

is the Strang splitting exp(h/2 B) exp(h A) exp(h/2 B) of the kinetic flow A and the potential
kick B: second order, time-reversible, symplectic, so its energy error stays O(h²) and bounded
for exponentially long times (backward error analysis: it exactly conserves a modified
Hamiltonian H + O(h²)). ``strang`` composes any two exact sub-flows the same way (e.g. a linear
part solved exactly and a nonlinear kick). Everything is plain arithmetic on the arrays passed
in, so numpy arrays and torch tensors (with autograd through the steps) both work.
"""
from __future__ import annotations

from typing import Callable


def leapfrog_step(q, p, grad_v: Callable, h: float, mass: float = 1.0):
    """One velocity-Verlet step of H = |p|²/2m + V(q); ``grad_v(q)`` = ∂V/∂q."""
    p_half = p - 0.5 * h * grad_v(q)
    q_new = q + h * p_half / mass
    return q_new, p_half - 0.5 * h * grad_v(q_new)


def leapfrog(q, p, grad_v: Callable, h: float, steps: int, mass: float = 1.0, every: int = 1,
             stack=None):
    """Integrate ``steps`` leapfrog steps; returns (qs, ps) every ``every`` steps, start included.

    ``stack`` joins the saved states (``numpy.stack`` or ``torch.stack``); default: numpy."""
    if stack is None:
        import numpy as np
        stack = np.stack
    qs, ps = [q], [p]
    for i in range(1, steps + 1):
        q, p = leapfrog_step(q, p, grad_v, h, mass)
        if i % every == 0:
            qs.append(q)
            ps.append(p)
    return stack(qs), stack(ps)


def strang(state, h: float, flow_a: Callable, flow_b: Callable):
    """Strang splitting B(h/2) ∘ A(h) ∘ B(h/2); ``flow_x(state, h)`` are exact (or symplectic) sub-flows."""
    return flow_b(flow_a(flow_b(state, 0.5 * h), h), 0.5 * h)
