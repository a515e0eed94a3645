"""Prime attention vs standard channel-token attention at the same width (the paper's comparison).

Variants (one training cell = one variant x one seed, covering every dataset x lookback x horizon):
  prime          iTransformer-style forecaster whose attention primes keys and values per channel
                 pair (model.py), width ``model.dim``
  standard       the same forecaster with standard attention at the same width (the paper's baseline)
  standard_id    ``standard`` plus a learned per-channel embedding added to the tokens (round 4): the
                 claims read min(standard, standard_id)
  standard_wide  standard attention, width raised until its parameter count matches the prime
                 model's (``matched_width``): round 3's extra row, no longer in the spec
  standard_id_bias  ``standard_id`` plus a learned per-pair, per-head attention bias (round 5): routing per
                 pair without priming; a comparator of the synthetic claim since round 6
  prime_sep      prime attention whose filters have no pair term, F_ij = (1 + a_i)(1 + b_j) (round 6, the
                 cold review of round 5): per-channel key/value scaling; a comparator of the synthetic
                 claim and the must-fail control's reference on the system without pairs

Datasets: ``syn`` (the heterogeneous echo system), ``nopair`` (its must-fail control since round 5: every
target echoes a hidden, independent copy of its driver, so no channel informs another), ``homo`` (round 4's
control: one law, one lag for every pair; no longer run) and ``macro``. A dataset whose
``configs.<ds>.variants`` is set is trained only by those variants.
``filter_dev_<ds>`` (prime cell): the mean over pairs and configs of the filters' deviation from 1.

Stages per (dataset, lookback L, horizon H) and variant: the platform's training rule
(``blocks.fitting.fit_to_plateau``, the same for every variant): the learning-rate grid ``fit.lr_grid``
piloted on validation MSE, the chosen rate held constant until the validation curve passes the gate's
plateau test, one drop to a tenth and a second plateau; the best-validation weights are scored on the
test windows. ``fit.per_dataset`` overrides the cadence per dataset (macrodata overfits within ~100
steps). Where the config has a rate table ``lr.<ds>.<variant>`` (round 6: chosen once on validation on a
pilot seed no claim reads, by a full fit to plateau per rate, ``pilot_rates.py``), every fit trains at that
one rate (``blocks.rate_table``), its edge on ``fit.lr_grid`` recorded as ``lr_edge_<ds>_L<L>_H<H>``.
In the ``configs.<ds>.ridge_in`` cell (default ``standard``) the linear references are fitted too
(``ridge``: all channels, and each channel on its own past), closed form, deterministic given the seed's
data. ``model.norm`` must name every dataset (a missing one raises).

Test units (``ctx.metrics.units``): on the synthetic system, independent test episodes (one forecast
origin each, the same episodes for every variant, lookback and horizon); on macrodata, the 12
channels (MSE over every test window of the channel).

Metrics (standardised units, so an MSE of 1 is the variance of the channel):
  mse_<ds>_L<L>_H<H>   test MSE of one config        mse_<ds>       mean over the configs (units)
  mse_<ds>_short/long  mean over H at the shorter / longer lookback (units; datasets with two lookbacks)
  params_<ds>_L<L>_H<H>  parameter count;  (blocks.fitting.log_fit) val_/lr_<ds>_L<L>_H<H>: validation
  curve and learning rate of the chosen run, lr_chosen_, steps_, drop_gain_<ds>_L<L>_H<H>
  mse_ridge_*, mse_ridgeown_* (standard cell only): the linear references, per config and as units
"""
from __future__ import annotations

import time

import numpy as np

from ...blocks.rate_table import stamp_source
from . import data as D
from reprozoo.figures import save_figure

VARIANTS = ("prime", "prime_sep", "standard", "standard_id", "standard_id_bias", "standard_wide")
COLORS = {"prime": "tab:red", "prime_sep": "tab:orange", "standard": "tab:blue", "standard_id": "tab:green",
          "standard_id_bias": "tab:olive", "standard_wide": "tab:cyan"}
PRIMED = ("prime", "prime_sep")  # the variants whose keys and values are primed by filters
GENERIC_CURVES = {"val_syn_L96_H24": ("training step", "validation MSE (standardised units^2)"),
                  "val_macro_L25_H8": ("training step", "validation MSE (standardised units^2)")}


# ------------------------------------------------------------------------------------------ data

