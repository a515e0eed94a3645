"""Spike-HTR (hybrid spiking handwritten text recognition) in miniature.

Stages and units:

* ``train_shared`` (per seed): render train / val / test digit lines (``data.py``) -> lines.npz.
* ``train`` (per variant x seed): build the variant's recogniser (``model.py``) and train it with
  CTC (``torch.nn.CTCLoss``, blank = 0) and Adam at a constant learning rate (after a short linear
  warm-up) chosen for each variant from ONE grid on validation (``lr_sweep.py``, seed 0), the
  validated and tested network being the moving average of the weights (``optim.ema``); batch
  and stopping rule the same in every variant: validate every ``eval_every`` steps and stop once
  the validation CTC loss is flat by the convergence gate's own test (``claims.tail_fit``: at most
  2 % improvement over the last 30 % of the run) at two evaluations in a row, between
  ``min_steps`` and ``max_steps``. Loss = CTC(head) + λ_aux CTC(aux head on the encoder
  features), the auxiliary term in EVERY variant (like for like; only the reducer variants use it
  to reduce the length).

Recorded: validation CTC loss (nats per line), validation CER and the learning rate per
evaluation; on the test lines (greedy decoding, no LM), per line: edit distance and reference
length (units, so claims read corpus CER = Σ edits / Σ chars with a line-level interval), fraction
of width positions the mixer sees; AC / MAC counts and energy (nJ per line). Controls, measured
in the same job: the test edits of the same network after ``control_step`` steps (an under-trained
SNN), and for the reducer variants the kept fraction before training, the test edits with the
confident-blank runs dropped instead of merged, the energy with the reducer keeping every
position, and a sweep of the reducer's threshold τ at test time.

Variants:

* ``spike_htr`` (method): learned InkCoder stream (T = 2) -> LIF CNN -> CTC-guided length reducer -> BiLSTM -> CTC;
* ``snn_full`` (baseline): the same without the reducer (the mixer sees all L positions);
* ``ann_crnn`` (baseline): the same CNN with ReLU on the static image (one step), no reducer;
* ``fixed_inkcoder`` (ablation, not in spec.yaml's variants for the smoke budget; lr_sweep.py and
  a spec line run it): ``spike_htr`` with the fixed blur pyramid instead of the learned coder.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...claims import tail_fit
from . import data as D
from reprozoo.figures import save_figure

GENERIC_CURVES = {}   # plot() draws every figure
PLATEAU_TOL = 0.02    # the convergence gate's tolerance (spec: convergence)
VARIANTS = {"spike_htr": dict(spiking=True, reducer=True, coder="learned"),
            "snn_full": dict(spiking=True, reducer=False, coder="learned"),
            "ann_crnn": dict(spiking=False, reducer=False),
            "fixed_inkcoder": dict(spiking=True, reducer=True, coder="fixed")}


def split_rng(seed: int) -> np.random.Generator:
    """The data stream of a seed (same as ``ctx.rng(0)``); plot() re-renders examples with it."""
    return np.random.default_rng(seed * 1_000_003)


def _splits(p: dict, seed: int) -> dict:
    if p.get("dataset", "digits") == "iam":
        iam = p["iam"]
        return {s: D.load_iam_lines(iam["root"], iam[f"{s}_ids"], p["data"]["height"], p["data"]["width"],
                                    p["alphabet"]) for s in ("train", "val", "test")}
    return D.make_splits(p, split_rng(seed))


def train_shared(ctx) -> None:
    splits = _splits(ctx.params, ctx.seed)
    arrays = {}
    for s, (X, texts) in splits.items():
        flat, lens = D.pack(texts)
        arrays.update({f"{s}_X": X, f"{s}_y": flat, f"{s}_len": lens})
    np.savez_compressed(Path(ctx.shared_dir) / "lines.npz", **arrays)
    ctx.progress(f"rendered lines: " + ", ".join(f"{s} {len(v[0])}" for s, v in splits.items()))


def _load(ctx):
    import torch

    z = np.load(Path(ctx.shared_dir) / "lines.npz")
    out = {}
    for s in ("train", "val", "test"):
        lens = z[f"{s}_len"]
        offs = np.concatenate([[0], np.cumsum(lens)])
        texts = [list(z[f"{s}_y"][offs[i]:offs[i + 1]]) for i in range(len(lens))]
        out[s] = (torch.from_numpy(z[f"{s}_X"]).unsqueeze(1), texts)
    return out


def _targets(texts):
    import torch

    return (torch.tensor([c for t in texts for c in t], dtype=torch.long),
            torch.tensor([len(t) for t in texts], dtype=torch.long))


def _evaluate(model, X, texts, ctc_loss, tau=None, reduce="merge", costs=True, batch=256):
    """Val/test pass: CTC loss (nats per line), corpus CER, per-line edits / reference lengths /
    kept fractions, costs per line."""
    import torch

    from .ctc import edit_distance, greedy_decode

    model.eval()
    preds, loss, kept, cost_rows = [], 0.0, [], []
    with torch.no_grad():
        for i in range(0, len(X), batch):
            xb, tb = X[i:i + batch], texts[i:i + batch]
            out = model(xb, tau, reduce)
            y, ylen = _targets(tb)
            loss += float(ctc_loss(out["logp"].transpose(0, 1), y, out["lengths"], ylen))
            preds += greedy_decode(out["logp"], out["lengths"])
            kept.append(out["lengths"].float() / out["L"])
            if costs:
                c = model.costs(xb, out)
                cost_rows.append({k: v * len(xb) for k, v in c.items()})
    model.train()
    n = len(X)
    refs = [list(map(int, t)) for t in texts]
    edits = [edit_distance(p, r) for p, r in zip(preds, refs)]
    chars = [len(r) for r in refs]
    tot = {k: sum(c[k] for c in cost_rows) / n for k in cost_rows[0]} if costs else {}
    kept = torch.cat(kept)
    return {"loss": loss / n, "cer": sum(edits) / max(1, sum(chars)), "edits": edits, "chars": chars,
            "kept_lines": kept.tolist(), "kept": float(kept.mean()), "preds": preds, **tot}


def lr_for(params: dict, variant: str) -> float:
    """The constant learning rate of ``variant``: ``optim.lr_by_variant[variant]`` (chosen by
    ``lr_sweep.py`` from ``optim.lr_grid`` on seed 0's validation lines), else ``optim.lr``."""
    o = params["optim"]
    return float((o.get("lr_by_variant") or {}).get(variant, o["lr"]))


def build(params: dict, variant: str, height: int):
    from .model import Recognizer

    m = params["model"]
    return Recognizer(height, len(params["alphabet"]), tuple(m["channels"]), m["d_model"], m["hidden"],
                      T=m["T"], sigma_max=m["sigma_max"], beta=m["beta"], threshold=m["threshold"],
                      tau=m["tau"], pools=m.get("pools", ((2, 2), (2, 1), (1, 1))),
                      readout=m.get("readout", "spikes"), sigma_last=m.get("sigma_last", 0.3),
                      sigma_cap=m.get("sigma_cap", 2.0), **VARIANTS[variant])


def fit(model, splits: dict, params: dict, seed: int, lr: float, progress=lambda s: None,
        on_step=None) -> dict:
    """Adam at the constant rate ``lr`` (linear warm-up over ``optim.warmup`` steps), stopped at a
    plateau of the validation CTC loss by the gate's own test (two evaluations in a row) between
    ``min_steps`` and ``max_steps``. With ``optim.ema`` > 0 the network that is validated (and
    returned, in ``model``) is the exponential moving average of the trained weights and buffers
    (Polyak averaging, time constant 1/(1 - ema) steps): at a constant rate it removes the
    step-to-step jitter of the weights, so the validation curve shows the trend, not the noise.
    ``on_step(step, net)`` is called after every update with the network that is validated
    (controls). Returns the curves (steps, val_ctc, val_cer, train_loss, lr) and the CPU seconds."""
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    o = params["optim"]
    Xtr, Ttr = splits["train"]
    Xva, Tva = splits["val"]
    ctc_sum = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    warm = max(1, int(o.get("warmup", 1)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / warm))
    gen = torch.Generator().manual_seed(seed)
    every, min_steps, max_steps = int(o["eval_every"]), int(o["min_steps"]), int(o["max_steps"])
    min_pts = int(o.get("min_tail_points", 6))
    rec = {k: [] for k in ("steps", "val_ctc", "val_cer", "train_loss", "lr")}
    t0 = time.process_time()
    decay = float(o.get("ema", 0.0))
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True) if decay > 0 else None
    net = ema.module if ema is not None else model          # the network that is validated
    perm, pos, run, nrun, flat = torch.randperm(len(Xtr), generator=gen), 0, 0.0, 0, 0
    model.train()
    for step in range(1, max_steps + 1):
        if pos + o["batch"] > len(Xtr):
            perm, pos = torch.randperm(len(Xtr), generator=gen), 0
        idx = perm[pos:pos + o["batch"]]
        pos += o["batch"]
        xb, tb = Xtr[idx], [Ttr[i] for i in idx.tolist()]
        y, ylen = _targets(tb)
        out = model(xb)
        B, L = xb.shape[0], out["L"]
        loss = ctc_sum(out["logp"].transpose(0, 1), y, out["lengths"], ylen) / B
        loss = loss + o["aux_weight"] * ctc_sum(out["aux_logp"].transpose(0, 1), y,
                                                torch.full((B,), L, dtype=torch.long), ylen) / B
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        lr_now = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        if ema is not None:
            ema.update_parameters(model)
        run, nrun = run + float(loss.detach()), nrun + 1
        if on_step is not None:
            on_step(step, net)
        if step % every == 0 or step == max_steps:
            ev = _evaluate(net, Xva, Tva, ctc_sum, costs=False)
            for k, v in (("steps", step), ("val_ctc", ev["loss"]), ("val_cer", ev["cer"]),
                         ("train_loss", run / nrun), ("lr", lr_now)):
                rec[k].append(v)
            run, nrun = 0.0, 0
            fitr = tail_fit(rec["steps"], rec["val_ctc"], "min", min_points=min_pts)
            flat = flat + 1 if step >= min_steps and fitr["improvement"] <= PLATEAU_TOL else 0
            progress(f"step {step}: train {rec['train_loss'][-1]:.3f} val CTC {ev['loss']:.3f} CER {ev['cer']:.3f} "
                     f"kept {ev['kept']:.2f} tail {fitr['improvement']:.3f}")
            if flat >= 2:
                break
    if ema is not None:
        model.load_state_dict(ema.module.state_dict())
    rec["cpu_s"] = time.process_time() - t0
    return rec


