"""Choose each variant's learning rate from one grid, on validation: ``python -m reprozoo.methods.ttfs.lr_sweep [scale]``.

Every variant trains on seed 0's split of each data set once per value of ``lr_grid`` (the same
grid for every variant), with the same stopping rule as the pipeline (a plateau of the
validation loss by the convergence gate's test, between ``min_steps`` and ``max_steps``). The
chosen rate is the one with the lowest plateau level (the median validation loss over the last
30 % of the run) among the rates whose run reached its plateau (stopped before ``max_steps``, or
flat by the gate's test there); only if none did, among all. The test split is never read. Prints the table and the ``lr_by_variant`` block
that the scale's config then fixes (a pipeline run does not repeat the sweep: it would triple the
training budget of every cell).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import yaml
from ...claims import tail_fit
from . import method as M


class _Collect:
    def __init__(self):
        self.scalars, self.curves = {}, {}

    def scalar(self, k, v):
        self.scalars[k] = v

    def units(self, k, v):
        self.scalars[k] = float(np.mean(v))

    def curve(self, k, x, y):
        self.curves[k] = (list(x), list(y))


def plateau_level(steps, values, tail: float = 0.3) -> float:
    """Median of a curve over its last ``tail`` of training."""
    xs, ys = np.asarray(steps, float), np.asarray(values, float)
    return float(np.median(ys[xs >= xs[0] + (1 - tail) * (xs[-1] - xs[0])]))


def sweep(params: dict, variants=None, seed: int = 0) -> dict:
    import torch

    torch.set_num_threads(1)
    variants = list(variants or M.VARIANTS)
    chosen: dict = {v: {} for v in variants}
    for i, name in enumerate(params["datasets"]):
        arrays = M._load_dataset(name, params, _rng(seed, i))
        for v in variants:
            levels, flat = {}, {}
            for lr in params["lr_grid"]:
                m = _Collect()
                M.fit_and_measure(name, arrays, M.VARIANTS[v], params, seed, m, lambda s: None, lr=float(lr))
                x, y = m.curves[f"val_loss_{name}"]
                levels[float(lr)] = plateau_level(x, y)
                flat[float(lr)] = x[-1] < int(params["max_steps"]) or \
                    tail_fit(x, y, "min", min_points=int(params.get("min_tail_points", 6)))["improvement"] <= M.PLATEAU_TOL
                print(f"{name:7s} {v:13s} lr {float(lr):g}: plateau val loss {levels[float(lr)]:.4f} "
                      f"({int(m.scalars[f'steps_{name}'])} steps{'' if flat[float(lr)] else ', no plateau'})", flush=True)
            pool = [lr for lr in levels if flat[lr]] or list(levels)
            chosen[v][name] = min(pool, key=levels.get)
    return chosen


def _rng(seed: int, i: int) -> np.random.Generator:
    """The generator ``train_shared`` draws data set ``i`` of seed ``seed`` with (``runtime``'s ``ctx.rng(i)``)."""
    return np.random.default_rng(seed * 1_000_003 + i)


if __name__ == "__main__":
    scale = sys.argv[1] if len(sys.argv) > 1 else "smoke"
    params = yaml.safe_load((Path(__file__).parent / "configs" / f"{scale}.yaml").read_text())
    out = sweep(params)
    print("lr_by_variant:")
    for v, d in out.items():
        print(f"  {v}: {{{', '.join(f'{k}: {val:g}' for k, val in d.items())}}}")
