"""ANTIC in miniature: in-situ compression of a running 2-D Kolmogorov flow.

Variants (all see the same trajectory per seed: the solver is deterministic):
  antic             adaptive selector + neural field with continual rank-r residual fine-tuning
  uniform_continual uniform selection at the adaptive selector's kept count, same spatial codec
  adaptive_scratch  adaptive selection, a fresh network per kept frame at ANTIC's bytes per kept frame
  zfp               zfpy on every frame, 2-D (classical lossy compressor, spatial only)
  zfp_kept          zfpy 2-D on the adaptive selector's kept frames, the same linear interpolation
  zfp_3d            zfpy's 3-D mode over (t, x, y) on every frame
  zfp_kept_3d       zfpy 3-D over the kept frames stacked in time, the same interpolation
                    (each zfp variant: a tolerance sweep fixed in advance, and its error at ANTIC's
                    stored bytes; ``zfp_codec.py``)

Stages: ``train_shared`` runs the solver once with the adaptive selector only (the kept count
K the uniform baseline and the scratch size need). ``train`` runs the solver again with the
variant's compressor as the ``record`` callback (single streaming pass), reconstructs every frame
(linear interpolation in time between kept reconstructions) and scores it. ``antic`` also runs
the same solver without the callback in the same job: the in-situ overhead as a wall-time ratio.

Units: vorticity in solver units (1/time); compression ratio = raw float32 bytes of all frames /
stored bytes; errors are relative L2 over all frames (and the enstrophy curve's relative L2).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .flow import enstrophy, make_flow, run_insitu
from .selection import AdaptiveSelector, UniformSelector, interpolate_frames
from reprozoo.figures import save_figure

VARIANT_ORDER = ["antic", "uniform_continual", "adaptive_scratch", "zfp", "zfp_kept", "zfp_3d", "zfp_kept_3d"]
COLORS = {"antic": "C0", "uniform_continual": "C1", "adaptive_scratch": "C2", "zfp": "C3", "zfp_kept": "C4",
          "zfp_3d": "C5", "zfp_kept_3d": "C6"}
GENERIC_CURVES: dict = {}  # plot() draws every figure
RAW_BYTES = 4  # float32 per grid value


def _adaptive(p):
    s = p["selector"]
    return AdaptiveSelector(int(p["flow"]["n_frames"]), s["tau_field"], s["tau_enstrophy"])


def train_shared(ctx) -> None:
    p = ctx.params
    solver, w_hat0, t_save = make_flow(p["flow"], ctx.seed)
    sel = _adaptive(p)
    kept = []
    wall, _ = run_insitu(solver, w_hat0, t_save, lambda i, w: kept.append(i) if sel.keep(i, w) else None)
    ctx.progress(f"reference pass: {len(kept)} of {len(t_save)} frames kept by the adaptive selector, {wall:.2f} s")
    (Path(ctx.outdir) / "selection.json").write_text(json.dumps({"kept": kept, "n_frames": len(t_save)}))
    ctx.metrics.scalar("n_kept", len(kept))


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _score(ctx, truth, recon, stored_bytes, n_keep, prefix=""):
    raw = truth.size * RAW_BYTES
    z_true, z_rec = enstrophy(truth), enstrophy(recon)
    ctx.metrics.scalar(prefix + "compression_ratio", raw / stored_bytes)
    ctx.metrics.scalar(prefix + "rel_l2", rel_l2(recon, truth))
    ctx.metrics.scalar(prefix + "enstrophy_err", rel_l2(z_rec, z_true))
    ctx.metrics.scalar(prefix + "bytes_per_kept_frame", stored_bytes / n_keep)
    return z_true, z_rec


def train(ctx) -> None:
    p = ctx.params
    shared = json.loads((Path(ctx.shared_dir) / "selection.json").read_text())
    K, N = len(shared["kept"]), int(shared["n_frames"])
    solver, w_hat0, t_save = make_flow(p["flow"], ctx.seed)
    n = int(p["flow"]["n"])
    truth = np.empty((N, n, n))
    if ctx.variant.startswith("zfp"):
        return _train_zfp(ctx, solver, w_hat0, t_save, truth, shared["kept"])

    import torch

    torch.set_num_threads(1)
    from .neural_codec import ContinualCodec, ScratchCodec, antic_bytes, scratch_width

    cfg = p["codec"]
    if ctx.variant == "adaptive_scratch":
        target = antic_bytes(cfg, K) // (2 * K) - 2  # parameters per kept frame at ANTIC's bytes per kept frame
        width = scratch_width(target, int(cfg["depth"]))
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
    recon = interpolate_frames(codec.kept_idx, codec.recon, N)
    z_true, z_rec = _score(ctx, truth, recon, codec.stored_bytes, len(codec.kept_idx))
    kept_err = float(np.mean([rel_l2(r, truth[i]) for i, r in zip(codec.kept_idx, codec.recon)]))
    ctx.metrics.scalar("kept_rel_l2", kept_err)
    ctx.metrics.scalar("n_kept", len(codec.kept_idx))
    ctx.metrics.curve("enstrophy_true", t_save, z_true)
    ctx.metrics.curve("enstrophy_rec", t_save, z_rec)
    ctx.metrics.curve("frame_rel_l2", t_save, [rel_l2(r, t) for r, t in zip(recon, truth)])
    ctx.metrics.curve("kept_frames", [t_save[i] for i in codec.kept_idx], codec.kept_idx)
    step = max(1, len(codec.losses) // 200)
    ctx.metrics.curve("fit_loss", range(0, len(codec.losses), step), codec.losses[::step])
    per_frame = codec.losses[-int(cfg["scratch_steps" if ctx.variant == "adaptive_scratch" else "delta_steps"]):]
    tail = max(2, len(per_frame) // 5)  # final slope of the last frame's loss: relative drop over its last fifth
    ctx.metrics.scalar("last_fit_loss_drop", float(1 - np.mean(per_frame[-tail // 2:]) / np.mean(per_frame[-tail:-tail // 2])))
    picks = sorted({0, N // 3, 2 * N // 3, N - 1})  # the same times for every variant (fields figure)
    np.savez_compressed(Path(ctx.outdir) / "frames.npz", t=t_save[picks], idx=np.array(picks),
                        truth=truth[picks].astype(np.float32), recon=recon[picks].astype(np.float32))


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


def _train_zfp(ctx, solver, w_hat0, t_save, truth, kept):
    """One zfp baseline (``zfp_codec.MODES``): its tolerance sweep and its error at ANTIC's bytes."""
    from .neural_codec import antic_bytes
    from .zfp_codec import encode, loglog_at, values_compressed

    p = ctx.params
    truth[:] = _trajectory(solver, w_hat0, t_save, (repr(sorted(p["flow"].items())), ctx.seed))
    scale = float(np.std(truth[0]))
    exps = [int(k) for k in p["zfp_log2_tolerances"]]
    raw = truth.size * RAW_BYTES
    sweep = [encode(truth, kept, ctx.variant, tolerance=2.0**k * scale) for k in exps]
    nbytes = [b for b, _ in sweep]
    errs = [rel_l2(rec, truth) for _, rec in sweep]
    ctx.metrics.curve("zfp_ratio_vs_tol", exps, [raw / b for b in nbytes])
    ctx.metrics.curve("zfp_err_vs_tol", exps, errs)
    # ANTIC's stored bytes, from its architecture and the adaptive selector's kept count (as its own run counts them)
    budget = antic_bytes(p["codec"], len(kept))
    ctx.metrics.scalar("antic_bytes", budget)
    # zfp's error at ANTIC's bytes: its sweep interpolated log-log; beyond the sweep, its most accurate point
    # (ANTIC's bytes above zfp's largest stream) or 1, the error of storing nothing (below zfp's smallest)
    err_acc = loglog_at(budget, nbytes, errs)
    if err_acc is None:
        err_acc = min(errs) if budget > max(nbytes) else 1.0
    ctx.metrics.scalar("err_at_antic_bytes", err_acc)
    ratio_target = loglog_at(float(p["target_rel_l2"]), errs, [raw / b for b in nbytes])
    if ratio_target is not None:
        ctx.metrics.scalar("ratio_at_target_err", ratio_target)
    # the scored reconstruction: the sweep's most accurate point within ANTIC's bytes (else its smallest)
    fits = [j for j, b in enumerate(nbytes) if b <= budget]
    stored, rec = sweep[min(fits, key=lambda j: errs[j])] if fits else sweep[int(np.argmin(nbytes))]
    z_true, z_rec = _score(ctx, truth, rec, stored, values_compressed(truth, kept, ctx.variant) // truth[0].size)
    ctx.metrics.curve("enstrophy_true", t_save, z_true)
    ctx.metrics.curve("enstrophy_rec", t_save, z_rec)
    ctx.metrics.curve("frame_rel_l2", t_save, [rel_l2(r, t) for r, t in zip(rec, truth)])
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

    # ratio vs error: NF variants as seed points with mean, zfp as its tolerance sweep per seed
    fig, ax = plt_.subplots(figsize=(5.5, 4))
    for v in variants:
        if v.startswith("zfp"):
            for s in sorted(set(table[table.variant == v].seed)):
                r = table[(table.variant == v) & (table.seed == s) & (table.metric == "zfp_ratio_vs_tol")].sort_values("x")
                e = table[(table.variant == v) & (table.seed == s) & (table.metric == "zfp_err_vs_tol")].sort_values("x")
                ax.plot(e.value.to_numpy(), r.value.to_numpy(), "-o", color=COLORS[v], ms=3, alpha=0.7,
                        label=f"{v} (tolerance sweep)" if s == min(table.seed) else None)
            e, r = vals("err_at_antic_bytes", v), vals("compression_ratio", "antic")
            if len(e) and len(e) == len(r):  # the claim's point: zfp's error at ANTIC's bytes
                ax.plot(e, r, "x", color=COLORS[v], ms=8, mew=2)
        else:
            e, r = vals("rel_l2", v), vals("compression_ratio", v)
            if len(e):
                ax.plot(e, r, "o", color=COLORS[v], alpha=0.5)
                ax.plot(e.mean(), r.mean(), "s", color=COLORS[v], ms=9, mec="k", label=v)
    tgt = float(params.get("target_rel_l2", 0.05))
    ax.axvline(tgt, color="gray", ls=":")
    ax.axhline(100, color="gray", ls=":")
    ax.set_xscale("log"), ax.set_yscale("log")
    _finish(plt_, fig, ax, "relative L2 error over all frames (-)", "compression ratio (raw float32 bytes / stored bytes)", "Bytes vs error (x: each zfp at ANTIC's bytes)", plots_dir / "ratio_vs_error.png")

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

    # fit loss curves (convergence)
    fig, ax = plt_.subplots(figsize=(6.5, 3.5))
    for v in variants:
        r = table[(table.variant == v) & (table.seed == s0) & (table.metric == "fit_loss")]
        if len(r):
            ax.plot(r.x, r.value, color=COLORS[v], lw=0.8, label=v)
    ax.set_yscale("log")
    _finish(plt_, fig, ax, "optimizer step (all kept frames, in stream order)", "training MSE (normalised units)", "Does each neural fit converge within its step budget?", plots_dir / "fit_loss.png")

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
