"""Slepian location encoders in miniature: land/sea, a coastal index and a planted regional field around Japan.

Variants (encoders.py), all at embedding dimension D (config ``encoder.dim``), same MLP head
(head.py), same data, same training rule (blocks.fitting.fit_to_plateau, one rate grid):
  slepian (method)      D best-concentrated Slepian functions of the region's cap
  hybrid (method)       SH up to degree L_g + D - (L_g+1)² Slepian functions
  sh (baseline)         real spherical harmonics up to L, (L+1)² = D (Rußwurm et al.)
  sinusoidal (baseline) raw lat/lon + multi-scale sin/cos, 2 + 4K ~ D
  hybrid_paper          the released code's rule: SH degrees 0..9 + Slepian λ > 0.05 (not D; not claimed)
  hybrid_sh1 (control)  SH to degree 1 + D - 4 Slepian: the control of hybrid_global_close_to_sh

Stages:
  train_shared (per seed): draw the land/sea points and label them from the GLOBE land mask;
      draw the coastal-index points in the cap (target tanh(signed coast distance / scale)); draw
      the regional field and its points in the cap (label: field > 0); the proximity-only
      references of all three tasks from the same training points (k-NN, inverse-distance
      weighted, k chosen on validation; and 1-NN); save ``tasks.npz``.
  train (per variant x seed), all three heads by fit_to_plateau (``head.fit`` / ``coast_head.fit`` /
  ``field_head.fit``: the
  rate grid piloted on validation, plateau stop, one rate drop, best-validation weights):
      encoder   dim, pole_gap (relative embedding change over longitudes at the poles);
                slepian/hybrid: band limit, Shannon number, λ of the last kept function and the
                concentration spectrum (curve slepian_eigenvalues; the plot overlays pyshtools')
      land/sea  head on train points; land_local_acc (test points in the cap, per point: units),
                global_acc (test points outside it, units), land_local_knn_acc / land_local_nn_acc
                (the references in the cap, units), val_loss_land and lr_land curves (and the fit record,
                :func:`_log_fit`), pole_pred_gap
                (largest change of P(land) over longitudes at a pole), map_land_prob curve (P(land)
                on the region grid, for the maps)
      coast     regression head on the coastal index; coast_mse, coast_knn_mse and coast_nn_mse per
                test point (units); coast_r2, val_loss_coast and lr_coast curves, map_coast_pred
                (prediction on the region grid)
      field     classification head on the regional field in the cap (issue 29: the task of the
                three local claims); local_acc, local_knn_acc and local_nn_acc per test point
                (units), val_loss_field and lr_field curves, map_field_prob (P(field > 0) on the
                region grid); cold review: local_boundary_acc / local_boundary_knn_acc (the test
                points within field.boundary_deg of the zero level set, units), field_span_r2 (R² of a
                least-squares readout of the field's value from the features: the mechanism
                precondition), the rate from the field_head.lr table where it has the variant
  hybrid_paper trains the land/sea and field heads, hybrid_sh1 the land/sea head only (``HEADS``).
Accuracies are fractions in [0, 1]; angles in degrees.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...io import save_npz
from .data import (CoastDistance, coast_task, field_task, is_land, land_sea_knn, land_sea_points, region_grid,
                   span_r2)
from .encoders import make_encoder, pole_gap
from .head import final_slope, fit_classifier, fit_regressor
from reprozoo.figures import save_figure

VARIANT_ORDER = ["slepian", "hybrid", "sh", "sinusoidal", "hybrid_paper", "hybrid_sh1"]
# the heads each variant trains (default: all three); the cold review's two added variants train only
# what they are read for: hybrid_sh1 is the control of the global claim (land/sea), hybrid_paper (the
# published rule, recorded, not claimed) the global land/sea and the regional field
HEADS = {"hybrid_sh1": ("land",), "hybrid_paper": ("land", "field")}


def train_shared(ctx) -> None:
    p = ctx.params
    t0 = time.perf_counter()
    tasks = make_tasks(p, ctx.rng(11), ctx.rng(12), ctx.rng(13))
    field, bumps = tasks.pop("_field"), tasks.pop("_bumps")
    grid = region_grid(p["region"], int(p["map_grid"]))
    tasks["map_land_truth"] = is_land(*grid).astype(np.int8)
    tasks["map_coast_truth"] = field.index(*grid)
    tasks["map_field_truth"] = bumps.label(*grid)
    save_npz(ctx.outdir / "tasks.npz", **tasks)
    ctx.metrics.scalar("land_fraction_local", tasks["test_local_y"].mean())
    ctx.metrics.scalar("land_fraction_global", tasks["test_global_y"].mean())
    ctx.metrics.scalar("coast_target_var", np.var(tasks["coast_test_y"]))
    ctx.metrics.scalar("land_knn_k", tasks["land_knn_k"])
    ctx.metrics.scalar("coast_knn_k", tasks["coast_knn_k"])
    ctx.metrics.scalar("field_knn_k", tasks["field_knn_k"])
    ctx.metrics.scalar("field_positive_fraction", tasks["field_test_y"].mean())
    ctx.progress(f"tasks drawn in {time.perf_counter() - t0:.1f} s")


def make_tasks(p: dict, rng_land: np.random.Generator, rng_coast: np.random.Generator,
               rng_field: np.random.Generator) -> dict:
    """The three tasks' points, targets and proximity references (``_field``: the coast-distance
    field; ``_bumps``: the planted regional field)."""
    field = CoastDistance(p["region"], p["coast"])
    land = land_sea_points(p, rng_land)
    regional, bumps = field_task(p, rng_field)
    return {**land, **land_sea_knn(land, p["region"]), **coast_task(p, rng_coast, field), **regional,
            "_field": field, "_bumps": bumps}


def _encoder_metrics(ctx, enc) -> None:
    ctx.metrics.scalar("dim", enc.dim)
    ctx.metrics.scalar("pole_gap", pole_gap(enc))
    cap = getattr(enc, "cap", None) or getattr(getattr(enc, "slep", None), "cap", None)
    if cap is None:
        return
    ours = cap.all_eigenvalues
    ctx.metrics.scalar("slepian_band_limit", cap.L)
    ctx.metrics.scalar("cap_radius_deg", cap.radius_deg)
    ctx.metrics.scalar("shannon_number", cap.shannon)
    ctx.metrics.scalar("lambda_last_kept", cap.eigenvalues[-1])
    n = min(len(ours), int(3 * cap.n_modes))
    ctx.metrics.curve("slepian_eigenvalues", range(1, n + 1), ours[:n])


def _log_fit(ctx, task: str, rec: dict) -> None:
    """The fit record of one head: curves val_loss_<task>, lr_<task> (the gate reads them),
    train_loss_<task>; scalars lr_chosen_<task> (the piloted rate), steps_<task> (where the plateau
    stop fired), best_step_<task>, drop_gain_<task> (how much the one rate drop lowered the best
    validation loss, relative), plateau_<task> (1 if the plateau test held, 0 if max_steps ended it)
    and lr_edge_<task> (1 if the chosen rate is the top or bottom of the grid)."""
    steps = rec["steps"]
    ctx.metrics.curve(f"val_loss_{task}", steps, rec["vals"])
    ctx.metrics.curve(f"lr_{task}", steps, rec["lrs"])
    ctx.metrics.curve(f"train_loss_{task}", steps[1:], rec["train"][1:])
    ctx.metrics.scalar(f"lr_chosen_{task}", rec["lr"])
    ctx.metrics.scalar(f"steps_{task}", rec["stop"])
    ctx.metrics.scalar(f"best_step_{task}", steps[int(np.argmin(rec["vals"]))])
    ctx.metrics.scalar(f"val_loss_{task}_best", min(rec["vals"]))
    ctx.metrics.scalar(f"val_loss_{task}_slope", final_slope(steps, rec["vals"]))
    ctx.metrics.scalar(f"plateau_{task}", float(bool(rec["plateau"])))
    ctx.metrics.scalar(f"lr_edge_{task}", float(rec["lr_edge"] is not None))
    if rec.get("drop_gain") is not None:
        ctx.metrics.scalar(f"drop_gain_{task}", rec["drop_gain"])


def train(ctx) -> None:
    p = ctx.params
    t = np.load(ctx.shared_dir / "tasks.npz")
    t0, c0 = time.perf_counter(), time.process_time()
    enc = make_encoder(ctx.variant, p)
    _encoder_metrics(ctx, enc)
    ctx.progress(f"encoder {ctx.variant}: dim {enc.dim}")
    grid_lat, grid_lon = region_grid(p["region"], int(p["map_grid"]))
    E_grid = enc(grid_lat, grid_lon)

    heads = HEADS.get(ctx.variant, ("land", "coast", "field"))
    if "land" in heads:
        _land(ctx, p, t, enc, E_grid, len(grid_lat))
    if "coast" in heads:
        _coast(ctx, p, t, enc, E_grid, len(grid_lat))
    if "field" in heads:
        _field(ctx, p, t, enc, E_grid, len(grid_lat))
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("train_cpu_seconds", time.process_time() - c0)


def _land(ctx, p, t, enc, E_grid, n_grid) -> None:
    X = {s: enc(t[f"{s}_lat"], t[f"{s}_lon"]) for s in ("train", "val")}
    clf, rec = fit_classifier(X["train"], t["train_y"], X["val"], t["val_y"], 2, p["head"], ctx.seed,
                              label=f"{ctx.variant} land", progress=ctx.progress)
    for split, name in (("test_local", "land_local_acc"), ("test_global", "global_acc")):
        pred = clf.proba(enc(t[f"{split}_lat"], t[f"{split}_lon"])).argmax(1)
        ctx.metrics.units(name, pred == t[f"{split}_y"])  # per test point: paired across variants
    y_loc = t["test_local_y"]
    ctx.metrics.units("land_local_knn_acc", t["test_local_knn_y"] == y_loc)
    ctx.metrics.units("land_local_nn_acc", t["test_local_nn_y"] == y_loc)
    ctx.metrics.scalar("land_local_majority_acc", max(y_loc.mean(), 1 - y_loc.mean()))
    ctx.metrics.scalar("global_majority_acc", max(t["test_global_y"].mean(), 1 - t["test_global_y"].mean()))
    _log_fit(ctx, "land", rec)
    lon = np.linspace(-180.0, 180.0, 36, endpoint=False)
    gaps = [np.ptp(clf.proba(enc(np.full(36, lat), lon))[:, 1]) for lat in (90.0, -90.0)]
    ctx.metrics.scalar("pole_pred_gap", max(gaps))
    ctx.metrics.curve("map_land_prob", range(n_grid), clf.proba(E_grid)[:, 1])
    if ctx.seed == min(p.get("seeds", [ctx.seed])):  # the mask on the map grid, once, for the plot
        ctx.metrics.curve("map_land_truth", range(n_grid), t["map_land_truth"])
    ctx.progress(f"land/sea: local {ctx.metrics.scalars['land_local_acc']:.3f} "
                 f"global {ctx.metrics.scalars['global_acc']:.3f}")


def _coast(ctx, p, t, enc, E_grid, n_grid) -> None:
    # coastal index in the cap (regression), against 1-NN from the same training points
    Xc = {sp: enc(t[f"coast_{sp}_lat"], t[f"coast_{sp}_lon"]) for sp in ("train", "val", "test")}
    reg, rec = fit_regressor(Xc["train"], t["coast_train_y"], Xc["val"], t["coast_val_y"], p["coast_head"],
                             ctx.seed, label=f"{ctx.variant} coast", progress=ctx.progress)
    y = t["coast_test_y"]
    err = reg.predict(Xc["test"]) - y
    ctx.metrics.units("coast_mse", err**2)
    ctx.metrics.units("coast_knn_mse", (t["coast_test_knn_y"] - y) ** 2)
    ctx.metrics.units("coast_nn_mse", (t["coast_test_nn_y"] - y) ** 2)
    ctx.metrics.scalar("coast_r2", 1 - np.mean(err**2) / np.var(y))
    _log_fit(ctx, "coast", rec)
    ctx.metrics.curve("map_coast_pred", range(n_grid), reg.predict(E_grid))
    if ctx.seed == min(p.get("seeds", [ctx.seed])):
        ctx.metrics.curve("map_coast_truth", range(n_grid), t["map_coast_truth"])
    ctx.progress(f"coast: mse {ctx.metrics.scalars['coast_mse']:.4f} (k-NN {ctx.metrics.scalars['coast_knn_mse']:.4f}, "
                 f"1-NN {ctx.metrics.scalars['coast_nn_mse']:.4f})")


def _field(ctx, p, t, enc, E_grid, n_grid) -> None:
    # regional field in the cap (classification; the task of the three local claims)
    Xf = {sp: enc(t[f"field_{sp}_lat"], t[f"field_{sp}_lon"]) for sp in ("train", "val", "test")}
    # the rate (cold review, for the budget): the field head's ``lr`` table where it has this variant's
    # entry (piloted once on the grid, seed 0, validation data only: configs/smoke.yaml), else the grid
    # piloted in this fit (ci, paper); the plateau rule is the same either way
    from ...blocks.rate_table import fit_with_table_rate, stamp_source

    fit_cfg, source = fit_with_table_rate(p["field_head"]["fit"], p["field_head"].get("lr"), ctx.variant,
                                          required=False, where="field_head.lr")
    clf_f, rec = fit_classifier(Xf["train"], t["field_train_y"], Xf["val"], t["field_val_y"], 2,
                                {**p["field_head"], "fit": fit_cfg}, ctx.seed, label=f"{ctx.variant} field",
                                progress=ctx.progress)
    stamp_source(rec, source)
    ctx.metrics.scalar("lr_from_table_field", float(source["lr_source"] == "table"))
    yf = t["field_test_y"]
    ctx.metrics.units("local_acc", clf_f.proba(Xf["test"]).argmax(1) == yf)
    ctx.metrics.units("local_knn_acc", t["field_test_knn_y"] == yf)
    ctx.metrics.units("local_nn_acc", t["field_test_nn_y"] == yf)
    ctx.metrics.scalar("local_majority_acc", max(yf.mean(), 1 - yf.mean()))
    # the boundary band (cold review; the paper tests near label boundaries): test points within
    # field.boundary_deg of the field's zero level set, the same points for every variant of a seed
    band = t["field_test_boundary"].astype(bool)
    ctx.metrics.units("local_boundary_acc", (clf_f.proba(Xf["test"][band]).argmax(1) == yf[band]))
    ctx.metrics.units("local_boundary_knn_acc", t["field_test_knn_y"][band] == yf[band])
    ctx.metrics.scalar("field_boundary_fraction", band.mean())
    # the mechanism precondition (cold review): how much of the field the encoder's features span in
    # the cap, a least-squares readout of the field's value fitted on the span points, R² on the test points
    Es = enc(t["field_span_lat"], t["field_span_lon"])
    ctx.metrics.scalar("field_span_r2", span_r2(Es, t["field_span_v"], Xf["test"], t["field_test_v"]))
    _log_fit(ctx, "field", rec)
    ctx.metrics.curve("map_field_prob", range(n_grid), clf_f.proba(E_grid)[:, 1])
    if ctx.seed == min(p.get("seeds", [ctx.seed])):
        ctx.metrics.curve("map_field_truth", range(n_grid), t["map_field_truth"])
    ctx.progress(f"field: span R2 {ctx.metrics.scalars['field_span_r2']:.3f} boundary acc "
                 f"{ctx.metrics.scalars['local_boundary_acc']:.4f} (k-NN {ctx.metrics.scalars['local_boundary_knn_acc']:.4f})")
    ctx.progress(f"field: acc {ctx.metrics.scalars['local_acc']:.4f} (k-NN {ctx.metrics.scalars['local_knn_acc']:.4f}, "
                 f"1-NN {ctx.metrics.scalars['local_nn_acc']:.4f})")


# --- plots ---------------------------------------------------------------------------------------

def _variants(table):
    present = set(table.variant.unique())
    return [v for v in VARIANT_ORDER if v in present] + sorted(present - set(VARIANT_ORDER))


def _grid(params):
    n = int(params["map_grid"])
    lat, lon = region_grid(params["region"], n)
    return lat.reshape(n, n), lon.reshape(n, n)


def _cap_outline(ax, r):
    from ...blocks.sphere import cap_frame, lat_lon

    a = np.radians(r["radius_deg"])
    phi = np.linspace(0, 2 * np.pi, 200)
    local = np.stack([np.sin(a) * np.cos(phi), np.sin(a) * np.sin(phi), np.full_like(phi, np.cos(a))], 1)
    la, lo = lat_lon(local @ cap_frame(r["lat"], r["lon"]))
    ax.plot(lo, la, "w--", lw=0.8)


def _map_values(table, metric, variant, n):
    sub = table[(table.metric == metric) & (table.variant == variant)]
    if sub.empty:
        return None
    s0 = sub[sub.seed == sub.seed.min()].sort_values("x")
    return s0.value.to_numpy().reshape(n, n)


MAPS = {  # task -> (prediction curve, truth curve, truth title, value range, contour level, colour-bar label, question)
    "land": ("map_land_prob", "map_land_truth", "GLOBE land mask (truth)", (0.0, 1.0), 0.5, "P(land)",
             "Which encoder resolves the coastline inside the {r}° cap (dashed) at equal dimension {D}?"),
    "coast": ("map_coast_pred", "map_coast_truth", "coastal index (truth)", (-1.0, 1.0), 0.0,
              "tanh(signed coast distance / {km} km)", "Which encoder reproduces the coastal index inside the cap (dashed)?"),
    "field": ("map_field_prob", "map_field_truth", "planted field > 0 (truth)", (0.0, 1.0), 0.5, "P(field > 0)",
              "Which encoder resolves the planted regional field inside the cap (dashed)?"),
}


def plot_maps(table, plots_dir: Path, params, task: str) -> None:
    """The truth and every encoder's prediction over the region grid (first seed), the cap dashed,
    the truth's coastline contour on every panel: one helper for both tasks (``MAPS``)."""
    from ...plotting import plt

    pred_metric, truth_metric, truth_title, (vmin, vmax), level, label, question = MAPS[task]
    truth = table[table.metric == truth_metric]
    if truth.empty:
        return
    pyplot = plt()
    LA, LO = _grid(params)
    n = LA.shape[0]
    variants = _variants(table)
    truth = truth[(truth.variant == truth.variant.iloc[0]) & (truth.seed == truth.seed.min())]
    truth = truth.sort_values("x").value.to_numpy().reshape(n, n)
    fig, axes = pyplot.subplots(1, len(variants) + 1, figsize=(3.2 * (len(variants) + 1), 3.4), squeeze=False)
    panels = [(truth_title, truth)] + [(v, _map_values(table, pred_metric, v, n)) for v in variants]
    for ax, (name, val) in zip(axes[0], panels):
        if val is None:
            ax.axis("off")
            continue
        im = ax.pcolormesh(LO, LA, val, vmin=vmin, vmax=vmax, cmap="BrBG_r", shading="auto")
        ax.contour(LO, LA, truth, levels=[level], colors="k", linewidths=0.4)
        _cap_outline(ax, params["region"])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("longitude (°E)")
    axes[0, 0].set_ylabel("latitude (°N)")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label=label.format(km=params["coast"]["scale_km"]))
    title = question.format(r=params["region"]["radius_deg"], D=params["encoder"]["dim"])
    fig.suptitle(f"{title} (seed {int(table.seed.min())})", fontsize=10)
    for metric in (pred_metric, truth_metric):
        fig.savefig(plots_dir / f"curve_{metric}.png", dpi=110, bbox_inches="tight")
    pyplot.close(fig)


