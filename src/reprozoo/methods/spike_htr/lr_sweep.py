"""Choose each variant's learning rate from one grid, on validation:
``python -m reprozoo.methods.spike_htr.lr_sweep [scale] [variant ...]``.

Every variant trains on seed 0's lines once per value of ``optim.lr_grid`` (the same grid for
every variant) with the pipeline's own stopping rule (``method.fit``: a plateau of the validation
CTC loss by the convergence gate's test, between ``min_steps`` and ``max_steps``). The chosen rate
is the one with the lowest plateau level (median validation CTC loss over the last 30 % of the
run) among the rates whose run reached its plateau (stopped before ``max_steps``); only if none
did, among all. The test lines are never read. Prints one row per run and the ``lr_by_variant``
block that the scale's config then fixes (a pipeline run does not repeat the sweep: it would
triple the training budget of every cell).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ...claims import tail_fit
from . import method as M


def plateau_level(steps, values) -> float:
    """The level a run ends at: the median of its curve over the gate's tail (``claims.tail_fit``)."""
    start = tail_fit(steps, values, "min")["tail_start"]
    return float(np.median([y for x, y in zip(steps, values) if x >= start]))


def sweep(params: dict, variants=None, seed: int = 0, log=print) -> dict:
    import torch

    from . import data as D

    torch.set_num_threads(1)
    raw = M._splits(params, seed)
    splits = {}
    for s in ("train", "val"):
        X, texts = raw[s]
        flat, lens = D.pack(texts)   # classes 1..K, as train_shared stores them
        offs = np.concatenate([[0], np.cumsum(lens)])
        splits[s] = (torch.from_numpy(X).unsqueeze(1), [list(flat[offs[i]:offs[i + 1]]) for i in range(len(lens))])
    chosen = {}
    for v in variants or list(M.VARIANTS):
        rows = {}
        for lr in params["optim"]["lr_grid"]:
            torch.manual_seed(seed)
            model = M.build(params, v, splits["train"][0].shape[2])
            rec = M.fit(model, splits, params, seed, float(lr))
            flat = rec["steps"][-1] < int(params["optim"]["max_steps"])
            rows[float(lr)] = (plateau_level(rec["steps"], rec["val_ctc"]), flat)
            log(f"{v:16s} lr {float(lr):8.1e}  steps {rec['steps'][-1]:5d}  plateau val CTC {rows[float(lr)][0]:7.3f}  "
                f"val CER {plateau_level(rec['steps'], rec['val_cer']):.3f}  flat {flat}  cpu {rec['cpu_s']:.1f} s")
        ok = {lr: r for lr, r in rows.items() if r[1]} or rows
        chosen[v] = min(ok, key=lambda lr: ok[lr][0])
    return chosen


def main(argv=None) -> None:
    import yaml

    argv = list(sys.argv[1:] if argv is None else argv)
    scale = argv.pop(0) if argv else "smoke"
    params = yaml.safe_load((Path(__file__).parent / "configs" / f"{scale}.yaml").read_text())
    chosen = sweep(params, argv or None, log=lambda s: print(s, flush=True))
    print("lr_by_variant: {" + ", ".join(f"{v}: {lr:g}" for v, lr in chosen.items()) + "}")


if __name__ == "__main__":
    main()