def train(ctx) -> None:
    import torch

    p = ctx.params
    o = p["optim"]
    torch.manual_seed(ctx.seed)
    torch.set_num_threads(ctx.threads)
    splits = _load(ctx)
    Xte, Tte = splits["test"]
    model = build(p, ctx.variant, splits["train"][0].shape[2])
    ctc_sum = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    reducer = VARIANTS[ctx.variant]["reducer"]
    if reducer:   # control: what the reducer keeps before training (the aux head at initialisation)
        ctx.metrics.units("kept_fraction_init", _evaluate(model, Xte, Tte, ctc_sum, costs=False)["kept_lines"])
    early = {}

    def on_step(step, net):   # control: the same network after control_step updates (under-trained)
        if step == int(o["control_step"]):
            early.update(_evaluate(net, Xte, Tte, ctc_sum, costs=False))

    lr = lr_for(p, ctx.variant)
    rec = fit(model, splits, p, ctx.seed, lr, ctx.progress, on_step)
    ctx.metrics.curve("val_ctc", rec["steps"], rec["val_ctc"])
    ctx.metrics.curve("val_cer", rec["steps"], rec["val_cer"])
    ctx.metrics.curve("train_loss", rec["steps"], rec["train_loss"])
    ctx.metrics.curve("lr", rec["steps"], rec["lr"])
    ctx.metrics.scalar("lr_peak", lr)
    ctx.metrics.scalar("steps", rec["steps"][-1])
    ctx.metrics.scalar("train_cpu_s", rec["cpu_s"])
    ctx.metrics.scalar("val_ctc_tail_improvement",
                       tail_fit(rec["steps"], rec["val_ctc"], "min")["improvement"])

    ev = _evaluate(model, Xte, Tte, ctc_sum)
    ctx.metrics.units("edits", ev["edits"])                  # per test line: edit distance
    ctx.metrics.units("chars", ev["chars"])                  # per test line: reference length
    ctx.metrics.units("kept_fraction", ev["kept_lines"])     # per test line: positions the mixer sees / L
    ctx.metrics.scalar("cer", ev["cer"])
    ctx.metrics.scalar("test_ctc", ev["loss"])
    ctx.metrics.scalar("sop_per_line", ev["ac"])
    ctx.metrics.scalar("mac_per_line", ev["mac"])
    ctx.metrics.scalar("mixer_mac", ev["mixer_mac"])
    ctx.metrics.scalar("energy_nj", ev["energy_nj"])
    if early:
        ctx.metrics.units("edits_early", early["edits"])
        ctx.metrics.scalar("cer_early", early["cer"])
    if VARIANTS[ctx.variant]["spiking"]:
        for t, s in enumerate(model.coder.sigmas().detach().tolist(), 1):
            ctx.metrics.scalar(f"inkcoder_sigma_{t}", s)
        for t, d in enumerate(model.coder.details().detach().tolist(), 1):
            ctx.metrics.scalar(f"inkcoder_detail_{t}", d)
    if reducer:
        drop = _evaluate(model, Xte, Tte, ctc_sum, reduce="drop", costs=False)
        ctx.metrics.units("edits_drop", drop["edits"])
        ctx.metrics.scalar("cer_drop", drop["cer"])
        ctx.metrics.scalar("energy_keepall", _evaluate(model, Xte, Tte, ctc_sum, reduce="off")["energy_nj"])
        taus = list(p["tau_sweep"])
        sweep = [_evaluate(model, Xte, Tte, ctc_sum, tau=t, costs=False) for t in taus]
        ctx.metrics.curve("cer_vs_tau", taus, [s["cer"] for s in sweep])
        ctx.metrics.curve("kept_vs_tau", taus, [s["kept"] for s in sweep])
    # examples for the figure: decoded strings (and kept positions) of the first test lines
    n_ex = p.get("n_examples", 4)
    with torch.no_grad():
        model.eval()
        out = model(Xte[:n_ex])
    for k in range(n_ex):
        pred = ev["preds"][k]
        ctx.metrics.curve(f"example_pred_{k}", list(range(len(pred))), [c - 1 for c in pred])
        if reducer:
            ctx.metrics.curve(f"example_kept_{k}", list(range(out["L"])), out["keep"][k].float().tolist())
    ctx.progress(f"test CER {ev['cer']:.4f} kept {ev['kept']:.3f} energy {ev['energy_nj']:.1f} nJ/line "
                 f"({rec['steps'][-1]} steps, lr {lr:g}, {rec['cpu_s']:.1f} s CPU)")


