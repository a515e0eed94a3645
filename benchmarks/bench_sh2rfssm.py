"""Harmonic RF SSM layer: FFT (parallel) path against the sequential IMEX recurrence, same run.

One layer of ``methods.sh2rfssm.model`` (C = 16 channels, batch 1, one thread), forward only:

* ``fft``: the closed-form IMEX kernel (``imex_kernel``, via ``blocks.spiking.rf_kernel``) and its
  zero-padded FFT convolution (``blocks.spiking.causal_fft_conv``), the whole cost of the path;
* ``recurrence``: ``imex_recurrence``, the two-state update step by step (the oracle: the two paths
  are checked equal before timing).

L from 1k to 50k. Wall time: best of REPEATS interleaved rounds (the machine is shared: the minimum
is the least noisy). Peak memory: each (path, L) runs once in a forked child and reports the growth
of its peak resident set over its start (MB). The log-log slope of time against L is fitted per
path; the FFT path should grow as L log L (slope slightly above 1 over this range, where the
per-call overhead fades), the recurrence as L with a far larger constant; ratios are recurrence
time / FFT time (> 1: the FFT path is faster).

Writes benchmarks/results/sh2rfssm.json. ``python -m benchmarks sh2rfssm``.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np
from benchmarks import save_report

REPEATS = 3
LENGTHS = (1000, 2000, 5000, 10000, 20000, 50000)
CHANNELS = 16


def _paths():
    import torch

    from reprozoo.blocks.spiking import causal_fft_conv
    from reprozoo.methods.sh2rfssm.model import imex_kernel, imex_recurrence

    omega = torch.linspace(0.1, 1.0, CHANNELS)
    b = 0.03 * omega
    return {"fft": lambda x: causal_fft_conv(x, imex_kernel(omega, b, x.shape[-1])),
            "recurrence": lambda x: imex_recurrence(x, omega, b)}


def _peak_child(name, L, q):
    import torch

    torch.set_num_threads(1)
    fn = _paths()[name]
    x = torch.randn(1, CHANNELS, L)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.no_grad():
        fn(x)
    q.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)


def _peak_mb(name, L):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_peak_child, args=(name, L, q))
    p.start()
    out = q.get()
    p.join()
    return out


def main() -> dict:
    import torch

    torch.set_num_threads(1)
    paths = _paths()
    report = {"repeats": REPEATS, "channels": CHANNELS, "threads": 1, "lengths": list(LENGTHS), "results": {}}
    with torch.no_grad():
        x = torch.randn(2, CHANNELS, 3000, dtype=torch.float32)
        ref = paths["recurrence"](x)
        err = float((paths["fft"](x) - ref).abs().max() / ref.abs().max())
    report["fft_vs_recurrence_rel_err"] = err
    times = {k: [] for k in paths}
    for L in LENGTHS:
        x = torch.randn(1, CHANNELS, L)
        runs = {k: [] for k in paths}
        with torch.no_grad():
            for _ in range(REPEATS):  # interleaved rounds
                for k, f in paths.items():
                    t0 = time.perf_counter()
                    f(x)
                    runs[k].append(time.perf_counter() - t0)
        row = {"s": {k: float(min(v)) for k, v in runs.items()},
               "peak_mb": {k: round(_peak_mb(k, L), 1) for k in paths}}
        row["ratio_recurrence_to_fft"] = round(row["s"]["recurrence"] / row["s"]["fft"], 1)
        for k in paths:
            times[k].append(row["s"][k])
        report["results"][str(L)] = row
        print(f"L={L}: fft {1e3 * row['s']['fft']:.2f} ms ({row['peak_mb']['fft']} MB), recurrence "
              f"{1e3 * row['s']['recurrence']:.1f} ms ({row['peak_mb']['recurrence']} MB), "
              f"x{row['ratio_recurrence_to_fft']}", flush=True)
    lx = np.log(LENGTHS)
    report["loglog_slope"] = {k: round(float(np.polyfit(lx, np.log(v), 1)[0]), 3) for k, v in times.items()}
    # L log L over the same lengths has this slope: the FFT path's expected value
    report["loglog_slope_of_L_log_L"] = round(float(np.polyfit(lx, np.log(np.array(LENGTHS) * lx), 1)[0]), 3)
    print(f"rel. error FFT vs recurrence {err:.1e}; log-log slopes {report['loglog_slope']} "
          f"(L log L: {report['loglog_slope_of_L_log_L']})", flush=True)
    return save_report("sh2rfssm", report)


if __name__ == "__main__":
    main()
