"""Where the time and memory go: Snakemake's ``benchmark:`` files tabulated per method and stage.

Every rule writes ``results/<scale>/benchmarks/<method>/<stage>.tsv`` (data jobs:
``benchmarks/data/<stage>-<dataset>.tsv``) with wall seconds, CPU seconds and peak memory of the
job's whole process tree, job start-up included; each job also writes ``<stage>.usage.json`` with
its exact CPU seconds (getrusage, interpreter start to end) and peak memory. A method's cost is its own jobs plus the data
jobs of the datasets it reads (shared datasets are counted in full for every method that reads
them: each must fit its budget on its own). Budgets (2 cores):

- ``ci``: the method's whole pipeline under 30 s wall (its jobs back to back);
- ``smoke``: 2 CPU-minutes on average over methods, no method over 5.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

CI_WALL_S = 30.0
SMOKE_MEAN_CPU_S = 120.0
SMOKE_MAX_CPU_S = 300.0


@dataclass
class Job:
    method: str | None  # None for data jobs
    stage: str
    wall_s: float
    cpu_s: float
    max_rss_mb: float
    dataset: str | None = None


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
        vals = _read(f)
        usage = f.with_suffix(".usage.json")
        if usage.exists():
            u = json.loads(usage.read_text())
            vals["cpu_s"], vals["max_rss_mb"] = u["cpu_s"], u["max_rss_mb"]
        if rel.parts[0] == "data":
            stage, _, dataset = f.stem.partition("-")
            out.append(Job(None, stage, dataset=dataset, **vals))
        elif len(rel.parts) >= 2:
            out.append(Job(rel.parts[0], f.stem if len(rel.parts) == 2 else "/".join(rel.parts[1:])[:-4], **vals))
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
        df["budget"] = [f"cpu <= {SMOKE_MAX_CPU_S:g} s (mean <= {SMOKE_MEAN_CPU_S:g})"] * len(df)
        df["over"] = df.cpu_s > SMOKE_MAX_CPU_S
    else:
        df["budget"] = ["-"] * len(df)
        df["over"] = False
    return df


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
    if scale == "smoke" and mean_cpu > SMOKE_MEAN_CPU_S:
        ok = False
        lines.append(f"OVER: mean CPU per method {mean_cpu:.1f} s > {SMOKE_MEAN_CPU_S:g} s")
    over = list(df.method[df.over])
    lines.append("over budget: " + (", ".join(over) if over else "none"))
    return "\n".join(lines), ok
