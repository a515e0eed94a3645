"""Spike-HTR (Spiking Neural Transformer for handwritten text recognition) in miniature.

Stages and units:

* ``train_shared`` (per seed): render train / val / test digit lines (``data.py``) -> lines.npz.
* ``train`` (per variant x seed): build the variant's recogniser (``model.py``) and train it with
  CTC (``torch.nn.CTCLoss``, blank = 0) by the shared rule ``blocks.fitting.fit_to_plateau``: ONE
  learning-rate grid (``fit.lr_grid``, the same for every variant) piloted on the validation
  lines, the best rate continued at a constant rate until the validation curve passes the
  platform's plateau test. Since round 12 the rate of each variant is fixed in the config
  (``fit.lr``), chosen once by that same grid pilot on one seed (README); the run at the fixed
  rate is the run the pilot continued (same initial weights and batches), without the pilots. The validation curve is the validation CER (corpus CER of greedy
  decoding, what the claims read) of the moving average of the weights (``fit.ema``); the
  checkpoint kept and tested is the averaged network with the best validation CER. The
  validation CTC loss is recorded beside it (diagnostic: it rises late from over-confidence while
  CER still falls). Loss = CTC(head) + λ_aux CTC(aux head on the encoder features), the auxiliary
  term in EVERY variant (like for like; only the reducer variants use it to reduce the length).

Recorded on the test lines (greedy decoding, no LM), per line: edit distance and reference
length (units, so claims read corpus CER = Σ edits / Σ chars with a line-level interval), the
fraction of width positions the mixer sees, the former rule's bound (2n + 1)/L and CTC's floor
(n + repeats)/L, the fraction
a weak ink-column reducer keeps; AC / MAC counts, energy (nJ per line) and the mixer's part.
Controls, measured in the same job: the test edits of the same network after ``control_step``
steps (an under-trained SNN), and for the reducer variants the test edits with the
confident-blank runs dropped instead of merged, the test edits and energy with each line pooled
uniformly to the reducer's length (no CTC guidance), the energy with the reducer keeping every
position, the kept fraction and CER of the former rule (one position per blank run; ablation),
and a sweep of the reducer's threshold τ at test time.

Variants:

* ``spike_htr`` (method): learned InkCoder stream (T = 2) -> LIF CNN -> CTC-aware length reducer
  -> spiking transformer (spiking self-attention; 1 block at smoke) -> CTC;
* ``snn_full`` (baseline): the same without the reducer (the mixer sees all L positions);
* ``ann`` (baseline): the ANN counterpart: the same CNN with ReLU on the static image (one step),
  the same transformer with softmax attention and ReLU, no reducer;
* ``fixed_inkcoder``, ``direct`` (ablations, not in spec.yaml's variants for the smoke budget):
  ``spike_htr`` with the fixed blur pyramid, or with the same image at both steps.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...blocks.rate_table import fit_with_table_rate, grid_edge
from ...claims import tail_fit
from . import data as D
from reprozoo.figures import save_figure

GENERIC_CURVES = {}   # plot() draws every figure
UNTRAINED = 2.0       # validation score recorded for the untrained network (step 0): never the best
VARIANTS = {"spike_htr": dict(spiking=True, reducer=True, coder="learned"),
            "snn_full": dict(spiking=True, reducer=False, coder="learned"),
            "ann": dict(spiking=False, reducer=False),
            "fixed_inkcoder": dict(spiking=True, reducer=True, coder="fixed"),
            "direct": dict(spiking=True, reducer=True, coder="direct")}


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


def encode_batches(model, X, batch=500) -> list:
    """The encoder's output (``model.encode``, eval mode) for each batch of ``_evaluate``: the test
    passes of one trained network (reducer modes, τ sweep) differ only after the encoder, so they
    share one encoder pass (round 13, budget; the same numbers, tested)."""
    import torch

    was = model.training
    model.eval()
    with torch.no_grad():
        encs = [model.encode(X[i:i + batch]) for i in range(0, len(X), batch)]
    model.train(was)
    return encs


def _evaluate(model, X, texts, ctc_loss, tau=None, reduce="merge", costs=True, batch=500, encs=None):
    """Val/test pass: CTC loss (nats per line), corpus CER, per-line edits / reference lengths /
    kept fractions, costs per line. ``encs``: the encoder's output per batch (``encode_batches``
    with the same ``batch``), else computed here."""
    import torch

    from .ctc import edit_distance, greedy_decode

    was = model.training
    model.eval()
    preds, losses, kept, cost_rows = [], [], [], []
    with torch.no_grad():
        for j, i in enumerate(range(0, len(X), batch)):
            xb, tb = X[i:i + batch], texts[i:i + batch]
            enc = None if encs is None else encs[j]
            if costs:
                c = model.costs(xb, tau, reduce, enc=enc)
                out = c.pop("out")
                cost_rows.append({k: v * len(xb) for k, v in c.items()})
            else:
                out = model(xb, tau, reduce, enc=enc)
            y, ylen = _targets(tb)
            losses.append(float(ctc_loss(out["logp"].transpose(0, 1), y, out["lengths"], ylen)))
            preds += greedy_decode(out["logp"], out["lengths"])
            kept.append(out["lengths"].float() / out["L"])
    model.train(was)
    n = len(X)
    refs = [list(map(int, t)) for t in texts]
    edits = [edit_distance(p, r) for p, r in zip(preds, refs)]
    chars = [len(r) for r in refs]
    tot = {k: sum(c[k] for c in cost_rows) / n for k in cost_rows[0]} if costs else {}
    kept = torch.cat(kept)
    return {"loss": sum(losses) / n, "batch_losses": losses, "cer": sum(edits) / max(1, sum(chars)), "edits": edits, "chars": chars,
            "kept_lines": kept.tolist(), "kept": float(kept.mean()), "preds": preds, **tot}


def build(params: dict, variant: str, height: int):
    from .model import Recognizer

    m = params["model"]
    return Recognizer(height, len(params["alphabet"]), tuple(m["channels"]), m["d_model"], heads=m["heads"],
                      mlp=m["mlp"], blocks=m["blocks"], T=m["T"], sigma_max=m["sigma_max"], beta=m["beta"],
                      threshold=m["threshold"], tau=m["tau"], pools=m.get("pools", ((2, 2), (2, 1), (1, 1))),
                      readout=m.get("readout", "membrane"), sigma_last=m.get("sigma_last", 0.3),
                      sigma_cap=m.get("sigma_cap", 2.0), **VARIANTS[variant])


def ctc_need(texts) -> list[int]:
    """The fewest input positions CTC can align each target to: n + (adjacent repeats)."""
    return [len(t) + sum(1 for a, b in zip(t[:-1], t[1:]) if a == b) for t in texts]


def ctc_feasible(lengths, texts) -> list[bool]:
    """Can CTC align each target to its input length? It needs n + (adjacent repeats) positions; a
    line that cannot is a loss of +inf, which ``zero_infinity=True`` silently zeroes (counted)."""
    return [int(n) >= k for n, k in zip(lengths, ctc_need(texts))]


class Averaged:
    """Builds the module that ``fit_to_plateau`` trains: the network (``net``) and the exponential
    moving average of its weights (``ema``, Polyak averaging, time constant 1/(1 - decay) steps;
    batch-norm statistics copied), the latter frozen (no gradient, so Adam skips it). The module's
    state holds both, so the best-validation state that ``fit_to_plateau`` keeps is the best
    AVERAGED network."""

    @staticmethod
    def wrap(net, decay: float):
        import copy

        from torch import nn

        class _Avg(nn.Module):
            def __init__(self):
                super().__init__()
                self.net, self.ema = net, copy.deepcopy(net)
                for p in self.ema.parameters():
                    p.requires_grad_(False)
                self.decay, self.n = decay, 0

            def update(self):
                import torch

                with torch.no_grad():
                    for pe, p in zip(self.ema.parameters(), self.net.parameters()):
                        pe.lerp_(p, 1.0 if self.n == 0 else 1.0 - self.decay)
                    for be, b in zip(self.ema.buffers(), self.net.buffers()):
                        be.copy_(b)
                self.n += 1

        return _Avg()


def train_model(params: dict, variant: str, splits: dict, seed: int, progress=print, control_step=None):
    """Train one variant by ``fit_to_plateau`` (module doc). Returns (averaged network with the
    best validation CER, fit record with ``val_ctc`` added, the averaged network's state after
    ``control_step`` updates of the chosen run or None, the number of training lines whose CTC
    loss was infinite and zeroed)."""
    import copy

    import torch

    from ...blocks.fitting import fit_to_plateau

    f = params["fit"]
    Xtr, Ttr = splits["train"]
    Xva, Tva = splits["val"]
    height = Xtr.shape[2]
    ctc_sum = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    val_ctc, val_cer, val_half, early, zeroed = {}, {}, {}, {}, {}

    def build_fn(gen):
        torch.manual_seed(int(gen.initial_seed()))
        return Averaged.wrap(build(params, variant, height), float(f["ema"]))

    def train_loss(model, gen):
        model.update()                      # average in the previous update (the first call copies)
        if control_step is not None and model.n == int(control_step) + 1:
            early[id(model)] = copy.deepcopy(model.ema.state_dict())
        idx = torch.randint(len(Xtr), (int(f["batch"]),), generator=gen)
        xb, tb = Xtr[idx], [Ttr[i] for i in idx.tolist()]
        y, ylen = _targets(tb)
        out = model.net(xb)
        B, L = xb.shape[0], out["L"]
        zeroed[id(model)] = zeroed.get(id(model), 0) + sum(not ok for ok in ctc_feasible(out["lengths"].tolist(), tb))
        loss = ctc_sum(out["logp"].transpose(0, 1), y, out["lengths"], ylen) / B
        return loss + float(f["aux_weight"]) * ctc_sum(out["aux_logp"].transpose(0, 1), y,
                                                       torch.full((B,), L, dtype=torch.long), ylen) / B

    n_chars = max(1, sum(len(t) for t in Tva))
    half = len(Tva) // 2
    n_half = max(1, sum(len(t) for t in Tva[:half]))
    tie = float(f.get("ctc_tiebreak", 0.0))

    def val_loss(model):
        # two batches of half the validation lines: the first half's score is recorded beside the
        # full one (val_score_half, a diagnostic of the validation noise at half the lines)
        ev = _evaluate(model.ema, Xva, Tva, ctc_sum, costs=False, batch=max(1, half))
        val_ctc.setdefault(id(model), []).append(ev["loss"])
        val_cer.setdefault(id(model), []).append(ev["cer"])
        val_half.setdefault(id(model), []).append(UNTRAINED if model.n == 0 else
                                                  sum(ev["edits"][:half]) / n_half + tie * ev["batch_losses"][0] / n_half)
        if model.n == 0:      # the untrained network is never a candidate: its random outputs can read
            return UNTRAINED  # below the CER 1 of the CTC blank plateau and would win every pilot
        # validation CER, ties broken by the CTC loss (nats per character x ctc_tiebreak): on the
        # CTC blank plateau every rate reads CER 1 and the pilot would otherwise pick the first
        return ev["cer"] + tie * ev["loss"] * len(Tva) / n_chars

    # `fit.lr`: the rate of each variant chosen once on validation (blocks.rate_table); a variant it does
    # not name pilots the grid. The edge is read against the grid the rate was chosen from either way.
    fv, _ = fit_with_table_rate(f, f.get("lr"), variant, required=False, where="fit.lr")
    model, rec = fit_to_plateau(build_fn, train_loss, val_loss, fv, seed, label=variant, progress=progress)
    rec["lr_edge"] = grid_edge(rec["lr"], f["lr_grid"])
    rec["val_ctc"], rec["val_cer"], rec["val_half"] = val_ctc[id(model)], val_cer[id(model)], val_half[id(model)]
    return model.ema, rec, early.get(id(model)), zeroed.get(id(model), 0)


def train(ctx) -> None:
    import torch

    from ...blocks.fitting import log_fit
    from .model import ink_reduce_lengths

    p = ctx.params
    f = p["fit"]
    torch.set_num_threads(ctx.threads)
    splits = _load(ctx)
    Xte, Tte = splits["test"]
    ctc_sum = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    reducer = VARIANTS[ctx.variant]["reducer"]
    t0 = time.process_time()
    model, rec, early_state, zeroed = train_model(p, ctx.variant, splits, ctx.seed, ctx.progress,
                                                  f.get("control_step"))
    log_fit(ctx.metrics, "score", rec)                       # curves val_score, lr_score (the gate's)
    ctx.metrics.curve("val_cer", rec["steps"], rec["val_cer"])
    ctx.metrics.curve("val_ctc", rec["steps"], rec["val_ctc"])
    ctx.metrics.curve("val_score_half", rec["steps"], rec["val_half"])   # diagnostic: half the lines
    for name, curve in (("score", rec["vals"]), ("score_half", rec["val_half"])):
        ctx.metrics.scalar(f"val_{name}_tail_improvement", tail_fit(rec["steps"], curve, "min")["improvement"])
    for lr, v in rec["pilot_best"].items():
        ctx.metrics.scalar(f"pilot_val_score_lr{lr:g}", v)
    # the rate's place in the grid it was chosen from: +1 top, -1 bottom, 0 bracketed
    ctx.metrics.scalar("lr_grid_edge", {"top": 1, "bottom": -1}.get(rec["lr_edge"], 0))
    ctx.metrics.scalar("val_cer_tail_improvement", tail_fit(rec["steps"], rec["val_cer"], "min")["improvement"])
    ctx.metrics.scalar("train_cpu_s", time.process_time() - t0)
    ctx.metrics.scalar("lines_zeroed_train", zeroed)        # CTC infeasible (input shorter than needed)
    ctx.metrics.scalar("val_ctc_tail_improvement", tail_fit(rec["steps"], rec["val_ctc"], "min")["improvement"])

    # the reducer variants test one trained network six times (modes, τ sweep): one encoder pass
    encs = encode_batches(model, Xte) if reducer else None
    ev = _evaluate(model, Xte, Tte, ctc_sum, encs=encs)
    L = int(Xte.shape[3]) // model.stride
    ctx.metrics.units("edits", ev["edits"])                  # per test line: edit distance
    ctx.metrics.units("chars", ev["chars"])                  # per test line: reference length
    ctx.metrics.units("kept_fraction", ev["kept_lines"])     # per test line: positions the mixer sees / L
    ctx.metrics.units("kept_bound", [(2 * n + 1) / L for n in ev["chars"]])   # the former rule's floor
    ctx.metrics.units("kept_floor_ctc", [k / L for k in ctc_need(Tte)])      # what CTC needs: n + repeats
    ink = ink_reduce_lengths(Xte, model.stride, float(p.get("ink_threshold", 0.5))).float() / L
    ctx.metrics.units("kept_fraction_ink", ink.tolist())     # the weak ink-column reducer
    ctx.metrics.scalar("cer", ev["cer"])
    ctx.metrics.scalar("test_ctc", ev["loss"])
    ctx.metrics.scalar("n_test_chars", sum(ev["chars"]))
    ctx.metrics.scalar("sop_per_line", ev["ac"])
    ctx.metrics.scalar("mac_per_line", ev["mac"])
    ctx.metrics.scalar("mixer_ac", ev["mixer_ac"])
    ctx.metrics.scalar("mixer_mac", ev["mixer_mac"])
    ctx.metrics.scalar("mixer_nj", ev["mixer_nj"])
    ctx.metrics.scalar("mixer_energy_share", ev["mixer_nj"] / ev["energy_nj"])
    ctx.metrics.scalar("energy_nj", ev["energy_nj"])
    # lines the reducer leaves too short for CTC (it merged away a position the aux head missed):
    # per line (units, so the page can split reducer_cer_margin into these lines and the rest),
    # their count, and the test edits made on them
    infeasible = [float(not ok) for ok in ctc_feasible([round(k * L) for k in ev["kept_lines"]], Tte)]
    ctx.metrics.units("infeasible_test", infeasible)
    ctx.metrics.scalar("lines_infeasible_test", sum(infeasible))
    ctx.metrics.scalar("edits_on_infeasible", sum(e for e, b in zip(ev["edits"], infeasible) if b))
    if early_state is not None and reducer:      # the under-trained control of close_to_ann
        net = build(p, ctx.variant, Xte.shape[2])
        net.load_state_dict(early_state)
        early = _evaluate(net, Xte, Tte, ctc_sum, costs=False)
        ctx.metrics.units("edits_early", early["edits"])
        ctx.metrics.scalar("cer_early", early["cer"])
    if VARIANTS[ctx.variant]["spiking"] and model.coder is not None:
        for t, s in enumerate(model.coder.sigmas().detach().tolist(), 1):
            ctx.metrics.scalar(f"inkcoder_sigma_{t}", s)
        for t, d in enumerate(model.coder.details().detach().tolist(), 1):
            ctx.metrics.scalar(f"inkcoder_detail_{t}", d)
    if reducer:
        drop = _evaluate(model, Xte, Tte, ctc_sum, reduce="drop", costs=False, encs=encs)
        ctx.metrics.units("edits_drop", drop["edits"])
        ctx.metrics.scalar("cer_drop", drop["cer"])
        # the control of reducer_cer_margin: the same trained network pooling each line uniformly
        # to the length the reducer gives it (no CTC guidance), energy through the same code path
        uni = _evaluate(model, Xte, Tte, ctc_sum, reduce="uniform", encs=encs)
        ctx.metrics.units("edits_uniform", uni["edits"])
        ctx.metrics.scalar("cer_uniform", uni["cer"])
        ctx.metrics.scalar("energy_uniform", uni["energy_nj"])
        ctx.metrics.scalar("kept_uniform", uni["kept"])
        # ablation at test time: the former rule (one position per blank run, also between
        # different characters) on the same trained network
        runs = _evaluate(model, Xte, Tte, ctc_sum, reduce="runs", costs=False, encs=encs)
        ctx.metrics.units("kept_fraction_runs", runs["kept_lines"])
        ctx.metrics.scalar("cer_runs", runs["cer"])
        off = _evaluate(model, Xte, Tte, ctc_sum, reduce="off", encs=encs)
        ctx.metrics.scalar("energy_keepall", off["energy_nj"])
        ctx.metrics.scalar("cer_keepall", off["cer"])
        taus = sorted(set(p["tau_sweep"]) | {p["model"]["tau"]})
        sweep = [ev if t == p["model"]["tau"] else _evaluate(model, Xte, Tte, ctc_sum, tau=t, costs=False, encs=encs)
                 for t in taus]
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
                 f"({rec['stop']} steps, lr {rec['lr']:g}, {time.process_time() - t0:.1f} s CPU)")


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
                                                ("spike_htr", "cer_drop", "spike_htr, runs dropped (control)"),
                                                ("spike_htr", "cer_uniform", "spike_htr, uniform pooling (control)"),
                                                ("spike_htr", "cer_runs", "spike_htr, one position per run (ablation)")]
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
    for v, metric, label in [(v, "energy_nj", v) for v in variants] + [
            ("spike_htr", "energy_keepall", "spike_htr, reducer off (control)"),
            ("spike_htr", "energy_uniform", "spike_htr, uniform pooling (control)")]:
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
