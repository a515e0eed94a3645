"""Training and reference data for the Boltzmann generators: MALA samples, symmetry augmentation,
and the internal coordinates every model (ArBG, flow, CNF) is trained in.

Coordinates. A particle target (DW4: 4 particles in 2-D; LJ13: 13 in 3-D) has an energy that is
invariant to translations, so its Boltzmann density lives on the zero-centre-of-mass subspace
{Σ_i x_i = 0} of dimension (n - 1) d. Every model here works in the FREE coordinates
y = (x_1, ..., x_{n-1}) of the first n - 1 particles of a COM-free configuration; the last particle
is x_n = -Σ_{i<n} x_i. The map y -> x is linear and injective with a constant Jacobian, so the
target density in y is p(y) ∝ exp(-E(x(y)) / T) and importance weights p/q need no correction
(the constant cancels in self-normalised weights and in the normalised ESS). All models see the
same y, scaled by one isotropic length ``scale`` (the data's coordinate std), which keeps the
rotation symmetry of the scaled data.

Augmentation. p is invariant to rotations, reflections and permutations of identical particles;
MALA chains mix slowly between the symmetry copies of a mode. Every variant is trained on the same
augmented set: each training configuration is copied ``augment`` times under a Haar-random
orthogonal map O(d) and a random particle permutation (both leave p unchanged), then reduced to y.
"""
from __future__ import annotations

import torch

from ...blocks.boltzmann import remove_com


def to_free(x: torch.Tensor, n_particles: int, spatial_dim: int) -> torch.Tensor:
    """COM-free configurations (B, n*d) -> free coordinates (B, (n-1)*d) (drop the last particle)."""
    x = remove_com(x, n_particles, spatial_dim)
    return x[..., : (n_particles - 1) * spatial_dim]


def to_full(y: torch.Tensor, n_particles: int, spatial_dim: int) -> torch.Tensor:
    """Free coordinates (B, (n-1)*d) -> full COM-free configuration (B, n*d), x_n = -Σ_{i<n} x_i."""
    ys = y.reshape(*y.shape[:-1], n_particles - 1, spatial_dim)
    last = -ys.sum(dim=-2, keepdim=True)
    return torch.cat([ys, last], dim=-2).reshape(*y.shape[:-1], n_particles * spatial_dim)


def random_orthogonal(n: int, d: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """n Haar-distributed matrices of O(d): QR of a Gaussian matrix with the signs of diag(R) fixed."""
    a = torch.randn(n, d, d, generator=generator, dtype=dtype)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)


def augment(x: torch.Tensor, n_particles: int, spatial_dim: int, copies: int,
            generator: torch.Generator) -> torch.Tensor:
    """``copies`` symmetry images (random O(d) and particle permutation) of each configuration."""
    xs = x.reshape(len(x), n_particles, spatial_dim).repeat(copies, 1, 1)
    rot = random_orthogonal(len(xs), spatial_dim, generator, xs.dtype)
    perm = torch.argsort(torch.rand(len(xs), n_particles, generator=generator), dim=1)
    xs = torch.gather(xs, 1, perm.unsqueeze(-1).expand(-1, -1, spatial_dim))
    return torch.einsum("bnd,bed->bne", xs, rot).reshape(len(xs), -1)


