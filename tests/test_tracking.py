"""Tracking: concurrent writers lose nothing, crashes mark runs FAILED, outages never lose results."""
import json
import os
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprozoo import tracking

N_PROC, N_METRICS = 6, 100


def _worker(args):
    results, uri, i = args
    run = tracking.JobRun(method="concurrency", run_name=f"job{i}", results=Path(results),
                          tags={"worker": str(i)}, pending_path=Path(results) / f"pending{i}.json", uri=uri)
    with run:
        run.log_params({"i": i, "nested": {"a": 1}})
        run.log_metrics({"final": float(i)}, {"curve": (list(range(N_METRICS - 1)), [float(i * k) for k in range(N_METRICS - 1)])})
    return run.run_id, run.error


def test_parallel_processes_log_every_run_and_metric(tmp_path):
    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    tracking.init_store(uri, ["concurrency"], results)  # once, before fanning out
    tracking.start_invocation(uri, results, "ci", {})
    with mp.get_context("spawn").Pool(N_PROC) as pool:
        out = pool.map(_worker, [(str(results), uri, i) for i in range(N_PROC)])
    assert all(err is None for _, err in out)
    client = tracking._client(uri)
    exp = client.get_experiment_by_name("concurrency")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("role") == "pipeline"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1, "the parent run is created once, under the lock"
    assert len(children) == N_PROC
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    for r in children:
        assert r.info.status == "FINISHED"
        hist = client.get_metric_history(r.info.run_id, "curve")
        assert len(hist) == N_METRICS - 1
        assert r.data.params["nested.a"] == "1"
        assert {"git_commit", "host"} <= set(r.data.tags)
    tracking.finish_invocation(results, "FINISHED")
    assert client.get_run(parents[0].info.run_id).info.status == "FINISHED"


def test_crash_marks_run_failed_and_keeps_the_exception(tmp_path):
    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    tracking.init_store(uri, ["crash"], results)
    run = tracking.JobRun(method="crash", run_name="boom", results=results, tags={},
                          pending_path=results / "p.json", uri=uri, nested=False)
    with pytest.raises(ZeroDivisionError):
        with run:
            1 / 0
    r = tracking._client(uri).get_run(run.run_id)
    assert r.info.status == "FAILED"
    assert "ZeroDivisionError" in r.data.tags["error"]


