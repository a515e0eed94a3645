"""CBiT in miniature: imputation as conditional inference forward in time, against interpolation,
carry-forward, BRITS and SAITS, on a real series (statsmodels El Nino SST) and on Lorenz-96.

Variants (one cell = one variant x seed, all scored on the same hidden entries):

* ``cbit``: history-compressed partitioned transformer (``models.CBiT``), linear in T;
* ``brits``: bidirectional recurrent imputation (``models.BRITS``), linear in T;
* ``saits``: diagonally-masked self-attention (``models.SAITS``), quadratic in T, applied to
  windows of the training length;
* ``linear``, ``locf``: ``blocks.imputation.linear_interpolation`` / ``carry_forward``.

Stages of a cell, per dataset (elnino: monthly SST, one channel; lorenz96: N variables):
  1. split into train / validation / test segments, z-score each channel on train;
  2. (learned models) train on random windows with artificial holes (random or block, missing
     rate drawn in [0.1, 0.6]) for the same steps, batch, warm-up + cosine schedule and gradient
     clipping; the peak learning rate is each model's best of a common grid on validation data;
     validation masked MAE on a fixed 30 % random mask every ``eval_every`` steps (curve
     ``val_mae_<dataset>``, final slope ``val_slope_<dataset>`` per 100 steps);
  3. test: for each pattern (random, block) and rate (10/30/50 %) a mask drawn from the seed only
     (same for every variant); masked MAE / RMSE on the hidden, truly known entries, in z-units.
Runtime (learned models and linear): inference seconds on a Lorenz-sized input at growing T,
log-log slope ``runtime_slope``; best of ``runtime_repeats``, one thread.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...blocks.imputation import (block_mask, carry_forward, linear_interpolation, masked_mae, masked_rmse,
                                  random_mask)
from reprozoo.figures import save_figure

LEARNED = ("cbit", "brits", "saits")
STATSMODELS_COLUMN = {"elnino": "sst", "co2": "co2", "sunspots": "sunactivity"}  # univariate real series
GENERIC_CURVES = {f"val_mae_{n}": ("training step", "validation masked MAE (z-units)")
                  for n in ("elnino", "co2", "sunspots", "lorenz96")}


# --- data ---------------------------------------------------------------------------------------

def _need(ctx, name):
    if name not in ctx.data:
        raise KeyError(f"cbit: dataset '{name}' is not among the method's datasets {sorted(ctx.data)}; "
                       "add it to spec.yaml `datasets`")
    return Path(ctx.data[name])


def load_series(ctx, name: str) -> dict:
    """{'train', 'val', 'test': (T, C) arrays in z-units; 'obs_*': True where the truth is known}."""
    p = ctx.params
    if name in STATSMODELS_COLUMN:
        from ...data.timeseries.statsmodels_series import load

        df = load(_need(ctx, "ts_statsmodels"))[name]
        x = df[STATSMODELS_COLUMN[name]].to_numpy(float)[:, None]
        known = np.isfinite(x)  # co2's 59 real gaps: never shown, never scored
        a, b = p["split"][name]  # row indices: train < a <= val < b <= test
        parts = {"train": slice(0, a), "val": slice(a, b), "test": slice(b, len(x))}
        segs = {k: x[s] for k, s in parts.items()}
        obs = {k: known[s] for k, s in parts.items()}
        trains = [segs["train"]]
        otrains = [obs["train"]]
    elif name == "lorenz96":
        from ...data.timeseries.lorenz96 import load

        clean = load(_need(ctx, "ts_lorenz96"))["clean"]
        cols = [c for c in clean.columns if c.startswith("x")]
        trajs = sorted(clean["traj"].unique())
        t0 = trajs[ctx.seed % len(trajs)]
        arr = {t: clean[clean["traj"] == t][cols].to_numpy(float) for t in trajs}
        n_test, n_val = int(p["lorenz_test"]), int(p["lorenz_val"])
        segs = {"test": arr[t0][:n_test], "val": arr[t0][n_test:n_test + n_val]}
        trains = [arr[t][: int(p["lorenz_train"])] for t in trajs if t != t0]
        otrains = [np.ones_like(s, dtype=bool) for s in trains]
        obs = {k: np.ones_like(v, dtype=bool) for k, v in segs.items()}
    else:
        raise KeyError(f"cbit: unknown series '{name}'; known: {sorted(STATSMODELS_COLUMN)}, lorenz96")
    allx = np.concatenate(trains)
    allo = np.concatenate(otrains)
    mu = np.array([allx[allo[:, c], c].mean() for c in range(allx.shape[1])])
    sd = np.array([allx[allo[:, c], c].std() for c in range(allx.shape[1])])
    z = lambda a: np.where(np.isfinite(a), (a - mu) / sd, 0.0)  # noqa: E731
    return {"train": [z(t) for t in trains], "obs_train": otrains,
            "val": z(segs["val"]), "obs_val": obs["val"], "test": z(segs["test"]), "obs_test": obs["test"]}


def test_masks(ctx, name: str, shape, known) -> dict:
    """The hidden entries of every (pattern, rate): a function of the seed and dataset only."""
    p = ctx.params
    out = {}
    for i, pattern in enumerate(("random", "block")):
        for j, rate in enumerate(p["rates"]):
            rng = ctx.rng(1000 + 100 * i + j + sum(map(ord, name)))
            seen = random_mask(shape, rate, rng) if pattern == "random" else block_mask(shape, rate, int(p["block"]), rng)
            out[(pattern, rate)] = (seen & known, ~seen & known)  # (model input mask, eval mask)
    return out


# --- learned models -------------------------------------------------------------------------------

def train_windows(rng, trains, otrains, n: int, W: int, block: int):
    """A batch of n windows (n, W, C) with artificial holes: rate ~ U(0.1, 0.6), random or block."""
    xs, ks = [], []
    for _ in range(n):
        s = int(rng.integers(len(trains)))
        t = int(rng.integers(0, len(trains[s]) - W + 1))
        xs.append(trains[s][t:t + W])
        ks.append(otrains[s][t:t + W])
    x, known = np.stack(xs), np.stack(ks)
    rate = rng.uniform(0.1, 0.6, size=(n, 1, 1))
    blocky = rng.random((n, 1, 1)) < 0.5
    nb = -(-W // block) + 1
    coarse = np.repeat(rng.random((n, nb, x.shape[2])), block, axis=1)
    off = int(rng.integers(block))
    u = np.where(blocky, coarse[:, off:off + W], rng.random(x.shape))
    seen = (u >= rate) & known
    return x, seen, known & ~seen


def impute_learned(model, x, seen, window: int | None):
    import torch

    with torch.no_grad():
        xt = torch.tensor(np.where(seen, x, 0.0)[None], dtype=torch.float32)
        mt = torch.tensor(seen[None], dtype=torch.float32)
        if window is None:
            y = model(xt, mt)["impute"][0].numpy()
        else:
            y = np.concatenate([model(xt[:, s:s + window], mt[:, s:s + window])["impute"][0].numpy()
                                for s in range(0, x.shape[0], window)])
    return np.where(seen, x, y)


def lr_factor(step: int, steps: int, warmup: float, schedule: str) -> float:
    """Learning-rate multiplier: linear warm-up over the first ``warmup`` fraction of the steps, then
    constant or a cosine decay to 0 at the last step (the same schedule for every learned model)."""
    w = int(round(warmup * steps))
    if step < w:
        return (step + 1) / w
    if schedule == "cosine":
        return 0.5 * (1 + np.cos(np.pi * (step - w) / max(1, steps - w)))
    if schedule == "constant":
        return 1.0
    raise KeyError(f"cbit: unknown schedule '{schedule}'; known: constant, cosine")


def final_slope(xs, ys) -> float:
    """Least-squares slope of the validation curve over its last third (at least 2 points), per
    100 training steps: how much the model was still learning when training stopped."""
    h = len(ys) - max(2, -(-len(ys) // 3))
    if h < 0:
        return 0.0
    return float(np.polyfit(np.asarray(xs[h:], float), np.asarray(ys[h:], float), 1)[0] * 100)


def fit(ctx, variant: str, name: str, ds: dict):
    """Same objective, steps, batch, schedule, clipping and holes for every learned variant; the peak
    learning rate may be one number or one per model (``lr: {cbit: .., brits: .., saits: ..}``, each
    chosen on validation data from the same grid)."""
    import torch

    from .models import build, loss_fn

    p = ctx.params
    torch.manual_seed(ctx.seed)
    C = ds["val"].shape[1]
    model = build(variant, C, p)
    lr = p["lr"][variant] if isinstance(p["lr"], dict) else p["lr"]
    opt = torch.optim.Adam(model.parameters(), lr=float(lr))
    steps = int(p["steps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, float(p.get("warmup", 0.0)),
                                                                      p.get("schedule", "constant")))
    clip = float(p.get("clip", 0.0))
    rng = ctx.rng(17 + sum(map(ord, name)))
    vseen = random_mask(ds["val"].shape, 0.3, ctx.rng(5)) & ds["obs_val"]
    veval = ds["obs_val"] & ~vseen
    window = int(p["window"]) if variant == "saits" else None
    xs, ys = [], []
    for step in range(steps + 1):
        if step % int(p["eval_every"]) == 0 or step == steps:
            model.eval()
            xs.append(step)
            ys.append(masked_mae(impute_learned(model, ds["val"], vseen, window), ds["val"], veval))
            model.train()
        if step == steps:
            break
        x, seen, hidden = train_windows(rng, ds["train"], ds["obs_train"], int(p["batch"]), int(p["window"]),
                                        int(p["block"]))
        xt = torch.tensor(x, dtype=torch.float32)
        out = model(xt * torch.tensor(seen, dtype=torch.float32), torch.tensor(seen, dtype=torch.float32))
        loss = loss_fn(out, xt, torch.tensor(seen, dtype=torch.float32), torch.tensor(hidden, dtype=torch.float32))
        opt.zero_grad()
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
    ctx.metrics.curve(f"val_mae_{name}", xs, ys)
    ctx.metrics.scalar(f"val_slope_{name}", final_slope(xs, ys))
    ctx.metrics.scalar(f"val_drop_{name}", 1 - ys[-1] / ys[len(ys) - max(2, -(-len(ys) // 3))])  # same span
    model.eval()
    # the runtime check gives every model the whole sequence as context (SAITS: one global window)
    return (lambda x, seen: impute_learned(model, x, seen, window)), (lambda x, seen: impute_learned(model, x, seen, None))


def runtime_slope(ctx, impute, C: int) -> None:
    lengths = [int(v) for v in ctx.params["runtime_lengths"]]
    rng = np.random.default_rng(0)
    secs = []
    for T in lengths:
        x = rng.standard_normal((T, C))
        seen = rng.random((T, C)) >= 0.3
        best = np.inf
        for _ in range(int(ctx.params["runtime_repeats"])):
            t0 = time.process_time()
            impute(x, seen)
            best = min(best, time.process_time() - t0)
        secs.append(best)
    slope = np.polyfit(np.log(lengths), np.log(np.maximum(secs, 1e-6)), 1)[0]
    ctx.metrics.curve("runtime_s", lengths, secs)
    ctx.metrics.scalar("runtime_slope", float(slope))


# --- cell ---------------------------------------------------------------------------------------

def train(ctx) -> None:
    p, v = ctx.params, ctx.variant
    if v in LEARNED:
        import torch

        torch.set_num_threads(max(1, ctx.threads))
    lorenz_C = None
    per = {}
    for name in p["series"]:
        ds = load_series(ctx, name)
        if v in LEARNED:
            t0 = time.process_time()
            impute, full_context = fit(ctx, v, name, ds)
            ctx.metrics.scalar(f"train_cpu_s_{name}", time.process_time() - t0)
        elif v == "linear":
            impute = full_context = lambda x, seen: linear_interpolation(x, seen)  # noqa: E731
        elif v == "locf":
            impute = full_context = lambda x, seen: carry_forward(x, seen)  # noqa: E731
        else:
            raise KeyError(f"cbit: unknown variant '{v}'")
        x = ds["test"]
        for (pattern, rate), (seen, ev) in test_masks(ctx, name, x.shape, ds["obs_test"]).items():
            y = impute(x, seen)
            key = f"{pattern}_{int(round(100 * rate))}"
            per.setdefault(key, []).append((masked_mae(y, x, ev), masked_rmse(y, x, ev)))
            ctx.metrics.scalar(f"mae_{name}_{key}", per[key][-1][0])
            ctx.metrics.scalar(f"rmse_{name}_{key}", per[key][-1][1])
            if (pattern, rate) == ("block", p["rates"][1]):
                k = min(len(x), int(p["example_len"]))
                ctx.metrics.curve(f"example_truth_{name}", range(k), x[:k, 0])
                ctx.metrics.curve(f"example_imputed_{name}", range(k), y[:k, 0])
                ctx.metrics.curve(f"example_hidden_{name}", range(k), ev[:k, 0].astype(float))
        if name == "lorenz96":
            lorenz_C, lorenz_impute = x.shape[1], full_context
        ctx.progress(f"{name}: " + ", ".join(f"{k} {per[k][-1][0]:.3f}" for k in per))
    for pattern in ("random", "block"):
        maes = []
        for rate in p["rates"]:
            key = f"{pattern}_{int(round(100 * rate))}"
            mae, rmse = np.mean([a for a, _ in per[key]]), np.mean([b for _, b in per[key]])
            ctx.metrics.scalar(f"mae_{key}", mae)  # mean over the series, z-units
            ctx.metrics.scalar(f"rmse_{key}", rmse)
            maes.append(mae)
        ctx.metrics.curve(f"mae_vs_rate_{pattern}", [100 * r for r in p["rates"]], maes)
    if v != "locf" and lorenz_C is not None:
        runtime_slope(ctx, lorenz_impute, lorenz_C)


# --- plots --------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    t = table
    order = [v for v in ("cbit", "brits", "saits", "linear", "locf") if v in set(t.variant)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, pattern in zip(axes, ("random", "block")):
        sub = t[t.metric == f"mae_vs_rate_{pattern}"]
        for v in order:
            g = sub[sub.variant == v].groupby("x")["value"]
            mean, sd = g.mean(), g.std().fillna(0.0)
            ax.plot(mean.index, mean.values, "o-", label=v)
            ax.fill_between(mean.index, mean - sd, mean + sd, alpha=0.2)
        ax.set_xlabel("missing rate (%)")
        ax.set_title(f"{pattern} mask", fontsize=9)
    axes[0].set_ylabel("masked MAE (z-units, mean over series; band ±1 sd over seeds)")
    axes[1].legend(fontsize=8)
    fig.suptitle("Does CBiT have the lowest masked MAE at every missing rate?", fontsize=10)
    save_figure(fig, plots_dir / "mae_vs_rate.png", dpi=110)

    seed0 = t.seed.min() if len(t) else 0
    for name in params.get("series", ["elnino", "lorenz96"]):
        truth = t[(t.metric == f"example_truth_{name}") & (t.seed == seed0)]
        if truth.empty:
            continue
        truth = truth[truth.variant == truth.variant.iloc[0]].sort_values("x")
        hid = t[(t.metric == f"example_hidden_{name}") & (t.seed == seed0)]
        hid = hid[hid.variant == hid.variant.iloc[0]].sort_values("x")
        fig, ax = plt.subplots(figsize=(11, 3.8))
        xs, hv = hid.x.to_numpy(), hid.value.to_numpy() > 0.5
        for i in np.flatnonzero(hv):
            ax.axvspan(xs[i] - 0.5, xs[i] + 0.5, color="0.85", lw=0)
        ax.plot(truth.x, truth.value, "k-", lw=1.6, label="truth")
        for v in order:
            e = t[(t.metric == f"example_imputed_{name}") & (t.seed == seed0) & (t.variant == v)].sort_values("x")
            ax.plot(e.x, e.value, lw=0.9, label=v)
        ax.set_xlabel("test time step (elnino: months; lorenz96: 0.05 model time units)")
        ax.set_ylabel("value (z-units of channel 0)")
        ax.set_title(f"{name}, block mask {int(100 * params.get('rates', [0, 0.3])[1])} % (hidden steps shaded): "
                     "which imputation follows the truth through the gaps?", fontsize=9)
        ax.legend(fontsize=7, ncol=6)
        save_figure(fig, plots_dir / f"imputed_{name}.png", dpi=110)

    rt = t[t.metric == "runtime_s"]
    if not rt.empty:
        fig, ax = plt.subplots(figsize=(6, 4))
        for v in [v for v in order if v in set(rt.variant)]:
            g = rt[rt.variant == v].groupby("x")["value"]
            ax.loglog(g.mean().index, g.mean().values, "o-", label=v)
        ax.set_xlabel("sequence length T (steps)")
        ax.set_ylabel("inference CPU time (s, 1 thread)")
        ax.set_title("Does CBiT's inference time grow linearly with length?", fontsize=9)
        ax.legend(fontsize=8)
        save_figure(fig, plots_dir / "runtime_vs_length.png", dpi=110)
