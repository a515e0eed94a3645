"""Mind-Omni in miniature: one masked discrete-diffusion transformer for seven brain tasks.

Stages and units:

* ``train_shared`` (per seed): split the sklearn digits (train / val / test), compute captions and
  BQA answers, synthesise the smooth 'fMRI' (``data.py``), fit the k-means brain and image
  tokenizers on the training split, tokenise everything -> ``shared.npz`` + ``tokenizers.npz``.
  Records the tokenizer ceilings (voxel r and pixel r of tokenise -> detokenise on test).
* ``train`` (per variant x seed): masked-token transformers (``blocks/masked_token_transformer``)
  trained with the masked diffusion loss (nats per masked token) on the joint token sequences of
  ``tasks.py``, each by the shared rule of ``blocks/fitting`` (AdamW at every rate of
  one grid for a pilot, the best on validation continued at that constant rate until the platform's
  plateau test holds on the mean AND on every task's curve, best-validation weights kept; validation CE with all targets masked, averaged
  over the model's tasks); every task is then decoded greedily on the test split, scored, and
  chance-corrected (``tasks.chance_corrected``).

Variants (identical architecture, optimiser, learning-rate grid, stopping rule, data, decoding):

* ``joint`` (method, Mind-Omni): ONE model; every step draws ``batch_per_task`` = b examples of EACH
  of the seven tasks (batch 7 b). Its weights after ``control_step`` updates are scored too
  (``cc_early_*``): the weakened control every claim must fail on;
* ``single_task_joint_batch`` (baseline, the claims' comparison): SEVEN models of the same size, one
  per task, each 7 b examples of its own task per step, the joint model's batch size: the control
  for the batch-size confound the review named;
* ``single_task`` (baseline): seven models, b examples of their task per step (the joint model's
  per-task batch, the paper-style single-task baseline).
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from . import data as D
from . import tasks as T

GENERIC_CURVES: list[str] = []   # plot() draws every curve itself
N_EXAMPLES = 6                   # test digits whose reconstructions are recorded (seed 0) for the plot


# --- shared per seed: data and tokenizers ----------------------------------------------------------

def build_data(p: dict, seed: int, rng: np.random.Generator) -> dict:
    images, labels = D.load_digits_images()
    perm = rng.permutation(len(images))
    n_val, n_test = p["split"]["val"], p["split"]["test"]
    n_train = min(p["split"].get("train", len(images)), len(images) - n_val - n_test)
    test, val, train = perm[:n_test], perm[n_test:n_test + n_val], perm[n_test + n_val:n_test + n_val + n_train]
    cap = D.captions(images, labels, train)
    ans = D.bqa_answers(cap)
    b = p["brain"]
    fmri, _ = D.synthetic_fmri(images, train, b["grid"], b["smooth"], b["noise"], rng)
    tk = p["tokenizer"]
    btok = D.PatchTokenizer(tk["brain_patch"], tk["brain_codes"], seed).fit(fmri[train])
    itok = D.PatchTokenizer(tk["image_patch"], tk["image_codes"], seed).fit(images[train])
    return dict(images=images, labels=labels, caption=cap, answers=ans, fmri=fmri,
                brain_tok=btok.tokenize(fmri), image_tok=itok.tokenize(images),
                train=train, val=val, test=test,
                brain_centroids=btok.centroids, image_centroids=itok.centroids,
                brain_patch=np.array(tk["brain_patch"]), image_patch=np.array(tk["image_patch"]))


def train_shared(ctx) -> None:
    d = build_data(ctx.params, ctx.seed, ctx.rng())
    np.savez(ctx.shared_dir / "shared.npz", **d)
    te = d["test"]
    bt, it = _detokenizers(d)
    ctx.progress(f"data: {len(d['train'])} train / {len(d['val'])} val / {len(te)} test digits")
    ctx.metrics.scalar("brain_tokenizer_voxel_r", T.voxel_correlation(
        bt(d["brain_tok"][te]).reshape(len(te), -1), d["fmri"][te].reshape(len(te), -1)))
    ctx.metrics.scalar("image_tokenizer_pixel_r", T.pixel_correlation(it(d["image_tok"][te]), d["images"][te]))


def _detokenizers(d):
    bp, ip = int(d["brain_patch"]), int(d["image_patch"])
    g = d["fmri"].shape[-1]
    return (lambda tok: D.from_patches(d["brain_centroids"][tok], bp, g),
            lambda tok: D.from_patches(d["image_centroids"][tok], ip, 8))


def load_shared(shared_dir: Path) -> dict:
    with np.load(shared_dir / "shared.npz") as z:
        return {k: z[k] for k in z.files}


# --- training ---------------------------------------------------------------------------------------

def _layout(d) -> T.Layout:
    return T.Layout(d["brain_tok"].shape[1], d["image_tok"].shape[1], len(d["brain_centroids"]),
                    len(d["image_centroids"]))


def task_batch(d, lay: T.Layout, task: str, idx: np.ndarray, question: np.ndarray):
    clean = lay.clean_tokens(d["brain_tok"][idx], d["image_tok"][idx], d["caption"][idx], question,
                             d["answers"][idx])
    return lay.for_task(clean, task)


def _eval_sets(d, lay, split, tasks):
    """Per task: (tokens, target) of a split; BQA rows repeat each image once per question."""
    idx = d[split]
    nq = len(D.QUESTIONS)
    out = {}
    for task in tasks:
        if task == "bqa":
            ii, qq = np.repeat(idx, nq), np.tile(np.arange(nq), len(idx))
        else:
            ii, qq = idx, np.zeros(len(idx), dtype=np.int64)
        out[task] = task_batch(d, lay, task, ii, qq)
    return out


def variant_plan(variant: str, b: int) -> tuple[list[list[str]], int]:
    """(task groups, one model per group; examples of EACH task of a group per step).

    joint: one group of all seven tasks, ``b`` of each per step (batch 7 b); single_task: seven
    groups, ``b`` per step (batch b); single_task_joint_batch: seven groups, ``7 b`` per step (batch
    7 b, the joint model's batch: the control for the batch-size confound)."""
    tasks = list(T.TASKS)
    if variant == "joint":
        return [tasks], b
    if variant == "single_task":
        return [[t] for t in tasks], b
    if variant == "single_task_joint_batch":
        return [[t] for t in tasks], b * len(tasks)
    raise ValueError(f"variant '{variant}' unknown (joint, single_task, single_task_joint_batch)")


def train_model(d, tasks: list[str], per_task: int, cfg: dict, fit: dict, seed: int, label: str,
                snap_step: int | None = None, progress=print):
    """One masked-token transformer on ``tasks`` (``per_task`` examples of each per step), trained by
    ``_fit_every_task_flat`` (the shared rule of ``blocks.fitting``, stopping when the mean validation CE and
    every task's curve pass the plateau test).
    Returns (model with its best-validation weights, fit record, per-task validation curves of the
    chosen run, the chosen run's weights after ``snap_step`` updates or None)."""
    import torch

    from ...blocks.masked_token_transformer import MaskedTokenTransformer, masked_token_loss

    lay = _layout(d)
    bias = torch.tensor(lay.logit_bias())
    train = d["train"]
    val = {k: (torch.tensor(x), torch.tensor(t)) for k, (x, t) in _eval_sets(d, lay, "val", tasks).items()}
    rngs, counts, snaps, per_task_vals = {}, {}, {}, {}

    def build(gen):
        torch.manual_seed(seed)     # the same initial weights for every rate of the grid
        return MaskedTokenTransformer(lay.vocab, lay.seq_len, cfg["dim"], cfg["depth"], cfg["heads"],
                                      cfg["mlp_ratio"])

    def train_loss(model, gen):
        key = id(model)
        rng = rngs.setdefault(key, np.random.default_rng(seed + 17))   # the same batches for every rate
        xs, ts = [], []
        for task in tasks:
            idx = rng.choice(train, per_task)
            x, t = task_batch(d, lay, task, idx, rng.integers(0, len(D.QUESTIONS), per_task))
            xs.append(x)
            ts.append(t)
        if snap_step is not None and counts.get(key, 0) == snap_step:
            snaps[key] = copy.deepcopy(model.state_dict())
        counts[key] = counts.get(key, 0) + 1
        return masked_token_loss(model, torch.tensor(np.concatenate(xs)), torch.tensor(np.concatenate(ts)),
                                 bias, gen)

    def val_loss(model):
        """CE (nats per token) of every target token with ALL targets masked (the first reverse
        step), mean over the model's tasks."""
        out = {}
        for k, (x, t) in val.items():
            logits = model(torch.where(t, torch.full_like(x, model.mask_id), x)) + bias
            out[k] = torch.nn.functional.cross_entropy(logits[t], x[t]).item()
        per_task_vals.setdefault(id(model), []).append(out)
        return float(np.mean(list(out.values())))

    model, rec = _fit_every_task_flat(build, train_loss, val_loss, fit, seed, label, progress,
                                      lambda m: per_task_vals[id(m)], tasks)
    model.eval()
    hist = per_task_vals[id(model)]
    curves = {k: [h[k] for h in hist] for k in tasks}
    snap = snaps.get(id(model))
    if snap_step is not None and snap is None:
        raise ValueError(f"{label}: control_step {snap_step} not reached (the run took {rec['stop']} steps)")
    return model, rec, curves, snap


def _fit_every_task_flat(build, train_loss, val_loss, fit: dict, seed: int, label: str, progress, history,
                         tasks: list[str]):
    """The shared rule (``blocks.fitting``: the rate of ``fit.lr_grid`` with the best pilot, then a
    constant rate, one drop by ``lr_drop`` at an early first plateau, best-validation weights kept),
    except that a model stops only when its mean validation CE AND each task's curve pass the
    plateau test: the claims read per-task scores, and a joint model stopped on its mean alone left
    one task still improving 2.0 % over the gate's window (seed 2 at 4cf9312)."""
    import torch

    from ...blocks.fitting import PlateauRun
    from ...claims import plateau

    kw = {"optimizer": fit.get("optimizer", "adam"), "weight_decay": float(fit.get("weight_decay", 0.0))}
    runs = []
    for lr in fit["lr_grid"]:
        run = PlateauRun(build(torch.Generator().manual_seed(seed)), float(lr), train_loss, val_loss,
                         int(fit["eval_every"]), torch.Generator().manual_seed(seed + 7), **kw)
        run.advance(int(fit["pilot_steps"]))
        runs.append(run)
    run = min(runs, key=lambda r: r.best)
    tol, top, every = float(fit["flat_tol"]), int(fit["max_steps"]), int(fit["eval_every"])

    def every_task_flat() -> bool:
        hist = history(run.model)
        return all(plateau(run.steps, [h[k] for h in hist], tol) for k in tasks)

    def to_plateau(first: int) -> bool:
        while run.step < top:
            if run.advance(min(top, run.step + every), min_steps=first, tol=tol) and every_task_flat():
                return True
        return False

    stopped, drop_step = to_plateau(int(fit["min_steps"])), None
    if stopped and fit.get("lr_drop") and run.step <= top // 2:
        drop_step = run.step
        run.set_lr(run.lr * float(fit["lr_drop"]))
        stopped = to_plateau(run.step + every * 5)
    stopped = stopped or (plateau(run.steps, run.vals, tol) and every_task_flat())
    run.model.load_state_dict(run.best_state)
    progress(f"{label}: lr {run.lr:g}, {run.step} steps ({'plateau' if stopped else 'max steps'}), "
             f"best validation loss {run.best:.3e}")
    return run.model, {"steps": run.steps, "vals": run.vals, "lrs": run.lrs, "lr": run.lr, "stop": run.step,
                       "drop_step": drop_step, "plateau": stopped, "losses": run.losses,
                       "pilot_best": {float(r.lr): r.best for r in runs}}


# --- evaluation -------------------------------------------------------------------------------------

def evaluate(model, d, tasks: list[str], steps: int) -> tuple[dict, dict]:
    """Greedy reverse decoding of every task on the test split -> (scalars, generated tokens)."""
    import torch

    from ...blocks.masked_token_transformer import decode_greedy

    lay = _layout(d)
    bias = torch.tensor(lay.logit_bias())
    bt, it = _detokenizers(d)
    te = d["test"]
    n = len(te)
    out, gen = {}, {}
    for task, (x, t) in _eval_sets(d, lay, "test", tasks).items():
        y = decode_greedy(model, torch.tensor(x), torch.tensor(t), steps, bias).numpy()
        gen[task] = y
        if task.endswith("2brain"):
            pred = bt(y[:, lay.span["brain"]] - lay.offset["brain"])
            out[f"voxel_r_{task}"] = T.voxel_correlation(pred.reshape(n, -1), d["fmri"][te].reshape(n, -1))
            out[f"score_{task}"] = out[f"voxel_r_{task}"]
        if task in ("brain2img", "brain2imgtxt"):
            rec = it(y[:, lay.span["image"]] - lay.offset["image"])
            out[f"id_acc_{task}"] = T.identification_accuracy(rec, d["images"][te])
            out[f"pixel_r_{task}"] = T.pixel_correlation(rec, d["images"][te])
        if task in ("brain2txt", "brain2imgtxt"):
            words = y[:, lay.span["text"]] - lay.offset["text"]
            out[f"word_acc_{task}"] = float((words == d["caption"][te]).mean())
            out[f"digit_acc_{task}"] = float((words[:, 0] == d["labels"][te]).mean())
        if task == "bqa":
            ans = y[:, lay.span["answer"]][:, 0] - lay.offset["answer"]
            truth = d["answers"][np.repeat(te, len(D.QUESTIONS)), np.tile(np.arange(len(D.QUESTIONS)), n)]
            out["score_bqa"] = float((ans == truth).mean())
    if "brain2img" in tasks:
        out["score_brain2img"] = out["id_acc_brain2img"]
    if "brain2txt" in tasks:
        out["score_brain2txt"] = out["word_acc_brain2txt"]
    if "brain2imgtxt" in tasks:
        out["score_brain2imgtxt"] = 0.5 * (out["id_acc_brain2imgtxt"] + out["word_acc_brain2imgtxt"])
    for task in tasks:
        out[f"cc_{task}"] = T.chance_corrected(task, out[f"score_{task}"])
    return out, gen


def train(ctx) -> None:
    import torch

    from ...blocks.fitting import log_fit

    torch.set_num_threads(max(1, ctx.threads))
    p, d = ctx.params, load_shared(ctx.shared_dir)
    cfg, fit = p["model"], p["fit"]
    groups, per_task = variant_plan(ctx.variant, cfg["batch_per_task"])
    scalars, gens = {}, {}
    for g in groups:
        label = "joint" if len(g) > 1 else g[0]
        snap_step = p["control_step"] if ctx.variant == "joint" else None
        model, rec, curves, snap = train_model(d, g, per_task, cfg, fit, ctx.seed, label, snap_step, ctx.progress)
        # the gate's curves: val_<label> (mean CE over the model's tasks) and lr_<label>
        log_fit(ctx.metrics, label, rec)
        ctx.metrics.scalar(f"examples_per_task_{label}", rec["stop"] * per_task)
        steps = rec["steps"]
        for k in g:
            ctx.metrics.curve(f"val_loss_{k}", steps, curves[k])      # per task, for the plot
        # training loss: the chosen run's mean over each evaluation interval
        every = int(fit["eval_every"])
        ctx.metrics.curve(f"train_{label}", steps[1:], [float(np.mean(rec["losses"][a - every:a])) for a in steps[1:]])
        s, gen = evaluate(model, d, g, p["decode_steps"])
        scalars.update(s)
        gens.update(gen)
        if snap is not None:
            # the weakened control: the same joint run after control_step updates
            model.load_state_dict(snap)
            s_early, _ = evaluate(model, d, g, p["decode_steps"])
            scalars.update({k.replace("score_", "score_early_").replace("cc_", "cc_early_"): v
                            for k, v in s_early.items() if k.startswith(("score_", "cc_"))})
    ctx.metrics.scalar("batch_size", per_task * len(groups[0]))
    for k, v in scalars.items():
        ctx.metrics.scalar(k, v)
    if ctx.seed == min(p["seeds"]):
        _record_examples(ctx, d, gens)


def _record_examples(ctx, d, gens) -> None:
    """A few test digits, as curves over pixel / voxel / word index, for the reconstruction plot."""
    lay = _layout(d)
    bt, it = _detokenizers(d)
    te = d["test"][:N_EXAMPLES]
    for k in range(len(te)):
        img = it(gens["brain2img"][k:k + 1, lay.span["image"]] - lay.offset["image"])[0]
        ctx.metrics.curve(f"example{k}_brain2img", range(64), img.ravel())
        words = gens["brain2txt"][k, lay.span["text"]] - lay.offset["text"]
        ctx.metrics.curve(f"example{k}_brain2txt", range(3), words)
        if ctx.variant == "joint":
            ctx.metrics.curve(f"example{k}_image", range(64), d["images"][te[k]].ravel())
            ctx.metrics.curve(f"example{k}_fmri", range(d["fmri"][0].size), d["fmri"][te[k]].ravel())
            ctx.metrics.curve(f"example{k}_caption", range(3), d["caption"][te[k]])


# --- plots ------------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from .plots import plot_all

    plot_all(table, plots_dir, params)
