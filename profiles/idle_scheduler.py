"""A local patch to Snakemake's job scheduler (9.27.1): no re-evaluation rounds while jobs run.

Why: Snakemake's scheduler loop (``snakemake/scheduling/job_scheduler.py``, ``JobScheduler.schedule``)
wakes on every job end and, at the bottom of every round in which jobs are ready, arms a
``threading.Timer`` for the ``--max-jobs-per-timespan`` window (default ``100/1s``) so that jobs held
back by the rate limit get another chance. The timer is armed whether or not the limit held anything
back, and every round arms one more: each job that ends while other jobs wait for a core starts
another once-a-second chain. Every wake-up re-runs the job selector over all ready jobs: their
params and resources are re-evaluated and every input is stat-ed three times (``update_input_sizes``:
``exists_local``, ``size``), although nothing can have changed (upstream: snakemake issues #3955,
#4240). On a 2-core run of the whole suite that was a quarter of a core for the whole run. The timer
threads are not daemons either, so Snakemake's exit waits for the last one.

No setting turns this off: any ``--max-jobs-per-timespan`` value builds a rate limiter (a larger
window only spaces the wake-ups and delays the exit by up to one window), and a profile cannot
unset the option. So both profiles (profiles/default, profiles/slurm) load this module, which
changes two methods of ``JobScheduler``:

- ``_schedule_reevalutation``: arms the timer only when the rate limiter has no free slot left
  (the only case in which a job end will not wake the scheduler when it can submit again), at most
  one at a time, as a daemon thread. Re-evaluations for queue inputs (``queue_input_wait_time``,
  unused here) keep Snakemake's behaviour.
- ``update_input_sizes``: stats only the input files it has not sized yet (a ready job's inputs are
  finished outputs; their sizes only rank jobs in the selector), instead of all inputs of all ready
  jobs in every round.

It also changes one constant of Snakemake's ``benchmark:`` sampler, which polls every running job
from the main process (psutil: the whole machine's process table to find the job's children, and their
``smaps``) every 0.5 s for its first 30 samples, then every 30 s: that was most of the
scheduling loop's CPU on ci-scale jobs of a few seconds.

- ``snakemake.benchmark.BENCHMARK_INTERVAL_SHORT``: 0.5 s -> 5 s. The benchmark files keep their wall
  time (``s``: measured from start to end, not sampled); their sampled CPU and memory columns get
  coarser, which costs nothing here: every job records its exact CPU seconds and peak memory itself
  (``<stage>.usage.json``, getrusage), and ``reprozoo budget`` reads those.

Job dispatch is unchanged: a job end, an error and the first round still wake the scheduler at
once. Measured by ``python -m benchmarks scheduler`` (README, "Benchmarks and budgets").

``apply()`` is idempotent and checks the methods it replaces still have the shape it expects
(the pinned Snakemake); otherwise it leaves Snakemake alone and says so. ``REPROZOO_IDLE_PATCH=0``
disables it.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading

_MARK = "_reprozoo_idle_patch"
BENCHMARK_SAMPLE_S = 5.0
EXPECTED = ("job_rate_limiter", "_open_jobs", "_input_sizes", "self._schedule_reevalutation(self.job_rate_limiter.timespan)")


def _expected_shape(cls) -> str | None:
    """None if ``cls`` looks like the scheduler this patch was written for, else what differs."""
    for name in ("_schedule_reevalutation", "update_input_sizes", "schedule"):
        if not callable(getattr(cls, name, None)):
            return f"JobScheduler.{name} is missing"
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return "the scheduler's source is unavailable"
    missing = [s for s in EXPECTED if s not in src]
    return f"the scheduler no longer mentions {missing}" if missing else None


def _schedule_reevalutation(self, delay) -> None:
    dag = self.workflow.dag
    if getattr(dag, "queue_input_jobs", None):  # queue inputs: Snakemake's own periodic re-evaluation
        return _schedule_reevalutation.original(self, delay)
    limiter = self.job_rate_limiter
    if limiter is None or limiter.get_free_jobs() > 0:
        return  # no rate limit, or it held nothing back: the next job end wakes the scheduler
    lock = self.__dict__.setdefault("_reprozoo_timer_lock", threading.Lock())
    with lock:
        pending = self.__dict__.get("_reprozoo_timer")
        if pending is not None and pending.is_alive():
            return  # one wake-up is already armed; it re-arms itself while the limit binds
        timer = threading.Timer(delay, self._open_jobs.release)
        timer.daemon = True  # Snakemake's exit never waits for it
        self._reprozoo_timer = timer
        timer.start()


async def update_input_sizes(self, jobs) -> None:
    async def get_size(path):
        return path, await path.size() if await path.exists() else None

    paths = {path for job in jobs for path in job.input}
    sizes = self._input_sizes
    new = [p for p in paths if sizes.get(p) is None]  # unknown, or missing when last seen
    if new:
        sizes.update(await asyncio.gather(*[get_size(p) for p in new]))
    if len(sizes) > 10000:  # as Snakemake does: forget files no ready job reads
        for path in [p for p in sizes if p not in paths]:
            del sizes[path]


def apply(verbose: bool = False) -> bool:
    """Patch ``snakemake.scheduling.job_scheduler.JobScheduler``; True if it is (now) patched."""
    if os.environ.get("REPROZOO_IDLE_PATCH", "1") == "0":
        return False
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler
    except ImportError:
        return False
    if getattr(JobScheduler, _MARK, False):
        return True
    why = _expected_shape(JobScheduler)
    if why:
        print(f"profiles/idle_scheduler.py: not applied ({why}); Snakemake's scheduler re-evaluates "
              "once a second while jobs wait (see that file)", file=sys.stderr)
        return False
    _schedule_reevalutation.original = JobScheduler._schedule_reevalutation
    update_input_sizes.original = JobScheduler.update_input_sizes
    JobScheduler._schedule_reevalutation = _schedule_reevalutation
    JobScheduler.update_input_sizes = update_input_sizes
    try:
        import snakemake.benchmark as bench

        bench.BENCHMARK_INTERVAL_SHORT = max(float(bench.BENCHMARK_INTERVAL_SHORT), BENCHMARK_SAMPLE_S)
    except (ImportError, AttributeError, TypeError, ValueError):
        pass
    setattr(JobScheduler, _MARK, True)
    if verbose:
        print("profiles/idle_scheduler.py: scheduler re-evaluates on job ends only", file=sys.stderr)
    return True

