"""Where the time and memory go: Snakemake's ``benchmark:`` files tabulated per method and stage.

Every rule writes ``results/<scale>/benchmarks/<method>/<stage>.tsv`` (data jobs:
``benchmarks/data/<stage>-<dataset>.tsv``) with wall seconds, CPU seconds and peak memory of the
job's whole process tree, job start-up included; each job also writes ``<stage>.usage.json`` with
its exact CPU seconds (getrusage, interpreter start to end) and peak memory. A method's cost is its own jobs plus the data
jobs of the datasets it reads (shared datasets are counted in full for every method that reads
them: each must fit its budget on its own). Budgets (2 cores):

- ``ci``: the method's whole pipeline under 30 s wall (its jobs back to back);
- ``smoke``: every method at most 8 CPU-minutes for all its jobs together; the whole suite within
  60 minutes of wall on the profile's cores (profiles/default ``cores:``).

Jobs of partial selections (a subset of variants or seeds, a hyper-parameter override such as
``reprozoo converge``'s, under ``partial/``) are not part of the default run and are left out.

Besides the per-method table, :func:`report` states the suite as a whole: its total CPU (every job
once, a shared dataset once), the wall it projects on the profile's cores, and the measured wall of
the last complete invocation from its record (``results/.tracking/invocations/<id>.json``, written
by reprozoo.tracking: ``started`` at Snakemake's onstart hook, after the DAG is built, and
``finished`` in its end hook, after the deferred MLflow logging; so Snakemake's own start-up and
exit are not in it). A record does not say which jobs ran: the jobs whose benchmark files were
written between its start and end tell a run of the whole suite from a rerun of a few jobs.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

CI_WALL_S = 30.0
SMOKE_MAX_CPU_S = 480.0  # 8 CPU-minutes per method, all its jobs
SMOKE_SUITE_WALL_S = 3600.0  # the default run, one invocation, on the profile's cores
PROFILE = "profiles/default/config.yaml"


@dataclass
class Job:
    method: str | None  # None for data jobs
    stage: str
    wall_s: float
    cpu_s: float
    max_rss_mb: float
    dataset: str | None = None
    path: Path | None = None  # its benchmark file


def _read(path: Path) -> dict[str, float]:
    with open(path) as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    row = rows[-1]  # Snakemake writes one row per repeat; we run one

    def num(key):
        try:
            return float(row.get(key, "nan"))
        except ValueError:  # "NA" when the process ended before the first sample
            return float("nan")

    return {"wall_s": num("s"), "cpu_s": num("cpu_time"), "max_rss_mb": num("max_rss")}


def jobs(results: Path, scale: str) -> list[Job]:
    """Wall time from Snakemake's benchmark file (the whole job, Snakemake's start-up of it
    included); CPU seconds and peak memory from the job's own ``.usage.json`` where present."""
    import json

    root = Path(results) / scale / "benchmarks"
    out = []
    for f in sorted(root.rglob("*.tsv")):
        rel = f.relative_to(root)
        if "partial" in rel.parts:  # not the default run (subset or override selections)
            continue
        vals = _read(f)
        usage = f.with_suffix(".usage.json")
        if usage.exists():
            u = json.loads(usage.read_text())
            vals["cpu_s"], vals["max_rss_mb"] = u["cpu_s"], u["max_rss_mb"]
        if rel.parts[0] == "data":
            stage, _, dataset = f.stem.partition("-")
            out.append(Job(None, stage, dataset=dataset, path=f, **vals))
        elif len(rel.parts) >= 2:
            out.append(Job(rel.parts[0], f.stem if len(rel.parts) == 2 else "/".join(rel.parts[1:])[:-4],
                           path=f, **vals))
    return out


