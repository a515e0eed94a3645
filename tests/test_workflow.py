"""Integration: the whole workflow at the `ci` scale for every registered method, in a temp copy."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from reprozoo import registry
from reprozoo.claims import VERDICTS
from workcopy import copy_workflow

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration
CLAIM_KEYS = {"id", "text", "expr", "op", "threshold", "paper_value", "value_mean", "value_std", "n_seeds",
              "ci_low", "ci_high", "per_seed", "holds_every_seed", "single_seed", "verdict", "error"}


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("REPROZOO_INVOCATION", None)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=1500)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="module")
def workflow_run(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("wf"))
    proc = snakemake(work, "--config", "scale=ci")
    return work, proc


def test_every_method_produces_outputs_and_claims(workflow_run):
    work, _ = workflow_run
    res = work / "results"
    for m in registry.method_ids():
        spec = registry.get(m)
        claims = json.loads((res / "ci" / m / "claims.json").read_text())
        assert claims["method"] == m and claims["scale"] == "ci" and claims["complete"]
        assert {c["id"] for c in claims["claims"]} == {c.id for c in spec.claims}
        for c in claims["claims"]:
            assert CLAIM_KEYS <= set(c), c
            assert c["verdict"] in VERDICTS and c["verdict"] != "error", c
            assert c["error"] is None, f"{m}.{c['id']} could not be evaluated: {c['error']}"
            if c["n_seeds"] == 1:  # one seed never holds, fails, or passes a control
                assert c["verdict"] not in ("holds", "fails", "non-discriminative") and c["single_seed"]
        table = pd.read_parquet(res / "ci" / m / "metrics.parquet")
        assert list(table.columns) == ["method", "variant", "seed", "scale", "metric", "x", "value"]
        assert set(table.variant) == set(spec.variant_ids)
        assert list((res / "ci" / m / "plots").glob("*.png"))
        assert (res / "ci" / "benchmarks" / m / "train_batch.tsv").exists()
        for d in spec.datasets_for("ci"):
            card = json.loads((res / "data" / d / "ci" / "card.json").read_text())
            assert card["source"] == "offline" and card["files"]
            assert (res / "data" / d / "ci" / "preview.png").exists()
    summary = pd.read_parquet(res / "ci" / "summary.parquet")
    assert set(summary.method) == set(registry.method_ids())
    assert "verdict" in (res / "ci" / "summary.md").read_text()
    assert "plumbing only" in (res / "ci" / "summary.md").read_text()
    assert "<img src=\"data:image/png;base64," in (res / "ci" / "report.html").read_text()


def test_mlflow_holds_parent_and_child_runs(workflow_run):
    from mlflow.tracking import MlflowClient

    work, _ = workflow_run
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'results' / 'mlflow.db'}")
    for m in registry.method_ids():
        spec = registry.get(m)
        exp = client.get_experiment_by_name(m)
        assert exp is not None, f"no experiment for {m}"
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        parents = [r for r in runs if r.data.tags.get("role") == "pipeline"]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        parent = parents[0]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                    and r.data.tags.get("rule") == "train"]
        seeds = spec.config("ci").get("seeds", [0])
        assert sorted((r.data.tags["variant"], int(r.data.tags["seed"])) for r in children) == \
            sorted((v, s) for v in spec.variant_ids for s in seeds)
        for r in children:
            assert r.info.status == "FINISHED"
            for tag in ("git_commit", "rule", "scale", "data_source", "host"):
                assert tag in r.data.tags, tag
            assert r.data.tags["scale"] == "ci"
            assert r.data.params and r.data.metrics
            assert r.info.run_name.endswith(".ci") and r.info.run_name.startswith(f"{m}.")
        arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
        assert "claims.json" in arts and "plots" in arts and "metrics.parquet" in arts
        assert any(k.startswith("claim.") for k in parent.data.metrics)


def _view(client, method):
    """What a researcher sees of a method in MLflow, in comparable form."""
    exp = client.get_experiment_by_name(method)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    by_id = {r.info.run_id: r.info.run_name for r in runs}
    view = {}
    for r in runs:
        tags = {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.") and k != "replayed"}
        parent = by_id.get(r.data.tags.get("mlflow.parentRunId"))
        arts = sorted(a.path for a in client.list_artifacts(r.info.run_id))
        inputs = sorted((d.dataset.name, d.dataset.digest) for d in (r.inputs.dataset_inputs if r.inputs else []))
        key = r.info.run_name if tags.get("role") != "pipeline" else "pipeline"
        view[key] = {"status": r.info.status, "params": dict(r.data.params), "metrics": dict(r.data.metrics),
                     "tags": tags, "parent": parent and ("pipeline" if parent.startswith("pipeline") else parent),
                     "artifacts": arts, "inputs": inputs}
    return view


def test_the_mlflow_view_can_be_rebuilt_from_results(workflow_run, tmp_path):
    from mlflow.tracking import MlflowClient

    work, _ = workflow_run
    new_uri = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    proc = subprocess.run([sys.executable, "-m", "reprozoo.cli", "sync", "--rebuild", "--uri", new_uri], cwd=work,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    old = MlflowClient(tracking_uri=f"sqlite:///{work / 'results' / 'mlflow.db'}")
    new = MlflowClient(tracking_uri=new_uri)
    for m in registry.method_ids():
        a, b = _view(old, m), _view(new, m)
        assert set(a) == set(b), (m, set(a) ^ set(b))
        for name in a:
            for field in ("status", "params", "metrics", "tags", "parent", "artifacts", "inputs"):
                assert a[name][field] == b[name][field], (m, name, field)


def test_rerun_is_a_noop_and_lint_is_clean(workflow_run):
    work, _ = workflow_run
    proc = snakemake(work, "--config", "scale=ci", "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr
    lint = snakemake(work, "--lint", check=False)
    assert "Congratulations" in lint.stdout + lint.stderr, lint.stdout + lint.stderr


def test_invalid_config_fails_fast_with_a_clear_message(workflow_run):
    work, _ = workflow_run
    proc = snakemake(work, "-n", "--config", "scale=huge", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "invalid config key 'scale'" in out and "smoke" in out
    proc = snakemake(work, "-n", "--config", "methods=[nosuch]", check=False)
    assert proc.returncode != 0 and "known methods" in proc.stdout + proc.stderr


def test_one_method_one_variant_one_seed_by_override(workflow_run):
    work, _ = workflow_run
    proc = snakemake(work, "-n", "--forceall", "results/ci/rex/partial/ddim_seeds5/claims.json", "--quiet", "host",
                     "--config", "scale=ci", "methods=[rex]", "variants={rex: [ddim]}", "seeds=[5]")
    out = proc.stdout + proc.stderr
    assert "train" in out and "seed5" in out and "rex_euler" not in out


def _train_jobs(out: str) -> set[str]:
    import re

    # the job-stats table of a dry run (job blocks are quiet in profiles/default)
    return set(re.findall(r"^(train_batch_\w+)\s+\d+\s*$", out, re.M))


def test_editing_a_method_reruns_only_that_method(workflow_run, tmp_path):
    work, _ = workflow_run
    f = work / "src" / "reprozoo" / "methods" / "rex" / "method.py"
    original = f.read_text()
    try:
        f.write_text(original + "\n# edited\n")
        out = snakemake(work, "-n", "--config", "scale=ci").stdout
        assert _train_jobs(out) == {"train_batch_rex"}, out[-3000:]
    finally:
        f.write_text(original)
    assert "Nothing to be done" in snakemake(work, "-n", "--config", "scale=ci").stdout


def test_editing_a_block_reruns_the_methods_that_import_it_and_no_others(workflow_run):
    from reprozoo import codehash

    work, _ = workflow_run
    block = work / "src" / "reprozoo" / "blocks" / "ode.py"
    users = {m for m in registry.method_ids()
             if codehash.PACKAGE_DIR / "blocks" / "ode.py" in codehash.method_code_files(m)}
    assert "rex" in users and len(users) < len(registry.method_ids())
    original = block.read_text()
    try:
        block.write_text(original + "\n# edited\n")
        out = snakemake(work, "-n", "--config", "scale=ci").stdout
        assert _train_jobs(out) == {f"train_batch_{m}" for m in users}, out[-3000:]
    finally:
        block.write_text(original)


def test_a_partial_run_never_overwrites_the_complete_results(workflow_run):
    work, _ = workflow_run
    full = work / "results" / "ci" / "rex" / "claims.json"
    before = full.read_text()
    bench = work / "results" / "ci" / "benchmarks" / "rex" / "train_batch.tsv"  # `reprozoo budget` reads it
    bench_before = bench.read_text()
    # forced, so that the subset's batch job runs (its cells are up to date) and writes its own log
    # and benchmark: under partial/, where the budget leaves them out, never over the complete run's
    snakemake(work, "--forcerun", "train_batch_rex", "--config", "scale=ci", "methods=[rex]",
              "variants={rex: [ddim, rex_euler]}", "seeds=[0]")
    assert full.read_text() == before
    assert bench.read_text() == bench_before
    assert (bench.parent / "partial" / "ddim+rex_euler_seeds0" / "train_batch.tsv").exists()
    part = json.loads((work / "results" / "ci" / "rex" / "partial" / "ddim+rex_euler_seeds0" / "claims.json").read_text())
    assert not part["complete"]
    verdicts = {c["id"]: c for c in part["claims"]}
    assert verdicts["order_rk4"]["verdict"] == "not measured"   # reads rex_rk4, not run here
    # and its declared control (the order-2 base in rk4's place) reads rex_midpoint, not run either
    assert verdicts["order_rk4"]["missing_variants"] == ["rex_midpoint", "rex_rk4"]
    assert verdicts["order_euler"]["verdict"] != "not measured"
    assert (work / "results" / "ci" / "summary.md").exists()


def test_budget_tabulates_every_method(workflow_run):
    work, _ = workflow_run
    proc = subprocess.run([sys.executable, "-m", "reprozoo.cli", "budget", "--scale", "ci"], cwd=work,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for m in registry.method_ids():
        assert m in proc.stdout
    assert "over budget:" in proc.stdout


def test_datasets_target_builds_every_offline_dataset(workflow_run):
    from reprozoo.data import registry as dreg

    work, _ = workflow_run
    proc = snakemake(work, "-n", "datasets", "--quiet", "host", "--config", "scale=ci")
    out = proc.stdout + proc.stderr
    for name in dreg.names():
        if "offline" in dreg.get(name).sources:
            assert f"data/{name}/ci/" in out or "Nothing to be done" in out, name


def test_bad_override_fails_before_any_job_and_a_bug_is_not_retried(workflow_run):
    work, _ = workflow_run
    proc = snakemake(work, "-n", "--config", "scale=ci", "methods=[rex]", "params={rex: {zeta: abc}}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "params.rex.zeta" in out and "a number" in out
    proc = snakemake(work, "-n", "--config", "scale=ci", "methods=[rex]", "params={rex: {denoiser: {stepz: 5}}}",
                     check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "stepz" in out and "allowed" in out
    # a string-typed override from the command line is coerced to the config's type and runs
    proc = snakemake(work, "-n", "--config", "scale=ci", "methods=[rex]", "params={rex: {zeta: 0.99}}")
    assert "train_batch_rex" in proc.stdout
    # a deterministic error runs once: the retry stops at once and says why
    proc = snakemake(work, "--forcerun", "train_batch_rex", "--retries", "1", "--config", "scale=ci",
                     "methods=[rex]", "inject_failure=[{method: rex, variant: ddim, seed: 0, attempts: 5, kind: bug}]",
                     check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "not retried" in out and "InjectedBug" in out
    assert out.count("Traceback") <= 2, out[-4000:]
