"""Feasibility probe (not part of the pipeline): does scratch at the largest N reach the 10 %
precondition with the smoke config's training rule, and what does a step cost?

    nice -n 19 .venv/bin/python -m reprozoo.methods.geopt.probe [N] [MAX_STEPS]
    nice -n 19 .venv/bin/python -m reprozoo.methods.geopt.probe pretrain [VARIANT] [MAX_STEPS]

Draws the smoke config's flows for seed-0-like data (128 + 32 validation + 64 test shapes, 96
points), fits one scratch model with ``method.fit`` exactly as ``train`` does, and prints the CPU
seconds, steps, plateau flag, the learning-rate pilot, best validation and test relative L2 and
the validation curve every 100 steps. ``MAX_STEPS`` replaces the config's step limit. The
``pretrain`` form fits one pre-training (``lifted`` or ``static_vec``) on the smoke config's
unlabelled shapes (seed-0-like) the same way. The numbers quoted on the page come from this script.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from . import method
from .model import GeometrySimulator


def main(n: int = 128, max_steps: int | None = None) -> None:
    import torch

    torch.set_num_threads(1)
    p = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    n_max = max(p["n_labels"])
    flows = method.make_flow_set(np.random.default_rng(1), n_max + p["n_val"] + p["n_test"], p["panels"],
                                 p["queries"], p["cond_step"])
    val = method._tensors(flows, np.arange(n_max, n_max + p["n_val"]), "y", p["val_points"])
    test = method._tensors(flows, np.arange(n_max + p["n_val"], n_max + p["n_val"] + p["n_test"]), "y")
    cfg = dict(p["finetune"], **({} if max_steps is None else {"max_steps": max_steps}))
    t0 = time.process_time()
    m, h = method.fit(GeometrySimulator(**p["network"], out_dim=2, seed=0), flows, np.arange(n), "y", cfg, 2, val)
    cpu = time.process_time() - t0
    test_err = float(np.sqrt(method.per_shape_sq_error(m, test).mean()))
    print(f"N {n}: fit {cpu:.1f} CPU s, {h['stop_step']} steps, plateau {h['plateau']}, lr {h['lr_chosen']:g} "
          f"(pilot {h['lr_pilot']}), best val {h['best_val']:.4f}, test {test_err:.4f}")
    print("val every 100 steps:", [round(v, 3) for v in h["val"][::4]])


def pretrain(variant: str = "lifted", max_steps: int | None = None) -> None:
    import torch

    torch.set_num_threads(1)
    p = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    pt = dict(p["pretrain"], **({} if max_steps is None else {"max_steps": max_steps}))
    key = method.PRETRAIN_KEY[variant]
    pre = method.make_pretrain_set(np.random.default_rng(2), pt["shapes"] + pt["val_shapes"], p["panels"],
                                   pt["queries"], p["walk_steps"], p["step_range"])
    held = np.arange(pt["shapes"], pt["shapes"] + pt["val_shapes"])
    m = GeometrySimulator(**p["network"], out_dim=2, seed=0)
    m.new_head(pre[key].shape[-1], 0)
    t0 = time.process_time()
    m, h = method.fit(m, pre, np.arange(pt["shapes"]), key, pt, 7, method._tensors(pre, held, key, p["val_points"]))
    print(f"pretrain {variant}: fit {time.process_time() - t0:.1f} CPU s, {h['stop_step']} steps, plateau "
          f"{h['plateau']}, lr {h['lr_chosen']:g} (pilot {h['lr_pilot']}), best held-out rel L2 {h['best_val']:.4f}")
    print("val every 100 steps:", [round(v, 3) for v in h["val"][::4]])


if __name__ == "__main__":
    if sys.argv[1:2] == ["pretrain"]:
        pretrain(*(sys.argv[2:3] or ["lifted"]), *(int(a) for a in sys.argv[3:4]))
    else:
        main(*(int(a) for a in sys.argv[1:3]))