def table(results: Path, scale: str):
    """One row per method: wall, CPU and peak memory per stage kind, totals and the verdict on
    the scale's budget."""
    import math

    import pandas as pd

    from . import registry

    all_jobs = jobs(results, scale)
    data = {}
    for j in all_jobs:
        if j.method is None:
            data.setdefault(j.dataset, []).append(j)
    rows = []
    for method in sorted({j.method for j in all_jobs if j.method}):
        own = [j for j in all_jobs if j.method == method]
        try:
            dsets = registry.get(method).datasets_for(scale)
        except ValueError:
            dsets = []
        mine = own + [j for d in dsets for j in data.get(d, [])]

        def total(key, js):
            return float(sum(getattr(j, key) for j in js if not math.isnan(getattr(j, key))))

        def stage_of(j):
            s = j.stage.split("/")[-1]
            return "data" if j.method is None else ("train" if s.startswith("train") else s.split("-")[0])

        row = {"method": method, "jobs": len(mine), "wall_s": total("wall_s", mine), "cpu_s": total("cpu_s", mine),
               "max_rss_mb": max((j.max_rss_mb for j in mine if not math.isnan(j.max_rss_mb)), default=float("nan"))}
        for kind in ("data", "train", "evaluate", "verify"):
            js = [j for j in mine if stage_of(j) == kind]
            row[f"{kind}_wall_s"] = total("wall_s", js)
            row[f"{kind}_cpu_s"] = total("cpu_s", js)
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    if scale == "ci":
        df["budget"] = [f"wall <= {CI_WALL_S:g} s"] * len(df)
        df["over"] = df.wall_s > CI_WALL_S
    elif scale == "smoke":
        df["budget"] = [f"cpu <= {SMOKE_MAX_CPU_S:g} s"] * len(df)
        df["over"] = df.cpu_s > SMOKE_MAX_CPU_S
    else:
        df["budget"] = ["-"] * len(df)
        df["over"] = False
    return df


def profile_cores(root: Path) -> int | None:
    """``cores:`` of the local profile (``profiles/default/config.yaml`` under ``root``), if set."""
    import re

    f = Path(root) / PROFILE
    if not f.exists():
        return None
    m = re.search(r"(?m)^cores:\s*(\d+)\s*(#.*)?$", f.read_text())
    return int(m.group(1)) if m else None


def suite(results: Path, scale: str, cores: int | None = None) -> dict:
    """The default run as a whole: every job of the scale's complete results once (a dataset's
    jobs once, however many methods read it; partial selections and the report left out): CPU and
    wall summed, the longest job, and the wall it projects on ``cores`` (every core kept busy:
    summed CPU, or summed job wall where jobs wait on more than CPU, over the cores; never less
    than the longest job)."""
    import math

    js = [j for j in jobs(results, scale) if "partial/" not in j.stage]

    def total(key):
        return float(sum(getattr(j, key) for j in js if not math.isnan(getattr(j, key))))

    out = {"jobs": len(js), "methods": len({j.method for j in js if j.method}), "cpu_s": total("cpu_s"),
           "wall_s": total("wall_s"), "longest_job_s": max((j.wall_s for j in js if not math.isnan(j.wall_s)),
                                                           default=0.0), "cores": cores}
    if cores:
        out["projected_wall_s"] = max(out["cpu_s"] / cores, out["wall_s"] / cores, out["longest_job_s"])
        out["projected_cpu_wall_s"] = out["cpu_s"] / cores
    return out


def _selects_everything(config: dict | None) -> bool:
    """An invocation of the whole default pipeline: every method, their own variants and seeds."""
    c = config or {}
    return (c.get("methods", "all") == "all" and not c.get("variants") and c.get("seeds") is None
            and not c.get("params"))


