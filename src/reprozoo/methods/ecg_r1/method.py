"""ECG-R1 in miniature: SFT on protocol reports, evidence-reward RL, interleaved modality dropout.

Stages
* train_shared (per seed): simulate the records with neurokit2 (data.py), measure them with the
  protocol (protocol.py: delineation -> features -> six-statement report), draw noisy
  observations (``views_train`` per training record, ``views_test`` per validation / test record)
  and render each as an image. Cached in ``shared_dir/data.npz``; every variant of the seed reads
  the same arrays. Besides the seed's training records (stage 1 only), three sets the same for
  every seed, simulated once per run: validation set A and the test records (EVAL_SEED), and
  stage 2's own records (STAGE2_SEED): validation set B and the stage-2 pool, which stage 1 never
  sees (the paper's separate RL set).
* train (per variant x seed): stage 1, teacher-forced SFT on the seed's training records by
  blocks.fitting.fit_to_plateau (``fit1``: the variant's rate from the ``lr`` table, chosen once on
  validation from ``fit1.lr_grid``; to a plateau of the validation evidence reward, the
  best-validation EMA weights kept; no rate drop), validated on set A. Stage 2, SFT continued on the
  stage-2 pool's protocol reports (``rl_batch`` ECGs per update; ``fit2``, table ``lr2``), validated on
  set B: every variant; it ends sft_only. Stage 3, the RL variants only: GRPO with the evidence
  reward on the same pool from stage 2's model (``rl_batch`` ECGs x ``group`` samples, no KL, as the
  paper's run; ``fit3``, table ``lr3``, at least 300 steps), validated on set B. ecg_r1 and sft_only
  share stages 1 and 2 exactly (``shared_stage``), so the RL claim's arms differ by stage 3 alone.
  Each stage runs to B's (A's) plateau and keeps its best-validation weights (stages 2-3 from step
  ``eval_every`` on: never the unchanged start). Evaluation decodes
  greedily on the held-out records with both modalities, the signal only and the image only.
  The validation and test records (EVAL_SEED) are simulated once per run (cached_eval_arrays).

Variants (same data, stage rules, batch, width and optimiser for all)
    ecg_r1         both modalities, interleaved modality dropout, SFT -> SFT on the pool -> RL
    sft_only       ecg_r1 without its RL stage (stages 1 and 2 shared)
    rl_no_dropout  both modalities always present, SFT -> SFT on the pool -> RL
    signal_only    signal encoder only, SFT -> SFT on the pool -> RL
    image_only     image encoder only, SFT -> SFT on the pool -> RL

Metrics (test records, one unit per record via ctx.metrics.units; fractions in [0, 1])
    dx_acc              diagnosis equals the protocol's diagnosis
    dx_chance           the majority training diagnosis would be right (the chance level)
    halluc_rate         statements (5 evidence + diagnosis) contradicted by the grounded check
                        (protocol.grounded: the generator's own values, no delineation; the
                        reward reads neurokit2's measurement)
    evidence_precision  grounded evidence statements / evidence statements
    halluc_rate_reward  statements not stated exactly as the protocol's (what the reward credits)
    consistency         diagnosis follows from the report's own cited rate and regularity
    reward              the paper's evidence reward of the greedy report (protocol.evidence_reward)
    img_extra_info      1 if the record's image is not the rendering of the signal the model is
                        given (information the signal lacks; 0 by construction here, recorded
                        so the page can show it, read by no claim)
    *_sig, *_img        the same with only the signal / only the image given to the model
"""
from __future__ import annotations

import numpy as np

from ...blocks.rate_table import stamp_source
from . import data as D
from . import protocol as P

VARIANTS = ("ecg_r1", "sft_only", "rl_no_dropout", "signal_only", "image_only")
SETUP = {  # variant -> (modalities given in training, modality dropout, last stage: "rl" = stage 3)
    "ecg_r1": ("both", True, "rl"),
    "sft_only": ("both", True, "sft"),
    "rl_no_dropout": ("both", False, "rl"),
    "signal_only": ("signal", False, "rl"),
    "image_only": ("image", False, "rl"),
}
GENERIC_CURVES: list[str] = []   # plot() draws the training curves with seed bands itself


