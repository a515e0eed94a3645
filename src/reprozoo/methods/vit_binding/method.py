"""Binding information in a Vision Transformer, in miniature.

Stages and units:

* ``train_shared`` (per seed): render the recognition scenes and the three balanced binding
  conditions (``scenes.py``); train a small ViT from scratch on recognition (multi-label: which
  colours and which shapes are in the scene, BCE on a linear head over [CLS]; AdamW, cosine
  schedule, the best-on-validation epoch kept); record its validation loss per epoch (nats per
  label) and its exact-set accuracy; save every token of the final layer (after the last
  LayerNorm) for the probe scenes -> ``tokens.npz``. At ``paper`` scale the backbone is a
  pretrained ViT loaded through ``transformers`` instead (``pretrained.py``).
* ``train`` (per probe variant x seed): for every condition, fit the variant's probe family twice,
  for Y (conjunctions, 16 heads) and for F (features, 8 heads), on the same frozen tokens; test
  cross-entropies CE(Y), CE(F) in bits per scene; binding information H(Y|F) - (CE(Y) - CE(F))
  in bits and binding ratio (``probes.py``); binding accuracy (is the true pairing the most
  likely among those consistent with the true features; chance 1/6 or 1/4) and per-bit accuracy.

Variants (probe families; identical data, optimiser, epochs and early stopping):

* ``attention_spatial`` (method): attention probe over the spatial tokens only (never [CLS]),
  one conditioned query per head, quadratic readout;
* ``cls_linear`` (baseline): linear probe on [CLS], the paper's [CLS] probe;
* ``cls_quadratic`` (baseline): the attention probe's quadratic readout applied to [CLS]: separates
  "which tokens are read" from "how nonlinear the readout is".
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import scenes as S
from reprozoo.figures import save_figure

VARIANT_PROBES = {  # variant -> (probe family, which tokens)
    "attention_spatial": ("attention", "spatial"),
    "cls_linear": ("linear", "cls"),
    "cls_quadratic": ("quadratic", "cls"),
}
SPLITS = ("train", "val", "test")


# --- shared per seed: scenes, ViT, tokens --------------------------------------------------------

def render_probe_sets(p: dict, rng) -> dict:
    """Balanced scenes of every condition, split train / val / test (arrays keyed cond_split_X|Y|F)."""
    out = {}
    for cond in p["conditions"]:
        n = {s: p["probe_data"][f"n_{s}"] for s in SPLITS}
        X, Y, F = S.balanced_scenes(cond, sum(n.values()), rng, p["geometry"])
        start = 0
        for s in SPLITS:
            sl = slice(start, start + n[s])
            out[f"{cond}_{s}_X"], out[f"{cond}_{s}_Y"], out[f"{cond}_{s}_F"] = X[sl], Y[sl], F[sl]
            start += n[s]
    return out


def recognition_target(Y: np.ndarray, target: str) -> np.ndarray:
    if target == "features":
        return S.features_of(Y)
    if target == "conjunctions":
        return Y
    raise ValueError(f"recognition target '{target}' unknown (features, conjunctions)")


def train_vit(Xtr, Ttr, Xva, Tva, cfg: dict, seed: int, progress=print):
    """From-scratch ViT on multi-label recognition; returns the best-on-validation model and the
    validation curve (epoch, mean BCE in nats per label)."""
    import torch

    from ...blocks.transformer import VisionTransformer

    torch.manual_seed(seed)
    vit = VisionTransformer(Xtr.shape[-1], cfg["patch"], cfg["dim"], cfg["depth"], cfg["heads"],
                            cfg["mlp_ratio"], n_out=Ttr.shape[1])
    opt = torch.optim.AdamW(vit.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    steps_per_epoch = len(Xtr) // cfg["batch"]
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, cfg["lr"], total_steps=cfg["epochs"] * steps_per_epoch,
                                                pct_start=0.1)
    Xtr, Ttr, Xva, Tva = (torch.from_numpy(a) for a in (Xtr, Ttr, Xva, Tva))
    gen = torch.Generator().manual_seed(seed)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    curve, best, best_state = [], float("inf"), None
    for epoch in range(cfg["epochs"]):
        vit.train()
        perm = torch.randperm(len(Xtr), generator=gen)
        for i in range(steps_per_epoch):
            idx = perm[i * cfg["batch"]:(i + 1) * cfg["batch"]]
            loss = bce(vit(Xtr[idx]), Ttr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        vit.eval()
        with torch.no_grad():
            val = float(bce(vit(Xva), Tva))
        curve.append((epoch + 1, val))
        if val < best:
            best, best_state = val, {k: v.clone() for k, v in vit.state_dict().items()}
        progress(f"ViT epoch {epoch + 1}/{cfg['epochs']}: train {loss.item():.4f} val {val:.4f} nats/label")
    vit.load_state_dict(best_state)
    return vit.eval(), curve


def exact_set_accuracy(logits, target) -> float:
    return float(((logits > 0).astype(np.float32) == target).all(1).mean())


def train_shared(ctx) -> None:
    p = ctx.params
    rng = ctx.rng(0)
    probe_sets = render_probe_sets(p, ctx.rng(1))
    if p.get("backbone", "scratch") == "pretrained":
        from .pretrained import pretrained_tokens

        ctx.progress(f"tokens of the pretrained backbone {p['pretrained']['name']}")
        tokens = {k.removesuffix("_X") + "_T": pretrained_tokens(v, p["pretrained"])
                  for k, v in probe_sets.items() if k.endswith("_X")}
        vit_info = {}
    else:
        import torch

        rec = p["recognition"]
        t0 = time.process_time()
        Xtr, Ytr = S.recognition_scenes(rec["n_train"], rng, p["geometry"], p_chain=rec["p_chain"])
        Xva, Yva = S.recognition_scenes(rec["n_val"], rng, p["geometry"], p_chain=rec["p_chain"])
        ctx.progress(f"rendered {len(Xtr) + len(Xva)} recognition scenes in {time.process_time() - t0:.1f} CPU-s")
        Ttr, Tva = recognition_target(Ytr, rec["target"]), recognition_target(Yva, rec["target"])
        t0 = time.process_time()
        vit, curve = train_vit(Xtr, Ttr, Xva, Tva, p["vit"], ctx.seed, ctx.progress)
        vit_info = {"vit_train_cpu_seconds": time.process_time() - t0}
        with torch.no_grad():
            vit_info["vit_val_exact"] = exact_set_accuracy(vit(torch.from_numpy(Xva)).numpy(), Tva)
            tokens = {}
            for k, v in probe_sets.items():
                if k.endswith("_X"):
                    tokens[k.removesuffix("_X") + "_T"] = vit.forward_tokens(torch.from_numpy(v)).numpy()
            for cond in p["conditions"]:
                X, Y = probe_sets[f"{cond}_test_X"], probe_sets[f"{cond}_test_Y"]
                vit_info[f"vit_exact_{cond}"] = exact_set_accuracy(vit(torch.from_numpy(X)).numpy(),
                                                                   recognition_target(Y, rec["target"]))
        ep, vals = zip(*curve)
        k = min(3, len(vals) - 1)  # slope of the last epochs, relative to the loss: has it flattened?
        vit_info["vit_val_final_rel_slope"] = (vals[-1] - vals[-1 - k]) / max(k, 1) / vals[-1] if k else float("nan")
        vit_info["vit_val_curve_epochs"], vit_info["vit_val_curve"] = list(ep), list(vals)
        for k, v in vit_info.items():
            if not isinstance(v, list):
                ctx.metrics.scalar(k, v)
        ctx.metrics.curve("vit_val_loss", ep, vals)
    arrays = {k: v for k, v in probe_sets.items() if not k.endswith("_X")}
    np.savez_compressed(ctx.outdir / "tokens.npz", **tokens, **arrays)
    import json

    (ctx.outdir / "vit_info.json").write_text(json.dumps(vit_info))


# --- per probe variant ----------------------------------------------------------------------------

def probe_condition(kind: str, tokens_of: str, data, cond: str, cfg: dict, seed: int) -> dict:
    """Fit the Y and F probes of one family on one condition; the binding metrics on its test split."""
    import torch

    from . import probes as P

    def z(split):
        t = torch.from_numpy(data[f"{cond}_{split}_T"])
        return t[:, 1:] if tokens_of == "spatial" else t[:, 0]

    lab = {(s, n): torch.from_numpy(data[f"{cond}_{s}_{n}"].astype(np.float32)) for s in SPLITS for n in "YF"}
    out, t0 = {}, time.process_time()
    for name in "YF":
        probe, curve = P.fit_probe(kind, z("train"), lab["train", name], z("val"), lab["val", name], cfg, seed)
        ce = P.cross_entropy_bits(probe, z("test"), lab["test", name])
        out[f"ce_{name.lower()}"] = float(ce.mean())
        out[f"ce_{name.lower()}_sem"] = float(ce.std(ddof=1) / np.sqrt(len(ce)))
        out[f"epochs_{name.lower()}"] = curve[-1][0]
        # 1 if the fit ran into the epoch cap (did not stop on patience), else 0
        out[f"cap_hit_{name.lower()}"] = float(curve[-1][0] >= cfg["epochs"])
        out[f"val_curve_{name.lower()}"] = curve
        with torch.no_grad():
            logits = probe(z("test"), lab["test", name])
        out[f"acc_{name.lower()}"] = float(((logits > 0).float() == lab["test", name]).float().mean())
        if name == "Y":
            cands = [torch.from_numpy(S.candidates_given_features(f, cond)) for f in data[f"{cond}_test_F"]]
            out["binding_acc"] = P.candidate_accuracy(probe, z("test"), cands, lab["test", "Y"])
            out["binding_chance"] = 1.0 / len(cands[0])
    h = S.conditional_entropy_bits(cond)
    out["h_y_given_f"] = h
    out["binding_info"], out["binding_ratio"] = P.binding_ratio(h, out["ce_y"], out["ce_f"])
    out["probe_cpu_seconds"] = time.process_time() - t0
    return out


def train(ctx) -> None:
    import json

    p = ctx.params
    if ctx.variant not in VARIANT_PROBES:
        raise KeyError(f"variant '{ctx.variant}' unknown; known: {sorted(VARIANT_PROBES)}")
    kind, tokens_of = VARIANT_PROBES[ctx.variant]
    data = dict(np.load(ctx.shared_dir / "tokens.npz"))
    cap_hits = 0.0
    for cond in p["conditions"]:
        r = probe_condition(kind, tokens_of, data, cond, p["probe"], ctx.seed)
        for key in ("binding_ratio", "binding_info", "ce_y", "ce_f", "ce_y_sem", "ce_f_sem", "acc_y", "acc_f",
                    "binding_acc", "binding_chance", "h_y_given_f", "epochs_y", "epochs_f", "cap_hit_y", "cap_hit_f",
                    "probe_cpu_seconds"):
            ctx.metrics.scalar(f"{key}_{cond}", r[key])
        cap_hits += r["cap_hit_y"] + r["cap_hit_f"]
        for name in "yf":
            ep, vals = zip(*r[f"val_curve_{name}"])
            ctx.metrics.curve(f"probe_val_ce_{name}_{cond}", ep, vals)
        ctx.progress(f"{cond}: CE(Y) {r['ce_y']:.3f} CE(F) {r['ce_f']:.3f} bits, binding ratio "
                     f"{r['binding_ratio']:.3f}, binding acc {r['binding_acc']:.3f} (chance {r['binding_chance']:.3f})")
    ctx.metrics.scalar("probe_cap_hits", cap_hits)  # fits (Y and F, all conditions) that hit probe.epochs
    info = json.loads((ctx.shared_dir / "vit_info.json").read_text())
    for k, v in info.items():  # the backbone's own numbers, repeated in every variant's table
        if not isinstance(v, list):
            ctx.metrics.scalar(k, v)
    if "vit_val_curve" in info:
        ctx.metrics.curve("vit_val_loss", info["vit_val_curve_epochs"], info["vit_val_curve"])


# --- plots ----------------------------------------------------------------------------------------

def _bars(table, metric_prefix: str, conditions, ax, chance_prefix: str | None = None):
    variants = [v for v in VARIANT_PROBES if v in set(table.variant)]
    width = 0.8 / max(1, len(variants))
    for j, v in enumerate(variants):
        means, errs = [], []
        for cond in conditions:
            vals = table[(table.variant == v) & (table.metric == f"{metric_prefix}_{cond}")].value
            means.append(vals.mean() if len(vals) else np.nan)
            errs.append(vals.std(ddof=1) if len(vals) > 1 else 0.0)
        ax.bar(np.arange(len(conditions)) + (j - (len(variants) - 1) / 2) * width, means, width, yerr=errs,
               capsize=3, label=v)
    if chance_prefix:
        for i, cond in enumerate(conditions):
            ch = table[table.metric == f"{chance_prefix}_{cond}"].value
            if len(ch):
                ax.hlines(ch.mean(), i - 0.45, i + 0.45, colors="k", linestyles=":", label="chance" if i == 0 else None)
    ax.set_xticks(range(len(conditions)), conditions)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    conditions = list(params.get("conditions", S.CONDITIONS))
    pl = plt()
    panels = [("binding_ratio", "binding ratio (1 = all of H(Y|F))",
               "Which tokens hold which-feature-goes-with-which? Binding ratio by condition", None, "binding_ratio.png"),
              ("binding_acc", "binding accuracy (fraction of test scenes)",
               "Probe accuracy: true pairing ranked first among those with the same features", "binding_chance",
               "probe_accuracy_binding.png"),
              ("acc_y", "per-bit accuracy of the conjunction probe", "Probe accuracy on Y (conjunction bits)", None,
               "probe_accuracy_y.png"),
              ("acc_f", "per-bit accuracy of the feature probe", "Probe accuracy on F (feature bits)", None,
               "probe_accuracy_f.png")]
    for metric, ylabel, title, chance, fname in panels:
        fig, ax = pl.subplots(figsize=(6.5, 4))
        _bars(table, metric, conditions, ax, chance)
        if metric == "binding_ratio":
            ax.axhline(0, color="k", lw=0.8)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("scene condition (mean +- std over seeds)")
        ax.set_title(title, fontsize=9)
        save_figure(fig, plots_dir / fname, dpi=110)
    curve_plot(table, "vit_val_loss", plots_dir / "curve_vit_val_loss.png", xlabel="epoch",
               ylabel="validation BCE (nats per label)", title="Has the from-scratch ViT finished learning?",
               variants=[v for v in VARIANT_PROBES if v in set(table.variant)][:1])
