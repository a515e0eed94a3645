"""`reprozoo budget`: the suite as a whole (total CPU, projected wall on the profile's cores, measured
wall of the last complete invocation), on benchmark files and invocation records planted in a tmp
project."""
import json
import os
import time
from pathlib import Path

import pytest

from reprozoo import budget
from reprozoo.cli import main

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
EVERYTHING = {"methods": "all", "scale": "smoke", "seeds": None, "variants": {}, "params": {}}


def _job(root: Path, rel: str, wall: float, cpu: float, mtime: float, usage_cpu: float | None = None) -> None:
    f = root / "results" / "smoke" / "benchmarks" / rel
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(HEADER + f"{wall}\t0:00:{int(wall)}\t100\t200\t90\t95\t0\t0\t50\t{cpu}\n")
    if usage_cpu is not None:
        f.with_suffix(".usage.json").write_text(json.dumps({"cpu_s": usage_cpu, "max_rss_mb": 120.0}))
        os.utime(f.with_suffix(".usage.json"), (mtime, mtime))
    os.utime(f, (mtime, mtime))


def _invocation(root: Path, inv_id: str, started: float, finished: float | None, status: str = "FINISHED",
                **config) -> None:
    d = root / "results" / ".tracking" / "invocations"
    d.mkdir(parents=True, exist_ok=True)
    rec = {"id": inv_id, "scale": "smoke", "started": started, "pid": 1, "host": "box", "parents": {},
           "config": {**EVERYTHING, **config}}
    if finished is not None:
        rec.update(finished=finished, status=status)
    (d / f"{inv_id}.json").write_text(json.dumps(rec))


@pytest.fixture
def project(tmp_path):
    """Two methods and a shared dataset; a full run 40 minutes long, then a rerun of one job, a
    partial run, a failed one and one still running."""
    root = tmp_path
    (root / "Snakefile").write_text("")
    (root / "profiles" / "default").mkdir(parents=True)
    (root / "profiles" / "default" / "config.yaml").write_text("__use_yte__: true\ncores: 2  # both\nretries: 1\n")
    t0 = time.time() - 10 * 3600
    full = (t0, t0 + 2400)
    _job(root, "data/acquire-shared_ds.tsv", 10, 4, t0 + 10)
    _job(root, "data/preprocess-shared_ds.tsv", 20, 15, t0 + 30, usage_cpu=18)
    _job(root, "alpha/train_batch.tsv", 1500, 1400, t0 + 1600, usage_cpu=1450)  # the usage file wins
    _job(root, "alpha/evaluate.tsv", 30, 25, t0 + 1700, usage_cpu=26)
    _job(root, "beta/train_batch.tsv", 1200, 1100, t0 + 1300, usage_cpu=1150)
    _job(root, "beta/partial/x/evaluate.tsv", 5, 4, t0 + 5000)  # a partial selection: not the suite
    _invocation(root, "full1", *full)
    rerun = (t0 + 3000, t0 + 3100)
    _job(root, "beta/evaluate.tsv", 40, 30, t0 + 3050, usage_cpu=31)  # rerun after an edit
    _invocation(root, "rerun2", *rerun)
    _invocation(root, "partial3", t0 + 4900, t0 + 5100, methods=["beta"], variants={"beta": ["x"]})
    _invocation(root, "failed4", t0 + 6000, t0 + 6500, status="FAILED")
    _invocation(root, "running5", t0 + 7000, None)
    return root, t0


def test_suite_counts_every_job_once_and_projects_on_the_profiles_cores(project):
    root, _ = project
    assert budget.profile_cores(root) == 2
    s = budget.suite(root / "results", "smoke", cores=2)
    assert s["jobs"] == 6 and s["methods"] == 2  # the partial selection's job left out
    assert s["cpu_s"] == pytest.approx(4 + 18 + 1450 + 26 + 1150 + 31)
    assert s["wall_s"] == pytest.approx(10 + 20 + 1500 + 30 + 1200 + 40)
    assert s["longest_job_s"] == 1500
    assert s["projected_cpu_wall_s"] == pytest.approx(s["cpu_s"] / 2)
    assert s["projected_wall_s"] == pytest.approx(max(s["wall_s"] / 2, 1500))


def test_invocations_and_the_last_complete_one(project):
    root, t0 = project
    invs = {i["id"]: i for i in budget.invocations(root / "results", "smoke")}
    assert set(invs) == {"full1", "rerun2", "partial3", "failed4"}  # the running one has no end yet
    assert invs["full1"]["complete"] and invs["rerun2"]["complete"]
    assert not invs["partial3"]["complete"] and not invs["failed4"]["complete"]
    assert invs["full1"]["wall_s"] == pytest.approx(2400)
    assert invs["rerun2"]["jobs_run"] == 1 and invs["full1"]["jobs_run"] == 5 and invs["full1"]["jobs_total"] == 6
    # no invocation ran all 6 jobs (beta/evaluate was rerun later): the last complete one, said to be a rerun
    last = budget.last_complete_invocation(root / "results", "smoke")
    assert last["id"] == "rerun2"
    # once the rerun's job dates from the full run too, the full run is the last one that ran everything
    f = root / "results" / "smoke" / "benchmarks" / "beta" / "evaluate.tsv"
    os.utime(f, (t0 + 2000, t0 + 2000))
    assert budget.last_complete_invocation(root / "results", "smoke")["id"] == "full1"


