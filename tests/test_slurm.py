"""The workflow on a real (single-node) SLURM cluster, through profiles/slurm, logging to an MLflow server.

The cluster: a running one if `sinfo` answers, else `.ci/slurm-up.sh` starts one from Debian's
packages (and `.ci/slurm-down.sh` stops, by pid, what it started); where that is impossible (not
root, no apt) the tests are skipped with the reason. The workflow runs in a temporary copy of the
repository at scale=ci for up to three registered methods (the fastest ones; all of them while fewer
than three exist), with `reprozoo server` on 127.0.0.1 and one train job made to fail on its first
attempt (config `inject_failure`), so one run checks both the normal path and the retry.

Checks without sacct (accounting is off): the main Snakemake log lists every submission, the SLURM
job logs (kept by the profile) show which jobs ran inside which SLURM job, `squeue --states=all`
shows recent jobs' states and memory requests, and the MLflow server holds the runs and their tags.

The two tests at the bottom need no cluster: paper-scale jobs ask for GPUs (a dry run fed to the
plugin's own sbatch builders) and `reprozoo server` alone (loopback, state file, stop by pid).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from reprozoo import registry

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
COPY = ["Snakefile", "workflows", "envs", "config", "profiles", "src"]
RUN_TIMEOUT = int(os.environ.get("REPROZOO_SLURM_TEST_TIMEOUT", 540))  # the whole workflow, seconds
USABLE = re.compile(r"^(idle|mixed|allocated|completing)")


# --- the cluster -------------------------------------------------------------------------------

def _sinfo_ok() -> bool:
    if not shutil.which("sinfo"):
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(USABLE.match(s) for s in out.stdout.split())


@pytest.fixture(scope="module")
def slurm_cluster():
    if _sinfo_ok():
        yield {"started_here": False}
        return
    up = subprocess.run(["bash", str(ROOT / ".ci" / "slurm-up.sh")], capture_output=True, text=True,
                        timeout=int(os.environ.get("SLURM_UP_TIMEOUT", 240)) + 60)
    if up.returncode == 77:
        reason = [l for l in up.stderr.splitlines() if "SKIP" in l] or up.stderr.splitlines()[-1:]
        pytest.skip(f"no SLURM cluster can be started here: {' '.join(reason)}")
    if up.returncode != 0 or not _sinfo_ok():
        pytest.fail(f".ci/slurm-up.sh failed (rc {up.returncode}):\n{up.stderr[-3000:]}")
    try:
        yield {"started_here": True}
    finally:  # stop the daemons it started, by their process ids
        subprocess.run(["bash", str(ROOT / ".ci" / "slurm-down.sh")], timeout=60)


def _status_command() -> str:
    """sacct needs accounting; a cluster without it (like ours) is watched with squeue."""
    if os.environ.get("REPROZOO_SLURM_STATUS"):
        return os.environ["REPROZOO_SLURM_STATUS"]
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=10).stdout
    return "squeue" if re.search(r"AccountingStorageType\s*=\s*accounting_storage/none", out) else "sacct"


# --- what to run -------------------------------------------------------------------------------

ENV_COST = {"core": 0, "torch": 1, "eeg": 2, "atomistic": 2}


def _cost(spec) -> tuple:
    """Cheap first: few SLURM jobs in the test's plan, light environments, small ci budgets."""
    jobs = len(spec.datasets) + int(spec.train_shared) + len(pick_variants(spec)) + 1  # +1: evaluate+verify
    res = spec.resources_for("ci")
    return (jobs, ENV_COST.get(spec.env, 3), res["runtime"], res["mem_mb"], spec.id)


def pick_methods(n: int = 3) -> list[str]:
    """REPROZOO_SLURM_TEST_METHODS=a,b,c chooses them; else the n cheapest registered methods."""
    wanted = [m for m in os.environ.get("REPROZOO_SLURM_TEST_METHODS", "").split(",") if m.strip()]
    if wanted:
        return [registry.get(m.strip()).id for m in wanted]
    specs = sorted(registry.all_specs(), key=_cost)
    return [s.id for s in specs[:n]]


