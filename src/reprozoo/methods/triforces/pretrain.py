"""Self-supervised pre-training on unlabelled structures (no energies, no forces).

Each batch of B structures is seen as two views (2B graphs, one pass). Each view gets
* a Gaussian displacement of every atom, sigma drawn per structure in ``noise`` (Angstrom), and
* atom masking: each atom's element replaced by the mask token with probability ``mask_prob``.

Objectives (weights ``weights.{denoise, mask, jepa}``):
* denoising: the negative gradient of a per-atom scalar head w.r.t. the noisy positions predicts
  the displacement back to the clean structure, in units of ``noise_unit`` (mean squared error per
  atom; an energy-conserving denoiser, i.e. a pseudo force field);
* masked-atom prediction: cross-entropy of the element of every masked atom;
* two-view consistency (LeJEPA-style): squared distance between the per-structure projections of
  the two views plus SIGReg (sliced Epps-Pulley test of the projections against N(0, I)), which
  keeps the latent from collapsing without negatives.

Validation (``val``, unlabelled held-out structures): every ``val_every`` steps (and before the first
step) the same terms on the held-out structures with a FIXED corruption (noise, masks and SIGReg
slices drawn from the same generator seed each time), so the curve moves only with the weights; the
convergence gate reads this curve (``val_loss``) and the learning rate at the same steps (``lr``).
"""
from __future__ import annotations

import time

import numpy as np
import torch
from torch.nn import functional as F

from ...blocks.atomistic import AtomsData, Batch
from ...blocks.atomistic.descriptors import mean_pool, sigreg_epps_pulley
from .model import MASK_Z, PretrainHeads, TriForces

DEFAULTS = dict(epochs=4, batch_size=8, lr=2e-3, lr_final_factor=0.1, noise=[0.03, 0.2], noise_unit=0.1,
                mask_prob=0.15, weights={"denoise": 1.0, "mask": 1.0, "jepa": 0.1}, sigreg_slices=64,
                proj_dim=16, head_hidden=32, grad_clip=10.0, max_steps=None, time_budget_s=None,
                val_every=None, val_points=20)


def two_views(b: Batch) -> Batch:
    """The batch concatenated with itself (structures B..2B-1 are the second view)."""
    n, B = b.positions.shape[0], b.n_structures
    return Batch(numbers=b.numbers.repeat(2), positions=b.positions.repeat(2, 1),
                 batch=torch.cat([b.batch, b.batch + B]),
                 edge_index=torch.cat([b.edge_index, b.edge_index + n], dim=1),
                 shifts=b.shifts.repeat(2, 1), n_atoms=b.n_atoms.repeat(2), cells=b.cells.repeat(2, 1, 1))


def pretrain_loss(model: TriForces, heads: PretrainHeads, b: Batch, cfg: dict, gen: torch.Generator,
                  create_graph: bool = True) -> dict:
    """All terms for one batch (b: a two-view batch); ``create_graph=False`` for evaluation only."""
    dtype = b.positions.dtype
    n_struct, n = b.n_structures, b.positions.shape[0]
    lo, hi = cfg["noise"]
    sigma = lo + (hi - lo) * torch.rand(n_struct, generator=gen, dtype=torch.float64).to(dtype)
    delta = sigma[b.batch].unsqueeze(-1) * torch.randn((n, 3), generator=gen, dtype=torch.float64).to(dtype)
    masked = torch.rand(n, generator=gen, dtype=torch.float64) < cfg["mask_prob"]
    numbers = torch.where(masked, torch.full_like(b.numbers, MASK_Z), b.numbers)
    pos = (b.positions + delta).detach().requires_grad_(True)
    x = model.node_features(numbers, pos, b.batch, b.edge_index, b.shifts, n_struct)
    s = heads.denoise(x).sum()
    (grad,) = torch.autograd.grad(s, pos, create_graph=create_graph)
    target = -delta / cfg["noise_unit"]
    l_dn = ((-grad - target) ** 2).sum(-1).mean()
    baseline = (target ** 2).sum(-1).mean().detach()
    l_mask = F.cross_entropy(heads.unmask(x[masked]), b.numbers[masked]) if bool(masked.any()) else x.new_zeros(())
    acc = ((heads.unmask(x[masked]).argmax(-1) == b.numbers[masked]).to(dtype).mean().detach()
           if bool(masked.any()) else x.new_zeros(()))
    z = heads.proj(mean_pool(x, b.batch, n_struct))
    half = n_struct // 2
    l_pred = ((z[:half] - z[half:]) ** 2).sum(-1).mean()
    l_sig = sigreg_epps_pulley(z, cfg["sigreg_slices"], generator=gen)
    l_jepa = 0.5 * (l_pred + l_sig)
    w = cfg["weights"]
    total = w["denoise"] * l_dn + w["mask"] * l_mask + w["jepa"] * l_jepa
    return {"loss": total, "denoise": l_dn, "denoise_baseline": baseline, "mask": l_mask, "mask_acc": acc,
            "jepa_pred": l_pred, "sigreg": l_sig}


