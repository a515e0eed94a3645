"""Does a longer fit reach the convergence gate's plateau? (the measurement behind the page's
convergence paragraph; not part of the pipeline).

    python -m reprozoo.methods.antic.budget_probe [--scale smoke] [--seed 0] [--factors 1 4 16]

Runs the smoke configuration's solver and adaptive selector, then fits the first kept frame (base),
the second (one rank-r residual from that base) and a scratch network on the first, each with its
step budget multiplied by every factor (the config's rate schedule and batch, rate chosen as in
``train_shared``), and prints each fit's improvement over its last 30 % (the gate's ``tail_fit``;
the gate passes at <= 2 %), its final relative error and its CPU seconds.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


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
        c.add(kept[1], frames[1])
        t2 = time.process_time()
        width, _ = scratch_config(cfg, len(kept))
        s = ScratchCodec(n, cfg, a.seed, width)
        s.add(kept[0], frames[0])
        t3 = time.process_time()
        for name, fit, rec, w, cpu in (("base", c.fits[0], c.recon[0], frames[0], t1 - t0),
                                       ("residual", c.fits[1], c.recon[1], frames[1], t2 - t1),
                                       ("scratch", s.fits[0], s.recon[0], frames[0], t3 - t2)):
            imp = tail_fit(fit["x"], fit["y"])["improvement"]
            print(f"x{f:g} {name:8s} {fit['x'][-1]:6d} steps: still improving by {100 * imp:5.1f} % over its last 30 %, "
                  f"relative error {rel_err(rec, w):.4f}, {cpu:.1f} CPU-s", flush=True)


if __name__ == "__main__":
    main()
