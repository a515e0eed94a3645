"""`reprozoo server` exposure: a warning off loopback (no authentication, which Host headers are
allowed), and `--auth` (MLflow's basic-auth app) on 127.0.0.1: an unauthenticated REST call gets
401, the admin's credentials get 200, and --stop ends it by pid. Waits are bounded."""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from reprozoo import server

ROOT = Path(__file__).resolve().parents[1]
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def test_build_command_allows_private_hosts_off_loopback_only():
    args = server.parse_args(["--host", "0.0.0.0", "--auth"])
    cmd = server.build_command(args, 5000)
    hosts = cmd[cmd.index("--allowed-hosts") + 1].split(",")
    assert {"10.*", "172.*", "192.168.*", "127.0.0.1:*"} <= set(hosts)
    assert cmd[cmd.index("--app-name") + 1] == "basic-auth"
    loop = server.build_command(server.parse_args([]), 5000)
    assert "--allowed-hosts" not in loop and "--app-name" not in loop


def test_binding_off_loopback_warns_no_authentication(tmp_path, monkeypatch, capsys):
    """main() warns before starting (a stand-in process that exits at once: nothing binds)."""
    monkeypatch.chdir(tmp_path)
    real_popen = subprocess.Popen
    monkeypatch.setattr(server.subprocess, "Popen",
                        lambda cmd, **kw: real_popen([sys.executable, "-c", "pass"], **kw))
    rc = server.main(["--host", "0.0.0.0", "--port", "5999", "--wait", "5",
                      "--state-file", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "NO authentication" in err and "0.0.0.0:5999" in err and "--auth" in err
    assert "10.*" in err and "192.168.*" in err and "172.*" in err
    assert server.exposure_warning("127.0.0.1", 5000, False, None) is None
    assert "basic auth over plain HTTP" in server.exposure_warning("0.0.0.0", 1, True, None)


def _server(cwd: Path, env: dict, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reprozoo.cli", "server", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _get(url: str, auth: tuple[str, str] | None = None) -> int:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with _DIRECT.open(req, timeout=20) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


@pytest.mark.skipif(importlib.util.find_spec("flask_wtf") is None,
                    reason="MLflow's basic-auth app needs Flask-WTF (pip install 'mlflow[auth]')")
def test_auth_server_rejects_anonymous_calls_and_accepts_the_admin(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    t0 = time.monotonic()
    started = _server(tmp_path, env, "--detach", "--auth", "--port", "0", "--workers", "1", "--wait", "150",
                      "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                      "--artifacts-destination", str(tmp_path / "arts"))
    assert started.returncode == 0, started.stdout + started.stderr
    state_file = tmp_path / "results" / ".tracking" / "server.json"
    state = json.loads(state_file.read_text())
    try:
        assert state["auth"] == "basic-auth" and state["host"] == "127.0.0.1"
        assert "NO authentication" not in started.stderr  # loopback: no exposure warning
        cred = Path(state["credentials"])
        assert stat.S_IMODE(cred.stat().st_mode) == 0o600
        pairs = dict(line.removeprefix("export ").split("=", 1) for line in cred.read_text().splitlines())
        user, password = pairs["MLFLOW_TRACKING_USERNAME"], pairs["MLFLOW_TRACKING_PASSWORD"]
        assert user == "admin" and len(password) >= 12
        assert password not in state_file.read_text()  # the state file holds the path, not the secret
        api = f"{state['uri']}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _get(f"{state['uri']}/health") == 200  # health stays open: --wait and --status use it
        assert _get(api) == 401
        assert _get(api, (user, "wrong-password-123")) == 401
        assert _get(api, (user, password)) == 200
    finally:
        stopped = _server(tmp_path, env, "--stop", timeout=60)
    assert f"pid {state['pid']}" in stopped.stdout, stopped.stdout + stopped.stderr
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(state["pid"]):
        time.sleep(0.2)
    assert not _alive(state["pid"]) and not state_file.exists()
    print(f"auth server start+checks+stop: {time.monotonic() - t0:.1f} s")