def test_budget_command_reports_the_suite(project, capsys):
    root, t0 = project
    f = root / "results" / "smoke" / "benchmarks" / "beta" / "evaluate.tsv"
    os.utime(f, (t0 + 2000, t0 + 2000))
    assert main(["-C", str(root), "budget", "--scale", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "suite: 6 jobs of 2 methods" in out and "CPU 2679 s (44.6 CPU-min)" in out
    assert "projected wall on 2 cores (profiles/default/config.yaml): 25.0 min" in out
    assert "measured wall of the last complete invocation (full1" in out and "40.0 min, ran all 6 jobs" in out
    assert "OVER: projected" not in out and "OVER: measured" not in out


def test_a_suite_over_its_hour_is_over_budget(project, capsys):
    root, t0 = project
    _job(root, "gamma/train_batch.tsv", 7300, 7300, t0 + 9000, usage_cpu=7300)
    _invocation(root, "long6", t0 + 8000, t0 + 8000 + 3 * 3600)
    for f in (root / "results" / "smoke" / "benchmarks").rglob("*.tsv"):  # every job ran in it
        if "partial" not in str(f):
            os.utime(f, (t0 + 8500, t0 + 8500))
    assert main(["-C", str(root), "budget", "--scale", "smoke", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "OVER: projected wall" in out and "OVER: measured wall 180.0 min > 60 min" in out


def test_no_invocation_record_says_so(project, capsys):
    root, _ = project
    for f in (root / "results" / ".tracking" / "invocations").glob("*.json"):
        f.unlink()
    (root / "profiles" / "default" / "config.yaml").write_text("retries: 1\n")
    lines, ok = budget.suite_lines(root / "results", "smoke")
    text = "\n".join(lines)
    assert "no `cores:`" in text and "no complete invocation at smoke" in text and ok


def test_the_budget_audit_halves_plateau_tolerances_as_it_doubles_steps():
    """A fit that stops on its plateau before its floor or cap would rerun unchanged at 2x steps:
    the audit also divides every plateau tolerance by the factor, and its table says so."""
    from reprozoo import converge

    cfg = {"fit": {"min_steps": 500, "max_steps": 3000, "flat_tol": 0.01, "lr_grid": [1e-3]},
           "heads": {"a": {"fit": {"flat_tol": 0.004, "max_steps": 100}}}, "solver": {"sw_steps": 40}}
    keys = converge.budget_keys(cfg)
    tols = converge.tolerance_keys(cfg)
    # a cap's floor moves with it (a fit stopping at its floor would rerun unchanged); no floor, no key
    assert set(keys) == {"fit.max_steps", "heads.a.fit.max_steps", "fit.min_steps"}
    assert tols == ["fit.flat_tol", "heads.a.fit.flat_tol"]
    o = converge.scaled_override(cfg, keys, 2.0, tols)
    assert o["fit"] == {"min_steps": 1000, "max_steps": 6000, "flat_tol": 0.005}
    assert o["heads"]["a"]["fit"] == {"flat_tol": 0.002, "max_steps": 200}
    rows = [{"id": "c", "value_1x": 1.0, "verdict_1x": "holds", "value_fx": 1.0, "verdict_fx": "holds",
             "budget_sensitive": False, "factor": 2.0}]
    text = converge.markdown(rows, 2.0, keys + tols, "abc")
    assert "multiplied by 2 and every plateau tolerance (`fit.flat_tol`, `heads.a.fit.flat_tol`) divided by it" in text
    # a declared cap without its floor gets the floor too, once, and a declared floor is not repeated
    assert converge.budget_keys(cfg, ["fit.max_steps"]) == ["fit.max_steps", "fit.min_steps"]
    assert converge.budget_keys(cfg, ["fit.min_steps", "fit.max_steps"]) == ["fit.min_steps", "fit.max_steps"]
    # per-part caps (ceitnet's fit.max_steps.o4): the floor is the same part of min_steps when that is
    # per part, else the one scalar min_steps (the ceitnet audit of ecf5317 doubled its caps alone)
    per = {"fit": {"min_steps": 150, "max_steps": {"o4": 600, "o2": 1000}}}
    assert converge.budget_keys(per, ["fit.max_steps.o4", "fit.max_steps.o2"]) == \
        ["fit.max_steps.o4", "fit.max_steps.o2", "fit.min_steps"]
    per["fit"]["min_steps"] = {"o4": 150, "o2": 200}
    assert converge.budget_keys(per, ["fit.max_steps.o4"]) == ["fit.max_steps.o4", "fit.min_steps.o4"]
    o = converge.scaled_override(per, converge.budget_keys(per, ["fit.max_steps.o4"]), 2.0, [])
    assert o["fit"] == {"max_steps": {"o4": 1200}, "min_steps": {"o4": 300}}
    # the method's own step count list is unchanged when it has no tolerance
    assert "divided" not in converge.markdown(rows, 2.0, keys, "abc")
