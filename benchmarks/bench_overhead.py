"""Platform overhead per job: a no-op job through our dispatcher against ``python -c pass``,
both run by Snakemake in the same invocation, one core, N jobs each.

- ``bare``: ``shell: python -c pass`` (the floor: Snakemake's job handling + a Python start);
- ``noop``: ``script: workflows/scripts/stage.py`` doing nothing (our dispatch, log redirection,
  failure record, package import);
- ``noop_tracked``: the same plus one MLflow run with a metric in a fresh SQLite store (what a
  job that tracks pays).

Overhead per job = (wall of the kind − wall of bare) / N. Also prints the last complete default
run's wall time (``results/smoke/runs.jsonl``). Writes benchmarks/results/overhead.json.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N = 6

SNAKEFILE = """
STAGE = {stage!r}
N = {n}
rule all:
    input: expand("out/{{kind}}/{{i}}.json", kind=config["kind"], i=range(N))
rule bare:
    output: "out/bare/{{i}}.json"
    shell: "{python} -c pass && echo {{{{}}}} > {{output}}"
rule noop:
    output: "out/noop/{{i}}.json"
    log: "logs/noop/{{i}}.log"
    script: STAGE
rule noop_tracked:
    output: "out/noop_tracked/{{i}}.json"
    params: uri="sqlite:///" + {db!r}
    log: "logs/noop_tracked/{{i}}.log"
    script: STAGE
"""


def wall(work: Path, kind: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--config", f"kind={kind}", "-q"],
                          cwd=work, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return dt


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "results").mkdir()
        db = str(work / "results" / "mlflow.db")
        (work / "Snakefile").write_text(SNAKEFILE.format(stage=str(ROOT / "workflows" / "scripts" / "stage.py"),
                                                         n=N, python=sys.executable, db=db))
        from reprozoo.tracking import init_store

        init_store(f"sqlite:///{db}", ["overhead"], work / "results")  # as onstart does
        times = {k: wall(work, k) for k in ("bare", "noop", "noop_tracked")}
    per_job = {k: (times[k] - times["bare"]) / N for k in ("noop", "noop_tracked")}
    out = {"jobs_per_kind": N, "wall_s": times, "overhead_per_job_s": per_job,
           "bare_per_job_s": times["bare"] / N}
    runs = ROOT / "results" / "smoke" / "runs.jsonl"
    if runs.exists():
        last = [json.loads(line) for line in runs.read_text().splitlines() if line.strip()]
        full = [r for r in last if r.get("complete") and r.get("all_methods")]
        if full:
            out["last_full_smoke_run_wall_s"] = full[-1]["wall_s"]
    print(f"{N} jobs each, one core: bare {times['bare']:.1f} s, noop {times['noop']:.1f} s, "
          f"noop+tracking {times['noop_tracked']:.1f} s")
    print(f"platform overhead per job: {per_job['noop']:.2f} s (dispatch), {per_job['noop_tracked']:.2f} s "
          f"(dispatch + one MLflow run); Snakemake's own floor {times['bare'] / N:.2f} s per job")
    if "last_full_smoke_run_wall_s" in out:
        print(f"last complete default (smoke) run: {out['last_full_smoke_run_wall_s'] / 60:.1f} min wall")
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "overhead.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