def pick_variants(spec) -> list[str]:
    """The paper's method and one baseline: every stage runs, in a test-sized number of jobs."""
    chosen = [next(v.id for v in spec.variants if v.role == "method")]
    chosen += [v.id for v in spec.variants if v.role == "baseline"][:1]
    return chosen


# --- log parsing -------------------------------------------------------------------------------

SUBMITTED = re.compile(r"Job (\S+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.?$", re.M)
RULE = re.compile(r"^\s*(local)?rule (\w+):\s*$")


SHOWN_LOG = re.compile(r"^Logfile [^\n]*:\n={40,}\n.*?^={40,}$", re.M | re.S)


def executed(log_text: str) -> list[tuple[str, bool, tuple[str, ...], int]]:
    """(rule, local, outputs, attempt) for each job block Snakemake printed (not counting the
    failed jobs' logs it shows with --show-failed-logs)."""
    jobs, cur = [], None
    for line in SHOWN_LOG.sub("", log_text).splitlines():
        m = RULE.match(line)
        if m:
            cur = {"rule": m.group(2), "local": bool(m.group(1)), "output": (), "attempt": 1}
            jobs.append(cur)
            continue
        if cur is None:
            continue
        s = line.strip()
        if s.startswith("output: "):
            cur["output"] = tuple(x.strip() for x in s[len("output: "):].split(","))
        elif s.startswith("resources: ") and "attempt=" in s:
            cur["attempt"] = int(re.search(r"attempt=(\d+)", s).group(1))
    return [(j["rule"], j["local"], j["output"], j["attempt"]) for j in jobs]


def squeue_history() -> dict[str, dict]:
    """Jobs slurmctld still remembers (MinJobAge): id -> state, memory (no sacct needed)."""
    out = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%T|%m|%j"], capture_output=True,
                         text=True, timeout=20).stdout
    rows = [l.split("|") for l in out.splitlines() if l.count("|") == 3]
    return {r[0]: {"state": r[1], "mem": r[2], "name": r[3]} for r in rows}


def _mem_mb(s: str) -> int:
    m = re.fullmatch(r"(\d+)([MG]?)", s.strip())
    return int(m.group(1)) * (1024 if m.group(2) == "G" else 1)


# --- the run -----------------------------------------------------------------------------------

