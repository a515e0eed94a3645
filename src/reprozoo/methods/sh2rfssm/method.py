"""S-H²RF-SSM in miniature: heterogeneous harmonic resonate-and-fire SSM vs its ablations and baselines.

Variants (one cell = one variant x seed; every cell trains one fresh model per (task, L) with the
same optimiser, steps, batch, learning rate and the same data stream):

    sh2rf          the method: heterogeneous ω_c, b_c per channel, IMEX-discretised kernel, FFT path
    sh2rf_sampled  ablation of the discretisation: same, kernel = sampled continuous impulse response
    hrf_homog      homogeneous RF: one ω, b shared by all channels (IMEX kernel)
    lif_ssm        first-order spiking SSM: leaky-integrator kernel β_c^k, per-channel β_c
    gru            non-spiking GRU (short L only: sequential in L)
    transformer    small non-spiking transformer (short L only: attention is O(L²))

Stages of a cell: for each task (freq: frequency discrimination, accuracy; adding: adding problem,
R² = 1 - MSE / Var(y)) and each L of the variant (``lengths`` for spiking SSMs, ``short_lengths``
for GRU / transformer), Adam on fresh batches drawn from a stream seeded by (seed, task, L), so all
variants see the same sequences; validation loss every ``eval_every`` steps (curve ``val_loss_<task>_L<L>``);
test metrics on a fixed test set; spike operations per sequence (blocks.spiking.synaptic_ops).
``score`` = mean over (task, L) of accuracy / R²; ``score_short`` the same at the short L only.
The sh2rf cell also (i) evaluates its L_max-trained frequency model on sequences of
``long_eval.length`` (50k) steps (accuracy, peak resident memory of the process in MB) and (ii) times
one layer's FFT path against the sequential IMEX recurrence over ``timing.lengths`` (seconds, one
thread) and fits the log-log slopes.
"""
from __future__ import annotations

import resource
import time

import numpy as np

from . import data as D

VARIANTS = {
    "sh2rf": dict(family="ssm", kernel="imex", shared=False),
    "sh2rf_sampled": dict(family="ssm", kernel="sampled", shared=False),
    "hrf_homog": dict(family="ssm", kernel="imex", shared=True),
    "lif_ssm": dict(family="ssm", kernel="lif", shared=False),
    "gru": dict(family="gru"),
    "transformer": dict(family="transformer"),
}
TASK_OFFSET = {"freq": 1, "adding": 2}

GENERIC_CURVES: dict = {}  # plot() draws the loss curves itself (one panel per task and L)


def _task_io(task: str, p: dict) -> tuple[int, int]:
    return (1, int(p["freq"].get("n_classes", 4))) if task == "freq" else (2, 1)


def _batches(task, n, length, rng, p):
    return D.make(task, n, length, rng, p["freq"] if task == "freq" else None)


def _evaluate(model, task, x, y, batch):
    """(loss, metric, spike ops per sequence, spikes of the first sequence's layer 1)."""
    import torch
    import torch.nn.functional as F

    outs, sops, raster = [], 0.0, None
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out, spikes = model(x[i:i + batch])
            outs.append(out)
            if spikes:
                sops += sum(float(s.sum()) * f for s, f in zip(spikes, model.fan_outs))
                raster = raster if raster is not None else spikes[0][0].numpy()
    out = torch.cat(outs)
    if task == "freq":
        return float(F.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean()), sops / len(x), raster
    mse = float(((out[:, 0] - y) ** 2).mean())
    return mse, 1.0 - mse / float(y.var()), sops / len(x), raster


