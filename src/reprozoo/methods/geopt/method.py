"""GeoPT in miniature: lifted vs static geometric pre-training vs scratch, fine-tuned on few flows.

Variants (same network, same fine-tune data, steps, optimiser and learning rate):
  scratch  random initial weights;
  static   backbone pre-trained to regress the signed distance of random query points
           (geometry only, "static-geometry supervision");
  lifted   backbone pre-trained on GeoPT's lifted targets: query points walk T steps of length
           s along a direction d, stopped at the surface by ray casting; the target at each
           step is the vector to the nearest surface point (``geometry.lifted_targets``).
Both pre-trainings see the same unlabelled shapes for the same number of steps.

Stages and units (lengths in units of the domain box [-1, 1]^2, velocities in units of U∞):
  train_shared (per seed): draw labelled shapes, solve potential flow with the source panel
    method (``panel.py``), store the perturbation velocity u − U∞ at query points; draw the
    unlabelled pre-training shapes with both target sets.
  train (variant × seed): pre-train (static / lifted), then for each N in ``n_labels``
    fine-tune a copy on the first N labelled shapes for ``finetune.steps`` steps, recording the
    validation relative L2 curve and the test relative L2, pooled over the split's shapes
        rel L2 = ‖û − u‖₂ / ‖u‖₂   (u: perturbation velocity u − U∞ at all query points).
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from .geometry import lifted_targets, outward_normals, random_shape, sample_outside, sdf
from .panel import flow_velocity, solve_source_panels
from reprozoo.figures import save_figure

GENERIC_CURVES: dict = {}
U_INF = np.array([1.0, 0.0])


def _boundary_features(poly: np.ndarray) -> np.ndarray:
    """Vertex positions with the outward normal averaged from the two adjacent panels."""
    n = outward_normals(poly)
    nv = n + np.roll(n, 1, axis=0)
    return np.concatenate([poly, nv / np.linalg.norm(nv, axis=1, keepdims=True)], 1)


def make_flow_set(rng, n_shapes: int, k: int, m: int, step: float, margin: float = 0.03):
    """Labelled flows. Query points keep ``margin`` from the wall: the non-lifting flow is singular
    at a sharp trailing edge, and a handful of points there would dominate every error."""
    bnd, q, cond, y = [], [], [], []
    for _ in range(n_shapes):
        poly = random_shape(rng, k)
        sigma = solve_source_panels(poly, U_INF)
        x = sample_outside(poly, rng, m, margin=margin)
        bnd.append(_boundary_features(poly))
        q.append(x)
        cond.append(np.tile([*U_INF, step], (m, 1)))
        y.append(flow_velocity(poly, sigma, U_INF, x) - U_INF)
    return {"bnd": np.array(bnd), "q": np.array(q), "cond": np.array(cond), "y": np.array(y)}


def make_pretrain_set(rng, n_shapes: int, k: int, m: int, walk_steps: int, step_range):
    bnd, q, cond, y_lift, y_sdf = [], [], [], [], []
    for _ in range(n_shapes):
        poly = random_shape(rng, k)
        x = sample_outside(poly, rng, m)
        ang = rng.uniform(0, 2 * np.pi, m)
        d = np.stack([np.cos(ang), np.sin(ang)], 1)
        s = rng.uniform(*step_range, m)
        bnd.append(_boundary_features(poly))
        q.append(x)
        cond.append(np.concatenate([d, s[:, None]], 1))
        y_lift.append(lifted_targets(poly, x, d, s, walk_steps))
        y_sdf.append(sdf(poly, x)[:, None])
    return {"bnd": np.array(bnd), "q": np.array(q), "cond": np.array(cond),
            "y_lifted": np.array(y_lift), "y_static": np.array(y_sdf)}


def train_shared(ctx) -> None:
    p = ctx.params
    rng = ctx.rng(1)
    n_train = max(p["n_labels"])
    flows = make_flow_set(rng, n_train + p["n_val"] + p["n_test"], p["panels"], p["queries"], p["cond_step"])
    np.savez(ctx.shared_dir / "flows.npz", **flows)
    pre = make_pretrain_set(ctx.rng(2), p["pretrain"]["shapes"], p["panels"], p["queries"],
                            p["walk_steps"], p["step_range"])
    np.savez(ctx.shared_dir / "pretrain.npz", **pre)


# --- training --------------------------------------------------------------------------------

def _tensors(d: dict, idx, ykey: str, device: str = "cpu"):
    import torch

    return [torch.as_tensor(d[k][idx], dtype=torch.float32, device=device) for k in ("bnd", "q", "cond", ykey)]


def rel_l2(pred, y):
    """Mean over shapes of ‖pred − y‖ / ‖y‖ over the shape's query points and components."""
    import torch

    num = torch.linalg.vector_norm((pred - y).flatten(1), dim=1)
    return (num / torch.linalg.vector_norm(y.flatten(1), dim=1)).mean()


