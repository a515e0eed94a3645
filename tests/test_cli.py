"""The reprozoo command line: listing, early config errors, dataset cards."""
import pytest

from reprozoo.cli import main


def test_list_shows_methods_variants_and_claims(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "rex" in out and "rex_euler*" in out and "ddim" in out and "claim roundtrip_exact_score" in out


def test_datasets_list(capsys):
    assert main(["datasets", "list"]) == 0
    assert "gmm2d" in capsys.readouterr().out


def test_run_rejects_unknown_method_before_starting_snakemake(capsys):
    assert main(["run", "nosuch", "--scale", "ci"]) == 2
    assert "known methods" in capsys.readouterr().err


def test_run_rejects_bad_scale():
    with pytest.raises(SystemExit):
        main(["run", "rex", "--scale", "huge"])


def test_unknown_dataset_card(capsys):
    assert main(["datasets", "card", "nosuch"]) == 2
    assert "known datasets" in capsys.readouterr().err


def test_version_and_exit_codes(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "reprozoo" in capsys.readouterr().out
    # a directory that is not a project: a clear error, never another checkout's results/
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="not a reprozoo project"):
        main(["budget"])
    # `server --stop` with nothing running says so and exits non-zero
    from reprozoo.server import main as server_main

    assert server_main(["--stop", "--state-file", str(tmp_path / "server.json")]) == 1


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory):
    from workcopy import copy_workflow

    return copy_workflow(tmp_path_factory.mktemp("cli"))


def _cli(work, *args):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "REPROZOO_INVOCATION")}
    return subprocess.run([sys.executable, "-m", "reprozoo.cli", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_run_one_method_for_real(project_copy):
    proc = _cli(project_copy, "run", "iterated_erm", "--scale", "ci", "--seeds", "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    claims = project_copy / "results" / "ci" / "iterated_erm" / "claims.json"
    assert claims.exists() and "reprozoo verdicts" in proc.stdout


@pytest.mark.integration
def test_dataset_fetch_for_real(project_copy):
    proc = _cli(project_copy, "datasets", "fetch", "gmm2d", "--scale", "ci")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (project_copy / "results" / "data" / "gmm2d" / "ci" / "card.json").exists()
    assert '"dataset": "gmm2d"' in proc.stdout
