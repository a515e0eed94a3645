"""Spike-HTR (hybrid spiking handwritten text recognition) in miniature.

Stages and units:

* ``train_shared`` (per seed): render train / val / test digit lines (``data.py``) -> lines.npz.
* ``train`` (per variant x seed): build the variant's recogniser (``model.py``), train it with
  CTC (``torch.nn.CTCLoss``, blank = 0) for the same number of Adam steps, batch and schedule in
  every variant; loss = CTC(head) + λ_aux CTC(aux head on the encoder features), the auxiliary
  term in EVERY variant (like for like; only ``spike_htr`` uses it to reduce the length).
  Recorded: validation CTC loss (nats per line) and validation CER per evaluation step; test CER
  (greedy decoding, no LM), fraction of width positions the mixer sees, AC / MAC counts and
  energy (nJ per line), and, for ``spike_htr``, CER and kept fraction over a sweep of the
  reducer's threshold τ at test time.

Variants:

* ``spike_htr`` (method): InkCoder stream (T = 2) -> LIF CNN -> CTC-guided length reducer -> BiLSTM -> CTC;
* ``snn_full`` (baseline): the same without the reducer (the mixer sees all L positions);
* ``ann_crnn`` (baseline): the same CNN with ReLU on the static image (one step), no reducer.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import data as D
from reprozoo.figures import save_figure

GENERIC_CURVES = {}   # plot() draws every figure
VARIANTS = {"spike_htr": dict(spiking=True, reducer=True),
            "snn_full": dict(spiking=True, reducer=False),
            "ann_crnn": dict(spiking=False, reducer=False)}


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


def _evaluate(model, X, texts, ctc_loss, tau=None, batch=256):
    """Val/test pass: CTC loss (nats per line), CER, kept fraction, costs per line."""
    import torch

    from .ctc import cer, greedy_decode

    model.eval()
    preds, loss, kept, costs = [], 0.0, [], []
    with torch.no_grad():
        for i in range(0, len(X), batch):
            xb, tb = X[i:i + batch], texts[i:i + batch]
            out = model(xb, tau)
            y, ylen = _targets(tb)
            loss += float(ctc_loss(out["logp"].transpose(0, 1), y, out["lengths"], ylen))
            preds += greedy_decode(out["logp"], out["lengths"])
            kept.append(out["lengths"].float() / out["L"])
            c = model.costs(xb, out)
            costs.append({k: v * len(xb) for k, v in c.items()})
    model.train()
    n = len(X)
    tot = {k: sum(c[k] for c in costs) / n for k in costs[0]}
    return {"loss": loss / n, "cer": cer(preds, [list(map(int, t)) for t in texts]),
            "kept": float(torch.cat(kept).mean()), "preds": preds, **tot}


def train(ctx) -> None:
    import torch

    from .model import Recognizer

    p = ctx.params
    m, o = p["model"], p["optim"]
    torch.manual_seed(ctx.seed)
    torch.set_num_threads(ctx.threads)
    splits = _load(ctx)
    Xtr, Ttr = splits["train"]
    Xva, Tva = splits["val"]
    Xte, Tte = splits["test"]
    model = Recognizer(Xtr.shape[2], len(p["alphabet"]), tuple(m["channels"]), m["d_model"], m["hidden"],
                       T=m["T"], sigma_max=m["sigma_max"], beta=m["beta"], threshold=m["threshold"],
                       tau=m["tau"], pools=m.get("pools", ((2, 2), (2, 1), (1, 1))),
                       readout=m.get("readout", "spikes"), **VARIANTS[ctx.variant])
    ctc_sum = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    opt = torch.optim.Adam(model.parameters(), lr=o["lr"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, o["lr"], total_steps=o["steps"], pct_start=0.15)
    gen = torch.Generator().manual_seed(ctx.seed)
    steps_x, val_loss, val_cer, tr_loss = [], [], [], []
    t0 = time.process_time()
    perm, pos = torch.randperm(len(Xtr), generator=gen), 0
    run = 0.0
    for step in range(1, o["steps"] + 1):
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
        opt.step()
        sched.step()
        run += float(loss.detach())
        if step % o["eval_every"] == 0 or step == o["steps"]:
            ev = _evaluate(model, Xva, Tva, ctc_sum)
            steps_x.append(step)
            val_loss.append(ev["loss"])
            val_cer.append(ev["cer"])
            tr_loss.append(run / o["eval_every"])
            run = 0.0
            ctx.progress(f"step {step}: train {tr_loss[-1]:.3f} val CTC {ev['loss']:.3f} CER {ev['cer']:.3f} "
                         f"kept {ev['kept']:.2f}")
    train_cpu = time.process_time() - t0
    ctx.metrics.curve("val_ctc", steps_x, val_loss)
    ctx.metrics.curve("val_cer", steps_x, val_cer)
    ctx.metrics.curve("train_loss", steps_x, tr_loss)
    n_tail = max(2, len(val_loss) // 4)            # slope of the last quarter of the val curve
    slope = np.polyfit(steps_x[-n_tail:], val_loss[-n_tail:], 1)[0]
    ctx.metrics.scalar("val_ctc_final_slope_per_100", 100 * slope)

    ev = _evaluate(model, Xte, Tte, ctc_sum)
    for k in ("cer", "kept", "ac", "mac", "mixer_mac", "energy_nj"):
        ctx.metrics.scalar({"kept": "kept_fraction", "cer": "cer", "ac": "sop_per_line",
                            "mac": "mac_per_line"}.get(k, k), ev[k])
    ctx.metrics.scalar("test_ctc", ev["loss"])
    ctx.metrics.scalar("train_cpu_s", train_cpu)
    if ctx.variant == "spike_htr":
        taus = list(p["tau_sweep"])
        sweep = [_evaluate(model, Xte, Tte, ctc_sum, tau=t) for t in taus]
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
        if ctx.variant == "spike_htr":
            ctx.metrics.curve(f"example_kept_{k}", list(range(out["L"])), out["keep"][k].float().tolist())
    ctx.progress(f"test CER {ev['cer']:.4f} kept {ev['kept']:.3f} energy {ev['energy_nj']:.1f} nJ/line "
                 f"({train_cpu:.1f} s CPU)")


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
    curve_plot(table, "val_ctc", plots_dir / "curve_val_ctc.png", xlabel="training step (Adam, same for all)",
               ylabel="validation CTC loss (nats per line)", title="Have all models finished training?",
               logy=True, variants=variants)
    curve_plot(table, "val_cer", plots_dir / "curve_val_cer.png", xlabel="training step",
               ylabel="validation CER (fraction of characters)", title="Validation CER during training",
               logy=True, variants=variants)
    # 4. energy proxy
    fig, ax = pl.subplots(figsize=(6, 3.2))
    for i, v in enumerate(variants):
        s = table[(table.metric == "energy_nj") & (table.variant == v)].value
        ax.barh(i, s.mean(), xerr=s.std() if len(s) > 1 else 0, color="tab:blue", alpha=0.7)
    ax.set_yticks(range(len(variants)), variants)
    ax.set_xlabel("energy proxy per line (nJ; 0.9 pJ/AC + 4.6 pJ/MAC)")
    ax.set_title("What does one line cost to recognise?", fontsize=9)
    save_figure(fig, plots_dir / "energy.png", dpi=110)