# ------------------------------------------------------------------ figures
def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    pl = plt()
    variants = [v for v in VARIANTS if v in set(table.variant)]
    # 1. examples: line image, decoded string of every variant underneath, kept positions shaded
    seed0 = int(sorted(table.seed.unique())[0])
    n_ex = int(params.get("n_examples", 4))
    try:
        X, texts = _splits(params, seed0)["test"]
    except FileNotFoundError:
        X = None
    if X is not None:
        fig, axes = pl.subplots(n_ex, 1, figsize=(7, 1.5 * n_ex))
        sub = table[table.seed == seed0]
        for k, ax in enumerate(np.atleast_1d(axes)):
            ax.imshow(X[k], cmap="gray_r", aspect="auto", extent=(0, X.shape[2], X.shape[1], 0))
            kept = sub[(sub.metric == f"example_kept_{k}") & (sub.variant == "spike_htr")].sort_values("x")
            stride = X.shape[2] / max(1, len(kept))   # pixel columns per encoder position
            for w, keep in zip(kept.x, kept.value):
                if keep > 0.5:
                    ax.axvspan(stride * w, stride * (w + 1), color="tab:orange", alpha=0.18, lw=0)
            lines = [f"truth: {''.join(params['alphabet'][int(c)] for c in texts[k])}"]
            for v in variants:
                pr = sub[(sub.metric == f"example_pred_{k}") & (sub.variant == v)].sort_values("x")
                lines.append(f"{v}: {''.join(params['alphabet'][int(c)] for c in pr.value)}")
            ax.set_xlabel("   |   ".join(lines), fontsize=7)
            ax.set_yticks([])
            ax.tick_params(labelsize=6)
        fig.suptitle("What does each model read? (seed %d test lines; orange = positions the reducer keeps)"
                     % seed0, fontsize=9)
        save_figure(fig, plots_dir / "examples.png", dpi=110)
    # 2. CER vs kept fraction: the threshold sweep of spike_htr, and each variant's operating point
    fig, ax = pl.subplots(figsize=(6, 4.2))
    cer_t = table[(table.metric == "cer_vs_tau") & (table.variant == "spike_htr")]
    kep_t = table[(table.metric == "kept_vs_tau") & (table.variant == "spike_htr")]
    if not cer_t.empty:
        mc = cer_t.groupby("x").value.agg(["mean", "std"]).fillna(0)
        mk = kep_t.groupby("x").value.mean()
        ax.errorbar(100 * mk.values, 100 * mc["mean"].values, yerr=100 * mc["std"].values, marker=".",
                    color="k", label="spike_htr, test-time threshold τ swept (mean ± std over seeds)")
        for tau, kx, cy in zip(mc.index, mk.values, mc["mean"].values):
            ax.annotate(f"τ={tau:g}", (100 * kx, 100 * cy), fontsize=6, xytext=(3, 3), textcoords="offset points")
    for v, mk_ in zip(variants, "osD"):
        cer = table[(table.metric == "cer") & (table.variant == v)].set_index("seed").value
        kept = table[(table.metric == "kept_fraction") & (table.variant == v)].set_index("seed").value
        ax.scatter(100 * kept.loc[cer.index], 100 * cer, marker=mk_, label=f"{v} (" + ("τ = %g, " % params["model"]["tau"] if v == "spike_htr" else "") + "per seed)")
    ax.set_xlabel("width positions the mixer processes (% of L)")
    ax.set_ylabel("test CER (%)")
    ax.set_title("How much of the line can the reducer drop before CER rises?", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, plots_dir / "cer_vs_kept.png", dpi=110)
    # 3. training curves
    curve_plot(table, "val_ctc", plots_dir / "curve_val_ctc.png", xlabel="training step (constant rate; each run stops at its plateau)",
               ylabel="validation CTC loss (nats per line)", title="Have all models finished training?",
               logy=True, variants=variants)
    curve_plot(table, "val_cer", plots_dir / "curve_val_cer.png", xlabel="training step",
               ylabel="validation CER (fraction of characters)", title="Validation CER during training",
               logy=True, variants=variants)
    # 4. what each model reads and what it costs: test CER (with the controls) and energy per line
    fig, (ax1, ax2) = pl.subplots(1, 2, figsize=(10, 3.4))
    rows = [(v, "cer", v) for v in variants] + [("spike_htr", "cer_early", "spike_htr, early (control)"),
                                                ("spike_htr", "cer_drop", "spike_htr, runs dropped (control)")]
    labels = []
    for v, metric, label in rows:
        s_ = table[(table.metric == metric) & (table.variant == v)].value
        if s_.empty:
            continue
        ax1.barh(len(labels), 100 * s_.mean(), xerr=100 * s_.std() if len(s_) > 1 else 0,
                 color="tab:gray" if "control" in label else "tab:blue", alpha=0.7)
        labels.append(label)
    ax1.set_yticks(range(len(labels)), labels, fontsize=7)
    ax1.set_xlabel("test CER (%), mean ± std over seeds")
    ax1.set_title("How well does each model read?", fontsize=9)
    labels = []
    for v, metric, label in [(v, "energy_nj", v) for v in variants] + [("spike_htr", "energy_keepall",
                                                                        "spike_htr, reducer off (control)")]:
        s_ = table[(table.metric == metric) & (table.variant == v)].value
        if s_.empty:
            continue
        ax2.barh(len(labels), s_.mean(), xerr=s_.std() if len(s_) > 1 else 0,
                 color="tab:gray" if "control" in label else "tab:blue", alpha=0.7)
        labels.append(label)
    ax2.set_yticks(range(len(labels)), labels, fontsize=7)
    ax2.set_xlabel("energy per line (nJ; 0.9 pJ/AC, 4.6 pJ/MAC)")
    ax2.set_title("What does one line cost to recognise?", fontsize=9)
    save_figure(fig, plots_dir / "energy.png", dpi=110)
