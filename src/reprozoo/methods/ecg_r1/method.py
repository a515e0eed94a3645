"""ECG-R1 in miniature: SFT on protocol reports, evidence-reward RL, interleaved modality dropout.

Stages
* train_shared (per seed): simulate the records with neurokit2 (data.py), measure them with the
  protocol (protocol.py: delineation -> features -> six-statement report), draw noisy
  observations (``views_train`` per training record, ``views_test`` per test record) and render
  each as an image. Cached in ``shared_dir/data.npz``; every variant of the seed reads the same
  arrays.
* train (per variant x seed): ``sft_steps`` of teacher-forced SFT, then ``rl_steps`` of a second
  stage: group policy gradient with the evidence reward (RL variants) or more SFT (sft_only, so
  both arms get the same number of updates on the same data). Evaluation decodes greedily on the
  held-out records with both modalities, the signal only and the image only.

Variants (same data, steps, batch, width and optimiser for all)
    ecg_r1         both modalities, interleaved modality dropout, SFT -> evidence-reward RL
    sft_only       both modalities, the same dropout, SFT for sft_steps + rl_steps
    rl_no_dropout  both modalities always present, SFT -> RL
    signal_only    signal encoder only, SFT -> RL
    image_only     image encoder only, SFT -> RL

Metrics (test records, one unit per record via ctx.metrics.units; fractions in [0, 1])
    dx_acc              diagnosis equals the protocol's diagnosis
    dx_chance           the majority training diagnosis would be right (the chance level)
    halluc_rate         statements (5 evidence + diagnosis) contradicted by the grounded check
                        (protocol.grounded: simulator ground truth, independent of the reward)
    evidence_precision  grounded evidence statements / evidence statements
    halluc_rate_reward  the same by the reward's own scorer (protocol.supported): what RL optimised
    consistency         diagnosis follows from the report's own cited rate and regularity
    reward              the evidence reward of the greedy report
    *_sig, *_img        the same with only the signal / only the image given to the model
"""
from __future__ import annotations

import numpy as np

from . import data as D
from . import protocol as P

VARIANTS = ("ecg_r1", "sft_only", "rl_no_dropout", "signal_only", "image_only")
SETUP = {  # variant -> (modalities given in training, modality dropout, second stage)
    "ecg_r1": ("both", True, "rl"),
    "sft_only": ("both", True, "sft"),
    "rl_no_dropout": ("both", False, "rl"),
    "signal_only": ("signal", False, "rl"),
    "image_only": ("image", False, "rl"),
}
GENERIC_CURVES: list[str] = []   # plot() draws the training curves with seed bands itself


# --- data ------------------------------------------------------------------------------------

EVAL_SEED = 20_260_204       # validation and test records: the same for every seed (seeds vary training)


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
                        "ref": P.ground_truth(p, feat)})
    progress(f"{n} records simulated ({tries - n} resampled after failed delineation)")
    return out


def make_views(records: list[dict], views: int, rng: np.random.Generator, noise_mv) -> dict:
    sig = np.stack([D.observe(r["clean"], rng, noise_mv) for r in records for _ in range(views)])
    img = np.stack([D.render_image(s) for s in sig])
    rep = np.stack([r["report"] for r in records for _ in range(views)])
    feat = np.array([[r["feat"][k] for k in P.FEATURES] for r in records for _ in range(views)])
    ref = np.stack([r["ref"] for r in records for _ in range(views)])
    return {"sig": sig, "img": img, "report": rep, "feat": feat, "ref": ref}


def train_shared(ctx) -> None:
    """Training records from the seed's stream; validation and test records from EVAL_SEED, so every
    seed is scored on the same records and per-record units pair across seeds and variants."""
    p = ctx.params
    rng = ctx.rng(0)
    eval_rng = np.random.default_rng(EVAL_SEED)
    parts = {"train": (simulate_records(p["n_train"], rng, ctx.progress), p["views_train"], rng),
             "val": (simulate_records(p["n_val"], eval_rng, ctx.progress), p["views_test"], eval_rng),
             "test": (simulate_records(p["n_test"], eval_rng, ctx.progress), p["views_test"], eval_rng)}
    arrays = {}
    for name, (recs, views, r) in parts.items():
        for k, v in make_views(recs, views, r, tuple(p["noise_mv"])).items():
            arrays[f"{name}_{k}"] = v
    np.savez_compressed(ctx.shared_dir / "data.npz", **arrays)


# --- training --------------------------------------------------------------------------------

def _masks(setup: str, n: int):
    return (np.full(n, float(setup != "image"), np.float32), np.full(n, float(setup != "signal"), np.float32))


def per_variant(value, variant: str):
    """A config value, or a mapping {variant: value, default: value} chosen per variant."""
    return value.get(variant, value["default"]) if isinstance(value, dict) else value


def evaluate(model, arr: dict, m_sig, m_img) -> dict:
    """Greedy reports of one split, scored per observation: the grounded check (claims) and the
    reward's own scorer (``*_reward``: what RL optimised, reported, never claimed)."""
    import torch

    with torch.no_grad():
        z = model.encode(torch.from_numpy(arr["sig"]), torch.from_numpy(arr["img"]),
                         torch.from_numpy(m_sig), torch.from_numpy(m_img))
        rep = model.generate(z, greedy=True)[0].numpy()
    ok = P.supported(rep, arr["report"])
    g = P.grounded(rep, arr["ref"])
    return {"dx_acc": (rep[:, -1] == arr["report"][:, -1]).astype(float),
            "halluc_rate": 1.0 - g.mean(axis=1), "evidence_precision": g[:, :-1].mean(axis=1),
            "halluc_rate_reward": 1.0 - ok.mean(axis=1), "consistency": P.consistent(rep).astype(float),
            "reward": P.evidence_reward(rep, arr["report"]), "_reports": rep}