def invocations(results: Path, scale: str) -> list[dict]:
    """The scale's finished invocation records, oldest first, each with its measured wall
    (``finished - started``), whether it selected the whole pipeline (``complete``) and how many of
    the scale's benchmark files (one per job) were written while it ran (``jobs_run``, of
    ``jobs_total``)."""
    import json

    d = Path(results) / ".tracking" / "invocations"
    files = sorted(d.glob("*.json")) if d.exists() else []
    stamps = [j.path.stat().st_mtime for j in jobs(results, scale) if j.path is not None and "partial/" not in j.stage]
    out = []
    for f in files:
        try:
            inv = json.loads(f.read_text())
            started, finished = float(inv["started"]), float(inv["finished"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable, or still running (no "finished")
        if inv.get("scale") != scale or finished < started:
            continue
        out.append({"id": inv.get("id", f.stem), "status": inv.get("status"), "started": started,
                    "finished": finished, "wall_s": finished - started, "host": inv.get("host"),
                    "complete": inv.get("status") == "FINISHED" and _selects_everything(inv.get("config")),
                    "jobs_run": sum(1 for t in stamps if started - 1 <= t <= finished + 1),
                    "jobs_total": len(stamps)})
    return sorted(out, key=lambda i: i["finished"])


def last_complete_invocation(results: Path, scale: str) -> dict | None:
    """The last invocation that ran the whole pipeline (it selected everything, finished, and every
    job's benchmark file dates from it); else the last one that selected everything and finished
    (a rerun of some jobs: its ``jobs_run`` says how many); else None."""
    complete = [i for i in invocations(results, scale) if i["complete"]]
    full = [i for i in complete if i["jobs_total"] and i["jobs_run"] == i["jobs_total"]]
    return (full or complete or [None])[-1]


def suite_lines(results: Path, scale: str) -> tuple[list[str], bool]:
    """The suite's total CPU, its projected wall on the profile's cores and the measured wall of
    the last complete invocation; False where the smoke suite's wall target is missed."""
    import datetime

    cores = profile_cores(Path(results).parent)
    s = suite(results, scale, cores)
    ok = True
    lines = [f"suite: {s['jobs']} jobs of {s['methods']} methods (each job once, a shared dataset once): "
             f"CPU {s['cpu_s']:.0f} s ({s['cpu_s'] / 60:.1f} CPU-min), job wall {s['wall_s']:.0f} s summed, "
             f"longest job {s['longest_job_s']:.0f} s"]
    if cores:
        lines.append(f"projected wall on {cores} cores ({PROFILE}): {s['projected_wall_s'] / 60:.1f} min "
                     f"(CPU / cores: {s['projected_cpu_wall_s'] / 60:.1f} min; every core kept busy)")
    else:
        lines.append(f"projected wall: no `cores:` in {PROFILE}")
    inv = last_complete_invocation(results, scale)
    if inv is None:
        lines.append(f"measured wall: no complete invocation at {scale} recorded under "
                     f"{Path(results) / '.tracking' / 'invocations'} (run the whole pipeline once)")
    else:
        when = datetime.datetime.fromtimestamp(inv["finished"]).isoformat(timespec="minutes")
        ran = (f"ran all {inv['jobs_total']} jobs" if inv["jobs_run"] == inv["jobs_total"] else
               f"a rerun: {inv['jobs_run']} of {inv['jobs_total']} jobs ran in it")
        lines.append(f"measured wall of the last complete invocation ({inv['id']}, ended {when} on "
                     f"{inv['host']}): {inv['wall_s'] / 60:.1f} min, {ran} (from its onstart to its end "
                     f"hook: Snakemake's start-up and DAG are not in it)")
    if scale == "smoke":
        limit = SMOKE_SUITE_WALL_S / 60
        if cores and s["projected_wall_s"] > SMOKE_SUITE_WALL_S:
            ok = False
            lines.append(f"OVER: projected wall {s['projected_wall_s'] / 60:.1f} min > {limit:g} min on {cores} cores")
        if inv is not None and inv["jobs_run"] == inv["jobs_total"] and inv["wall_s"] > SMOKE_SUITE_WALL_S:
            ok = False
            lines.append(f"OVER: measured wall {inv['wall_s'] / 60:.1f} min > {limit:g} min")
    return lines, ok


def report(results: Path, scale: str) -> tuple[str, bool]:
    """Text table and whether everything is within budget."""
    df = table(results, scale)
    if df.empty:
        return (f"no benchmark files under {Path(results) / scale / 'benchmarks'}: run the workflow at "
                f"scale {scale} first", False)
    lines = [f"{'method':18s} {'jobs':>4s} {'wall s':>8s} {'cpu s':>8s} {'peak MB':>8s}   "
             f"{'data':>6s} {'train':>7s} {'eval':>6s} {'verify':>6s} (cpu s)  budget"]
    for r in df.itertuples():
        flag = "OVER " if r.over else "ok   "
        lines.append(f"{r.method:18s} {r.jobs:4d} {r.wall_s:8.1f} {r.cpu_s:8.1f} {r.max_rss_mb:8.0f}   "
                     f"{r.data_cpu_s:6.1f} {r.train_cpu_s:7.1f} {r.evaluate_cpu_s:6.1f} {r.verify_cpu_s:6.1f}"
                     f"          {flag}{r.budget}")
    ok = not bool(df.over.any())
    mean_cpu = float(df.cpu_s.mean())
    lines.append(f"{len(df)} methods: wall {df.wall_s.sum():.0f} s summed over jobs, CPU {df.cpu_s.sum():.0f} s, "
                 f"mean CPU per method {mean_cpu:.1f} s")
    over = list(df.method[df.over])
    lines.append("over budget: " + (", ".join(over) if over else "none"))
    more, suite_ok = suite_lines(results, scale)
    return "\n".join(lines + more), ok and suite_ok
