"""Mind-Omni in miniature: one masked discrete-diffusion transformer for seven brain tasks.

Stages and units:

* ``train_shared`` (per seed): split the sklearn digits (train / val / test), compute captions and
  BQA answers, synthesise the smooth 'fMRI' (``data.py``), fit the k-means brain and image
  tokenizers on the training split, tokenise everything -> ``shared.npz``. Records the tokenizer
  ceilings (voxel r and pixel r of tokenise -> detokenise on test). Then trains THE joint model of the
  seed once (``joint_model.pt``: weights and fit record), which ``joint`` and ``joint_planted`` score.
* ``train`` (per variant x seed): masked-token transformers (``blocks/masked_token_transformer``)
  trained with the masked diffusion loss (nats per masked token) on the joint token sequences of
  ``tasks.py``, each by the shared rule ``blocks.fitting.fit_to_plateau`` (AdamW at every rate of one
  grid for a pilot, ranked on validation (the config's ``pilot_score``); the best continued at that
  constant rate until the plateau test holds on every curve: for a model of several tasks the mean
  validation CE AND each task's CE, ``stop_on``; then once at ``lr_drop`` x the rate until flat again;
  best weights by the mean, ``select``). Encoding tasks
  are scored from the expected brain map (code probabilities x centroids), decoding tasks by greedy
  reverse decoding; every score is recorded per test image and chance-corrected
  (``tasks.chance_corrected``).

Variants (identical architecture, optimiser, learning-rate grid, stopping rule, decoding, and loss:
adapted from the authors' loss, ``paper_loss``):

* ``joint`` (method, Mind-Omni): ONE model; every step draws ``batch_per_task`` = b examples of EACH
  of the seven tasks (batch 7 b);
* ``joint_planted`` (the claims' control): the same joint model (same data, seed, loss, rule: the
  same weights, trained once in ``train_shared``), scored with a PLANTED DEFICIT of ``planted_deficit``
  (config, 0.1 = twice the larger claim margin, 0.05) on every task: test images, in a random order,
  are scored on broken brain-stimulus pairs (``shuffled_pairing`` on the test split) until the task's
  mean has fallen by it (``plant_deficit``). A joint model that
  is this much worse than it is must fail every claim: the control tells a gap near the margins from a
  tie, which a control at chance could not;
* ``single_task_joint_batch`` (baseline, the claims' comparison): one model of the same size per task
  of ``baseline_tasks`` (the config), each 7 b examples of its own task per step, the joint model's
  batch size.
"""
from __future__ import annotations

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
    for k, v in linear_ceilings(d, bt).items():
        ctx.metrics.scalar(k, v)
    _with_math_attention(ctx, lambda: _train_joint_once(ctx, load_shared(ctx.shared_dir)))


JOINT_FILE = "joint_model.pt"


def _train_joint_once(ctx, d) -> None:
    """The joint model, trained ONCE per seed (shared): ``joint`` scores it, ``joint_planted`` scores it
    with the planted deficit; both log its fit record (the gate reads the same curves for both)."""
    import torch

    p = ctx.params
    groups, per_task = variant_plan("joint", p["model"]["batch_per_task"])
    model, rec = train_model(d, groups[0], per_task, p["model"], p["fit"], ctx.seed, "joint", ctx.progress)
    torch.save({"state": model.state_dict(), "rec": rec}, ctx.shared_dir / JOINT_FILE)


def _load_joint(d, cfg, shared_dir: Path):
    import torch

    z = torch.load(shared_dir / JOINT_FILE, weights_only=False)
    model = _new_model(_layout(d), cfg)
    model.load_state_dict(z["state"])
    model.eval()
    return model, z["rec"]