class Task:
    """One (dataset, L, H): a training array to sample windows from (rows ``starts`` begin a window
    that lies wholly inside one training episode), validation and test windows, and the per-unit
    grouping of the test windows (``unit_axis``: ``window``, one unit per test window, or
    ``channel``)."""

    def __init__(self, train, L, H, Xva, Yva, Xte, Yte, unit_axis, starts=None):
        self.train, self.L, self.H = train, L, H
        self.tr = D.window_starts(0, len(train), L, H) if starts is None else np.asarray(starts)
        self.Xva, self.Yva, self.Xte, self.Yte = Xva, Yva, Xte, Yte
        self.unit_axis = unit_axis  # "window" (one unit per test window) or "channel"
        if min(len(self.tr), len(Xva), len(Xte)) == 0:
            raise ValueError(f"L={L}, H={H} leaves no windows (train/val/test {len(self.tr)}/{len(Xva)}/{len(Xte)}): "
                             "shorten lookback or horizon")

    def unit_mse(self, pred: np.ndarray) -> np.ndarray:
        err = (pred - self.Yte) ** 2  # (windows, H, N)
        return err.mean(axis=(1, 2)) if self.unit_axis == "window" else err.mean(axis=(0, 1))

    def train_windows(self, starts: np.ndarray):
        idx = np.asarray(starts)[:, None] + np.arange(self.L + self.H)[None]
        w = self.train[idx]
        return w[:, :self.L], w[:, self.L:]


SYSTEM_KEYS = ("n_drivers", "lags", "noise", "season_period", "season_phi", "season_smooth", "season_share")


def synthetic_tasks(p: dict, rng_of, ds: str = "syn") -> tuple[dict, np.ndarray, dict]:
    """{(L, H): Task} for the coupled seasonal system (``ds`` = ``syn``), its control without pairs
    (``nopair``: every target echoes a hidden copy of its driver) or its homogeneous variant (``homo``: one
    law and one lag for every pair), the test episodes and the system.

    Training: ``train_episodes`` independent episodes of ``train_length`` steps each (windows at
    every origin inside an episode); validation and test: independent episodes, one forecast origin
    each (row max L), the same for every variant, lookback and horizon."""
    s, cfg = p["synthetic"], p["configs"][ds]
    Ls, Hs = sorted(int(x) for x in cfg["lookbacks"]), sorted(int(x) for x in cfg["horizons"])
    homo, unpaired = ds == "homo", ds == "nopair"
    o = {"syn": 0, "homo": 20, "nopair": 40}[ds]  # independent draws for each control system
    system = D.draw_system(rng_of(11 + o), homogeneous=homo, unpaired=unpaired, **{k: s[k] for k in SYSTEM_KEYS})
    pool = D.simulate(system, rng_of(12 + o), int(s["train_episodes"]), int(s["train_length"]))
    length = max(Ls) + max(Hs)
    val = D.simulate(system, rng_of(13 + o), int(s["val_episodes"]), length)
    test = D.simulate(system, rng_of(14 + o), int(s["test_episodes"]), length)
    mu, sd = pool.mean((0, 1)), pool.std((0, 1)) + 1e-8
    pool, val, test = ((a - mu) / sd for a in (pool, val, test))
    E, T, N = pool.shape
    flat = np.ascontiguousarray(pool.reshape(E * T, N))
    tasks = {}
    for L in Ls:
        for H in Hs:
            starts = (np.arange(E)[:, None] * T + D.window_starts(0, T, L, H)[None]).ravel()
            Xva, Yva = D.episode_windows(val, max(Ls), L, H)
            Xte, Yte = D.episode_windows(test, max(Ls), L, H)
            tasks[(L, H)] = Task(flat, L, H, Xva, Yva, Xte, Yte, "window", starts)
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


# ------------------------------------------------------------------------------------- reference

