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

Training: the platform's shared rule (:func:`reprozoo.blocks.fitting.fit_to_plateau`), as for the
fine-tunes: the rates of ``lr_grid`` piloted ``pilot_steps`` from the same initial weights on the
same batches (B cells drawn with replacement from the pool), the best continued at a constant rate
until the plateau test holds on the held-out loss AND the held-out masked-element accuracy, then one
drop of the rate (``lr_drop``, the rule's default 0.1) and on to a second plateau after the drop;
the best held-out-loss weights are kept. No cosine: the gate sees the plateau while the rate is up.

Validation (``val``, unlabelled held-out structures): every ``eval_every`` steps (and before the
first step) the same terms on the held-out structures with a FIXED corruption (noise, masks and
SIGReg slices drawn from the same generator seed each time), so the curve moves only with the
weights. The same fixed masks give the masking task's reference: ``mask_visible_majority``, the
accuracy of guessing, for each masked atom, the most common element among the VISIBLE atoms of its
own structure (what composition alone gives; a pre-training that does not beat it has learned
nothing about where an element sits).
"""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn import functional as F

from ...blocks.atomistic import AtomsData, Batch
from ...blocks.atomistic.descriptors import mean_pool, sigreg_epps_pulley
from .model import MASK_Z, PretrainHeads, TriForces

# the shared rule's keys (blocks.fitting.fit_to_plateau); the rest of the config is the objective's
RULE_KEYS = ("lr_grid", "pilot_steps", "eval_every", "min_steps", "max_steps", "flat_tol", "clip", "lr_drop",
             "patience", "ema_decay", "pilot_score")
DEFAULTS = dict(batch_size=8, lr_grid=[3e-3], pilot_steps=10, eval_every=5, min_steps=20, max_steps=100,
                flat_tol=0.01, clip=10.0, noise=[0.03, 0.2], noise_unit=0.1, mask_prob=0.15,
                weights={"denoise": 1.0, "mask": 1.0, "jepa": 0.1}, sigreg_slices=64, proj_dim=16,
                head_hidden=32, val_batch=32)
KEYS = ("loss", "denoise", "denoise_baseline", "mask", "mask_acc", "mask_visible_majority", "jepa_pred", "sigreg")


class Pretrainer(nn.Module):
    """The encoder and its self-supervised heads, trained together (one module for the shared rule)."""

    def __init__(self, model: TriForces, heads: PretrainHeads):
        super().__init__()
        self.model, self.heads = model, heads


def two_views(b: Batch) -> Batch:
    """The batch concatenated with itself (structures B..2B-1 are the second view)."""
    n, B = b.positions.shape[0], b.n_structures
    return Batch(numbers=b.numbers.repeat(2), positions=b.positions.repeat(2, 1),
                 batch=torch.cat([b.batch, b.batch + B]),
                 edge_index=torch.cat([b.edge_index, b.edge_index + n], dim=1),
                 shifts=b.shifts.repeat(2, 1), n_atoms=b.n_atoms.repeat(2), cells=b.cells.repeat(2, 1, 1))


def visible_majority(numbers: torch.Tensor, masked: torch.Tensor, batch: torch.Tensor, n_struct: int) -> torch.Tensor:
    """For each masked atom, the most common element among the unmasked atoms of its structure
    (ties: the smallest Z; a structure with every atom masked: the mask token, never right)."""
    counts = torch.zeros(n_struct, int(numbers.max()) + 1, dtype=torch.long)
    vis = ~masked
    counts.index_put_((batch[vis], numbers[vis]), torch.ones(int(vis.sum()), dtype=torch.long), accumulate=True)
    guess = counts.argmax(1)  # first maximum: the smallest Z; all-zero rows give 0 = MASK_Z
    return guess[batch[masked]]


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
    zero = x.new_zeros(())
    if bool(masked.any()):
        logits = heads.unmask(x[masked])
        l_mask = F.cross_entropy(logits, b.numbers[masked])
        acc = (logits.argmax(-1) == b.numbers[masked]).to(dtype).mean().detach()
        maj = (visible_majority(b.numbers, masked, b.batch, n_struct) == b.numbers[masked]).to(dtype).mean()
    else:
        l_mask, acc, maj = zero, zero, zero
    z = heads.proj(mean_pool(x, b.batch, n_struct))
    half = n_struct // 2
    l_pred = ((z[:half] - z[half:]) ** 2).sum(-1).mean()
    l_sig = sigreg_epps_pulley(z, cfg["sigreg_slices"], generator=gen)
    l_jepa = 0.5 * (l_pred + l_sig)
    w = cfg["weights"]
    total = w["denoise"] * l_dn + w["mask"] * l_mask + w["jepa"] * l_jepa
    return {"loss": total, "denoise": l_dn, "denoise_baseline": baseline, "mask": l_mask, "mask_acc": acc,
            "mask_visible_majority": maj, "jepa_pred": l_pred, "sigreg": l_sig, "n_masked": int(masked.sum())}


def validate(model: TriForces, heads: PretrainHeads, val: AtomsData, cfg: dict, seed: int = 12345) -> dict:
    """Every term on the held-out structures with the same corruption at every call (generator
    reseeded): a curve that changes only with the weights. Losses are averaged over structures, the
    masked-element accuracies over masked atoms."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    acc, weights, n_masked = {k: 0.0 for k in KEYS}, 0, 0
    for b in val.batches(int(cfg.get("val_batch") or cfg["batch_size"]), dtype=dtype):
        b.energy, b.forces = None, None
        terms = pretrain_loss(model, heads, two_views(b), cfg, gen, create_graph=False)
        for k in KEYS:
            w = terms["n_masked"] if k in ("mask_acc", "mask_visible_majority") else b.n_structures
            acc[k] += float(terms[k].detach()) * w
        weights += b.n_structures
        n_masked += terms["n_masked"]
    model.train(was)
    return {k: v / max(n_masked if k in ("mask_acc", "mask_visible_majority") else weights, 1) for k, v in acc.items()}


def pretrain(make_model, data: AtomsData, val: AtomsData, cfg: dict | None = None, seed: int = 0, progress=None,
             label: str = "pretrain"):
    """Pre-train a fresh ``make_model()`` on ``data`` (labels, if any, are never read) by the shared
    rule, validated on ``val``. Returns ``(model, heads, history)``: the best held-out-loss weights;
    history holds the held-out curve (``val_step``, ``val_<term>``, ``lr`` at those steps), ``steps``,
    ``lr_chosen``, ``pilot`` (each rate's pilot score), ``drop_step``, ``drop_gain``, ``lr_edge``,
    ``plateau``, ``loss`` (every training step's loss) and ``seconds``."""
    from ...blocks.fitting import fit_to_plateau

    cfg = {**DEFAULTS, **(cfg or {})}
    cfg["weights"] = {**DEFAULTS["weights"], **(cfg.get("weights") or {})}
    bs = int(cfg["batch_size"])
    rule = {k: cfg[k] for k in RULE_KEYS if k in cfg}
    rule.update(select="loss", stop_on=["loss", "neg_mask_acc"])

    def build(gen):
        torch.manual_seed(seed)
        model = make_model()
        dtype = next(model.parameters()).dtype
        return Pretrainer(model, PretrainHeads(model.fused_dim, int(cfg["head_hidden"]), int(cfg["proj_dim"])).to(dtype))

    def train_loss(m: Pretrainer, gen):
        idx = torch.randint(len(data), (bs,), generator=gen).tolist()
        b = data.collate(idx, dtype=next(m.parameters()).dtype)
        b.energy, b.forces = None, None   # unlabelled by construction
        return pretrain_loss(m.model, m.heads, two_views(b), cfg, gen)["loss"]

    def val_loss(m: Pretrainer):
        t = validate(m.model, m.heads, val, cfg)
        # the plateau must hold on the loss and on the masked-element accuracy (as -accuracy, a
        # minimised curve whose relative test is the gate's mode: max on the accuracy)
        return {"loss": t["loss"], "neg_mask_acc": -t["mask_acc"], **{k: t[k] for k in KEYS if k != "loss"}}

    t0 = time.perf_counter()
    m, rec = fit_to_plateau(build, train_loss, val_loss, rule, seed, label=label,
                            progress=progress or (lambda *_: None))
    m.eval()
    cur = rec["curves"]
    hist = {"val_step": list(rec["steps"]), "lr": list(rec["lrs"]), "steps": int(rec["stop"]),
            "lr_chosen": float(rec["lr"]), "pilot": {str(k): v for k, v in rec["pilot_best"].items()},
            "drop_step": rec["drop_step"], "drop_gain": rec["drop_gain"], "lr_edge": rec["lr_edge"],
            "plateau": bool(rec["plateau"]), "loss": list(rec["losses"]), "seconds": time.perf_counter() - t0,
            **{f"val_{k}": list(cur[k]) for k in KEYS}}
    return m.model, m.heads, hist