def _server(workdir: Path, env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "reprozoo.cli", "server", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster_run(slurm_cluster, tmp_path_factory):
    t_start = time.monotonic()
    work = tmp_path_factory.mktemp("slurm-run")
    for name in COPY:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(
            src, work / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if src.is_dir() else {}))

    methods = pick_methods(3)
    assert methods, "no registered method"
    if len(methods) < 3:
        msg = (f"only {len(methods)} method(s) registered ({', '.join(methods)}): the SLURM test runs "
               f"those; it runs three as soon as three exist")
        print(f"\n[test_slurm] {msg}")
        warnings.warn(msg)
    specs = {m: registry.get(m) for m in methods}
    variants = {m: pick_variants(specs[m]) for m in methods}
    failing = {"method": methods[0], "variant": variants[methods[0]][-1], "seed": 0, "attempts": 1}
    # one SLURM job per variant x seed (the paper-scale fan-out), at the ci scale's sizes
    run_config = {"scale": "ci", "methods": methods, "seeds": [0], "variants": variants, "fanout": "cell",
                  "inject_failure": [failing]}
    (work / "slurm-test.yaml").write_text(yaml.safe_dump(run_config))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SNAKEMAKE_", "SLURM_"))}
    env.update(PYTHONPATH=str(work / "src"), PYTHONUNBUFFERED="1",
               REPROZOO_SLURM_STATUS=_status_command(),
               REPROZOO_SLURM_INIT_SECONDS=os.environ.get("REPROZOO_SLURM_INIT_SECONDS", "5"))

    # the MLflow server, on 127.0.0.1 and a free port; `--detach` waits (bounded) until it answers
    t0 = time.monotonic()
    srv = _server(work, env, "--detach", "--port", "0", "--workers", "1", "--wait", "150")
    assert srv.returncode == 0, f"reprozoo server failed:\n{srv.stdout}\n{srv.stderr}"
    state = json.loads((work / "results" / ".tracking" / "server.json").read_text())
    assert state["host"] == "127.0.0.1" and state["uri"].startswith("http://127.0.0.1:")
    t_server = time.monotonic() - t0

    try:
        rc, text, t_workflow = _run_workflow(work, env)
        # everything the tests need from the server, before it stops
        from mlflow.tracking import MlflowClient

        client = MlflowClient(state["uri"])
        runs = {}
        for m in methods:
            exp = client.get_experiment_by_name(m)
            runs[m] = client.search_runs([exp.experiment_id]) if exp else []
    finally:  # stop the server by its pid, whatever happened
        stop = _server(work, env, "--stop", timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(state["pid"]):
            time.sleep(0.2)
        if _alive(state["pid"]):  # never leave it behind
            os.killpg(state["pid"], signal.SIGKILL)

    timings = {"server_start_s": round(t_server, 1), "workflow_s": round(t_workflow, 1),
               "total_s": round(time.monotonic() - t_start, 1)}
    print(f"\n[test_slurm] methods={methods} variants={variants} failing={failing} timings={timings}")
    assert rc == 0, f"snakemake on SLURM failed (rc {rc}); log tail:\n{text[-6000:]}"
    return SimpleNamespace(work=work, methods=methods, variants=variants, failing=failing, log=text,
                           runs=runs, server=state, server_stopped=stop, timings=timings)


def _run_workflow(work: Path, env: dict) -> tuple:
    """snakemake through profiles/slurm, bounded by RUN_TIMEOUT; the profile finds the server's URI
    in results/.tracking/server.json."""
    cmd = [PY, "-m", "snakemake", "--profile", "profiles/slurm", "--workflow-profile", "none",
           "--configfile", "slurm-test.yaml"]
    log_path = work / "snakemake-slurm.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # Snakemake cancels its SLURM jobs on interrupt
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            run_id = re.search(r"SLURM run ID: (\S+)", log_path.read_text())
            if run_id:  # whatever is left of this run's jobs (they carry its name)
                subprocess.run(["scancel", "--name", run_id.group(1)], timeout=20)
            rc = f"timeout after {RUN_TIMEOUT} s"
    return rc, log_path.read_text(), time.monotonic() - t0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return ""


# --- tests -------------------------------------------------------------------------------------

@pytest.mark.slurm
def test_every_job_ran_as_a_slurm_job_and_all_outputs_exist(cluster_run):
    r = cluster_run
    jobs = executed(r.log)
    local = {rule for rule, is_local, _, _ in jobs if is_local}
    assert local <= {"all"}, f"jobs ran outside SLURM: {local}"
    remote = [(rule, out, att) for rule, is_local, out, att in jobs if not is_local]
    assert remote, "no job was submitted"

    submitted = SUBMITTED.findall(r.log)
    slurm_ids = [sid for _, sid, _ in submitted]
    assert len(set(slurm_ids)) == len(slurm_ids)
    ran_inside: dict[tuple[str, ...], set] = {}
    for _, sid, logfile in submitted:
        path = Path(logfile)
        assert path.is_file(), f"SLURM log {path} is missing (the profile keeps them)"
        assert path.stem == sid
        for rule, _, out, _ in executed(path.read_text()):
            ran_inside.setdefault(out, set()).add(sid)
    for rule, out, _ in remote:
        assert ran_inside.get(out), f"{rule} -> {out} ran in no SLURM job"

    history = squeue_history()  # what slurmctld still remembers (MinJobAge)
    name = re.search(r"SLURM run ID: (\S+)", r.log).group(1)
    for sid in slurm_ids:
        if sid in history:
            assert history[sid]["name"] == name
            assert history[sid]["state"] in ("COMPLETED", "FAILED"), history[sid]
    failed = [sid for sid in slurm_ids if history.get(sid, {}).get("state") == "FAILED"]
    assert len(failed) <= 1, f"only the injected failure may fail: {failed}"

    from reprozoo import config as rz_config

    plan = rz_config.plan(rz_config.load(yaml.safe_load((r.work / "slurm-test.yaml").read_text())))
    res = r.work / "results"
    for m in r.methods:
        spec = registry.get(m)
        for v in r.variants[m]:
            assert (res / "ci" / m / v / "seed0" / "metrics.json").is_file()
        sel = res / "ci" / m / plan.selection(m)
        assert (sel / "metrics.parquet").is_file()
        assert (sel / "plots").is_dir() and any((sel / "plots").glob("*.png"))
        claims = json.loads((sel / "claims.json").read_text())
        assert claims["scale"] == "ci" and claims["variants"] == sorted(r.variants[m])
        for d in spec.datasets_for("ci"):
            assert (res / "data" / d / "ci" / "card.json").is_file()
        if spec.train_shared:
            assert (res / "ci" / m / "_shared" / "seed0" / "done.json").is_file()
    for f in ("summary.md", "summary.parquet", "report.html"):
        assert (res / "ci" / plan.report_selection() / f).is_file()


@pytest.mark.slurm
def test_every_run_is_in_mlflow_with_its_slurm_job_id(cluster_run):
    r = cluster_run
    submitted = {sid: Path(logfile) for _, sid, logfile in SUBMITTED.findall(r.log)}
    for m in r.methods:
        runs = r.runs[m]
        assert runs, f"no MLflow runs for {m}"
        for run in runs:
            tags = run.data.tags
            assert tags.get("slurm_job_id") in submitted, (m, run.info.run_name, tags.get("slurm_job_id"))
        parents = [x for x in runs if x.data.tags.get("role") == "pipeline"]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        train = [x for x in runs if x.data.tags.get("rule") == "train" and x.info.status == "FINISHED"]
        assert sorted(x.data.tags["variant"] for x in train) == sorted(r.variants[m])
        for x in train:  # the run's SLURM job is the one whose log belongs to that very job
            log = submitted[x.data.tags["slurm_job_id"]]
            assert log.parent.name == f"{m}_{x.data.tags['variant']}_0" and log.parent.parent.name == "rule_train"
            assert x.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        if registry.get(m).train_shared:
            shared = [x for x in runs if x.data.tags.get("rule") == "train_shared"]
            assert [x.info.status for x in shared] == ["FINISHED"]


@pytest.mark.slurm
def test_failed_job_is_retried_with_more_memory_and_its_run_is_failed(cluster_run):
    r = cluster_run
    f = r.failing
    runs = [x for x in r.runs[f["method"]]
            if x.data.tags.get("rule") == "train" and x.data.tags.get("variant") == f["variant"]]
    by_attempt = {int(x.data.tags["attempt"]): x for x in runs}
    assert sorted(by_attempt) == [1, 2], [(x.data.tags.get("attempt"), x.info.status) for x in runs]
    first, second = by_attempt[1], by_attempt[2]
    assert first.info.status == "FAILED" and "InjectedFailure" in first.data.tags.get("error", "")
    assert second.info.status == "FINISHED"
    mem1, mem2 = int(first.data.tags["mem_mb"]), int(second.data.tags["mem_mb"])
    assert mem2 == 2 * mem1 == 2 * registry.get(f["method"]).resources_for("ci")["mem_mb"]
    id1, id2 = first.data.tags["slurm_job_id"], second.data.tags["slurm_job_id"]
    assert id1 != id2, "the retry is a new SLURM job"

    # Snakemake submitted attempt 2 with the larger request ...
    attempts = [(att, out) for rule, local, out, att in executed(r.log)
                if rule == "train" and not local and f"/{f['variant']}/seed0/" in out[0]
                and out[0].startswith(f"results/ci/{f['method']}/")]
    # (the log may print a job's block again when it reports the failure: compare the attempts seen)
    assert sorted({a for a, _ in attempts}) == [1, 2]
    # ... and SLURM got it (while slurmctld remembers the jobs)
    history = squeue_history()
    if id1 in history and id2 in history:
        assert history[id1]["state"] == "FAILED" and history[id2]["state"] == "COMPLETED"
        assert _mem_mb(history[id1]["mem"]) == mem1 and _mem_mb(history[id2]["mem"]) == mem2
    log1 = r.work / ".snakemake" / "slurm_logs" / "rule_train" / f"{f['method']}_{f['variant']}_0" / f"{id1}.log"
    assert log1.is_file() and "InjectedFailure" in log1.read_text()


@pytest.mark.slurm
def test_mlflow_server_was_local_and_stopped_by_pid(cluster_run):
    r = cluster_run
    assert r.server["host"] == "127.0.0.1"
    assert r.server_stopped.returncode == 0 and f"pid {r.server['pid']}" in r.server_stopped.stdout
    assert not _alive(r.server["pid"])
    assert not (r.work / "results" / ".tracking" / "server.json").exists()


# --- no cluster needed ---------------------------------------------------------------------------

def test_paper_scale_asks_for_gpus_and_the_profile_takes_settings_from_the_environment(tmp_path, monkeypatch):
    """Dry run through profiles/slurm at scale=paper; then the plugin's own sbatch builders."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    for name in COPY:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SNAKEMAKE_", "SLURM_"))}
    env.update(PYTHONPATH=str(tmp_path / "src"), REPROZOO_SLURM_PARTITION="all",
               REPROZOO_SLURM_STATUS="squeue")
    out = subprocess.run([PY, "-m", "snakemake", "--profile", "profiles/slurm", "--workflow-profile", "none",
                          "--config", "scale=paper", "-n"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    blocks = _blocks(out.stdout + out.stderr)
    assert blocks
    # a partition named like a Python builtin stays a string
    assert all(b["resources"].get("slurm_partition") == "all" for b in blocks)
    checked = 0
    for b in blocks:
        if b["rule"] not in ("train", "train_shared"):
            continue
        res = registry.get(b["wildcards"]["method"]).resources_for("paper")
        assert int(b["resources"]["mem_mb"]) == res["mem_mb"]  # attempt 1
        assert int(b["resources"]["runtime"]) == res["runtime"]
        assert int(b["resources"].get("gpu", 0)) == res["gpu"]
        job = _fake_job(b["resources"], threads=res["threads"])
        sbatch = get_submit_command(job, {"run_uuid": "x", "slurm_logfile": "x.log", "comment_str": "c",
                                          "account": "", "partition": "-p all", "workdir": str(tmp_path)})
        sbatch += set_gres_string(job)
        assert f"--mem {res['mem_mb']}" in sbatch and f"-t {res['runtime']}" in sbatch
        assert f"--cpus-per-task={res['threads']}" in sbatch
        if res["gpu"]:
            assert f"--gpus={res['gpu']}" in sbatch
        checked += 1
    assert checked, "no training job in the paper-scale DAG"
    paper_gpu = [m for m in registry.method_ids() if registry.get(m).resources_for("paper")["gpu"]]
    assert paper_gpu, "no method asks for a GPU at the paper scale"

    # the status command and the init delay come from the environment, sacct by default
    from snakemake.profiles import ProfileConfigFileParser

    monkeypatch.setattr(sys, "argv", ["snakemake", "-n", "--workflow-profile", "none"])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the profile exports what it finds
    monkeypatch.setenv("REPROZOO_SERVER_FILE", str(tmp_path / "no-server.json"))
    monkeypatch.setenv("_REPROZOO_PROFILE_SAID", "1")
    for value, expected in ((None, "sacct"), ("squeue", "squeue")):
        if value is None:
            monkeypatch.delenv("REPROZOO_SLURM_STATUS", raising=False)
        else:
            monkeypatch.setenv("REPROZOO_SLURM_STATUS", value)
        with open(tmp_path / "profiles" / "slurm" / "config.yaml") as fh:
            parsed = ProfileConfigFileParser().parse(fh)
        assert parsed["slurm-status-command"] == expected
        assert parsed["executor"] == "slurm" and int(parsed["retries"]) >= 1
        assert "mem_mb=2000 * attempt" in parsed["default-resources"]
        assert not any("slurm_account" in r for r in parsed["default-resources"])  # unset unless asked
    assert "MLFLOW_TRACKING_URI" not in os.environ


def _blocks(text: str) -> list[dict]:
    out, cur = [], None
    for line in text.splitlines():
        m = RULE.match(line)
        if m:
            cur = {"rule": m.group(2), "resources": {}, "wildcards": {}}
            out.append(cur)
        elif cur is not None and line.strip().startswith(("resources: ", "wildcards: ")):
            key, _, rest = line.strip().partition(": ")
            cur[key] = dict(kv.split("=", 1) for kv in rest.split(", ") if "=" in kv)
    return [b for b in out if b["rule"] != "all"]


class _Res(dict):
    __getattr__ = dict.get


def _fake_job(resources: dict, threads: int):
    res = _Res({k: (int(v) if str(v).isdigit() else v) for k, v in resources.items()})
    return SimpleNamespace(resources=res, threads=threads, name="train", is_group=lambda: False)


def _group_members(pgid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(p.name))
    return out


def test_server_binds_loopback_records_its_uri_takes_runs_and_stops_by_pid(tmp_path):
    """`reprozoo server`: 127.0.0.1 and a free port, state file for the profile, artifacts proxied
    to --artifacts-destination, idempotent --detach, --stop ends the server and its workers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    backend, arts = tmp_path / "db" / "mlflow.db", tmp_path / "artifacts"
    args = ["--detach", "--port", "0", "--workers", "1", "--wait", "150",
            "--backend-store-uri", f"sqlite:///{backend}", "--artifacts-destination", str(arts)]
    started = _server(tmp_path, env, *args)
    assert started.returncode == 0, started.stdout + started.stderr
    state_file = tmp_path / "results" / ".tracking" / "server.json"
    state = json.loads(state_file.read_text())
    try:
        assert state["host"] == "127.0.0.1" and state["uri"] == f"http://127.0.0.1:{state['port']}"
        assert state["backend_store_uri"] == f"sqlite:///{backend}" and backend.exists()
        again = _server(tmp_path, env, *args)  # a second --detach finds it and starts nothing
        assert again.returncode == 0 and "already running" in again.stdout
        assert _server(tmp_path, env, "--status").returncode == 0

        from mlflow.tracking import MlflowClient

        client = MlflowClient(state["uri"])
        run = client.create_run(client.create_experiment("probe"), tags={"slurm_job_id": "42"})
        (tmp_path / "a.txt").write_text("artifact")
        client.log_artifact(run.info.run_id, str(tmp_path / "a.txt"))
        client.set_terminated(run.info.run_id)
        assert client.get_run(run.info.run_id).data.tags["slurm_job_id"] == "42"
        assert list(arts.rglob("a.txt")), "artifacts go to --artifacts-destination through the server"
        assert len(_group_members(state["pid"])) >= 2  # the mlflow CLI and its uvicorn worker
    finally:
        stopped = _server(tmp_path, env, "--stop", timeout=60)
    assert f"pid {state['pid']}" in stopped.stdout
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _group_members(state["pid"]):
        time.sleep(0.2)
    assert not _group_members(state["pid"]), "a server process outlived --stop"
    assert not state_file.exists()
    assert _server(tmp_path, env, "--status").returncode == 1
