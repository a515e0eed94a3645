"""Prime attention vs standard channel-token attention at the same width (the paper's comparison).

Variants (one training cell = one variant x one seed, covering every dataset x lookback x horizon):
  prime          iTransformer-style forecaster whose attention primes keys and values per channel
                 pair (model.py), width ``model.dim``
  standard       the same forecaster with standard attention at the same width (the paper's baseline;
                 the claims read it)
  standard_wide  standard attention, width raised until its parameter count matches the prime
                 model's (``matched_width``): an extra row, not the baseline

Stages per (dataset, lookback L, horizon H) and variant: Adam at a constant learning rate on the
MSE of standardised values, validation
MSE every ``train.eval_every`` steps, stopped at the first evaluation past ``train.min_steps`` where
the validation curve is flat by the convergence gate's own test (``reprozoo.claims.plateau``) and
no new best came in its last 30 % (``stop_here``), or at ``train.max_steps``; the best-validation
weights are scored on the test windows. The learning rate: one grid (``train.lr_grid``) for every
variant, run on the dataset's largest (L, H), the rate with the lowest validation MSE kept for the
dataset's other configs. The rate is constant, so a plateau is one at a learning rate that is
still up (recorded as the ``lr_<cfg>`` curve for the gate). ``train.per_dataset`` overrides the
evaluation cadence per dataset (macrodata overfits within ~100 steps).

Test units (``ctx.metrics.units``): on the synthetic system, independent test episodes (one forecast
origin each, the same episodes for every variant, lookback and horizon); on macrodata, the 12
channels (MSE over every test window of the channel).

Metrics (standardised units, so an MSE of 1 is the variance of the channel):
  mse_<ds>_L<L>_H<H>   test MSE of one config        mse_<ds>       mean over the configs (units)
  mse_<ds>_short/long  mean over H at the shorter / longer lookback (units; datasets with two lookbacks)
  params_/steps_<ds>_L<L>_H<H>  parameter count, steps trained;  lr_chosen_<ds>, lr_grid_val_<ds>
  val_<ds>_L<L>_H<H>, lr_<ds>_L<L>_H<H>  validation curve and learning rate of the chosen run
"""
from __future__ import annotations

import time

import numpy as np

from . import data as D
from reprozoo.figures import save_figure

VARIANTS = ("prime", "standard", "standard_wide")
COLORS = {"prime": "tab:red", "standard": "tab:blue", "standard_wide": "tab:cyan"}
GENERIC_CURVES = {"val_syn_L96_H48": ("training step", "validation MSE (standardised units^2)"),
                  "val_macro_L25_H8": ("training step", "validation MSE (standardised units^2)"),
                  "lr_grid_val_syn": ("learning rate", "best validation MSE on the largest (L, H)"),
                  "lr_grid_val_macro": ("learning rate", "best validation MSE on the largest (L, H)")}


# ------------------------------------------------------------------------------------------ data

class Task:
    """One (dataset, L, H): a training series to sample windows from, validation and test windows,
    and the per-unit grouping of the test windows (``unit_of``: test window -> unit index, or
    None for one unit per window)."""

    def __init__(self, train, L, H, Xva, Yva, Xte, Yte, unit_axis):
        self.train, self.L, self.H = train, L, H
        self.tr = D.window_starts(0, len(train), L, H)
        self.Xva, self.Yva, self.Xte, self.Yte = Xva, Yva, Xte, Yte
        self.unit_axis = unit_axis  # "window" (one unit per test window) or "channel"
        if min(len(self.tr), len(Xva), len(Xte)) == 0:
            raise ValueError(f"L={L}, H={H} leaves no windows (train/val/test {len(self.tr)}/{len(Xva)}/{len(Xte)}): "
                             "shorten lookback or horizon")

    def unit_mse(self, pred: np.ndarray) -> np.ndarray:
        err = (pred - self.Yte) ** 2  # (windows, H, N)
        return err.mean(axis=(1, 2)) if self.unit_axis == "window" else err.mean(axis=(0, 1))