def make_dataset(target, n_train: int, n_val: int, n_test: int, copies: int, generator: torch.Generator,
                 mala_kw: dict) -> dict[str, torch.Tensor]:
    """MALA samples of ``target`` (float64): train (augmented), validation and test (as sampled).

    One MALA run of independent chains (``mala_kw["n_chains"]``: ``{train, val, test}`` chain
    counts; all chains share the burn-in, ``burn_in`` adaptive steps, then every ``thin``-th state
    is kept), split by chain, so held-out samples are not correlated with training ones. The
    validation split chooses the learning rate and draws the convergence curve; the test split is
    the E-W2 reference and the NLL set, read only after training. ``test_half`` (0 / 1 per test
    sample) splits the test CHAINS into two disjoint halves: the E-W2 between them is the
    reference's own noise floor (``ew2_ref_floor``), and their short-pair shares show whether the
    chains agree on the balance of metastable states.
    """
    from ...blocks.boltzmann import mala

    chains = mala_kw.get("n_chains", {"train": 128, "val": 64, "test": 128})
    kw = {k: v for k, v in mala_kw.items() if k not in ("n_chains",)}
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    nc = {s: max(int(chains[s]), 1) for s in sizes}
    per_chain = max(-(-sizes[s] // nc[s]) for s in sizes)
    total = sum(nc.values())
    x0 = target.project(target._init(total, generator, torch.float64))
    res = mala(mala_log_prob(target), x0, float(kw.get("step", 1e-3)), per_chain * int(kw.get("thin", 10)),
               burn_in=int(kw.get("burn_in", 2000)), thin=int(kw.get("thin", 10)), project=target.project,
               generator=generator)
    out, start = {}, 0
    for s in ("train", "val", "test"):
        block = res.samples[:, start:start + nc[s]]          # (kept, chains, dim)
        start += nc[s]
        k = -(-sizes[s] // nc[s])
        flat = block[:k].transpose(0, 1).reshape(-1, target.dim)   # chain-major
        out[s] = flat[: sizes[s]]
        if s == "test":
            chain_of = torch.arange(nc[s]).repeat_interleave(k)[: sizes[s]]
            out["test_half"] = (chain_of >= nc[s] // 2).long()
    n, d = target.n_particles, target.spatial_dim
    x_aug = augment(out["train"], n, d, copies, generator) if copies > 1 else out["train"]
    y_tr = to_free(x_aug, n, d)
    return {"y_train": y_tr, "y_val": to_free(out["val"], n, d), "y_test": to_free(out["test"], n, d),
            "test_half": out["test_half"], "scale": y_tr.std().reshape(()),
            "accept": torch.tensor([res.accept_rate])}


def dw4_log_prob_and_grad(target, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(-E(x)/T, its gradient) of a pair-potential target with DW4's energy
    E = sum_{i<j} a r^4 + b r^2 + c, r = |x_i - x_j| - d0, in closed form:
    dE/dx_i = sum_{j != i} (4 a r^3 + 2 b r) (x_i - x_j) / |x_i - x_j|, over the full n x n matrix
    of pairs (each unordered pair twice, the diagonal masked). The same density MALA samples with
    autograd, in fewer tensor operations (``test_arbg`` compares both)."""
    n, d = target.n_particles, target.spatial_dim
    xs = x.reshape(*x.shape[:-1], n, d)
    diff = xs.unsqueeze(-2) - xs.unsqueeze(-3)                        # (..., n, n, d): x_i - x_j
    off = 1.0 - torch.eye(n, dtype=x.dtype, device=x.device)
    dist = diff.norm(dim=-1) + (1.0 - off)                            # 1 on the diagonal (masked)
    r = dist - target.d0
    r2 = r * r
    energy = 0.5 * ((target.a * r2 * r2 + target.b * r2 + target.c) * off).sum((-2, -1))
    coef = (4 * target.a * r2 + 2 * target.b) * r / dist * off
    grad = (coef.unsqueeze(-1) * diff).sum(-2)
    return -energy / target.temperature, -grad.reshape(x.shape) / target.temperature


class _AnalyticLogProb(torch.autograd.Function):
    """log p(x) whose backward uses the closed-form gradient instead of a recorded graph."""

    @staticmethod
    def forward(ctx, x, target):
        lp, g = dw4_log_prob_and_grad(target, x)
        ctx.save_for_backward(g)
        return lp

    @staticmethod
    def backward(ctx, grad_out):
        (g,) = ctx.saved_tensors
        return grad_out.unsqueeze(-1) * g, None


def mala_log_prob(target):
    """The log density MALA is given: DW4's with its closed-form gradient (the MALA burn-in, 20000
    steps, is where this saves; the sampled law is the same), any other target's as it is."""
    from ...blocks.boltzmann import DoubleWell4

    if isinstance(target, DoubleWell4):
        return lambda x: _AnalyticLogProb.apply(x, target)
    return target.log_prob
