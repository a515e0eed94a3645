"""How fast is planning? Dry run of the full DAG (every method, smoke scale) and a no-op rerun,
as ratios to Snakemake's own start-up floor (a one-rule workflow) measured in the same run.

Writes benchmarks/results/workflow.json.
"""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEAT = 3


def timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return dt


def median_time(cmd, cwd) -> float:
    return statistics.median(timed(cmd, cwd) for _ in range(REPEAT))


def main(with_noop: bool = True) -> dict:
    sm = [sys.executable, "-m", "snakemake", "--cores", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        floor_dir = tmp / "floor"
        floor_dir.mkdir()
        (floor_dir / "Snakefile").write_text('rule all:\n    output: "x"\n    shell: "touch {output}"\n')
        floor = median_time(sm + ["-n"], floor_dir)
        work = tmp / "wf"
        work.mkdir()
        for name in ("Snakefile", "workflows", "envs", "config", "profiles", "src"):
            src = ROOT / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, work / name)
        full = median_time(sm + ["-n"], work)
        noop = float("nan")
        if with_noop:  # a finished workflow: run the ci scale once (minutes), then time the no-op dry run
            timed(sm[:-1] + ["2", "--config", "scale=ci"], work)
            noop = median_time(sm + ["-n", "--config", "scale=ci"], work)
    from reprozoo import config as rz_config

    n_jobs = len(rz_config.plan(rz_config.load()).jobs())
    report = {"snakemake_floor_s": round(floor, 3), "full_dag_dry_run_s": round(full, 3),
              "full_dag_ratio_to_floor": round(full / floor, 2), "noop_rerun_s": round(noop, 3),
              "noop_ratio_to_floor": round(noop / floor, 2), "train_jobs_in_smoke_dag": n_jobs}
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "workflow.json").write_text(json.dumps(report, indent=2))
    for k, v in report.items():
        print(f"{k:28s} {v}")
    return report


if __name__ == "__main__":
    import sys as _sys

    main(with_noop="--no-noop" not in _sys.argv)