def ridge(task: Task, alphas, n_fit: int, rng: np.random.Generator, own: bool = False) -> dict:
    """Ridge regression of the H future values on the L past values (standardised units, an intercept,
    no per-window normalisation), closed form on up to ``n_fit`` training windows, the penalty
    ``alpha`` chosen on the validation windows. ``own=False``: all H x N futures on all L x N pasts,
    the linear reference that reads every channel at every lag (so it uses the echoes, and the
    nonlinear echo only linearly). ``own=True``: each channel on its own past alone (one ridge per
    channel, the same penalty for all): the univariate reference a trained forecaster must beat."""
    starts = task.tr if len(task.tr) <= n_fit else rng.choice(task.tr, n_fit, replace=False)
    X, Y = task.train_windows(starts)
    n, L, N = X.shape
    H = Y.shape[1]

    def feats(x):  # (groups, windows, features + 1)
        x = np.asarray(x, np.float64)
        x = x.transpose(2, 0, 1) if own else x.reshape(1, len(x), -1)
        return np.concatenate([x, np.ones(x.shape[:2] + (1,))], axis=2)

    def targ(y):
        y = np.asarray(y, np.float64)
        return y.transpose(2, 0, 1) if own else y.reshape(1, len(y), -1)

    A, B = feats(X), targ(Y)
    G, R = A.transpose(0, 2, 1) @ A / n, A.transpose(0, 2, 1) @ B / n
    eye = np.eye(G.shape[1])
    eye[-1, -1] = 0.0  # no penalty on the intercept
    Fva, Tva, best = feats(task.Xva), targ(task.Yva), None
    for a in alphas:
        W = np.linalg.solve(G + float(a) * eye, R)
        v = float(((Fva @ W - Tva) ** 2).mean())
        if best is None or v < best[0]:
            best = (v, float(a), W)
    v, a, W = best
    P = feats(task.Xte) @ W  # (groups, windows, outputs)
    pred = (P.transpose(1, 2, 0) if own else P[0].reshape(len(task.Xte), H, N)).astype(np.float32)
    return {"alpha": a, "val": v, "pred": pred, "units": task.unit_mse(pred)}


# ------------------------------------------------------------------------------------- training

def fit_and_score(task: Task, variant: str, mp: dict, fp: dict, seed: int, label: str, progress=print,
                  norm: bool = True) -> dict:
    """One (task, variant) by the platform's rule (``blocks.fitting.fit_to_plateau``: the learning-rate
    grid piloted on validation MSE, the chosen rate to a plateau, one drop, a second plateau; the same
    for every variant), the best-validation weights scored on the test windows."""
    import torch

    from ...blocks.fitting import fit_to_plateau
    from .model import build, matched_width, n_params

    N = task.train.shape[1]
    rank = mp.get("filter_rank")
    dim, d_ff = int(mp["dim"]), None
    if variant == "standard_wide":
        (dim, d_ff), _, _ = matched_width(N, task.L, task.H, int(mp["dim"]), int(mp["n_heads"]),
                                          int(mp["n_layers"]), float(mp["ff_mult"]), rank)
    xz = torch.from_numpy(task.train)
    tr = torch.from_numpy(np.asarray(task.tr, dtype=np.int64))
    Xva, Yva = torch.from_numpy(task.Xva), torch.from_numpy(task.Yva)
    ar = torch.arange(task.L + task.H)[None]
    L, bs = task.L, int(fp["batch"])

    def make(gen):
        torch.manual_seed(seed)  # the same initial weights for every rate
        return build(N, task.L, task.H, dim, int(mp["n_heads"]), int(mp["n_layers"]), float(mp["ff_mult"]),
                     variant in PRIMED, rank, d_ff=d_ff, norm=norm,
                     channel_id=variant in ("standard_id", "standard_id_bias"), pair_bias=variant == "standard_id_bias",
                     separable=variant == "prime_sep")

    def train_loss(model, gen):
        b = tr[torch.randint(len(tr), (bs,), generator=gen)]
        w = xz[b[:, None] + ar]
        return ((model(w[:, :L]) - w[:, L:]) ** 2).mean()

    def val_loss(model):
        with torch.no_grad():
            return float(((model(Xva) - Yva) ** 2).mean())

    fit = {k: v for k, v in fp.items() if k != "batch"}
    model, rec = fit_to_plateau(make, train_loss, val_loss, fit, seed, label=label, progress=progress)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(task.Xte)).numpy()
    rec.update(model=model, pred=pred, units=task.unit_mse(pred), params=n_params(model))
    return rec


def window_norm(mp: dict, ds: str) -> bool:
    """iTransformer's per-window normalisation on dataset ``ds`` (``model.norm``: a bool or {ds: bool}).
    A dict must name every dataset it is asked about: a missing one raises (round 6, the cold review of
    round 5: the control system without pairs fell through to a default of ``True`` while the system
    it controls ran with the normalisation off)."""
    norm = mp.get("norm", True)
    if isinstance(norm, dict):
        if ds not in norm:
            raise KeyError(f"config `model.norm` names {sorted(norm)} but not dataset '{ds}': say whether "
                           "per-window normalisation is on for it")
        return bool(norm[ds])
    return bool(norm)


