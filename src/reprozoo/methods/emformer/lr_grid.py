"""The learning-rate grid, chosen on the validation trajectories (not part of the pipeline: run once,
the chosen rates go into configs/<scale>.yaml).

    python -m reprozoo.methods.emformer.lr_grid --scale smoke --seed 0

For each rate of ``--pre`` it pretrains the shared model (the paper's loss) and reports the
validation one-step RMSE (median over the last 30 % of the evaluations) and the convergence gate's
tail improvement; the best rate's model is then fine-tuned by every fine-tuning variant at each rate
of ``--ft`` (the same grid for every model), scored on its validation rollout RMSE. The
seed's data are simulated exactly as the pipeline does (``ctx.rng(0)`` of that seed).
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import yaml

from ...claims import tail_fit
from .method import ABLATIONS, VARIANTS, finetune, make_data, pretrain


def _score(curves: dict) -> tuple[float, float]:
    xs, ys = np.asarray(curves["step"], float), np.asarray(curves["val"], float)
    tail = xs >= xs[0] + 0.7 * (xs[-1] - xs[0])
    return float(np.median(ys[tail])), float(tail_fit(xs, ys)["improvement"])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pre", type=float, nargs="+", default=[3e-3, 1e-2, 3e-2])
    ap.add_argument("--ft", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    ap.add_argument("--variants", nargs="+", default=[v for v, c in VARIANTS.items() if c[0]])
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # as the pipeline's jobs run
    p = yaml.safe_load((Path(__file__).parent / "configs" / f"{a.scale}.yaml").read_text())
    quiet = lambda *_: None  # noqa: E731
    data = make_data(p, np.random.default_rng(a.seed * 1_000_003))
    out = {"pretrain": {}, "finetune": {}}
    best = {}
    for kind in ("sin",):
        for lr in a.pre:
            q = copy.deepcopy(p)
            q["pretrain"]["lr"] = lr
            t0 = time.process_time()
            net, loss_fn, c = pretrain(q, data, kind, a.seed, quiet)
            val, imp = _score(c)
            out["pretrain"][(kind, lr)] = val
            print(f"pretrain {kind:5s} lr {lr:.0e}: val RMSE {val:.4f}, tail improvement {100 * imp:+.1f} %, "
                  f"lambda {c['w'][-1]:.1e} ({time.process_time() - t0:.0f} CPU-s)", flush=True)
            if kind not in best or val < best[kind][0]:
                best[kind] = (val, lr, net.state_dict(), loss_fn.state_dict())
    from .method import _loss, _net

    for v in a.variants:
        _, accumulative, weighting = {**VARIANTS, **ABLATIONS}[v]
        pre = "sin"
        for lr in a.ft:
            q = copy.deepcopy(p)
            q["finetune"]["lr"] = lr
            net, loss_fn = _net(q), _loss(weighting)
            net.load_state_dict(best[pre][2])
            loss_fn.load_state_dict({k: w for k, w in best[pre][3].items() if k in loss_fn.state_dict()}, strict=False)
            t0 = time.process_time()
            _, c = finetune(net, loss_fn, q, data, accumulative, a.seed, quiet)
            val, imp = _score(c)
            out["finetune"][(v, lr)] = val
            print(f"finetune {v:10s} lr {lr:.0e} (pretrained at {best[pre][1]:.0e}): val rollout RMSE "
                  f"{c['val'][0]:.4f} -> {val:.4f}, tail improvement {100 * imp:+.1f} % "
                  f"({time.process_time() - t0:.0f} CPU-s)", flush=True)
    return out


if __name__ == "__main__":
    main()