def test_unreachable_server_keeps_results_and_pending_payload(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    results = tmp_path / "results"
    out = results / "m" / "v" / "seed0"
    out.mkdir(parents=True)
    run = tracking.JobRun(method="m", run_name="v-seed0", results=results, tags={"k": "v"},
                          pending_path=out / "tracking_pending.json", retries=1, nested=False)
    with run:
        (out / "metrics.json").write_text("{}")  # the job's result, written first
        run.log_metrics({"x": 1.0})
    assert (out / "metrics.json").exists()
    pending = json.loads((out / "tracking_pending.json").read_text())
    assert pending["metrics"][0][:2] == ["x", 1.0]
    assert "WARNING" in capsys.readouterr().err
    # once tracking is back, `reprozoo sync` replays it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    assert tracking.replay_pending(results) == 1
    assert not (out / "tracking_pending.json").exists()


def test_train_stage_failure_leaves_no_output_and_a_failed_run(tmp_path, monkeypatch):
    from reprozoo import stages
    from reprozoo.config import load, method_params

    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracking.init_store(uri, ["rex"], results)
    hp = method_params(load({"scale": "ci"}), "rex")
    metrics = results / "rex" / "ddim" / "seed0" / "metrics.json"
    with pytest.raises(stages.InjectedFailure):
        stages.train("rex", "ddim", 0, "ci", hp, {}, metrics, None, 1, None, attempt=1,
                     inject_failure=[{"method": "rex", "variant": "ddim", "attempts": 1}])
    assert not metrics.exists()
    runs = tracking._client(uri).search_runs([tracking._client(uri).get_experiment_by_name("rex").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert runs[0].data.tags["attempt"] == "1"


def test_a_hanging_tracking_server_costs_a_job_seconds_not_minutes(tmp_path):
    """A server that accepts connections and never answers: each MLflow call is bounded and the
    job's total tracking budget runs out, so the run is spooled to its pending file and the job
    goes on (MLflow's defaults would retry for about four minutes per call)."""
    import socket
    import subprocess
    import sys
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    conns, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])  # hold it open, say nothing
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    out = tmp_path / "job"
    out.mkdir()
    code = f"""
import json, sys, time
from pathlib import Path
from reprozoo import tracking
run = tracking.JobRun(method="m", run_name="r", results=Path({str(tmp_path)!r}), tags={{}},
                      pending_path=Path({str(out)!r}) / "tracking_pending.json",
                      uri="http://127.0.0.1:{port}", retries=3, nested=False)
with run:
    run.log_metrics({{"x": 1.0}})
print("done")
"""
    env = dict(os.environ, REPROZOO_TRACKING_BUDGET_S="4", MLFLOW_HTTP_REQUEST_TIMEOUT="1")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    finally:
        stop.set()
        t.join(5)
        for c in conns:
            c.close()
        srv.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done" in proc.stdout
    pending = json.loads((out / "tracking_pending.json").read_text())
    assert pending["metrics"] and pending["status"] == "FINISHED"


def _first_use(args):
    uri, results, i = args
    client = tracking._client(uri)  # a fresh store: schema creation races without the lock
    exp = tracking.get_or_create_experiment(client, "race", Path(results))
    client.create_run(exp, run_name=f"r{i}")
    return i


def test_eight_concurrent_first_uses_of_a_fresh_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    with mp.get_context("spawn").Pool(8) as pool:
        assert sorted(pool.map(_first_use, [(uri, str(tmp_path), i) for i in range(8)])) == list(range(8))
    client = tracking._client(uri)
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert len(runs) == 8


def test_two_invocations_keep_their_own_state_and_parents(tmp_path):
    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    a = tracking.start_invocation(uri, results, "ci", {})
    pa = tracking.parent_run_id(tracking._client(uri), "m", results)
    b = tracking.start_invocation(uri, results, "smoke", {})
    pb = tracking.parent_run_id(tracking._client(uri), "m", results)
    assert a["id"] != b["id"] and pa != pb
    assert tracking.read_invocation(results, a["id"])["parents"]["m"] == pa  # untouched by b
    tracking.finish_invocation(results, "FINISHED", inv_id=a["id"])
    tracking.finish_invocation(results, "FINISHED", inv_id=b["id"])
    client = tracking._client(uri)
    assert client.get_run(pa).info.status == "FINISHED" and client.get_run(pb).info.status == "FINISHED"


def test_a_killed_invocation_is_reaped_and_its_results_picked_up(tmp_path):
    """kill -9 of Snakemake: its parent run stays RUNNING and its jobs' payloads unlogged. The
    next invocation marks the parent KILLED and logs what the jobs left (a job that finished as
    FINISHED, one that was killed too as FAILED)."""
    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    dead = tracking.start_invocation(uri, results, "ci", {})
    parent = tracking.parent_run_id(tracking._client(uri), "m", results)
    for name, status in (("done", "FINISHED"), ("killed", "RUNNING")):
        d = results / "ci" / "m" / name / "seed0"
        d.mkdir(parents=True)
        run = tracking.JobRun(method="m", run_name=name, results=results, tags={"rule": "train"},
                              pending_path=d / tracking.PENDING, uri=uri, deferred=True)
        run.__enter__()
        run.log_metrics({"x": 1.0})
        if status == "FINISHED":
            run.__exit__(None, None, None)
    state = tracking._inv_path(results, dead["id"])
    st = json.loads(state.read_text())
    st["pid"] = 2 ** 22 + 12345  # a pid that is not alive: Snakemake was killed
    state.write_text(json.dumps(st))
    tracking.start_invocation(uri, results, "ci", {})  # the next invocation
    client = tracking._client(uri)
    assert client.get_run(parent).info.status == "KILLED"
    exp = client.get_experiment_by_name("m").experiment_id
    kids = {r.info.run_name: r for r in client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'")}
    assert kids["done"].info.status == "FINISHED" and kids["done"].data.metrics["x"] == 1.0
    assert kids["killed"].info.status == "FAILED"
    assert json.loads(state.read_text())["status"] == "KILLED"


def test_tracking_mode_follows_the_store_the_jobs_will_use(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.mode_for("auto", "smoke", "sqlite:///results/mlflow.db") == "deferred"
    assert tracking.mode_for("auto", "paper", "sqlite:///results/mlflow.db") == "live"
    # a tracking server named in the environment (clusters) wins over the config's embedded store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.mode_for("auto", "ci", "sqlite:///results/mlflow.db") == "live"
    assert tracking.mode_for("deferred", "ci", "sqlite:///results/mlflow.db") == "deferred"


def test_a_killed_attempt_carries_its_attempt_tag(tmp_path, monkeypatch):
    """The run's attempt and memory tags are set when the run starts, so an attempt killed
    mid-way (its payload still RUNNING, or its live run left RUNNING) carries them too."""
    from reprozoo import stages

    results = tmp_path / "results"
    out = results / "ci" / "rex" / "ddim" / "seed0" / "metrics.json"
    tracking.start_invocation("sqlite:///unused.db", results, "ci", {})
    started = {}
    real_enter = tracking.JobRun.__enter__

    def enter_then_capture(self):
        r = real_enter(self)
        started.update(json.loads(self.pending_path.read_text()))  # what a kill -9 here would leave
        return r

    monkeypatch.setattr(tracking.JobRun, "__enter__", enter_then_capture)
    with pytest.raises(stages.InjectedFailure):
        stages.train("rex", "ddim", 0, "ci", {}, {}, out, tracking={"mode": "deferred"}, attempt=2,
                     inject_failure=[{"method": "rex", "attempts": 5}], mem_mb=4000)
    assert started["status"] == "RUNNING"
    assert started["run_tags"]["attempt"] == "2" and started["run_tags"]["mem_mb"] == "4000"
    failed = json.loads((out.parent / tracking.PENDING).read_text())
    assert failed["status"] == "FAILED" and failed["run_tags"]["attempt"] == "2"


def test_experiment_links_read_a_real_sqlite_store_without_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from reprozoo.tracking import experiment_links

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp_id = MlflowClient(tracking_uri=uri).create_experiment("rex")
    links = experiment_links(["rex", "ldr"], uri)
    assert links == {"rex": f"http://127.0.0.1:5000/#/experiments/{exp_id}?workflowType=machine_learning"}
    assert experiment_links(["rex"], f"sqlite:///{tmp_path / 'absent.db'}") == {}


def test_experiment_links_ask_a_tracking_server_by_name():
    import http.server
    import json as _json
    import threading

    from reprozoo.tracking import experiment_links

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            if "experiment_name=rex" in self.path:
                body = _json.dumps({"experiment": {"experiment_id": "7", "name": "rex"}}).encode()
                self.send_response(200)
            else:
                body = b'{"error_code": "RESOURCE_DOES_NOT_EXIST"}'
                self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        links = experiment_links(["rex", "ldr"], base)
    finally:
        server.shutdown()
        server.server_close()
    assert links == {"rex": f"{base}/#/experiments/7?workflowType=machine_learning"}


# --- a killed invocation in the store: reaping, `reprozoo sync`, `reprozoo run` -----------------

DEAD_PID = 2 ** 22 + 12345  # a pid that is not alive: Snakemake was killed


def _set_record(results, inv_id, **fields):
    path = tracking._inv_path(results, inv_id)
    st = json.loads(path.read_text())
    st.update(fields)
    path.write_text(json.dumps(st))
    return st


def _payload(results, inv_id, name, finished):
    """A deferred job's run payload, as a job of invocation ``inv_id`` leaves it (RUNNING: killed)."""
    d = results / "ci" / "m" / name / "seed0"
    d.mkdir(parents=True, exist_ok=True)
    run = tracking.JobRun(method="m", run_name=name, results=results, tags={"rule": "train", "invocation": inv_id},
                          pending_path=d / tracking.PENDING, deferred=True)
    run.__enter__()
    run.log_metrics({"x": 1.0})
    if finished:
        run.__exit__(None, None, None)


def _runs(client, inv_id):
    exp = client.get_experiment_by_name("m").experiment_id
    parents = client.search_runs([exp], f"tags.role = 'pipeline' and tags.invocation = '{inv_id}'")
    assert len(parents) == 1, [p.info.run_name for p in parents]
    kids = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    return parents[0], {r.info.run_name: r for r in kids}


def test_a_killed_deferred_invocation_ends_its_parent_killed(tmp_path):
    """Deferred tracking (ci, smoke): the dead invocation's jobs never reached MLflow, so its parent
    is first created when the next invocation reaps it; it must end KILLED, not stay RUNNING."""
    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    dead = tracking.start_invocation(uri, results, "ci", {})
    _payload(results, dead["id"], "done", finished=True)
    _payload(results, dead["id"], "killed", finished=False)
    _set_record(results, dead["id"], pid=DEAD_PID)
    assert [i["id"] for i in tracking.interrupted_invocations(results)] == [dead["id"]]
    tracking.start_invocation(uri, results, "ci", {})  # the next invocation reaps it
    parent, kids = _runs(tracking._client(uri), dead["id"])
    assert parent.info.status == "KILLED" and parent.info.end_time
    assert kids["done"].info.status == "FINISHED" and kids["done"].data.metrics["x"] == 1.0
    assert kids["killed"].info.status == "FAILED" and "killed" in kids["killed"].data.tags["error"]
    record = tracking.read_invocation(results, dead["id"])
    assert record["status"] == "KILLED" and record["parents"] == {"m": parent.info.run_id}
    assert tracking.interrupted_invocations(results) == []


def test_sync_repairs_runs_an_earlier_version_left_running(tmp_path, monkeypatch, capsys):
    """A store written the old way: the reaped invocation's record says KILLED but its parent is
    RUNNING (with a child its killed job left RUNNING); another invocation died and was never
    reaped. `reprozoo sync` ends both parents KILLED and their unfinished children FAILED, keeps
    the finished children, and leaves alone a live invocation's parent and a parent with no record."""
    from reprozoo.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "Snakefile").write_text("")
    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    client = tracking._client(uri)
    exp = tracking.get_or_create_experiment(client, "m", results)

    old = tracking.start_invocation(uri, results, "ci", {})  # reaped by the old code
    _set_record(results, old["id"], pid=DEAD_PID, finished=1.0, status="KILLED", parents={})
    planted = client.create_run(exp, run_name=f"pipeline-ci-{old['id']}",
                                tags={"role": "pipeline", "invocation": old["id"], "replayed": "true"}).info.run_id
    child = {}
    for name, status in (("done", "FINISHED"), ("left", "RUNNING")):
        child[name] = client.create_run(exp, run_name=name, tags={"mlflow.parentRunId": planted}).info.run_id
        if status != "RUNNING":
            client.set_terminated(child[name], status)
    never = tracking.start_invocation(uri, results, "ci", {})  # dies below; no later invocation reaps it
    _payload(results, never["id"], "cut", finished=False)
    live = tracking.start_invocation(uri, results, "ci", {})  # this process: alive
    live_parent = tracking.parent_run_id(client, "m", results)
    _set_record(results, never["id"], pid=DEAD_PID)
    stray = client.create_run(exp, run_name="pipeline-ci-elsewhere",
                              tags={"role": "pipeline", "invocation": "elsewhere"}).info.run_id
    monkeypatch.delenv("REPROZOO_INVOCATION")

    assert main(["sync"]) == 0
    out = capsys.readouterr().out
    assert "closed 1 parent run(s)" in out and "1 unfinished child run(s)" in out, out
    assert f"invocation {never['id']}" in out and "reaped" in out
    assert client.get_run(planted).info.status == "KILLED"
    assert client.get_run(child["left"]).info.status == "FAILED"
    assert client.get_run(child["done"]).info.status == "FINISHED"
    parent, kids = _runs(client, never["id"])
    assert parent.info.status == "KILLED" and kids["cut"].info.status == "FAILED"
    assert client.get_run(live_parent).info.status == "RUNNING"
    assert client.get_run(stray).info.status == "RUNNING"
    assert tracking.read_invocation(results, live["id"]).get("finished") is None
    assert main(["sync"]) == 0 and "closed" not in capsys.readouterr().out  # nothing left to repair


@pytest.fixture
def dead_checkout(tmp_path, monkeypatch):
    """A project whose last invocation died: its record (pid gone) and Snakemake's stale lock.
    Snakemake itself is replaced by a recorder: these tests check what `reprozoo run` decides."""
    from reprozoo import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "Snakefile").write_text("")
    results = tmp_path / "results"
    dead = tracking.start_invocation("sqlite:///unused.db", results, "ci", {})
    monkeypatch.delenv("REPROZOO_INVOCATION")
    _set_record(results, dead["id"], pid=DEAD_PID)
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text("results/ci/ftrl_regret/claims.json\n")
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "--unlock" in cmd:
            import shutil
            shutil.rmtree(locks)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    return tmp_path, dead, calls


def _fake_snakemake(cwd, inv_id=None):
    """A process that /proc shows as a Snakemake working in ``cwd`` (a job of ``inv_id``)."""
    env = {k: v for k, v in os.environ.items() if k != "REPROZOO_INVOCATION"}
    if inv_id:
        env["REPROZOO_INVOCATION"] = inv_id
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m", "snakemake"],
                            cwd=cwd, env=env)