def synthetic_tasks(p: dict, rng_of) -> tuple[dict, np.ndarray, dict]:
    """{(L, H): Task} for the coupled seasonal system, the test episodes and the system."""
    s, cfg = p["synthetic"], p["configs"]["syn"]
    Ls, Hs = sorted(int(x) for x in cfg["lookbacks"]), sorted(int(x) for x in cfg["horizons"])
    keys = ("n_drivers", "short_lag", "long_lag", "noise", "season_period", "season_phi", "season_smooth",
            "season_share")
    system = D.draw_system(rng_of(11), **{k: s[k] for k in keys})
    train = D.simulate(system, rng_of(12), 1, int(s["train_length"]))[0]
    length = max(Ls) + max(Hs)
    val = D.simulate(system, rng_of(13), int(s["val_episodes"]), length)
    test = D.simulate(system, rng_of(14), int(s["test_episodes"]), length)
    mu, sd = train.mean(0), train.std(0) + 1e-8
    train, val, test = ((a - mu) / sd for a in (train, val, test))
    tasks = {}
    for L in Ls:
        for H in Hs:
            Xva, Yva = D.episode_windows(val, max(Ls), L, H)
            Xte, Yte = D.episode_windows(test, max(Ls), L, H)
            tasks[(L, H)] = Task(train, L, H, Xva, Yva, Xte, Yte, "window")
    return tasks, test, system


def macro_tasks(p: dict, folder) -> dict:
    """{(L, H): Task} on macrodata: chronological 70/10/20 split, validation and test windows borrow
    their lookback from the segment before (TSLib), every window (stride 1); units are channels."""
    cfg = p["configs"]["macro"]
    series, _ = D.load_macrodata(folder)
    z, (n_tr, n_va) = D.split_standardise(series)
    tasks = {}
    for L in sorted(int(x) for x in cfg["lookbacks"]):
        for H in sorted(int(x) for x in cfg["horizons"]):
            Xva, Yva = D.windows(z, D.window_starts(n_tr, n_va, L, H, targets_from=n_tr), L, H)
            Xte, Yte = D.windows(z, D.window_starts(n_va, len(z), L, H, targets_from=n_va), L, H)
            tasks[(L, H)] = Task(z[:n_tr], L, H, Xva, Yva, Xte, Yte, "channel")
    return tasks


# ------------------------------------------------------------------------------------- training

