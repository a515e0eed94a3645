"""The pipeline's fits outside the pipeline, on validation data only: the same grid and protocol for
every learned model.

    python -m reprozoo.methods.cbit.lr_grid [--scale smoke] [--seed 0] [--lrs 1e-3 3e-3 1e-2]
                                           [--variants cbit brits saits] [--set key=value ...]

Each model is trained with ``method.fit`` exactly as in the pipeline (``blocks.fitting.fit_to_plateau``:
the config's rate grid piloted, the chosen rate to a plateau, one drop) on every series of the scale's
config, piloting the config's grid ``fit.lr_grid`` (the config's ``lr`` table, the rates the pipeline
trains at, is ignored here: this script is how that table was chosen, with ``max_steps`` set to
``pilot_steps`` so that only the pilots run; see configs/smoke.yaml); ``--lrs`` replaces the grid (one
rate: that rate alone, no pilot choice). Prints each rate's pilot
score, the chosen rate, the steps, whether it stopped on a plateau, the best validation masked MAE (no
test data is read). Prints linear
interpolation's error on the same validation windows and holes first (``--variants`` with no
model prints only that), then one row per (model, rate): validation MAE per series and mean, steps, whether it stopped on a plateau, CPU
seconds. Needs the scale's datasets in ``results/data`` (``reprozoo datasets fetch NAME --scale S``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import yaml


def main(argv=None) -> list[dict]:
    from ...claims import tail_fit
    from ...runtime import RunContext
    from ...blocks.imputation import linear_interpolation
    from .method import fit, impute_classical, load_series, val_masks, window_errors, windows

    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lrs", type=float, nargs="+", default=None)
    ap.add_argument("--variants", nargs="*", default=["cbit", "brits", "saits"])
    ap.add_argument("--root", default=".")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config keys (YAML values)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    here = Path(__file__).parent
    params = yaml.safe_load((here / "configs" / f"{a.scale}.yaml").read_text())
    for kv in a.set:
        key, _, val = kv.partition("=")
        params[key] = yaml.safe_load(val)
    spec = yaml.safe_load((here / "spec.yaml").read_text())
    data = {d: Path(a.root) / "results" / "data" / d / a.scale for d in spec["datasets"]}
    rows = []
    W = int(params["window"])
    ref = {}
    for name in params["series"]:  # reference: linear interpolation on the same validation windows and holes
        ctx = RunContext(method="cbit", variant="linear", seed=a.seed, scale=a.scale, params=params, data=data,
                         outdir=Path("/tmp"))
        ds = load_series(ctx, name)
        xv = windows(ds["val"], W)
        ref[name] = float(sum(window_errors(impute_classical(linear_interpolation, xv, seen), xv, ev)[0].mean()
                              for seen, ev in val_masks(ctx, name, xv.shape, windows(ds["obs_val"], W)))
                          / 2)
    print("linear interpolation (reference): val MAE " + ", ".join(f"{k} {x:.3f}" for k, x in ref.items()),
          flush=True)
    for v in a.variants:
        for lrs in ([a.lrs] if a.lrs is None or len(a.lrs) > 1 else [[x] for x in a.lrs]):
            ctx = RunContext(method="cbit", variant=v, seed=a.seed, scale=a.scale, params=params, data=data,
                             outdir=Path("/tmp"))
            row = {"variant": v, "grid": lrs or params["fit"]["lr_grid"], "val": {}, "steps": {}, "flat": {},
                   "lr": {}, "pilots": {}, "cpu_s": 0.0}
            for name in params["series"]:
                # the pilot reads no test data of any seed of the scale (load_series' pilot_seeds)
                ds = load_series(ctx, name, pilot_seeds=params.get("seeds", [a.seed]))
                _, rec = fit(ctx, v, name, ds, lr_grid=lrs or params["fit"]["lr_grid"])
                row["val"][name] = float(min(rec["vals"]))
                row["steps"][name] = rec["stop"]
                row["flat"][name] = rec["plateau"]
                row["lr"][name] = rec["lr"]
                row["pilots"][name] = rec["pilot_best"]
                row.setdefault("tail", {})[name] = float(tail_fit(rec["steps"], rec["vals"])["improvement"])
                row["cpu_s"] += rec["cpu_s"]
            row["mean"] = sum(row["val"].values()) / len(row["val"])
            rows.append(row)
            print(f"{v:10s}: " + "; ".join(f"{k}: lr {row['lr'][k]:g}, val MAE {row['val'][k]:.3f}, {row['steps'][k]} steps"
                                         f"{'' if row['flat'][k] else ' (cap)'}, tail {100 * row['tail'][k]:+.1f} %, pilots "
                                         + ", ".join(f"{r:g} {x:.3f}" for r, x in row["pilots"][k].items())
                                         for k in row["val"]) + f"; {row['cpu_s']:.1f} CPU-s", flush=True)
    print(yaml.safe_dump({"linear_reference": ref, "rows": rows}, sort_keys=False))
    return rows


if __name__ == "__main__":
    main()
