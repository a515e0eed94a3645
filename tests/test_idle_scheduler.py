"""profiles/idle_scheduler.py: Snakemake's scheduler re-evaluates on job ends only, and after the
rate window only while the rate limit holds jobs back; the profiles load it."""
import importlib.util
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("idle_scheduler_under_test", ROOT / "profiles" / "idle_scheduler.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Limiter:
    timespan = 0.2

    def __init__(self, free):
        self.free = free

    def get_free_jobs(self):
        return self.free


def _scheduler(free):
    return SimpleNamespace(workflow=SimpleNamespace(dag=SimpleNamespace(queue_input_jobs=[])),
                           job_rate_limiter=None if free is None else _Limiter(free),
                           _open_jobs=threading.Semaphore(0))


def test_a_wakeup_is_armed_only_while_the_rate_limit_binds_and_only_one():
    mod = _module()
    for free in (None, 3):  # no limiter (dry run), or free slots: a job end will wake the scheduler
        s = _scheduler(free)
        mod._schedule_reevalutation(s, 0.05)
        assert not hasattr(s, "_reprozoo_timer")
        assert not s._open_jobs.acquire(timeout=0.2)
    s = _scheduler(0)  # the limit holds jobs back: one daemon wake-up after the window, however often asked
    for _ in range(5):
        mod._schedule_reevalutation(s, 0.1)
    assert s._reprozoo_timer.daemon
    assert s._open_jobs.acquire(timeout=2)
    assert not s._open_jobs.acquire(timeout=0.3)
    mod._schedule_reevalutation(s, 0.05)  # re-armed once the previous one fired
    assert s._open_jobs.acquire(timeout=2)


def test_input_sizes_are_looked_up_once():
    import asyncio

    mod = _module()
    calls = []

    class F(str):
        async def exists(self):
            calls.append(("exists", str(self)))
            return True

        async def size(self):
            calls.append(("size", str(self)))
            return len(self)

    a, b = F("a.txt"), F("bb.txt")
    s = SimpleNamespace(_input_sizes={})
    jobs = [SimpleNamespace(input=[a, b]), SimpleNamespace(input=[a])]
    asyncio.run(mod.update_input_sizes(s, jobs))
    assert s._input_sizes == {a: 5, b: 6} and len(calls) == 4
    asyncio.run(mod.update_input_sizes(s, jobs))
    assert len(calls) == 4  # nothing stat-ed again


def test_apply_patches_the_pinned_snakemake_once():
    from snakemake.scheduling.job_scheduler import JobScheduler

    mod = _module()
    saved = {k: JobScheduler.__dict__.get(k) for k in ("_schedule_reevalutation", "update_input_sizes",
                                                          "_reprozoo_idle_patch")}
    import snakemake.benchmark as bench

    interval = bench.BENCHMARK_INTERVAL_SHORT
    try:
        if saved["_reprozoo_idle_patch"]:
            del JobScheduler._reprozoo_idle_patch
        assert mod.apply() and mod.apply()
        assert JobScheduler._schedule_reevalutation is mod._schedule_reevalutation
        assert bench.BENCHMARK_INTERVAL_SHORT == 5.0
    finally:
        for k, v in saved.items():
            if v is None:
                if k in JobScheduler.__dict__:
                    delattr(JobScheduler, k)
            else:
                setattr(JobScheduler, k, v)
        bench.BENCHMARK_INTERVAL_SHORT = interval


@pytest.mark.integration
def test_a_run_with_the_profile_dispatches_under_a_rate_limit_and_exits_at_once(tmp_path):
    """The profile's patch in a real run: jobs held back by a rate limit still run (after the
    window), and without one Snakemake exits without waiting for a timer."""
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: expand("out/{i}.txt", i=range(4))\n'
        'rule one:\n    output: "out/{i}.txt"\n    shell: "touch {output}"\n')
    sm = [sys.executable, "-m", "snakemake", "--cores", "1", "-q"]
    proc = subprocess.run(sm + ["--max-jobs-per-timespan", "2/3s"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((tmp_path / "out").glob("*.txt"))) == 4
    shutil.rmtree(tmp_path / "out")
    shutil.rmtree(tmp_path / ".snakemake")
    t0 = time.perf_counter()
    proc = subprocess.run(sm + ["--max-jobs-per-timespan", "100/60s"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.perf_counter() - t0 < 45  # stock Snakemake waits out the 60 s timer before exiting
