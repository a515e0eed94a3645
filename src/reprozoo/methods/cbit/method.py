"""CBiT in miniature: imputation as conditional inference forward in time, against interpolation,
carry-forward, BRITS and SAITS, on a real series (statsmodels El Nino SST) and on Lorenz-96.

Variants (one cell = one variant x seed, all scored on the same hidden entries of the same windows):

* ``cbit``: history-compressed partitioned transformer (``models.CBiT``), linear in T;
* ``brits``: bidirectional recurrent imputation (``models.BRITS``);
* ``saits``: diagonally-masked self-attention (``models.SAITS``);
* ``linear``, ``locf``: ``blocks.imputation.linear_interpolation`` / ``carry_forward``;
* ``cbit_untrained``: CBiT at its initialisation (the seed's weights, no training), the negative
  control every claim must fail on.

Every model sees the same context: the test (and validation) segment is cut into non-overlapping
windows of ``window`` steps, the training length, and each window is imputed on its own (learned
models as one batch, the classical baselines window by window). The windows are the test units
(``ctx.metrics.units``): El Nino 5 windows of 48 months, Lorenz-96 20 windows of 48 samples.

Stages of a cell, per dataset (elnino: monthly SST, one channel; lorenz96: 40 variables sampled
every ``lorenz_every`` x 0.05 time units):
  1. split into train / validation / test, z-score each channel on train;
  2. (learned models) train on random windows with artificial holes (random or block, missing
     rate drawn in [0.1, 0.6]), all models alike: batch, Adam, linear warm-up then a constant
     learning rate (each model's best of one grid on validation), gradient clipping, at most
     ``max_steps``; every ``eval_every`` steps the validation masked MAE (mean of a 30 % random and a
     30 % block mask on the validation windows; curve ``val_mae_<dataset>``, learning rate
     ``lr_<dataset>``). Training stops when that curve is flat by the convergence gate's own test
     (``reprozoo.claims.plateau``, after ``min_steps``); the best validation checkpoint is kept;
  3. test: for each pattern (random, block) and rate (10/30/50 %) per-window masks drawn from the
     seed and dataset only (the same for every variant); masked MAE / RMSE per window on the
     hidden, truly known entries, in z-units.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np

from ...blocks.imputation import block_mask, carry_forward, linear_interpolation
from reprozoo.figures import save_figure

LEARNED = ("cbit", "brits", "saits")
UNTRAINED = "cbit_untrained"
STATSMODELS_COLUMN = {"elnino": "sst", "co2": "co2", "sunspots": "sunactivity"}  # univariate real series
GENERIC_CURVES = {f"val_mae_{n}": ("training step", "validation masked MAE (z-units)")
                  for n in ("elnino", "co2", "sunspots", "lorenz96")}
PATTERNS = ("random", "block")


# --- data ---------------------------------------------------------------------------------------

def _need(ctx, name):
    if name not in ctx.data:
        raise KeyError(f"cbit: dataset '{name}' is not among the method's datasets {sorted(ctx.data)}; "
                       "add it to spec.yaml `datasets`")
    return Path(ctx.data[name])


def load_series(ctx, name: str) -> dict:
    """{'train': [(T, C)], 'obs_train': [...], 'val', 'test': (T, C) in z-units; 'obs_*': True where
    the truth is known}. Lorenz-96 is sampled every ``lorenz_every`` stored steps (0.05 each)."""
    p = ctx.params
    if name in STATSMODELS_COLUMN:
        from ...data.timeseries.statsmodels_series import load

        df = load(_need(ctx, "ts_statsmodels"))[name]
        x = df[STATSMODELS_COLUMN[name]].to_numpy(float)[:, None]
        known = np.isfinite(x)  # co2's real gaps: never shown, never scored
        a, b = p["split"][name]  # row indices: train < a <= val < b <= test
        parts = {"train": slice(0, a), "val": slice(a, b), "test": slice(b, len(x))}
        segs = {k: x[s] for k, s in parts.items()}
        obs = {k: known[s] for k, s in parts.items()}
        trains, otrains = [segs["train"]], [obs["train"]]
    elif name == "lorenz96":
        from ...data.timeseries.lorenz96 import load

        clean = load(_need(ctx, "ts_lorenz96"))["clean"]
        cols = [c for c in clean.columns if c.startswith("x")][: int(p.get("lorenz_vars", 10**9))]
        k = int(p.get("lorenz_every", 1))
        trajs = sorted(clean["traj"].unique())
        arr = {t: clean[clean["traj"] == t].sort_values("step")[cols].to_numpy(float)[::k] for t in trajs}
        n_test, n_val = int(p["lorenz_test"]), int(p["lorenz_val"])
        t0 = trajs[ctx.seed % len(trajs)]
        segs = {"test": arr[t0][:n_test]}
        if len(trajs) >= 3:  # validation on a trajectory of its own, training on the rest
            tv = trajs[(ctx.seed + 1) % len(trajs)]
            segs["val"] = arr[tv][:n_val]
        else:  # (ci) validation after the test segment of the same trajectory
            tv = t0
            segs["val"] = arr[t0][n_test:n_test + n_val]
        if len(segs["test"]) < n_test or len(segs["val"]) < n_val:
            raise ValueError(f"cbit: Lorenz-96 trajectories hold {len(arr[t0])} samples at lorenz_every={k}; "
                             f"need {n_test} test + {n_val} validation")
        trains = [arr[t] for t in trajs if t not in (t0, tv)]
        otrains = [np.ones_like(s, dtype=bool) for s in trains]
        obs = {s: np.ones_like(v, dtype=bool) for s, v in segs.items()}
    else:
        raise KeyError(f"cbit: unknown series '{name}'; known: {sorted(STATSMODELS_COLUMN)}, lorenz96")
    allx, allo = np.concatenate(trains), np.concatenate(otrains)
    mu = np.array([allx[allo[:, c], c].mean() for c in range(allx.shape[1])])
    sd = np.array([allx[allo[:, c], c].std() for c in range(allx.shape[1])])
    z = lambda a: np.where(np.isfinite(a), (a - mu) / sd, 0.0)  # noqa: E731
    return {"train": [z(t) for t in trains], "obs_train": otrains,
            "val": z(segs["val"]), "obs_val": obs["val"], "test": z(segs["test"]), "obs_test": obs["test"]}


def windows(x: np.ndarray, W: int) -> np.ndarray:
    """(T, C) -> (T // W, W, C): non-overlapping windows, a remainder shorter than W dropped."""
    n = x.shape[0] // W
    if n == 0:
        raise ValueError(f"cbit: a segment of {x.shape[0]} steps holds no window of {W}")
    return x[:n * W].reshape(n, W, x.shape[1])


def exact_random_mask(known: np.ndarray, rate: float, rng) -> np.ndarray:
    """Observed-mask (True = shown) of one window: exactly round(rate x known entries) of its known
    entries hidden, at least one, chosen uniformly (random holes, MCAR)."""
    idx = np.flatnonzero(known)
    k = min(len(idx), max(1, int(round(rate * len(idx)))))
    seen = known.copy().reshape(-1)
    seen[rng.choice(idx, size=k, replace=False)] = False
    return seen.reshape(known.shape)


def window_masks(shape, known, pattern: str, rate: float, block: int, rng) -> np.ndarray:
    """Observed-mask of (n, W, C) windows: each window its own holes (so every window is a unit
    with hidden entries)."""
    out = np.empty(shape, dtype=bool)
    for i in range(shape[0]):
        if pattern == "random":
            out[i] = exact_random_mask(known[i], rate, rng)
        else:
            out[i] = block_mask(shape[1:], rate, block, rng) & known[i]
    return out


def test_masks(ctx, name: str, shape, known) -> dict:
    """The hidden entries of every (pattern, rate): a function of the seed and dataset only."""
    p = ctx.params
    out = {}
    for i, pattern in enumerate(PATTERNS):
        for j, rate in enumerate(p["rates"]):
            rng = ctx.rng(1000 + 100 * i + j + sum(map(ord, name)))
            seen = window_masks(shape, known, pattern, rate, int(p["block"]), rng)
            out[(pattern, rate)] = (seen, known & ~seen)  # (model input mask, eval mask)
    return out


def val_masks(ctx, name: str, shape, known) -> list:
    """The fixed validation holes: a 30 % random and a 30 % block mask (seed and dataset only)."""
    rng = ctx.rng(5 + sum(map(ord, name)))
    out = []
    for pattern in PATTERNS:
        seen = window_masks(shape, known, pattern, 0.3, int(ctx.params["block"]), rng)
        out.append((seen, known & ~seen))
    return out


def window_errors(y: np.ndarray, x: np.ndarray, ev: np.ndarray):
    """Per-window masked MAE and RMSE over the hidden entries ev of (n, W, C) windows."""
    n = x.shape[0]
    err, e = (y - x).reshape(n, -1), ev.reshape(n, -1)
    cnt = e.sum(1)
    if (cnt == 0).any():
        raise ValueError("cbit: a test window has no hidden entry")
    mae = (np.abs(err) * e).sum(1) / cnt
    rmse = np.sqrt((err ** 2 * e).sum(1) / cnt)
    return mae, rmse


# --- imputers -----------------------------------------------------------------------------------

def impute_learned(model, xw: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """(n, W, C) windows, all in one batch; observed entries are kept as they are."""
    import torch

    with torch.no_grad():
        xt = torch.tensor(np.where(seen, xw, 0.0), dtype=torch.float32)
        mt = torch.tensor(seen, dtype=torch.float32)
        y = model(xt, mt)["impute"].numpy().astype(float)
    return np.where(seen, xw, y)


def impute_classical(fn, xw: np.ndarray, seen: np.ndarray) -> np.ndarray:
    return np.stack([fn(xw[i], seen[i]) for i in range(xw.shape[0])])


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


def lr_factor(step: int, warmup_steps: int) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup_steps``, then constant (no decay: the
    convergence gate must see the plateau while the rate is still up)."""
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def peak_lr(p: dict, variant: str) -> float:
    lr = p["lr"]
    return float(lr[variant] if isinstance(lr, dict) else lr)


def fit(ctx, variant: str, name: str, ds: dict, lr: float | None = None):
    """Train one learned model on one dataset; the same protocol for every model. Returns the model
    (best validation checkpoint) and a record of the run."""
    import torch

    from ...claims import plateau
    from .models import build, loss_fn

    p = ctx.params
    torch.manual_seed(ctx.seed)
    W = int(p["window"])
    C = ds["val"].shape[1]
    model = build(variant, C, p)
    lr = peak_lr(p, variant) if lr is None else float(lr)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    max_steps, min_steps = int(p["max_steps"]), int(p["min_steps"])
    warm = int(p.get("warmup_steps", 0))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warm))
    clip, tol = float(p.get("clip", 0.0)), float(p.get("stop_tol", 0.02))
    rng = ctx.rng(17 + sum(map(ord, name)))
    xv = windows(ds["val"], W)
    vmasks = val_masks(ctx, name, xv.shape, windows(ds["obs_val"], W))

    def val_mae():
        model.eval()
        errs = [window_errors(impute_learned(model, xv, seen), xv, ev)[0].mean() for seen, ev in vmasks]
        model.train()
        return float(np.mean(errs))

    xs, ys, lrs = [], [], []
    best = (np.inf, None, 0)
    stopped = False
    t0 = time.process_time()
    for step in range(max_steps + 1):
        if step % int(p["eval_every"]) == 0 or step == max_steps:
            xs.append(step)
            ys.append(val_mae())
            lrs.append(opt.param_groups[0]["lr"])
            if ys[-1] < best[0]:
                best = (ys[-1], copy.deepcopy(model.state_dict()), step)
            if step >= min_steps and plateau(xs, ys, tol=tol):
                stopped = True
                break
        if step == max_steps:
            break
        x, seen, hidden = train_windows(rng, ds["train"], ds["obs_train"], int(p["batch"]), W, int(p["block"]))
        xt, st, ht = (torch.tensor(a, dtype=torch.float32) for a in (x, seen, hidden))
        loss = loss_fn(model(xt * st, st), xt, st, ht)
        opt.zero_grad()
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
    model.load_state_dict(best[1])
    model.eval()
    return model, {"steps": xs, "val": ys, "lr": lrs, "stopped": stopped, "best_step": best[2],
                   "best_val": best[0], "cpu_s": time.process_time() - t0}


# --- cell ---------------------------------------------------------------------------------------

def train(ctx) -> None:
    p, v = ctx.params, ctx.variant
    if v in LEARNED or v == UNTRAINED:
        import torch

        torch.set_num_threads(max(1, ctx.threads))
    W = int(p["window"])
    per: dict[str, list] = {}
    for name in p["series"]:
        ds = load_series(ctx, name)
        if v in LEARNED:
            model, rec = fit(ctx, v, name, ds)
            ctx.metrics.curve(f"val_mae_{name}", rec["steps"], rec["val"])
            ctx.metrics.curve(f"lr_{name}", rec["steps"], rec["lr"])
            ctx.metrics.scalar(f"steps_{name}", rec["steps"][-1])
            ctx.metrics.scalar(f"stopped_flat_{name}", float(rec["stopped"]))
            ctx.metrics.scalar(f"best_step_{name}", rec["best_step"])
            ctx.metrics.scalar(f"train_cpu_s_{name}", rec["cpu_s"])
            ctx.progress(f"{name}: {rec['steps'][-1]} steps ({'flat' if rec['stopped'] else 'max_steps'}), "
                         f"best val MAE {rec['best_val']:.3f} at {rec['best_step']}, {rec['cpu_s']:.1f} CPU-s")
            impute = lambda xw, seen, m=model: impute_learned(m, xw, seen)  # noqa: E731
        elif v == UNTRAINED:
            from .models import build

            torch.manual_seed(ctx.seed)
            model = build("cbit", ds["val"].shape[1], p).eval()
            impute = lambda xw, seen, m=model: impute_learned(m, xw, seen)  # noqa: E731
        elif v == "linear":
            impute = lambda xw, seen: impute_classical(linear_interpolation, xw, seen)  # noqa: E731
        elif v == "locf":
            impute = lambda xw, seen: impute_classical(carry_forward, xw, seen)  # noqa: E731
        else:
            raise KeyError(f"cbit: unknown variant '{v}'")
        xw = windows(ds["test"], W)
        known = windows(ds["obs_test"], W)
        for (pattern, rate), (seen, ev) in test_masks(ctx, name, xw.shape, known).items():
            y = impute(xw, seen)
            key = f"{pattern}_{int(round(100 * rate))}"
            mae, rmse = window_errors(y, xw, ev)
            ctx.metrics.units(f"mae_{name}_{key}", mae)
            ctx.metrics.units(f"rmse_{name}_{key}", rmse)
            per.setdefault(key, []).append((mae.mean(), rmse.mean()))
            if (pattern, rate) == ("block", p["rates"][1]):
                k = min(xw.shape[0], max(1, int(p["example_len"]) // W))
                ctx.metrics.curve(f"example_truth_{name}", range(k * W), xw[:k, :, 0].reshape(-1))
                ctx.metrics.curve(f"example_imputed_{name}", range(k * W), y[:k, :, 0].reshape(-1))
                ctx.metrics.curve(f"example_hidden_{name}", range(k * W), ev[:k, :, 0].reshape(-1).astype(float))
        for pattern in PATTERNS:
            ctx.metrics.curve(f"mae_vs_rate_{name}_{pattern}", [100 * r for r in p["rates"]],
                              [ctx.metrics.scalars[f"mae_{name}_{pattern}_{int(round(100 * r))}"] for r in p["rates"]])
        ctx.progress(f"{name}: " + ", ".join(f"{k} {per[k][-1][0]:.3f}" for k in per))
    for key, vals in per.items():  # mean over the series (z-units), for the table
        ctx.metrics.scalar(f"mae_{key}", np.mean([a for a, _ in vals]))
        ctx.metrics.scalar(f"rmse_{key}", np.mean([b for _, b in vals]))


# --- plots --------------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    t = table
    order = [v for v in ("cbit", "brits", "saits", "linear", "locf", UNTRAINED) if v in set(t.variant)]
    series = params.get("series", ["elnino", "lorenz96"])
    fig, axes = plt.subplots(len(series), 2, figsize=(11, 3.6 * len(series)), squeeze=False)
    for r, name in enumerate(series):
        for ax, pattern in zip(axes[r], PATTERNS):
            sub = t[t.metric == f"mae_vs_rate_{name}_{pattern}"]
            for v in order:
                g = sub[sub.variant == v].groupby("x")["value"]
                if g.ngroups == 0:
                    continue
                mean, sd = g.mean(), g.std().fillna(0.0)
                ax.plot(mean.index, mean.values, "o-" if v != UNTRAINED else "x:", label=v)
                ax.fill_between(mean.index, mean - sd, mean + sd, alpha=0.2)
            ax.set_xlabel("missing rate (%)")
            ax.set_ylabel("masked MAE (z-units)")
            ax.set_title(f"{name}, {pattern} holes (band: ±1 sd over seeds)", fontsize=9)
    axes[0][1].legend(fontsize=8)
    fig.suptitle("Does CBiT have the lowest masked MAE at every missing rate?", fontsize=10)
    save_figure(fig, plots_dir / "mae_vs_rate.png", dpi=110)

    seed0 = t.seed.min() if len(t) else 0
    for name in series:
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
        W = int(params.get("window", 48))
        for b in range(W, int(xs.max()) + 1, W):
            ax.axvline(b - 0.5, color="0.6", lw=0.6, ls="--")
        ax.plot(truth.x, truth.value, "k-", lw=1.6, label="truth")
        for v in [v for v in order if v != UNTRAINED]:
            e = t[(t.metric == f"example_imputed_{name}") & (t.seed == seed0) & (t.variant == v)].sort_values("x")
            ax.plot(e.x, e.value, lw=0.9, label=v)
        dt = 0.05 * int(params.get("lorenz_every", 1))
        ax.set_xlabel(f"test time step (elnino: months; lorenz96: {dt:g} model time units); dashed: window edges")
        ax.set_ylabel("value (z-units of channel 0)")
        ax.set_title(f"{name}, block holes {int(100 * params.get('rates', [0, 0.3])[1])} % (hidden steps shaded): "
                     "which imputation follows the truth through the gaps?", fontsize=9)
        ax.legend(fontsize=7, ncol=6)
        save_figure(fig, plots_dir / f"imputed_{name}.png", dpi=110)