def per_record(values: np.ndarray, views: int) -> np.ndarray:
    """Observation values (records x views, record-major) -> one value per record (view mean)."""
    return np.asarray(values, float).reshape(-1, views).mean(axis=1)


def train(ctx) -> None:
    import torch

    from .model import ReportModel, dropout_masks, group_policy_loss

    p = ctx.params
    setup, use_dropout, stage2 = SETUP[ctx.variant]
    lr_sft, lr_rl = per_variant(p["lr"], ctx.variant), per_variant(p["lr_rl"], ctx.variant)
    z = np.load(ctx.shared_dir / "data.npz")
    keys = ("sig", "img", "report", "feat", "ref")
    split = {s: {k: z[f"{s}_{k}"] for k in keys} for s in ("train", "val", "test")}
    tr = split["train"]
    n = len(tr["report"])
    T = {k: torch.from_numpy(v) for k, v in tr.items() if k in ("sig", "img", "report")}

    torch.manual_seed(ctx.seed)
    rng = ctx.rng(1)                                   # batches and dropout masks
    gen = torch.Generator().manual_seed(ctx.seed)       # policy samples
    model = ReportModel(p["width"])

    def batch_masks(b):
        if setup == "both" and use_dropout:
            ms, mi = dropout_masks(b, p["p_drop"], rng)
        else:
            ms, mi = _masks(setup, b)
        return torch.from_numpy(ms), torch.from_numpy(mi)

    val_masks = _masks(setup, len(split["val"]["report"]))
    curves = {k: ([], []) for k in ("val_loss", "val_reward", "sft_val_loss", "rl_val_reward", "lr_sft", "lr_rl")}

    def add(name, step, value):
        curves[name][0].append(step)
        curves[name][1].append(float(value))

    def log_val(step, stage, lr):
        """Validation CE and reward at ``step``; the gate's curves per stage: the SFT stage's CE
        (the whole run for sft_only, whose second stage is SFT) and the RL stage's reward."""
        va = split["val"]
        with torch.no_grad():
            zv = model.encode(torch.from_numpy(va["sig"]), torch.from_numpy(va["img"]),
                              *map(torch.from_numpy, val_masks))
            ce = float(model.sft_loss(zv, torch.from_numpy(va["report"])))
        rew = float(evaluate(model, va, *val_masks)["reward"].mean())
        add("val_loss", step, ce)
        add("val_reward", step, rew)
        if stage == "sft":
            add("sft_val_loss", step, ce)
            add("lr_sft", step, lr)
        if stage == "rl":
            add("rl_val_reward", step, rew)
            add("lr_rl", step, lr)
        return ce, rew

    def sft_step(opt):
        idx = torch.from_numpy(rng.integers(n, size=p["batch"]))
        ms, mi = batch_masks(len(idx))
        loss = model.sft_loss(model.encode(T["sig"][idx], T["img"][idx], ms, mi), T["report"][idx])
        opt.zero_grad()
        loss.backward()
        opt.step()

    def rl_step(opt):
        g = p["group"]
        idx = torch.from_numpy(rng.integers(n, size=p["rl_batch"]))
        ms, mi = batch_masks(len(idx))
        zb = model.encode(T["sig"][idx], T["img"][idx], ms, mi).repeat_interleave(g, 0)
        rep, logp = model.generate(zb, greedy=False, gen=gen)
        reward = torch.from_numpy(P.evidence_reward(rep.numpy(), T["report"][idx].repeat_interleave(g, 0).numpy()))
        loss = group_policy_loss(logp, reward.float(), g)
        opt.zero_grad()
        loss.backward()
        opt.step()

    # constant learning rates (no schedule: the gate's lr floor holds by construction), recorded
    opt = torch.optim.Adam(model.parameters(), lr=lr_sft)
    total = p["sft_steps"] + p["rl_steps"]
    for step in range(p["sft_steps"]):
        if step % p["eval_every"] == 0:
            log_val(step, "sft", lr_sft)
        sft_step(opt)
    if stage2 == "rl":
        log_val(p["sft_steps"], "sft", lr_sft)          # the SFT stage's last point ...
        opt2 = torch.optim.Adam(model.parameters(), lr=lr_rl)
        for step in range(p["sft_steps"], total):
            if (step - p["sft_steps"]) % p["eval_every_rl"] == 0:
                log_val(step, "rl", lr_rl)               # ... and the RL stage's first
            rl_step(opt2)
        ce, rew = log_val(total, "rl", lr_rl)
    else:                                               # sft_only: plain continuation of the SFT run
        for step in range(p["sft_steps"], total):
            if step % p["eval_every"] == 0:
                log_val(step, "sft", lr_sft)
            sft_step(opt)
        ce, rew = log_val(total, "sft", lr_sft)
    ctx.progress(f"val CE {ce:.3f}, val reward {rew:.3f} (lr {lr_sft:g} / {lr_rl:g})")
    for name, (xs, ys) in curves.items():
        if xs:
            ctx.metrics.curve(name, xs, ys)

    te = split["test"]
    nt, views = len(te["report"]), p["views_test"]
    # chance: the majority training diagnosis, scored per test record like dx_acc
    majority = np.bincount(tr["report"][:, -1], minlength=len(P.DX)).argmax()
    ctx.metrics.units("dx_chance", per_record(te["report"][:, -1] == majority, views))
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


# --- plots -----------------------------------------------------------------------------------

def plot(table, plots_dir, params) -> None:
    from .plots import plot_all

    plot_all(table, plots_dir, VARIANTS, (params or {}).get("sft_steps"))
