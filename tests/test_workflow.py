"""Integration: the whole workflow at the `ci` scale for every registered method, in a temp copy."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from reprozoo import registry

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration
CLAIM_KEYS = {"id", "text", "expr", "op", "threshold", "paper_value", "value_mean", "value_std", "n_seeds",
              "per_seed", "holds_every_seed", "verdict", "error"}


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=1500)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="module")
def workflow_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("wf")
    for name in ("Snakefile", "workflows", "envs", "config", "profiles", "src"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / name)
    proc = snakemake(work, "--config", "scale=ci")
    return work, proc


def test_every_method_produces_outputs_and_claims(workflow_run):
    work, _ = workflow_run
    res = work / "results"
    for m in registry.method_ids():
        spec = registry.get(m)
        claims = json.loads((res / m / "claims.json").read_text())
        assert claims["method"] == m and claims["scale"] == "ci"
        assert {c["id"] for c in claims["claims"]} == {c.id for c in spec.claims}
        for c in claims["claims"]:
            assert CLAIM_KEYS <= set(c), c
            assert c["verdict"] in ("holds", "fails")
            assert c["error"] is None, f"{m}.{c['id']} could not be evaluated: {c['error']}"
        table = pd.read_parquet(res / m / "metrics.parquet")
        assert list(table.columns) == ["method", "variant", "seed", "scale", "metric", "x", "value"]
        assert set(table.variant) == set(spec.variant_ids)
        assert list((res / m / "plots").glob("*.png"))
        for d in spec.datasets_for("ci"):
            card = json.loads((res / "data" / d / "ci" / "card.json").read_text())
            assert card["source"] == "offline" and card["files"]
            assert (res / "data" / d / "ci" / "preview.png").exists()
    summary = pd.read_parquet(res / "summary.parquet")
    assert set(summary.method) == set(registry.method_ids())
    assert "verdict" in (res / "summary.md").read_text()
    assert "<img src=\"data:image/png;base64," in (res / "report.html").read_text()


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
        arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
        assert "claims.json" in arts and "plots" in arts and "metrics.parquet" in arts
        assert any(k.startswith("claim.") for k in parent.data.metrics)


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
    proc = snakemake(work, "-n", "--config", "scale=ci", "methods=[rex]", "variants={rex: [ddim]}", "seeds=[5]",
                     "--forceall", "results/rex/claims.json")
    out = proc.stdout + proc.stderr
    assert "train" in out and "seed5" in out and "rex_euler" not in out


def test_datasets_target_builds_every_offline_dataset(workflow_run):
    from reprozoo.data import registry as dreg

    work, _ = workflow_run
    proc = snakemake(work, "-n", "datasets", "--config", "scale=ci")
    out = proc.stdout + proc.stderr
    for name in dreg.names():
        if "offline" in dreg.get(name).sources:
            assert f"data/{name}/ci/" in out or "Nothing to be done" in out, name
