"""ArBG in miniature: an autoregressive Boltzmann generator against a spline flow and a CNF.

Variants (same data, same optimiser, same steps and batch, comparable parameter counts):
  arbg  - discretised coordinates, causal transformer, uniform dequantisation (the paper's method)
  flow  - neural spline flow over all coordinates (discrete-time BG baseline)
  cnf   - flow-matching continuous normalizing flow, exact-divergence likelihood (continuous-time BG)

Stages.
  train_shared (per seed): for every target in ``targets`` (dw4 at smoke; dw4 and lj13 at paper),
    MALA samples of the exact Boltzmann density (shared block), split into disjoint train/test
    chains, training set augmented by symmetry images (data.py), saved as ``<target>.pt``.
  train (per variant x seed): maximum likelihood (flow matching for the CNF) with Adam and a cosine
    schedule; a validation curve every ``eval_every`` steps; then ``n_samples`` proposal samples
    with their exact log q, log importance weights log w = -E(x)/T - log q(y), and the metrics:
      ess_<t>     normalised Kish ESS of the weights (1 = perfect proposal, 1/n = one sample counts)
      frac_above_ref_max_<t>  share of proposal samples with energy above the highest test energy
      ew2_<t>     E-W2 (energy units of the target, k_B T = 1) between proposal energies and test
                  reference energies; ew2_rw_<t> the same with the importance weights
      nll_<t>     -mean log q(y) of held-out reference samples (nats, free coordinates)
      ehist_*_<t> energy histograms (density per energy unit) on a fixed grid, for the plots.
Energies are the target's exact energies, evaluated in float64 on the full COM-free configuration.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from reprozoo.figures import save_figure

VARIANTS = ("arbg", "flow", "cnf")


def _target(name: str):
    from ...blocks.boltzmann import make_target

    return make_target(name)


# --- shared per-seed work ----------------------------------------------------------------------

def train_shared(ctx) -> None:
    import torch

    from .data import make_dataset

    p = ctx.params
    for k, name in enumerate(p["targets"]):
        tgt = _target(name)
        gen = torch.Generator().manual_seed(ctx.seed * 1_000_003 + 17 + k)
        t0 = time.process_time()
        data = make_dataset(tgt, p["data"]["n_train"], p["data"]["n_test"], p["data"]["augment"], gen,
                            p["data"]["mala"])
        ctx.metrics.scalar(f"mala_seconds_{name}", time.process_time() - t0)
        ctx.metrics.scalar(f"mala_accept_{name}", float(data["accept"].mean()))
        ctx.progress(f"{name}: {len(data['y_train'])} train (augmented), {len(data['y_test'])} test samples, "
                     f"MALA acceptance {float(data['accept'].mean()):.3f}")
        torch.save(data, ctx.outdir / f"{name}.pt")


# --- per variant -------------------------------------------------------------------------------

def fit(model, y_train, y_val, steps: int, batch: int, lr: float, eval_every: int, generator, val_fn,
        progress=print):
    """Adam with a cosine learning-rate schedule on the model's own loss; returns the train-loss
    curve (mean over each window of ``eval_every`` steps) and the validation curve."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    n, window, tr, va = len(y_train), [], [], []
    for step in range(1, steps + 1):
        idx = torch.randint(0, n, (min(batch, n),), generator=generator, device=y_train.device)
        loss = model.loss(y_train[idx], generator) if _takes_generator(model) else model.loss(y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        window.append(float(loss.detach()))
        if step % eval_every == 0 or step == steps:
            model.eval()
            with torch.no_grad():
                v = float(val_fn(model, y_val))
            model.train()
            tr.append((step, float(np.mean(window))))
            va.append((step, v))
            window = []
            progress(f"step {step}/{steps}: train {tr[-1][1]:.4f} val {v:.4f}")
    return tr, va


def _takes_generator(model) -> bool:
    from .models import CNF

    return isinstance(model, CNF)


def _val_loss(model, y_val):
    """Validation objective of the model's own training loss on held-out samples (fixed noise)."""
    import torch

    from .models import CNF

    if isinstance(model, CNF):
        return model.loss(y_val, torch.Generator(device=y_val.device).manual_seed(0))
    return model.loss(y_val)


def final_slope(curve: list[tuple[int, float]]) -> float:
    """Change of the validation loss per 1000 steps over the last third of training (flatness)."""
    if len(curve) < 3:
        return float("nan")
    xs, ys = np.array(curve, dtype=float).T
    keep = xs >= xs[-1] - (xs[-1] - xs[0]) / 3
    return float(np.polyfit(xs[keep], ys[keep], 1)[0] * 1000) if keep.sum() >= 2 else float("nan")


def energy_histogram(e, lo: float, hi: float, bins: int, weights=None):
    """Density per energy unit on a fixed grid (so seeds and variants align); out-of-range mass is
    dropped from the plot, not from the metrics."""
    e = np.asarray(e, dtype=float)
    w = None if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(e)
    if w is not None:
        keep &= np.isfinite(w)
        w = w[keep] / w[keep].sum()
    else:
        w = np.full(int(keep.sum()), 1.0 / max(int(keep.sum()), 1))
    h, edges = np.histogram(e[keep], bins=bins, range=(lo, hi), weights=w)
    return 0.5 * (edges[1:] + edges[:-1]), h / (edges[1] - edges[0])


def evaluate(model, target, y_test, n_samples: int, generator, hist_range, chunk: int = 8192):
    """Sample the proposal (in chunks), weight it against the exact Boltzmann density, compute
    the metrics (energies and weights in float64 on the CPU)."""
    import torch

    from ...blocks import gen_metrics as M
    from .data import to_full

    n, d = target.n_particles, target.spatial_dim
    model.eval()
    t0 = time.process_time()
    with torch.no_grad():
        ys, lqs = zip(*(model.sample_and_log_prob(min(chunk, n_samples - i), generator)
                        for i in range(0, n_samples, chunk)))
    sample_s = time.process_time() - t0
    y, log_q = torch.cat(ys).cpu(), torch.cat(lqs).cpu()
    with torch.no_grad():
        e_model = target.energy(to_full(y.double(), n, d))
        e_ref = target.energy(to_full(y_test.cpu().double(), n, d))
        log_w = M.log_importance_weights(-e_model / target.temperature, log_q.double())
        lw = np.where(np.isfinite(log_w), log_w, -np.inf)
        w = np.exp(lw - lw.max())
        lq_test = torch.cat([model.log_prob(y_test[i:i + chunk].float()).double().cpu()
                             for i in range(0, len(y_test), chunk)])
    out = {
        "ess": M.kish_ess(log_w),
        "ew2": M.energy_w2(e_model, e_ref),
        "ew2_rw": M.energy_w2(e_model, e_ref, weights=w),
        "nll": M.nll(lq_test),
        "test_outside_support": float((~torch.isfinite(lq_test)).double().mean()),
        "mean_energy": float(e_model[torch.isfinite(e_model)].mean()),
        "mean_energy_rw": float(np.sum(w * np.nan_to_num(e_model.numpy())) / w.sum()),
        "ref_mean_energy": float(e_ref.mean()),
        # share of proposal samples above every reference energy: the tail that dominates E-W2
        "frac_above_ref_max": float((~(e_model <= e_ref.max())).double().mean()),
        "sample_seconds": sample_s,
    }
    lo, hi, nb = hist_range
    hists = {"ehist_model": energy_histogram(e_model.numpy(), lo, hi, nb),
             "ehist_rw": energy_histogram(e_model.numpy(), lo, hi, nb, weights=w),
             "ehist_ref": energy_histogram(e_ref.numpy(), lo, hi, nb)}
    return out, hists


def intervention(model, target, y_test, n_prefixes: int, n_per_prefix: int, generator):
    """Sequential inference-time intervention (ArBG only): condition on the first particle's
    position, taken from ``n_prefixes`` held-out reference configurations, and sample the other
    coordinates from the model's exact conditional q(rest | prefix). Importance weights against the
    target restricted to that prefix: log w = -E(x)/T - log q(rest | prefix)."""
    import torch

    from ...blocks import gen_metrics as M
    from .data import to_full

    n, d = target.n_particles, target.spatial_dim
    idx = torch.linspace(0, len(y_test) - 1, n_prefixes).round().long()
    errs, energies, ess = [], [], []
    model.eval()
    for i in idx.tolist():
        prefix = y_test[i, :d]
        y, lq = model.sample_conditional(prefix, n_per_prefix, generator)
        y, lq = y.cpu().double(), lq.cpu().double()
        errs.append(float((y[:, :d] - prefix.cpu().double()).abs().max()))
        e = target.energy(to_full(y, n, d))
        energies.append(e[torch.isfinite(e)])
        ess.append(M.kish_ess(M.log_importance_weights(-e / target.temperature, lq)))
    e_all = torch.cat(energies)
    return {"intervention_prefix_err": max(errs),
            "intervention_half_bin": float(model.delta * model.scale) / 2,
            "intervention_energy_mean": float(e_all.mean()),
            "intervention_ess": float(np.mean(ess))}


def train(ctx) -> None:
    import torch

    from .models import build, n_params

    p, v = ctx.params, ctx.variant
    if v not in VARIANTS:
        raise ValueError(f"unknown variant {v!r}; this method has {VARIANTS}")
    tp = p["train"]
    device = torch.device(p.get("device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config asks for device 'cuda' but torch sees no GPU; run the paper scale on a GPU "
                           "node or override device=cpu")
    for k, name in enumerate(p["targets"]):
        data = torch.load(ctx.shared_dir / f"{name}.pt", weights_only=True)
        tgt = _target(name)
        y_tr, y_te = data["y_train"].float().to(device), data["y_test"].float().to(device)
        torch.manual_seed(ctx.seed * 7919 + k)
        model = build(v, y_tr.shape[1], float(data["scale"]), p).to(device)
        ctx.metrics.scalar(f"n_params_{name}", n_params(model))
        gen = torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 101 + k)
        t0 = time.process_time()
        tr, va = fit(model, y_tr, y_te, tp["steps"], tp["batch"], tp["lr"], tp["eval_every"], gen, _val_loss,
                     progress=lambda m: ctx.progress(f"{name} {m}"))
        ctx.metrics.scalar(f"train_seconds_{name}", time.process_time() - t0)
        ctx.metrics.curve(f"train_loss_{name}", *zip(*tr))
        ctx.metrics.curve(f"val_loss_{name}", *zip(*va))
        ctx.metrics.scalar(f"val_slope_per_1k_{name}", final_slope(va))
        out, hists = evaluate(model, tgt, y_te, p["eval"]["n_samples"],
                              torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 202 + k),
                              p["energy_hist"][name])
        for key, val in out.items():
            ctx.metrics.scalar(f"{key}_{name}", val)
        for key, (xs, ys) in hists.items():
            ctx.metrics.curve(f"{key}_{name}", xs, ys)
        if v == "arbg":
            iv = p.get("intervention", {})
            iout = intervention(model, tgt, y_te, int(iv.get("n_prefixes", 4)), int(iv.get("n_per_prefix", 256)),
                                torch.Generator(device=device).manual_seed(ctx.seed * 1_000_003 + 303 + k))
            iout["intervention_energy_mean_uncond"] = out["mean_energy"]
            for key, val in iout.items():
                ctx.metrics.scalar(f"{key}_{name}", val)
            ctx.progress(f"{name}: intervention (first particle fixed) prefix err {iout['intervention_prefix_err']:.3g} "
                         f"<= {iout['intervention_half_bin']:.3g}, ESS {iout['intervention_ess']:.4f}")
        ctx.progress(f"{name}: ESS {out['ess']:.4f}, E-W2 {out['ew2']:.3f} (reweighted {out['ew2_rw']:.3f}), "
                     f"NLL {out['nll']:.3f}")


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    targets = sorted({m.rsplit("_", 1)[-1] for m in table.metric.unique() if m.startswith("ess_")})
    variants = [v for v in VARIANTS if v in set(table.variant)]
    colors = {"arbg": "tab:red", "flow": "tab:blue", "cnf": "tab:green"}
    pl = plt()
    for t in targets:
        # energy histograms: proposal and reweighted, against the reference
        fig, axes = pl.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), squeeze=False, sharey=True)
        for ax, v in zip(axes[0], variants):
            for metric, style, label in ((f"ehist_ref_{t}", dict(color="k", lw=2), "reference (MALA)"),
                                         (f"ehist_model_{t}", dict(color=colors[v], ls="--"), f"{v} proposal"),
                                         (f"ehist_rw_{t}", dict(color=colors[v]), f"{v} reweighted")):
                sub = table[(table.metric == metric) & (table.variant == v)]
                if sub.empty:
                    continue
                g = sub.groupby("x").value
                mean, std = g.mean(), g.std().fillna(0.0)
                ax.plot(mean.index, mean.values, label=label, **style)
                ax.fill_between(mean.index, (mean - std).clip(lower=0), mean + std, alpha=0.12,
                                color=style["color"])
            ax.set_xlabel(f"energy E(x) ({t.upper()}, units of k_B T)")
            ax.set_title(v)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0, 0].set_ylabel("density (per energy unit)")
        fig.suptitle(f"{t.upper()}: do proposal and reweighted energies match the reference? (mean ± std over seeds)")
        save_figure(fig, plots_dir / f"energy_hist_{t}.png", dpi=110)

        # ESS / E-W2 / NLL per variant, one dot per seed
        fig, axes = pl.subplots(1, 3, figsize=(12, 3.8))
        panels = ((f"ess_{t}", "normalised Kish ESS (fraction of n)", "ESS (higher is better)"),
                  (f"ew2_{t}", "E-W2 of the proposal (k_B T, log scale)", "E-W2 (lower is better)"),
                  (f"nll_{t}", "test NLL (nats, free coordinates)", "held-out NLL (lower is better)"))
        n_eval = params.get("eval", {}).get("n_samples")
        for ax, (metric, ylabel, title) in zip(axes, panels):
            allv = table[table.metric == metric].value.to_numpy()
            allv = allv[np.isfinite(allv) & (allv > 0)]
            for i, v in enumerate(variants):
                vals = table[(table.metric == metric) & (table.variant == v)].value.to_numpy()
                if len(vals) == 0:
                    continue
                ax.bar(i, vals.mean(), color=colors[v], alpha=0.6)
                ax.scatter(np.full(len(vals), i), vals, color="k", s=12, zorder=3)
            ax.set_xticks(range(len(variants)), variants)
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=10)
            if metric != f"nll_{t}" and len(allv):
                ax.set_yscale("log")
                lo = min(allv.min(), 1.0 / n_eval) if (n_eval and metric == f"ess_{t}") else allv.min()
                ax.set_ylim(lo / 2, allv.max() * 2)
            ax.grid(alpha=0.3, axis="y", which="both")
        if n_eval:
            axes[0].axhline(1.0 / n_eval, color="k", ls=":", lw=1)
            axes[0].annotate("1/n: one sample carries all weight", (0.02, 1.0 / n_eval), xycoords=("axes fraction", "data"),
                             fontsize=7, va="bottom")
        fig.suptitle(f"{t.upper()}: does the autoregressive BG beat the flows? (bars: mean, dots: seeds)")
        save_figure(fig, plots_dir / f"ess_{t}.png", dpi=110)

        curve_plot(table, f"val_loss_{t}", plots_dir / f"curve_val_loss_{t}.png", xlabel="training step",
                   ylabel="validation loss (NLL nats for arbg/flow; FM loss for cnf)",
                   title=f"{t.upper()}: has every model finished training?", variants=variants)
