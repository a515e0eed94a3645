"""Cost of a step: wall time, peak memory of torch tensors, and log-log scaling slopes.

Added for DKMP; generic (any callable).

``peak_tensor_bytes(fn)``: peak bytes of live torch tensors allocated during ``fn()`` above the
state at entry. On CPU, torch's allocator keeps no statistics and process RSS mixes in the
interpreter, the allocator's caching and other libraries, so we record every allocation and free
of torch's CPU allocator with the autograd profiler (``profile_memory=True``: each raw "[memory]"
event carries the signed byte count), replay them in time order and take the maximum of the
running sum. Tensors alive at entry (inputs, weights) are not counted; those created and still
alive at exit (outputs) are. On CUDA: ``torch.cuda.max_memory_allocated`` above the entry value.
The profiler slows the call down, so time and memory are measured in separate calls.

``median_seconds(fn, repeats, warmup)``: median wall time over ``repeats`` calls after warm-up.
``rss_high_water_mb()``: the process's RSS high-water mark (VmHWM), for whole-process checks
(in a fresh subprocess per configuration: it never goes down).
``loglog_slope(x, y)``: least-squares slope of log y against log x (the scaling exponent).
"""
from __future__ import annotations

import time

import numpy as np
import torch


def peak_tensor_bytes(fn, device: str = "cpu"):
    """(peak extra bytes of torch tensors during ``fn()``, ``fn()``'s result)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base), out
    from torch.autograd.profiler import profile

    with profile(profile_memory=True, use_kineto=False) as prof:
        out = fn()
    events = []
    for e in prof.kineto_results.events():
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"):
            events.append((e.start_ns(), e.nbytes()))
    events.sort(key=lambda t: t[0])
    cur = peak = 0
    for _, nb in events:
        cur += nb
        peak = max(peak, cur)
    return int(peak), out


def median_seconds(fn, repeats: int = 3, warmup: int = 1, device: str = "cpu") -> float:
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    for _ in range(max(0, warmup)):
        fn()
    sync()
    ts = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def rss_high_water_mb() -> float:
    """Peak resident set size of this process in MB: VmHWM from /proc (Linux; reset by exec, unlike
    ru_maxrss, which a child inherits from a larger parent), else ru_maxrss."""
    import resource
    import sys

    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0


def loglog_slope(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])
