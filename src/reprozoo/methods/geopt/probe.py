"""Feasibility probe (not part of the pipeline): with the smoke config's training rule, does one fit
reach the convergence gate's plateau, at what error, and at what cost?

    nice -n 19 .venv/bin/python -m reprozoo.methods.geopt.probe [N] [MAX_STEPS] [key=value ...]
    nice -n 19 .venv/bin/python -m reprozoo.methods.geopt.probe pretrain [VARIANT] [MAX_STEPS] [key=value ...]

The first form draws the smoke config's flows for seed-0-like data (128 + 32 validation + n_test test
shapes, 96 points) and fits one scratch model on the first N with ``method.fit`` exactly as
``train`` does; the ``pretrain`` form fits one pre-training (``lifted`` or ``static_vec``) on the
smoke config's unlabelled shapes (seed-0-like) the same way. ``MAX_STEPS`` replaces the config's
step limit (with the smoke config's ``schedule: cosine``, the schedule's length); ``key=value`` replaces a
key of the fit's config (``schedule=constant min_steps=400 lr_drop=0.1`` is the rule before issue 26's third
round, as the earlier probes on the page ran it: there ``min_steps=2000`` keeps a fit from stopping and
``drop_at=400`` forces the rate drop), ``net.KEY=value`` a key of the
network, ``seed=S`` the pipeline seed whose data, initial weights and fit seed it reproduces (default
0), ``fit_seed=S`` the fit's seed (default seed + 2 for fine-tuning, seed + 7 for pre-training) and, for
pre-training, ``shapes=`` / ``queries=`` the unlabelled set. It prints the CPU seconds, steps,
plateau flag, the learning-rate pilot scores, best validation (and, fine-tuning, test) relative L2,
the convergence gate's tail improvement (``claims.tail_fit``) at the end, the first evaluation from
step 200 on where it is at most 2 % and 1 %, and the validation curve every 100 steps. The
numbers quoted on the page come from this script.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from . import method
from .model import GeometrySimulator


def _overrides(args: list[str]) -> tuple[dict, dict, dict]:
    fit, net, other = {}, {}, {}
    for a in args:
        k, v = a.split("=", 1)
        v = yaml.safe_load(v)
        if k.startswith("net."):
            net[k[4:]] = v
        elif k in ("fit_seed", "shapes", "queries", "seed"):
            other[k] = v
        else:
            fit[k] = v
    return fit, net, other


def _report(label: str, cpu: float, h: dict, extra: str = "") -> None:
    from ...claims import tail_fit

    st, v = h["step"], h["val"]
    first = {tol: next((s for i, s in enumerate(st) if s >= 200
                        and tail_fit(st[:i + 1], v[:i + 1])["improvement"] <= tol), None) for tol in (0.02, 0.01)}
    pilot = {k: round(x, 4) for k, x in h["lr_pilot"].items()}
    print(f"{label}: fit {cpu:.1f} CPU s, {h['stop_step']} steps, plateau {h['plateau']}, lr {h['lr_chosen']:g} "
          f"(pilot {pilot}), drop {h['drop_step']}, best val {h['best_val']:.4f}{extra}, gate tail improvement "
          f"{tail_fit(st, v)['improvement']:.3f}, first <= 2 % at step {first[0.02]}, <= 1 % at {first[0.01]}")
    print("val at steps 100, 200, ...:", [round(x, 4) for s, x in zip(st, v) if s % 100 == 0])


def main(n: int = 128, max_steps: int | None = None, *args: str) -> None:
    import torch

    torch.set_num_threads(1)
    fit_over, net_over, other = _overrides(list(args))
    p = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    n_max = max(p["n_labels"])
    seed = int(other.get("seed", 0))
    flows = method.make_flow_set(np.random.default_rng(seed * 1_000_003 + 1), n_max + p["n_val"] + p["n_test"], p["panels"],
                                 p["queries"], p["cond_step"])
    val = method._tensors(flows, np.arange(n_max, n_max + p["n_val"]), "y", p["val_points"])
    test = method._tensors(flows, np.arange(n_max + p["n_val"], n_max + p["n_val"] + p["n_test"]), "y")
    cfg = dict(p["finetune"], **({} if max_steps is None else {"max_steps": max_steps}))
    cfg.update(fit_over)
    model = GeometrySimulator(**{**p["network"], **net_over}, out_dim=2, seed=seed)
    t0 = time.process_time()
    m, h = method.fit(model, flows, np.arange(n), "y", cfg, other.get("fit_seed", seed + 2), val)
    cpu = time.process_time() - t0
    test_err = float(np.sqrt(method.per_shape_sq_error(m, test).mean()))
    _report(f"scratch N {n} {' '.join(args)}", cpu, h, f", test {test_err:.4f}")


def pretrain(variant: str = "lifted", max_steps: int | None = None, *args: str) -> None:
    import torch

    torch.set_num_threads(1)
    fit_over, net_over, other = _overrides(list(args))
    p = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    pt = dict(p["pretrain"], **({} if max_steps is None else {"max_steps": max_steps}))
    pt.update({k: other[k] for k in ("shapes", "queries") if k in other}, **fit_over)
    key = method.PRETRAIN_KEY[variant]
    seed = int(other.get("seed", 0))
    pre = method.make_pretrain_set(np.random.default_rng(seed * 1_000_003 + 2), pt["shapes"] + pt["val_shapes"], p["panels"],
                                   pt["queries"], p["walk_steps"], p["step_range"])
    held = np.arange(pt["shapes"], pt["shapes"] + pt["val_shapes"])
    m = GeometrySimulator(**{**p["network"], **net_over}, out_dim=2, seed=seed)
    m.new_head(pre[key].shape[-1], seed)
    t0 = time.process_time()
    m, h = method.fit(m, pre, np.arange(pt["shapes"]), key, pt, other.get("fit_seed", seed + 7),
                      method._tensors(pre, held, key, p["val_points"]))
    _report(f"pretrain {variant} {' '.join(args)}", time.process_time() - t0, h)


if __name__ == "__main__":
    argv = sys.argv[1:]
    pos = [a for a in argv if "=" not in a]
    kv = [a for a in argv if "=" in a]
    if pos[:1] == ["pretrain"]:
        pretrain(pos[1] if len(pos) > 1 else "lifted", int(pos[2]) if len(pos) > 2 else None, *kv)
    else:
        main(int(pos[0]) if pos else 128, int(pos[1]) if len(pos) > 1 else None, *kv)
