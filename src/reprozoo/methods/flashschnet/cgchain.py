"""A 269-bead C-alpha-like coarse-grained chain: priors, a reference potential, Langevin/NVE MD.

Units: kcal/mol, Angstrom, amu, ps (force / mass * 418.4 = acceleration in A/ps^2).

Prior (what CGSchNet adds to the network): harmonic bonds k_b (r - r0)^2, harmonic angles
k_a (theta - theta0)^2, and a soft repulsion eps_r (sigma / r)^6 between beads |i - j| >= 3.
Reference ("all-atom" stand-in the network must learn on top of the prior): a type-dependent
attractive Gaussian well -eps_ab exp(-(r - r_w)^2 / (2 w^2)) between beads |i - j| >= 3, eps_ab from
20 random bead "hydrophobicities" (bead types 1..20, like the 20 amino acids).

Every function works on a batch of replicas: positions (R, N, 3), float64 by default.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ACC = 418.4      # (kcal/mol/A) / amu -> A/ps^2
KB = 0.0019872041  # kcal/mol/K


@dataclass
class ChainSystem:
    types: np.ndarray            # (N,) int in 1..20
    hydro: np.ndarray            # (21,) hydrophobicity per type (index 0 unused)
    mass: float = 110.0
    r0: float = 3.8
    k_bond: float = 30.0
    theta0: float = 1.75
    k_angle: float = 8.0
    rep_sigma: float = 3.6
    rep_eps: float = 1.0
    well_eps: float = 0.8
    well_r: float = 5.5
    well_w: float = 1.0
    min_sep: int = 3

    @property
    def n(self) -> int:
        return len(self.types)

    def eps_matrix(self) -> np.ndarray:
        h = self.hydro[self.types]
        return self.well_eps * (0.25 + 0.75 * np.sqrt(np.outer(h, h)))

    def to_npz(self) -> dict:
        return {"types": self.types, "hydro": self.hydro}


def make_chain(n_beads: int = 269, seed: int = 0) -> ChainSystem:
    rng = np.random.default_rng(seed)
    return ChainSystem(types=rng.integers(1, 21, n_beads), hydro=np.concatenate([[0.0], rng.random(20)]))


class ChainPotential:
    """Prior and reference energies/forces of a chain on replicas (torch, float64).

    Non-bonded terms (|i - j| >= min_sep) use a Verlet pair list (cutoff ``rc`` + ``skin``, rebuilt
    when any bead moved more than skin/2); the repulsion is shifted-force so energy and force go
    to zero at ``rc`` (smooth: NVE conserves energy). Bonds and angles by autograd (N terms).
    """

    def __init__(self, system: ChainSystem, rc: float = 10.0, skin: float = 1.5, dtype=torch.float64):
        self.s, self.dtype, self.rc, self.skin = system, dtype, float(rc), float(skin)
        n = system.n
        sep = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
        self.allowed = torch.from_numpy(sep >= system.min_sep)
        self.eps_full = torch.from_numpy(system.eps_matrix()).to(dtype)
        self._ref_pos = None
        self.rebuilds = 0

    # --- pair list ---------------------------------------------------------------------------
    def _pairs(self, pos):
        if self._ref_pos is None or self._ref_pos.shape != pos.shape or \
                (pos - self._ref_pos).norm(dim=-1).max() > 0.5 * self.skin:
            with torch.no_grad():
                d = torch.cdist(pos, pos)
                mask = (d < self.rc + self.skin) & self.allowed & torch.triu(torch.ones_like(self.allowed), 1)
                self._r, self._i, self._j = torch.nonzero(mask, as_tuple=True)
                self._eps = self.eps_full[self._i, self._j]
                self._ref_pos = pos.detach().clone()
                self.rebuilds += 1
        return self._r, self._i, self._j

    def _pair_terms(self, pos, rep: bool, well: bool):
        """Energy (R,) and forces (R, N, 3) of the non-bonded terms, analytic."""
        s = self.s
        r_, i, j = self._pairs(pos)
        vec = pos[r_, j] - pos[r_, i]
        r = torch.linalg.vector_norm(vec, dim=-1)
        inside = (r < self.rc).to(pos.dtype)
        e = torch.zeros_like(r)
        dedr = torch.zeros_like(r)
        if rep:
            sr6, sc6 = (s.rep_sigma / r) ** 6, (s.rep_sigma / self.rc) ** 6
            e = e + s.rep_eps * (sr6 - sc6 + 6 * sc6 * (r - self.rc) / self.rc)
            dedr = dedr + s.rep_eps * (-6 * sr6 / r + 6 * sc6 / self.rc)
        if well:  # energy-shifted to zero at rc (the force left there is ~1e-4 of its peak at rc = 10)
            g = torch.exp(-((r - s.well_r) ** 2) / (2 * s.well_w**2))
            g_rc = float(np.exp(-((self.rc - s.well_r) ** 2) / (2 * s.well_w**2)))
            e = e - self._eps * (g - g_rc)
            dedr = dedr + self._eps * g * (r - s.well_r) / s.well_w**2
        e, dedr = e * inside, dedr * inside
        energy = torch.zeros(pos.shape[0], dtype=pos.dtype).index_add_(0, r_, e)
        fvec = (dedr / r).unsqueeze(-1) * vec   # force on i is +dU/dr * rhat_ij, on j the opposite
        forces = torch.zeros_like(pos)
        flat = forces.view(-1, 3)
        n = pos.shape[1]
        flat.index_add_(0, r_ * n + i, fvec)
        flat.index_add_(0, r_ * n + j, -fvec)
        return energy, forces

    def _bonded(self, pos):
        s = self.s
        with torch.enable_grad():
            p = pos.detach().requires_grad_(True)
            b = p[:, 1:] - p[:, :-1]
            rb = torch.linalg.vector_norm(b, dim=-1)
            e = s.k_bond * ((rb - s.r0) ** 2).sum(-1)
            u1, u2 = -b[:, :-1], b[:, 1:]
            cos = (u1 * u2).sum(-1) / (rb[:, :-1] * rb[:, 1:])
            theta = torch.acos(cos.clamp(-1 + 1e-9, 1 - 1e-9))
            e = e + s.k_angle * ((theta - s.theta0) ** 2).sum(-1)
            (g,) = torch.autograd.grad(e.sum(), p)
        return e.detach(), -g

    def energy_forces(self, pos, which: str = "reference"):
        """which: 'prior' (bonds, angles, repulsion), 'learned' (the well), 'reference' (both)."""
        pos = pos.detach()
        if which == "learned":
            return self._pair_terms(pos, rep=False, well=True)
        eb, fb = self._bonded(pos)
        ep, fp = self._pair_terms(pos, rep=True, well=(which == "reference"))
        return eb + ep, fb + fp

    def energy(self, pos, which: str = "reference"):
        return self.energy_forces(pos, which)[0]


def compact_start(system: ChainSystem, rng: np.random.Generator) -> np.ndarray:
    """A compact self-avoiding start: the serpentine path through a cubic lattice (spacing r0),
    randomly rotated, with small noise. (N, 3)."""
    n = system.n
    L = int(np.ceil(n ** (1 / 3)))
    pts = []
    for z in range(L + 1):
        for yy in range(L):
            y = yy if z % 2 == 0 else L - 1 - yy
            xs = range(L) if (yy + z * L) % 2 == 0 else range(L - 1, -1, -1)
            for x in xs:
                pts.append((x, y, z))
    pos = np.asarray(pts[:n], float) * system.r0
    pos -= pos.mean(0)
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    return pos @ (q * np.sign(np.diag(r))).T + rng.normal(0, 0.05, pos.shape)


def kinetic(vel, mass):
    return 0.5 * mass * (vel**2).sum((-1, -2)) / ACC  # kcal/mol


def langevin_baoab(pos, vel, force_fn, mass: float, dt: float, gamma: float, kT: float, n_steps: int,
                   gen: torch.Generator, every: int = 0, callback=None, f0=None, return_forces: bool = False):
    """BAOAB Langevin integrator (Leimkuhler-Matthews) on replicas; ``force_fn(pos) -> forces``.

    ``callback(step, pos, vel)`` every ``every`` steps (e.g. to record frames or rebuild lists).
    ``f0``: the forces at ``pos`` if known (a continued run: exactly one force call per step);
    ``return_forces``: also return the forces at the final positions.
    """
    c1 = float(np.exp(-gamma * dt))
    c2 = float(np.sqrt((1 - c1**2) * kT * ACC / mass))
    f = force_fn(pos) if f0 is None else f0
    for step in range(1, n_steps + 1):
        vel = vel + 0.5 * dt * ACC / mass * f
        pos = pos + 0.5 * dt * vel
        vel = c1 * vel + c2 * torch.randn(vel.shape, generator=gen, dtype=vel.dtype)
        pos = pos + 0.5 * dt * vel
        f = force_fn(pos)
        vel = vel + 0.5 * dt * ACC / mass * f
        if every and callback is not None and step % every == 0:
            callback(step, pos, vel)
    return (pos, vel, f) if return_forces else (pos, vel)


def velocity_verlet(pos, vel, energy_force_fn, mass: float, dt: float, n_steps: int, every: int = 1):
    """NVE; returns positions, velocities and the total energy (R,) every ``every`` steps."""
    e, f = energy_force_fn(pos)
    totals = [(e + kinetic(vel, mass)).clone()]
    for step in range(1, n_steps + 1):
        vel = vel + 0.5 * dt * ACC / mass * f
        pos = pos + dt * vel
        e, f = energy_force_fn(pos)
        vel = vel + 0.5 * dt * ACC / mass * f
        if step % every == 0:
            totals.append((e + kinetic(vel, mass)).clone())
    return pos, vel, torch.stack(totals)


def maxwell_boltzmann(shape, mass: float, kT: float, gen: torch.Generator, dtype=torch.float64):
    v = torch.randn(shape, generator=gen, dtype=dtype) * float(np.sqrt(kT * ACC / mass))
    return v - v.mean(dim=-2, keepdim=True)  # no centre-of-mass drift


def generate_frames(system: ChainSystem, n_replicas: int, n_equil: int, n_frames_per_replica: int, every: int,
                    dt: float, T: float, gamma: float, seed: int, progress=None) -> dict:
    """Langevin MD on the reference potential; frames in the common MD format (energy/forces of
    the *learned part*, i.e. reference minus prior, which is what the network fits)."""
    pot = ChainPotential(system)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    kT = KB * T
    pos = torch.from_numpy(np.stack([compact_start(system, rng) for _ in range(n_replicas)]))
    vel = maxwell_boltzmann(pos.shape, system.mass, kT, gen)
    ff = lambda p: pot.energy_forces(p, "reference")[1]  # noqa: E731
    pos, vel = langevin_baoab(pos, vel, ff, system.mass, dt, gamma, kT, n_equil, gen)
    frames = []
    pos, vel = langevin_baoab(pos, vel, ff, system.mass, dt, gamma, kT, n_frames_per_replica * every, gen,
                              every=every, callback=lambda s, p, v: frames.append(p.clone()))
    X = torch.cat(frames)  # (F, N, 3)
    e, f = ChainPotential(system).energy_forces(X, "learned")
    if progress:
        rg = torch.sqrt(((X - X.mean(1, keepdim=True)) ** 2).sum(-1).mean(-1)).mean().item()
        progress(f"chain data: {len(X)} frames, radius of gyration {rg:.1f} A, learned-part force RMS "
                 f"{f.pow(2).mean().sqrt().item():.3f} kcal/mol/A")
    n = system.n
    return {"positions": X.numpy(), "numbers": system.types.astype(np.int64), "cells": np.zeros((len(X), 3, 3)),
            "pbc": np.zeros(3, bool), "energy": e.numpy(), "forces": f.numpy(), "n_beads": n,
            "final_positions": pos.numpy()}


def equilibrated_starts(system: ChainSystem, n_replicas: int, n_steps: int, dt: float, T: float, gamma: float,
                        seed: int) -> np.ndarray:
    """Independent starting conformations (R, N, 3): compact starts (random rotations) run
    ``n_steps`` Langevin steps on the reference potential, each replica with its own noise. Chosen
    long against the observables' autocorrelation times, so the replicas are independent draws."""
    pot = ChainPotential(system)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    kT = KB * T
    pos = torch.from_numpy(np.stack([compact_start(system, rng) for _ in range(n_replicas)]))
    vel = maxwell_boltzmann(pos.shape, system.mass, kT, gen)
    pos, _ = langevin_baoab(pos, vel, lambda p: pot.energy_forces(p, "reference")[1], system.mass, dt, gamma, kT,
                            n_steps, gen)
    return pos.numpy()
