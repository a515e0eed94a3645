"""Integration: Snakemake killed with SIGKILL during a ci run, then resumed.

The first run of ``ftrl_regret`` (deferred tracking into sqlite:///results/mlflow.db) is held
inside one cell (``ogd_tuned``), some cells finished before it, and its Snakemake process is killed
with SIGKILL, as an operator's ``kill -9`` would. Its job runs on (an orphan): ``reprozoo run``
must refuse to resume under it. Once the job is killed too, ``reprozoo run`` removes the stale
lock, says so in one line, and resumes; the dead invocation's parent run ends KILLED, its
unfinished cell FAILED, its finished cells FINISHED, and the rerun's parent FINISHED. Then the
store is put back the way the old code left it (parent and the cut cell RUNNING, nothing
recorded) and ``reprozoo sync`` repairs it. Every wait is bounded.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workcopy import copy_workflow

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration
METHOD, HELD = "ftrl_regret", "ogd_tuned"
RUN_BEFORE = "dftrl_ensemble"  # a cell the scheduler runs before HELD (the spec's order)
HOLD = f'''

# test_reaping: hold the cell named by REPROZOO_TEST_HOLD (bounded) so that a kill lands inside it
import os as _os
import time as _time

_train_unheld = train


def train(ctx):
    if ctx.variant == _os.environ.get("REPROZOO_TEST_HOLD"):
        _time.sleep(300)
    return _train_unheld(ctx)
'''


def _env(work, **extra):
    """The copy's own package first (the installed one may be another checkout), no inherited
    tracking store or invocation."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "REPROZOO_INVOCATION")}
    env["PYTHONPATH"] = os.pathsep.join([str(work / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _cli(work, *args, timeout=900):
    return subprocess.run([sys.executable, "-m", "reprozoo.cli", *args], cwd=work, env=_env(work),
                          capture_output=True, text=True, timeout=timeout)


def _status(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _runs(client, inv_id):
    exp = client.get_experiment_by_name(METHOD).experiment_id
    parents = client.search_runs([exp], f"tags.role = 'pipeline' and tags.invocation = '{inv_id}'")
    assert len(parents) == 1, [p.info.run_name for p in parents]
    kids = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'", max_results=1000)
    return parents[0], {r.data.tags.get("variant", "shared"): r for r in kids}


@pytest.fixture
def work(tmp_path):
    copy_workflow(tmp_path)
    method = tmp_path / "src" / "reprozoo" / "methods" / METHOD / "method.py"
    method.write_text(method.read_text() + HOLD)
    return tmp_path


def test_the_held_cells_are_variants_in_the_order_the_test_needs():
    """A renamed or dropped variant must fail here, in a second, not as a 10-minute wait below."""
    from reprozoo import registry

    ids = [v.id for v in registry.get(METHOD).variants]
    assert RUN_BEFORE in ids and HELD in ids, ids
    assert ids.index(RUN_BEFORE) < ids.index(HELD), ids


def test_a_sigkilled_ci_run_is_reaped_in_mlflow_and_resumed(work):
    from mlflow.tracking import MlflowClient

    from reprozoo import registry

    variants = [v.id for v in registry.get(METHOD).variants]
    t0 = time.monotonic()
    res = work / "results"
    cells = res / "ci" / METHOD
    log = open(work / "first.log", "w")
    first = subprocess.Popen([sys.executable, "-m", "snakemake", "-c2", "--config", "scale=ci",
                              f"methods=[{METHOD}]"], cwd=work, env=_env(work, REPROZOO_TEST_HOLD=HELD),
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pgid = first.pid
    try:
        deadline = time.monotonic() + 600
        while _status(cells / HELD / "seed0" / "tracking_pending.json") != "RUNNING":
            assert first.poll() is None, (work / "first.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the held cell never started"
            time.sleep(0.2)
        assert _status(cells / RUN_BEFORE / "seed0" / "tracking_pending.json") == "FINISHED"
        (dead_id,) = [p.stem for p in (res / ".tracking" / "invocations").glob("*.json")]
        os.kill(first.pid, signal.SIGKILL)  # Snakemake only: its job runs on, held in HELD
        first.wait(30)
        t_kill = time.monotonic() - t0

        held = _cli(work, "run", METHOD, "--scale", "ci", timeout=120)
        assert held.returncode == 1, held.stdout + held.stderr
        assert f"previous invocation {dead_id}" in held.stderr and "still run" in held.stderr, held.stderr
        assert (work / ".snakemake" / "locks").exists()  # the lock is kept under a live job
    finally:
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)  # the orphaned job (and its script) die too
        deadline = time.monotonic() + 60
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        log.close()
    assert not _group_alive(pgid)
    # what the dead invocation left, read once nothing of it can still write: its finished cells,
    # and the cells it cut (the held one, and any the second core had started)
    left = {p.parent.parent.name: _status(p) for p in cells.glob("*/seed0/tracking_pending.json")}
    finished_before = {c for c, s in left.items() if s == "FINISHED"}
    cut = {c for c, s in left.items() if s != "FINISHED"}
    assert RUN_BEFORE in finished_before and HELD in cut, left

    t1 = time.monotonic()
    rerun = _cli(work, "run", METHOD, "--scale", "ci", "-j", "2")
    t_rerun = time.monotonic() - t1
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    lines = [line for line in rerun.stdout.splitlines() if "died without finishing" in line]
    assert len(lines) == 1, rerun.stdout[-3000:]  # one line: what happened, and how this run resumes
    assert f"previous invocation {dead_id}" in lines[0] and "removed its stale Snakemake lock" in lines[0]
    assert "parents KILLED" in lines[0]
    assert "Directory cannot be locked" not in rerun.stdout + rerun.stderr

    client = MlflowClient(tracking_uri=f"sqlite:///{res / 'mlflow.db'}")
    records = {json.loads(p.read_text())["id"]: json.loads(p.read_text())
               for p in (res / ".tracking" / "invocations").glob("*.json")}
    assert records[dead_id]["status"] == "KILLED"
    (new_id,) = set(records) - {dead_id}
    assert records[new_id]["status"] == "FINISHED"

    def check():
        parent, kids = _runs(client, dead_id)
        assert parent.info.status == "KILLED"
        assert set(kids) == finished_before | cut, set(kids)  # cells never started have no run
        assert all(kids[c].info.status == "FINISHED" and kids[c].data.metrics for c in finished_before)
        assert all(kids[c].info.status == "FAILED" and "killed" in kids[c].data.tags["error"] for c in cut)
        new_parent, new_kids = _runs(client, new_id)
        assert new_parent.info.status == "FINISHED"
        assert set(new_kids) == set(variants), set(new_kids)  # the batch job reran every cell
        assert {r.info.status for r in new_kids.values()} == {"FINISHED"}
        exp = client.get_experiment_by_name(METHOD).experiment_id
        assert not client.search_runs([exp], "attributes.status = 'RUNNING'")
        return parent, kids

    parent, kids = check()

    # the store the old code left: the dead parent (and, as a killed live job leaves it, the cut
    # cell) still RUNNING, and no parent recorded for the invocation; `reprozoo sync` repairs it
    client.update_run(parent.info.run_id, status="RUNNING")
    client.update_run(kids[HELD].info.run_id, status="RUNNING")
    path = res / ".tracking" / "invocations" / f"{dead_id}.json"
    path.write_text(json.dumps(dict(records[dead_id], parents={})))
    t2 = time.monotonic()
    sync = _cli(work, "sync", timeout=300)
    t_sync = time.monotonic() - t2
    assert sync.returncode == 0, sync.stdout + sync.stderr
    assert "closed 1 parent run(s)" in sync.stdout and "1 unfinished child run(s)" in sync.stdout, sync.stdout
    check()
    print(f"kill after {t_kill:.1f} s; rerun {t_rerun:.1f} s; sync {t_sync:.1f} s; "
          f"total {time.monotonic() - t0:.1f} s")


def test_a_killed_invocation_is_reaped_on_a_tracking_server(tmp_path, monkeypatch):
    """Live tracking (paper scale, clusters): the dead invocation's parent and its jobs' runs are
    on an MLflow server (here on 127.0.0.1). The next invocation ends the parent KILLED and the
    run its killed job left RUNNING as FAILED; `repair_runs` (what `reprozoo sync` calls) does
    the same for a server whose runs an earlier version left RUNNING."""
    from reprozoo import tracking

    env = _env(tmp_path, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_")}
    state_file = tmp_path / "server.json"
    started = subprocess.run(
        [sys.executable, "-m", "reprozoo.cli", "server", "--detach", "--port", "0", "--workers", "1",
         "--wait", "150", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "arts"), "--state-file", str(state_file)],
        cwd=tmp_path, env=dict(env, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=200)
    assert started.returncode == 0, started.stdout + started.stderr
    uri = json.loads(state_file.read_text())["uri"]
    assert uri.startswith("http://127.0.0.1:")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    try:
        results = tmp_path / "results"
        dead = tracking.start_invocation(uri, results, "paper", {})
        runs = {}
        for name in ("done", "cut"):  # live jobs: each opens its run at start
            run = tracking.JobRun(method="m", run_name=name, results=results, tags={"rule": "train"},
                                  pending_path=tmp_path / f"{name}.json", uri=uri)
            run.__enter__()
            run.log_metrics({"x": 1.0})
            if name == "done":
                run.__exit__(None, None, None)
            assert run.error is None, run.error
            runs[name] = run.run_id
        record = tracking.read_invocation(results, dead["id"])
        parent = record["parents"]["m"]
        tracking._inv_path(results, dead["id"]).write_text(json.dumps(dict(record, pid=2 ** 22 + 12345)))
        tracking.start_invocation(uri, results, "paper", {})  # the next invocation reaps it
        client = tracking._client(uri)

        def check():
            assert client.get_run(parent).info.status == "KILLED"
            assert client.get_run(runs["done"]).info.status == "FINISHED"
            cut = client.get_run(runs["cut"])
            assert cut.info.status == "FAILED" and "killed" in cut.data.tags["error"]

        check()
        assert tracking.read_invocation(results, dead["id"])["status"] == "KILLED"
        # what an earlier version left on the server: parent and cut run RUNNING
        client.update_run(parent, status="RUNNING")
        client.update_run(runs["cut"], status="RUNNING")
        assert tracking.repair_runs(results, uri) == (1, 1)
        check()
    finally:
        subprocess.run([sys.executable, "-m", "reprozoo.cli", "server", "--stop", "--state-file", str(state_file)],
                       cwd=tmp_path, env=dict(env, PYTHONPATH=str(ROOT / "src")), capture_output=True, timeout=60)