def fit_config(p: dict, ds: str, variant: str) -> tuple[dict, dict]:
    """The ``fit`` config of (dataset, variant) and its rate record: ``fit`` with ``fit.per_dataset.<ds>``
    over it; where the config has a rate table ``lr`` (``lr.<ds>.<variant>``, chosen once on validation by
    ``pilot_rates.py``), that one rate (``blocks.rate_table.fit_with_table_rate``; an entry missing from a
    table raises), its edge on ``fit.lr_grid`` recorded; without a table the grid is piloted in every fit."""
    from ...blocks.rate_table import fit_with_table_rate

    fp = {k: v for k, v in p["fit"].items() if k != "per_dataset"}
    fp.update((p["fit"].get("per_dataset") or {}).get(ds) or {})
    return fit_with_table_rate(fp, p.get("lr"), ds, variant, required=True)


def train(ctx):
    import torch

    from ...blocks.fitting import log_fit

    torch.set_num_threads(max(1, ctx.threads))
    p = ctx.params
    mp = p["model"]
    for ds in p["datasets"]:
        only = p["configs"][ds].get("variants")  # a dataset only some variants train on (the control system)
        if only is not None and ctx.variant not in only:
            continue
        fp, how = fit_config(p, ds, ctx.variant)
        ref = p["configs"][ds].get("ridge_in", "standard")  # the cell that records the linear references
        if ds in ("syn", "homo", "nopair"):
            tasks, test, system = synthetic_tasks(p, ctx.rng, ds)
        elif ds == "macro":
            if "ts_statsmodels" not in ctx.data:
                raise KeyError(f"dataset 'ts_statsmodels' is not among this method's datasets {sorted(ctx.data)}; "
                               "add it to spec.datasets")
            tasks = macro_tasks(p, ctx.data["ts_statsmodels"])
        else:
            raise KeyError(f"unknown dataset '{ds}' (known: syn, homo, nopair, macro)")
        Ls = sorted({L for L, _ in tasks})
        Hs = sorted({H for _, H in tasks})
        units, ridge_units, devs = {}, {}, []
        for (L, H) in sorted(tasks):
            task = tasks[(L, H)]
            tag = f"{ds}_L{L}_H{H}"
            t0 = time.perf_counter()
            # one learning-rate grid, piloted on validation, for every model (blocks.fitting)
            run = fit_and_score(task, ctx.variant, mp, fp, ctx.seed * 7919 + L * 31 + H, tag, ctx.progress,
                                norm=window_norm(mp, ds))
            stamp_source(run, how)  # a one-rate grid brackets nothing: a table rate's edge on the recorded grid
            ctx.metrics.scalar(f"lr_edge_{tag}", {"top": 1.0, "bottom": -1.0}.get(run["lr_edge"], 0.0))
            units[(L, H)] = run["units"]
            ctx.metrics.scalar(f"mse_{tag}", float(run["units"].mean()))
            ctx.metrics.scalar(f"params_{tag}", run["params"])
            log_fit(ctx.metrics, tag, run)
            if ctx.variant == "prime":  # how far the pair filters moved from F = 1 (mean over pairs)
                dev = float(run["model"].filter_deviation().detach().mean())
                ctx.metrics.scalar(f"filter_dev_{tag}", dev)
                devs.append(dev)
            ctx.progress(f"{tag}: test MSE {run['units'].mean():.4f}, {run['params']} params, lr {run['lr']:g} "
                         f"(pilots {', '.join(f'{k:g}: {v:.4f}' for k, v in run['pilot_best'].items())}), "
                         f"{run['stop']} steps ({'plateau' if run['plateau'] else 'max_steps'}), "
                         f"{time.perf_counter() - t0:.1f}s")
            if ctx.variant == ref:
                # the linear references (closed form, deterministic given the seed's data): recorded once,
                # in the baseline's cell (``configs.<ds>.ridge_in``, default ``standard``), where the
                # preconditions read them
                for name, own in (("ridge", False), ("ridgeown", True)):
                    r = ridge(task, p["ridge"]["alphas"], int(p["ridge"]["n_fit"]), ctx.rng(20 + L + H), own=own)
                    ridge_units.setdefault(name, {})[(L, H)] = r["units"]
                    ctx.metrics.scalar(f"mse_{name}_{tag}", float(r["units"].mean()))
                    ctx.metrics.scalar(f"{name}_alpha_{tag}", r["alpha"])
                    alphas = sorted(float(x) for x in p["ridge"]["alphas"])  # 1: the grid does not bracket it
                    ctx.metrics.scalar(f"{name}_alpha_edge_{tag}", float(r["alpha"] in (alphas[0], alphas[-1])))
                    ctx.progress(f"{tag}: {name} test MSE {r['units'].mean():.4f} (alpha {r['alpha']:g})")
            if ds == "syn" and (L, H) == (max(Ls), min(Hs)):
                _syn_extras(ctx, run, system, task, L, H)
        if devs:
            ctx.metrics.scalar(f"filter_dev_{ds}", float(np.mean(devs)))
        for name, u in [("mse", units)] + [(f"mse_{k}", u) for k, u in ridge_units.items()]:
            if not u:
                continue
            ctx.metrics.units(f"{name}_{ds}", np.mean([u[k] for k in sorted(u)], axis=0))
            if len(Ls) > 1:
                ctx.metrics.units(f"{name}_{ds}_short", np.mean([u[(min(Ls), H)] for H in Hs], axis=0))
                ctx.metrics.units(f"{name}_{ds}_long", np.mean([u[(max(Ls), H)] for H in Hs], axis=0))