def test_run_after_a_killed_invocation_removes_the_stale_lock_and_says_so(dead_checkout, capsys):
    from reprozoo.cli import main

    work, dead, calls = dead_checkout
    assert main(["run", "ftrl_regret", "--scale", "ci"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if "died" in l)
    assert f"previous invocation {dead['id']}" in line and "removed its stale Snakemake lock" in line
    assert "KILLED" in line
    assert "--unlock" in calls[0] and "--unlock" not in calls[1]  # unlocked, then the run itself
    assert not (work / ".snakemake" / "locks").exists()


def test_run_waits_for_jobs_of_the_killed_invocation_that_still_run(dead_checkout, capsys):
    """kill -9 of Snakemake alone leaves its jobs running: resuming now would run two writers on
    the same outputs, and --unlock would drop the lock under them. Say so and stop."""
    from reprozoo.cli import main

    work, dead, calls = dead_checkout
    orphan = _fake_snakemake(work, dead["id"])
    try:
        assert main(["run", "ftrl_regret", "--scale", "ci"]) == 1
        err = capsys.readouterr().err
        assert f"pid {orphan.pid}" in err and "still run" in err and "reprozoo run ftrl_regret" in err
        assert calls == [] and (work / ".snakemake" / "locks" / "0.output.lock").exists()
        assert main(["run", "ftrl_regret", "--scale", "ci", "--unlock"]) == 1  # never under a live job
        assert calls == []
        assert tracking.reap_orphans(work / "results") == []  # not while its job runs on
    finally:
        orphan.kill()
        orphan.wait(10)
    assert main(["run", "ftrl_regret", "--scale", "ci"]) == 0
    assert "--unlock" in calls[0]


def test_run_keeps_the_lock_while_another_snakemake_works_here(dead_checkout, capsys):
    from reprozoo.cli import main

    work, dead, calls = dead_checkout
    other = _fake_snakemake(work)
    try:
        assert main(["run", "ftrl_regret", "--scale", "ci"]) == 0  # Snakemake itself decides (stand-in: 0)
        out = capsys.readouterr().out
        assert "lock is kept" in out and str(other.pid) in out and "run this again" in out
        assert all("--unlock" not in c for c in calls)
    finally:
        other.kill()
        other.wait(10)


def test_finished_jobs_are_logged_while_the_run_goes_on(tmp_path, monkeypatch):
    """Deferred mode: the background thread logs a finished job's payload during the run, leaves a
    running job's alone (the end hook logs it FAILED if it never ends), and the end hook logs the
    rest once. The store is put in WAL mode (commits without a wait for fsync)."""
    import sqlite3

    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    uri = tracking.resolve_uri("sqlite:///results/mlflow.db", tmp_path)
    inv = tracking.start_invocation(uri, results, "ci", {})
    bg = tracking.start_background_replay(results, {"uri": uri}, interval_s=0.05)
    try:
        _payload(results, inv["id"], "done", finished=True)
        _payload(results, inv["id"], "busy", finished=False)
        done = results / "ci" / "m" / "done" / "seed0"
        for _ in range(400):  # bounded: 20 s at most
            if (done / "tracking_logged.json").exists():
                break
            time.sleep(0.05)
        assert (done / "tracking_logged.json").exists() and not (done / tracking.PENDING).exists()
        assert (results / "ci" / "m" / "busy" / "seed0" / tracking.PENDING).exists()
    finally:
        n_end = tracking.replay_or_warn(results, {"uri": uri})  # stops the thread first
    assert bg.logged >= 1 and bg.cpu_s > 0 and not bg._thread.is_alive()
    assert n_end == 1  # only the job that never ended, logged FAILED
    parent, kids = _runs(tracking._client(uri), inv["id"])
    assert kids["done"].info.status == "FINISHED" and kids["busy"].info.status == "FAILED"
    db = uri[len("sqlite:///"):]
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_jobs_of_a_killed_invocation_on_other_methods_do_not_hold_this_run(dead_checkout, capsys):
    """An orphaned job of a dead run of another method (or scale) writes other outputs: this run
    goes on (without resuming or reaping the dead one), and says so in one line."""
    from reprozoo.cli import main

    work, dead, calls = dead_checkout
    _set_record(work / "results", dead["id"], config={"scale": "ci", "methods": ["rex"]})
    orphan = _fake_snakemake(work, dead["id"])
    try:
        assert main(["run", "ftrl_regret", "--scale", "ci"]) == 0
        out = capsys.readouterr().out
        assert "other methods or another scale" in out and str(orphan.pid) in out
        assert all("--unlock" not in c for c in calls)
        assert main(["run", "rex", "--scale", "ci"]) == 1  # the same method still waits
    finally:
        orphan.kill()
        orphan.wait(10)
