"""EMFormer in miniature: forecasting a simulated QG atmosphere with a single-convolution
multi-scale transformer, accumulative-context fine-tuning and a sinusoidally weighted composite loss.

Stages (units: the state is (psi, zeta) standardised per variable with the training mean and std,
so RMSE is in standard deviations; one lead step = ``sim.dt_save`` model time units):

* train_shared (per seed): simulate QG trajectories (``qg.py``); split train / val / test
  trajectories; pretrain two single-step forecasters (one-step loss, no context) from the same
  initialisation and batches, one with the sinusoidal composite loss, one with the fixed one.
* train (per variant x seed): fine-tune a pretrained forecaster on R-step rollouts for the same
  number of updates, then forecast the test set autoregressively to ``eval.leads`` and record
  latitude-weighted RMSE and ACC per lead and variable (``skill.py``).

Variants (all share the simulator, the network size, the pretraining budget, the fine-tuning
budget in updates and rollout length, the optimiser and the batches):

* ``emformer``    single-conv multi-scale block, accumulative-context fine-tuning, sinusoidal loss;
* ``rollout_ft``  the same pretrained model, standard rollout fine-tuning (Markov steps);
* ``fixed_loss``  pretrained and fine-tuned with the composite loss at a fixed weight (the
  sinusoid's mean), accumulative context;
* ``pretrained``  the pretrained model, no fine-tuning (reference for the fine-tuning gains).

The multi-branch block is not a training variant: it computes the same function as the single
convolution (tests/test_emformer.py checks outputs and gradients), so its accuracy equals the
single-conv one up to float rounding. What differs is speed, measured in the ``emformer`` cell (and in
benchmarks/bench_emformer.py) for both blocks in the same run.

Composite loss (our reading of the paper; the reference code weighs two L2 terms as
(1 - w) L1 + w L2): L = (1 - w(s)) L_field + w(s) L_grad, with L_field the latitude-weighted MSE of
the fields and L_grad that of their periodic finite-difference gradients (small-scale structure).
Sinusoidal: w(s) = (1 - cos(pi s / S)) / 2 over each stage of S updates (0 -> 1); fixed: w = 1/2,
the sinusoid's mean, so both spend the same average weight on each term.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .qg import QG2D, simulate
from .skill import latitude_weights, weighted_acc, weighted_rmse

GENERIC_CURVES = {"val_loss": ("pretraining update", "validation one-step MSE (std units²)"),
                  "ft_val_rmse": ("fine-tuning update", "validation rollout RMSE (std units)")}
VARIABLES = ("psi", "zeta")

VARIANTS = {  # id: (pretrained model, fine-tuning, context window, loss weighting)
    "emformer": ("sin", "accumulative", True, "sin"),
    "rollout_ft": ("sin", "rollout", False, "sin"),
    "fixed_loss": ("fixed", "accumulative", True, "fixed"),
    "pretrained": ("sin", None, False, "sin"),
}


# --- data ----------------------------------------------------------------------------------------

def make_data(p: dict, rng: np.random.Generator) -> dict:
    s = p["sim"]
    sim = QG2D(ny=s["ny"], nx=s["nx"], beta=s["beta"], ld=s["ld"], mu=s["mu"], nu=s["nu"],
               forcing_amp=s["forcing_amp"])
    traj = simulate(sim, rng, s["n_traj"], s["n_frames"], s["dt_save"], s["dt_max"], s["spinup"])
    n_test, n_val = s["n_test"], s["n_val"]
    train, val, test = traj[: -n_val - n_test], traj[-n_val - n_test: -n_test], traj[-n_test:]
    mean = train.mean(axis=(0, 1, 3, 4), keepdims=True)[0]
    std = train.std(axis=(0, 1, 3, 4), keepdims=True)[0]
    norm = lambda a: ((a - mean) / std).astype(np.float32)  # noqa: E731
    train, val, test = norm(train), norm(val), norm(test)
    return {"train": train, "val": val, "test": test, "clim": train.mean(axis=(0, 1)),
            "mean": mean[0, :, 0, 0], "std": std[0, :, 0, 0]}


# --- loss ----------------------------------------------------------------------------------------

def loss_weight(kind: str, s: int, total: int) -> float:
    """Weight of the gradient term at update s of a stage of ``total`` updates."""
    if kind == "fixed":
        return 0.5
    if kind == "sin":
        return 0.5 * (1.0 - math.cos(math.pi * s / max(total, 1)))
    raise ValueError(f"loss weighting '{kind}': expected 'sin' or 'fixed'")


def composite_loss(pred, target, w: float, lat_w):
    """(1 - w) * lat-weighted field MSE + w * lat-weighted MSE of the periodic gradients."""
    import torch

    err = pred - target
    field = (lat_w * err**2).mean()
    gx = torch.roll(err, -1, dims=-1) - err
    gy = torch.roll(err, -1, dims=-2) - err
    grad = (lat_w * (gx**2 + gy**2)).mean()
    return (1.0 - w) * field + w * grad


# --- training ------------------------------------------------------------------------------------

def _net(p: dict, kind: str = "single"):
    from .model import EMFormerNet

    m = p["model"]
    return EMFormerNet(channels=len(VARIABLES), dim=m["dim"], depth=m["depth"], heads=m["heads"],
                       patch=m["patch"], kind=kind)


def _windows(traj: np.ndarray, length: int, idx_rng: np.random.Generator, batch: int) -> np.ndarray:
    """batch random windows of ``length`` consecutive frames: (batch, length, C, H, W)."""
    n, t = traj.shape[:2]
    i = idx_rng.integers(0, n, batch)
    j = idx_rng.integers(0, t - length + 1, batch)
    return np.stack([traj[a, b: b + length] for a, b in zip(i, j)])


def _val_windows(traj: np.ndarray, length: int, n: int) -> np.ndarray:
    starts = np.linspace(0, traj.shape[1] - length, max(1, n // traj.shape[0])).astype(int)
    return np.stack([traj[a, b: b + length] for a in range(traj.shape[0]) for b in starts])


def _update(opt, sched, loss) -> None:
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


def pretrain(p: dict, data: dict, loss_kind: str, seed: int, progress=print):
    """Single-step training (no context): the same initialisation and batches for either loss."""
    import torch

    from .model import rollout

    cfg = p["pretrain"]
    torch.manual_seed(seed)
    net = _net(p)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg["lr"], weight_decay=1e-4)
    warm = max(1, cfg["steps"] // 10)  # linear warm-up, then cosine decay
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, 0.5 * (1 + math.cos(
        math.pi * min(1.0, max(0, s - warm) / max(1, cfg["steps"] - warm))))))
    lat_w = torch.from_numpy(latitude_weights(data["train"].shape[-2]).astype(np.float32))[:, None]
    idx_rng = np.random.default_rng(seed + 17)
    val = torch.from_numpy(_val_windows(data["val"], 2, 32))
    xs, ys = [], []
    for s in range(cfg["steps"]):
        win = torch.from_numpy(_windows(data["train"], 2, idx_rng, cfg["batch"]))
        pred = rollout(net, win[:, 0], 1)[0]
        _update(opt, sched, composite_loss(pred, win[:, 1], loss_weight(loss_kind, s, cfg["steps"]), lat_w))
        if s % cfg["eval_every"] == 0 or s == cfg["steps"] - 1:
            with torch.no_grad():
                v = float(((rollout(net, val[:, 0], 1)[0] - val[:, 1]) ** 2).mean())
            xs.append(s + 1)
            ys.append(v)
            progress(f"pretrain[{loss_kind}] {s + 1}/{cfg['steps']} val MSE {v:.4f}")
    return net, xs, ys


def finetune(net, p: dict, data: dict, accumulative: bool, loss_kind: str, seed: int, progress=print):
    """R-step rollout fine-tuning, one update per rollout, loss averaged over the R leads; inputs of
    later steps are the detached forecasts. ``accumulative``: every step attends to the keys/values of
    the earlier steps of its rollout (window ``finetune.window``); otherwise Markov steps."""
    import torch

    from .model import rollout

    cfg = p["finetune"]
    R, window = cfg["rollout"], (cfg["window"] if accumulative else 0)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg["lr"], weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg["steps"])
    lat_w = torch.from_numpy(latitude_weights(data["train"].shape[-2]).astype(np.float32))[:, None]
    idx_rng = np.random.default_rng(seed + 29)  # the same batches for every variant of a seed
    val = torch.from_numpy(_val_windows(data["val"], R + 1, 16))
    xs, ys = [], []
    for s in range(cfg["steps"]):
        win = torch.from_numpy(_windows(data["train"], R + 1, idx_rng, cfg["batch"]))
        preds = rollout(net, win[:, 0], R, window)
        _update(opt, sched, composite_loss(preds, win[:, 1:].transpose(0, 1),
                                           loss_weight(loss_kind, s, cfg["steps"]), lat_w))
        if s % cfg["eval_every"] == 0 or s == cfg["steps"] - 1:
            with torch.no_grad():
                v = float(torch.sqrt(((rollout(net, val[:, 0], R, window) - val[:, 1:].transpose(0, 1)) ** 2).mean()))
            xs.append(s + 1)
            ys.append(v)
            progress(f"finetune {s + 1}/{cfg['steps']} val rollout RMSE {v:.4f}")
    return net, xs, ys


# --- evaluation ----------------------------------------------------------------------------------

def forecast_skill(net, data: dict, leads: int, window: int, n_init: int):
    """Autoregressive forecasts from n_init test states: RMSE and ACC (leads, variables), the
    forecasts and truths of the first one (leads, C, H, W)."""
    import torch

    from .model import rollout

    test = data["test"]
    win = _val_windows(test, leads + 1, n_init)
    with torch.no_grad():
        f = rollout(net, torch.from_numpy(win[:, 0]), leads, window).numpy().transpose(1, 0, 2, 3, 4)
    t = win[:, 1:]
    rmse = weighted_rmse(f, t).mean(axis=0)
    acc = weighted_acc(f, t, data["clim"]).mean(axis=0)
    return rmse, acc, f[0], t[0]


def block_speed(channels: int, h: int, w: int, batch: int, repeats: int = 5, target_s: float = 0.05,
                seed: int = 0) -> dict:
    """Best-of-``repeats`` time per call of the single-conv and multi-branch blocks, forward and
    forward+backward, interleaved rounds in one process; the merge of the kernels is inside the timed
    single-conv call. Returns ms per call and the ratios multi-branch / single (> 1: single faster)."""
    import torch

    from .model import MultiBranchConv, SingleConvMultiScale

    torch.manual_seed(seed)
    blocks = {"single": SingleConvMultiScale(channels), "multibranch": MultiBranchConv(channels)}
    blocks["multibranch"].load_state_dict(blocks["single"].state_dict())
    x = torch.randn(batch, channels, h, w)
    xg = x.clone().requires_grad_(True)

    def fwd(b):
        with torch.no_grad():
            b(x)

    def fwdbwd(b):
        b(xg).sum().backward()

    def timed(fn, b):
        fn(b)
        n, t0 = 0, time.perf_counter()
        while True:
            fn(b)
            n += 1
            dt = time.perf_counter() - t0
            if dt >= target_s:
                return dt / n

    runs = {(k, m): [] for k in blocks for m in ("fwd", "fwdbwd")}
    for _ in range(repeats):
        for k, b in blocks.items():
            runs[(k, "fwd")].append(timed(fwd, b))
            runs[(k, "fwdbwd")].append(timed(fwdbwd, b))
    ms = {f"{k}_{m}_ms": 1e3 * min(v) for (k, m), v in runs.items()}
    ms["speedup_fwd"] = ms["multibranch_fwd_ms"] / ms["single_fwd_ms"]
    ms["speedup_fwdbwd"] = ms["multibranch_fwdbwd_ms"] / ms["single_fwdbwd_ms"]
    return ms


def snapshot_leads(leads: int) -> list[int]:
    return sorted({1, max(1, leads // 2), leads})


# --- platform entry points -----------------------------------------------------------------------

def train_shared(ctx) -> None:
    import torch

    p = ctx.params
    t0 = time.perf_counter()
    data = make_data(p, ctx.rng(0))
    ctx.metrics.scalar("simulate_seconds", time.perf_counter() - t0)
    ctx.progress(f"simulated {p['sim']['n_traj']} QG trajectories in {time.perf_counter() - t0:.1f}s")
    np.savez(ctx.outdir / "data.npz", **data)
    for kind in ("sin", "fixed"):
        t0 = time.perf_counter()
        net, xs, ys = pretrain(p, data, kind, ctx.seed, ctx.progress)
        ctx.metrics.scalar(f"pretrain_seconds_{kind}", time.perf_counter() - t0)
        ctx.metrics.curve("val_loss" if kind == "sin" else "val_loss_fixed", xs, ys)
        torch.save(net.state_dict(), ctx.outdir / f"pretrained_{kind}.pt")


def train(ctx) -> None:
    import torch

    p = ctx.params
    if ctx.variant not in VARIANTS:
        raise ValueError(f"emformer: unknown variant '{ctx.variant}', expected one of {sorted(VARIANTS)}")
    pre, ft, accumulative, loss_kind = VARIANTS[ctx.variant]
    with np.load(ctx.shared_dir / "data.npz") as z:
        data = {k: z[k] for k in z.files}
    net = _net(p)
    net.load_state_dict(torch.load(ctx.shared_dir / f"pretrained_{pre}.pt", weights_only=True))
    if ft is not None:
        t0 = time.perf_counter()
        net, xs, ys = finetune(net, p, data, accumulative, loss_kind, ctx.seed, ctx.progress)
        ctx.metrics.scalar("finetune_seconds", time.perf_counter() - t0)
        ctx.metrics.curve("ft_val_rmse", xs, ys)
    net.eval()
    e = p["eval"]
    window = p["finetune"]["window"] if accumulative else 0
    rmse, acc, f0, t0_ = forecast_skill(net, data, e["leads"], window, e["n_init"])
    leads = np.arange(1, e["leads"] + 1) * p["sim"]["dt_save"]
    for i, v in enumerate(VARIABLES):
        ctx.metrics.curve(f"rmse_{v}", leads, rmse[:, i])
        ctx.metrics.curve(f"acc_{v}", leads, acc[:, i])
    long = slice(e["leads"] // 2, None)
    ctx.metrics.scalar("rmse_short", float(rmse[0].mean()))
    ctx.metrics.scalar("rmse_long", float(rmse[long].mean()))
    ctx.metrics.scalar("acc_long", float(acc[long].mean()))
    ctx.metrics.scalar("acc_short", float(acc[0].mean()))
    np.savez(ctx.outdir / "forecast_example.npz", forecast=f0, truth=t0_, leads=leads)
    if ctx.seed == p["seeds"][0]:  # psi snapshots of the first test forecast, flattened, for plot()
        for k in snapshot_leads(e["leads"]):
            ctx.metrics.curve(f"snap_psi_lead{k}_forecast", range(f0[k - 1, 0].size), f0[k - 1, 0].ravel())
            ctx.metrics.curve(f"snap_psi_lead{k}_truth", range(t0_[k - 1, 0].size), t0_[k - 1, 0].ravel())
    if ctx.variant == "emformer":
        m, s = p["model"], p["speed"]
        ny, nx = p["sim"]["ny"] // m["patch"], p["sim"]["nx"] // m["patch"]
        sp = block_speed(3 * m["dim"], ny, nx, p["finetune"]["batch"], s["repeats"], s["target_s"], ctx.seed)
        for k, v in sp.items():
            ctx.metrics.scalar(k, v)
        ctx.progress(f"block speed-up fwd x{sp['speedup_fwd']:.2f}, fwd+bwd x{sp['speedup_fwdbwd']:.2f}")


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir, params) -> None:
    from .plots import plot_all

    plot_all(table, plots_dir, params)