def _syn_extras(ctx, run, system, task, L, H):
    """The learned filter map against the true coupling laws, and one forecast example."""
    cmap = system["cmap"]
    N = cmap.shape[0]
    if ctx.variant == "prime":
        dev = run["model"].filter_deviation().detach().numpy()
        ctx.metrics.curve("filter_map", range(N * N), dev.ravel())
        coupled = (cmap > 0) | (cmap.T > 0)  # both directions of a (driver, echo) pair
        ctx.metrics.scalar("filter_contrast", float(dev[coupled].mean() / dev[~coupled].mean()))
    ctx.metrics.curve("coupling_type", range(N * N), cmap.ravel())
    ch = int(np.argwhere(cmap == D.LAWS.index("delayed"))[0, 0])
    ctx.metrics.curve("example_context", range(-L, 0), task.Xte[0, :, ch])
    ctx.metrics.curve("example_truth", range(H), task.Yte[0, :, ch])
    ctx.metrics.curve("example_pred", range(H), run["pred"][0, :, ch])
    ctx.metrics.curve("lag_of_target", range(len(system["lag"])), system["lag"])
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
    titles = {"syn": "coupled seasonal system (test: independent episodes)",
              "homo": "homogeneous control system (one law, one lag for every pair)",
              "nopair": "control system without pairs (echoes of hidden drivers)", "macro": "statsmodels macrodata"}

    # 1) test MSE per horizon (or per lookback, with one horizon), mean +- std over seeds, every seed as a dot
    fig, axes = plt.subplots(1, len(dss), figsize=(5.4 * len(dss), 3.9), squeeze=False)
    for ax, ds in zip(axes[0], dss):
        cfg = params["configs"][ds]
        Ls, Hs = sorted(cfg["lookbacks"]), sorted(cfg["horizons"])
        by_lookback = len(Hs) == 1 and len(Ls) > 1  # one horizon: the lookback on the x axis
        if by_lookback:
            series = [("", Ls, [f"{{}}_{ds}_L{L}_H{Hs[0]}" for L in Ls], "-")]
        else:
            series = [(f", L={L}", Hs, [f"{{}}_{ds}_L{L}_H{H}" for H in Hs], "--" if k == 0 and len(Ls) > 1 else "-")
                      for k, L in enumerate(Ls)]
        for suffix, xs, names, ls in series:
            for v in variants:
                m = [_vals(table, n.format("mse"), v) for n in names]
                if any(len(a) == 0 for a in m):
                    continue
                mean = np.array([a.mean() for a in m])
                sd = np.array([a.std(ddof=1) if len(a) > 1 else 0.0 for a in m])
                ax.plot(xs, mean, ls, marker="o", color=COLORS[v], label=f"{v}{suffix}")
                ax.fill_between(xs, mean - sd, mean + sd, color=COLORS[v], alpha=0.12)
                for x, a in zip(xs, m):
                    ax.plot(np.full(len(a), x), a, ".", color=COLORS[v], ms=3, alpha=0.6)
            for ref, color in (("ridge", "0.2"), ("ridgeown", "0.6")):  # the linear references
                m = [_vals(table, n.format(f"mse_{ref}"), "standard") for n in names]
                if any(len(a) == 0 for a in m):
                    continue
                ax.plot(xs, [a.mean() for a in m], ls, marker="s", ms=4, color=color,
                        label=f"{ref} ({'all channels' if ref == 'ridge' else 'own channel'}){suffix}")
        unit = "time steps" if ds in ("syn", "homo", "nopair") else "quarters"
        ax.set_xticks(Ls if by_lookback else Hs)
        ax.set_xlabel(f"lookback L ({unit}; horizon {Hs[0]})" if by_lookback else f"horizon H ({unit})")
        ax.set_ylabel("test MSE (standardised units^2)")
        ax.set_title(titles.get(ds, ds) + ("; dashed: short lookback" if len(Ls) > 1 and not by_lookback else ""),
                     fontsize=9)
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
