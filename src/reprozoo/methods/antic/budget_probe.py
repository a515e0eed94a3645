"""Does a longer fit, or another optimisation rule, reach the convergence gate's plateau? (the
measurement behind the page's convergence paragraph; not part of the pipeline).

    python -m reprozoo.methods.antic.budget_probe [--scale smoke] [--seed 0] [--factors 1 4 16]
                                                  [--rules fixed plateau lbfgs]

Runs the smoke configuration's solver and adaptive selector, then fits the first kept frame (base),
the second (one rank-r residual from that base) and a scratch network on the first, each with its
step budget multiplied by every factor, and prints each fit's improvement over its last 30 % (the
gate's ``tail_fit``; the gate passes at <= 2 %), its final relative error and its CPU seconds.
Rules (rates chosen as in ``train_shared``, from the config's grid):

- ``fixed``: the pipeline's codec (full-batch Adam at a constant rate for the step budget);
- ``plateau``: the project's shared rule ``blocks.fitting.fit_to_plateau`` at the same chosen rate
  (constant rate, stop on the gate's plateau test at half its tolerance, one rate drop x0.1 after the
  first plateau), capped at the step budget; it says whether a fit stopped on a plateau;
- ``lbfgs``: full-batch L-BFGS with a strong-Wolfe line search (no rate to choose), the step budget
  counted in loss-and-gradient evaluations: a quasi-Newton optimiser, to see whether the power-law
  tail is Adam's or the problem's.

The residual starts from the ``fixed`` rule's float16 base in every rule (the same starting point).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _residual_module(base, rank: int, gen):
    """The rank-r residual of ``base`` as a module whose parameters are the delta alone."""
    import torch
    from torch import nn

    from .neural_codec import _linears, forward_with_delta

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self._base = (base,)  # not a submodule: its weights stay fixed
            self.u, self.v, self.db = nn.ParameterList(), nn.ParameterList(), nn.ParameterList()
            for lin in _linears(base):
                self.u.append(nn.Parameter(torch.zeros(lin.out_features, rank)))
                self.v.append(nn.Parameter(torch.randn(lin.in_features, rank, generator=gen) / lin.in_features**0.5))
                self.db.append(nn.Parameter(torch.zeros(lin.out_features)))

        def forward(self, feat):
            return forward_with_delta(self._base[0], None, list(zip(self.u, self.v, self.db)), feat)

    return Residual()


def _rel(pred, y) -> float:
    return float(((pred - y) ** 2).mean().sqrt() / y.std())


def _fit_plateau(build, feat, y, lr: float, steps: int, eval_every: int, seed: int):
    from reprozoo.blocks.fitting import fit_to_plateau

    def val(m):
        import torch

        with torch.no_grad():
            return float(((m(feat) - y) ** 2).mean())

    fit = {"lr_grid": [lr], "pilot_steps": 0, "eval_every": eval_every, "min_steps": min(steps, 10 * eval_every),
           "max_steps": steps, "flat_tol": 0.01}
    m, rec = fit_to_plateau(build, lambda m, g: ((m(feat) - y) ** 2).mean(), val, fit, seed, progress=lambda s: None)
    with __import__("torch").no_grad():
        err = _rel(m(feat), y)
    note = ("plateau" if rec["plateau"] else "cap") + ("" if rec["drop_step"] is None else f", drop at {rec['drop_step']}")
    return rec["steps"], rec["vals"], err, note


def _fit_lbfgs(model, feat, y, evals: int):
    import torch

    opt = torch.optim.LBFGS(list(model.parameters()), lr=1.0, max_iter=5, history_size=50,
                            line_search_fn="strong_wolfe", tolerance_grad=0.0, tolerance_change=0.0)
    count, xs, ys = [0], [], []

    def closure():
        opt.zero_grad()
        loss = ((model(feat) - y) ** 2).mean()
        loss.backward()
        count[0] += 1
        return loss

    while count[0] < evals:
        loss = opt.step(closure)
        xs.append(count[0])
        ys.append(float(loss.detach()))
    with torch.no_grad():
        err = _rel(model(feat), y)
    return xs, ys, err, f"{count[0]} evaluations"


def main(argv=None) -> None:
    import torch

    from reprozoo.claims import tail_fit
    from reprozoo.registry import get

    from .flow import make_flow, run_insitu
    from .method import _adaptive
    from .neural_codec import ContinualCodec, ScratchCodec, choose_lrs, rel_err, scratch_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--factors", type=float, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rules", nargs="+", default=["fixed"], choices=["fixed", "plateau", "lbfgs"])
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    p = get("antic").configs[a.scale]
    solver, w_hat0, t_save = make_flow(p["flow"], a.seed)
    sel, kept, frames = _adaptive(p), [], []

    def on_frame(i, w):
        if sel.keep(i, w):
            kept.append(i)
            frames.append(w.copy())

    run_insitu(solver, w_hat0, t_save, on_frame)
    n = int(p["flow"]["n"])
    lrs = choose_lrs(frames[:2], kept, n, p["codec"], a.seed, p["lr_grid"])
    print(f"kept {len(kept)} frames; peak rates chosen: base {lrs['lr']}, residual {lrs['delta_lr']}, scratch {lrs['scratch_lr']}")
    for f in a.factors:
        cfg = {**p["codec"], **{k: lrs[k] for k in ("lr", "delta_lr", "scratch_lr")}}
        for k in ("base_steps", "delta_steps", "scratch_steps"):
            cfg[k] = int(round(cfg[k] * f))
        cfg["eval_every"] = max(1, int(round(cfg.get("eval_every", 5) * f)))
        t0 = time.process_time()
        c = ContinualCodec(n, cfg, a.seed)
        c.add(kept[0], frames[0])
        t1 = time.process_time()
        width, _ = scratch_config(cfg, len(kept))
        y0, m0, s0 = c._target(frames[0])
        y1, m1, s1 = c._target(frames[1])
        for rule in a.rules:
            rows = []
            if rule == "fixed":
                t2 = time.process_time()
                c.add(kept[1], frames[1])
                t3 = time.process_time()
                s = ScratchCodec(n, cfg, a.seed, width)
                s.add(kept[0], frames[0])
                t4 = time.process_time()
                rows = [("base", c.fits[0]["x"], c.fits[0]["y"], rel_err(c.recon[0], frames[0]), "", t1 - t0),
                        ("residual", c.fits[1]["x"], c.fits[1]["y"], rel_err(c.recon[1], frames[1]), "", t3 - t2),
                        ("scratch", s.fits[0]["x"], s.fits[0]["y"], rel_err(s.recon[0], frames[0]), "", t4 - t3)]
            else:
                from reprozoo.blocks.neural_field import CoordinateMLP

                base = c.branch(c.rank).model  # the float16 base network, fixed
                for p_ in base.parameters():
                    p_.requires_grad_(False)
                feat = c.feat

                def new_base(_g=None):
                    torch.manual_seed(a.seed)
                    m = CoordinateMLP(2, 1, width=cfg["width"], depth=cfg["depth"], n_features=cfg["n_features"],
                                      sigma=cfg["sigma"], seed=a.seed)
                    return m.net

                def new_scratch(_g=None):
                    torch.manual_seed(a.seed * 1000)
                    m = CoordinateMLP(2, 1, width=width, depth=cfg["depth"], n_features=cfg["n_features"],
                                      sigma=cfg["sigma"], seed=a.seed)
                    return m.net

                def new_res(_g=None):
                    return _residual_module(base, c.rank, torch.Generator().manual_seed(1000 * a.seed + 1))

                jobs = (("base", new_base, y0, cfg["lr"], cfg["base_steps"]),
                        ("residual", new_res, y1, cfg["delta_lr"], cfg["delta_steps"]),
                        ("scratch", new_scratch, y0, cfg["scratch_lr"], cfg["scratch_steps"]))
                for name, build, y, lr, steps in jobs:
                    t2 = time.process_time()
                    if rule == "plateau":
                        xs, ys, err, note = _fit_plateau(build, feat, y, float(lr), int(steps), cfg["eval_every"], a.seed)
                    else:
                        xs, ys, err, note = _fit_lbfgs(build(), feat, y, int(steps))
                    rows.append((name, xs, ys, err, note, time.process_time() - t2))
            for name, xs, ys, err, note, cpu in rows:
                imp = tail_fit(xs, ys)["improvement"]
                print(f"x{f:g} {rule:7s} {name:8s} {int(xs[-1]):6d} steps: still improving by {100 * imp:5.1f} % over its "
                      f"last 30 %, relative error {err:.4f}, {cpu:.1f} CPU-s {('(' + note + ')') if note else ''}", flush=True)


if __name__ == "__main__":
    main()
