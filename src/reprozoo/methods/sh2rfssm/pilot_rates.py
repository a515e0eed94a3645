"""Choose every model's learning rate per task once, on validation, on a pilot seed no claim reads (round 9).

The same procedure for every variant (review of 34b630e: rates had been fixed on seed 0, a claim seed,
and ``lif_ssm`` piloted per seed at chance-level pilots):

1. the shared rule's pilots (``train.pilot_steps`` steps from the same initial weights and batches,
   one per rate of ``train.lr_grid``), scored by the rule's pilot score (mean of the pilot's second
   half of validation losses), bracketed beyond an edge choice as :func:`method.fit_bracketed` does;
2. where no pilot has *learned* by the rule's own measure (best validation loss ``train.min_progress``
   below its start: a pilot on the task's chance plateau ranks rates by how little they moved), every
   rate of the grid is instead fitted whole by the rule (:func:`method.fit`'s settings: plateau, drop,
   second plateau or ``max_steps``) and the rate with the lowest best validation loss among the fits
   that pass the convergence gate's tail test wins (all of them if none passes).

Test data are never read. The table it prints is ``train.lr_fixed`` (read by :func:`method.fixed_rate`
through ``blocks.rate_table``); the grid stays in the config so the choice can be rerun:

    nice -n 15 .venv/bin/python -m reprozoo.methods.sh2rfssm.pilot_rates --seed 100 [--variants ...] [--tasks ...]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from . import method as M

HERE = Path(__file__).parent
GATE_TOL = 0.02  # the convergence gate's tolerance (reprozoo.claims)


def _setup(task, variant, p, seed):
    import torch

    from .model import build

    options = M.VARIANTS[variant]
    d_in, n_out = M._task_io(task, p)
    L = M._lengths(task, p, options["family"] == "ssm")[0]
    data = M.TaskData(task, L, p, seed)
    bs = int(p["train"]["batch"])

    def make_model(gen):
        torch.manual_seed(int(torch.randint(0, 2 ** 62, (1,), generator=gen)))
        return build(options["family"], d_in, n_out, L, options, p["arch"])

    def train_loss(model, gen):
        xb, yb = data.batch(bs, gen)
        return M._loss(model(xb)[0], yb, task)

    k = M.n_classes(task, p)

    def val_loss(model):
        return M._evaluate(model, task, *data.val, int(p["train"]["eval_batch"]), k)[0]

    return make_model, train_loss, val_loss, data.base, L


def choose(task, variant, p, seed, log=print) -> dict:
    from ...blocks.fitting import fit_to_plateau
    from ...claims import tail_fit

    tr = p["train"]
    rule = dict(tr, scale=M.STOP_SCALE.get(task, "value"))
    rule.pop("lr_fixed", None)
    make_model, train_loss, val_loss, base, L = _setup(task, variant, p, seed)
    n, need = int(tr["pilot_steps"]), float(tr["min_progress"])
    quiet = lambda *_: None  # noqa: E731

    def pilot(lr):
        _, rec = fit_to_plateau(make_model, train_loss, val_loss,
                                dict(rule, lr_grid=[lr], min_steps=n, max_steps=n, lr_drop=0), base, progress=quiet)
        v = [float(y) for x, y in zip(rec["steps"], rec["vals"]) if x <= n]
        return float(rec["pilot_best"][lr]), bool(v) and v[0] - min(v) >= need * abs(v[0])

    grid = sorted(float(r) for r in tr["lr_grid"])
    pilots = {r: pilot(r) for r in grid}
    best = min(grid, key=lambda r: pilots[r][0])
    edge = "top" if best == grid[-1] else "bottom" if best == grid[0] else None
    for _ in range(int(tr.get("extend_edge") or 0) if edge else 0):
        extra = float(f"{best * (grid[-1] / grid[-2] if edge == 'top' else grid[0] / grid[1]):.3g}")
        pilots[extra] = pilot(extra)
        if pilots[extra][1] and pilots[extra][0] < pilots[best][0]:
            best = extra
        else:
            edge = None if pilots[best][1] else edge
            break
    row = {"variant": variant, "task": task, "seed": seed, "L": L,
           "pilots": {f"{r:g}": [round(s, 4), ok] for r, (s, ok) in sorted(pilots.items())}}
    if any(ok for _, ok in pilots.values()):
        row.update(rate=best, how="pilots", edge=edge)
        log(json.dumps(row))
        return row
    # no pilot left the chance plateau: whole fits at every rate of the grid, the rule's own fit
    fits = {r: whole_fit(task, variant, p, seed, r, log) for r in grid}
    ok = [r for r in grid if fits[r]["tail"] <= GATE_TOL] or grid
    best = min(ok, key=lambda r: fits[r]["best"])
    row.update(rate=best, how="whole fits", fits={f"{r:g}": f for r, f in fits.items()},
               edge="top" if best == grid[-1] else "bottom" if best == grid[0] else None)
    log(json.dumps(row))
    return row


def whole_fit(task, variant, p, seed, rate, log=print) -> dict:
    """One whole fit by the rule (method.fit's settings) at one rate: its best validation loss, steps,
    whether the rule's plateau held, and its gate tail improvement on the task's scale."""
    from ...blocks.fitting import fit_to_plateau
    from ...claims import tail_fit

    rule = dict(p["train"], scale=M.STOP_SCALE.get(task, "value"), lr_grid=[rate])
    rule.pop("lr_fixed", None)
    make_model, train_loss, val_loss, base, _ = _setup(task, variant, p, seed)
    t0 = time.process_time()
    _, rec = fit_to_plateau(make_model, train_loss, val_loss, rule, base, progress=lambda *_: None)
    tail = tail_fit(rec["steps"], rec["vals"], "min", rule["scale"])["improvement"]
    out = dict(best=round(float(min(rec["vals"])), 4), steps=int(rec["stop"]), plateau=bool(rec["plateau"]),
               tail=round(float(tail), 4), cpu_s=round(time.process_time() - t0, 1))
    log(json.dumps({"variant": variant, "task": task, "seed": seed, "whole_fit": rate, **out}))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--variants", nargs="*", default=list(M.VARIANTS))
    ap.add_argument("--tasks", nargs="*", default=None)
    ap.add_argument("--whole", type=float, default=None, help="only one whole fit at this rate (to run the "
                    "whole fits of step 2 side by side)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    p = yaml.safe_load((HERE / "configs" / f"{a.scale}.yaml").read_text())
    if a.whole is not None:
        for v in a.variants:
            for t in a.tasks or p["tasks"]:
                whole_fit(t, v, p, a.seed, a.whole, log=lambda s: print(s, flush=True))
        return
    for v in a.variants:
        for t in a.tasks or p["tasks"]:
            t0 = time.process_time()
            row = choose(t, v, p, a.seed, log=lambda s: print(s, flush=True))
            print(f"# {v} {t}: rate {row['rate']:g} ({row['how']}), {time.process_time() - t0:.1f} CPU-s", flush=True)


if __name__ == "__main__":
    main()