def pooled_rel_l2(pred, y) -> float:
    """‖pred − y‖ / ‖y‖ over all shapes, points and components of a split.

    The evaluation metric. The per-shape mean (``rel_l2``) is dominated by the few shapes that
    barely disturb the flow (a thin airfoil aligned with U∞ has ‖u − U∞‖ ≈ 0), where any
    error divides by almost nothing; pooling weighs every point's velocity error equally."""
    import torch

    return float(torch.linalg.vector_norm(pred - y) / torch.linalg.vector_norm(y))


def fit(model, data: dict, idx: np.ndarray, ykey: str, steps: int, cfg: dict, seed: int,
        val=None, eval_every: int = 0, loss: str = "mse"):
    """AdamW with warm-up and cosine decay on random minibatches of shapes (all their query points).

    Returns the validation curve [(step, rel L2)] if ``val`` is given. Same routine, batch,
    learning rate and schedule for every variant and every stage."""
    import torch

    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg.get("weight_decay", 0.0))
    warm = max(1, steps // 10)                  # linear warm-up over 10 %, then cosine decay
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: min(1.0, (k + 1) / warm) * 0.5 * (1 + np.cos(np.pi * min(k, steps) / steps)))
    bnd, q, cond, y = _tensors(data, idx, ykey, cfg.get("device", "cpu"))
    curve = []
    for step in range(1, steps + 1):
        b = torch.randint(len(idx), (min(cfg["batch"], len(idx)),), generator=g).to(bnd.device)
        pred = model(bnd[b], q[b], cond[b])
        lval = rel_l2(pred, y[b]) if loss == "rel_l2" else ((pred - y[b]) ** 2).mean()
        opt.zero_grad()
        lval.backward()
        opt.step()
        sched.step()
        if val is not None and (step % eval_every == 0 or step == steps):
            curve.append((step, evaluate(model, val)))
    return curve


def evaluate(model, split) -> float:
    import torch

    bnd, q, cond, y = split
    with torch.no_grad():
        return pooled_rel_l2(model(bnd, q, cond), y)


