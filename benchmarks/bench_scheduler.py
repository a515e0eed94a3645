"""The Snakemake scheduler's own share of a run's CPU, stock settings against profiles/default.

One ci-scale pipeline of a few quick methods runs twice on 2 cores, each in a fresh temporary copy
of the workflow (same jobs, data generated again):

- ``before``: profiles/default without its ``idle-scheduler`` blocks (Snakemake's defaults: the ILP
  job selector, and a selector round once a second while jobs wait, each stat-ing every ready
  job's inputs);
- ``after``: profiles/default as it is (profiles/idle_scheduler.py, the greedy selector).

Snakemake runs in-process under a small launcher that, at exit, records the main process's own CPU
(``getrusage(RUSAGE_SELF)``: every thread of the Snakemake process, no children) split into
start-up (parsing, DAG), the scheduling loop (``JobScheduler.schedule``) and the end (hooks: the
deferred MLflow logging), and the CPU of every child it reaped (``RUSAGE_CHILDREN``: the jobs and
their own children; ILP solver processes counted apart, as scheduler cost). The scheduler's share
= (CPU of the scheduling loop + solver processes) / (all CPU of the run); the main process's
whole share is reported as well. It also counts the loop's rounds, job selections and the input
files stat-ed during selections.

    python -m benchmarks scheduler                        # default methods
    python benchmarks/bench_scheduler.py ftrl_regret milcci ...

Writes benchmarks/results/scheduler.json.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import save_report  # noqa: E402

# quick at ci (no torch import in most), several datasets and stages each
METHODS = ["ftrl_regret", "iterated_erm", "evodiverse", "verbalized_bp", "milcci", "prime_attention"]
COPY = ["Snakefile", "workflows", "envs", "config", "profiles", "src"]
BLOCK = re.compile(r"^# idle-scheduler:begin.*?^# idle-scheduler:end[^\n]*\n", re.S | re.M)

LAUNCHER = r'''
import atexit, json, os, resource, subprocess, sys, time
stats = {"rounds": 0, "selections": 0, "ready_jobs_seen": 0, "input_stats": 0, "solver_calls": 0,
         "solver_cpu_s": 0.0, "t0": time.perf_counter()}
_in_selection = [False]

def _ru_cpu(ru):
    return ru.ru_utime + ru.ru_stime

_orig_try_wait = subprocess.Popen._try_wait
def _try_wait(self, wait_flags):  # wait4: the reaped child's CPU, to tell solver processes apart
    try:
        pid, sts, ru = os.wait4(self.pid, wait_flags)
    except ChildProcessError:
        return self.pid, 0
    if pid and "cbc" in os.path.basename(str(self.args[0] if isinstance(self.args, (list, tuple)) else self.args).split()[0]):
        stats["solver_calls"] += 1
        stats["solver_cpu_s"] += _ru_cpu(ru)
    return pid, sts
subprocess.Popen._try_wait = _try_wait

from snakemake.io import _IOFile
from snakemake.scheduling import job_scheduler as js
_orig_size = _IOFile.size
async def _size(self):
    if _in_selection[0]:
        stats["input_stats"] += 1
    return await _orig_size(self)
_IOFile.size = _size

_orig_selector = js.JobScheduler.job_selector
def _job_selector(self, jobs):
    stats["selections"] += 1
    stats["ready_jobs_seen"] += len(jobs)
    _in_selection[0] = True
    try:
        return _orig_selector(self, jobs)
    finally:
        _in_selection[0] = False
js.JobScheduler.job_selector = _job_selector

class _CountingSemaphore:
    def __init__(self, sem):
        self.sem = sem
    def acquire(self, *a, **k):
        r = self.sem.acquire(*a, **k)
        stats["rounds"] += 1
        return r
    def release(self, *a, **k):
        return self.sem.release(*a, **k)

_orig_schedule = js.JobScheduler.schedule
def _schedule(self):
    self._open_jobs = _CountingSemaphore(self._open_jobs)
    stats["schedule_start_cpu_s"] = time.process_time()
    stats["schedule_start_wall_s"] = time.perf_counter() - stats["t0"]
    try:
        return _orig_schedule(self)
    finally:
        stats["schedule_end_cpu_s"] = time.process_time()
        stats["schedule_end_wall_s"] = time.perf_counter() - stats["t0"]
js.JobScheduler.schedule = _schedule

def _dump():
    try:  # the tracking thread logs finished jobs during the loop: its CPU is not the scheduler's
        from reprozoo import tracking as _t
        _bg = _t._BACKGROUND.get("last")
        stats["background_tracking_cpu_s"] = _bg.cpu_s if _bg is not None else 0.0
    except Exception:
        stats["background_tracking_cpu_s"] = 0.0
    stats["self_cpu_s"] = _ru_cpu(resource.getrusage(resource.RUSAGE_SELF))
    stats["children_cpu_s"] = _ru_cpu(resource.getrusage(resource.RUSAGE_CHILDREN))
    stats["exit_wall_s"] = time.perf_counter() - stats["t0"]
    with open(os.environ["RZ_SCHED_STATS"], "w") as fh:
        json.dump(stats, fh)
atexit.register(_dump)

from snakemake.cli import main
sys.argv[0] = "snakemake"
main()
'''


def run_variant(name: str, methods: list[str], tmp: Path, cores: int = 2) -> dict:
    work = tmp / name
    work.mkdir()
    for item in COPY:
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / item)
    prof = work / "profiles" / "default" / "config.yaml"
    if name == "before":
        prof.write_text(BLOCK.sub("", prof.read_text()))
        (work / "profiles" / "idle_scheduler.py").unlink()
    launcher = tmp / f"launch_{name}.py"
    launcher.write_text(LAUNCHER)
    stats_file = tmp / f"stats_{name}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "REPROZOO_INVOCATION")}
    env["RZ_SCHED_STATS"] = str(stats_file)
    cmd = [sys.executable, str(launcher), "--cores", str(cores), "--config", "scale=ci",
           f"methods=[{','.join(methods)}]"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    s = json.loads(stats_file.read_text())
    n_jobs = sum(1 for line in proc.stderr.splitlines() if line.startswith("Finished jobid"))
    loop = s["schedule_end_cpu_s"] - s["schedule_start_cpu_s"] - s.get("background_tracking_cpu_s", 0.0)
    startup = s["schedule_start_cpu_s"]
    own = s["self_cpu_s"]
    jobs_cpu = s["children_cpu_s"] - s["solver_cpu_s"]
    total = own + s["children_cpu_s"]
    sched = loop + s["solver_cpu_s"]
    out = {
        "wall_s": round(wall, 2),
        "jobs": n_jobs,
        "total_cpu_s": round(total, 2),
        "jobs_cpu_s": round(jobs_cpu, 2),
        "snakemake_process_cpu_s": round(own, 2),
        "startup_cpu_s": round(startup, 2),
        "scheduling_loop_cpu_s": round(loop, 2),
        "end_hooks_cpu_s": round(own - startup - loop, 2),  # with the tracking thread's CPU
        "background_tracking_cpu_s": round(s.get("background_tracking_cpu_s", 0.0), 2),
        "solver_processes": s["solver_calls"],
        "solver_cpu_s": round(s["solver_cpu_s"], 2),
        "scheduler_cpu_s": round(sched, 2),
        "scheduler_share": round(sched / total, 4),
        "snakemake_process_share": round((own + s["solver_cpu_s"]) / total, 4),
        "scheduling_wall_s": round(s["schedule_end_wall_s"] - s["schedule_start_wall_s"], 2),
        "exit_after_loop_s": round(s["exit_wall_s"] - s["schedule_end_wall_s"], 2),
        "scheduler_rounds": s["rounds"],
        "job_selections": s["selections"],
        "ready_jobs_examined": s["ready_jobs_seen"],
        "input_files_stated": s["input_stats"],
    }
    return out


def main(argv: list[str] | None = None) -> dict:
    from reprozoo import registry

    wanted = [a for a in (argv or []) if not a.startswith("-")] or METHODS
    known = set(registry.method_ids())
    methods = [m for m in wanted if m in known]
    if len(methods) < len(wanted):
        print(f"not registered now, left out: {sorted(set(wanted) - known)}")
    if not methods:
        raise SystemExit("no registered method to run")
    with tempfile.TemporaryDirectory(prefix="rz-sched-") as tmp:
        runs = {name: run_variant(name, methods, Path(tmp)) for name in ("before", "after")}
    b, a = runs["before"], runs["after"]
    report = {
        "methods": methods, "scale": "ci", "cores": 2, "runs": runs,
        "scheduler_share_before": b["scheduler_share"], "scheduler_share_after": a["scheduler_share"],
        "scheduler_share_ratio_after_to_before": round(a["scheduler_share"] / b["scheduler_share"], 3),
        "scheduler_cpu_ratio_after_to_before": round(a["scheduler_cpu_s"] / b["scheduler_cpu_s"], 3),
        "process_share_ratio_after_to_before": round(a["snakemake_process_share"] / b["snakemake_process_share"], 3),
        "goal_scheduler_share_below": 0.02,
    }
    save_report("scheduler", report)
    keys = ["wall_s", "jobs", "total_cpu_s", "jobs_cpu_s", "snakemake_process_cpu_s", "startup_cpu_s",
            "scheduling_loop_cpu_s", "end_hooks_cpu_s", "solver_processes", "solver_cpu_s", "scheduler_share",
            "snakemake_process_share", "scheduling_wall_s", "exit_after_loop_s", "scheduler_rounds",
            "job_selections", "ready_jobs_examined", "input_files_stated"]
    print(f"ci, 2 cores, methods {methods}")
    print(f"{'':28s} {'before':>10s} {'after':>10s}")
    for k in keys:
        print(f"{k:28s} {b[k]:>10} {a[k]:>10}")
    print(f"scheduler share {b['scheduler_share']:.2%} -> {a['scheduler_share']:.2%} of the run's CPU "
          f"(ratio {report['scheduler_share_ratio_after_to_before']}); the Snakemake process as a whole "
          f"{b['snakemake_process_share']:.2%} -> {a['snakemake_process_share']:.2%}")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
