"""Mind-Omni in miniature: one masked discrete-diffusion transformer for seven brain tasks.

Stages and units:

* ``train_shared`` (per seed): split the sklearn digits (train / val / test), compute captions and
  BQA answers, synthesise the smooth 'fMRI' (``data.py``), fit the k-means brain and image
  tokenizers on the training split, tokenise everything -> ``shared.npz`` + ``tokenizers.npz``.
  Records the tokenizer ceilings (voxel r and pixel r of tokenise -> detokenise on test).
* ``train`` (per variant x seed): masked-token transformers (``blocks/masked_token_transformer``)
  trained with the masked diffusion loss (nats per masked token) on the joint token sequences of
  ``tasks.py``; the best-on-validation checkpoint is kept; every task is then decoded greedily on
  the test split and scored (``tasks.py``).

Variants (identical architecture, optimiser, schedule, data, decoding; budget stated per task):

* ``joint`` (method, Mind-Omni): ONE model; every step draws ``batch_per_task`` examples of EACH of
  the seven tasks (batch 7 x b) for ``steps`` steps;
* ``single_task`` (baseline): SEVEN models of the same size, one per task, each ``steps`` steps of
  ``batch_per_task`` examples of its own task. Each task therefore gets the same steps x batch in
  both variants (and the seven single models together cost what the joint model costs).
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


def train_model(d, tasks: list[str], cfg: dict, seed: int, progress=print):
    """One masked-token transformer on ``tasks`` (b examples of each per step); returns the
    best-on-validation model and curves (step, train loss; step, val loss per task)."""
    import torch

    from ...blocks.masked_token_transformer import MaskedTokenTransformer, masked_token_loss

    torch.manual_seed(seed)
    lay = _layout(d)
    bias = torch.tensor(lay.logit_bias())
    model = MaskedTokenTransformer(lay.vocab, lay.seq_len, cfg["dim"], cfg["depth"], cfg["heads"], cfg["mlp_ratio"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, cfg["lr"], total_steps=cfg["steps"],
                                                pct_start=max(0.05, 2.0 / cfg["steps"]))
    rng = np.random.default_rng(seed + 17)
    gen = torch.Generator().manual_seed(seed + 29)
    b, train = cfg["batch_per_task"], d["train"]
    val = {k: (torch.tensor(x), torch.tensor(t)) for k, (x, t) in _eval_sets(d, lay, "val", tasks).items()}

    def val_losses():
        """CE (nats per token) of every target token with ALL targets masked: the first reverse step."""
        model.eval()
        out = {}
        with torch.no_grad():
            for k, (x, t) in val.items():
                logits = model(torch.where(t, torch.full_like(x, model.mask_id), x)) + bias
                out[k] = torch.nn.functional.cross_entropy(logits[t], x[t]).item()
        model.train()
        return out

    curves = {"step": [], "train": [], **{f"val_{k}": [] for k in tasks}}
    best, best_state, run = np.inf, None, []
    for step in range(1, cfg["steps"] + 1):
        xs, ts = [], []
        for task in tasks:
            idx = rng.choice(train, b)
            x, t = task_batch(d, lay, task, idx, rng.integers(0, len(D.QUESTIONS), b))
            xs.append(x)
            ts.append(t)
        loss = masked_token_loss(model, torch.tensor(np.concatenate(xs)), torch.tensor(np.concatenate(ts)),
                                 bias, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        run.append(loss.item())
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            vl = val_losses()
            curves["step"].append(step)
            curves["train"].append(float(np.mean(run)))
            run = []
            for k, v in vl.items():
                curves[f"val_{k}"].append(v)
            m = float(np.mean(list(vl.values())))
            if m < best:
                best, best_state = m, copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    model.eval()
    return model, curves


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
    return out, gen


def _final_slope(steps, ys, frac: float = 0.25) -> float:
    """Least-squares slope of a curve over its last ``frac`` of steps, per 1000 steps."""
    s, y = np.asarray(steps, float), np.asarray(ys, float)
    keep = s >= s[-1] * (1 - frac)
    return float(np.polyfit(s[keep], y[keep], 1)[0] * 1000) if keep.sum() >= 2 else float("nan")


def train(ctx) -> None:
    import torch

    torch.set_num_threads(max(1, ctx.threads))
    p, d = ctx.params, load_shared(ctx.shared_dir)
    cfg, all_tasks = p["model"], list(T.TASKS)
    groups = [all_tasks] if ctx.variant == "joint" else [[t] for t in all_tasks] \
        if ctx.variant == "single_task" else None
    if groups is None:
        raise ValueError(f"variant '{ctx.variant}' unknown (joint, single_task)")
    scalars, train_curves, slopes, gens = {}, [], [], {}
    for g in groups:
        model, c = train_model(d, g, cfg, ctx.seed, ctx.progress)
        s, gen = evaluate(model, d, g, p["decode_steps"])
        scalars.update(s)
        gens.update(gen)
        train_curves.append(c["train"])
        for k in g:
            ctx.metrics.curve(f"val_loss_{k}", c["step"], c[f"val_{k}"])
            slopes.append(_final_slope(c["step"], c[f"val_{k}"]))
        ctx.progress(f"{'+'.join(g)}: best val {min(np.mean([c[f'val_{k}'] for k in g], 0)):.3f} nats")
    # train loss: the mean over the variant's models (joint: one model on the task mixture)
    ctx.metrics.curve("train_loss", c["step"], np.mean(train_curves, 0))
    ctx.metrics.scalar("val_loss_final_slope_max", max(slopes))
    ctx.metrics.scalar("train_examples_per_task", cfg["steps"] * cfg["batch_per_task"])
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
