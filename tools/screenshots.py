#!/usr/bin/env python
"""Screenshots of the MLflow UI and of the report, rendered by headless Chromium.

    python tools/screenshots.py                                  # results/, scale ci, first method
    python tools/screenshots.py --results results --scale ci --method rex --out docs/screenshots

Given a results folder holding an MLflow store (``mlflow.db``) and a report
(``<scale>/report.html``), it

1. starts ``reprozoo ui`` (one worker, no job runner) on a free port on 127.0.0.1 and waits until
   it answers ``/health``;
2. loads the experiment page of one method (``--method``, default the first experiment with runs)
   in the model-training view and writes ``<out>/mlflow-<method>.png``;
3. dumps that page's DOM (``--dump-dom``) and checks that the names of its top-level runs appear
   (the UI folds child runs under their parent, so only those rows are rendered);
4. writes ``<out>/report-<scale>.png`` from ``<results>/<scale>/report.html``;
5. stops the server.

It exits 0 when both screenshots were written and every checked run name was found, 1 otherwise.

Needs Debian's ``chromium`` (``apt-get install -y chromium``) or ``--chromium PATH``. Nothing
leaves the machine: the server binds 127.0.0.1 and Chromium runs with background networking,
component updates and sync off, in a throw-away profile.

An experiment without the tag ``mlflow.experimentKind`` (stores made before the tag was set at
creation) is tagged ``custom_model_development``, as the next ``reprozoo run`` would do.
MLflow 3.17 itself picks the view from its sidebar toggle (GenAI by default); the page is opened
with ``?workflowType=machine_learning`` so that it shows the runs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http proxy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, path: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    """GET (no body) or POST (JSON body) on the MLflow REST API."""
    url = f"{base}/api/2.0/mlflow/{path}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with _DIRECT.open(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def healthy(base: str) -> bool:
    try:
        with _DIRECT.open(f"{base}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_ui(store: Path, project: Path, port: int, wait: float = 180.0) -> tuple[subprocess.Popen, str]:
    """``reprozoo ui`` on ``store`` (an sqlite file) at 127.0.0.1:port; returns (process, base URL)
    once it answers. The process leads its own group: stop it with :func:`stop_ui`."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # it would win over --uri
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "reprozoo.cli", "-C", str(project), "ui", "--host", "127.0.0.1",
           "--port", str(port), "--uri", f"sqlite:///{store.resolve()}", "--wait", str(wait)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reprozoo ui exited with status {proc.returncode}")
        if healthy(base):
            return proc, base
        time.sleep(0.5)
    stop_ui(proc)
    raise RuntimeError(f"reprozoo ui did not answer within {wait:g} s")


def stop_ui(proc: subprocess.Popen, seconds: float = 20.0) -> None:
    """SIGTERM to ``reprozoo ui`` (it stops its server), then SIGKILL to the group if need be."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything of its group left behind
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def chromium_binary(given: str | None = None) -> str | None:
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def chromium(binary: str, url: str, *, screenshot: Path | None = None, dump_dom: bool = False,
             size: str = "1400,900", timeout: float = 120.0) -> str:
    """Run headless Chromium once on ``url``: write a PNG to ``screenshot`` or return the DOM."""
    with tempfile.TemporaryDirectory(prefix="reprozoo-chromium-") as profile:
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
               f"--window-size={size}", "--hide-scrollbars"]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            cmd.append(f"--screenshot={screenshot.resolve()}")
        if dump_dom:
            cmd.append("--dump-dom")
        cmd.append(url)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True, text=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"chromium did not finish {url} within {timeout:g} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"chromium exited with status {proc.returncode} on {url}")
        return out


def page_text(dom: str) -> str:
    """The visible text of a dumped DOM (scripts and styles dropped, entities kept as they are)."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


def experiment_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}?workflowType=machine_learning"


def top_level_runs(base: str, experiment_id: str, limit: int = 10) -> list[str]:
    """Names of the newest runs without a parent (the rows the runs table shows first)."""
    body = {"experiment_ids": [experiment_id], "max_results": 200, "order_by": ["attributes.start_time DESC"]}
    runs = api(base, "runs/search", body).get("runs", [])
    names = []
    for r in runs:
        tags = {t["key"]: t["value"] for t in r.get("data", {}).get("tags", [])}
        if "mlflow.parentRunId" not in tags:
            names.append(r["info"].get("run_name") or tags.get("mlflow.runName", ""))
    return [n for n in names if n][:limit]


def ensure_kind(base: str, experiment: dict) -> None:
    tags = {t["key"]: t["value"] for t in experiment.get("tags", [])}
    if tags.get(KIND_TAG) != KIND:
        api(base, "experiments/set-experiment-tag",
            {"experiment_id": experiment["experiment_id"], "key": KIND_TAG, "value": KIND})
        print(f"tagged experiment {experiment['name']}: {KIND_TAG}={KIND}")


def pick_experiment(base: str, method: str | None) -> dict:
    if method:
        return api(base, f"experiments/get-by-name?experiment_name={urllib.parse.quote(method)}")["experiment"]
    exps = api(base, "experiments/search", {"max_results": 1000}).get("experiments", [])
    for exp in sorted(exps, key=lambda e: e["name"]):
        if exp["name"] != "Default" and top_level_runs(base, exp["experiment_id"], 1):
            return exp
    raise RuntimeError("no experiment with runs in the store")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--results", type=Path, default=Path("results"), help="folder with mlflow.db (default results)")
    p.add_argument("--scale", default="ci", help="report at <results>/<scale>/report.html (default ci)")
    p.add_argument("--method", help="experiment to show (default: the first one with runs)")
    p.add_argument("--out", type=Path, default=Path("results/screenshots"), help="where the PNGs go")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--chromium", help="the Chromium binary (default: chromium on PATH)")
    p.add_argument("--size", default="1400,900", help="window size WIDTH,HEIGHT")
    args = p.parse_args(argv)

    binary = chromium_binary(args.chromium)
    if binary is None:
        print("error: no chromium on PATH (apt-get install -y chromium) and no --chromium", file=sys.stderr)
        return 2
    results = args.results.resolve()
    store, report = results / "mlflow.db", results / args.scale / "report.html"
    if not store.exists():
        print(f"error: no MLflow store at {store}", file=sys.stderr)
        return 2
    project = results.parent if (results.parent / "Snakefile").exists() else REPO
    ok = True
    proc, base = start_ui(store, project, args.port or free_port())
    try:
        exp = pick_experiment(base, args.method)
        ensure_kind(base, exp)
        url = experiment_url(base, exp["experiment_id"])
        names = top_level_runs(base, exp["experiment_id"])
        shot = args.out / f"mlflow-{exp['name']}.png"
        chromium(binary, url, screenshot=shot, size=args.size)
        print(f"wrote {shot} ({url})")
        text = page_text(chromium(binary, url, dump_dom=True, size=args.size))
        missing = [n for n in names if n not in text]
        print(f"run names on the page: {len(names) - len(missing)} of {len(names)}"
              + (f"; missing: {', '.join(missing)}" if missing else ""))
        ok = ok and bool(names) and not missing
    finally:
        stop_ui(proc)
    if report.exists():
        shot = args.out / f"report-{args.scale}.png"
        chromium(binary, report.as_uri(), screenshot=shot, size=args.size)
        print(f"wrote {shot}")
    else:
        print(f"error: no report at {report}", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