def fit(task: str, length: int, options: dict, p: dict, seed: int, metrics, progress):
    import torch
    import torch.nn.functional as F

    from .model import build

    tr = p["train"]
    d_in, n_out = _task_io(task, p)
    torch.manual_seed(seed)
    model = build(options["family"], d_in, n_out, length, options, p["arch"])
    opt = torch.optim.Adam(model.parameters(), lr=float(tr["lr"]))
    base = seed * 1_000_003 + 1000 * TASK_OFFSET[task] + length
    stream = np.random.default_rng(base)  # same training sequences for every variant
    xv, yv = (torch.from_numpy(a) for a in _batches(task, int(tr["n_val"]), length, np.random.default_rng(base + 7), p))
    xt, yt = (torch.from_numpy(a) for a in _batches(task, int(tr["n_test"]), length, np.random.default_rng(base + 11), p))
    steps, every, bs = int(tr["steps"]), int(tr["eval_every"]), int(tr["batch"])
    xs, vals = [], []
    t0 = time.process_time()
    for step in range(1, steps + 1):
        xb, yb = (torch.from_numpy(a) for a in _batches(task, bs, length, stream, p))
        out, _ = model(xb)
        loss = F.cross_entropy(out, yb) if task == "freq" else F.mse_loss(out[:, 0], yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == steps:
            xs.append(step)
            vals.append(_evaluate(model, task, xv, yv, int(tr["eval_batch"]))[0])
    tag = f"{task}_L{length}"
    metrics.curve(f"val_loss_{tag}", xs, vals)
    half = len(vals) // 2  # flatness: relative change of the val loss over the last half of training
    metrics.scalar(f"rel_change_val_loss_last_half_{tag}", (vals[-1] - vals[half]) / max(abs(vals[half]), 1e-12))
    _, metric, sops, raster = _evaluate(model, task, xt, yt, int(tr["eval_batch"]))
    metrics.scalar(f"{'acc' if task == 'freq' else 'r2'}_{tag}", metric)
    metrics.scalar(f"train_cpu_s_{tag}", time.process_time() - t0)
    if options["family"] == "ssm":
        metrics.scalar(f"sops_per_step_{tag}", sops / length)
    progress(f"{tag}: {'acc' if task == 'freq' else 'R2'} {metric:.3f}, val loss {vals[-1]:.4f}")
    return model, metric, sops / length, raster


def long_sequence_eval(model, p, seed, metrics):
    """The L_max-trained frequency model on ``long_eval.length``-step sequences (length transfer:
    the read-out kernel is in units of L), with the process's peak resident memory afterwards."""
    import torch

    le = p["long_eval"]
    L = int(le["length"])
    x, y = D.frequency_discrimination(int(le["n"]), L, np.random.default_rng(seed * 1_000_003 + 99), **p["freq"])
    t0 = time.perf_counter()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), int(le["batch"])):
            out, _ = model(torch.from_numpy(x[i:i + int(le["batch"])]))
            correct += int((out.argmax(1) == torch.from_numpy(y[i:i + int(le["batch"])])).sum())
    metrics.scalar("acc_freq_long", correct / len(x))
    metrics.scalar("long_eval_s_per_seq", (time.perf_counter() - t0) / len(x))
    metrics.scalar("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def timing(p, metrics):
    """One layer (C channels, batch 1): FFT path (kernel + convolution) vs the IMEX recurrence."""
    import torch

    from ...blocks.spiking import causal_fft_conv
    from .model import imex_kernel, imex_recurrence

    tm = p["timing"]
    C = int(tm["channels"])
    omega = torch.linspace(0.1, 1.0, C)
    b = 0.03 * omega
    lengths = [int(v) for v in tm["lengths"]]
    t_fft, t_rec = [], []
    for L in lengths:
        x = torch.randn(1, C, L)
        with torch.no_grad():
            best = []
            for _ in range(int(tm["repeats"])):
                t0 = time.perf_counter()
                causal_fft_conv(x, imex_kernel(omega, b, L))
                best.append(time.perf_counter() - t0)
            t_fft.append(min(best))
            t0 = time.perf_counter()
            imex_recurrence(x, omega, b)
            t_rec.append(time.perf_counter() - t0)
    metrics.curve("time_fft_s", lengths, t_fft)
    metrics.curve("time_recurrence_s", lengths, t_rec)
    lx = np.log(lengths)
    metrics.scalar("slope_fft", float(np.polyfit(lx, np.log(t_fft), 1)[0]))
    metrics.scalar("slope_recurrence", float(np.polyfit(lx, np.log(t_rec), 1)[0]))
    metrics.scalar("speedup_at_lmax", t_rec[-1] / t_fft[-1])


def train(ctx) -> None:
    p = ctx.params
    options = VARIANTS[ctx.variant]
    spiking = options["family"] == "ssm"
    lengths = [int(v) for v in (p["lengths"] if spiking else p["short_lengths"])]
    short = set(int(v) for v in p["short_lengths"])
    scores, short_scores, sops = [], [], []
    for task in p["tasks"]:
        for L in lengths:
            model, metric, s, raster = fit(task, L, options, p, ctx.seed, ctx.metrics, ctx.progress)
            scores.append(metric)
            if L in short:
                short_scores.append(metric)
            if spiking:
                sops.append(s)
                if task == "freq" and L == min(lengths):  # raster of one channel, first test sequence
                    ch = int(np.argmax(raster.sum(1)))
                    t_sp = np.flatnonzero(raster[ch])
                    ctx.metrics.curve("raster_freq", t_sp, np.full(len(t_sp), ch))
            if task == "freq" and L == max(lengths) and ctx.variant == "sh2rf" and p.get("long_eval"):
                long_sequence_eval(model, p, ctx.seed, ctx.metrics)
    ctx.metrics.scalar("score", float(np.mean(scores)))
    ctx.metrics.scalar("score_short", float(np.mean(short_scores)))
    if spiking:
        ctx.metrics.scalar("sops_per_step", float(np.mean(sops)))
    if ctx.variant == "sh2rf" and p.get("timing"):
        timing(p, ctx.metrics)


def plot(table, plots_dir, params) -> None:
    from . import plots

    plots.make_all(table, plots_dir, params)