def train(ctx) -> None:
    import torch

    from .model import GeometrySimulator

    p = ctx.params
    torch.manual_seed(ctx.seed)
    flows = dict(np.load(ctx.shared_dir / "flows.npz"))
    n_max = max(p["n_labels"])
    val_idx = np.arange(n_max, n_max + p["n_val"])
    test_idx = np.arange(n_max + p["n_val"], n_max + p["n_val"] + p["n_test"])
    dev = p.get("device", "cpu")
    val, test = _tensors(flows, val_idx, "y", dev), _tensors(flows, test_idx, "y", dev)
    model = GeometrySimulator(**p["network"], out_dim=2, seed=ctx.seed).to(dev)

    if ctx.variant in ("static", "lifted"):
        pre = dict(np.load(ctx.shared_dir / "pretrain.npz"))
        out_dim = pre[f"y_{ctx.variant}"].shape[-1]
        model.new_head(out_dim, ctx.seed)
        model.to(dev)
        fit(model, pre, np.arange(len(pre["q"])), f"y_{ctx.variant}", p["pretrain"]["steps"],
            {**p["pretrain"], "device": dev}, ctx.seed)
        held = _tensors(pre, np.arange(min(16, len(pre["q"]))), f"y_{ctx.variant}", dev)
        ctx.metrics.scalar("pretrain_rel_l2", evaluate(model, held))
    ctx.progress(f"backbone ready ({ctx.variant})")

    ft = p["finetune"]
    for n in p["n_labels"]:
        m = copy.deepcopy(model)
        m.new_head(2, ctx.seed + 1)                 # same fresh head for every variant
        m.to(dev)
        curve = fit(m, flows, np.arange(n), "y", ft["steps"], {**ft, "device": dev}, ctx.seed + 2, val=val,
                    eval_every=ft["eval_every"], loss=ft.get("loss", "mse"))
        xs, ys = zip(*curve)
        ctx.metrics.curve(f"val_rel_l2_n{n}", xs, ys)
        ctx.metrics.scalar(f"err_n{n}", evaluate(m, test))
        half = [v for s, v in curve if s <= ft["steps"] // 2]
        ctx.metrics.scalar(f"val_half_n{n}", half[-1])
        ctx.metrics.scalar(f"val_final_n{n}", ys[-1])
        # slope of log10(val error) per 10 % of the budget over the last 20 %: flat means trained
        tail = np.array(ys[-max(2, len(ys) // 5):])
        ctx.metrics.scalar(f"val_tail_slope_n{n}",
                           float(np.log10(tail[-1] / tail[0]) / max(len(tail) - 1, 1) * len(ys) / 10))
        ctx.progress(f"N={n}: test rel L2 {ctx.metrics.scalars[f'err_n{n}']:.4f}")
        if n == p["field_plot_n"] and ctx.seed == 0:
            _save_field(ctx, m, flows, test_idx[0])
    ctx.metrics.curve("err_vs_labels", p["n_labels"], [ctx.metrics.scalars[f"err_n{n}"] for n in p["n_labels"]])


def _save_field(ctx, model, flows, i: int) -> None:
    """Prediction on a regular grid around one test shape, with the panel-method truth."""
    import torch

    from .geometry import inside
    from .panel import flow_velocity, solve_source_panels

    poly = flows["bnd"][i][:, :2]
    g = np.linspace(-1, 1, 61)
    xx, yy = np.meshgrid(g, g)
    x = np.stack([xx.ravel(), yy.ravel()], 1)
    mask = inside(poly, x)
    truth = flow_velocity(poly, solve_source_panels(poly, U_INF), U_INF, x) - U_INF
    cond = np.tile(flows["cond"][i][:1], (len(x), 1))
    with torch.no_grad():
        dev = next(model.parameters()).device
        pred = model(*(torch.as_tensor(a[None], dtype=torch.float32, device=dev)
                       for a in (flows["bnd"][i], x, cond)))[0].cpu().numpy()
    np.savez(ctx.outdir / "field.npz", poly=poly, x=x, mask=mask, truth=truth, pred=pred)


# --- plots -----------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    colors = {"scratch": "tab:gray", "static": "tab:blue", "lifted": "tab:red"}
    variants = [v for v in ("scratch", "static", "lifted") if v in set(table["variant"])]

    # error vs number of labels, seed bands
    fig, ax = plt.subplots(figsize=(5, 4))
    for v in variants:
        t = table[(table.variant == v) & (table.metric == "err_vs_labels")]
        if t.empty:
            continue
        g = t.groupby("x")["value"]
        mu, lo, hi = g.mean(), g.min(), g.max()
        ax.plot(mu.index, mu.values, "o-", color=colors[v], label=v)
        ax.fill_between(mu.index, lo.values, hi.values, color=colors[v], alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("labelled simulations N (shapes)")
    ax.set_ylabel("test relative L2 of u − U∞ (–)")
    ax.set_title("How many labels does each pre-training save?")
    ax.legend(title="band: seed min–max")
    save_figure(fig, plots_dir / "error_vs_labels.png", dpi=120)

    # validation curves, one panel per N
    ns = sorted({int(m[len("val_rel_l2_n"):]) for m in set(table.metric) if m.startswith("val_rel_l2_n")})
    if ns:
        fig, axes = plt.subplots(1, len(ns), figsize=(3.2 * len(ns), 3.2), sharey=True, squeeze=False)
        for ax, n in zip(axes[0], ns):
            for v in variants:
                t = table[(table.variant == v) & (table.metric == f"val_rel_l2_n{n}")]
                if t.empty:
                    continue
                g = t.groupby("x")["value"]
                ax.plot(g.mean().index, g.mean().values, color=colors[v], label=v)
                ax.fill_between(g.mean().index, g.min().values, g.max().values, color=colors[v], alpha=0.2)
            ax.set_yscale("log")
            ax.set_title(f"N = {n}")
            ax.set_xlabel("fine-tune step")
        axes[0][0].set_ylabel("validation relative L2 (–)")
        axes[0][0].legend()
        fig.suptitle("Does pre-training speed up fine-tuning convergence?")
        save_figure(fig, plots_dir / "validation_curves.png", dpi=120)

    _plot_fields(plots_dir, variants, colors)


def _plot_fields(plots_dir: Path, variants, colors) -> None:
    """Speed |u − U∞| of prediction, truth and error for the seed-0 test shape of each variant."""
    import matplotlib.pyplot as plt

    root = plots_dir.parent
    files = {v: root / v / "seed0" / "field.npz" for v in variants}
    files = {v: f for v, f in files.items() if f.exists()}
    if not files:
        return
    fig, axes = plt.subplots(len(files), 3, figsize=(10, 3.2 * len(files)), squeeze=False)
    for row, (v, f) in zip(axes, files.items()):
        d = np.load(f)
        n = int(np.sqrt(len(d["x"])))
        speed = lambda u: np.where(d["mask"], np.nan, np.linalg.norm(u, axis=1)).reshape(n, n)
        truth, pred = speed(d["truth"]), speed(d["pred"])
        err = np.where(d["mask"], np.nan, np.linalg.norm(d["pred"] - d["truth"], axis=1)).reshape(n, n)
        vmax = np.nanpercentile(truth, 99)
        for ax, img, title, vm in zip(row, (pred, truth, err), (f"{v}: prediction", "panel method", "|error|"),
                                      (vmax, vmax, vmax / 2)):
            im = ax.imshow(img, origin="lower", extent=(-1, 1, -1, 1), vmin=0, vmax=vm, cmap="viridis")
            ax.fill(*d["poly"].T, color="w", ec="k")
            ax.set_title(title)
            ax.set_xlabel("x (box units)")
            fig.colorbar(im, ax=ax, label="|u − U∞| / U∞")
        row[0].set_ylabel("y (box units)")
    fig.suptitle("Does the fine-tuned model reproduce the potential flow around one test shape?")
    save_figure(fig, plots_dir / "fields.png", dpi=110)