def linear_ceilings(d, bt) -> dict:
    """What a linear readout reaches, the yardstick of the tokenizer's ceiling: the caption's digit
    read from the continuous 'fMRI' and from the detokenised brain map (logistic regression), and the
    test-image pattern r of a ridge encoder image -> continuous 'fMRI' (fit on the training split)."""
    from sklearn.linear_model import LogisticRegression, Ridge

    tr, te = d["train"], d["test"]
    n = len(d["images"])
    fm = d["fmri"].reshape(n, -1)
    detok = bt(d["brain_tok"]).reshape(n, -1)
    digit = d["caption"][:, 0]

    def acc(f):
        return float(LogisticRegression(max_iter=300).fit(f[tr], digit[tr]).score(f[te], digit[te]))

    img = d["images"].reshape(n, -1)
    enc = Ridge(10.0).fit(img[tr], fm[tr]).predict(img[te])
    return {"linear_digit_acc_fmri": acc(fm), "linear_digit_acc_brain_tokens": acc(detok),
            "linear_encoding_pattern_r": float(T.pattern_correlation(enc, fm[te]).mean())}


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
    """(tokens, target mask) of ``task`` for images ``idx``."""
    clean = lay.clean_tokens(d["brain_tok"][idx], d["image_tok"][idx], d["caption"][idx], question,
                             d["answers"][idx])
    return lay.for_task(clean, task)


def _eval_sets(d, lay, split, tasks):
    """Per task: (tokens, target) of a split; BQA rows repeat each image once per question (image-major),
    on validation too: one answer token per image was a stopping curve too noisy to tell the answer
    prior from a model that reads the brain."""
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


VARIANTS = ("joint", "joint_planted", "single_task_joint_batch")


def variant_plan(variant: str, b: int, baseline_tasks=None) -> tuple[list[list[str]], int]:
    """(task groups, one model per group; examples of EACH task of a group per step).

    joint and joint_planted: one group of all seven tasks, ``b`` of each per step (batch 7 b);
    single_task_joint_batch: one group per task of ``baseline_tasks`` (default: all seven), ``7 b`` of
    the group's one task per step (the joint model's batch: the control for the batch-size confound)."""
    tasks = list(T.TASKS)
    if variant in ("joint", "joint_planted"):
        return [tasks], b
    if variant == "single_task_joint_batch":
        chosen = tasks if baseline_tasks is None else list(baseline_tasks)
        bad = [t for t in chosen if t not in tasks]
        if bad or not chosen:
            raise ValueError(f"baseline_tasks {chosen}: expected tasks of {tasks}")
        return [[t] for t in chosen], b * len(tasks)
    raise ValueError(f"variant '{variant}' unknown ({', '.join(VARIANTS)})")


def shuffled_pairing(d: dict, seed: int, splits=("test",)) -> dict:
    """Broken brain-stimulus pairs on ``splits``: every image of a split gets the brain tokens AND the
    measured 'fMRI' of a random other image of the same split whose digit differs (drawn with
    replacement); the other splits keep their true pairs. Images, captions and answers stay together, so
    only the brain-stimulus relation is gone. ``joint_planted`` scores its model on the test split so
    broken (``swap``): an encoding prediction is then correlated with another digit's map and a decoder
    reads another digit's brain tokens, so every such score sits at chance in expectation."""
    rng = np.random.default_rng(seed + 1009)
    digit = d["labels"]
    tok, fmri = d["brain_tok"].copy(), d["fmri"].copy()
    for split in splits:
        idx = d[split]
        src = rng.choice(idx, len(idx))
        same = digit[src] == digit[idx]
        while same.any():
            src[same] = rng.choice(idx, int(same.sum()))
            same = digit[src] == digit[idx]
        tok[idx] = d["brain_tok"][src]
        fmri[idx] = d["fmri"][src]
    return dict(d, brain_tok=tok, fmri=fmri)


def plant_deficit(true_units, swapped_units, deficit: float, rng: np.random.Generator):
    """The planted-deficit control's units: the model's per-image scores with some test images scored on
    broken pairs (``swapped_units``: at chance in expectation) instead of their true pairs. The images
    are taken in a random order and swapped one by one until the mean has fallen by ``deficit`` (exact
    to one image's share, |true - swapped| / n; a random fraction alone missed 0.1 by up to 0.027 on
    seed 0's pilot), about f = deficit / (mean true - mean swapped) of them; all of them, and the whole
    gap, where the gap is smaller than ``deficit``. Returns (units, fraction swapped)."""
    u, w = np.asarray(true_units, float), np.asarray(swapped_units, float)
    n = len(u)
    order = rng.permutation(n)
    fall = np.cumsum(u[order] - w[order]) / n
    reached = np.nonzero(fall >= deficit)[0]
    k = n if len(reached) == 0 else int(reached[0]) + 1
    out = u.copy()
    out[order[:k]] = w[order[:k]]
    return out, k / n


