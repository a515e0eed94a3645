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

Metrics (test records; fractions in [0, 1])
    dx_acc              diagnosis equals the protocol's diagnosis
    halluc_rate         statements (5 evidence + diagnosis) not supported by the measured features
    evidence_precision  supported evidence statements / evidence statements
    consistency         diagnosis follows from the report's own cited rate and regularity
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

def simulate_records(n: int, rng: np.random.Generator, progress=print) -> list[dict]:
    """n records with successful delineation: params, clean signal, features, protocol report."""
    out, tries = [], 0
    while len(out) < n:
        tries += 1
        p = D.sample_params(rng)
        clean = D.simulate_clean(p)
        feat = P.measure(clean, D.FS_SIM)
        if feat is not None:
            out.append({"params": p, "clean": clean, "feat": feat, "report": P.protocol_report(feat)})
    progress(f"{n} records simulated ({tries - n} resampled after failed delineation)")
    return out


def make_views(records: list[dict], views: int, rng: np.random.Generator, noise_mv) -> dict:
    sig = np.stack([D.observe(r["clean"], rng, noise_mv) for r in records for _ in range(views)])
    img = np.stack([D.render_image(s) for s in sig])
    rep = np.stack([r["report"] for r in records for _ in range(views)])
    feat = np.array([[r["feat"][k] for k in P.FEATURES] for r in records for _ in range(views)])
    return {"sig": sig, "img": img, "report": rep, "feat": feat}


def train_shared(ctx) -> None:
    p = ctx.params
    rng = ctx.rng(0)
    recs = simulate_records(p["n_train"] + p["n_val"] + p["n_test"], rng, ctx.progress)
    tr, va, te = np.split(np.arange(len(recs)), [p["n_train"], p["n_train"] + p["n_val"]])
    arrays = {}
    for name, idx, views in (("train", tr, p["views_train"]), ("val", va, p["views_test"]),
                             ("test", te, p["views_test"])):
        for k, v in make_views([recs[i] for i in idx], views, rng, tuple(p["noise_mv"])).items():
            arrays[f"{name}_{k}"] = v
    np.savez_compressed(ctx.shared_dir / "data.npz", **arrays)


# --- training --------------------------------------------------------------------------------

def _masks(setup: str, n: int):
    return (np.full(n, float(setup != "image"), np.float32), np.full(n, float(setup != "signal"), np.float32))


def evaluate(model, arr: dict, m_sig, m_img) -> dict:
    import torch

    with torch.no_grad():
        z = model.encode(torch.from_numpy(arr["sig"]), torch.from_numpy(arr["img"]),
                         torch.from_numpy(m_sig), torch.from_numpy(m_img))
        rep = model.generate(z, greedy=True)[0].numpy()
    ok = P.supported(rep, arr["report"])
    return {"dx_acc": ok[:, -1].mean(), "halluc_rate": 1.0 - ok.mean(),
            "evidence_precision": ok[:, :-1].mean(), "consistency": P.consistent(rep).mean(),
            "reward": P.evidence_reward(rep, arr["report"]).mean(), "_reports": rep}


def train(ctx) -> None:
    import torch

    from .model import ReportModel, dropout_masks, group_policy_loss

    p = ctx.params
    setup, use_dropout, stage2 = SETUP[ctx.variant]
    z = np.load(ctx.shared_dir / "data.npz")
    split = {s: {k: z[f"{s}_{k}"] for k in ("sig", "img", "report", "feat")} for s in ("train", "val", "test")}
    tr = split["train"]
    n = len(tr["report"])
    T = {k: torch.from_numpy(v) for k, v in tr.items() if k != "feat"}

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
    sft_curve, reward_curve = ([], []), ([], [])

    def log_val(step):
        import torch as _t

        with _t.no_grad():
            va = split["val"]
            zv = model.encode(_t.from_numpy(va["sig"]), _t.from_numpy(va["img"]),
                              *map(_t.from_numpy, val_masks))
            sft_curve[0].append(step)
            sft_curve[1].append(float(model.sft_loss(zv, _t.from_numpy(va["report"]))))
        reward_curve[0].append(step)
        reward_curve[1].append(float(evaluate(model, va, *val_masks)["reward"]))

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

    opt = torch.optim.Adam(model.parameters(), lr=p["lr"])
    total = p["sft_steps"] + p["rl_steps"]
    for step in range(p["sft_steps"]):
        if step % p["eval_every"] == 0:
            log_val(step)
        sft_step(opt)
    opt2 = torch.optim.Adam(model.parameters(), lr=p["lr_rl"] if stage2 == "rl" else p["lr"])
    if stage2 == "sft":
        opt2 = opt                                      # plain continuation of the SFT run
    for step in range(p["sft_steps"], total):
        if step % p["eval_every"] == 0:
            log_val(step)
        rl_step(opt2) if stage2 == "rl" else sft_step(opt2)
    log_val(total)
    ctx.progress(f"val CE {sft_curve[1][-1]:.3f}, val reward {reward_curve[1][-1]:.3f}")
    ctx.metrics.curve("sft_val_loss", *sft_curve)
    ctx.metrics.curve("val_reward", *reward_curve)

    te = split["test"]
    nt = len(te["report"])
    modes = {"": _masks(setup, nt)}
    if setup == "both":
        modes["_sig"] = _masks("signal", nt)
        modes["_img"] = _masks("image", nt)
    for suffix, masks in modes.items():
        res = evaluate(model, te, *masks)
        for k, v in res.items():
            if not k.startswith("_"):
                ctx.metrics.scalar(k + suffix, v)
        if suffix == "":
            reports = res["_reports"]
    # one example for the figure: the first test record (same record for every variant of a seed)
    for j in range(P.N_STATEMENTS):
        ctx.metrics.scalar(f"ex_report_{j}", reports[0, j])
        ctx.metrics.scalar(f"ex_truth_{j}", te["report"][0, j])
    for k, v in zip(P.FEATURES, te["feat"][0]):
        ctx.metrics.scalar(f"ex_feat_{k}", v)
    ctx.metrics.curve("ex_signal", np.arange(te["sig"].shape[1]) / D.FS_MODEL, te["sig"][0])


# --- plots -----------------------------------------------------------------------------------

def plot(table, plots_dir, params) -> None:
    from .plots import plot_all

    plot_all(table, plots_dir, VARIANTS, (params or {}).get("sft_steps"))