# --- data ------------------------------------------------------------------------------------

EVAL_SEED = 20_260_204       # validation and test records: the same for every seed (seeds vary training)


def _source_hash(*names: str) -> str:
    """sha256 of this folder's source files, read once at import: the code that is running."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).parent
    return hashlib.sha256(b"".join((here / f).read_bytes() for f in names)).hexdigest()


_STAGE_SRC = _source_hash("model.py", "method.py")                 # keys the shared SFT stage


def simulate_records(n: int, rng: np.random.Generator, progress=print) -> list[dict]:
    """n records with successful delineation: params, clean signal, features, protocol report and
    the grounded check's reference (protocol.ground_truth)."""
    out, tries = [], 0
    while len(out) < n:
        tries += 1
        p = D.sample_params(rng)
        clean = D.simulate_clean(p)
        feat = P.measure(clean, D.FS_SIM)
        if feat is not None:
            out.append({"params": p, "clean": clean, "feat": feat, "report": P.protocol_report(feat),
                        "ref": P.ground_truth(p)})
    progress(f"{n} records simulated ({tries - n} resampled after failed delineation)")
    return out


def make_views(records: list[dict], views: int, rng: np.random.Generator, noise_mv) -> dict:
    sig = np.stack([D.observe(r["clean"], rng, noise_mv) for r in records for _ in range(views)])
    img = np.stack([D.render_image(s) for s in sig])
    rep = np.stack([r["report"] for r in records for _ in range(views)])
    feat = np.array([[r["feat"][k] for k in P.FEATURES] for r in records for _ in range(views)])
    ref = np.stack([r["ref"] for r in records for _ in range(views)])
    return {"sig": sig, "img": img, "report": rep, "feat": feat, "ref": ref}


def eval_arrays(p: dict, progress=print) -> dict:
    """Validation and test arrays from EVAL_SEED: records, then their views, in that order."""
    eval_rng = np.random.default_rng(EVAL_SEED)
    recs = {"val": simulate_records(p["n_val"], eval_rng, progress),
            "test": simulate_records(p["n_test"], eval_rng, progress)}
    arrays = {}
    for name, r in recs.items():
        for k, v in make_views(r, p["views_test"], eval_rng, tuple(p["noise_mv"])).items():
            arrays[f"{name}_{k}"] = v
    return arrays


def _eval_source() -> str:
    """sha256 of the code that simulates, measures and renders the evaluation records: data.py,
    protocol.py and this module's simulate_records / make_views / eval_arrays (not the training
    code, so a change to training does not simulate the 700 records again)."""
    import hashlib
    import inspect

    src = _source_hash("data.py", "protocol.py") + "".join(
        inspect.getsource(f) for f in (simulate_records, make_views, eval_arrays)) + str(EVAL_SEED)
    return hashlib.sha256(src.encode()).hexdigest()


_EVAL_SRC = _eval_source()           # keys the evaluation-record cache