def plot_accuracy(table, plots_dir: Path) -> None:
    from ...plotting import plt

    pyplot = plt()
    variants = _variants(table)
    metrics = [("local_acc", "regional field in the cap (accuracy)", "local_knn_acc", "local_nn_acc"),
               ("local_boundary_acc", "field, within 1° of its zero set (accuracy)", "local_boundary_knn_acc", None),
               ("land_local_acc", "land/sea in the cap (accuracy)", "land_local_knn_acc", "land_local_nn_acc"),
               ("global_acc", "land/sea outside the cap (accuracy)", None, None),
               ("coast_mse", "coastal index in the cap (test MSE)", "coast_knn_mse", "coast_nn_mse")]
    fig, axes = pyplot.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.6))
    for ax, (m, label, knn, nn) in zip(axes, metrics):
        for i, v in enumerate(variants):
            vals = table[(table.metric == m) & (table.variant == v)].value.to_numpy()
            if len(vals):
                ax.bar(i, vals.mean(), yerr=vals.std(ddof=1) if len(vals) > 1 else 0, alpha=0.6, capsize=3)
                ax.plot(np.full(len(vals), i), vals, "k.", ms=4)
        refs = []
        for ref, ls, name in ((knn, "--", "k-NN (IDW, k on val.)"), (nn, ":", "1-NN")):
            vals = table[table.metric == ref].value if ref else []
            if len(vals):
                ax.axhline(vals.mean(), color="k", ls=ls, lw=1, label=name)
                refs.append(vals.mean())
        if refs:
            ax.legend(fontsize=7)
        ax.set_xticks(range(len(variants)), variants, fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("test MSE" if m == "coast_mse" else "test accuracy (fraction)")
        ax.set_title(label, fontsize=9)
        sub = table[(table.metric == m)].value
        if len(sub) and m != "coast_mse":
            ax.set_ylim(max(0.0, min([sub.min()] + refs) - 0.05), min(1.0, max([sub.max()] + refs) + 0.03))
    fig.suptitle("Does concentrating the encoding in the region raise accuracy there, and what does it cost "
                 "globally? (bars: seed mean ± std, dots: seeds; lines: proximity-only references)", fontsize=10)
    save_figure(fig, plots_dir / "accuracy.png", dpi=110)


def plot_spectrum(table, plots_dir: Path) -> None:
    """Our concentration spectrum against pyshtools' (computed here once, for the same cap)."""
    from ...plotting import plt
    from .slepian_basis import pyshtools_cap_eigenvalues

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 4))
    for v in ("slepian", "hybrid"):
        s = table[(table.variant == v) & (table.seed == table.seed.min())]
        ours = s[s.metric == "slepian_eigenvalues"].sort_values("x")
        if ours.empty:
            continue
        N = s[s.metric == "shannon_number"].value.iloc[0]
        L = int(s[s.metric == "slepian_band_limit"].value.iloc[0])
        theirs = pyshtools_cap_eigenvalues(L, float(s[s.metric == "cap_radius_deg"].value.iloc[0]))[:len(ours)]
        diff = np.max(np.abs(theirs - ours.value.to_numpy()))
        line, = ax.plot(ours.x, ours.value, "-", label=f"{v}: ours (L = {L})")
        ax.plot(ours.x, theirs, "o", ms=2.5, mfc="none", color=line.get_color(),
                label=f"{v}: pyshtools SHReturnTapers (max |Δλ| = {diff:.1e})")
        ax.axvline(N, color=line.get_color(), ls=":", lw=1)
    ax.set_xlabel("rank of the Slepian function (dotted: Shannon number N)")
    ax.set_ylabel("concentration λ in the cap (share of energy)")
    ax.set_title("Do our cap concentration eigenvalues match pyshtools?", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, plots_dir / "curve_slepian_eigenvalues.png", dpi=110)


def plot_losses(table, plots_dir: Path) -> None:
    from ...plotting import curve_plot

    for task in ("land", "coast", "field"):
        for kind in ("val", "train"):
            m = f"{kind}_loss_{task}"
            curve_plot(table, m, plots_dir / f"curve_{m}.png", xlabel="optimiser step",
                       ylabel=f"{kind} " + ("MSE" if task == "coast" else "cross-entropy (nats)"),
                       variants=_variants(table),
                       title=f"Has every head converged on the {task} task? ({kind} loss, seed mean ± std)")


def plot(table, plots_dir, params) -> None:
    plots_dir = Path(plots_dir)
    if table.empty:
        return
    plot_accuracy(table, plots_dir)
    plot_losses(table, plots_dir)
    plot_spectrum(table, plots_dir)
    for task in MAPS:
        plot_maps(table, plots_dir, params, task)
