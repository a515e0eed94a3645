"""GeoPT in miniature: lifted vs static geometric pre-training vs scratch, fine-tuned on few flows.

Variants (same network, initial weights, fine-tune data, learning-rate grid, stopping rule, batch):
  lifted      backbone pre-trained on GeoPT's lifted targets (the authors' rule,
              ``geometry.lifted_targets``): a query point with a direction d and a step s walks
              T - 1 moves, each cut short at the surface by ray casting; the target is the vector
              from the nearest surface point to the walker at each of the T positions (2·T outputs);
  static_vec  the same backbone pre-trained on the static part of that target only: the
              nearest-surface vector at the query point itself (2 outputs, the lifted target's
              first block; no dynamics). The ablation that separates the lifting from the target type;
  static      (not in the smoke/paper spec since issue 27: 1 scalar output against the lifted
              model's 6, an unmatched baseline; ``static_vec`` replaces it) signed distance;
  scratch     random initial weights (the same ones every pre-training starts from).
All pre-trainings see the same unlabelled shapes and query points with the same rule.

One training rule for every fit (``fit``). At smoke and paper scale (``schedule: cosine``, since issue 26's
third round): Adam at a rate taken from one grid (``lrs``) after ``pilot_steps`` from the same start (ranked
by the mean of the second half of each pilot's validation curve; the pilots are the schedule's first
steps), annealed along half a cosine to ``lr_final`` (0.1: the convergence gate's floor) of that rate over
a fixed budget of ``max_steps``, with no early stop; validation reads the weight average (EMA) and keeps
its best state. The shared rule (``schedule: constant``, the default, kept for the tests and probes), that
of ``reprozoo.blocks.fitting.fit_to_plateau``:
Adam at a constant learning rate taken from one grid (``lrs``) after ``pilot_steps`` from the same
start (ranked by the mean of the second half of each pilot's validation curve), then training until
the validation curve of the weight average (EMA) is flat by the convergence gate's own test (a
Theil-Sen line through the last 30 % improving by at most ``flat_tol``), at or after ``min_steps``,
or to ``max_steps``; with ``lr_drop`` (0.1, the shared rule's default) the rate then drops
once to a tenth after that first plateau and the plateau is judged again on a window wholly after
the drop (a drop whose window would not fit below ``max_steps`` is not taken; ``drop_at``, for
probes only, forces the drop at a step). The rate never falls below a tenth of its value (the
gate's floor), so a flat curve is a plateau, not a schedule that ran out. Targets are divided by their root mean square over the fit's
training data.

Stages and units (lengths in units of the domain box [-1, 1]^2, velocities in units of U∞):
  train_shared (per seed): draw labelled shapes, solve potential flow with the source panel
    method (``panel.py``), store the perturbation velocity u − U∞ at query points; draw the
    unlabelled pre-training shapes with the three target sets.
  train (variant × seed): pre-train (lifted / static_vec; curve ``pretrain_val``: held-out
    relative L2 of the pre-training target), then for each N in ``n_labels`` fine-tune a copy on
    the first N labelled shapes (validation curve ``val_rel_l2_n{N}`` on the validation shapes) and
    score the test shapes:
        err_n{N}  = ‖û − u‖₂ / ‖u‖₂ pooled over all test shapes and points (u = u − U∞),
        err2_n{N} = per test shape (units, same shapes for every variant of a seed)
                    ‖û_i − u_i‖² / mean_j ‖u_j‖²,  so that sqrt(mean_i err2) = err_n{N};
        steps_to_target_n{N}: first fine-tune step whose validation error is <= ``target_error``
                    (not reached: censored at twice ``max_steps``; ``reached_target_n{N}`` 0/1).
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
PRETRAIN_KEY = {"lifted": "y_lifted", "static_vec": "y_static_vec", "static": "y_static"}
VARIANTS = ("scratch", "static", "static_vec", "lifted")


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
    """Unlabelled shapes with the three pre-training targets of the same query points and walks."""
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
    y_lift = np.array(y_lift)
    return {"bnd": np.array(bnd), "q": np.array(q), "cond": np.array(cond),
            "y_lifted": y_lift, "y_static_vec": y_lift[..., :2].copy(), "y_static": np.array(y_sdf)}


def train_shared(ctx) -> None:
    p = ctx.params
    n_train = max(p["n_labels"])
    flows = make_flow_set(ctx.rng(1), n_train + p["n_val"] + p["n_test"], p["panels"], p["queries"], p["cond_step"])
    np.savez(ctx.shared_dir / "flows.npz", **flows)
    pt = p["pretrain"]
    pre = make_pretrain_set(ctx.rng(2), pt["shapes"] + pt["val_shapes"], p["panels"], pt["queries"],
                            p["walk_steps"], p["step_range"])
    np.savez(ctx.shared_dir / "pretrain.npz", **pre)


# --- training --------------------------------------------------------------------------------

def _tensors(d: dict, idx, ykey: str, points: int | None = None, device: str = "cpu"):
    import torch

    sl = slice(None) if points is None else slice(0, points)
    return [torch.as_tensor(d[k][idx][:, sl], dtype=torch.float32, device=device) for k in ("bnd", "q", "cond", ykey)]


def pooled_rel_l2(pred, y) -> float:
    """‖pred − y‖ / ‖y‖ over all shapes, points and components of a split.

    The evaluation metric. The per-shape mean is dominated by the few shapes that barely disturb
    the flow (a thin airfoil aligned with U∞ has ‖u − U∞‖ ≈ 0), where any error divides by almost
    nothing; pooling weighs every point's velocity error equally."""
    import torch

    return float(torch.linalg.vector_norm(pred - y) / torch.linalg.vector_norm(y))


