"""Binding information in a Vision Transformer, in miniature.

Stages and units:

* ``train_shared`` (per seed): render the recognition scenes and the four balanced binding
  conditions (``scenes.py``); train a small ViT from scratch on recognition (multi-label: which
  colours and which shapes are in the scene, BCE on a linear head over [CLS]) by the shared rule
  ``blocks.fitting.fit_to_plateau`` (AdamW, a rate grid piloted on validation, the best continued
  at a constant rate to the plateau, best-validation weights kept); record its validation loss
  (nats per label) and rate per evaluation (``val_vit``, ``lr_vit``) and its exact-set accuracy
  per condition; save every token of the final layer (after the last LayerNorm) for the probe
  scenes (``_T``), the same for the ViT at its seeded initialisation (``_U``, the
  ``untrained_vit`` control) and the raw pixel patches (``_R``, the ``raw_patches`` control) ->
  ``tokens.npz``. At ``paper`` scale the backbone is a pretrained ViT loaded through
  ``transformers`` instead (``pretrained.py``; its random-init twin for ``_U``).
* ``train`` (per probe variant x seed): for every condition (``variant_conditions`` may restrict a
  control to the conditions its claim reads), fit the variant's probe family twice
  (each by ``fit_to_plateau``, except the convex linear probe, fitted to its optimum by Newton with an
  L2 chosen on validation, ``probes.fit_linear_convex``; curves ``probe_val_ce_{y,f}_<cond>`` and
  ``probe_lr_{y,f}_<cond>``),
  for Y (conjunctions, 16 heads) and for F (features, 8 heads), on the same frozen tokens; test
  cross-entropies CE(Y), CE(F) in bits per scene; binding information H(Y|F) - (CE(Y) - CE(F))
  in bits and binding ratio (``probes.py``); binding accuracy (is the true pairing the most
  likely among those consistent with the true features; chance 1/6 or 1/4) and per-bit accuracy.

Variants (probe families; identical data and the same fitting rule and rate grid):

* ``attention_spatial`` (method): attention probe over the spatial tokens only (never [CLS]),
  one conditioned query per head, quadratic readout;
* ``cls_linear`` (baseline): linear probe on [CLS], the paper's [CLS] probe;
* ``cls_quadratic`` (baseline): the attention probe's quadratic readout applied to [CLS]: separates
  "which tokens are read" from "how nonlinear the readout is";
* ``untrained_vit`` (control): the attention probe on the untrained ViT's spatial tokens;
* ``raw_patches`` (control): the attention probe on the raw pixel patches (locality alone), on the
  ``straddle`` scenes its claim reads.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import scenes as S
from reprozoo.figures import save_figure

VARIANT_PROBES = {  # variant -> (probe family, which tokens, token set: T trained ViT, U untrained ViT, R raw patches)
    "attention_spatial": ("attention", "spatial", "T"),
    "cls_linear": ("linear", "cls", "T"),
    "cls_quadratic": ("quadratic", "cls", "T"),
    "untrained_vit": ("attention", "spatial", "U"),
    "raw_patches": ("attention", "patches", "R"),
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


def train_vit(Xtr, Ttr, Xva, Tva, cfg: dict, fit: dict, seed: int, progress=print):
    """From-scratch ViT on multi-label recognition, trained by the shared rule
    ``blocks.fitting.fit_to_plateau`` (AdamW, one learning-rate grid piloted on validation, the best
    rate continued at a constant rate to the plateau, best-validation weights kept); returns the model
    and the fit record (validation mean BCE in nats per label at ``steps``, rates at ``lrs``)."""
    import torch

    from ...blocks.fitting import fit_to_plateau

    Xtr, Ttr, Xva, Tva = (torch.from_numpy(a) for a in (Xtr, Ttr, Xva, Tva))
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    def train_loss(vit, gen):
        idx = torch.randint(len(Xtr), (cfg["batch"],), generator=gen)
        return bce(vit(Xtr[idx]), Ttr[idx])

    def val_loss(vit):
        with torch.no_grad():
            return float(bce(vit(Xva), Tva))

    vit, rec = fit_to_plateau(lambda gen: build_vit(Xtr.shape[-1], Ttr.shape[1], cfg, seed), train_loss, val_loss,
                              fit, seed, label="ViT", progress=progress)
    return vit.eval(), rec


def build_vit(img: int, n_out: int, cfg: dict, seed: int):
    """The ViT at its initialisation for this seed (the ``untrained_vit`` control reads it as is)."""
    import torch

    from ...blocks.transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(img, cfg["patch"], cfg["dim"], cfg["depth"], cfg["heads"], cfg["mlp_ratio"], n_out=n_out)


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
        from ...blocks.transformer import patchify  # the raw-pixel control at the backbone's patch size
        import torch

        untrained = {**p["pretrained"], "random_init": True, "seed": ctx.seed}
        tokens.update({k.removesuffix("_X") + "_U": pretrained_tokens(v, untrained)
                       for k, v in probe_sets.items() if k.endswith("_X")})
        tokens.update({k.removesuffix("_X") + "_R": patchify(torch.from_numpy(v), p["pretrained"].get("patch", 14)).numpy()
                       for k, v in probe_sets.items() if k.endswith("_X")})
        vit_info = {}
    else:
        import torch

        rec = p["recognition"]
        t0 = time.process_time()
        kw = {"p_chain": rec["p_chain"], "p_free": rec.get("p_free", 0.0)}
        Xtr, Ytr = S.recognition_scenes(rec["n_train"], rng, p["geometry"], **kw)
        Xva, Yva = S.recognition_scenes(rec["n_val"], rng, p["geometry"], **kw)
        ctx.progress(f"rendered {len(Xtr) + len(Xva)} recognition scenes in {time.process_time() - t0:.1f} CPU-s")
        Ttr, Tva = recognition_target(Ytr, rec["target"]), recognition_target(Yva, rec["target"])
        t0 = time.process_time()
        vit, rec_fit = train_vit(Xtr, Ttr, Xva, Tva, p["vit"], p["vit_fit"], ctx.seed, ctx.progress)
        vit_info = {"vit_train_cpu_seconds": time.process_time() - t0, "vit_plateau": float(rec_fit["plateau"]),
                    "lr_chosen_vit": float(rec_fit["lr"]), "steps_vit": float(rec_fit["stop"])}
        untrained = build_vit(Xtr.shape[-1], Ttr.shape[1], p["vit"], ctx.seed).eval()
        from ...blocks.transformer import patchify

        with torch.no_grad():
            vit_info["vit_val_exact"] = exact_set_accuracy(vit(torch.from_numpy(Xva)).numpy(), Tva)
            tokens = {}
            for k, v in probe_sets.items():
                if k.endswith("_X"):
                    x = torch.from_numpy(v)
                    stem = k.removesuffix("_X")
                    tokens[stem + "_T"] = vit.forward_tokens(x).numpy()
                    tokens[stem + "_U"] = untrained.forward_tokens(x).numpy()
                    tokens[stem + "_R"] = patchify(x, p["vit"]["patch"]).numpy()
            for cond in p["conditions"]:
                X, Y = probe_sets[f"{cond}_test_X"], probe_sets[f"{cond}_test_Y"]
                vit_info[f"vit_exact_{cond}"] = exact_set_accuracy(vit(torch.from_numpy(X)).numpy(),
                                                                   recognition_target(Y, rec["target"]))
        vit_info["vit_curve"] = {k: rec_fit[k] for k in ("steps", "vals", "lrs")}
        for k, v in vit_info.items():
            if not isinstance(v, dict):
                ctx.metrics.scalar(k, v)
        ctx.metrics.curve("val_vit", rec_fit["steps"], rec_fit["vals"])
        ctx.metrics.curve("lr_vit", rec_fit["steps"], rec_fit["lrs"])
    arrays = {k: v for k, v in probe_sets.items() if not k.endswith("_X")}
    np.savez_compressed(ctx.outdir / "tokens.npz", **tokens, **arrays)
    import json

    (ctx.outdir / "vit_info.json").write_text(json.dumps(vit_info))


# --- per probe variant ----------------------------------------------------------------------------

def probe_condition(kind: str, tokens_of: str, data, cond: str, cfg: dict, seed: int, token_set: str = "T") -> dict:
    """Fit the Y and F probes of one family on one condition; the binding metrics on its test split."""
    import torch

    from . import probes as P

    def z(split):
        t = torch.from_numpy(data[f"{cond}_{split}_{token_set}"])
        return {"spatial": t[:, 1:], "cls": t[:, 0], "patches": t}[tokens_of]

    lab = {(s, n): torch.from_numpy(data[f"{cond}_{s}_{n}"].astype(np.float32)) for s in SPLITS for n in "YF"}
    out, t0 = {}, time.process_time()
    for name in "YF":
        if kind == "linear" and "convex" in cfg:  # convex: fitted to its optimum (L-BFGS, L2 on validation)
            probe, fit = P.fit_linear_convex(z("train"), lab["train", name], z("val"), lab["val", name],
                                             cfg["convex"], seed)
            out[f"l2_chosen_{name.lower()}"] = fit["l2"]
            out[f"grad_norm_{name.lower()}"] = fit["grad_norm"]
        else:
            probe, fit = P.fit_probe(kind, z("train"), lab["train", name], z("val"), lab["val", name], cfg, seed)
        ce = P.cross_entropy_bits(probe, z("test"), lab["test", name])
        out[f"ce_{name.lower()}_units"] = ce
        out[f"ce_{name.lower()}"] = float(ce.mean())
        out[f"ce_{name.lower()}_sem"] = float(ce.std(ddof=1) / np.sqrt(len(ce)))
        out[f"steps_{name.lower()}"] = float(fit["stop"])
        # 1 if the fit ran into fit.max_steps without passing the plateau test, else 0
        out[f"cap_hit_{name.lower()}"] = float(not fit["plateau"])
        out[f"lr_chosen_{name.lower()}"] = float(fit["lr"])
        out[f"fit_{name.lower()}"] = fit
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
    # per test scene (the same scenes, in the same order, for every variant of a seed): their mean is
    # the binding ratio above, so the claims get the seed x scene bootstrap interval
    out["binding_ratio_units"] = P.binding_ratio(h, out["ce_y_units"], out["ce_f_units"])[1]
    out["probe_cpu_seconds"] = time.process_time() - t0
    return out


def train(ctx) -> None:
    import json

    p = ctx.params
    if ctx.variant not in VARIANT_PROBES:
        raise KeyError(f"variant '{ctx.variant}' unknown; known: {sorted(VARIANT_PROBES)}")
    kind, tokens_of, token_set = VARIANT_PROBES[ctx.variant]
    data = dict(np.load(ctx.shared_dir / "tokens.npz"))
    cap_hits = 0.0
    # a control read only where a claim reads it (raw_patches: the straddle claim's control)
    conditions = p.get("variant_conditions", {}).get(ctx.variant, p["conditions"])
    for cond in conditions:
        r = probe_condition(kind, tokens_of, data, cond, p["probe"], ctx.seed, token_set)
        ctx.metrics.units(f"binding_ratio_{cond}", r["binding_ratio_units"])
        for key in ("binding_info", "ce_y", "ce_f", "ce_y_sem", "ce_f_sem", "acc_y", "acc_f",
                    "binding_acc", "binding_chance", "h_y_given_f", "steps_y", "steps_f", "cap_hit_y", "cap_hit_f",
                    "lr_chosen_y", "lr_chosen_f", "probe_cpu_seconds",
                    "l2_chosen_y", "l2_chosen_f", "grad_norm_y", "grad_norm_f"):
            if key in r:
                ctx.metrics.scalar(f"{key}_{cond}", r[key])
        cap_hits += r["cap_hit_y"] + r["cap_hit_f"]
        for name in "yf":
            fit = r[f"fit_{name}"]
            ctx.metrics.curve(f"probe_val_ce_{name}_{cond}", fit["steps"], fit["vals"])
            ctx.metrics.curve(f"probe_lr_{name}_{cond}", fit["steps"], fit["lrs"])
        ctx.progress(f"{cond}: CE(Y) {r['ce_y']:.3f} CE(F) {r['ce_f']:.3f} bits, binding ratio "
                     f"{r['binding_ratio']:.3f}, binding acc {r['binding_acc']:.3f} (chance {r['binding_chance']:.3f})")
    ctx.metrics.scalar("probe_cap_hits", cap_hits)  # fits (Y and F, all conditions) that ended at fit.max_steps
    info = json.loads((ctx.shared_dir / "vit_info.json").read_text())
    for k, v in info.items():  # the trained backbone's own numbers, repeated in every variant's table
        if not isinstance(v, dict):
            ctx.metrics.scalar(k, v)
    if "vit_curve" in info and token_set == "T":  # the gate reads the trained ViT's curve where its tokens are probed
        c = info["vit_curve"]
        ctx.metrics.curve("val_vit", c["steps"], c["vals"])
        ctx.metrics.curve("lr_vit", c["steps"], c["lrs"])


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
    curve_plot(table, "val_vit", plots_dir / "curve_val_vit.png", xlabel="step",
               ylabel="validation BCE (nats per label)", title="Has the from-scratch ViT finished learning?",
               variants=[v for v in VARIANT_PROBES if v in set(table.variant)][:1])
