"""The one-off pilot behind ``configs/smoke.yaml``'s ``lr`` and ``reg`` tables (cold review of stop 50: the
networks overfit early with untuned regularisation while the linear model's C was tuned). Not part of the
pipeline; run from the repository root on one core:

    python -m reprozoo.methods.afr_net.pilot_reg                       # the whole protocol, every network
    python -m reprozoo.methods.afr_net.pilot_reg afr_net --rates 1e-3 3e-3   # a part of stage 1 (fits are
    python -m reprozoo.methods.afr_net.pilot_reg afr_net --lr 1e-2 --reg 1 2  # deterministic: parts combine)

Protocol, the same for every fitted variant (like for like), on seed 0's smoke cohort (the one ``train_shared``
draws) and its validation subjects only; every fit is a FULL fit by the shared rule (``method.fit``:
``blocks.fitting.fit_to_plateau`` at one rate), scored by its best validation cross-entropy (the quantity the rule
keeps its weights by):

1. the rate: every rate of ``fit.lr_grid`` at the first ``reg_grid`` setting (the earlier fixed one); the lowest
   score wins (ties within 1e-3 to the lower rate). Why full fits and not the rule's 30-step pilots: on the
   closing-0.25 cohort the 30-step pilot tails of AFR-Net, its structural-gate ablation and the GCN lie within 0.687-0.698, near log 2, and the first version
   of this pilot, which used them, gave AFR-Net 3e-4, whose full fit then moved its validation loss from 0.691 to
   0.689 while a full fit at 1e-2 reached 0.678 (README, "This round");
2. the regularisation: the other ``reg_grid`` settings at that rate; the lowest score wins (ties within 1e-3 to
   the weaker setting).

Prints one line per fit.
"""
import argparse
import time
from pathlib import Path

import numpy as np
import yaml

SMOKE = Path(__file__).parent / "configs" / "smoke.yaml"


def _setup():
    import torch

    from .data import make_cohort, split_indices

    torch.set_num_threads(1)
    cfg = yaml.safe_load(SMOKE.read_text())
    seed = 0
    d = {**cfg["data"], "severity": tuple(cfg["data"]["severity"])}
    c = make_cohort(np.random.default_rng(seed * 1_000_003), **d)                  # ctx.rng(0) of seed 0
    sp = split_indices(c.y, tuple(cfg["split"]), np.random.default_rng(seed * 1_000_003 + 1))
    T = {"S": torch.tensor(c.sc, dtype=torch.float32), "F": torch.tensor(c.fc, dtype=torch.float32),
         "y": torch.tensor(c.y, dtype=torch.long)}
    T.update({k: torch.tensor(sp[k], dtype=torch.long) for k in sp})
    return cfg, c, sp, T


def one_fit(cfg, c, sp, T, v: str, rate: float, reg_index: int) -> float:
    """A full fit of ``v`` at ``rate`` and ``reg_grid[reg_index]`` on seed 0; prints and returns its score."""
    import torch

    from .method import _predict, fit, roc_auc

    t = time.process_time()
    reg = cfg["reg_grid"][reg_index]
    p = {k: val for k, val in cfg.items() if k not in ("lr", "reg")}
    p["reg"], p["lr"] = {v: reg}, {v: float(rate)}
    torch.manual_seed(0)
    model, rec = fit(v, c, T, p, 0, lambda *a, **k: None)
    zv, _ = _predict(model, T, T["val"], 0)
    vauc = roc_auc(c.y[sp["val"]], (zv[:, 1] - zv[:, 0]).numpy())
    score = float(min(rec["vals"]))
    print(f"{v} lr {rate:g} wd {reg['weight_decay']:g} dropout {reg['dropout']:g}: best val CE {score:.4f} "
          f"(step {rec['steps'][int(np.argmin(rec['vals']))]} of {rec['stop']}, plateau {rec['plateau']}) "
          f"val AUC {vauc:.3f} | {time.process_time() - t:.1f} CPU-s", flush=True)
    return score


def pick(scores: dict, tol: float = 1e-3):
    """The key with the lowest score; ties within ``tol`` to the first key (keys in preference order)."""
    best = min(scores.values())
    return next(k for k, s in scores.items() if s <= best + tol)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=["mlp", "gcn", "afr_net", "afr_net_fixed"])
    ap.add_argument("--rates", nargs="*", type=float, help="stage 1 only, these rates")
    ap.add_argument("--lr", type=float, help="stage 2 only, at this rate")
    ap.add_argument("--reg", nargs="*", type=int, help="stage 2 only, these reg_grid indices")
    a = ap.parse_args()
    cfg, c, sp, T = _setup()
    for v in a.variants:
        if a.lr is not None:
            for i in a.reg or range(1, len(cfg["reg_grid"])):
                one_fit(cfg, c, sp, T, v, a.lr, i)
            continue
        rates = a.rates or sorted(float(r) for r in cfg["fit"]["lr_grid"])
        scores = {r: one_fit(cfg, c, sp, T, v, r, 0) for r in rates}
        if a.rates:
            continue
        rate = pick(scores)
        regs = {0: scores[rate], **{i: one_fit(cfg, c, sp, T, v, rate, i) for i in range(1, len(cfg["reg_grid"]))}}
        i = pick(regs)
        print(f"{v}: chosen lr {rate:g}, reg {cfg['reg_grid'][i]}", flush=True)


if __name__ == "__main__":
    main()