def predict(model, bnd, q, cond, chunk: int = 64):
    """Model output in target units (the fit's scale ``model.y_scale`` undone), in shape chunks."""
    import torch

    with torch.no_grad():
        out = [model(bnd[i:i + chunk], q[i:i + chunk], cond[i:i + chunk]) for i in range(0, len(bnd), chunk)]
    return torch.cat(out) * getattr(model, "y_scale", 1.0)


def evaluate(model, split) -> float:
    bnd, q, cond, y = split
    return pooled_rel_l2(predict(model, bnd, q, cond), y)


def per_shape_sq_error(model, split) -> np.ndarray:
    """Units: ‖û_i − u_i‖² / mean_j ‖u_j‖² per shape i (their mean is the pooled rel L2 squared)."""
    bnd, q, cond, y = split
    e = (predict(model, bnd, q, cond) - y).flatten(1).pow(2).sum(1)
    return (e / y.flatten(1).pow(2).sum(1).mean()).cpu().numpy()


def _flat(steps, vals, min_points: int, flat_tol: float, tail: float = 0.3) -> bool:
    """The platform's convergence test, :func:`reprozoo.claims.plateau`: a Theil-Sen line through
    the last ``tail`` of the curve (>= ``min_points`` evaluations there) improves by at most
    ``flat_tol`` of its median level. The same test as ``reprozoo.blocks.fitting.fit_to_plateau``."""
    from ...claims import plateau

    return plateau(np.asarray(steps, float), np.asarray(vals, float), flat_tol, tail=tail, min_points=min_points)


def schedule_factor(step: int, total: int, final: float) -> float:
    """The cosine schedule's rate at optimiser step ``step`` (0-based) of ``total``, as a fraction of
    the peak: 1 at the first step, falling along half a cosine to ``final`` at step ``total`` (the
    last step, ``total - 1``, runs a hair above it). With ``final`` = 0.1, the convergence gate's floor
    (``claims.LR_FLOOR``), the gate's learning-rate check still reads the tail's rate as up."""
    import math

    t = min(max(step, 0), total) / max(total, 1)
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * t))