def task_weight(task: str) -> float:
    """A task's weight, ADAPTED from the authors' loss (their released stage-1 script: loss = 0.5 x
    encoding + image decoding + text decoding, one mode per step; brain -> image + text decoding thus
    weighs 2 there, and brain QA is a separate LoRA stage 2 in their code): here every task is in every
    step, 0.5 for the three encoding tasks (brain is the target), 1 for each decoding task and brain QA.
    The encoding gradient share is our mapping of their weights, not theirs."""
    return 0.5 if task.endswith("2brain") else 1.0


def paper_loss(model, tokens, target, weights, bias=None, gen=None):
    """The multi-task masked-diffusion loss, adapted from the authors' (their released training script;
    ``task_weight`` says what differs): per example, the
    cross-entropy of the masked target tokens averaged over that example's masked tokens (the script's
    CE summed over the masked positions / (length x masking rate)); per task, the mean over its
    examples; the total, the WEIGHTED SUM over tasks (``weights``, one per task; ``task_weight``).
    ``tokens`` holds ``len(weights)`` equal blocks of rows, one per task. The forward process is the
    shared one (``blocks.masked_token_transformer.mask_targets``). A single-task model gets weight 1
    (AdamW's step does not depend on a constant factor of the loss)."""
    import torch

    from ...blocks.masked_token_transformer import mask_targets

    n_tasks = len(weights)
    noised, masked, _ = mask_targets(tokens, target, model.mask_id, gen)
    logits = model(noised)
    if bias is not None:
        logits = logits + bias
    # only the masked positions: the logit bias forbids every other position's token (-inf)
    ce = torch.nn.functional.cross_entropy(logits[masked], tokens[masked], reduction="none")
    row = torch.arange(len(tokens))[:, None].expand_as(masked)[masked]
    sums = torch.zeros(len(tokens), dtype=ce.dtype).index_add(0, row, ce)
    per_example = sums / masked.sum(1)                          # mask_targets masks >= 1 target per row
    per_task = per_example.reshape(n_tasks, -1).mean(1)
    return (per_task * torch.as_tensor(weights, dtype=ce.dtype)).sum()


def _new_model(lay: T.Layout, cfg: dict):
    from ...blocks.masked_token_transformer import MaskedTokenTransformer

    return MaskedTokenTransformer(lay.vocab, lay.seq_len, cfg["dim"], cfg["depth"], cfg["heads"], cfg["mlp_ratio"])


def train_model(d, tasks: list[str], per_task: int, cfg: dict, fit: dict, seed: int, label: str,
                progress=print):
    """One masked-token transformer on ``tasks`` (``per_task`` examples of each per step), trained with
    ``paper_loss`` by the shared rule ``blocks.fitting.fit_to_plateau``. A model of several tasks
    returns its validation CE as a dict (``mean`` over tasks, the selection curve, then one curve per
    task), and stops only when every one of them passes the plateau test (the claims read per-task
    scores). Returns (model with its best-validation weights, fit record)."""
    import torch

    from ...blocks.fitting import fit_to_plateau

    lay = _layout(d)
    bias = torch.tensor(lay.logit_bias())
    train = d["train"]
    val = {k: (torch.tensor(x), torch.tensor(t)) for k, (x, t) in _eval_sets(d, lay, "val", tasks).items()}
    rngs = {}
    weights = [task_weight(t) for t in tasks] if len(tasks) > 1 else [1.0]

    def build(gen):
        torch.manual_seed(seed)     # the same initial weights for every rate of the grid
        return _new_model(lay, cfg)

    def train_loss(model, gen):
        rng = rngs.setdefault(id(model), np.random.default_rng(seed + 17))   # the same batches for every rate
        xs, ts = [], []
        for task in tasks:
            idx = rng.choice(train, per_task)
            x, t = task_batch(d, lay, task, idx, rng.integers(0, len(D.QUESTIONS), per_task))
            xs.append(x)
            ts.append(t)
        return paper_loss(model, torch.tensor(np.concatenate(xs)), torch.tensor(np.concatenate(ts)),
                          weights, bias, gen)

    @torch.no_grad()
    def val_loss(model):
        """CE (nats per token) of every target token with ALL targets masked (the first reverse step)."""
        out = {}
        for k, (x, t) in val.items():
            logits = model(torch.where(t, torch.full_like(x, model.mask_id), x)) + bias
            out[k] = torch.nn.functional.cross_entropy(logits[t], x[t]).item()
        if len(tasks) == 1:
            return out[tasks[0]]
        return {"mean": float(np.mean(list(out.values()))), **out}

    fit = dict(fit, select="mean") if len(tasks) > 1 else fit
    model, rec = fit_to_plateau(build, train_loss, val_loss, fit, seed, label, progress)
    model.eval()
    return model, rec


