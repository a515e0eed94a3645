"""EMFormer in miniature: forecasting a simulated QG atmosphere with a single-convolution
multi-scale transformer, accumulative-context fine-tuning and the paper's sinusoidally weighted
composite loss.

Stages (the state is (psi, zeta) standardised per variable with the training mean and std, so RMSE
is in standard deviations; one lead step = ``sim.dt_save`` model time units):

* train_shared (per seed): simulate QG trajectories (``qg.py``); split train / val / test
  trajectories; pretrain one single-step forecaster (one-step loss, no context) with the paper's
  composite loss (learned sinusoidal weight, ``loss.py``); every variant of the seed starts from it.
* train (per variant x seed): fine-tune a pretrained forecaster on R-step rollouts for the same
  number of updates, then forecast from the test start states autoregressively to ``eval.leads``
  and record latitude-weighted RMSE and ACC per start state (the test units), lead and variable
  (``skill.py``).

Skill window. The claims read ACC over ``eval.window`` (leads 4-8), fixed before any training
from the data's anomaly autocorrelation (the persistence forecast's ACC): on the training
trajectories it is 0.52 (psi) at lead 4 and about 0 at lead 8, so the window spans the leads where
persistence loses its skill while a dynamical forecast can keep some. Beyond lead 8 every model of
this size was at or above climatology (the earlier design's leads 9-16), where a lower RMSE only
rewards damping towards climatology. The ``persistence`` variant records that autocorrelation on the
test states (its ACC curve) in every run.

Variants (all share the simulator, the network size, the pretrained model, the fine-tuning
budget in updates and rollout length, the optimiser, learning rates and the batches):

* ``emformer``    single-conv multi-scale block, accumulative-context fine-tuning, the paper's loss;
* ``rollout_ft``  the same pretrained model, standard rollout fine-tuning (Markov steps);
* ``pretrained``  the pretrained model, no fine-tuning (reference for the fine-tuning gains);
* ``persistence`` the forecast x(t + k) = x(t): the controls' stand-in, no model.

The fixed-weight ablation of the loss (``ABLATIONS``: accumulative context, the composite loss at
a fixed weight 1/2 in fine-tuning; run by ``lr_grid.py --variants fixed_loss``) is not a pipeline
variant: in fine-tuning it matched ``emformer`` to 1e-7 in ACC (README), so it could not answer,
and the stage where the weighting could matter (pretraining) would need a second pretraining per
seed, which does not fit the budget.

The multi-branch block is not a training variant: it computes the same function as the single
convolution (tests/test_emformer.py checks outputs and gradients), so its accuracy equals the
single-conv one up to float rounding. What differs is speed, measured in the ``emformer`` cell (and
in benchmarks/bench_emformer.py) for both blocks in the same run, with an A/A timing (the
multi-branch block against an identical copy of itself) as the speed claims' control.

Learning rates: pretraining warms up linearly, runs at a constant rate, then at a constant 0.15 x
that rate (stopping at the first flat validation curve by the gate's own test, after a minimum);
fine-tuning runs at a constant rate. No schedule reaches zero, so a flat validation curve at the end
is a plateau; the rates were chosen on the validation trajectories by ``lr_grid.py`` (one grid, the
same for every model).
"""
from __future__ import annotations

import json
import time

import numpy as np

from .qg import QG2D, simulate
from .skill import latitude_weights, weighted_acc, weighted_rmse

GENERIC_CURVES = {"pre_val_rmse": ("pretraining update", "validation one-step RMSE (std units)"),
                  "ft_val_rmse": ("fine-tuning update", "validation rollout RMSE (std units)")}
VARIABLES = ("psi", "zeta")

VARIANTS = {  # id: (fine-tuning, accumulative context, loss weighting in fine-tuning)
    "emformer": ("accumulative", True, "sin"),
    "rollout_ft": ("rollout", False, "sin"),
    "pretrained": (None, False, "sin"),
    "persistence": (None, False, None),
}
ABLATIONS = {"fixed_loss": ("accumulative", True, "fixed")}  # lr_grid.py only (see above)


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


def anomaly_autocorrelation(traj: np.ndarray, clim: np.ndarray, leads: int) -> np.ndarray:
    """ACC of persistence, lag 1..leads: (leads, variables), over every pair of frames of ``traj``
    (trajectories, time, C, H, W)."""
    return np.stack([weighted_acc(traj[:, :-k], traj[:, k:], clim).mean(axis=(0, 1))
                     for k in range(1, leads + 1)])