class _Run:
    """One Adam run at a learning rate that stays constant (until the rule's single drop) or follows
    the cosine schedule (``schedule: cosine``), with a weight average (EMA) that validation reads and
    whose best-validation state is kept."""

    def __init__(self, model, data, lr: float, cfg: dict, generator):
        import torch

        self.model, self.data, self.lr, self.cfg, self.g = model, data, lr, cfg, generator
        self.ema = copy.deepcopy(model)
        for t in self.ema.parameters():
            t.requires_grad_(False)
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
        self.params = [t for t in model.parameters()]
        self.ema_params = [t for t in self.ema.parameters()]
        self.step, self.best, self.best_state = 0, float("inf"), None
        self.hist = {"step": [], "val": [], "lr": []}

    def current_lr(self) -> float:
        return float(self.opt.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def advance(self, until: int, val, stop_from: int | None = None) -> bool:
        """Train to step ``until``; from ``stop_from`` on, stop (True) once the curve is flat. With
        ``schedule: cosine`` every step's rate is ``lr · schedule_factor(step, max_steps, lr_final)``."""
        import torch

        bnd, q, cond, y = self.data
        cfg = self.cfg
        n, m_all = q.shape[0], q.shape[1]
        nb, npts = min(cfg["batch"], n), min(cfg["points"], m_all)
        cosine = cfg.get("schedule", "constant") == "cosine"
        while self.step < until:
            if cosine:
                self.set_lr(self.lr * schedule_factor(self.step, int(cfg["max_steps"]), float(cfg["lr_final"])))
            self.step += 1
            b = torch.randint(n, (nb,), generator=self.g).to(q.device)
            pts = torch.rand(nb, m_all, generator=self.g).argsort(1)[:, :npts].to(q.device)
            take = lambda t: torch.gather(t[b], 1, pts[..., None].expand(-1, -1, t.shape[-1]))
            loss = ((self.model(bnd[b], take(q), take(cond)) - take(y)) ** 2).mean()
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, cfg.get("clip", 1.0), foreach=True)
            self.opt.step()
            with torch.no_grad():
                decay = min(cfg["ema_decay"], (1 + self.step) / (10 + self.step))
                torch._foreach_lerp_(self.ema_params, self.params, 1 - decay)
            if self.step % cfg["eval_every"] == 0 or self.step == until:
                self.ema.y_scale = self.model.y_scale
                v = evaluate(self.ema, val)
                self.hist["step"].append(self.step)
                self.hist["val"].append(v)
                self.hist["lr"].append(self.current_lr())
                if v < self.best:
                    self.best, self.best_state = v, copy.deepcopy(self.ema.state_dict())
                if stop_from is not None and self.step >= stop_from and _flat(
                        self.hist["step"], self.hist["val"], 5, cfg["flat_tol"]):
                    return True
        return False

    def pilot_score(self) -> float:
        """The shared rule's pilot ranking (``pilot_score: tail``): the mean of the second half of the
        pilot's validation points, so a noisy rate's lucky minimum does not win the grid."""
        vals = self.hist["val"]
        return float(np.mean(vals[len(vals) // 2:]))


def fit(model, data: dict, idx: np.ndarray, ykey: str, cfg: dict, seed: int, val):
    """The one training rule of every fit (module docstring). ``model`` is the start (not
    modified); every one of its parameters is trained (fine-tuning trains the whole backbone, not
    only the head); returns the EMA model with the best validation value and its history (curves
    step / val / lr, lr_chosen, lr_pilot, stop_step, plateau, best_val, drop_step, drop_gain).

    The shared rule (``reprozoo.blocks.fitting.fit_to_plateau``): every rate of the grid is piloted
    from the same start and ranked by the second half of its pilot curve; the chosen rate trains at
    a constant rate to its first plateau, then drops once by ``lr_drop`` (the convergence gate's
    floor, a tenth) and trains on until the plateau test holds on a window wholly after the drop, or
    to ``max_steps`` (a drop whose judging window would not fit below ``max_steps`` is not taken: the
    constant-rate plateau stands). One addition (``drop_at``): the drop also comes at step ``drop_at`` when the
    constant-rate curve has not flattened by then (the constant rate's slow drift towards its noise
    floor, README); without the key the drop waits for the first plateau, as in the shared rule.

    ``schedule: cosine`` (smoke and paper; a prototype of the option the shared rule lacks): the same
    pilots, run along the schedule's first steps, then the chosen run continues along the schedule
    (``schedule_factor``: the chosen rate annealed to ``lr_final`` of it at ``max_steps``) to
    ``max_steps``, with no early stop and no drop; ``plateau`` records the gate's test at the end. The
    budget ``max_steps`` is fixed by the config's written rule, and ``reprozoo converge`` doubles it."""
    import math

    import torch

    train = _tensors(data, idx, ykey, device=cfg.get("device", "cpu"))
    y_scale = float(train[3].pow(2).mean().sqrt())
    train[3] = train[3] / y_scale
    schedule = cfg.get("schedule", "constant")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"fit.schedule '{schedule}': expected constant or cosine")
    if schedule == "cosine" and not 0.1 <= float(cfg.get("lr_final", -1)) < 1:
        raise ValueError(f"fit.lr_final {cfg.get('lr_final')}: the cosine schedule needs a final fraction in "
                         f"[0.1, 1) (0.1: the convergence gate's floor)")
    runs = []
    for lr in cfg["lrs"]:
        m = copy.deepcopy(model).requires_grad_(True)   # every parameter trains (a start that a
        m.y_scale = y_scale                              # previous fit returned is its frozen EMA)
        run = _Run(m, train, float(lr), cfg, torch.Generator().manual_seed(seed))
        run.advance(cfg["pilot_steps"], val)
        runs.append(run)
    pilot = {r.lr: r.pilot_score() for r in runs}
    run = min(runs, key=lambda r: pilot[r.lr])
    top = int(cfg["max_steps"])
    if schedule == "cosine":
        # a fixed budget: the chosen pilot runs on along the same schedule to max_steps, no early stop
        # and no drop (the schedule is the anneal); ``plateau`` records the gate's test at the end
        run.advance(top, val)
        return _finish(run, pilot, y_scale, _flat(run.hist["step"], run.hist["val"], 5, cfg["flat_tol"]), None, None)
    factor = float(cfg.get("lr_drop") or 0.0)
    first = min(top, int(cfg.get("drop_at") or top))
    plateau = run.advance(first, val, stop_from=cfg["min_steps"])
    drop_step, drop_gain = None, None
    # the plateau test reads the last 30 % of the curve: after a drop, stop only once that window
    # lies wholly after it, so a flat pre-drop stretch cannot vouch for the dropped rate; a drop that
    # the step limit leaves no room to judge is not taken (the constant-rate plateau stands)
    after = max(run.step + 5 * int(cfg["eval_every"]), math.ceil(run.step / 0.7))
    if factor and after <= top and (plateau or run.step >= first):
        drop_step, before = run.step, run.best
        run.set_lr(run.lr * factor)
        plateau = run.advance(top, val, stop_from=after)
        drop_gain = float((before - run.best) / before)
    elif not plateau:
        plateau = run.advance(top, val, stop_from=cfg["min_steps"])
    plateau = plateau or _flat(run.hist["step"], run.hist["val"], 5, cfg["flat_tol"])
    return _finish(run, pilot, y_scale, plateau, drop_step, drop_gain)


def _finish(run, pilot: dict, y_scale: float, plateau: bool, drop_step, drop_gain):
    """The chosen run's best-validation weight average (trainable, with its target scale) and the fit's
    record, the same for both schedules."""
    run.ema.load_state_dict(run.best_state)
    run.ema.requires_grad_(True)
    run.ema.y_scale = y_scale
    hist = dict(run.hist, lr_chosen=run.lr, lr_pilot=pilot, stop_step=run.step, plateau=bool(plateau),
                best_val=run.best, drop_step=drop_step, drop_gain=drop_gain)
    return run.ema, hist


def steps_to(hist: dict, target: float, censor: int) -> tuple[int, bool]:
    """First recorded step whose validation value is <= ``target``, else ``censor``."""
    for s, v in zip(hist["step"], hist["val"]):
        if v <= target:
            return int(s), True
    return int(censor), False


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
    val = _tensors(flows, val_idx, "y", p["val_points"], dev)
    test = _tensors(flows, test_idx, "y", device=dev)
    model = GeometrySimulator(**p["network"], out_dim=2, seed=ctx.seed)   # the same start for every variant

    if ctx.variant in PRETRAIN_KEY:
        pt = p["pretrain"]
        pre = dict(np.load(ctx.shared_dir / "pretrain.npz"))
        key = PRETRAIN_KEY[ctx.variant]
        model.new_head(pre[key].shape[-1], ctx.seed)
        held = np.arange(pt["shapes"], pt["shapes"] + pt["val_shapes"])
        model, hist = fit(model.to(dev), pre, np.arange(pt["shapes"]), key, {**pt, "device": dev}, ctx.seed + 7,
                          _tensors(pre, held, key, p["val_points"], dev))
        ctx.metrics.curve("pretrain_val", hist["step"], hist["val"])
        ctx.metrics.curve("pretrain_lr", hist["step"], hist["lr"])
        ctx.metrics.scalar("pretrain_rel_l2", hist["best_val"])
        ctx.metrics.scalar("pretrain_lr_chosen", hist["lr_chosen"])
        ctx.metrics.scalar("pretrain_stop_step", hist["stop_step"])
        ctx.progress(f"pre-trained ({ctx.variant}): held-out rel L2 {hist['best_val']:.4f}, "
                     f"lr {hist['lr_chosen']:g}, {hist['stop_step']} steps, plateau {hist['plateau']}")

    ft = p["finetune"]
    for n in p["n_labels"]:
        m = copy.deepcopy(model)
        m.new_head(2, ctx.seed + 1)                 # the same fresh head for every variant
        m, hist = fit(m.to(dev), flows, np.arange(n), "y", {**ft, "device": dev}, ctx.seed + 2, val)
        ctx.metrics.curve(f"val_rel_l2_n{n}", hist["step"], hist["val"])
        ctx.metrics.curve(f"lr_n{n}", hist["step"], hist["lr"])
        ctx.metrics.units(f"err2_n{n}", per_shape_sq_error(m, test))
        ctx.metrics.scalar(f"err_n{n}", np.sqrt(ctx.metrics.scalars[f"err2_n{n}"]))
        ctx.metrics.scalar(f"val_best_n{n}", hist["best_val"])
        ctx.metrics.scalar(f"lr_chosen_n{n}", hist["lr_chosen"])
        ctx.metrics.scalar(f"stop_step_n{n}", hist["stop_step"])
        reach, ok = steps_to(hist, p["target_error"], 2 * ft["max_steps"])
        ctx.metrics.scalar(f"steps_to_target_n{n}", reach)
        ctx.metrics.scalar(f"reached_target_n{n}", float(ok))
        ctx.progress(f"N={n}: test rel L2 {ctx.metrics.scalars[f'err_n{n}']:.4f}, lr {hist['lr_chosen']:g}, "
                     f"{hist['stop_step']} steps, plateau {hist['plateau']}")
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
    dev = next(model.parameters()).device
    pred = predict(model, *(torch.as_tensor(a[None], dtype=torch.float32, device=dev)
                            for a in (flows["bnd"][i], x, cond)))[0].cpu().numpy()
    np.savez(ctx.outdir / "field.npz", poly=poly, x=x, mask=mask, truth=truth, pred=pred)


# --- plots -----------------------------------------------------------------------------------

def plot(table, plots_dir: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    colors = {"scratch": "tab:gray", "static": "tab:blue", "static_vec": "tab:green", "lifted": "tab:red"}
    variants = [v for v in VARIANTS if v in set(table["variant"])]

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
        fig.suptitle("Does pre-training speed up fine-tuning convergence? (EMA weights, cosine-annealed lr)")
        save_figure(fig, plots_dir / "validation_curves.png", dpi=120)

    # pre-training curves: does each pre-training reach a plateau on its own target?
    pre = [v for v in variants if not table[(table.variant == v) & (table.metric == "pretrain_val")].empty]
    if pre:
        fig, ax = plt.subplots(figsize=(5, 4))
        for v in pre:
            for s, t in table[(table.variant == v) & (table.metric == "pretrain_val")].groupby("seed"):
                t = t.sort_values("x")
                ax.plot(t.x, t.value, color=colors[v], alpha=0.8, label=v if s == min(table.seed) else None)
        ax.set_yscale("log")
        ax.set_xlabel("pre-training step")
        ax.set_ylabel("held-out relative L2 of the pre-training target (–)")
        ax.set_title("Does each pre-training reach a plateau?")
        ax.legend()
        save_figure(fig, plots_dir / "pretrain_curves.png", dpi=120)

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
