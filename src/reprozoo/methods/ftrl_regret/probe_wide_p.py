"""Standalone probe (no claim reads it): would a wider P_T sweep separate the retuned discount from
the best discount fixed once? Runs the smoke config's learners and streams on one P_T sweep at one T
and prints the half-range deviation max(|lo - 1/2|, |hi - 1/2|) of the tuned discount and of the
discount fixed at each sweep point, and the CPU seconds.

    python -m reprozoo.methods.ftrl_regret.probe_wide_p linear 8000 1,2,4,8,16,32,64,128,256 0
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from . import learners as L
from . import method as M
from .streams import make_stream, path_length


def main(task: str, T: int, Ps: list[float], seed: int = 0) -> None:
    p = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    d, R, cfg = p["d"], p["replicates"], p[task]
    c = {**cfg, "jump": cfg.get("P_jump", cfg["jump"])}
    rng = np.random.default_rng(seed)
    t0 = time.process_time()
    fixed = [L.tuned_discount(T, d, cfg["kappa"] * P) for P in Ps]
    rows = []
    for P in Ps:
        st = M._stack([make_stream(task, T, d, P, c, rng) for _ in range(R)])
        tuned = [[L.tuned_discount(T, d, cfg["kappa"] * path_length(u))] for u in st["u"]]
        B = np.concatenate([np.array(tuned), np.tile(fixed, (R, 1))], axis=1)
        pred = L.run_discounted_ftrl_batch(task, st["x"], st["y"], B, p["ridge"], cfg["bound"])
        rows.append([M.dynamic_regret(task, pred[..., k], st)[:, -1].mean() for k in range(B.shape[1])])
    Y = np.array(rows)
    devs = [M.half_dev(*M.half_slopes(Ps, Y[:, k])) for k in range(Y.shape[1])]
    print(f"{task} T={T}: tuned deviation {devs[0]:.3f}; fixed at each P_T: "
          + " ".join(f"{v:.3f}" for v in devs[1:]) + f"; best fixed {min(devs[1:]):.3f}; "
          f"cpu {time.process_time() - t0:.1f} s")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), [float(x) for x in a[2].split(",")], int(a[3]) if len(a) > 3 else 0)