def _eval_cache_key(p: dict) -> str:
    """What the evaluation arrays depend on: their sizes, the noise, EVAL_SEED, the code that
    simulates, measures and renders them, and neurokit2's version."""
    import hashlib
    import json

    import neurokit2 as nk

    key = json.dumps([EVAL_SEED, p["n_val"], p["n_test"], p["views_test"], list(p["noise_mv"]),
                      nk.__version__, _EVAL_SRC])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _cached_arrays(cache_dir, stem: str, key: str, build, what: str, progress=print) -> dict:
    """build() -> arrays, computed once per run for all seeds: the first seed's train_shared writes
    them next to the per-seed folders (under a lock, atomically) and the others read them."""
    import fcntl
    import os
    from pathlib import Path

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{stem}_{key}.npz"
    with open(cache_dir / f".{stem}_{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                # a second seed waits here (no CPU) ...
        if path.exists():                                # ... and reads what the first wrote
            try:
                with np.load(path) as z:
                    arrays = {k: z[k] for k in z.files}
                progress(f"{what} read from {path.name}")
                return arrays
            except Exception:                            # a damaged cache: simulate again
                pass
        arrays = build()
        tmp = cache_dir / f".{stem}_{key}.{os.getpid()}.npz"
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
        return arrays


def cached_eval_arrays(p: dict, cache_dir, progress=print) -> dict:
    """eval_arrays, simulated once per run for all seeds: the validation (A) and test records are the
    same for every seed (EVAL_SEED). Keyed by _eval_cache_key, so a changed size, noise or
    simulation code simulates afresh."""
    return _cached_arrays(cache_dir, "eval_records", _eval_cache_key(p), lambda: eval_arrays(p, progress),
                          "validation and test records", progress)


# --- stage 2's own records: records stage 1 never saw (the paper's separate RL set) -------------

STAGE2_SEED = EVAL_SEED + 1   # validation set B and the stage-2 pool: the same for every seed


def stage2_arrays(p: dict, progress=print) -> dict:
    """Stage 2's records, from STAGE2_SEED: ``valb`` (validation set B, ``n_val_b`` records x
    ``views_test``: stage 2's pilots, stop and kept weights read it; stage 1 never sees it) and
    ``pool`` (``n_rl`` records x ``views_rl``: what stage 2 trains on, RL on their rewards and the SFT
    continuation on their protocol reports; stage 1 never sees them), in that order."""
    rng = np.random.default_rng(STAGE2_SEED)
    recs = {"valb": (simulate_records(p["n_val_b"], rng, progress), p["views_test"]),
            "pool": (simulate_records(p["n_rl"], rng, progress), p["views_rl"])}
    arrays = {}
    for name, (r, views) in recs.items():
        for k, v in make_views(r, views, rng, tuple(p["noise_mv"])).items():
            arrays[f"{name}_{k}"] = v
    return arrays


def _stage2_source() -> str:
    import inspect

    return _EVAL_SRC + inspect.getsource(stage2_arrays) + str(STAGE2_SEED)


_STAGE2_SRC = _stage2_source()       # keys the stage-2 record cache (read once, at import)


def _stage2_cache_key(p: dict) -> str:
    """What the stage-2 records depend on: their sizes, the noise, STAGE2_SEED, the simulation code
    and neurokit2's version."""
    import hashlib
    import json

    import neurokit2 as nk

    key = json.dumps([STAGE2_SEED, p["n_val_b"], p["n_rl"], p["views_test"], p["views_rl"],
                      list(p["noise_mv"]), nk.__version__, _STAGE2_SRC])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def cached_stage2_arrays(p: dict, cache_dir, progress=print) -> dict:
    """stage2_arrays, simulated once per run for all seeds (as cached_eval_arrays)."""
    return _cached_arrays(cache_dir, "stage2_records", _stage2_cache_key(p), lambda: stage2_arrays(p, progress),
                          "validation-B and stage-2 pool records", progress)


def train_shared(ctx) -> None:
    """Training records (stage 1) from the seed's stream; validation set A and test records from
    EVAL_SEED, so every seed is scored on the same records and per-record units pair across seeds
    and variants; validation set B and the stage-2 pool from STAGE2_SEED (all three simulated once
    per run: cached_eval_arrays, cached_stage2_arrays)."""
    p = ctx.params
    rng = ctx.rng(0)
    arrays = {}
    recs = simulate_records(p["n_train"], rng, ctx.progress)
    for k, v in make_views(recs, p["views_train"], rng, tuple(p["noise_mv"])).items():
        arrays[f"train_{k}"] = v
    arrays.update(cached_eval_arrays(p, ctx.shared_dir.parent, ctx.progress))
    arrays.update(cached_stage2_arrays(p, ctx.shared_dir.parent, ctx.progress))
    np.savez_compressed(ctx.shared_dir / "data.npz", **arrays)


# --- training --------------------------------------------------------------------------------

def _masks(setup: str, n: int):
    return (np.full(n, float(setup != "image"), np.float32), np.full(n, float(setup != "signal"), np.float32))


def evaluate(model, arr: dict, m_sig, m_img) -> dict:
    """Greedy reports of one split, scored per observation: the grounded check against the generator
    (claims) and the reward's own scorer (``*_reward``: statements not stated exactly as the protocol
    report, what RL optimised; reported, never claimed)."""
    import torch

    with torch.no_grad():
        z = model.encode(torch.from_numpy(arr["sig"]), torch.from_numpy(arr["img"]),
                         torch.from_numpy(m_sig), torch.from_numpy(m_img))
        rep = model.generate(z, greedy=True)[0].numpy()
    ok = P.exact(rep, arr["report"])
    g = P.grounded(rep, arr["ref"])
    return {"dx_acc": (rep[:, -1] == arr["report"][:, -1]).astype(float),
            "halluc_rate": 1.0 - g.mean(axis=1), "evidence_precision": g[:, :-1].mean(axis=1),
            "halluc_rate_reward": 1.0 - ok.mean(axis=1), "consistency": P.consistent(rep).astype(float),
            "reward": P.evidence_reward(rep, arr["report"]), "_reports": rep}


def per_record(values: np.ndarray, views: int) -> np.ndarray:
    """Observation values (records x views, record-major) -> one value per record (view mean)."""
    return np.asarray(values, float).reshape(-1, views).mean(axis=1)


def stage_losses(tr: dict, va: dict, setup: str, use_dropout: bool, objective: str, p: dict, batch: int):
    """A stage's (train_loss, val_loss) for blocks.fitting.fit_to_plateau; both stages validate alike.

    train_loss(model, gen): one RL step's GRPO surrogate (``objective`` "rl": ``batch`` ECGs x ``group``
    sampled reports) or one SFT minibatch's cross-entropy (``objective`` "sft": ``batch`` ECGs with
    their protocol reports; stage 1 of every variant with ``batch``, and sft_only's stage 2 with
    ``rl_batch``, as many ECGs per update as an RL step); the batch, the dropout masks and the policy
    samples all come from ``gen``, so every rate of a grid sees the same draws.
    ``train_loss.log`` (RL only): one (mean sampled reward, fraction of groups whose ``group`` samples
    all score the same) per call, in call order.
    val_loss(model): {"neg_reward": minus the mean evidence reward of the greedy validation
    reports (what the stop and the kept weights follow), "ce": the validation cross-entropy}."""
    import torch

    from .model import dropout_masks, group_policy_loss

    T = {k: torch.from_numpy(tr[k]) for k in ("sig", "img", "report")}
    n = len(tr["report"])

    def masks(b, gen):
        if setup == "both" and use_dropout:
            r = np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            ms, mi = dropout_masks(b, p["p_drop"], r)
        else:
            ms, mi = _masks(setup, b)
        return torch.from_numpy(ms), torch.from_numpy(mi)

    def rl_loss(model, gen):
        g, b = p["group"], batch
        idx = torch.randint(0, n, (b,), generator=gen)
        zb = model.encode(T["sig"][idx], T["img"][idx], *masks(b, gen)).repeat_interleave(g, 0)
        rep, logp = model.generate(zb, greedy=False, gen=gen)
        reward = P.evidence_reward(rep.numpy(), T["report"][idx].repeat_interleave(g, 0).numpy())
        spread = reward.reshape(-1, g).std(axis=1)
        rl_loss.log.append((float(reward.mean()), float((spread <= 1e-6).mean())))
        return group_policy_loss(logp, torch.from_numpy(reward).float(), g)

    rl_loss.log = []    # per call: (mean sampled reward, fraction of groups without reward spread)

    def sft_loss(model, gen):
        b = batch
        idx = torch.randint(0, n, (b,), generator=gen)
        return model.sft_loss(model.encode(T["sig"][idx], T["img"][idx], *masks(b, gen)), T["report"][idx])

    vm = tuple(map(torch.from_numpy, _masks(setup, len(va["report"]))))
    V = {k: torch.from_numpy(va[k]) for k in ("sig", "img", "report")}

    def val_loss(model):
        with torch.no_grad():
            zv = model.encode(V["sig"], V["img"], *vm)
            ce = float(model.sft_loss(zv, V["report"]))
            rep = model.generate(zv, greedy=True)[0].numpy()
        return {"neg_reward": -float(P.evidence_reward(rep, va["report"]).mean()), "ce": ce}

    return (rl_loss if objective == "rl" else sft_loss), val_loss


def shared_stage(shared_dir, key: dict, run, stem: str = "stage1"):
    """run() -> a dict of tensors and lists, computed once per ``key`` in ``shared_dir`` (the seed's
    folder, file ``<stem>_<tag>.pt``) and loaded by any later cell with the same key (under a lock; written atomically). The
    key adds the data file's identity and the source of model.py and method.py, so changed code or
    data trains afresh."""
    import fcntl
    import hashlib
    import json
    import os
    from pathlib import Path

    import torch

    st = (Path(shared_dir) / "data.npz").stat()
    tag = hashlib.sha256(json.dumps([key, st.st_size, st.st_mtime_ns, _STAGE_SRC],
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(shared_dir) / f"{stem}_{tag}.pt"
    with open(Path(shared_dir) / f".{stem}_{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            try:
                return torch.load(path, weights_only=False)
            except Exception:                            # a damaged file: train again
                pass
        out = run()
        tmp = Path(shared_dir) / f".{stem}_{tag}.{os.getpid()}.pt"
        torch.save(out, tmp)
        os.replace(tmp, path)
        return out


def stage1_fit(p: dict, variant: str) -> tuple[dict, dict]:
    """Stage 1's fit config for blocks.fitting.fit_to_plateau: ``fit1`` with the variant's rate from
    the ``lr`` table (blocks.rate_table: chosen once on validation, one seed, from ``fit1.lr_grid``;
    without a table the grid is piloted), stopping on and keeping the validation evidence reward,
    as stage 2 does. Returns (fit config, rate record)."""
    from ...blocks.rate_table import fit_with_table_rate

    fit, src = fit_with_table_rate(p["fit1"], p.get("lr"), variant)
    return {"select": "neg_reward", "stop_on": ["neg_reward"], **fit}, src


def later_fit(p: dict, variant: str, stage: int) -> tuple[dict, dict]:
    """Stage 2's (``fit2``, table ``lr2``: SFT continued on the stage-2 pool) or stage 3's (``fit3``,
    table ``lr3``: GRPO on the pool) fit config for blocks.fitting.fit_to_plateau: the variant's rate
    from the table (chosen once on seed 0's validation set B, each rate of the grid run in full:
    ``pilot_stage2``), without a table the grid piloted in the fit; stopping on and keeping set B's
    evidence reward, weights kept from step ``eval_every`` on (never the unchanged start)."""
    from ...blocks.rate_table import fit_with_table_rate

    name, table = {2: ("fit2", "lr2"), 3: ("fit3", "lr3")}[stage]
    fit, src = fit_with_table_rate(p[name], p.get(table), variant, where=table)
    return {"select": "neg_reward", "stop_on": ["neg_reward"], "keep_from": int(p[name]["eval_every"]), **fit}, src


def load_splits(shared_dir) -> dict:
    z = np.load(shared_dir / "data.npz")
    keys = ("sig", "img", "report", "feat", "ref")
    return {s: {k: z[f"{s}_{k}"] for k in keys} for s in ("train", "val", "valb", "pool", "test")}


def run_stage1(p: dict, variant: str, seed: int, shared_dir, split: dict, progress=print):
    """Stage 1, SFT on the seed's training records (every variant): blocks.fitting.fit_to_plateau at
    the variant's table rate, validated on set A's evidence reward of the EMA weights' greedy reports;
    the best-validation average is handed on. ecg_r1 and sft_only share it exactly (shared_stage:
    the first cell trains it, the other loads it). Returns (model, record, rate record, cache key)."""
    from ...blocks.fitting import fit_to_plateau
    from .model import ReportModel

    setup, use_dropout, _ = SETUP[variant]
    fit1, src1 = stage1_fit(p, variant)
    train1, val_loss1 = stage_losses(split["train"], split["val"], setup, use_dropout, "sft", p, p["batch"])

    def sft_stage():
        def build(gen):
            import torch
            torch.manual_seed(seed)                    # the same initial weights for every rate
            return ReportModel(p["width"])
        m, r = fit_to_plateau(build, train1, val_loss1, fit1, seed, label=f"{variant} stage 1 (sft)",
                              progress=progress)
        return {"state": m.state_dict(), "rec": r}

    key = {"setup": setup, "dropout": use_dropout, "seed": seed, "fit1": fit1,
           **{k: p[k] for k in ("batch", "width", "p_drop")}}
    done = shared_stage(shared_dir, key, sft_stage)
    model = ReportModel(p["width"])
    model.load_state_dict(done["state"])
    return model, done["rec"], src1, key


def run_stage2(p: dict, variant: str, seed: int, shared_dir, split: dict, start, key1: dict, fit2: dict,
               progress=print):
    """Stage 2, SFT continued on the stage-2 pool's protocol reports (every variant), ``rl_batch`` ECGs
    per update, from stage 1's model, validated on set B: the supervised use of the pool's labels, to
    a plateau of B's reward, the best-validation average kept. It ends sft_only; the RL variants start
    stage 3 from it. ecg_r1 and sft_only share it exactly (shared_stage, stem ``stage2``), so the RL
    claim's two arms differ by the RL stage alone. Returns (model, record)."""
    import copy

    from ...blocks.fitting import fit_to_plateau
    from .model import ReportModel

    setup, use_dropout, _ = SETUP[variant]
    train2, val2 = stage_losses(split["pool"], split["valb"], setup, use_dropout, "sft", p, p["rl_batch"])

    def sft2_stage():
        m, r = fit_to_plateau(lambda gen: copy.deepcopy(start), train2, val2, fit2, seed,
                              label=f"{variant} stage 2 (sft on the pool)", progress=progress)
        return {"state": m.state_dict(), "rec": r}

    done = shared_stage(shared_dir, {**key1, "fit2": fit2, "rl_batch": p["rl_batch"]}, sft2_stage, stem="stage2")
    model = ReportModel(p["width"])
    model.load_state_dict(done["state"])
    return model, done["rec"]


def run_stage3(p: dict, variant: str, seed: int, split: dict, start, fit3: dict, progress=print):
    """Stage 3 (RL variants), GRPO with the evidence reward on the stage-2 pool from stage 2's model,
    validated on set B, as the paper's run (``rl_batch`` ECGs x ``group`` samples, no KL, dynamic
    sampling). Returns (model, record, the RL log of stage_losses)."""
    import copy

    from ...blocks.fitting import fit_to_plateau

    setup, use_dropout, _ = SETUP[variant]
    train3, val3 = stage_losses(split["pool"], split["valb"], setup, use_dropout, "rl", p, p["rl_batch"])
    model, rec = fit_to_plateau(lambda gen: copy.deepcopy(start), train3, val3, fit3, seed,
                                label=f"{variant} stage 3 (rl)", progress=progress)
    return model, rec, train3.log


def train(ctx) -> None:
    p = ctx.params
    setup, use_dropout, last = SETUP[ctx.variant]
    split = load_splits(ctx.shared_dir)
    tr = split["train"]
    curves = {k: ([], []) for k in ("val_loss", "val_reward")}

    def add(name, step, value):
        curves[name][0].append(step)
        curves[name][1].append(float(value))

    def log_curves(tag, rec, offset, skip_first):
        xs = [offset + s for s in rec["steps"]]
        reward = [-v for v in rec["vals"]]
        ctx.metrics.curve(f"{tag}_val_reward", xs, reward)
        ctx.metrics.curve(f"lr_{tag}", xs, rec["lrs"])
        ctx.metrics.curve(f"{tag}_val_ce", xs, rec["curves"]["ce"])
        k = 1 if skip_first else 0                      # a stage's step 0 is the previous stage's end
        for x, r, c in zip(xs[k:], reward[k:], rec["curves"]["ce"][k:]):
            add("val_loss", x, c)
            add("val_reward", x, r)

    # stage 1, SFT on the seed's training records (every variant; validation set A)
    model, rec1, src1, key1 = run_stage1(p, ctx.variant, ctx.seed, ctx.shared_dir, split, ctx.progress)
    log_curves("s1", rec1, 0, False)
    _log_stage(ctx, "s1", rec1, stamp_source(rec1, src1)["lr_edge"])
    ctx.metrics.scalar("lr_from_table_s1", float(src1["lr_source"] == "table"))

    # What stage 1 memorised: the SFT model's greedy reward on its own training observations against
    # the stage-2 pool it never saw (the gap says how much the pool can still teach).
    for name, arr in (("s1_train", tr), ("s2_pool", split["pool"])):
        res = evaluate(model, arr, *_masks(setup, len(arr["report"])))
        ctx.metrics.scalar(f"sft_greedy_reward_{name}", float(res["reward"].mean()))

    # stage 2, SFT continued on the stage-2 pool (records stage 1 never saw; every variant; validation
    # set B): the pool's labels used by supervision, to B's plateau. sft_only ends here; ecg_r1 shares
    # it exactly, so the RL claim's two arms differ by stage 3 alone.
    fit2, src2 = later_fit(p, ctx.variant, 2)
    model, rec2 = run_stage2(p, ctx.variant, ctx.seed, ctx.shared_dir, split, model, key1, fit2, ctx.progress)
    off2 = rec1["stop"]
    log_curves("s2", rec2, off2, True)
    _log_stage(ctx, "s2", rec2, stamp_source(rec2, src2)["lr_edge"],
               fit2["keep_from"])
    ctx.metrics.scalar("sft2_greedy_reward_s2_pool",
                       float(evaluate(model, split["pool"], *_masks(setup, len(split["pool"]["report"])))
                             ["reward"].mean()))
    stops = [rec1["stop"], rec2["stop"]]
    msg = (f"stage 1 lr {rec1['lr']:g}, {rec1['stop']} steps, best val reward {-min(rec1['vals']):.3f}; "
           f"stage 2 (sft) lr {rec2['lr']:g}, {rec2['stop']} steps, best val reward {-min(rec2['vals']):.3f}")

    # stage 3 (RL variants), GRPO with the evidence reward on the same pool from stage 2's model,
    # validated on set B; the gate reads exactly the curve its stop tested.
    if last == "rl":
        fit3, src3 = later_fit(p, ctx.variant, 3)
        model, rec3, log = run_stage3(p, ctx.variant, ctx.seed, split, model, fit3, ctx.progress)
        off3 = off2 + rec2["stop"]
        _log_rl_training(ctx, log, rec3, fit3, off3)
        log_curves("s3", rec3, off3, True)
        _log_stage(ctx, "s3", rec3, stamp_source(rec3, src3)["lr_edge"],
                   fit3["keep_from"])
        for lr, score in rec3["pilot_best"].items():
            ctx.metrics.scalar(f"pilot_reward_s3_lr{lr:g}", -score)
        stops.append(rec3["stop"])
        msg += f"; stage 3 (rl) lr {rec3['lr']:g}, {rec3['stop']} steps, best val reward {-min(rec3['vals']):.3f}"
    ctx.metrics.scalar("updates", sum(stops))
    ctx.progress(msg)
    for name, (xs, ys) in curves.items():
        if xs:
            ctx.metrics.curve(name, xs, ys)

    te = split["test"]
    nt, views = len(te["report"]), p["views_test"]
    # chance: the majority training diagnosis, scored per test record like dx_acc
    majority = np.bincount(tr["report"][:, -1], minlength=len(P.DX)).argmax()
    ctx.metrics.units("dx_chance", per_record(te["report"][:, -1] == majority, views))
    # does the image carry information the signal lacks? 1 where it is not the rendering of the very
    # signal the model is given (make_views renders it from that signal: 0 for every record)
    extra = np.array([not np.array_equal(D.render_image(s), im) for s, im in zip(te["sig"], te["img"])], float)
    ctx.metrics.units("img_extra_info", per_record(extra, views))
    modes = {"": _masks(setup, nt)}
    if setup == "both":
        modes["_sig"] = _masks("signal", nt)
        modes["_img"] = _masks("image", nt)
    for suffix, masks in modes.items():
        res = evaluate(model, te, *masks)
        for k, v in res.items():
            if not k.startswith("_"):
                ctx.metrics.units(k + suffix, per_record(v, views))   # one unit per test record
        if suffix == "":
            reports = res["_reports"]
    # one example for the figure: the first test record (same record for every variant and seed)
    for j in range(P.N_STATEMENTS):
        ctx.metrics.scalar(f"ex_report_{j}", reports[0, j])
        ctx.metrics.scalar(f"ex_truth_{j}", te["report"][0, j])
        ctx.metrics.scalar(f"ex_ref_{j}", te["ref"][0, j])
    for k, v in zip(P.FEATURES, te["feat"][0]):
        ctx.metrics.scalar(f"ex_feat_{k}", v)
    ctx.metrics.curve("ex_signal", np.arange(te["sig"].shape[1]) / D.FS_MODEL, te["sig"][0])


def rl_run_log(log: list, rec: dict, fit2: dict) -> list:
    """The chosen run's entries of stage_losses' RL log: fit_to_plateau runs every rate's pilot in
    grid order (pilot_steps calls each), then continues the chosen one."""
    grid, n = [float(x) for x in fit2["lr_grid"]], int(fit2["pilot_steps"])
    k = grid.index(float(rec["lr"]))
    run = log[k * n:(k + 1) * n] + log[len(grid) * n:]
    assert len(run) == rec["stop"], (len(run), rec["stop"])
    return run


def _log_rl_training(ctx, log: list, rec: dict, fit2: dict, offset: int) -> None:
    """RL's training signal on the stage-2 pool: mean sampled reward and the fraction of GRPO groups
    without reward spread (dropped: no gradient), per eval window (curves) and at start / end."""
    run = np.asarray(rl_run_log(log, rec, fit2), float)
    w = int(fit2["eval_every"])
    ends = np.arange(w, len(run) + 1, w)
    ctx.metrics.curve("s3_train_reward", [offset + e for e in ends], [run[e - w:e, 0].mean() for e in ends])
    ctx.metrics.curve("s3_zero_spread", [offset + e for e in ends], [run[e - w:e, 1].mean() for e in ends])
    ctx.metrics.scalar("train_reward_s3_start", float(run[:w, 0].mean()))
    ctx.metrics.scalar("train_reward_s3_end", float(run[-w:, 0].mean()))
    ctx.metrics.scalar("zero_spread_s3_start", float(run[:w, 1].mean()))
    ctx.metrics.scalar("zero_spread_s3", float(run[:, 1].mean()))


def _log_stage(ctx, tag: str, rec: dict, edge, keep_from: int = 0) -> None:
    """Scalars of one fit_to_plateau stage: rate, steps, where its best validation point lies, whether
    it stopped on its plateau, the rate's grid edge and the drop's gain."""
    ctx.metrics.scalar(f"lr_chosen_{tag}", rec["lr"])
    ctx.metrics.scalar(f"steps_{tag}", rec["stop"])
    counted = [i for i, x in enumerate(rec["steps"]) if x >= keep_from]   # the points the kept weights came from
    ctx.metrics.scalar(f"best_step_{tag}", rec["steps"][min(counted, key=lambda i: rec["vals"][i])])
    ctx.metrics.scalar(f"plateau_{tag}", float(bool(rec["plateau"])))
    ctx.metrics.scalar(f"lr_edge_{tag}", {"top": 1.0, "bottom": -1.0}.get(edge, 0.0))
    if rec["drop_gain"] is not None:
        ctx.metrics.scalar(f"drop_gain_{tag}", rec["drop_gain"])


# --- plots -----------------------------------------------------------------------------------

def plot(table, plots_dir, params) -> None:
    from .plots import plot_all

    plot_all(table, plots_dir, VARIANTS)
