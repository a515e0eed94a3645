"""Prime attention vs standard channel-token attention at equal parameter count.

Variants (one training cell = one variant x one seed, covering every dataset x lookback x horizon):
  prime     iTransformer-style forecaster whose attention primes keys and values per channel pair
            (model.py), width ``model.dim``
  standard  the same forecaster with standard attention, width raised until its parameter count
            matches the prime model's (``matched_width``; both counts are recorded per config)

Stages per (dataset, lookback L, horizon H): windows from a chronological 70/10/20 split
(validation and test windows borrow their lookback from the segment before, as in TSLib), Adam on
the MSE of standardised values for ``train.steps`` steps, validation MSE every ``train.eval_every``
steps, the best-validation weights scored on the test windows. Metrics (standardised units, so an
MSE of 1 is the variance of the channel):

  mse_<ds>_L<L>_H<H>   test MSE of one config         mse_<ds>         mean over the four configs
  mse_<ds>_short/long  mean over H at the shorter / longer lookback
  params_<ds>_L<L>_H<H>  parameter count             val_slope_max    worst final val-curve slope
"""
from __future__ import annotations

import time

import numpy as np

from . import data as D
from reprozoo.figures import save_figure

GENERIC_CURVES = {"val_loss": ("training step", "validation MSE (standardised units^2)"),
                  "val_loss_macro": ("training step", "validation MSE (standardised units^2)")}
VARIANTS = ("prime", "standard")
COLORS = {"prime": "tab:red", "standard": "tab:blue"}


def _dataset(name: str, ctx):
    """(standardised series, split borders, true coupling map or None)."""
    p = ctx.params
    if name == "syn":
        s = p["synthetic"]
        series, cmap = D.coupled_system(ctx.rng(11), int(s["length"]), int(s["n_drivers"]), int(s["short_lag"]),
                                        int(s["long_lag"]), float(s["noise"]))
    elif name == "macro":
        if "ts_statsmodels" not in ctx.data:
            raise KeyError(f"dataset 'ts_statsmodels' is not among this method's datasets {sorted(ctx.data)}; "
                           "add it to spec.datasets")
        series, _ = D.load_macrodata(ctx.data["ts_statsmodels"])
        cmap = None
    else:
        raise KeyError(f"unknown dataset '{name}' (known: syn, macro)")
    z, borders = D.split_standardise(series)
    return z, borders, cmap


