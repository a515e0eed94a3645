"""The seed x unit bootstrap of claims on per-unit metrics: coverage and power on planted tables.

For each per-seed spread (0 to 0.15, against per-item noise 0.5 over 200 paired items and 3 seeds,
true effect 0.1), TABLES planted tables: how often the one-sided 95 % lower bound covers the
effect, how often the bootstrap (not the t fallback) gave the interval, and how often the claim
``acc@a - acc@b > 0`` holds with the units and with the per-seed values alone (Student-t).
docs/verdicts.md quotes these numbers. Writes benchmarks/results/unit_bootstrap.json;
``python -m benchmarks unit_bootstrap``.
"""
from __future__ import annotations

import numpy as np

from benchmarks import save_report
from reprozoo.claims import measure
from reprozoo.planted import unit_table

TABLES = 200
SPREADS = (0.0, 0.03, 0.05, 0.06, 0.08, 0.15)


def main() -> dict:
    rows = []
    for sd in SPREADS:
        rng = np.random.default_rng(1)
        cover = boot = holds_units = holds_seeds = 0
        for _ in range(TABLES):
            t = unit_table(rng, delta=0.1, seed_sd=sd)
            m = measure("acc@a - acc@b", ">", 0.0, t, [0, 1, 2])
            s = measure("acc@a - acc@b", ">", 0.0, t[~t.metric.str.endswith("#unit")], [0, 1, 2])
            cover += m["ci_low"] <= 0.1
            boot += m["interval"] == "seed x unit bootstrap"
            holds_units += m["verdict"] == "holds"
            holds_seeds += s["verdict"] == "holds"
        row = {"seed_sd": sd, "coverage": cover / TABLES, "bootstrap_used": boot / TABLES,
               "holds_with_units": holds_units / TABLES, "holds_seeds_only": holds_seeds / TABLES}
        rows.append(row)
        print(row, flush=True)
    return save_report("unit_bootstrap", {"tables": TABLES, "effect": 0.1, "units": 200, "seeds": 3,
                                          "noise": 0.5, "rows": rows})


if __name__ == "__main__":
    main()
