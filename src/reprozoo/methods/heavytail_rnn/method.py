"""Heavy-tailed Dale RNNs trained with an optimal-transport projection, in miniature.

Variants (same tasks, trial stream, initial input/readout weights and magnitude ranks, optimiser,
learning-rate grid and budget):

- ``dale_heavy``  (method)   Dale RNN, after every Adam step each E/I block of magnitudes is
                             mapped by 1-D OT (rank matching) onto log-normal quantiles.
- ``dale_gamma``  (baseline) the same onto Gamma quantiles with the log-normal's mean and RMS in
                             every block (shape 1/(e-1) = 0.58): only the tail differs.
- ``dale_gauss``  (baseline) the same onto half-normal quantiles of the same bulk radius (the
                             paper's "Gaussian" Dale RNN; a larger mean/RMS, so not tail-only).
- ``rnn_free``    (code only, not in the spec) unconstrained RNN of the same bulk radius.

Per cell (variant x seed), for each task of the config (tasks.py; 100 ms steps):
train ``steps`` Adam steps (cosine from ``lr`` down to ``lr_floor`` x ``lr`` over the first
``lr_decay_frac`` of them, then constant: the rate is still up where the convergence gate looks) on fresh ID trials (loss: cross-entropy per step, decision
period weighted ``decision_weight``), the validation loss and the learning rate every
``eval_every`` steps on a fixed batch; then on fixed test batches:
accuracy ID and in each OOD condition per trial (unseen coherences, longer delays; decision =
argmax of the mean logits over the decision period); effective rank of W, of its update W - W_0
and of its fluctuation W - <W>_blocks (E/I block means removed), at initialisation and trained;
participation ratio of the hidden rates on the ID test trials, at initialisation and trained;
Hill tail index of |W_EE| (the E->E block: one magnitude law); the eigenvalues of W and the
histogram of log10 |W_ij| / block RMS (for the plots).
Scalars without a task suffix are means over the tasks (accuracies: over all test trials, also
recorded per trial as units); the claims read those.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .analysis import effective_rank, hill_tail_index, participation_ratio
from .tasks import N_CLASSES, N_INPUTS, make_batch
from reprozoo.figures import save_figure

DALE_LAW = {"dale_heavy": "lognormal", "dale_gamma": "gamma", "dale_gauss": "halfnormal", "rnn_free": None}
HIST_EDGES = np.linspace(-3.0, 1.5, 46)  # bins of log10(|w| / block RMS) for the histograms


def _tensors(batch, device="cpu"):
    import torch

    return tuple(torch.from_numpy(a).to(device) for a in (batch.x, batch.y, batch.w, batch.decision))


def weighted_ce(logits, y, w):
    import torch

    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    return (ce * w.reshape(-1)).sum() / w.sum()


def decision_correct(logits, batch) -> np.ndarray:
    """Per trial: 1.0 where the mean logits over the decision period pick the right class."""
    z = logits.detach().cpu().numpy()
    dec = batch.decision[:, :, None]
    mean_logits = (z * dec).sum(0) / dec.sum(0)
    return (mean_logits.argmax(-1) == batch.choice).astype(float)


def decision_accuracy(logits, batch) -> float:
    """Fraction of trials whose mean logits over the decision period pick the right class."""
    return float(np.mean(decision_correct(logits, batch)))


def _evaluate(model, batch, seed: int):
    """Validation loss, per-trial correctness and hidden rates on a fixed batch (fixed noise)."""
    import torch

    device = model.b.device
    x, y, w, _ = _tensors(batch, device)
    with torch.no_grad():
        logits, rates = model(x, torch.Generator(device=device).manual_seed(seed))
    return float(weighted_ce(logits, y, w)), decision_correct(logits, batch), rates.cpu().numpy()


def block_mean(W: np.ndarray, n_exc: int) -> np.ndarray:
    """The E/I block-mean matrix (rank <= 2): the part of a Dale matrix set by its signs alone."""
    out = np.empty_like(W)
    for rows in (slice(0, n_exc), slice(n_exc, None)):
        for cols in (slice(0, n_exc), slice(n_exc, None)):
            out[rows, cols] = W[rows, cols].mean()
    return out


def final_slope(steps, values, frac: float = 0.25) -> float:
    """Least-squares slope of the last ``frac`` of a curve, per 100 steps."""
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    k = max(3, int(round(frac * len(steps))))
    return float(100.0 * np.polyfit(steps[-k:], values[-k:], 1)[0])


def lr_factor(step: int, steps: int, floor: float, decay_frac: float = 1.0) -> float:
    """Cosine from 1 down to ``floor`` (a fraction of the peak) over the first ``decay_frac`` of
    ``steps``, then constant at ``floor``: the rate never falls below ``floor`` x peak, and with
    ``decay_frac`` <= 0.7 it is constant over the convergence gate's window (the last 30 %), so a
    flat tail is a plateau at a fixed rate, neither a schedule that ran out nor one still annealing."""
    t = min(step / max(decay_frac * steps, 1.0), 1.0)
    return floor + (1.0 - floor) * 0.5 * (1.0 + np.cos(np.pi * t))


def train_task(task: str, variant: str, p: dict, seed: int, progress=print) -> dict:
    """Train one RNN on one task; returns scalars, per-trial correctness, curves and the weights."""
    import torch

    from .model import RateRNN

    tcfg = p["conditions"][task]
    steps = int(tcfg.get("steps", p["steps"]))  # a task's own budget, the same for every variant
    task_id = sorted(N_CLASSES).index(task)
    rng_train = np.random.default_rng([seed, task_id, 1])  # same trial stream for every variant
    rng_eval = np.random.default_rng([seed, task_id, 2])
    val = make_batch(task, tcfg["train"], p["n_val"], rng_eval, p["decision_weight"])
    test_id = make_batch(task, tcfg["train"], p["n_test"], rng_eval, p["decision_weight"])
    test_ood = {name: make_batch(task, cond, p["n_test"], rng_eval, p["decision_weight"])
                for name, cond in tcfg["ood"].items()}

    torch.manual_seed(seed * 1009 + task_id)  # same W_in, W_out (and magnitude ranks) for every variant
    model = RateRNN(N_INPUTS[task], p["n_hidden"], N_CLASSES[task], DALE_LAW[variant], g=p["g"],
                    frac_exc=p["frac_exc"], sigma_ln=p["sigma_ln"], alpha=p["alpha"], sigma_rec=p["sigma_rec"])
    device = p.get("device", "cpu")
    model.to(device)
    w0 = model.recurrent_weights().detach().cpu().numpy().copy()
    _, _, rates0 = _evaluate(model, test_id, seed + 1)  # the same test trials and noise as after training
    opt = torch.optim.Adam(model.parameters(), lr=p["lr"])
    floor, decay = float(p.get("lr_floor", 0.2)), float(p.get("lr_decay_frac", 1.0))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, steps, floor, decay))
    gen = torch.Generator(device=device).manual_seed(seed * 7919 + task_id)
    t0 = time.perf_counter()
    curve_steps, train_loss, val_loss, val_acc, lrs, running = [], [], [], [], [], []
    for step in range(1, steps + 1):
        x, y, w, _ = _tensors(make_batch(task, tcfg["train"], p["batch"], rng_train, p["decision_weight"]), device)
        logits, _ = model(x, gen)
        loss = weighted_ce(logits, y, w)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), p["grad_clip"])
        lr_now = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        model.project()  # the OT step (no-op for rnn_free)
        running.append(loss.item())
        if step % p["eval_every"] == 0:
            vl, vc, _ = _evaluate(model, val, seed)
            va = float(np.mean(vc))
            curve_steps.append(step)
            train_loss.append(float(np.mean(running)))
            val_loss.append(vl)
            val_acc.append(va)
            lrs.append(lr_now)
            running = []
    train_seconds = time.perf_counter() - t0
    progress(f"{task}: {steps} steps in {train_seconds:.1f}s, val loss {val_loss[-1]:.3f}, "
             f"val acc {val_acc[-1]:.3f}")

    _, correct_id, rates = _evaluate(model, test_id, seed + 1)
    correct_ood = {name: _evaluate(model, b, seed + 2)[1] for name, b in test_ood.items()}
    W = model.recurrent_weights().detach().cpu().numpy()
    n_exc = int(round(p["frac_exc"] * p["n_hidden"]))
    ee = np.abs(W[:n_exc, :n_exc]).ravel()  # one magnitude law per block: the tail of the E->E block
    rel = np.abs(W) / np.sqrt(block_mean(W**2, n_exc))  # each magnitude relative to its block's RMS
    hist, _ = np.histogram(np.log10(rel[rel > 0]), bins=HIST_EDGES, density=True)
    eig = np.linalg.eigvals(W)
    eig = eig[np.argsort(-np.abs(eig))]
    sv = np.linalg.svd(W, compute_uv=False)
    scalars = {
        "acc_id": float(np.mean(correct_id)),
        "acc_ood": float(np.mean(np.concatenate(list(correct_ood.values())))),
        **{f"acc_ood_{k}": float(np.mean(v)) for k, v in correct_ood.items()},
        "eff_rank": effective_rank(W),
        "eff_rank_init": effective_rank(w0),
        "eff_rank_update": effective_rank(W - w0),
        "eff_rank_fluct": effective_rank(W - block_mean(W, n_exc)),
        "eff_rank_fluct_init": effective_rank(w0 - block_mean(w0, n_exc)),
        "pr": participation_ratio(rates),
        "pr_init": participation_ratio(rates0),
        "hill": hill_tail_index(ee, p["hill_k_frac"]),
        "spectral_radius": float(np.abs(eig[0])),
        "val_loss": val_loss[-1],
        "val_loss_final_slope": final_slope(curve_steps, val_loss),
        "train_seconds": train_seconds,
    }
    curves = {
        "train_loss": (curve_steps, train_loss),
        "val_loss": (curve_steps, val_loss),
        "val_acc": (curve_steps, val_acc),
        "lr": (curve_steps, lrs),
        "mag_hist": (list(0.5 * (HIST_EDGES[1:] + HIST_EDGES[:-1])), list(hist)),
        "eig": (list(eig.real), list(eig.imag)),  # x = Re lambda, value = Im lambda
        "sv": (list(range(1, len(sv) + 1)), list(sv / sv[0])),
    }
    units = {"correct_id": correct_id, "correct_ood": np.concatenate(list(correct_ood.values()))}
    return {"scalars": scalars, "curves": curves, "units": units, "W": W, "W0": w0}


AVERAGED = ("eff_rank", "eff_rank_init", "eff_rank_update", "eff_rank_fluct", "eff_rank_fluct_init", "pr", "pr_init",
            "hill", "spectral_radius", "val_loss_final_slope")


def train(ctx) -> None:
    p = ctx.params
    if ctx.variant not in DALE_LAW:
        raise ValueError(f"unknown variant '{ctx.variant}'; known: {sorted(DALE_LAW)}")
    per_task = {}
    for task in p["tasks"]:
        res = train_task(task, ctx.variant, p, ctx.seed, ctx.progress)
        per_task[task] = res
        for k, v in res["scalars"].items():
            ctx.metrics.scalar(f"{k}_{task}", v)
        for k, (xs, ys) in res["curves"].items():
            ctx.metrics.curve(f"{k}_{task}", xs, ys)
    # per test trial (the same trials, in the same order, for every variant of a seed): the claims'
    # intervals resample trials as well as seeds; the scalars are the means over all trials
    ctx.metrics.units("acc_id", np.concatenate([r["units"]["correct_id"] for r in per_task.values()]))
    ctx.metrics.units("acc_ood", np.concatenate([r["units"]["correct_ood"] for r in per_task.values()]))
    for k in AVERAGED:
        ctx.metrics.scalar(k, float(np.mean([r["scalars"][k] for r in per_task.values()])))
    np.savez_compressed(ctx.outdir / "weights.npz",
                        **{f"W_{t}": r["W"] for t, r in per_task.items()},
                        **{f"W0_{t}": r["W0"] for t, r in per_task.items()})


# --- plots ---------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import curve_plot, plt

    tasks = params.get("tasks", [])
    variants = [v for v in DALE_LAW if v in set(table.variant)]
    colors = {"dale_heavy": "tab:red", "dale_gamma": "tab:green", "dale_gauss": "tab:blue", "rnn_free": "tab:gray"}
    pyplot = plt()

    for task in tasks:
        # weight-magnitude histograms: is the tail kept through training?
        fig, ax = pyplot.subplots(figsize=(5.5, 4))
        sub = table[table.metric == f"mag_hist_{task}"]
        for v in variants:
            g = sub[sub.variant == v].groupby("x").value
            mean, std = g.mean(), g.std().fillna(0.0)
            if mean.empty:
                continue
            ax.plot(mean.index, mean.values, color=colors[v], label=v)
            ax.fill_between(mean.index, np.maximum(mean - std, 1e-3), mean + std, color=colors[v], alpha=0.2)
        ax.set_yscale("log")  # the tails are what differ
        ax.set_ylim(1e-3, None)
        ax.set_xlabel("log10 (|W_ij| / RMS of its E/I block) (dimensionless)")
        ax.set_ylabel("density (1 / decade)")
        ax.set_title(f"{task}: which magnitudes does training leave? (mean +- std over seeds)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save_figure(fig, plots_dir / f"curve_mag_hist_{task}.png", dpi=110)

        # eigen-spectra of the trained connectivity, all seeds overlaid
        eig = table[table.metric == f"eig_{task}"]
        fig, axes = pyplot.subplots(1, len(variants), figsize=(3.4 * len(variants), 3.5), squeeze=False)
        for ax, v in zip(axes[0], variants):
            e = eig[eig.variant == v]
            ax.scatter(e.x, e.value, s=5, color=colors[v], alpha=0.5)
            t = np.linspace(0, 2 * np.pi, 200)
            ax.plot(params.get("g", 1.0) * np.cos(t), params.get("g", 1.0) * np.sin(t), "k:", lw=0.8)
            ax.set_aspect("equal")
            ax.set_xlabel("Re lambda(W) (dimensionless)")
            ax.set_ylabel("Im lambda(W) (dimensionless)")
            ax.set_title(v, fontsize=9)
            ax.grid(alpha=0.3)
        fig.suptitle(f"{task}: do heavy tails leave a few outlying eigenvalues of W? "
                     "(all seeds; dotted: initial bulk radius g)", fontsize=9)
        save_figure(fig, plots_dir / f"curve_eig_{task}.png", dpi=110)

        curve_plot(table, f"sv_{task}", plots_dir / f"curve_sv_{task}.png", logy=True, variants=variants,
                   xlabel="index i", ylabel="s_i / s_1", title=f"{task}: how fast do singular values of W decay?")
        curve_plot(table, f"val_loss_{task}", plots_dir / f"curve_val_loss_{task}.png", variants=variants,
                   xlabel="Adam step", ylabel="validation cross-entropy (nats)",
                   title=f"{task}: has training flattened?")

    # accuracy ID vs OOD, what training does to dimensionality: the claims at a glance
    scal = table[table.x.isna()]
    wide = scal.pivot_table(index=["variant", "seed"], columns="metric", values="value")
    cols = {"acc_id": wide.get("acc_id"), "acc_ood": wide.get("acc_ood")}
    if {"eff_rank_fluct", "eff_rank_fluct_init"} <= set(wide.columns):
        cols["rank_ratio"] = wide["eff_rank_fluct"] / wide["eff_rank_fluct_init"]
    if {"pr", "pr_init"} <= set(wide.columns):
        cols["pr_ratio"] = wide["pr"] / wide["pr_init"]
    panels = [("acc_id", "ID accuracy (fraction)"), ("acc_ood", "OOD accuracy (fraction)"),
              ("rank_ratio", "eff. rank of W - block means,\ntrained / initial"),
              ("pr_ratio", "participation ratio,\ntrained / initial")]
    panels = [(m, label) for m, label in panels if cols.get(m) is not None]
    fig, axes = pyplot.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.6),
                                squeeze=False)
    for ax, (m, label) in zip(axes[0], panels):
        g = cols[m].groupby(level="variant")
        mean, std = g.mean().reindex(variants), g.std().fillna(0.0).reindex(variants)
        ax.bar(range(len(variants)), mean.values, yerr=std.values, color=[colors[v] for v in variants], alpha=0.8)
        ax.set_xticks(range(len(variants)), variants, rotation=20, fontsize=7)
        ax.set_ylabel(label + ("" if m.startswith("acc") else " (dimensionless)"), fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Do heavy tails (red) beat matched light tails (green) out of distribution, and does training "
                 "lower their dimensionality more? (mean +- std over seeds)", fontsize=9)
    save_figure(fig, plots_dir / "summary.png", dpi=110)
