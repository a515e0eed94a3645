"""Training and test sets: reference samples of the target, generated per seed.

DW4 / LJ13: MALA chains (blocks/boltzmann.py), started from random configurations, adaptive
step during burn-in, then a fixed kernel, every ``thin``-th state kept. The training pool and the
test set come from two independent sets of chains (different generator streams), so test points
are not correlated with training points. Training sets of size N are the first N points of one
random permutation of the pool: the sets are NESTED (N=64 ⊂ N=128 ⊂ ...), so an ESS-vs-N curve
varies only the amount of data, not which data. The 2-D Gaussian mixture samples exactly.
Every set carries its energy labels E(x) (the extra information LDR uses).
"""
from __future__ import annotations

import torch


def reference_samples(target, n: int, seed: int, mcmc: dict) -> torch.Tensor:
    """n reference samples (float64, Cartesian) from an independent generator stream ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    if target.n_particles == 1:
        return target.sample_reference(n, g)
    return target.sample_reference(n, g, n_chains=int(mcmc["n_chains"]), burn_in=int(mcmc["burn_in"]),
                                   thin=int(mcmc["thin"]), step=float(mcmc["step"]))


def make_datasets(target, n_pool: int, n_test: int, seed: int, mcmc: dict) -> dict[str, torch.Tensor]:
    """{'pool': (n_pool, D) in nested order, 'test': (n_test, D), and their energies}."""
    pool = reference_samples(target, n_pool, 2 * seed + 1_000, mcmc)
    test = reference_samples(target, n_test, 2 * seed + 1_001, mcmc)
    perm = torch.randperm(n_pool, generator=torch.Generator().manual_seed(int(seed)))
    pool = pool[perm]
    return {"pool": pool, "test": test, "e_pool": target.energy(pool), "e_test": target.energy(test)}