KEYS = ("loss", "denoise", "denoise_baseline", "mask", "mask_acc", "jepa_pred", "sigreg")


def validate(model: TriForces, heads: PretrainHeads, val: AtomsData, cfg: dict, seed: int = 12345) -> dict:
    """Every term on the held-out structures, averaged over structures, with the same corruption at
    every call (generator reseeded): a curve that changes only with the weights."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    acc, weights = {k: 0.0 for k in KEYS}, 0
    for b in val.batches(cfg["batch_size"], dtype=dtype):
        b.energy, b.forces = None, None
        terms = pretrain_loss(model, heads, two_views(b), cfg, gen, create_graph=False)
        for k in KEYS:
            acc[k] += float(terms[k].detach()) * b.n_structures
        weights += b.n_structures
    model.train(was)
    return {k: v / max(weights, 1) for k, v in acc.items()}


def pretrain(model: TriForces, data: AtomsData, cfg: dict | None = None, seed: int = 0, progress=None,
             val: AtomsData | None = None):
    """Pre-train ``model`` (in place) on ``data`` (labels, if any, are never read).

    Returns ``(heads, history)``; history holds per-epoch means of every loss term and, with
    ``val``, the held-out curve: ``val_step``, ``val_<term>`` and ``lr`` at those steps.
    """
    cfg = {**DEFAULTS, **(cfg or {})}
    cfg["weights"] = {**DEFAULTS["weights"], **(cfg.get("weights") or {})}
    torch.manual_seed(seed)
    dtype = next(model.parameters()).dtype
    heads = PretrainHeads(model.fused_dim, int(cfg["head_hidden"]), int(cfg["proj_dim"])).to(dtype)
    params = list(model.parameters()) + list(heads.parameters())
    opt = torch.optim.Adam(params, lr=cfg["lr"])
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    steps_per_epoch = int(np.ceil(len(data) / cfg["batch_size"]))
    total = cfg["epochs"] * steps_per_epoch
    if cfg["max_steps"]:
        total = min(total, int(cfg["max_steps"]))
    fin = cfg["lr_final_factor"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: fin + (1 - fin) * 0.5 * (1 + np.cos(np.pi * min(s, total) / max(total, 1))))
    keys = KEYS
    hist = {k: [] for k in keys}
    hist["step_loss"] = []
    val_every = int(cfg["val_every"] or max(1, total // max(1, int(cfg["val_points"]))))
    hist.update(val_step=[], lr=[], val_seconds=0.0, **{f"val_{k}": [] for k in keys})

    def record_val() -> None:
        t = time.perf_counter()
        terms = validate(model, heads, val, cfg)
        hist["val_step"].append(step)
        hist["lr"].append(float(opt.param_groups[0]["lr"]))
        for k in keys:
            hist[f"val_{k}"].append(terms[k])
        hist["val_seconds"] += time.perf_counter() - t

    t0, step, stop = time.perf_counter(), 0, False
    model.train()
    if val is not None:
        record_val()
    for epoch in range(cfg["epochs"]):
        acc = {k: [] for k in keys}
        for b in data.batches(cfg["batch_size"], rng, dtype=dtype):
            b.energy, b.forces = None, None   # unlabelled by construction
            terms = pretrain_loss(model, heads, two_views(b), cfg, gen)
            opt.zero_grad()
            terms["loss"].backward()
            if cfg["grad_clip"]:
                torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])
            opt.step()
            sched.step()
            step += 1
            for k in keys:
                acc[k].append(float(terms[k].detach()))
            hist["step_loss"].append(acc["loss"][-1])
            stop = step >= total or bool(cfg["time_budget_s"] and time.perf_counter() - t0 > cfg["time_budget_s"])
            if val is not None and (step % val_every == 0 or stop):
                record_val()
            if stop:
                break
        for k in keys:
            hist[k].append(float(np.mean(acc[k])))
        if progress:
            progress(f"pretrain epoch {epoch}: loss {hist['loss'][-1]:.4f} denoise {hist['denoise'][-1]:.3f}"
                     f"/{hist['denoise_baseline'][-1]:.3f} mask CE {hist['mask'][-1]:.3f} acc {hist['mask_acc'][-1]:.2f}"
                     f" jepa {hist['jepa_pred'][-1]:.3f} sigreg {hist['sigreg'][-1]:.3f}")
        if stop:
            break
    model.eval()
    hist.update(epochs=epoch + 1, steps=step, seconds=time.perf_counter() - t0)
    return heads, hist
