"""Every command the README shows runs: Snakemake commands as dry runs, the CLI for real where it
is quick, `make` targets with `make -n`. The README cannot drift from the code."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from workcopy import copy_workflow

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration
QUICK_CLI = {"list", "budget", "docs", "datasets", "sync", "converge", "--version"}


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                cmds.append(line)
    return cmds


def test_the_readme_shows_commands():
    cmds = readme_commands()
    assert any(c.startswith("make run") for c in cmds) and any(c.startswith("make test") for c in cmds)
    assert sum(c.startswith(".venv/bin/snakemake") for c in cmds) >= 4


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = copy_workflow(tmp_path_factory.mktemp("readme"), extra=(
        "Makefile", "README.md", "requirements.txt", "constraints.txt", "pyproject.toml", "benchmarks", "tools"))
    (w / ".venv").symlink_to(Path(sys.executable).resolve().parents[1]) if not (w / ".venv").exists() else None
    return w


def _argv(cmd: str) -> list[str] | None:
    argv = shlex.split(cmd)
    exe = argv[0]
    if exe == "make":
        return ["make", "-n", *argv[1:]]
    if exe.endswith("/snakemake"):
        return [sys.executable, "-m", "snakemake", "-n", *argv[1:]]
    if exe.endswith("/reprozoo"):
        if argv[1] in ("run",):
            return [sys.executable, "-m", "reprozoo.cli", *argv[1:], "--", "-n"]
        if argv[1] in QUICK_CLI:
            if argv[1:3] == ["datasets", "fetch"]:
                return None
            return [sys.executable, "-m", "reprozoo.cli", *argv[1:]]
        if argv[1] in ("ui", "server"):
            return [sys.executable, "-m", "reprozoo.cli", argv[1], "--help"]
    if exe in ("squeue", "tail"):
        return None  # cluster monitoring, shown for the reader
    return [sys.executable, "-m", "reprozoo.cli", "--help"] if "reprozoo" in exe else None


@pytest.mark.parametrize("cmd", readme_commands())
def test_readme_command_runs(cmd, work):
    argv = _argv(cmd)
    if argv is None:
        pytest.skip(f"not runnable here: {cmd}")
    if "profiles/slurm" in cmd:
        pytest.skip("needs the SLURM cluster: tests/test_slurm.py runs this profile")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "REPROZOO_INVOCATION")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if "docs --check" in cmd:  # exit 1 says "pages differ from results/" (the copy has no results)
        assert proc.returncode in (0, 1) and ("differs from results" in proc.stdout or "match" in proc.stdout), \
            f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return
    if "docs --stale" in cmd:  # exit 1 lists the pages whose table was measured on other code
        assert proc.returncode in (0, 1) and ("stale:" in proc.stdout or "every page" in proc.stdout), \
            f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
