"""CBiT: inference time against sequence length, with BRITS and full-context SAITS in the same run.

The three models at the smoke configuration's sizes (configs/smoke.yaml, untrained: the cost does
not depend on the weights), C = 40 channels (Lorenz-96), 30 % of the entries missing at random.
Each model gets the whole sequence as context: CBiT through its compressed history (partitions of
``chunk`` steps, cost O(T)), BRITS through its recurrence (O(T)), SAITS through global attention
(O(T^2)). Interleaved, median of REPEATS CPU seconds, one thread. Reported: time per length, the
fitted log-log slope over the lengths, and CBiT's time as a ratio of BRITS' at each length.

Writes benchmarks/results/cbit.json. ``python -m benchmarks cbit``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from benchmarks import save_report

REPEATS = 3
C = 40
LENGTHS = (256, 512, 1024, 2048, 4096)
SAITS_MAX = 2048  # global attention beyond this costs more memory and time than the benchmark is worth


def main() -> dict:
    import torch
    import yaml

    from reprozoo.methods.cbit.models import build

    torch.set_num_threads(1)
    root = Path(__file__).resolve().parents[1]
    p = yaml.safe_load((root / "src/reprozoo/methods/cbit/configs/smoke.yaml").read_text())
    torch.manual_seed(0)
    models = {v: build(v, C, p).eval() for v in ("cbit", "brits", "saits")}
    rng = np.random.default_rng(0)
    secs = {v: {} for v in models}
    for T in LENGTHS:
        x = torch.tensor(rng.standard_normal((1, T, C)), dtype=torch.float32)
        m = torch.tensor(rng.random((1, T, C)) >= 0.3, dtype=torch.float32)
        runs = {v: [] for v in models if v != "saits" or T <= SAITS_MAX}
        with torch.no_grad():
            for v in runs:  # warm-up
                models[v](x * m, m)
            for _ in range(REPEATS):
                for v in runs:
                    t0 = time.process_time()
                    models[v](x * m, m)
                    runs[v].append(time.process_time() - t0)
        for v, r in runs.items():
            secs[v][T] = float(np.median(r))
        print(f"T={T:5d}: " + ", ".join(f"{v} {secs[v][T]:.3f} s" for v in runs), flush=True)
    report = {"repeats": REPEATS, "channels": C, "threads": 1, "config": "configs/smoke.yaml",
              "seconds": {v: {str(T): s for T, s in d.items()} for v, d in secs.items()}, "slope": {},
              "ratio_cbit_vs_brits": {str(T): secs["cbit"][T] / secs["brits"][T] for T in LENGTHS}}
    for v, d in secs.items():
        Ts = sorted(d)
        report["slope"][v] = float(np.polyfit(np.log(Ts), np.log([d[T] for T in Ts]), 1)[0])
    print("log-log slope of CPU time vs T: " + ", ".join(f"{v} {s:.2f}" for v, s in report["slope"].items())
          + "; CBiT / BRITS time: " + ", ".join(f"{T}: {r:.2f}" for T, r in report["ratio_cbit_vs_brits"].items()),
          flush=True)
    return save_report("cbit", report)


if __name__ == "__main__":
    main()