def fit_and_score(z, borders, L, H, variant, mp, tp, seed, torch):
    """Train one model on one (L, H) config; return (test mse, model, val curve, n params, test windows)."""
    from .model import build, matched_width, n_params

    N = z.shape[1]
    n_tr, n_va = borders
    tr = D.window_starts(0, n_tr, L, H)
    va = D.window_starts(n_tr, n_va, L, H, targets_from=n_tr, stride=int(tp["eval_stride"]))
    te = D.window_starts(n_va, len(z), L, H, targets_from=n_va, stride=int(tp["eval_stride"]))
    if min(len(tr), len(va), len(te)) == 0:
        raise ValueError(f"L={L}, H={H} leaves no windows in a split of {len(z)} rows (train/val/test "
                         f"{len(tr)}/{len(va)}/{len(te)}): shorten lookback or horizon")
    rank = mp.get("filter_rank")
    dim, d_ff = int(mp["dim"]), None
    if variant != "prime":
        (dim, d_ff), _, _ = matched_width(N, L, H, int(mp["dim"]), int(mp["n_heads"]), int(mp["n_layers"]),
                                  float(mp["ff_mult"]), rank)
    torch.manual_seed(seed)
    model = build(N, L, H, dim, int(mp["n_heads"]), int(mp["n_layers"]), float(mp["ff_mult"]),
                  variant == "prime", rank, d_ff=d_ff)
    opt = torch.optim.Adam(model.parameters(), lr=float(tp["lr"]))
    xz = torch.from_numpy(z)
    Xva, Yva = (torch.from_numpy(a) for a in D.windows(z, va, L, H))
    Xte, Yte = (torch.from_numpy(a) for a in D.windows(z, te, L, H))
    g = np.random.default_rng(seed)
    steps, every, bs = int(tp["steps"]), int(tp["eval_every"]), int(tp["batch"])
    xs, vals, best, best_state = [], [], np.inf, None
    for step in range(1, steps + 1):
        b = torch.from_numpy(tr[g.integers(0, len(tr), bs)])
        idx = b[:, None] + torch.arange(L + H)[None]
        w = xz[idx]
        loss = ((model(w[:, :L]) - w[:, L:]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == steps:
            with torch.no_grad():
                v = float(((model(Xva) - Yva) ** 2).mean())
            xs.append(step)
            vals.append(v)
            if v < best:
                best, best_state = v, {k: t.clone() for k, t in model.state_dict().items()}
    model.load_state_dict(best_state)
    with torch.no_grad():
        pred = model(Xte)
        mse = float(((pred - Yte) ** 2).mean())
    return mse, model, (xs, vals), n_params(model), (Xte, Yte, pred)


def _final_slope(xs, vals) -> float:
    """Relative change per 100 steps of the best-so-far validation MSE over the last quarter of training."""
    b = np.minimum.accumulate(np.asarray(vals))
    xs = np.asarray(xs, dtype=float)
    m = xs >= xs[-1] - 0.25 * (xs[-1] - xs[0])
    if m.sum() < 2:
        return 0.0
    slope = np.polyfit(xs[m], b[m], 1)[0]
    return float(slope * 100 / b[-1])


def train(ctx):
    import torch

    torch.set_num_threads(max(1, ctx.threads))
    p = ctx.params
    mp, tp = p["model"], p["train"]
    slopes = []
    for ds in p["datasets"]:
        z, borders, cmap = _dataset(ds, ctx)
        cfg = p["configs"][ds]
        Ls, Hs = [int(x) for x in cfg["lookbacks"]], [int(x) for x in cfg["horizons"]]
        per = {}
        for L in Ls:
            for H in Hs:
                t0 = time.perf_counter()
                mse, model, (xs, vals), npar, (Xte, Yte, pred) = fit_and_score(
                    z, borders, L, H, ctx.variant, mp, tp, ctx.seed * 7919 + L * 31 + H, torch)
                per[(L, H)] = mse
                ctx.metrics.scalar(f"mse_{ds}_L{L}_H{H}", mse)
                ctx.metrics.scalar(f"params_{ds}_L{L}_H{H}", npar)
                slopes.append(_final_slope(xs, vals))
                ctx.progress(f"{ds} L={L} H={H}: test MSE {mse:.4f}, {npar} params, val slope "
                             f"{slopes[-1]:+.3f}/100 steps, best val at step {xs[int(np.argmin(vals))]}, "
                             f"{time.perf_counter() - t0:.1f}s")
                if (L, H) == (max(Ls), max(Hs)):
                    ctx.metrics.curve("val_loss" if ds == "syn" else f"val_loss_{ds}", xs, vals)
                if ds == "syn" and (L, H) == (max(Ls), min(Hs)):
                    N = z.shape[1]
                    if ctx.variant == "prime":
                        dev = model.filter_deviation().detach().numpy()
                        ctx.metrics.curve("filter_map", range(N * N), dev.ravel())
                        coupled = cmap > 0
                        ctx.metrics.scalar("filter_contrast", dev[coupled].mean() / dev[~coupled].mean())
                    ctx.metrics.curve("coupling_type", range(N * N), cmap.ravel())
                    # forecast example: first test window, the delayed target channel
                    ch = int(np.argwhere(cmap == D.LAWS.index("delayed"))[0, 0])
                    ctx.metrics.curve("example_context", range(-L, 0), Xte[0, :, ch].numpy())
                    ctx.metrics.curve("example_truth", range(H), Yte[0, :, ch].numpy())
                    ctx.metrics.curve("example_pred", range(H), pred[0, :, ch].numpy())
                    ctx.metrics.scalar("example_channel", ch)
        ctx.metrics.scalar(f"mse_{ds}", float(np.mean(list(per.values()))))
        ctx.metrics.scalar(f"mse_{ds}_short", float(np.mean([per[(min(Ls), H)] for H in Hs])))
        ctx.metrics.scalar(f"mse_{ds}_long", float(np.mean([per[(max(Ls), H)] for H in Hs])))
    ctx.metrics.scalar("val_slope_max", float(np.max(np.abs(slopes))))


# ----------------------------------------------------------------------------------------------- plots

def _vals(table, metric, variant):
    return table[(table.metric == metric) & (table.variant == variant) & table.x.isna()].value.to_numpy()


def plot(table, plots_dir, params: dict) -> None:
    from pathlib import Path

    from ...plotting import plt as _plt

    plt = _plt()
    plots_dir = Path(plots_dir)
    variants = [v for v in VARIANTS if v in set(table.variant)]
    dss = [d for d in params["datasets"]]
    titles = {"syn": "coupled synthetic system", "macro": "statsmodels macrodata"}

    # 1) test MSE per lookback / horizon, mean +- std over seeds, every seed as a dot
    fig, axes = plt.subplots(1, len(dss), figsize=(5.2 * len(dss), 3.8), squeeze=False)
    for ax, ds in zip(axes[0], dss):
        cfg = params["configs"][ds]
        Ls, Hs = cfg["lookbacks"], cfg["horizons"]
        for k, H in enumerate(Hs):
            for v in variants:
                m = np.array([_vals(table, f"mse_{ds}_L{L}_H{H}", v) for L in Ls], dtype=object)
                if any(len(a) == 0 for a in m):
                    continue
                mean = np.array([a.mean() for a in m])
                sd = np.array([a.std(ddof=1) if len(a) > 1 else 0.0 for a in m])
                ls = "-" if k == 0 else "--"
                ax.plot(Ls, mean, ls, marker="o", color=COLORS[v], label=f"{v}, H={H}")
                ax.fill_between(Ls, mean - sd, mean + sd, color=COLORS[v], alpha=0.15)
                for L, a in zip(Ls, m):
                    ax.plot(np.full(len(a), L), a, ".", color=COLORS[v], ms=3, alpha=0.6)
        ax.set_xticks(Ls)
        ax.set_xlabel("lookback L (time steps)" if ds == "syn" else "lookback L (quarters)")
        ax.set_ylabel("test MSE (standardised units^2)")
        ax.set_title(titles.get(ds, ds), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Does prime attention forecast better than standard attention at equal parameters? "
                 "(band: +- std over seeds)", fontsize=9)
    save_figure(fig, plots_dir / "mse_by_lookback.png", dpi=110)

    # 2) learned pairwise filter map vs the true coupling law
    fm = table[(table.metric == "filter_map") & (table.variant == "prime")]
    ct = table[(table.metric == "coupling_type")]
    if not fm.empty and not ct.empty:
        seed = int(fm.seed.min())
        dev = fm[fm.seed == seed].sort_values("x").value.to_numpy()
        typ = ct[(ct.seed == seed) & (ct.variant == "prime")].sort_values("x").value.to_numpy()
        N = int(round(np.sqrt(len(dev))))
        fig, axes = plt.subplots(1, 2, figsize=(9.5, 4))
        im = axes[0].imshow(typ.reshape(N, N), cmap=plt.get_cmap("tab10", len(D.LAWS)), vmin=-0.5,
                            vmax=len(D.LAWS) - 0.5)
        cb = fig.colorbar(im, ax=axes[0], ticks=range(len(D.LAWS)))
        cb.ax.set_yticklabels(D.LAWS, fontsize=7)
        axes[0].set_title("true coupling law (target i <- source j)", fontsize=9)
        im = axes[1].imshow(dev.reshape(N, N), cmap="magma")
        fig.colorbar(im, ax=axes[1], label="||F_ij - 1|| / sqrt(d), mean over layers (dimensionless)")
        axes[1].set_title(f"learned prime filters (seed {seed}, largest L, shortest H)", fontsize=9)
        for ax in axes:
            ax.set_xlabel("key / source channel j")
            ax.set_ylabel("query / target channel i")
        fig.suptitle("Do the learned pair filters single out the coupled pairs?", fontsize=9)
        save_figure(fig, plots_dir / "filter_map.png", dpi=110)

    # 3) forecast example over the truth
    ex = table[table.metric == "example_truth"]
    if not ex.empty:
        seed = int(ex.seed.min())
        fig, ax = plt.subplots(figsize=(7, 3.4))
        c = table[(table.metric == "example_context") & (table.seed == seed) & (table.variant == variants[0])]
        t = ex[(ex.seed == seed) & (ex.variant == variants[0])]
        ax.plot(c.x, c.value, color="0.5", lw=1, label="lookback (input)")
        ax.plot(t.x, t.value, "k", lw=1.5, label="truth")
        for v in variants:
            pr = table[(table.metric == "example_pred") & (table.seed == seed) & (table.variant == v)]
            ax.plot(pr.x, pr.value, color=COLORS[v], lw=1.2, label=v)
        ax.axvline(0, color="0.7", ls=":")
        ax.set_xlabel("time step relative to forecast origin")
        ax.set_ylabel("delayed target channel (standardised units)")
        ax.set_title(f"Does each model follow the delayed-coupled channel? (synthetic, seed {seed}, first test window)",
                     fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        save_figure(fig, plots_dir / "forecast_example.png", dpi=110)
