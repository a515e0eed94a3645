"""The learning-rate grid on validation data: the same grid and protocol for every learned model.

    python -m reprozoo.methods.cbit.lr_grid [--scale smoke] [--seed 0] [--lrs 1e-3 3e-3 1e-2]
                                           [--variants cbit brits saits] [--set key=value ...]

Each (model, peak rate) is trained with ``method.fit`` exactly as in the pipeline (warm-up, constant
rate, stop at the gate's plateau or ``max_steps``) on every series of the scale's config, and scored
by its best validation masked MAE, averaged over the series (no test data is read). Prints linear
interpolation's error on the same validation windows and holes first (``--variants`` with no
model prints only that), then one row per (model, rate): validation MAE per series and mean, steps, whether it stopped on a plateau, CPU
seconds. Needs the scale's datasets in ``results/data`` (``reprozoo datasets fetch NAME --scale S``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import yaml


def main(argv=None) -> list[dict]:
    from ...runtime import RunContext
    from ...blocks.imputation import linear_interpolation
    from .method import fit, impute_classical, load_series, val_masks, window_errors, windows

    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
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
        for lr in a.lrs:
            ctx = RunContext(method="cbit", variant=v, seed=a.seed, scale=a.scale, params=params, data=data,
                             outdir=Path("/tmp"))
            row = {"variant": v, "lr": lr, "val": {}, "steps": {}, "flat": {}, "cpu_s": 0.0}
            for name in params["series"]:
                _, rec = fit(ctx, v, name, load_series(ctx, name), lr=lr)
                row["val"][name] = rec["best_val"]
                row["steps"][name] = rec["steps"][-1]
                row["flat"][name] = rec["stopped"]
                row["cpu_s"] += rec["cpu_s"]
            row["mean"] = sum(row["val"].values()) / len(row["val"])
            rows.append(row)
            print(f"{v:6s} lr {lr:.0e}: val MAE " + ", ".join(f"{k} {x:.3f}" for k, x in row["val"].items())
                  + f", mean {row['mean']:.3f}; steps " + ", ".join(f"{k} {row['steps'][k]}"
                                                                     f"{'' if row['flat'][k] else ' (cap)'}"
                                                                     for k in row["steps"])
                  + f"; {row['cpu_s']:.1f} CPU-s", flush=True)
    for v in a.variants:
        best = min((r for r in rows if r["variant"] == v), key=lambda r: r["mean"])
        print(f"best peak lr for {v}: {best['lr']:.0e} (mean validation MAE {best['mean']:.3f})")
    print(yaml.safe_dump({"linear_reference": ref, "rows": rows}, sort_keys=False))
    return rows


if __name__ == "__main__":
    main()
