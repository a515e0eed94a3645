"""Peak memory and throughput measurement, CPU and GPU.

Peak memory on CPU: tracemalloc does not see torch's allocations, and RSS high-water marks mix
in the interpreter, the allocator's caching and other libraries. We record every allocation and
free made by torch's CPU allocator during the call with the (legacy, low-overhead) autograd
profiler (``profile_memory=True``; its raw "[memory]" events carry the signed byte count of each
allocation/free), replay them in time order and take the maximum of the running sum: the peak of
live tensor bytes above the state at entry (inputs already allocated are not counted, outputs
still alive at exit are). On CUDA: ``torch.cuda.max_memory_allocated`` above the entry value.
"""
from __future__ import annotations

import time

import torch


def _cpu_memory_events(fn):
    from torch.autograd.profiler import profile

    with profile(profile_memory=True, use_kineto=False) as prof:
        out = fn()
    events = [(e.start_ns(), k, e.nbytes()) for k, e in enumerate(prof.kineto_results.events())
              if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    events.sort()
    return [nb for _, _, nb in events], out


def largest_allocation(fn) -> int:
    """Bytes of the largest single CPU tensor allocation made during fn()."""
    sizes, _ = _cpu_memory_events(fn)
    return max([0] + sizes)


def peak_bytes(fn, device: str = "cpu"):
    """(peak extra bytes of torch tensors during fn(), fn's result)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out
    sizes, out = _cpu_memory_events(fn)
    cur = peak = 0
    for nb in sizes:
        cur += nb
        peak = max(peak, cur)
    return peak, out


def timed(fn, repeats: int = 3, min_time: float = 0.0, device: str = "cpu"):
    """Median wall seconds of fn() over repeats (one warm-up call first)."""
    sync = (lambda: torch.cuda.synchronize()) if str(device).startswith("cuda") else (lambda: None)
    fn()
    sync()
    ts = []
    t_all = time.perf_counter()
    while len(ts) < repeats or time.perf_counter() - t_all < min_time:
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]