# --- training ------------------------------------------------------------------------------------

def _net(p: dict, kind: str = "single"):
    from .model import EMFormerNet

    m = p["model"]
    return EMFormerNet(channels=len(VARIABLES), dim=m["dim"], depth=m["depth"], heads=m["heads"],
                       patch=m["patch"], kind=kind, grid=(p["sim"]["ny"], p["sim"]["nx"]))


def _loss(weighting: str):
    from .loss import CompositeLoss

    return CompositeLoss(len(VARIABLES), weighting)


def _windows(traj: np.ndarray, length: int, idx_rng: np.random.Generator, batch: int) -> np.ndarray:
    """batch random windows of ``length`` consecutive frames: (batch, length, C, H, W)."""
    n, t = traj.shape[:2]
    i = idx_rng.integers(0, n, batch)
    j = idx_rng.integers(0, t - length + 1, batch)
    return np.stack([traj[a, b: b + length] for a, b in zip(i, j)])


def _val_windows(traj: np.ndarray, length: int, n: int) -> np.ndarray:
    starts = np.linspace(0, traj.shape[1] - length, max(1, n // traj.shape[0])).astype(int)
    return np.stack([traj[a, b: b + length] for a in range(traj.shape[0]) for b in starts])


def _lat_w(data: dict):
    import torch

    return torch.from_numpy(latitude_weights(data["train"].shape[-2]).astype(np.float32))[:, None]


def _val_rmse(pred, truth, lat_w) -> float:
    """Latitude-weighted RMSE per field, averaged over fields, leads and variables (the metric, not
    the loss)."""
    import torch

    return float(torch.sqrt((lat_w * (pred - truth) ** 2).mean(dim=(-2, -1))).mean())


def pretrain(p: dict, data: dict, weighting: str, seed: int, progress=print):
    """Single-step training (no context) with the composite loss (``weighting``: 'sin' learned,
    'fixed'). Linear warm-up over the first ``warmup`` fraction, then a constant rate, lowered once to
    ``decay`` x the rate at ``decay_at`` of the updates (a second constant stage: the convergence gate
    reads the last 30 % of the updates, all at that constant rate, above a tenth of the peak).
    Stopping rule: from ``min_steps`` of the updates on, training stops at the first evaluation where
    the validation curve is flat by the convergence gate's own test (``claims.plateau``), else at
    ``steps``. Returns the network, the loss module and the curves."""
    import torch

    from ...claims import plateau
    from .model import rollout

    cfg = p["pretrain"]
    torch.manual_seed(seed)
    net, loss_fn = _net(p), _loss(weighting)
    opt = torch.optim.AdamW(list(net.parameters()) + list(loss_fn.parameters()), lr=cfg["lr"], weight_decay=1e-4)
    warm = max(1, int(cfg.get("warmup", 0.1) * cfg["steps"]))
    drop = int(cfg.get("decay_at", 1.0) * cfg["steps"])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (cfg.get("decay", 1.0) if s >= drop else 1.0))
    lat_w = _lat_w(data)
    idx_rng = np.random.default_rng(seed + 17)
    val = torch.from_numpy(_val_windows(data["val"], 2, cfg.get("n_val", 32)))
    curves = {"step": [], "val": [], "lr": [], "w": []}
    for s in range(cfg["steps"]):
        lr = opt.param_groups[0]["lr"]
        win = torch.from_numpy(_windows(data["train"], 2, idx_rng, cfg["batch"]))
        loss = loss_fn(rollout(net, win[:, 0], 1)[0], win[:, 1], lat_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if (s + 1) % cfg["eval_every"] == 0 or s == 0:
            with torch.no_grad():
                v = _val_rmse(rollout(net, val[:, 0], 1)[0], val[:, 1], lat_w)
            for k, x in (("step", s + 1), ("val", v), ("lr", lr), ("w", float(loss_fn.weight().detach()))):
                curves[k].append(x)
            progress(f"pretrain[{weighting}] {s + 1}/{cfg['steps']} val RMSE {v:.4f} lambda {curves['w'][-1]:.2e}")
            if s + 1 >= cfg.get("min_steps", 1.0) * cfg["steps"] and plateau(curves["step"], curves["val"]):
                progress(f"pretrain[{weighting}] stops at update {s + 1}: validation curve flat (gate's test)")
                break
    return net, loss_fn, curves


def finetune(net, loss_fn, p: dict, data: dict, accumulative: bool, seed: int, progress=print):
    """R-step rollout fine-tuning at a constant rate, one update per rollout, the composite loss
    over the R leads (its learned log-variances and weight carry over from pretraining, as in the
    reference, where they are parameters of the model); inputs of later steps are the detached
    forecasts. ``accumulative``: every step attends to the keys/values of the earlier steps of its
    rollout (window ``finetune.window``); otherwise Markov steps."""
    import torch

    from .model import rollout

    cfg = p["finetune"]
    R, window = cfg["rollout"], (cfg["window"] if accumulative else 0)
    opt = torch.optim.AdamW(list(net.parameters()) + list(loss_fn.parameters()), lr=cfg["lr"], weight_decay=1e-4)
    lat_w = _lat_w(data)
    idx_rng = np.random.default_rng(seed + 29)  # the same batches for every variant of a seed
    val = torch.from_numpy(_val_windows(data["val"], R + 1, cfg.get("n_val", 32)))
    curves = {"step": [], "val": [], "lr": [], "w": []}

    def evaluate(step):
        with torch.no_grad():
            v = _val_rmse(rollout(net, val[:, 0], R, window), val[:, 1:].transpose(0, 1), lat_w)
        for k, x in (("step", step), ("val", v), ("lr", cfg["lr"]), ("w", float(loss_fn.weight().detach()))):
            curves[k].append(x)
        progress(f"finetune {step}/{cfg['steps']} val rollout RMSE {v:.4f}")

    evaluate(0)
    for s in range(cfg["steps"]):
        win = torch.from_numpy(_windows(data["train"], R + 1, idx_rng, cfg["batch"]))
        loss = loss_fn(rollout(net, win[:, 0], R, window), win[:, 1:].transpose(0, 1), lat_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (s + 1) % cfg["eval_every"] == 0:
            evaluate(s + 1)
    return net, curves


# --- evaluation ----------------------------------------------------------------------------------

def start_states(n_traj: int, n_frames: int, leads: int, stride: int) -> list[tuple[int, int]]:
    """The test units: (trajectory, frame) of every forecast start, ``stride`` frames apart."""
    return [(a, b) for a in range(n_traj) for b in range(0, n_frames - leads, stride)]


def forecast_skill(net, data: dict, leads: int, window: int, starts: list[tuple[int, int]]):
    """Autoregressive forecasts from the start states (``net`` None: persistence). Returns RMSE and
    ACC per start, lead and variable (starts, leads, C), and the forecast and truth of the first
    start (leads, C, H, W)."""
    test = data["test"]
    win = np.stack([test[a, b: b + leads + 1] for a, b in starts])
    if net is None:
        f = np.repeat(win[:, :1], leads, axis=1)
    else:
        import torch

        from .model import rollout

        with torch.no_grad():
            f = rollout(net, torch.from_numpy(win[:, 0]), leads, window).numpy().transpose(1, 0, 2, 3, 4)
    t = win[:, 1:]
    return weighted_rmse(f, t), weighted_acc(f, t, data["clim"]), f[0], t[0]


def block_speed(channels: int, h: int, w: int, batch: int, repeats: int = 5, target_s: float = 0.05,
                seed: int = 0) -> dict:
    """Best-of-``repeats`` time per call of the single-conv and multi-branch blocks, forward and
    forward+backward, interleaved rounds in one process; the merge of the kernels is inside the timed
    single-conv call. Also an identical second copy of the multi-branch block (the A/A control: a
    ratio that timing noise alone produces). Returns ms per call and the ratios multi-branch / single
    (> 1: single faster) and multi-branch copy / multi-branch (``*_aa``)."""
    import torch

    from .model import MultiBranchConv, SingleConvMultiScale

    torch.manual_seed(seed)
    blocks = {"single": SingleConvMultiScale(channels), "multibranch": MultiBranchConv(channels),
              "multibranch_copy": MultiBranchConv(channels)}
    blocks["multibranch"].load_state_dict(blocks["single"].state_dict())
    blocks["multibranch_copy"].load_state_dict(blocks["single"].state_dict())
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
    for m in ("fwd", "fwdbwd"):
        ms[f"speedup_{m}"] = ms[f"multibranch_{m}_ms"] / ms[f"single_{m}_ms"]
        ms[f"speedup_{m}_aa"] = ms[f"multibranch_copy_{m}_ms"] / ms[f"multibranch_{m}_ms"]
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
    auto = anomaly_autocorrelation(data["train"], data["clim"], p["eval"]["leads"])
    for i, v in enumerate(VARIABLES):
        ctx.metrics.curve(f"autocorr_{v}", range(1, len(auto) + 1), auto[:, i])
    ctx.progress("anomaly autocorrelation (psi) by lead: " + " ".join(f"{a:.2f}" for a in auto[:, 0]))
    np.savez(ctx.outdir / "data.npz", **data)
    t0 = time.perf_counter()
    net, loss_fn, curves = pretrain(p, data, "sin", ctx.seed, ctx.progress)
    ctx.metrics.scalar("pretrain_seconds", time.perf_counter() - t0)
    torch.save({"net": net.state_dict(), "loss": loss_fn.state_dict()}, ctx.outdir / "pretrained.pt")
    (ctx.outdir / "pretrain.json").write_text(json.dumps(curves))


def load_pretrained(p: dict, path, weighting: str):
    """The pretrained network and its loss module; a 'fixed' loss keeps the learned log-variances
    and replaces the learned sinusoidal weight by the constant."""
    import torch

    state = torch.load(path, weights_only=True)
    net, loss_fn = _net(p), _loss(weighting)
    net.load_state_dict(state["net"])
    loss_fn.load_state_dict({k: v for k, v in state["loss"].items() if k in loss_fn.state_dict()}, strict=False)
    return net, loss_fn


def _record_skill(ctx, rmse: np.ndarray, acc: np.ndarray) -> None:
    """Per-lead curves (mean over start states) and per-start units over the claim windows."""
    e = ctx.params["eval"]
    lo, hi = e["window"]
    leads = np.arange(1, e["leads"] + 1)
    for i, v in enumerate(VARIABLES):
        ctx.metrics.curve(f"rmse_{v}", leads, rmse[:, :, i].mean(axis=0))
        ctx.metrics.curve(f"acc_{v}", leads, acc[:, :, i].mean(axis=0))
    win = slice(lo - 1, hi)
    ctx.metrics.units("acc_win", acc[:, win].mean(axis=(1, 2)))
    ctx.metrics.units("rmse_win", rmse[:, win].mean(axis=(1, 2)))
    ctx.metrics.units("acc_short", acc[:, 0].mean(axis=1))
    ctx.metrics.units("rmse_short", rmse[:, 0].mean(axis=1))


def train(ctx) -> None:
    import torch

    p = ctx.params
    if ctx.variant not in VARIANTS:
        raise ValueError(f"emformer: unknown variant '{ctx.variant}', expected one of {sorted(VARIANTS)}")
    ft, accumulative, weighting = VARIANTS[ctx.variant]
    with np.load(ctx.shared_dir / "data.npz") as z:
        data = {k: z[k] for k in z.files}
    e = p["eval"]
    starts = start_states(data["test"].shape[0], data["test"].shape[1], e["leads"], e["stride"])
    net, window = None, 0
    if weighting is not None:
        net, loss_fn = load_pretrained(p, ctx.shared_dir / "pretrained.pt", weighting)
        c = json.loads((ctx.shared_dir / "pretrain.json").read_text())
        ctx.metrics.curve("pre_val_rmse", c["step"], c["val"])
        ctx.metrics.curve("pre_lr", c["step"], c["lr"])
        ctx.metrics.curve("pre_loss_weight", c["step"], c["w"])
        ctx.metrics.scalar("pretrain_updates", c["step"][-1])
        if ft is not None:
            t0 = time.perf_counter()
            net, c = finetune(net, loss_fn, p, data, accumulative, ctx.seed, ctx.progress)
            ctx.metrics.scalar("finetune_seconds", time.perf_counter() - t0)
            ctx.metrics.curve("ft_val_rmse", c["step"], c["val"])
            ctx.metrics.curve("ft_lr", c["step"], c["lr"])
            ctx.metrics.curve("ft_loss_weight", c["step"], c["w"])
        ctx.metrics.scalar("loss_weight_final", float(loss_fn.weight().detach()))
        net.eval()
        window = p["finetune"]["window"] if accumulative else 0
    rmse, acc, f0, t0_ = forecast_skill(net, data, e["leads"], window, starts)
    _record_skill(ctx, rmse, acc)
    np.savez(ctx.outdir / "forecast_example.npz", forecast=f0, truth=t0_)
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
        ctx.progress(f"block speed-up fwd x{sp['speedup_fwd']:.2f}, fwd+bwd x{sp['speedup_fwdbwd']:.2f} "
                     f"(A/A x{sp['speedup_fwd_aa']:.2f}, x{sp['speedup_fwdbwd_aa']:.2f})")


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir, params) -> None:
    from .plots import plot_all

    plot_all(table, plots_dir, params)
