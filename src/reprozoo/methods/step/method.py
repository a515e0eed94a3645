"""Step (selective token-guided expert pruning) against frequency and REAP pruning, in miniature.

Stages and units:

* ``train_shared`` (per seed): a Qwen3-MoE language model (transformers' own modelling code,
  random initialisation; ``moe.py``) trained from scratch on the bytes of the Python standard
  library's source (``corpus.py``; train files disjoint from held-out files) by the platform's
  shared rule (``blocks.fitting.fit_to_plateau``: AdamW, a learning-rate grid piloted on the
  validation loss, the best rate continued at a constant rate until the validation curve is flat,
  best-validation weights kept; linear warm-up and gradient clipping from the shared rule). The
  objective includes Switch Transformer's router load-balancing loss, per layer (coefficient
  ``model.aux_loss``; ``moe.training_loss``). Validation text: the first half of the held-out stream; every
  perplexity of the table uses the second half. At ``paper`` scale the pretrained Qwen3-30B-A3B is
  loaded instead (no training), through the same code path.
* ``train`` (per variant x seed): score every expert on the same calibration batches (from the
  training files) with the variant's rule, prune a fraction s in {25, 50, 75} % of the experts of
  every layer, optionally re-fit the kept experts (knowledge preservation), and measure IN THE SAME
  CELL: held-out byte perplexity of the dense and every pruned model; weight memory (bytes of all
  parameters; expert parameters alone); forward throughput in tokens / s of the dense and the 50 %
  model, interleaved repeats, median; pruning wall time (scoring + removal + re-fit, s); the
  router's balance (``low_half_slot_share``: the share of routed calibration slots the least-used
  half of the experts carry; the claims' precondition) and the share of slots each rule removed;
  and the shared model's validation curve (``val_moe``, ``lr_moe``) for the convergence gate.

Variants (identical model, calibration tokens, held-out tokens and sparsities; ``pruning.py``):

* ``step`` (method): token-selective (highest-loss tokens), loss-aware (first-order loss change of
  each expert's removal, with re-routing) scores, then the knowledge-preserving re-fit;
* ``step_nokp`` (ablation): Step's scores without the re-fit: what the scoring alone does;
* ``reap`` (baseline): router weight x activation norm (REAP), no re-fit;
* ``reap_refit`` (baseline): REAP's scores followed by the same re-fit as Step, the comparator of
  ``step_beats_reap_same_refit`` (it was the control of the claims on Step with its re-fit until the
  stop-51 cold review, which replaced it by ``random_refit``: it has an expert choice of its own);
* ``frequency`` (baseline): how often the router selects each expert, no re-fit;
* ``random`` (control): the same number of experts removed per layer at random (seeded by the
  seed and the calibration draw), no re-fit: the control of the claims on the scoring rules alone;
* ``random_refit`` (control): the same random removals + the same re-fit: the re-fit with no expert
  choice, the control of the claims on Step with its re-fit (stop-51 cold review);
* ``step_alltok`` (ablation): Step's rule from every token's loss (``token_frac`` 1.0), no re-fit:
  the token-agnostic reading that selective guidance must beat;
* ``step_randtok`` (control): Step's rule from a random half of the tokens (as many as Step selects,
  none chosen by their loss), no re-fit.

Calibration: every variant repeats scoring, removal, re-fit and evaluation at 50 % sparsity on
``calibration.draws`` independent calibration draws and records the mean per-window loss and
accuracy over the draws. ``train_shared`` also measures, once per seed, the held-out loss of
removing each expert alone (``removal.json``); ``score_rho`` ranks each rule's scores against it.

Held-out test units: every perplexity is exp of a mean loss over equal-length test windows; the
per-window losses (``nll_dense``, ``nll50`` (mean over the calibration draws), nats per byte, the
same windows in the same order for every variant of a seed) are recorded as units, so the claims (on log-perplexity differences)
take unit-level intervals.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from . import corpus
from reprozoo.figures import save_figure

VARIANTS = {  # variant -> scoring rule, knowledge-preserving re-fit, and (Step's rule only) token selection
    "step": {"rule": "step", "refit": True},
    "step_nokp": {"rule": "step", "refit": False},
    "step_alltok": {"rule": "step", "refit": False, "token_frac": 1.0},
    "step_randtok": {"rule": "step", "refit": False, "select": "random"},
    "reap": {"rule": "reap", "refit": False},
    "reap_refit": {"rule": "reap", "refit": True},
    "frequency": {"rule": "frequency", "refit": False},
    "random": {"rule": "random", "refit": False},
    "random_refit": {"rule": "random", "refit": True},
}
GENERIC_CURVES = ["val_moe"]


# --- data ----------------------------------------------------------------------------------------

def token_streams(p: dict):
    """(train, heldout) token id streams: bytes at miniature scale; the model's tokenizer at paper scale."""
    train, held = corpus.byte_split(p["data"].get("max_files"), p["data"]["heldout_every"], p["data"].get("max_bytes"))
    if p["model"].get("pretrained"):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(p["model"]["pretrained"])
        enc = lambda b: np.asarray(tok(b.tobytes().decode("utf-8", "replace"))["input_ids"], np.int64)
        return enc(train), enc(held)
    return train, held