def fit(task: Task, model, lr: float, tp: dict, seed: int, torch):
    """Adam at a constant ``lr`` until :func:`stop_here` (past ``min_steps``) or ``max_steps``;
    returns (best val MSE, best state, steps, vals, stopped_flat)."""
    from reprozoo.claims import plateau

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    xz = torch.from_numpy(task.train)
    Xva, Yva = torch.from_numpy(task.Xva), torch.from_numpy(task.Yva)
    g = np.random.default_rng(seed)
    L, H = task.L, task.H
    max_steps, min_steps = int(tp["max_steps"]), int(tp["min_steps"])
    every, bs = int(tp["eval_every"]), int(tp["batch"])
    xs, vals, best, best_state, flat = [], [], np.inf, None, False
    ar = torch.arange(L + H)[None]
    for step in range(1, max_steps + 1):
        b = torch.from_numpy(task.tr[g.integers(0, len(task.tr), bs)])
        w = xz[b[:, None] + ar]
        loss = ((model(w[:, :L]) - w[:, L:]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == max_steps:
            model.eval()
            with torch.no_grad():
                v = float(((model(Xva) - Yva) ** 2).mean())
            model.train()
            xs.append(step)
            vals.append(v)
            if v < best:
                best, best_state = v, {k: t.clone() for k, t in model.state_dict().items()}
            if step >= min_steps and stop_here(xs, vals, plateau):
                flat = True
                break
    return best, best_state, xs, vals, flat


def stop_here(xs, vals, plateau, tail: float = 0.3) -> bool:
    """Stop where the validation curve is flat by the convergence gate's own test (``plateau``)
    *and* its best value lies before the last ``tail`` of training (no new best there): a slow
    phase that the slope test alone calls flat, while the best keeps creeping down, goes on."""
    if not plateau(xs, vals, tail=tail):
        return False
    start = xs[0] + (1 - tail) * (xs[-1] - xs[0])
    return xs[int(np.argmin(vals))] < start


def fit_and_score(task: Task, variant: str, mp: dict, tp: dict, seed: int, torch, lrs) -> dict:
    """One (task, variant) at every learning rate of ``lrs``: the best-validation run, scored on the
    test windows (``grid_vals``: the best validation MSE at each rate)."""
    from .model import build, matched_width, n_params

    N = task.train.shape[1]
    rank = mp.get("filter_rank")
    dim, d_ff = int(mp["dim"]), None
    if variant == "standard_wide":
        (dim, d_ff), _, _ = matched_width(N, task.L, task.H, int(mp["dim"]), int(mp["n_heads"]),
                                          int(mp["n_layers"]), float(mp["ff_mult"]), rank)
    runs = []
    for lr in lrs:
        torch.manual_seed(seed)
        model = build(N, task.L, task.H, dim, int(mp["n_heads"]), int(mp["n_layers"]), float(mp["ff_mult"]),
                      variant == "prime", rank, d_ff=d_ff)
        best, state, xs, vals, flat = fit(task, model, lr, tp, seed, torch)
        runs.append({"lr": lr, "val": best, "state": state, "xs": xs, "vals": vals, "flat": flat, "model": model})
    run = min(runs, key=lambda r: r["val"])
    model = run["model"]
    model.load_state_dict(run["state"])
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(task.Xte)).numpy()
    run.update(pred=pred, units=task.unit_mse(pred), params=n_params(model),
               grid_vals=[r["val"] for r in runs])
    return run


def train(ctx):
    import torch

    torch.set_num_threads(max(1, ctx.threads))
    p = ctx.params
    mp = p["model"]
    for ds in p["datasets"]:
        tp = {k: v for k, v in p["train"].items() if k != "per_dataset"}
        tp.update((p["train"].get("per_dataset") or {}).get(ds) or {})
        if ds == "syn":
            tasks, test, system = synthetic_tasks(p, ctx.rng)
        elif ds == "macro":
            if "ts_statsmodels" not in ctx.data:
                raise KeyError(f"dataset 'ts_statsmodels' is not among this method's datasets {sorted(ctx.data)}; "
                               "add it to spec.datasets")
            tasks = macro_tasks(p, ctx.data["ts_statsmodels"])
        else:
            raise KeyError(f"unknown dataset '{ds}' (known: syn, macro)")
        Ls = sorted({L for L, _ in tasks})
        Hs = sorted({H for _, H in tasks})
        # the learning rate: the grid on the largest (L, H), chosen on validation, then kept for the
        # dataset's other configs (the same protocol for every variant)
        order = sorted(tasks, key=lambda k: (k != (max(Ls), max(Hs)), k))
        units, lr_ds = {}, None
        for (L, H) in order:
            task = tasks[(L, H)]
            t0 = time.perf_counter()
            lrs = [float(x) for x in tp["lr_grid"]] if lr_ds is None else [lr_ds]
            run = fit_and_score(task, ctx.variant, mp, tp, ctx.seed * 7919 + L * 31 + H, torch, lrs)
            if lr_ds is None:
                lr_ds = run["lr"]
                ctx.metrics.scalar(f"lr_chosen_{ds}", lr_ds)
                ctx.metrics.curve(f"lr_grid_val_{ds}", lrs, run["grid_vals"])
            units[(L, H)] = run["units"]
            tag = f"{ds}_L{L}_H{H}"
            ctx.metrics.scalar(f"mse_{tag}", float(run["units"].mean()))
            ctx.metrics.scalar(f"params_{tag}", run["params"])
            ctx.metrics.scalar(f"steps_{tag}", run["xs"][-1])
            ctx.metrics.curve(f"val_{tag}", run["xs"], run["vals"])
            ctx.metrics.curve(f"lr_{tag}", run["xs"], [run["lr"]] * len(run["xs"]))
            ctx.progress(f"{tag}: test MSE {run['units'].mean():.4f}, {run['params']} params, lr {run['lr']:g} "
                         f"(val {', '.join(f'{v:.4f}' for v in run['grid_vals'])}), stopped at step {run['xs'][-1]} "
                         f"({'flat' if run['flat'] else 'max_steps'}), best val at step "
                         f"{run['xs'][int(np.argmin(run['vals']))]}, {time.perf_counter() - t0:.1f}s")
            if ds == "syn" and (L, H) == (max(Ls), min(Hs)):
                _syn_extras(ctx, run, system, task, L, H)
        ctx.metrics.units(f"mse_{ds}", np.mean([units[k] for k in sorted(units)], axis=0))
        if len(Ls) > 1:
            ctx.metrics.units(f"mse_{ds}_short", np.mean([units[(min(Ls), H)] for H in Hs], axis=0))
            ctx.metrics.units(f"mse_{ds}_long", np.mean([units[(max(Ls), H)] for H in Hs], axis=0))


def _syn_extras(ctx, run, system, task, L, H):
    """The learned filter map against the true coupling laws, and one forecast example."""
    cmap = system["cmap"]
    N = cmap.shape[0]
    if ctx.variant == "prime":
        dev = run["model"].filter_deviation().detach().numpy()
        ctx.metrics.curve("filter_map", range(N * N), dev.ravel())
        coupled = cmap > 0
        ctx.metrics.scalar("filter_contrast", float(dev[coupled].mean() / dev[~coupled].mean()))
    ctx.metrics.curve("coupling_type", range(N * N), cmap.ravel())
    ch = int(np.argwhere(cmap == D.LAWS.index("delayed"))[0, 0])
    ctx.metrics.curve("example_context", range(-L, 0), task.Xte[0, :, ch])
    ctx.metrics.curve("example_truth", range(H), task.Yte[0, :, ch])
    ctx.metrics.curve("example_pred", range(H), run["pred"][0, :, ch])
    ctx.metrics.scalar("example_channel", ch)


# ----------------------------------------------------------------------------------------------- plots

def _vals(table, metric, variant):
    return table[(table.metric == metric) & (table.variant == variant) & table.x.isna()].value.to_numpy()


def plot(table, plots_dir, params: dict) -> None:
    from pathlib import Path

    from ...plotting import plt as _plt

    plt = _plt()
    plots_dir = Path(plots_dir)
    variants = [v for v in VARIANTS if v in set(table.variant)]
    dss = list(params["datasets"])
    titles = {"syn": "coupled seasonal system (test: independent episodes)", "macro": "statsmodels macrodata"}

    # 1) test MSE per horizon and lookback, mean +- std over seeds, every seed as a dot
    fig, axes = plt.subplots(1, len(dss), figsize=(5.4 * len(dss), 3.9), squeeze=False)
    for ax, ds in zip(axes[0], dss):
        cfg = params["configs"][ds]
        Ls, Hs = sorted(cfg["lookbacks"]), sorted(cfg["horizons"])
        for k, L in enumerate(Ls):
            for v in variants:
                m = [_vals(table, f"mse_{ds}_L{L}_H{H}", v) for H in Hs]
                if any(len(a) == 0 for a in m):
                    continue
                mean = np.array([a.mean() for a in m])
                sd = np.array([a.std(ddof=1) if len(a) > 1 else 0.0 for a in m])
                ls = "--" if k == 0 and len(Ls) > 1 else "-"
                ax.plot(Hs, mean, ls, marker="o", color=COLORS[v], label=f"{v}, L={L}")
                ax.fill_between(Hs, mean - sd, mean + sd, color=COLORS[v], alpha=0.12)
                for H, a in zip(Hs, m):
                    ax.plot(np.full(len(a), H), a, ".", color=COLORS[v], ms=3, alpha=0.6)
        ax.set_xticks(Hs)
        ax.set_xlabel("horizon H (time steps)" if ds == "syn" else "horizon H (quarters)")
        ax.set_ylabel("test MSE (standardised units^2)")
        ax.set_title(titles.get(ds, ds) + ("; dashed: short lookback" if len(Ls) > 1 else ""), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5)
    fig.suptitle("Does prime attention forecast better than standard attention of the same width, and does it "
                 "need less lookback? (band: +- std over seeds)", fontsize=9)
    save_figure(fig, plots_dir / "mse_by_horizon.png", dpi=110)

    # 2) validation curves of every config (chosen learning rate), seed-wise
    curves = table[table.metric.str.startswith("val_") & table.x.notna()]
    if not curves.empty:
        names = sorted(curves.metric.unique())
        ncol = 4
        nrow = int(np.ceil(len(names) / ncol))
        fig, axes = plt.subplots(nrow, ncol, figsize=(3.3 * ncol, 2.6 * nrow), squeeze=False)
        for ax, name in zip(axes.ravel(), names):
            for v in variants:
                for s in sorted(curves.seed.unique()):
                    c = curves[(curves.metric == name) & (curves.variant == v) & (curves.seed == s)].sort_values("x")
                    ax.plot(c.x, c.value, color=COLORS[v], lw=0.9, alpha=0.7, label=v if s == curves.seed.min() else None)
            ax.set_title(name.replace("val_", ""), fontsize=8)
            ax.set_xlabel("training step", fontsize=7)
            ax.set_ylabel("validation MSE", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3)
        for ax in axes.ravel()[len(names):]:
            ax.axis("off")
        axes[0, 0].legend(fontsize=6)
        fig.suptitle("Did every model train to a plateau? (validation MSE of the chosen learning rate; training stops "
                     "where the gate's plateau test passes)", fontsize=9)
        save_figure(fig, plots_dir / "val_curves.png", dpi=100)

    # 3) learned pairwise filter map vs the true coupling law
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

    # 4) forecast example over the truth
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
        ax.set_title(f"Does each model follow the delayed-coupled channel? (synthetic, seed {seed}, test episode 0)",
                     fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        save_figure(fig, plots_dir / "forecast_example.png", dpi=110)
