"""CBiT in miniature: imputation as conditional inference forward in time, against interpolation,
carry-forward, BRITS and SAITS, on a real series (statsmodels' weekly Mauna Loa CO2) and on Lorenz-96.

Variants (one cell = one variant x seed, all scored on the same hidden entries of the same windows):

* ``cbit``: history-compressed partitioned transformer (``models.CBiT``), linear in T;
* ``cbit_nomem``: the ablation, the same model with its memory never updated;
* ``brits``: bidirectional recurrent imputation (``models.BRITS``);
* ``saits``: diagonally-masked self-attention (``models.SAITS``);
* ``linear``, ``locf``: ``blocks.imputation.linear_interpolation`` / ``carry_forward``;
* ``cbit_untrained``: CBiT at its initialisation (the seed's weights, no training), the negative
  control every claim must fail on.

Every model sees the same context: the test (and validation) segment is cut into non-overlapping
windows of ``window`` steps, the training length, and each window is imputed on its own (learned
models as one batch, the classical baselines window by window). The windows are the test units
(``ctx.metrics.units``): CO2 9 windows of 48 weeks, Lorenz-96 20 windows of 48 samples.

Stages of a cell, per dataset (co2: weekly, one channel, interleaved blocks of ``window`` weeks for
train / validation / test and a polynomial trend fitted on the training weeks removed; lorenz96: a
section of ``lorenz_vars`` variables sampled every ``lorenz_every`` x 0.05 time units):
  1. split into train / validation / test, z-score each channel on train;
  2. (learned models) train on random windows with artificial holes (random or block, missing
     rate drawn in [0.1, 0.6]), all models alike with the platform's rule
     (``blocks.fitting.fit_to_plateau``, config ``fit``: the rate of the config's ``lr`` table, chosen
     once on seed 0's validation windows from one grid for every model by ``lr_grid.py``, to a
     plateau, one drop to a tenth, a second plateau); every
     ``eval_every`` steps the validation masked MAE (mean of a 30 % random and a 30 % block mask on
     the validation windows; curve ``val_mae_<dataset>``, learning rate ``lr_<dataset>``); the best
     validation checkpoint is kept;
  3. test: for each pattern (random, block) and rate (10/30/50 %) per-window masks drawn from the
     seed and dataset only (the same for every variant); masked MAE / RMSE per window on the
     hidden, truly known entries, in z-units (and the number and fraction of hidden entries).

Block holes are gaps of the series' own length (config ``block``, a number or ``{series: length}``;
``gap_length``), in the test, validation and training masks alike. CO2's 13 weeks are a quarter of its
seasonal cycle, by ``quarter_cycle_gap`` on the training runs only: across a quarter cycle the chord
misses a sinusoid by up to 1 - cos(pi / 4) = 0.29 of its amplitude (0.11 across 8 of 52 weeks), so the
cycle's shape, which a learned imputer can know, is a first-order part of linear interpolation's error.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...blocks.imputation import block_mask, carry_forward, linear_interpolation
from reprozoo.figures import save_figure

LEARNED = ("cbit", "cbit_nomem", "brits", "saits")
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


def load_series(ctx, name: str, pilot_seeds=None) -> dict:
    """{'train': [(T, C)], 'obs_train': [...], 'val', 'test': (T, C) in z-units; 'obs_*': True where
    the truth is known}. Lorenz-96 is sampled every ``lorenz_every`` stored steps (0.05 each).

    ``pilot_seeds`` (``lr_grid.py``'s rate pilots): Lorenz-96 training also leaves out the test
    trajectory of every one of these seeds, so the pilot that fixes the rates reads no test data of any
    seed (its validation trajectory is never a test trajectory; CO2's test blocks are the same for every
    seed and never train or validate)."""
    p = ctx.params
    if name in STATSMODELS_COLUMN:
        from ...data.timeseries.statsmodels_series import load

        df = load(_need(ctx, "ts_statsmodels"))[name]
        x = df[STATSMODELS_COLUMN[name]].to_numpy(float)[:, None]
        known = np.isfinite(x)  # co2's real gaps: never shown, never scored
        sp = p["split"][name]
        if isinstance(sp, dict):  # interleaved blocks of `window` steps (co2: the trend stays in range)
            W, per = int(p["window"]), int(sp["period"])
            n = len(x) // W
            role = ["test" if i % per == int(sp["test"]) else "val" if i % per == int(sp["val"]) else "train"
                    for i in range(n)] + ["train"]  # the remainder after the last whole block trains
            edges = [i * W for i in range(n)] + [n * W, len(x)]
            runs, cur = [], None  # contiguous runs of blocks of one role
            for i, r in enumerate(role):
                a, b = edges[i], edges[i + 1]
                if b <= a:
                    continue
                if cur and cur[0] == r and cur[2] == a:
                    cur[2] = b
                else:
                    cur = [r, a, b]
                    runs.append(cur)
            segs = {k: np.concatenate([x[a:b] for r, a, b in runs if r == k]) for k in ("val", "test")}
            obs = {k: np.concatenate([known[a:b] for r, a, b in runs if r == k]) for k in ("val", "test")}
            trains = [x[a:b] for r, a, b in runs if r == "train" and b - a >= W]
            otrains = [known[a:b] for r, a, b in runs if r == "train" and b - a >= W]
            t_tr = np.concatenate([np.arange(a, b) for r, a, b in runs if r == "train" and b - a >= W])
            deg = int(p.get("detrend", {}).get(name, -1))
            if deg >= 0:  # a polynomial trend in time fitted on the known training steps, removed everywhere
                ok = np.concatenate(otrains)[:, 0]
                coef = np.polyfit(t_tr[ok], np.concatenate(trains)[ok, 0], deg)
                trend = np.polyval(coef, np.arange(len(x)))[:, None]
                xd = x - trend
                segs = {k: np.concatenate([xd[a:b] for r, a, b in runs if r == k]) for k in ("val", "test")}
                trains = [xd[a:b] for r, a, b in runs if r == "train" and b - a >= W]
        else:
            a, b = sp  # row indices: train < a <= val < b <= test
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
        if len(trajs) >= 3:  # validation on the last trajectory, never a test trajectory of any seed (the
            tv = trajs[-1]   # rates chosen on seed 0's validation read no seed's test data); test on
            t0 = trajs[ctx.seed % (len(trajs) - 1)]  # trajectory seed mod (n - 1), training on the rest
            segs = {"test": arr[t0][:n_test], "val": arr[tv][:n_val]}
        else:  # (ci) validation after the test segment of the same trajectory
            t0 = tv = trajs[ctx.seed % len(trajs)]
            segs = {"test": arr[t0][:n_test], "val": arr[t0][n_test:n_test + n_val]}
        if len(segs["test"]) < n_test or len(segs["val"]) < n_val:
            raise ValueError(f"cbit: Lorenz-96 trajectories hold {len(arr[t0])} samples at lorenz_every={k}; "
                             f"need {n_test} test + {n_val} validation")
        excl = {t0, tv}
        if pilot_seeds is not None and len(trajs) >= 3:
            excl |= {trajs[int(q) % (len(trajs) - 1)] for q in pilot_seeds}
        trains = [arr[t] for t in trajs if t not in excl]
        otrains = [np.ones_like(s, dtype=bool) for s in trains]
        obs = {s: np.ones_like(v, dtype=bool) for s, v in segs.items()}
    else:
        raise KeyError(f"cbit: unknown series '{name}'; known: {sorted(STATSMODELS_COLUMN)}, lorenz96")
    allx, allo = np.concatenate(trains), np.concatenate(otrains)
    mu = np.array([allx[allo[:, c], c].mean() for c in range(allx.shape[1])])
    sd = np.array([allx[allo[:, c], c].std() for c in range(allx.shape[1])])
    z = lambda a: np.where(np.isfinite(a), (a - mu) / sd, 0.0)  # noqa: E731
    return {"train": [z(t) for t in trains], "obs_train": otrains,
            "val": z(segs["val"]), "obs_val": obs["val"], "test": z(segs["test"]), "obs_test": obs["test"],
            "mu": mu, "sd": sd}


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


def gap_length(p: dict, name: str) -> int:
    """The block-hole length of a series: ``block`` is one length for every series or a table
    ``{series: length}`` (configs: CO2 13 weeks, a quarter of its seasonal cycle, ``quarter_cycle_gap``)."""
    b = p["block"]
    if isinstance(b, dict):
        if name not in b:
            raise KeyError(f"cbit: `block` has no gap length for series '{name}' (has {sorted(b)})")
        return int(b[name])
    return int(b)


def quarter_cycle_gap(trains, otrains, max_lag: int = 80, min_acf: float = 0.5):
    """The gap-length rule, on training data only: a quarter of the dominant cycle, the lag of the
    highest autocorrelation after its first minimum (channel 0, known pairs of every training run),
    rounded. Returns (gap, period, acf at the period); gap is None where the series has no clear cycle
    (autocorrelation at the peak below ``min_acf``: the rule does not apply)."""
    num, cnt = np.zeros(max_lag + 1), np.zeros(max_lag + 1)
    for t, o in zip(trains, otrains):
        x, ok = t[:, 0], o[:, 0]
        for lag in range(min(max_lag + 1, len(x))):
            a = ok[:len(x) - lag] & ok[lag:]
            num[lag] += (x[:len(x) - lag][a] * x[lag:][a]).sum()
            cnt[lag] += a.sum()
    acf = num / np.maximum(cnt, 1)
    acf = acf / acf[0]
    lo = int(np.argmin(acf[: max_lag // 2 + 1]))
    period = lo + int(np.argmax(acf[lo:]))
    if acf[period] < min_acf or period <= lo:
        return None, period, float(acf[period])
    return int(round(period / 4)), period, float(acf[period])


def test_masks(ctx, name: str, shape, known) -> dict:
    """The hidden entries of every (pattern, rate): a function of the seed and dataset only."""
    p = ctx.params
    out = {}
    for i, pattern in enumerate(PATTERNS):
        for j, rate in enumerate(p["rates"]):
            rng = ctx.rng(1000 + 100 * i + j + sum(map(ord, name)))
            seen = window_masks(shape, known, pattern, rate, gap_length(p, name), rng)
            out[(pattern, rate)] = (seen, known & ~seen)  # (model input mask, eval mask)
    return out


def val_masks(ctx, name: str, shape, known) -> list:
    """The fixed validation holes: a 30 % random and a 30 % block mask (seed and dataset only)."""
    rng = ctx.rng(5 + sum(map(ord, name)))
    out = []
    for pattern in PATTERNS:
        seen = window_masks(shape, known, pattern, 0.3, gap_length(ctx.params, name), rng)
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


def fit(ctx, variant: str, name: str, ds: dict, lr_grid=None):
    """Train one learned model on one dataset with the platform's shared rule
    (``blocks.fitting.fit_to_plateau``, config ``fit``) at the rate of the config's ``lr`` table (chosen
    once on seed 0's validation windows by ``lr_grid.py``, the same grid for every model): trained on
    until the validation curve is flat (``flat_tol``, half the gate's tolerance), one drop to a tenth of
    the rate and a second plateau after it. Without an ``lr`` table (or with ``lr_grid`` given, as
    ``lr_grid.py`` does) the grid ``fit.lr_grid`` is piloted ``pilot_steps`` steps per rate from the same
    initial weights on the same batches and ranked on validation. Returns the model (best validation
    checkpoint) and the fit's record (plus ``cpu_s``)."""
    import torch

    from ...blocks.fitting import fit_to_plateau
    from ...blocks.rate_table import fit_with_table_rate
    from .models import build, loss_fn

    p = ctx.params
    f = dict(p["fit"])
    if lr_grid is not None:  # lr_grid.py: the grid (or rates) to pilot
        f["lr_grid"] = list(lr_grid)
    elif p.get("lr"):  # the rate chosen once on seed 0's validation windows (configs: `lr`, lr_grid.py)
        f, _ = fit_with_table_rate(f, p["lr"], variant, name)
    W, B, blk = int(p["window"]), int(p["batch"]), gap_length(p, name)  # training holes: the series' gaps
    C = ds["val"].shape[1]
    xv = windows(ds["val"], W)
    vmasks = val_masks(ctx, name, xv.shape, windows(ds["obs_val"], W))
    base = 17 + sum(map(ord, name))

    def make(gen):  # the seed's initial weights, the same for every rate
        torch.manual_seed(ctx.seed)
        return build(variant, C, p)

    def train_loss(model, gen):  # the batch stream is a function of the generator: the same for every rate
        rng = np.random.default_rng([base, int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen))])
        x, seen, hidden = train_windows(rng, ds["train"], ds["obs_train"], B, W, blk)
        xt, st, ht = (torch.tensor(a, dtype=torch.float32) for a in (x, seen, hidden))
        return loss_fn(model(xt * st, st), xt, st, ht)

    def val_loss(model):
        return float(np.mean([window_errors(impute_learned(model, xv, seen), xv, ev)[0].mean()
                              for seen, ev in vmasks]))

    t0 = time.process_time()
    model, rec = fit_to_plateau(make, train_loss, val_loss, f, ctx.seed, label=f"{variant} {name}",
                                progress=getattr(ctx, "progress", print))
    model.eval()
    rec["cpu_s"] = time.process_time() - t0
    return model, rec


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
            ctx.metrics.curve(f"val_mae_{name}", rec["steps"], rec["vals"])
            ctx.metrics.curve(f"lr_{name}", rec["steps"], rec["lrs"])
            ctx.metrics.scalar(f"steps_{name}", rec["stop"])
            ctx.metrics.scalar(f"stopped_flat_{name}", float(rec["plateau"]))
            ctx.metrics.scalar(f"lr_chosen_{name}", float(rec["lr"]))
            if rec.get("drop_gain") is not None:
                ctx.metrics.scalar(f"drop_gain_{name}", float(rec["drop_gain"]))
            ctx.metrics.scalar(f"best_val_{name}", float(min(rec["vals"])))
            ctx.metrics.scalar(f"train_cpu_s_{name}", rec["cpu_s"])
            ctx.progress(f"{name}: lr {rec['lr']:g}, {rec['stop']} steps ({'flat' if rec['plateau'] else 'max_steps'}), "
                         f"pilots " + ", ".join(f"{k:g}: {x:.3f}" for k, x in rec["pilot_best"].items())
                         + f", best val MAE {min(rec['vals']):.3f}, {rec['cpu_s']:.1f} CPU-s")
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
            ctx.metrics.scalar(f"hidden_n_{name}_{key}", float(ev.sum()))  # hidden, truly known entries
            ctx.metrics.scalar(f"hidden_frac_{name}_{key}", float(ev.sum() / known.sum()))  # of the known ones
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
    order = [v for v in ("cbit", "cbit_nomem", "brits", "saits", "linear", "locf", UNTRAINED) if v in set(t.variant)]
    series = params.get("series", ["co2", "lorenz96"])
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
            # what each condition really hides (block holes are whole gaps): measured, mean over the seeds
            rates = [int(round(100 * r)) for r in params.get("rates", [0.1, 0.3, 0.5])]
            real = []
            for r in rates:
                h = t[t.metric == f"hidden_frac_{name}_{pattern}_{r}"]["value"]
                real.append(f"{r}\n({100 * h.mean():.0f})" if len(h) else f"{r}")
            ax.set_xticks(rates)
            ax.set_xticklabels(real, fontsize=8)
            ax.set_xlabel("nominal missing rate (%)\n(measured: % of the known test entries hidden)", fontsize=8)
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
        ax.set_xlabel(f"test time step (co2: weeks, test blocks joined; lorenz96: {dt:g} model time units); dashed: window edges")
        ax.set_ylabel("value (z-units of channel 0)")
        ax.set_title(f"{name}, block holes {int(100 * params.get('rates', [0, 0.3])[1])} % (hidden steps shaded): "
                     "which imputation follows the truth through the gaps?", fontsize=9)
        ax.legend(fontsize=7, ncol=6)
        save_figure(fig, plots_dir / f"imputed_{name}.png", dpi=110)
