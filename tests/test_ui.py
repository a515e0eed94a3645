"""``reprozoo ui``: one worker, no job runner, the URL printed once it answers; experiments open in
the model-training view; the experiment page lists the runs (rendered by headless Chromium, when
``chromium`` is installed)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNS = ("alpha-run", "beta-run")
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _screenshots():
    spec = importlib.util.spec_from_file_location("reprozoo_tools_screenshots", REPO / "tools" / "screenshots.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


shots = _screenshots()


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    with _DIRECT.open(url, timeout=timeout) as resp:
        return resp.status, resp.read()


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    from reprozoo.tracking import _client, get_or_create_experiment

    project = tmp_path_factory.mktemp("uiproject")
    (project / "Snakefile").write_text("")
    results = project / "results"
    results.mkdir()
    uri = f"sqlite:///{results / 'mlflow.db'}"
    client = _client(uri)
    eid = get_or_create_experiment(client, "demo", results)
    for name in RUNS:
        run = client.create_run(eid, run_name=name)
        client.log_metric(run.info.run_id, "loss", 0.5)
        client.set_terminated(run.info.run_id)
    client.create_experiment("legacy")  # made before the kind tag: get_or_create_experiment adds it
    get_or_create_experiment(client, "legacy", results)

    port = shots.free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "reprozoo.cli", "-C", str(project), "ui", "--port", str(port),
                             "--wait", "180"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    family: list = []
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            if any(line.startswith("open http://") for line in lines):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"reprozoo ui printed no URL (exit {proc.poll()}): {lines}")
        import psutil

        family = psutil.Process(proc.pid).children(recursive=True)
        yield {"base": f"http://127.0.0.1:{port}", "proc": proc, "lines": lines, "eid": eid,
               "children": family}
    finally:
        proc.send_signal(signal.SIGTERM)  # reprozoo ui stops its server's process group
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for child in family:  # anything left behind, by pid
            try:
                child.wait(timeout=10)
            except Exception:  # noqa: BLE001
                try:
                    child.kill()
                except Exception:  # noqa: BLE001
                    pass


def test_url_printed_once_the_server_answers(ui):
    url_line = next(line for line in ui["lines"] if line.startswith("open http://"))
    assert url_line.strip() == f"open {ui['base']}"
    assert _get(f"{ui['base']}/health")[0] == 200


def test_one_worker_and_no_job_runner(ui):
    cmdlines = [" ".join(c.cmdline()) for c in ui["children"] if c.is_running()]
    uvicorn = [c for c in cmdlines if "uvicorn" in c]
    assert len(uvicorn) == 1 and "--workers 1" in uvicorn[0], cmdlines
    assert not [c for c in cmdlines if "huey" in c or "mlflow.server.jobs" in c], cmdlines
    assert len(cmdlines) <= 2, cmdlines  # `mlflow server` and its single uvicorn process


@pytest.mark.parametrize("name", ["demo", "legacy"])
def test_experiments_open_in_the_model_training_view(ui, name):
    _, body = _get(f"{ui['base']}/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}")
    tags = {t["key"]: t["value"] for t in json.loads(body)["experiment"].get("tags", [])}
    assert tags.get(KIND_TAG) == KIND


def test_experiment_page_lists_the_runs(ui):
    binary = shutil.which("chromium")
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    assert sorted(shots.top_level_runs(ui["base"], ui["eid"])) == sorted(RUNS)
    dom = shots.chromium(binary, shots.experiment_url(ui["base"], ui["eid"]), dump_dom=True, timeout=150)
    text = shots.page_text(dom)
    assert all(name in text for name in RUNS), text[:2000]
