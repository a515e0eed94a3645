"""Training, validation and test sets: reference samples of the target, generated per seed.

DW4 / LJ13: MALA chains (blocks/boltzmann.py) started from random configurations. The burn-in
is ANNEALED: the chains first run at the temperatures of ``mcmc.anneal`` (e.g. 3, 2, 1.5 kT,
where the pair-distance barriers of DW4 are low), each stage adapting its step, then at the
target temperature; after burn-in the kernel is frozen and every ``thin``-th state is kept
(``per_chain`` states per chain). Each DW4 pair distance sits in one of two wells 4.44 kT below
the barrier between them, so chains started at T = 1 rebalance short and long pairs only
slowly; at 3 kT the barrier is 1.5 kT and is crossed freely. Each kept configuration is then mapped by a random element of the
energy's symmetry group (a permutation of the particles and a rotation/reflection), which
leaves the Boltzmann density invariant: the samples of one chain no longer sit in one
permutation copy of the landscape.

The training pool and the validation/test sets come from two independent sets of chains
(different generator streams), so held-out points are not correlated with training points.
Training sets of size N are the first N points of one random permutation of the pool: the sets
are NESTED (N=64 ⊂ N=128 ⊂ ...), so an ESS-vs-N curve varies only the amount of data. The 2-D
Gaussian mixture samples exactly. Every set carries its energy labels E(x) (what LDR uses).
"""
from __future__ import annotations

import torch


def random_symmetry(x: torch.Tensor, n_particles: int, spatial_dim: int, generator: torch.Generator) -> torch.Tensor:
    """Apply an independent random particle permutation and rotation/reflection to each configuration."""
    m = x.shape[0]
    xs = x.reshape(m, n_particles, spatial_dim)
    perm = torch.argsort(torch.rand(m, n_particles, generator=generator), dim=1)
    xs = torch.gather(xs, 1, perm[..., None].expand(-1, -1, spatial_dim))
    # Haar-random orthogonal matrices (rotations and reflections): QR of a Gaussian matrix, sign-fixed
    a = torch.randn(m, spatial_dim, spatial_dim, generator=generator, dtype=x.dtype)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    return torch.einsum("mij,mnj->mni", q, xs).reshape(m, -1)


def annealed_mala(target, n: int, generator: torch.Generator, mcmc: dict) -> torch.Tensor:
    """n samples (float64, Cartesian, zero COM) from annealed-burn-in MALA chains (see module doc)."""
    from ...blocks.boltzmann import mala

    per_chain = int(mcmc.get("per_chain", 1))
    n_chains = -(-n // per_chain)
    x = target.project(target._init(n_chains, generator, torch.float64))
    step = float(mcmc["step"])
    stages = [float(t) for t in mcmc.get("anneal", [])] + [target.temperature]
    burn = int(mcmc["burn_in"])
    for k, temp in enumerate(stages):
        last = k == len(stages) - 1
        res = mala(lambda z, t=temp: -target.energy(z) / t, x, step, per_chain * int(mcmc["thin"]) if last else 1,
                   burn_in=burn, thin=int(mcmc["thin"]) if last else 1, project=target.project, generator=generator)
        if last:
            out = res.samples.transpose(0, 1).reshape(-1, target.dim)[:n]
        x, step = res.samples[-1], float(res.step.median())
    return random_symmetry(out, target.n_particles, target.spatial_dim, generator)


def reference_samples(target, n: int, seed: int, mcmc: dict) -> torch.Tensor:
    """n reference samples (float64, Cartesian) from an independent generator stream ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    if target.n_particles == 1:
        return target.sample_reference(n, g)
    return annealed_mala(target, n, g, mcmc)


def make_datasets(target, n_pool: int, n_val: int, n_test: int, seed: int, mcmc: dict,
                  stream: int = 0) -> dict[str, torch.Tensor]:
    """{'pool' (n_pool, D) in nested order, 'val', 'test', and their energies 'e_pool', ...}."""
    base = 10_000 * int(stream) + 2 * int(seed) + 1_000
    pool = reference_samples(target, n_pool, base, mcmc)
    held = reference_samples(target, n_val + n_test, base + 1, mcmc)
    held = held[torch.randperm(len(held), generator=torch.Generator().manual_seed(base + 2))]
    perm = torch.randperm(n_pool, generator=torch.Generator().manual_seed(int(seed) + 10_000 * int(stream)))
    out = {"pool": pool[perm], "val": held[:n_val], "test": held[n_val:]}
    for k in list(out):
        out["e_" + k] = target.energy(out[k])
    return out


def pair_distance_fraction(x: torch.Tensor, n_particles: int, spatial_dim: int, d0: float) -> float:
    """Fraction of pair distances below d0 (the short well of DW4): a slow observable of mixing."""
    from ...blocks.boltzmann import pair_distances

    return float((pair_distances(x, n_particles, spatial_dim) < d0).double().mean())
