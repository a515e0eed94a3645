"""TriForces in miniature on the EMT alloy pool.

Data (deterministic, the same for every seed and variant): the pool's ``test`` split is the
held-out test set (energy/force MAEs and retrieval); the other structures are shuffled with
``split_seed``; the first ``n_label_pool`` form the labelled reserve, the next ``n_val`` a
development set (used to choose hyper-parameters while building the method, never in the
metrics), the rest the unlabelled pre-training pool (energies and forces dropped before
pre-training).

train_shared (per seed): self-supervised pre-training (pretrain.py) of the three-stream model and,
for the ablation, of the backbone alone, on the unlabelled pool; encoder weights to shared_dir.
train (per variant x seed): for each N in ``n_train`` a labelled set of N structures (nested,
drawn from the reserve with the seed), a fresh model (pre-trained encoder loaded where the variant
says so), ``fit_energy_scale`` + ``fit`` (energy + force loss, same budget for every variant),
test energy MAE (meV/atom) and force MAE (meV/A); retrieval precision@k of the test structures'
prototype from the latent (mean-pooled fused features) before fine-tuning and after the largest N.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

DATASET = "md_emt_alloy_pool"
# variant -> (three streams?, pre-trained?)
VARIANTS = {
    "triforces": (True, True),
    "triforces_scratch": (True, False),
    "scratch": (False, False),
    "backbone_only_pretrained": (False, True),
}
PRETRAINED = {True: "three_stream", False: "backbone_only"}
# (pre-trained variant, the same architecture without pre-training, architecture)
PRETRAINING_PAIRS = [("triforces", "triforces_scratch", "three streams"),
                     ("backbone_only_pretrained", "scratch", "backbone alone")]


# --- data ------------------------------------------------------------------------------------------

def split_pool(d, p: dict) -> dict:
    """Disjoint index sets: test (the dataset's test split), labelled reserve, unlabelled pool."""
    split = d.table["split"].to_numpy()
    test = np.flatnonzero(split == "test")
    if p.get("n_test"):
        test = test[: int(p["n_test"])]
    rest = np.flatnonzero(split != "test")
    rest = rest[np.random.default_rng(int(p.get("split_seed", 0))).permutation(len(rest))]
    n_lab = int(p["n_label_pool"])
    if n_lab < max(p["n_train"]):
        raise ValueError(f"n_label_pool={n_lab} is smaller than the largest N {max(p['n_train'])}")
    if len(rest) < n_lab + 2:
        raise ValueError(f"pool has {len(rest)} non-test structures, need more than n_label_pool={n_lab}")
    n_val = int(p.get("n_val", 0))
    unlab = rest[n_lab + n_val:]
    if p.get("n_pretrain"):
        unlab = unlab[: int(p["n_pretrain"])]
    return {"test": test, "labelled": rest[:n_lab], "val": rest[n_lab:n_lab + n_val], "unlabelled": unlab}


def atoms_data(d, idx, cutoff: float, labels: bool = True):
    from ...blocks.atomistic.data import AtomsData

    fr = [d.frame(int(i)) for i in idx]
    frames = {"positions": [f["positions"] for f in fr], "numbers": [np.asarray(f["numbers"], np.int64) for f in fr],
              "cells": [f["cell"] for f in fr], "pbc": [np.asarray(f["pbc"], bool) for f in fr],
              "energy": np.array([f["energy"] for f in fr]) if labels else None,
              "forces": [f["forces"] for f in fr] if labels else None}
    return AtomsData(frames, cutoff).precompute()


def _cutoff(mcfg: dict) -> float:
    return max(float(mcfg["backbone"]["cutoff"]), float((mcfg.get("structural") or {}).get("cutoff", 0.0)))


# --- shared: pre-training ----------------------------------------------------------------------------

def pretrained_kinds(p: dict) -> list[str]:
    return list(p.get("pretrain_models", ["three_stream", "backbone_only"]))


def train_shared(ctx) -> None:
    import torch

    from ...data.md import load
    from .model import build
    from .pretrain import pretrain

    p = ctx.params
    d = load(ctx.data[DATASET])
    parts = split_pool(d, p)
    pool = atoms_data(d, parts["unlabelled"], _cutoff(p["model"]), labels=False)
    ctx.metrics.scalar("n_pretrain_structures", len(pool))
    ctx.progress(f"unlabelled pool {len(pool)} structures, labelled reserve {len(parts['labelled'])}, "
                 f"test {len(parts['test'])}")
    for kind in pretrained_kinds(p):
        torch.manual_seed(ctx.seed)
        model = build(p["model"], streams=(kind == "three_stream")).to(torch.float32)
        heads, hist = pretrain(model, pool, p["pretrain"], seed=ctx.seed, progress=ctx.progress)
        torch.save(model.encoder_state(), Path(ctx.outdir) / f"{kind}.pt")
        ep = list(range(1, len(hist["loss"]) + 1))
        ctx.metrics.curve(f"pretrain_loss_{kind}", ep, hist["loss"])
        ctx.metrics.curve(f"pretrain_denoise_{kind}", ep, hist["denoise"])
        ctx.metrics.curve(f"pretrain_mask_ce_{kind}", ep, hist["mask"])
        ctx.metrics.scalar(f"pretrain_seconds_{kind}", hist["seconds"])
        ctx.metrics.scalar(f"pretrain_denoise_r2_{kind}", 1 - hist["denoise"][-1] / hist["denoise_baseline"][-1])
        ctx.metrics.scalar(f"pretrain_mask_acc_{kind}", hist["mask_acc"][-1])


# --- per variant ---------------------------------------------------------------------------------------

def finetune_config(p: dict, n: int, seed: int) -> dict:
    ft = dict(p["finetune"])
    bs = int(ft.get("batch_size", 8))
    per_epoch = int(np.ceil(n / bs))
    steps = int(np.clip(int(ft.pop("epochs", 50)) * per_epoch, int(ft.pop("min_steps", 0)),
                        int(ft.pop("max_steps_cap", 10**9))))
    ft.update(batch_size=bs, epochs=int(np.ceil(steps / per_epoch)), max_steps=steps, seed=seed)
    return ft


def make_model(p: dict, variant: str, shared_dir, seed: int):
    import torch

    from .model import build

    streams, pretrained = VARIANTS[variant]
    torch.manual_seed(seed)
    model = build(p["model"], streams=streams).to(torch.float32)
    if pretrained:
        state = torch.load(Path(shared_dir) / f"{PRETRAINED[streams]}.pt", weights_only=True)
        missing, unexpected = model.load_state_dict(state, strict=False)
        bad = [k for k in missing if not (k.startswith("head.") or k in ("atomref", "e_mean", "e_std"))]
        if bad or unexpected:
            raise RuntimeError(f"pre-trained weights do not match the model: missing {bad}, unexpected {unexpected}")
    return model


def latents(model, data, batch_size: int = 32) -> np.ndarray:
    import torch

    model.eval()
    out = [model.latent(b) for b in data.batches(batch_size, dtype=torch.float32)]
    return torch.cat(out).double().numpy()


def train(ctx) -> None:
    from ...blocks.atomistic import evaluate, fit, fit_energy_scale
    from ...blocks.atomistic.descriptors import precision_at_k
    from ...data.md import load

    p, v = ctx.params, ctx.variant
    if v not in VARIANTS:
        raise ValueError(f"unknown variant {v!r}; known: {sorted(VARIANTS)}")
    d = load(ctx.data[DATASET])
    parts = split_pool(d, p)
    cutoff = _cutoff(p["model"])
    test = atoms_data(d, parts["test"], cutoff)
    reserve = atoms_data(d, parts["labelled"], cutoff)
    proto = d.extras["prototype"][parts["test"]]
    k = int(p.get("retrieval_k", 5))

    model = make_model(p, v, ctx.shared_dir, ctx.seed)
    ctx.metrics.scalar("n_parameters", sum(q.numel() for q in model.parameters()))
    ctx.metrics.scalar("retrieval_p5", precision_at_k(latents(model, test), proto, k))
    order = ctx.rng(7).permutation(len(reserve))
    e_mae, f_mae, secs = [], [], []
    ns = [int(n) for n in p["n_train"]]
    for n in ns:
        model = make_model(p, v, ctx.shared_dir, ctx.seed * 1000 + n)
        tr = reserve.subset(order[:n])
        fit_energy_scale(model, tr)
        t0 = time.perf_counter()
        fit(model, tr, None, finetune_config(p, n, ctx.seed * 1000 + n))
        secs.append(time.perf_counter() - t0)
        m = evaluate(model, test, batch_size=32)
        e_mae.append(1e3 * m["energy_mae_per_atom"])
        f_mae.append(1e3 * m["force_mae"])
        ctx.progress(f"N={n}: energy MAE {e_mae[-1]:.2f} meV/atom, force MAE {f_mae[-1]:.1f} meV/A "
                     f"({secs[-1]:.1f} s)")
    ctx.metrics.curve("energy_mae", ns, e_mae)
    ctx.metrics.curve("force_mae", ns, f_mae)
    ctx.metrics.curve("finetune_seconds", ns, secs)
    ctx.metrics.scalar("energy_mae_nmin", e_mae[0])
    ctx.metrics.scalar("energy_mae_nmax", e_mae[-1])
    ctx.metrics.scalar("force_mae_nmin", f_mae[0])
    ctx.metrics.scalar("force_mae_nmax", f_mae[-1])
    ctx.metrics.scalar("retrieval_p5_finetuned", precision_at_k(latents(model, test), proto, k))
    ctx.metrics.scalar("retrieval_chance", _chance(proto))


def _chance(labels) -> float:
    """Expected precision of a random ranking (self excluded)."""
    labels = np.asarray(labels)
    _, c = np.unique(labels, return_counts=True)
    return float((c * (c - 1)).sum() / (len(labels) * max(len(labels) - 1, 1)))


# --- plots ------------------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    order = [v for v in VARIANTS if v in set(table.variant)]
    curve_plot(table, "energy_mae", plots_dir / "curve_energy_mae.png", logx=True, logy=True,
               xlabel="labelled structures N", ylabel="test energy MAE (meV/atom)",
               title="Energy MAE vs fine-tuning set size", variants=order)
    curve_plot(table, "force_mae", plots_dir / "curve_force_mae.png", logx=True, logy=True,
               xlabel="labelled structures N", ylabel="test force MAE (meV/A)",
               title="Force MAE vs fine-tuning set size", variants=order)
    # the gain from pre-training, each architecture against itself without pre-training
    sub = table[table.metric == "energy_mae"]
    pp = plt()
    fig, ax = pp.subplots(1, 2, figsize=(10, 4))
    for pre, ref, label in PRETRAINING_PAIRS:
        if not {pre, ref} <= set(sub.variant):
            continue
        s = sub[sub.variant == pre].set_index(["seed", "x"]).value
        base = sub[sub.variant == ref].set_index(["seed", "x"]).value
        rel = (1 - s / base).dropna().groupby(level="x")
        m, sd = rel.mean() * 100, rel.std().fillna(0) * 100
        ax[0].errorbar(m.index, m.values, yerr=sd.values, marker="o", ms=3, capsize=2, label=f"{label}: {pre} vs {ref}")
    ax[0].axhline(0, color="k", lw=0.8)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("labelled structures N")
    ax[0].set_ylabel("energy-MAE reduction from pre-training (%)")
    ax[0].set_title("Does pre-training help the same model?")
    ax[0].grid(alpha=0.3)
    ax[0].legend(fontsize=7)
    sc = table[table.metric.isin(["retrieval_p5", "retrieval_p5_finetuned"])]
    w = 0.38
    for j, metric in enumerate(["retrieval_p5", "retrieval_p5_finetuned"]):
        g = sc[sc.metric == metric].groupby("variant").value
        m, sd = g.mean().reindex(order), g.std().reindex(order).fillna(0)
        ax[1].bar(np.arange(len(order)) + (j - 0.5) * w, m.values, w, yerr=sd.values, capsize=2,
                  label={"retrieval_p5": "before fine-tuning", "retrieval_p5_finetuned": "after fine-tuning (max N)"}[metric])
    ch = table[table.metric == "retrieval_chance"].value
    if len(ch):
        ax[1].axhline(ch.mean(), color="k", ls=":", lw=0.8, label="chance")
    ax[1].set_xticks(np.arange(len(order)))
    ax[1].set_xticklabels(order, rotation=15, fontsize=7)
    ax[1].set_ylabel(f"precision@{params.get('retrieval_k', 5)} (same prototype)")
    ax[1].set_title("Structure retrieval from the latent space")
    ax[1].legend(fontsize=7)
    save_figure(fig, plots_dir / "triforces_summary.png", dpi=110)