# --- evaluation -------------------------------------------------------------------------------------

def expected_brain_map(model, x, t, bias, d, lay: T.Layout) -> np.ndarray:
    """(N, G, G) the encoding prediction: every brain position's code distribution with ALL brain
    tokens masked, times the code centroids (the posterior-mean map, not the argmax code's)."""
    import torch

    with torch.no_grad():
        logits = model(torch.where(t, torch.full_like(x, model.mask_id), x)) + bias
        sl, o, k = lay.span["brain"], lay.offset["brain"], lay.k_brain
        prob = logits[:, sl, o:o + k].softmax(-1).numpy()                            # (N, T_b, K)
    patches = prob @ d["brain_centroids"]                                            # (N, T_b, p*p)
    return D.from_patches(patches, int(d["brain_patch"]), d["fmri"].shape[-1])


def evaluate(model, d, tasks: list[str], steps: int) -> tuple[dict, dict, dict]:
    """Every task on the test split -> (scalars, per-test-image units, generated tokens). Encoding:
    the expected brain map; decoding: greedy reverse decoding. Units (one per test image, in test
    order, for every variant): ``cc_<task>``, the chance-corrected per-image score."""
    import torch

    from ...blocks.masked_token_transformer import decode_greedy

    lay = _layout(d)
    bias = torch.tensor(lay.logit_bias())
    bt, it = _detokenizers(d)
    te = d["test"]
    n = len(te)
    nq = len(D.QUESTIONS)
    out, units, gen, per = {}, {}, {}, {}
    for task, (x, t) in _eval_sets(d, lay, "test", tasks).items():
        x_t, t_t = torch.tensor(x), torch.tensor(t)
        if task.endswith("2brain"):
            pred = expected_brain_map(model, x_t, t_t, bias, d, lay)
            per[task] = T.pattern_correlation(pred, d["fmri"][te])
            out[f"voxel_r_{task}"] = T.voxel_correlation(pred.reshape(n, -1), d["fmri"][te].reshape(n, -1))
            continue
        y = decode_greedy(model, x_t, t_t, steps, bias).numpy()
        gen[task] = y
        if task in ("brain2img", "brain2imgtxt"):
            rec = it(y[:, lay.span["image"]] - lay.offset["image"])
            ident = T.identification_per_image(rec, d["images"][te])
            out[f"id_acc_{task}"] = float(ident.mean())
            out[f"pixel_r_{task}"] = T.pixel_correlation(rec, d["images"][te])
        if task in ("brain2txt", "brain2imgtxt"):
            words = (y[:, lay.span["text"]] - lay.offset["text"]) == d["caption"][te]
            out[f"word_acc_{task}"] = float(words.mean())
            out[f"digit_acc_{task}"] = float(words[:, 0].mean())
        if task == "brain2img":
            per[task] = ident
        elif task == "brain2txt":
            per[task] = words.mean(1)
        elif task == "brain2imgtxt":
            per[task] = 0.5 * (ident + words.mean(1))
        elif task == "bqa":
            ans = y[:, lay.span["answer"]][:, 0] - lay.offset["answer"]
            truth = d["answers"][np.repeat(te, nq), np.tile(np.arange(nq), n)]
            per[task] = (ans == truth).reshape(n, nq).mean(1)
    for task in tasks:
        out[f"score_{task}"] = float(per[task].mean())
        units[f"cc_{task}"] = [T.chance_corrected(task, float(v)) for v in per[task]]
    return out, units, gen


