"""Deep PINNs with spectrally regulated coupling layers, in miniature: a depth sweep.

Variants (the trunk architecture, networks.py; same lifting, head, width, depths, collocation
points, optimiser, learning-rate grid, stopping rule and float32 precision for all):
- ``coupling`` (method): additive coupling blocks with spectrally normalised coupling functions,
  each block's Jacobian has singular values in [1/rho(c), rho(c)];
- ``mlp`` (baseline): the plain tanh MLP PINN (DeepXDE conventions: Glorot normal, tanh);
- ``resnet`` (baseline): the residual tanh MLP PINN (identity skips).

One cell (variant x seed) trains that trunk at every depth L of ``depths`` on every PDE of
``pdes`` (pdes.py). For each (pde, L) one training rule (``fit``), the same for every trunk:

- the members of the trunk (one per rate of ``lr_grid``, all from the seed's same initial weights)
  train side by side with Adam at their own *constant* rate on the mean squared residual at the
  seed's collocation points;
- every ``eval_every`` steps each member's relative L2 error on ``n_val`` held-out validation points
  (random in the domain, drawn apart from the collocation points and the test grid) is recorded, and
  each member keeps the weights of its best validation error so far;
- the *selected* rate is the member with the lowest best validation error; training stops once, after
  ``min_steps``, the selected member's validation curve is flat by the platform's own plateau test
  (``reprozoo.claims.plateau`` with ``flat_tol``, half the convergence gate's 2 %), or at
  ``max_steps``; there, if the best rate is still improving, the selection falls back to the best
  rate whose curve is flat (the rate chosen on validation among the runs that converged; none
  flat: the best rate, and the gate reports it). The selected member's best-validation weights are
  scored on the test grid.

Recorded for each (pde, L) (tag ``<pde>_L<L>``):
- ``err_<tag>``: test relative L2 error ||u - u_ref|| / ||u_ref|| on the evaluation grid;
- ``lr_<tag>`` (the selected rate), ``steps_<tag>``, ``flat_<tag>`` (1 if the selected curve is flat),
  ``fallback_<tag>`` (1 if the budget ran out and a converged rate other than the best was taken),
  ``valerr_lr<i>_<tag>`` (each rate's best validation error: the grid's whole picture);
- ``band_du_init_<tag>``, ``band_d2u_init_...``, ``band_du_trained_...``, ``band_d2u_trained_...``:
  decades spanned by the per-layer derivative norms (differential_profile.py);
- curves ``valerr_<tag>`` (the selected member's validation error vs step: the convergence gate's
  curve), ``lrcurve_<tag>`` (its rate vs step), ``loss_<tag>`` (its mean squared residual),
  ``prof_du_{init,trained}_<tag>`` / ``prof_d2u_...`` (norm vs layer index), ``field_<tag>``
  (prediction on the evaluation grid) and ``ref_<pde>``.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

GENERIC_CURVES: dict = {}  # plot() draws every figure


class MemberAdam:
    """Adam (Kingma & Ba 2015, torch's defaults) for parameters whose leading axis is the member:
    member k moves with its own learning rate lrs[k]; otherwise the textbook update
    m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2,  p <- p - lr_k (m / c1) / (sqrt(v / c2) + eps)
    with c_i = 1 - b_i^t (tests: equal to torch.optim.Adam run member by member)."""

    def __init__(self, params, lrs, betas=(0.9, 0.999), eps=1e-8):
        import torch

        self.params = [p for p in params if p.requires_grad]
        self.lrs = torch.as_tensor(lrs, dtype=self.params[0].dtype)
        self.b1, self.b2, self.eps, self.t = float(betas[0]), float(betas[1]), float(eps), 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.lr_of = [self.lrs.view(-1, *([1] * (p.dim() - 1))) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        import torch

        self.t += 1
        c1, c2 = 1.0 - self.b1 ** self.t, 1.0 - self.b2 ** self.t
        with torch.no_grad():  # as a handful of fused multi-tensor ops
            grads = [p.grad for p in self.params]
            torch._foreach_lerp_(self.m, grads, 1.0 - self.b1)
            torch._foreach_mul_(self.v, self.b2)
            torch._foreach_addcmul_(self.v, grads, grads, 1.0 - self.b2)
            denom = torch._foreach_sqrt(self.v)
            torch._foreach_div_(denom, c2 ** 0.5)
            torch._foreach_add_(denom, self.eps)
            upd = torch._foreach_div(self.m, denom)
            torch._foreach_mul_(upd, [(-1.0 / c1) * lr for lr in self.lr_of])
            torch._foreach_add_(self.params, upd)


def fit(arch: str, tasks: list[dict], depth: int, p: dict, seed: int) -> list[dict]:
    """Train one trunk architecture at one depth on every task by the rule in the module docstring.

    ``tasks``: one dict per PDE (``problem``, ``colloc``, ``X_val``, ``u_val``, ``X_test``, ``u_test``),
    all with the same input features and derivative directions (Poisson and Helmholtz; Burgers and
    Allen-Cahn). Every (task, rate) pair is one member of a single batched trunk: the members of a task
    start from that task's initial weights (seeded by seed, depth and PDE name), and the rates of the
    grid are the same for every task, trunk and depth. Members never interact; batching them only
    shares the per-operation overhead of tiny matrices. A task that has stopped keeps its
    best-validation weights and its curves end at its stopping step; the loop ends when every task
    has stopped, or at ``max_steps``."""
    import torch

    from ...claims import plateau
    from .differential_profile import band_decades, hidden_profile
    from .networks import PINNTrunk

    lrs = [float(x) for x in p["lr_grid"]]
    n_lr, n_task = len(lrs), len(tasks)
    probs = [t["problem"] for t in tasks]
    n_feat, n_dirs = probs[0].n_features, probs[0].n_dirs
    if any(q.n_features != n_feat or q.n_dirs != n_dirs for q in probs):
        raise ValueError("tasks trained together must share their features and derivative directions")
    kw = dict(coupling_c=float(p["coupling_c"]), n_power=int(p.get("n_power", 1)))
    model = PINNTrunk(arch, n_feat, int(p["width"]), depth, members=n_lr * n_task, **kw)
    tensors = list(model.parameters()) + list(model.buffers())  # buffers: the spectral norms' vectors
    groups = [slice(g * n_lr, (g + 1) * n_lr) for g in range(n_task)]
    with torch.no_grad():
        for sl, prob in zip(groups, probs):
            torch.manual_seed(seed * 7919 + depth * 101 + sum(map(ord, prob.name)))  # stable across processes
            init = PINNTrunk(arch, n_feat, int(p["width"]), depth, members=1, **kw)
            for t, t0 in zip(tensors, list(init.parameters()) + list(init.buffers())):
                t[sl] = t0
    feats = torch.cat([prob.feature_jet(t["colloc"]).unsqueeze(0).expand(n_lr, -1, -1, -1)
                       for prob, t in zip(probs, tasks)])  # (K, J, N, n_features)
    Xc = [torch.as_tensor(t["colloc"], dtype=torch.float32) for t in tasks]
    X_prof = [t["X_test"][:: max(1, len(t["X_test"]) // int(p["n_profile"]))] for t in tasks]

    def rel_err(g, X, u_ref):
        """Relative L2 error (n_lr,) and values (n_lr, M) of task g's members at X."""
        with torch.no_grad():
            was = model.training
            model.eval()
            u = probs[g].u(model, X)[groups[g]].numpy().astype(np.float64)
            model.train(was)
        return np.linalg.norm(u - u_ref[None], axis=1) / np.linalg.norm(u_ref), u

    outs = [{"prof_init": hidden_profile(model, probs[g], X_prof[g], member=groups[g].start)} for g in range(n_task)]
    opt = MemberAdam(model.parameters(), lrs * n_task)
    best_state = [t.detach().clone() for t in tensors]
    best = np.full(n_lr * n_task, np.inf)
    every, min_steps, max_steps = int(p["eval_every"]), int(p["min_steps"]), int(p["max_steps"])
    tol = float(p["flat_tol"])
    hist = [{"x": [], "val": [], "loss": [], "sel": 0, "steps": 0, "flat": False, "done": False, "fallback": False}
            for _ in tasks]

    def flat(xs, raw):
        """The convergence gate's own test (reprozoo.claims.plateau) at flat_tol, half its tolerance."""
        return plateau(xs, raw, tol)

    step = 0
    model.train()
    while step < max_steps and not all(h["done"] for h in hist):
        step += 1
        opt.zero_grad()
        out = model.jet(feats, n_dirs, True)  # (J, K, N, 1)
        loss = torch.cat([prob.residual_jet(X, out[:, sl]).pow(2).mean(dim=-1)
                          for prob, X, sl in zip(probs, Xc, groups)])  # (K,)
        loss.sum().backward()
        opt.step()
        if step % every:
            continue
        loss_np = loss.detach().numpy().astype(np.float64)
        for g, (h, sl, t) in enumerate(zip(hist, groups, tasks)):
            if h["done"]:
                continue
            v = rel_err(g, torch.as_tensor(t["X_val"], dtype=torch.float32), t["u_val"])[0]
            v = np.where(np.isfinite(v), v, np.inf)
            h["x"].append(step), h["val"].append(v), h["loss"].append(loss_np[sl])
            better = v < best[sl]
            if better.any():
                mask = torch.zeros(len(best), dtype=torch.bool)
                mask[sl] = torch.from_numpy(better)
                with torch.no_grad():
                    for b, tt in zip(best_state, tensors):
                        b[mask] = tt[mask]
                best[sl] = np.where(better, v, best[sl])
            h["sel"], h["steps"] = int(np.argmin(best[sl])), step
            if step >= min_steps and flat(h["x"], [r[h["sel"]] for r in h["val"]]):
                h["flat"] = h["done"] = True
    for h, sl in zip(hist, groups):
        if not h["flat"]:  # budget spent with the best rate still improving: the best rate whose run converged
            ok = [j for j in range(n_lr) if flat(h["x"], [r[j] for r in h["val"]])]
            if ok:
                h["sel"], h["flat"], h["fallback"] = min(ok, key=lambda j: best[sl][j]), True, True
    with torch.no_grad():  # every member back to its best-validation weights
        for b, t in zip(best_state, tensors):
            t.copy_(b)
    for g, (h, o, t) in enumerate(zip(hist, outs, tasks)):
        sel = h["sel"]
        errs, u_test_pred = rel_err(g, torch.as_tensor(t["X_test"], dtype=torch.float32), t["u_test"])
        o.update(err=float(errs[sel]), u=u_test_pred[sel], lr=lrs[sel], steps=h["steps"], flat=h["flat"],
                 fallback=h["fallback"],
                 best_val=best[groups[g]], val=(h["x"], [float(r[sel]) for r in h["val"]]),
                 loss=(h["x"], [float(r[sel]) for r in h["loss"]]),
                 prof_trained=hidden_profile(model, probs[g], X_prof[g], member=groups[g].start + sel))
        o["bands"] = {f"{q}_{s}": band_decades(o[f"prof_{s}"][i])
                      for s in ("init", "trained") for i, q in enumerate(("du", "d2u"))}
    return outs


def _task_groups(names: list[str], cfgs: dict) -> list[list[str]]:
    """PDEs that can share one batched trunk: the same features and derivative directions."""
    from .pdes import make_problem

    groups: dict[tuple, list[str]] = {}
    for n in names:
        q = make_problem(n, cfgs.get(n))
        groups.setdefault((q.n_features, q.n_dirs), []).append(n)
    return list(groups.values())


def train(ctx) -> None:
    import torch

    from .pdes import make_problem

    torch.set_num_threads(max(1, int(ctx.threads)))
    p = ctx.params
    arch = ctx.variant
    cfgs = p.get("pde_config") or {}
    depths = p["depths"][arch] if isinstance(p["depths"], dict) else p["depths"]
    tasks = {}
    for pi, name in enumerate(p["pdes"]):
        problem = make_problem(name, cfgs.get(name))
        X_test, u_test = problem.reference()
        ctx.metrics.curve(f"ref_{name}", range(len(u_test)), u_test)
        colloc = problem.collocation(ctx.rng(100 + pi), int(p["n_collocation"]))
        X_val = problem.collocation(ctx.rng(200 + pi), int(p["n_val"]))
        u_val = problem.exact_at(X_val)
        if u_val is None:  # no closed form (Burgers, Allen-Cahn): a random subset of the reference grid
            idx = ctx.rng(200 + pi).choice(len(u_test), size=min(int(p["n_val"]), len(u_test)), replace=False)
            X_val, u_val = X_test[idx], u_test[idx]
        tasks[name] = dict(problem=problem, colloc=colloc, X_val=X_val, u_val=u_val, X_test=X_test, u_test=u_test)
    for depth in depths:
        for names in _task_groups(list(p["pdes"]), cfgs):
            t0 = time.perf_counter()
            results = fit(arch, [tasks[n] for n in names], int(depth), p, ctx.seed)
            ctx.metrics.scalar(f"seconds_{'_'.join(names)}_L{int(depth)}", time.perf_counter() - t0)
            for name, r in zip(names, results):
                _record(ctx, arch, f"{name}_L{int(depth)}", r)


def _record(ctx, arch: str, tag: str, r: dict) -> None:
    ctx.metrics.scalar(f"err_{tag}", r["err"])
    ctx.metrics.scalar(f"lr_{tag}", r["lr"])
    ctx.metrics.scalar(f"steps_{tag}", r["steps"])
    ctx.metrics.scalar(f"flat_{tag}", float(r["flat"]))
    ctx.metrics.scalar(f"fallback_{tag}", float(r["fallback"]))
    for i, b in enumerate(r["best_val"]):
        ctx.metrics.scalar(f"valerr_lr{i}_{tag}", float(b))
    for q, v in r["bands"].items():
        ctx.metrics.scalar(f"band_{q}_{tag}", v)
    ctx.metrics.curve(f"loss_{tag}", *r["loss"])
    ctx.metrics.curve(f"valerr_{tag}", *r["val"])
    ctx.metrics.curve(f"lrcurve_{tag}", r["val"][0], [r["lr"]] * len(r["val"][0]))  # constant: the gate's lr floor holds
    for s in ("init", "trained"):
        d1, d2 = r[f"prof_{s}"]
        ctx.metrics.curve(f"prof_du_{s}_{tag}", range(len(d1)), d1)
        ctx.metrics.curve(f"prof_d2u_{s}_{tag}", range(len(d2)), d2)
    ctx.metrics.curve(f"field_{tag}", range(len(r["u"])), r["u"])
    ctx.progress(f"{arch} {tag}: test rel L2 {r['err']:.3e}, lr {r['lr']:g}, {r['steps']} steps "
                 f"({'max steps, best converged rate' if r['fallback'] else 'plateau' if r['flat'] else 'max steps'}), "
                 f"best val per lr "
                 f"{' '.join(f'{b:.2e}' for b in r['best_val'])}, band du init {r['bands']['du_init']:.2f} dec")


def plot(table, plots_dir, params) -> None:
    from .plots import draw_all

    draw_all(table, Path(plots_dir), params)