def as_batches(ids: np.ndarray, batch: int, device: str) -> list:
    import torch

    return [torch.as_tensor(ids[i:i + batch], device=device) for i in range(0, len(ids), batch)]


def val_windows(held: np.ndarray, p: dict) -> np.ndarray:
    """Validation windows (model selection, the plateau test): evenly spaced over the FIRST half of
    the held-out stream."""
    return corpus.windows(held[: len(held) // 2], p["fit"]["val_windows"], p["model"]["seq_len"], None)


def eval_windows(held: np.ndarray, p: dict) -> np.ndarray:
    """Test windows (every perplexity of the table): evenly spaced over the SECOND half, disjoint
    from the validation text."""
    return corpus.windows(held[len(held) // 2:], p["eval"]["windows"], p["model"]["seq_len"], None)


# --- model ---------------------------------------------------------------------------------------

def load_model(p: dict, shared_dir: Path, device: str):
    import torch

    from . import moe

    if p["model"].get("pretrained"):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(p["model"]["pretrained"], dtype=getattr(torch, p.get("dtype", "bfloat16")),
                                                    device_map=device)
    model = moe.build_model(p["model"], 0)
    model.load_state_dict(torch.load(shared_dir / "model.pt", weights_only=True))
    return model.to(device)


def window_nll(model, batches) -> np.ndarray:
    """Held-out loss in nats per token (byte at miniature scale) of every window, averaged over
    its targets: one value per test unit, in window order."""
    return window_scores(model, batches)[0]


def window_scores(model, batches) -> tuple[np.ndarray, np.ndarray]:
    """Per test window: the mean next-token loss (nats, as ``window_nll``) and the share of targets
    whose next token the model ranks first (top-1 accuracy, a second held-out metric that no
    pruning rule's score is defined from)."""
    import torch

    from .pruning import token_nll

    model.eval()
    nll, acc = [], []
    with torch.no_grad():
        for ids in batches:
            logits = model(input_ids=ids).logits
            nll.append(token_nll(logits, ids)[:, :-1].double().mean(1).cpu().numpy())
            acc.append((logits[:, :-1].argmax(-1) == ids[:, 1:]).double().mean(1).cpu().numpy())
    return np.concatenate(nll), np.concatenate(acc)


def single_removal_losses(model, batches) -> list[list[float]]:
    """The true cost of removing each expert alone: per layer, per expert, the held-out loss (nats
    per token, mean over the test windows) of the model with only that expert of that layer removed
    (its tokens re-routed to their next-best expert) minus the dense model's. The reference the
    rules' scores are ranked against (``score_rho``)."""
    from . import moe, pruning

    base = mean_nll(model, batches)
    E = [b.gate.num_experts for b in moe.moe_blocks(model)]
    out = []
    for li, e in enumerate(E):
        row = []
        for j in range(e):
            keep = [list(range(n)) for n in E]
            keep[li] = [i for i in range(e) if i != j]
            row.append(mean_nll(pruning.prune(model, keep), batches) - base)
        out.append(row)
    return out


def mean_nll(model, batches) -> float:
    """Held-out loss in nats per token averaged over every target (windows have equal length, so
    it is the mean of ``window_nll``)."""
    return float(np.mean(window_nll(model, batches)))


def train_shared(ctx) -> None:
    import torch

    from reprozoo.blocks.fitting import fit_to_plateau
    from reprozoo.blocks.rate_table import fit_with_table_rate, stamp_source
    from reprozoo.runtime import seed_everything

    from . import moe

    p = ctx.params
    seed_everything(ctx.seed, ctx.threads)
    if p["model"].get("pretrained"):
        ctx.progress(f"paper scale: pretrained {p['model']['pretrained']}, no training")
        return
    train, held = token_streams(p)
    # the rate: the config's ``lr`` table where it has an entry (chosen once on validation, one seed:
    # configs/smoke.yaml), else the grid piloted in this fit (ci, paper); the record says which
    f, source = fit_with_table_rate(p["fit"], p.get("lr"), "moe", required=False)
    L = p["model"]["seq_len"]
    # validation windows: the first half of the held-out files' windows; the pruning variants
    # evaluate on the other half (``eval_windows``), so the model is not selected on its test text
    val = as_batches(val_windows(held, p), f["batch"], "cpu")
    hi = len(train) - L

    def build(gen):  # the same initial weights for every rate of the grid
        return moe.build_model(p["model"], ctx.seed)

    def train_loss(model, gen):  # next-byte cross-entropy + the router's per-layer balance loss
        starts = torch.randint(0, hi, (f["batch"],), generator=gen).numpy()
        ids = torch.as_tensor(np.stack([train[s:s + L] for s in starts]).astype(np.int64))
        return moe.training_loss(model, ids, p["model"])

    t0 = time.perf_counter()
    model, rec = fit_to_plateau(build, train_loss, lambda m: mean_nll(m, val), f, ctx.seed,
                                label="moe", progress=ctx.progress)
    rec = stamp_source(rec, source)
    train_s = time.perf_counter() - t0
    torch.save(model.state_dict(), ctx.shared_dir / "model.pt")
    (ctx.shared_dir / "train.json").write_text(json.dumps(
        {"train_seconds": train_s, "steps": rec["steps"], "vals": rec["vals"], "lrs": rec["lrs"],
         "lr": rec["lr"], "stop": rec["stop"], "plateau": bool(rec["plateau"]),
         "lr_source": rec["lr_source"], "lr_edge": rec.get("lr_edge"), "drop_step": rec.get("drop_step"), "drop_gain": rec.get("drop_gain"),
         "pilot_best": {str(k): v for k, v in rec["pilot_best"].items()}}))
    # the reference of the mechanism claim: the held-out loss of removing each expert alone, on the
    # test windows every variant evaluates on (once per seed, shared by every variant)
    t0 = time.perf_counter()
    truth = single_removal_losses(model, as_batches(eval_windows(held, p), p["eval"]["batch"], "cpu"))
    (ctx.shared_dir / "removal.json").write_text(json.dumps(
        {"single_removal_loss": truth, "seconds": time.perf_counter() - t0}))


# --- one pruning variant ---------------------------------------------------------------------------

def tokens_per_second(models: list, ids, repeats: int) -> list[float]:
    """Forward throughput of each model on the same batch, repeats interleaved (so a slow moment of
    the machine hits every model alike), median over repeats after one warm-up pass each."""
    import torch

    times = [[] for _ in models]
    with torch.no_grad():
        for m in models:
            m.eval()
            m(input_ids=ids)
        for _ in range(repeats):
            for i, m in enumerate(models):
                t0 = time.perf_counter()
                m(input_ids=ids)
                if ids.is_cuda:
                    torch.cuda.synchronize()
                times[i].append(time.perf_counter() - t0)
    return [ids.numel() / float(np.median(ts)) for ts in times]


def train(ctx) -> None:
    import torch

    from reprozoo.runtime import seed_everything

    from . import moe, pruning

    p = ctx.params
    v = VARIANTS[ctx.variant]
    rule, refit = v["rule"], v["refit"]
    seed_everything(ctx.seed, ctx.threads)
    dev = p.get("device", "cpu")
    L = p["model"]["seq_len"]
    train_ids, held = token_streams(p)
    c = p["calibration"]
    frac, select = float(v.get("token_frac", c["token_frac"])), v.get("select", "loss")
    draws = int(c.get("draws", 1))
    held_b = as_batches(eval_windows(held, p), p["eval"]["batch"], dev)
    dense = load_model(p, ctx.shared_dir, dev)
    shared = ctx.shared_dir / "train.json"
    if shared.exists():
        # the shared model's training record, in every variant's table: the convergence gate reads it
        # (every variant prunes this model, so each claim needs it trained to its plateau)
        rec = json.loads(shared.read_text())
        ctx.metrics.curve("val_moe", rec["steps"], rec["vals"])
        ctx.metrics.curve("lr_moe", rec["steps"], rec["lrs"])
        ctx.metrics.scalar("lr_chosen_moe", rec["lr"])
        ctx.metrics.scalar("steps_moe", rec["stop"])
        ctx.metrics.scalar("lr_edge_moe", {"top": 1.0, "bottom": -1.0}.get(rec.get("lr_edge"), 0.0))
        if rec.get("drop_gain") is not None:
            ctx.metrics.scalar("drop_gain_moe", rec["drop_gain"])
    truth_f = ctx.shared_dir / "removal.json"
    truth = ([torch.as_tensor(r, dtype=torch.float64) for r in json.loads(truth_f.read_text())["single_removal_loss"]]
             if truth_f.exists() else None)

    dense_units, dense_acc = window_scores(dense, held_b)
    dense_nll = float(np.mean(dense_units))
    ctx.metrics.units("nll_dense", dense_units)
    ctx.metrics.units("acc_dense", dense_acc)
    ctx.metrics.scalar("ppl_dense", math.exp(dense_nll))
    dense_bytes, dense_expert = moe.param_bytes(dense), moe.expert_param_count(dense)

    # R independent calibration draws (windows from the training files; draw 0 is the previous
    # versions' single draw): each draw is scored, pruned, re-fitted and evaluated at 50 % sparsity,
    # and the claims' per-window units are the mean over the draws, so the noise of one calibration
    # sample (up to 0.33 nats/byte between draws of 64 windows, cold review) leaves the seed spread.
    # The random rules draw a new removal set per draw (seeded by seed and draw). 25 % and 75 %
    # (the plot) are evaluated on draw 0 only.
    nll_acc, acc_acc, usage_all, slot_share, rho, keep_diff = 0.0, 0.0, None, [], [], []
    pruned50, ppl = None, {}
    for r in range(draws):
        calib = as_batches(corpus.windows(train_ids, c["windows"], L, ctx.rng(2 + r)), c["batch"], dev)
        gseed = ctx.seed + 1000 * r
        t0 = time.perf_counter()
        scores, usage = pruning.expert_scores(dense, calib, rule, frac, seed=gseed, select=select)
        score_s = time.perf_counter() - t0
        usage_all = usage if usage_all is None else [a + u for a, u in zip(usage_all, usage)]
        if truth is not None:
            # the mechanism claim's units: per (draw, layer), the rank correlation of the rule's scores
            # with the true held-out loss of removing each expert alone
            rho += [pruning.rank_corr(sc, tr) for sc, tr in zip(scores, truth)]
        if rule == "step" and frac < 1.0 and select == "loss" and not refit:
            # the selection precondition (read at step_nokp): how many experts per layer the selective
            # rule keeps that the token-agnostic one (every token's loss, the same draw) removes
            every, _ = pruning.expert_scores(dense, calib, "step", 1.0, seed=gseed)
            keep_diff.append(pruning.keep_difference(pruning.keep_sets(scores, 0.5), pruning.keep_sets(every, 0.5)))
        for s in p["sparsities"]:
            half = abs(s - 0.5) < 1e-9
            if r > 0 and not half:
                continue
            t1 = time.perf_counter()
            keep = pruning.keep_sets(scores, s)
            model = pruning.prune(dense, keep)
            if refit:
                pruning.preserve_knowledge(model, dense, calib, p["refit"]["ridge"], p["refit"].get("max_joint", 8192))
            prune_s = score_s + time.perf_counter() - t1
            units, acc = window_scores(model, held_b)
            tag = f"{int(round(100 * s))}"
            if not half:
                ppl[s] = math.exp(float(np.mean(units)))
                ctx.metrics.scalar(f"ppl{tag}", ppl[s])
            else:
                nll_acc = nll_acc + units / draws
                acc_acc = acc_acc + acc / draws
                # the share of routed calibration slots this rule's removed experts carried
                slot_share.append(float(np.mean([1.0 - float(u[k].sum() / u.sum()) for u, k in zip(usage, keep)])))
            if r == 0:
                ctx.metrics.scalar(f"mem_ratio{tag}", moe.param_bytes(model) / dense_bytes)
                ctx.metrics.scalar(f"expert_mem_ratio{tag}", moe.expert_param_count(model) / dense_expert)
                if half:
                    pruned50 = model
                    ctx.metrics.scalar("prune_seconds50", prune_s)
                    ctx.metrics.scalar("nll50_draw0", float(np.mean(units)))
            if r == 0 or half:
                ctx.progress(f"draw {r}, sparsity {s:.2f}: ppl {math.exp(float(np.mean(units))):.3f} "
                             f"(dense {math.exp(dense_nll):.3f}), pruning {prune_s:.2f} s")
    ctx.metrics.units("nll50", nll_acc)   # per test window, mean over calibration draws: the claims' units
    ctx.metrics.units("acc50", acc_acc)
    ppl[0.5] = math.exp(float(np.mean(nll_acc)))
    ctx.metrics.scalar("ppl50", ppl[0.5])
    ctx.metrics.scalar("pruned_slot_share50", float(np.mean(slot_share)))
    ctx.metrics.scalar("calibration_draws", draws)
    if rho:
        ctx.metrics.units("score_rho", rho)
    if keep_diff:
        ctx.metrics.scalar("keep_diff50", float(np.mean(keep_diff)))
    usage_frac = torch.cat([u / u.sum() for u in usage_all]).tolist()
    ctx.metrics.curve("expert_usage", range(len(usage_frac)), usage_frac)
    # router balance (the precondition of every perplexity claim): the share of routed calibration slots
    # that the least-used half of each layer's experts carry, mean over layers (0.5 for a uniform router;
    # the slots that frequency pruning at 50 % must re-route, the fewest any rule can)
    ctx.metrics.scalar("low_half_slot_share", pruning.low_usage_share(usage_all, 0.5))
    xs = [0.0] + [100 * s for s in p["sparsities"]]
    ctx.metrics.curve("ppl_vs_sparsity", xs, [math.exp(dense_nll)] + [ppl[s if abs(s - 0.5) > 1e-9 else 0.5]
                                                                    for s in p["sparsities"]])
    ctx.metrics.scalar("ppl_ratio50", ppl[0.5] / math.exp(dense_nll))

    tp = p["throughput"]
    ids = torch.as_tensor(corpus.windows(held, tp["batch"], L, None), device=dev)
    # the library's default kernel (grouped_mm) and the per-expert loop (eager); reported, not claimed
    for k, impl in enumerate(tp["implementations"]):
        for m in (dense, pruned50):
            m.config._experts_implementation = impl
        tps_dense, tps50 = tokens_per_second([dense, pruned50], ids, tp["repeats"])
        sfx = "" if k == 0 else f"_{impl}"
        ctx.metrics.scalar(f"tps_dense{sfx}", tps_dense)
        ctx.metrics.scalar(f"tps50{sfx}", tps50)
        ctx.metrics.scalar(f"tps_ratio50{sfx}", tps50 / tps_dense)
    if shared.exists():
        ctx.metrics.scalar("prune_over_train_time", ctx.metrics.scalars["prune_seconds50"]
                           / json.loads(shared.read_text())["train_seconds"])


# --- plots -----------------------------------------------------------------------------------------

RULE_STYLE = {"step": ("C0", "-"), "step_nokp": ("C0", "--"), "step_alltok": ("C4", "--"), "step_randtok": ("C4", ":"),
              "reap": ("C1", "-"), "reap_refit": ("C1", "--"), "frequency": ("C2", "-"), "random": ("0.5", ":"),
              "random_refit": ("0.5", "--")}


def plot(table, plots_dir: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir = Path(plots_dir)
    cur = table[table.metric == "ppl_vs_sparsity"]
    if len(cur):
        fig, ax = plt.subplots(figsize=(6, 4))
        for v, g in cur.groupby("variant"):
            piv = g.pivot_table(index="x", columns="seed", values="value")
            m, lo, hi = piv.mean(1), piv.min(1), piv.max(1)
            col, ls = RULE_STYLE.get(v, ("k", ":"))
            ax.plot(piv.index, m, ls, color=col, marker="o", label=v)
            ax.fill_between(piv.index, lo, hi, color=col, alpha=0.15)
        ax.set_yscale("log")
        ax.set_xlabel("expert sparsity (% of experts removed per layer)")
        ax.set_ylabel("held-out perplexity (per byte)")
        ax.set_title("Which pruning rule keeps held-out perplexity lowest?\n(line: seed mean, band: seed min-max)")
        ax.legend(fontsize=8)
        save_figure(fig, plots_dir / "ppl_vs_sparsity.png", dpi=120)
    use = table[table.metric == "expert_usage"]
    if len(use):
        v0 = "step" if "step" in set(use.variant) else sorted(set(use.variant))[0]
        use = use[use.variant == v0]
        E = int(params["model"]["experts"]) if not params["model"].get("pretrained") else None
        n = int(use.x.max()) + 1
        E = E or n
        layers = n // E
        fig, axes = plt.subplots(1, layers, figsize=(3.2 * layers, 3.2), squeeze=False, sharey=True)
        for l in range(layers):
            ax = axes[0, l]
            sub = use[(use.x >= l * E) & (use.x < (l + 1) * E)]
            # sort experts by usage within each seed (expert identities differ between seeds)
            ranked = np.stack([np.sort(g.sort_values("x").value.to_numpy())[::-1] for _, g in sub.groupby("seed")])
            ax.bar(np.arange(E), 100 * ranked.mean(0), yerr=100 * ranked.std(0), color="C0", alpha=0.8)
            ax.axhline(100 / E, color="k", ls=":", lw=1, label="uniform")
            ax.set_xlabel("expert rank in layer")
            ax.set_title(f"layer {l}")
        axes[0, 0].set_ylabel("share of routed slots (%)")
        axes[0, 0].legend(fontsize=8)
        fig.suptitle("How unevenly does the trained router use its experts? (dense model, calibration tokens)", fontsize=9)
        save_figure(fig, plots_dir / "expert_usage.png", dpi=120)
