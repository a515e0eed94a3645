"""ANTIC in miniature: in-situ compression of a running 2-D Kolmogorov flow.

Variants (all see the same trajectory per seed: the solver is deterministic):
  antic             adaptive selector + neural field with continual rank-r residual fine-tuning; the
                    same job replays its kept frames at every rank of ``rd_ranks`` from its float16
                    base network (ANTIC's rate-distortion sweep)
  uniform_continual uniform selection at the adaptive selector's kept count, same spatial codec
  adaptive_scratch  adaptive selection, a fresh network per kept frame (ANTIC's Fourier encoding) at
                    most ANTIC's bytes per kept frame
  zfp               zfpy on every frame, 2-D (classical lossy compressor, spatial only)
  zfp_kept          zfpy 2-D on the adaptive selector's kept frames, the same linear interpolation
  zfp_3d            zfpy's 3-D mode over (t, x, y) on every frame
  zfp_kept_3d       zfpy 3-D over the kept frames stacked in time, the same interpolation
  pearson_ref       the reference code's selector alone (correlation to the last kept frame < 0.9,
                    a forced keep every 5 frames), interpolating its exact kept frames: our
                    drift / enstrophy selector is an ablation of it (selection only, no codec)
                    (each zfp variant: a tolerance sweep fixed in advance, read per frame at every
                    point of ANTIC's rate sweep and at the scratch baseline's bytes; ``zfp_codec.py``)

Stages: ``train_shared`` runs the solver once with the adaptive selector only (the kept count
K the uniform baseline and the scratch size need) and chooses each fit type's peak learning rate
from one grid. ``train`` runs the solver again with the variant's compressor as the ``record``
callback (single streaming pass), reconstructs every frame (linear interpolation in time between
kept reconstructions) and scores it. ``antic`` also runs the same solver without the callback in
the same job (the in-situ overhead as a wall-time ratio) and records the controls: a seeded random
selection at the same kept count (exact frames interpolated, and through the same codec from the
same base) and the stale base network on every kept frame (no residuals).

Units: vorticity in solver units (1/time); compression ratio = raw float32 bytes of all frames /
stored bytes; ``frame_err``: relative L2 error of every frame (per-unit values: the claims'
intervals resample frames); ``rel_l2``: relative L2 over all frames at once.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .flow import enstrophy, make_flow, run_insitu
from .selection import AdaptiveSelector, PearsonSelector, UniformSelector, interpolate_frames
from .zfp_codec import frame_errors
from reprozoo.figures import save_figure

VARIANT_ORDER = ["antic", "uniform_continual", "adaptive_scratch", "zfp", "zfp_kept", "zfp_3d", "zfp_kept_3d",
                 "pearson_ref"]
COLORS = {"pearson_ref": "C7", "antic": "C0", "uniform_continual": "C1", "adaptive_scratch": "C2", "zfp": "C3", "zfp_kept": "C4",
          "zfp_3d": "C5", "zfp_kept_3d": "C6"}
GENERIC_CURVES: dict = {}  # plot() draws every figure
RAW_BYTES = 4  # float32 per grid value


def _adaptive(p):
    s = p["selector"]
    return AdaptiveSelector(int(p["flow"]["n_frames"]), s["tau_field"], s["tau_enstrophy"])


def train_shared(ctx) -> None:
    """The adaptive selector's kept frames (the count K every variant is matched on) and the peak
    learning rate of each fit type, chosen from one grid on the first two kept frames."""
    from .neural_codec import choose_lrs

    p = ctx.params
    solver, w_hat0, t_save = make_flow(p["flow"], ctx.seed)
    sel = _adaptive(p)
    kept, first = [], []

    def on_frame(i, w):
        if sel.keep(i, w):
            kept.append(i)
            if len(first) < 2:
                first.append(w.copy())

    wall, _ = run_insitu(solver, w_hat0, t_save, on_frame)
    ctx.progress(f"reference pass: {len(kept)} of {len(t_save)} frames kept by the adaptive selector, {wall:.2f} s")
    lrs = choose_lrs(first, kept, int(p["flow"]["n"]), p["codec"], ctx.seed, p["lr_grid"])
    ctx.progress(f"learning rates chosen on the first kept frames: {({k: v for k, v in lrs.items() if k != 'errors'})}")
    (Path(ctx.outdir) / "selection.json").write_text(json.dumps({"kept": kept, "n_frames": len(t_save), "lrs": lrs}))
    ctx.metrics.scalar("n_kept", len(kept))


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def drift_contrast(truth: np.ndarray, blocks: int = 5) -> float:
    """How non-stationary the trajectory is: the frame-to-frame relative drift averaged over
    ``blocks`` consecutive stretches of the run, fastest stretch / slowest (1: uniform change)."""
    d = np.linalg.norm(np.diff(truth, axis=0), axis=(1, 2)) / np.linalg.norm(truth[:-1], axis=(1, 2))
    means = [float(np.mean(b)) for b in np.array_split(d, blocks)]
    return max(means) / min(means)


def _score(ctx, truth, recon, stored_bytes, n_keep, prefix=""):
    raw = truth.size * RAW_BYTES
    z_true, z_rec = enstrophy(truth), enstrophy(recon)
    ctx.metrics.units(prefix + "frame_err", frame_errors(recon, truth))  # per frame: the claims' units
    ctx.metrics.scalar(prefix + "compression_ratio", raw / stored_bytes)
    ctx.metrics.scalar(prefix + "rel_l2", rel_l2(recon, truth))
    ctx.metrics.scalar(prefix + "enstrophy_err", rel_l2(z_rec, z_true))
    ctx.metrics.scalar(prefix + "bytes_per_kept_frame", stored_bytes / n_keep)
    return z_true, z_rec


def least_converged(fits: list[dict]) -> tuple[dict, list[float]]:
    """The fit whose validation curve still improves most over its last 30 % (the convergence
    gate's own measure, ``claims.tail_fit``), and every fit's improvement: the gate reads the
    least converged fit, so it passes only if every fit does."""
    from reprozoo.claims import tail_fit

    tails = [float(tail_fit(f["x"], f["y"])["improvement"]) for f in fits]
    return fits[int(np.argmax(tails))], tails


def _record_fits(ctx, fits: list[dict], name: str) -> None:
    """The gate's curve ``{name}_fit`` (least converged fit, whole-grid MSE per step) with its rate
    ``{name}_lr``, and the spread of every fit's tail improvement."""
    if not fits:
        return
    worst, tails = least_converged(fits)
    ctx.metrics.curve(f"{name}_fit", worst["x"], worst["y"])
    ctx.metrics.curve(f"{name}_lr", worst["x"], worst["lr"])
    ctx.metrics.scalar(f"{name}_tail_max", max(tails))
    ctx.metrics.scalar(f"{name}_tail_median", float(np.median(tails)))
    ctx.metrics.scalar(f"{name}_worst_frame", worst["frame"])


def train(ctx) -> None:
    p = ctx.params
    shared = json.loads((Path(ctx.shared_dir) / "selection.json").read_text())
    K, N = len(shared["kept"]), int(shared["n_frames"])
    solver, w_hat0, t_save = make_flow(p["flow"], ctx.seed)
    n = int(p["flow"]["n"])
    truth = np.empty((N, n, n))
    if ctx.variant.startswith("zfp"):
        return _train_zfp(ctx, solver, w_hat0, t_save, truth, shared["kept"])
    if ctx.variant == "pearson_ref":
        return _train_selection_only(ctx, solver, w_hat0, t_save, truth)

    import torch

    torch.set_num_threads(1)
    from .neural_codec import ContinualCodec, ScratchCodec, scratch_config

    cfg = {**p["codec"], **{k: shared["lrs"][k] for k in ("lr", "delta_lr", "scratch_lr")}}
    if ctx.variant == "adaptive_scratch":
        width, _ = scratch_config(cfg, K)  # at most ANTIC's bytes per kept frame, ANTIC's Fourier encoding
        codec, sel = ScratchCodec(n, cfg, ctx.seed, width), _adaptive(p)
        ctx.metrics.scalar("scratch_width", width)
    else:
        codec = ContinualCodec(n, cfg, ctx.seed)
        sel = _adaptive(p) if ctx.variant == "antic" else UniformSelector(N, K)

    def on_frame(i, w):
        truth[i] = w  # ground truth kept for scoring only, not counted as stored
        if sel.keep(i, w):
            codec.add(i, w)

    if ctx.variant == "antic":  # the same solver without the callback, in the same job
        wall_plain, _ = run_insitu(solver, w_hat0, t_save, None)
        cpu_plain = run_insitu.cpu_s
        ctx.metrics.scalar("solver_wall_s", wall_plain)
    wall, in_callback = run_insitu(solver, w_hat0, t_save, on_frame)
    ctx.progress(f"in-situ pass: {len(codec.kept_idx)} kept, {wall:.2f} s ({in_callback:.2f} s in the callback)")
    if ctx.variant == "antic":
        ctx.metrics.scalar("insitu_wall_s", wall)
        ctx.metrics.scalar("insitu_wall_ratio", wall / wall_plain)
        ctx.metrics.scalar("insitu_cpu_ratio", run_insitu.cpu_s / cpu_plain)
        ctx.metrics.scalar("callback_wall_fraction", in_callback / wall)
    kept = list(codec.kept_idx)
    recon = interpolate_frames(kept, codec.recon, N)
    z_true, z_rec = _score(ctx, truth, recon, codec.stored_bytes, len(kept))
    ctx.metrics.scalar("kept_err", float(np.mean([rel_l2(r, truth[i]) for i, r in zip(kept, codec.recon)])))
    # the selection alone: interpolating the exact kept frames (no spatial codec, no training)
    ctx.metrics.units("interp_err", frame_errors(interpolate_frames(kept, truth[kept], N), truth))
    ctx.metrics.scalar("n_kept", len(kept))
    ctx.metrics.curve("enstrophy_true", t_save, z_true)
    ctx.metrics.curve("enstrophy_rec", t_save, z_rec)
    ctx.metrics.curve("frame_rel_l2", t_save, frame_errors(recon, truth))
    ctx.metrics.curve("kept_frames", [t_save[i] for i in kept], kept)
    for kind in ("base", "delta", "scratch"):
        _record_fits(ctx, [f for f in codec.fits if f["kind"] == kind], kind)
    if ctx.variant == "antic":
        ctx.metrics.scalar("drift_contrast", drift_contrast(truth))
        _controls(ctx, codec, truth, N, K)
        _rate_sweep(ctx, codec, truth, p)
    picks = sorted({0, N // 3, 2 * N // 3, N - 1})  # the same times for every variant (fields figure)
    np.savez_compressed(Path(ctx.outdir) / "frames.npz", t=t_save[picks], idx=np.array(picks),
                        truth=truth[picks].astype(np.float32), recon=recon[picks].astype(np.float32))


def _train_selection_only(ctx, solver, w_hat0, t_save, truth) -> None:
    """The reference code's selector alone (no spatial codec): its kept count and the error of
    interpolating its exact kept frames, per frame (the same units as ``interp_err`` of the others)."""
    s = ctx.params.get("pearson_selector", {})
    sel = PearsonSelector(len(t_save), float(s.get("rho", 0.9)), int(s.get("window", 5)))
    kept = []

    def on_frame(i, w):
        truth[i] = w
        if sel.keep(i, w):
            kept.append(i)

    run_insitu(solver, w_hat0, t_save, on_frame)
    N = len(t_save)
    ctx.metrics.units("interp_err", frame_errors(interpolate_frames(kept, truth[kept], N), truth))
    ctx.metrics.scalar("n_kept", len(kept))
    ctx.metrics.curve("kept_frames", [t_save[i] for i in kept], kept)
    ctx.progress(f"reference (Pearson) selector: {len(kept)} of {N} frames kept")


def random_kept(n_frames: int, n_keep: int, seed: int) -> list[int]:
    """A seeded random selection of ``n_keep`` frames (the first and last always kept, as every
    selector does): the selection control, which knows nothing about the flow."""
    rng = np.random.default_rng(10_007 + seed)
    inner = rng.choice(np.arange(1, n_frames - 1), size=max(0, min(n_keep, n_frames) - 2), replace=False)
    return sorted({0, n_frames - 1, *inner.tolist()})


def _controls(ctx, codec, truth, N: int, K: int) -> None:
    """The controls recorded by the antic job (each a case where the claimed effect must be absent).
    Selection: a seeded random selection at the same kept count K, interpolated from its exact
    frames (``interp_err_random``) and through the same continual codec from the same base
    (``frame_err_random``; its residual fits join the ``sweep`` gate curve). Codec: the stale base,
    the base network alone on every kept frame with that frame's stored mean and std, no
    residuals (``frame_err_stale``)."""
    rk = random_kept(N, K, ctx.seed)
    ctx.metrics.units("interp_err_random", frame_errors(interpolate_frames(rk, truth[rk], N), truth))
    c = codec.branch(codec.rank)
    for i in rk[1:]:
        c.add(i, truth[i])
    ctx.metrics.units("frame_err_random", frame_errors(interpolate_frames(c.kept_idx, c.recon, N), truth))
    ctx.metrics.scalar("n_kept_random", len(rk))
    codec.control_fits = [f for f in c.fits if f["kind"] == "delta"]
    stale = interpolate_frames(codec.kept_idx, codec.stale_recon(), N)
    ctx.metrics.units("frame_err_stale", frame_errors(stale, truth))
    ctx.metrics.scalar("rel_l2_stale", rel_l2(stale, truth))


def ratio_at_error(target: float, errs, ratios) -> tuple[float, str]:
    """The compression ratio at ``target`` error along a rate sweep, interpolated log-log (as zfp's
    ``ratio_at_target_err``). Outside the sweep, the conservative end: every point more accurate
    than the target gives the sweep's largest ratio (a lower bound); every point less accurate gives
    0 (the sweep never reaches the target). Returns the ratio and which case applied."""
    from .zfp_codec import loglog_at

    errs, ratios = np.asarray(errs, dtype=float), np.asarray(ratios, dtype=float)
    r = loglog_at(target, errs, ratios)
    if r is not None:
        return r, "inside"
    if np.all(errs < target):
        return float(np.max(ratios)), "below"
    return 0.0, "above"


def _rate_sweep(ctx, codec, truth, p) -> None:
    """ANTIC's rate-distortion sweep: the same kept frames, the same float16 base network, residuals
    of every rank in ``rd_ranks`` (the in-situ run's own rank is one of them and is reused). Per
    rank j: stored bytes, compression ratio and per-frame errors (``frame_err_rd{j}``)."""
    N = len(truth)
    ranks = [int(r) for r in p["rd_ranks"]]
    if int(codec.rank) not in ranks:
        raise ValueError(f"rd_ranks {ranks} must contain the codec's rank {codec.rank}")
    sweep_fits = list(getattr(codec, "control_fits", []))
    errs, ratios = [], []
    for j, r in enumerate(ranks):
        c = codec
        if r != codec.rank:
            c = codec.branch(r)
            for i in codec.kept_idx[1:]:
                c.add(i, truth[i])
            sweep_fits += [f for f in c.fits if f["kind"] == "delta"]
        rec = interpolate_frames(c.kept_idx, c.recon, N)
        ctx.metrics.units(f"frame_err_rd{j}", frame_errors(rec, truth))
        ctx.metrics.scalar(f"rank_rd{j}", r)
        ctx.metrics.scalar(f"bytes_rd{j}", c.stored_bytes)
        ctx.metrics.scalar(f"ratio_rd{j}", truth.size * RAW_BYTES / c.stored_bytes)
        ctx.metrics.scalar(f"rel_l2_rd{j}", rel_l2(rec, truth))
        errs.append(rel_l2(rec, truth))
        ratios.append(truth.size * RAW_BYTES / c.stored_bytes)
        ctx.progress(f"rate sweep: rank {r}: {c.stored_bytes} bytes, relative L2 {rel_l2(rec, truth):.4f}")
    # ANTIC's ratio at the target error (relative L2 over all frames), read from its rank sweep
    r_t, case = ratio_at_error(float(p["target_rel_l2"]), errs, ratios)
    ctx.metrics.scalar("ratio_at_target_err", r_t)
    ctx.metrics.scalar("target_err_bracketed", float(case == "inside"))
    ctx.progress(f"ratio at {p['target_rel_l2']} error along the rank sweep: {r_t:.1f} ({case})")
    _record_fits(ctx, sweep_fits, "sweep")


_TRAJ: dict = {}  # the zfp variants of one seed share one solver run (within a batched job)


def _trajectory(solver, w_hat0, t_save, key):
    if key not in _TRAJ:
        frames = np.empty((len(t_save),) + solver.to_grid(w_hat0)[0].shape)

        def on_frame(i, w):
            frames[i] = w

        run_insitu(solver, w_hat0, t_save, on_frame)
        _TRAJ.clear()
        _TRAJ[key] = frames
    return _TRAJ[key]


def zfp_targets(p: dict, n_keep: int) -> dict[str, int]:
    """The stored bytes at which each zfp baseline is read: every point of ANTIC's rate sweep
    (``rd{j}``) and the scratch baseline's bytes, all from the architecture and the kept count, as
    those codecs count them."""
    from .neural_codec import antic_bytes, scratch_config

    out = {f"rd{j}": antic_bytes(p["codec"], n_keep, int(r)) for j, r in enumerate(p["rd_ranks"])}
    out["scratch"] = scratch_config(p["codec"], n_keep)[1]
    return out


def _train_zfp(ctx, solver, w_hat0, t_save, truth, kept):
    """One zfp baseline (``zfp_codec.MODES``): its tolerance sweep, read at every target's bytes."""
    from .neural_codec import antic_bytes
    from .zfp_codec import encode, frame_errors_at, loglog_at, values_compressed

    p = ctx.params
    truth[:] = _trajectory(solver, w_hat0, t_save, (repr(sorted(p["flow"].items())), ctx.seed))
    scale = float(np.std(truth[0]))
    exps = [int(k) for k in p["zfp_log2_tolerances"]]
    raw = truth.size * RAW_BYTES
    sweep = [encode(truth, kept, ctx.variant, tolerance=2.0**k * scale) for k in exps]
    nbytes = [b for b, _ in sweep]
    errs = [rel_l2(rec, truth) for _, rec in sweep]
    per_frame = [frame_errors(rec, truth) for _, rec in sweep]
    ctx.metrics.curve("zfp_ratio_vs_tol", exps, [raw / b for b in nbytes])
    ctx.metrics.curve("zfp_err_vs_tol", exps, errs)
    ctx.metrics.curve("zfp_frame_err_vs_tol", exps, [float(np.mean(f)) for f in per_frame])
    for name, budget in zfp_targets(p, len(kept)).items():
        fe, case = frame_errors_at(budget, nbytes, per_frame)
        ctx.metrics.units(f"err_at_{name}", fe)
        ctx.metrics.scalar(f"target_bytes_{name}", budget)
        ctx.metrics.scalar(f"bracketed_{name}", float(case == "inside"))
    # zfp's ratio at the target error (log-log in the sweep; the nearest end outside it)
    ratios = [raw / b for b in nbytes]
    tgt = float(p["target_rel_l2"])
    r_t = loglog_at(tgt, errs, ratios)
    if r_t is None:
        r_t = ratios[int(np.argmin(np.abs(np.log(np.asarray(errs) / tgt))))]
    ctx.metrics.scalar("ratio_at_target_err", r_t)
    # the scored reconstruction: the sweep's most accurate point within ANTIC's bytes (else its smallest)
    budget = antic_bytes(p["codec"], len(kept))
    fits = [j for j, b in enumerate(nbytes) if b <= budget]
    stored, rec = sweep[min(fits, key=lambda j: errs[j])] if fits else sweep[int(np.argmin(nbytes))]
    z_true, z_rec = _score(ctx, truth, rec, stored, values_compressed(truth, kept, ctx.variant) // truth[0].size)
    ctx.metrics.curve("enstrophy_true", t_save, z_true)
    ctx.metrics.curve("enstrophy_rec", t_save, z_rec)
    ctx.metrics.curve("frame_rel_l2", t_save, frame_errors(rec, truth))
    picks = sorted({0, len(t_save) // 3, 2 * len(t_save) // 3, len(t_save) - 1})
    np.savez_compressed(Path(ctx.outdir) / "frames.npz", t=t_save[picks], idx=np.array(picks),
                        truth=truth[picks].astype(np.float32), recon=rec[picks].astype(np.float32))


# --- plots ---------------------------------------------------------------------------------------

def _finish(plt_, fig, ax, xlabel, ylabel, title, png):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    save_figure(fig, png, dpi=110)


def plot(table, plots_dir: Path, params: dict) -> None:
    from ...plotting import plt

    plt_ = plt()
    plots_dir = Path(plots_dir)
    variants = [v for v in VARIANT_ORDER if v in set(table.variant)]
    sc = table[table.x.isna()]

    def vals(metric, v):
        return sc[(sc.metric == metric) & (sc.variant == v)].sort_values("seed").value.to_numpy()

    # rate-distortion: ANTIC's rank sweep and every zfp's tolerance sweep per seed (mean per-frame
    # error, the claims' unit), uniform / scratch as points
    fig, ax = plt_.subplots(figsize=(6, 4.2))
    seeds = sorted(set(table.seed))
    n_rd = len(set(m for m in sc.metric if m.startswith("ratio_rd")))
    for v in variants:
        for s in seeds:
            first = s == seeds[0]
            if v.startswith("zfp"):
                r = table[(table.variant == v) & (table.seed == s) & (table.metric == "zfp_ratio_vs_tol")].sort_values("x")
                e = table[(table.variant == v) & (table.seed == s) & (table.metric == "zfp_frame_err_vs_tol")].sort_values("x")
                ax.plot(e.value.to_numpy(), r.value.to_numpy(), "-o", color=COLORS[v], ms=3, alpha=0.6,
                        label=f"{v} (tolerance sweep)" if first else None)
            elif v == "antic" and n_rd:
                pts = [(sc[(sc.metric == f"frame_err_rd{j}") & (sc.variant == v) & (sc.seed == s)].value,
                        sc[(sc.metric == f"ratio_rd{j}") & (sc.variant == v) & (sc.seed == s)].value) for j in range(n_rd)]
                pts = [(float(e.iloc[0]), float(r.iloc[0])) for e, r in pts if len(e) and len(r)]
                if pts:
                    ax.plot(*zip(*pts), "-s", color=COLORS[v], ms=5, lw=2, label="antic (rank sweep)" if first else None)
            else:
                e, r = vals("frame_err", v), vals("compression_ratio", v)
                if len(e) and first:
                    ax.plot(e, r, "o", color=COLORS[v], ms=6, mec="k", label=v)
    tgt = float(params.get("target_rel_l2", 0.05))
    ax.axvline(tgt, color="gray", ls=":")
    ax.axhline(100, color="gray", ls=":")
    ax.set_xscale("log"), ax.set_yscale("log")
    _finish(plt_, fig, ax, "mean relative L2 error per frame (-)", "compression ratio (raw float32 bytes / stored bytes)",
            "Rate-distortion: ANTIC's rank sweep against zfp's tolerance sweeps", plots_dir / "ratio_vs_error.png")

    # enstrophy over time, true vs reconstructed (seed 0 of each variant) + kept frames
    s0 = min(table.seed)
    fig, ax = plt_.subplots(figsize=(6.5, 4))
    tr = table[(table.variant == variants[0]) & (table.seed == s0) & (table.metric == "enstrophy_true")]
    ax.plot(tr.x, tr.value, "k-", lw=2.5, label="true")
    for v in variants:
        r = table[(table.variant == v) & (table.seed == s0) & (table.metric == "enstrophy_rec")]
        ax.plot(r.x, r.value, "-", color=COLORS[v], lw=1, label=f"{v} (reconstructed)")
        k = table[(table.variant == v) & (table.seed == s0) & (table.metric == "kept_frames")]
        if len(k):
            zt = np.interp(k.x, tr.x, tr.value)
            ax.plot(k.x, zt, "|", color=COLORS[v], ms=12)
    _finish(plt_, fig, ax, "simulation time t (solver units)", "enstrophy Z = <w^2>/2 (1/time^2)", f"Does the reconstruction keep the enstrophy curve? (seed {s0}; ticks: kept frames)", plots_dir / "enstrophy.png")

    # per-frame error over time
    fig, ax = plt_.subplots(figsize=(6.5, 3.5))
    for v in variants:
        for s in sorted(set(table.seed)):
            r = table[(table.variant == v) & (table.seed == s) & (table.metric == "frame_rel_l2")]
            if len(r):
                ax.plot(r.x, r.value, color=COLORS[v], lw=1, alpha=0.6, label=v if s == s0 else None)
    ax.set_yscale("log")
    _finish(plt_, fig, ax, "simulation time t (solver units)", "relative L2 error of the frame (-)", "Where in time does each compressor lose accuracy?", plots_dir / "frame_error.png")

    # the convergence gate's curves: each variant's least converged fit of each kind (seed s0)
    fig, ax = plt_.subplots(figsize=(6.5, 3.8))
    for v in variants:
        for kind, ls in (("base", "-"), ("delta", "--"), ("sweep", ":"), ("scratch", "-.")):
            r = table[(table.variant == v) & (table.seed == s0) & (table.metric == f"{kind}_fit")].sort_values("x")
            if len(r):
                ax.plot(r.x, r.value, ls, color=COLORS[v], lw=1, label=f"{v}: {kind}")
    ax.set_yscale("log")
    _finish(plt_, fig, ax, "optimizer step within the fit", "whole-grid MSE (normalised units)",
            f"Least converged fit of each kind (seed {s0}): flat over its last 30 %?", plots_dir / "fit_loss.png")

    # fields side by side: the cells' frames.npz next to the plots folder (skipped when absent)
    frames = {}
    for v in variants:
        f = plots_dir.parent / v / f"seed{s0}" / "frames.npz"
        if f.exists():
            frames[v] = dict(np.load(f))
    if frames:
        plot_fields(frames, plots_dir / "fields.png")


def plot_fields(frames_by_variant: dict, png: Path) -> None:
    """Fields, reconstructions and errors side by side (rows: variants; columns: saved times)."""
    from ...plotting import plt

    plt_ = plt()
    vs = list(frames_by_variant)
    d0 = frames_by_variant[vs[0]]
    cols = len(d0["t"])
    fig, axes = plt_.subplots(1 + 2 * len(vs), cols, figsize=(2.2 * cols, 2.1 * (1 + 2 * len(vs))), squeeze=False)
    vmax = float(np.abs(d0["truth"]).max())
    for j in range(cols):
        axes[0, j].imshow(d0["truth"][j].T, origin="lower", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        axes[0, j].set_title(f"true w, t={d0['t'][j]:.2f}", fontsize=7)
    for r, v in enumerate(vs):
        d = frames_by_variant[v]
        for j in range(cols):
            axes[1 + 2 * r, j].imshow(d["recon"][j].T, origin="lower", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
            axes[1 + 2 * r, j].set_title(f"{v}", fontsize=7)
            axes[2 + 2 * r, j].imshow((d["recon"][j] - d["truth"][j]).T, origin="lower", cmap="RdBu_r",
                                      vmin=-0.2 * vmax, vmax=0.2 * vmax)
            axes[2 + 2 * r, j].set_title(f"{v} error (x5 scale)", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle("Vorticity (1/time): true, reconstructed, error; error colour range = 20% of the field's")
    save_figure(fig, png, dpi=90)
