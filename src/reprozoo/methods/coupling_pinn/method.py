"""Deep PINNs with spectrally regulated coupling layers, in miniature: a depth sweep.

Variants (the trunk architecture, networks.py; same lifting, head, width, depths, collocation
points, optimiser, step budget and float32 precision for all):
- ``coupling`` (method): additive coupling blocks with spectrally normalised coupling functions,
  each block's Jacobian has singular values in [1/rho(c), rho(c)];
- ``mlp`` (baseline): the plain tanh MLP PINN (DeepXDE conventions: Glorot normal, tanh);
- ``resnet`` (baseline): the residual tanh MLP PINN (identity skips).

One cell (variant x seed) trains that trunk at every depth L of ``depths`` on every PDE of
``pdes`` (pdes.py), from the seed's initialisation and the seed's collocation points, and records
for each (pde, L):
- ``err_<pde>_L<L>``: relative L2 error ||u - u_ref|| / ||u_ref|| on the evaluation grid;
- ``band_du_init_<pde>_L<L>``, ``band_d2u_init_...``, ``band_du_trained_...``, ``band_d2u_trained_...``:
  decades spanned by the per-layer derivative norms (differential_profile.py);
- curves ``loss_<pde>_L<L>`` (mean squared residual vs step), ``valerr_<pde>_L<L>`` (relative L2 vs
  step, the validation curve), ``prof_du_{init,trained}_<pde>_L<L>`` / ``prof_d2u_...`` (norm vs
  layer index), ``field_<pde>_L<L>`` (prediction on the evaluation grid) and ``ref_<pde>``;
- ``loss_slope_<pde>_L<L>``: d log10(loss) / d(step / 1000) over the last quarter of training.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

GENERIC_CURVES: dict = {}  # plot() draws every figure


def _train_one(arch: str, problem, depth: int, p: dict, seed: int, colloc: np.ndarray, X_eval, u_ref):
    import torch

    from .differential_profile import band_decades, hidden_profile
    from .networks import PINNTrunk

    torch.manual_seed(seed * 7919 + depth * 101 + sum(map(ord, problem.name)))  # stable across processes
    model = PINNTrunk(arch, problem.n_features, int(p["width"]), depth,
                      coupling_c=float(p["coupling_c"]), n_power=int(p.get("n_power", 1)))
    X = torch.tensor(colloc, dtype=torch.float32, requires_grad=True)
    Xe = torch.tensor(X_eval, dtype=torch.float32)
    Xp = torch.tensor(X_eval[:: max(1, len(X_eval) // int(p["n_profile"]))], dtype=torch.float32)
    ref_norm = float(np.linalg.norm(u_ref))

    def rel_err():
        with torch.no_grad():
            was = model.training
            model.eval()
            u = problem.u(model, Xe).squeeze(-1).numpy().astype(np.float64)
            model.train(was)
        return float(np.linalg.norm(u - u_ref) / ref_norm), u

    out = {"prof_init": hidden_profile(model, problem, Xp)}
    steps, lr = int(p["steps"]), float(p["lr"])
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=float(p["lr_final_ratio"]) ** (1.0 / steps))
    every = max(1, steps // int(p["n_log"]))
    loss_x, loss_y, val_x, val_y = [], [], [], []
    model.train()
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = problem.residual(model, X).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        if step % every == 0 or step == steps:
            loss_x.append(step), loss_y.append(loss.item())
            val_x.append(step), val_y.append(rel_err()[0])
    err, u_pred = rel_err()
    out.update(err=err, u=u_pred, loss=(loss_x, loss_y), val=(val_x, val_y),
               prof_trained=hidden_profile(model, problem, Xp))
    q = max(2, len(loss_y) // 4)
    ly = np.log10(np.maximum(np.asarray(loss_y[-q:]), 1e-30))
    out["loss_slope"] = float(np.polyfit(np.asarray(loss_x[-q:]) / 1000.0, ly, 1)[0])
    out["bands"] = {f"{k}_{s}": band_decades(out[f"prof_{s}"][i])
                    for s in ("init", "trained") for i, k in enumerate(("du", "d2u"))}
    return out


def train(ctx) -> None:
    import torch

    from .pdes import make_problem

    torch.set_num_threads(max(1, int(ctx.threads)))
    p = ctx.params
    arch = ctx.variant
    for pi, name in enumerate(p["pdes"]):
        problem = make_problem(name, (p.get("pde_config") or {}).get(name))
        X_eval, u_ref = problem.reference()
        ctx.metrics.curve(f"ref_{name}", range(len(u_ref)), u_ref)
        colloc = problem.collocation(ctx.rng(100 + pi), int(p["n_collocation"]))
        for depth in p["depths"]:
            t0 = time.perf_counter()
            r = _train_one(arch, problem, int(depth), p, ctx.seed, colloc, X_eval, u_ref)
            tag = f"{name}_L{int(depth)}"
            ctx.metrics.scalar(f"err_{tag}", r["err"])
            ctx.metrics.scalar(f"loss_slope_{tag}", r["loss_slope"])
            ctx.metrics.scalar(f"seconds_{tag}", time.perf_counter() - t0)
            for k, v in r["bands"].items():
                ctx.metrics.scalar(f"band_{k}_{tag}", v)
            ctx.metrics.curve(f"loss_{tag}", *r["loss"])
            ctx.metrics.curve(f"valerr_{tag}", *r["val"])
            for s in ("init", "trained"):
                d1, d2 = r[f"prof_{s}"]
                ctx.metrics.curve(f"prof_du_{s}_{tag}", range(len(d1)), d1)
                ctx.metrics.curve(f"prof_d2u_{s}_{tag}", range(len(d2)), d2)
            ctx.metrics.curve(f"field_{tag}", range(len(r["u"])), r["u"])
            ctx.progress(f"{arch} {tag}: rel L2 {r['err']:.3e}, loss slope {r['loss_slope']:+.2f} dec/kstep, "
                         f"band du init {r['bands']['du_init']:.2f} dec, {time.perf_counter() - t0:.1f}s")


def plot(table, plots_dir, params) -> None:
    from .plots import draw_all

    draw_all(table, Path(plots_dir), params)