def train(ctx) -> None:
    _with_math_attention(ctx, lambda: _train(ctx))


def _with_math_attention(ctx, fn) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.set_num_threads(max(1, ctx.threads))
    # torch's plain (math) attention kernel: at 25 tokens and 4 heads it is cheaper on CPU than the
    # flash kernel torch picks by default (the same attention up to float rounding; README, budget)
    with sdpa_kernel(SDPBackend.MATH):
        fn()


def _train(ctx) -> None:
    from ...blocks.fitting import log_fit

    p, d = ctx.params, load_shared(ctx.shared_dir)
    cfg, fit = p["model"], p["fit"]
    groups, per_task = variant_plan(ctx.variant, cfg["batch_per_task"], p.get("baseline_tasks"))
    scalars, units, gens = {}, {}, {}
    for g in groups:
        label = "joint" if len(g) > 1 else g[0]
        if len(g) > 1:       # joint and joint_planted: the shared joint model of this seed
            model, rec = _load_joint(d, cfg, ctx.shared_dir)
        else:
            model, rec = train_model(d, g, per_task, cfg, fit, ctx.seed, label, ctx.progress)
        # the gate's curves: val_<label> (mean CE over the model's tasks), val_<label>_<task>, lr_<label>
        log_fit(ctx.metrics, label, rec)
        ctx.metrics.scalar(f"examples_per_task_{label}", rec["stop"] * per_task)
        steps = rec["steps"]
        for k in g:      # per task, for the plot
            ctx.metrics.curve(f"val_loss_{k}", steps, rec["curves"][k] if len(g) > 1 else rec["vals"])
        # training loss: the chosen run's mean over each evaluation interval
        every = int(fit["eval_every"])
        ctx.metrics.curve(f"train_{label}", steps[1:], [float(np.mean(rec["losses"][a - every:a])) for a in steps[1:]])
        s, u, gen = evaluate(model, d, g, p["decode_steps"])
        if ctx.variant == "joint_planted":
            u = _planted_units(ctx, model, d, g, u, p)
        scalars.update(s)
        units.update(u)
        gens.update(gen)
    ctx.metrics.scalar("batch_size", per_task * len(groups[0]))
    for k, v in scalars.items():
        ctx.metrics.scalar(k, v)
    for k, v in units.items():
        ctx.metrics.units(k, v)          # also records the scalar k (the mean)
    if ctx.seed == min(p["seeds"]):
        _record_examples(ctx, d, gens)


def _planted_units(ctx, model, d, tasks, units, p) -> dict:
    """joint_planted: the joint model's per-image units with the planted deficit ``planted_deficit``
    (config) on every task (``plant_deficit``: test images scored on broken brain-stimulus pairs until
    the mean has fallen by it). Records the fraction and the realised deficit per task."""
    deficit = float(p["planted_deficit"])
    _, swapped, _ = evaluate(model, shuffled_pairing(d, ctx.seed, ("test",)), tasks, p["decode_steps"])
    rng = np.random.default_rng(ctx.seed + 2027)
    out = {}
    for k in sorted(units):
        out[k], f = plant_deficit(units[k], swapped[k], deficit, rng)
        ctx.metrics.scalar(f"planted_fraction_{k}", f)
        ctx.metrics.scalar(f"planted_deficit_{k}", float(np.mean(units[k]) - np.mean(out[k])))
        ctx.metrics.scalar(f"swapped_{k}", float(np.mean(swapped[k])))
    return out


def _record_examples(ctx, d, gens) -> None:
    """A few test digits, as curves over pixel / voxel / word index, for the reconstruction plot."""
    lay = _layout(d)
    bt, it = _detokenizers(d)
    te = d["test"][:N_EXAMPLES]
    for k in range(len(te)):
        if "brain2img" in gens:
            img = it(gens["brain2img"][k:k + 1, lay.span["image"]] - lay.offset["image"])[0]
            ctx.metrics.curve(f"example{k}_brain2img", range(64), img.ravel())
        if "brain2txt" in gens:
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
