"""MLflow tracking that never endangers the result files.

Design (see docs/tracking.md):
- The store and one experiment per method are created once, before jobs fan out
  (:func:`init_store`, called from the Snakefile's ``onstart``), because concurrent
  first-time schema creation and duplicate experiment creation race in MLflow.
- Each pipeline invocation has an id (``results/.tracking/invocation.json``). The parent run of a
  method in that invocation is created lazily, under a file lock, by the first job of the method
  that needs it, so a no-op rerun leaves no empty parent runs.
- Two modes (config ``tracking.mode``). **live** (paper scale, clusters): every job opens its own
  run at start (so a crash marks it FAILED), writes its result files first, and logs in batches
  at the end. **deferred** (ci, smoke): jobs never import MLflow (about 3-6 s a job on 2 cores);
  each writes its run as a payload file beside its outputs (status RUNNING at start, FINISHED or
  FAILED at the end), and the invocation's end hook replays every payload in one process,
  parents, children, dataset inputs and artifacts, exactly as live jobs would have logged them.
  A job killed before it could write its status stays RUNNING in its payload and is logged
  FAILED. Tracking calls are retried; if they still fail, the job
  warns loudly, records what it could not log in ``tracking_pending.json`` next to its outputs and
  still succeeds: the files under results/ are the source of truth (``reprozoo sync`` replays them).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from .io import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_URI = "sqlite:///results/mlflow.db"
STATE_DIR_NAME = ".tracking"
PENDING = "tracking_pending.json"          # a child run not yet in MLflow
PARENT_PENDING = "tracking_parent_pending.json"  # a method's claims/table/plots not yet in MLflow


def mode_for(configured: str | None, scale: str, uri: str | None = None) -> str:
    """``auto``: live at paper scale or with a tracking server (clusters: runs appear as jobs
    finish), deferred at ci/smoke on the embedded store (one MLflow import per invocation)."""
    if configured in ("live", "deferred"):
        return configured
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    return "live" if scale == "paper" or uri.startswith(("http://", "https://")) else "deferred"


def resolve_uri(configured: str | None = None, workdir: Path | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` wins; relative sqlite paths are made absolute against ``workdir``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or configured or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        path = (Path(workdir or os.getcwd()) / rel).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{path}"
    return uri


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def retry(fn: Callable, retries: int = 3, what: str = "tracking call", base_delay: float = 0.5):
    """Call ``fn``; on failure wait and retry, printing each failure so nothing fails silently."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - any tracking backend error is retried
            if attempt == retries:
                raise
            delay = base_delay * 2**attempt
            print(f"[reprozoo.tracking] {what} failed ({type(exc).__name__}: {exc}); "
                  f"retry {attempt + 1}/{retries} in {delay:.1f}s", file=sys.stderr, flush=True)
            time.sleep(delay)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def base_tags(**extra: Any) -> dict[str, str]:
    tags = {"git_commit": git_commit(), "host": socket.gethostname()}
    if os.environ.get("SLURM_JOB_ID"):
        tags["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
    tags.update({k: str(v) for k, v in extra.items() if v is not None})
    return tags


def artifact_root(results: Path) -> Path:
    return (results / "mlartifacts").resolve()


def get_or_create_experiment(client, name: str, results: Path) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:"):
        location = (artifact_root(results) / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another process: read it back
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def init_store(uri: str, methods: Iterable[str], results: Path) -> dict[str, str]:
    """Create the schema and the experiments once, before any job runs."""
    client = _client(uri)
    return {m: retry(lambda m=m: get_or_create_experiment(client, m, results), what=f"create experiment {m}")
            for m in methods}


def init_store_or_warn(uri: str, methods: Iterable[str], results: Path) -> None:
    """Like :func:`init_store`, but an unreachable store only warns: jobs still run and keep
    their payloads for ``reprozoo sync``."""
    try:
        init_store(uri, methods, results)
    except Exception as exc:  # noqa: BLE001
        print(f"[reprozoo.tracking] WARNING: tracking store {uri} is unavailable ({exc}); "
              "the pipeline runs on and results stay in results/.", file=sys.stderr, flush=True)


# --- invocations and parent runs -------------------------------------------------------------

def state_dir(results: Path) -> Path:
    d = results / STATE_DIR_NAME
    d.mkdir(parents=True, exist_ok=True)
    return d


def start_invocation(uri: str, results: Path, scale: str, config: dict) -> dict:
    info = {"id": uuid.uuid4().hex[:12], "uri": uri, "scale": scale, "started": time.time(),
            "parents": {}, "config": config}
    atomic_write_text(state_dir(results) / "invocation.json", json.dumps(info, indent=1, default=str))
    return info


@contextlib.contextmanager
def _locked(results: Path):
    with open(state_dir(results) / "invocation.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_invocation(results: Path) -> dict | None:
    path = results / STATE_DIR_NAME / "invocation.json"
    return json.loads(path.read_text()) if path.exists() else None


def parent_run_id(client, method: str, results: Path) -> str | None:
    """Parent run of ``method`` for the current invocation, created on first use."""
    with _locked(results):
        inv = read_invocation(results)
        if inv is None:
            return None
        if method in inv["parents"]:
            return inv["parents"][method]
        exp_id = get_or_create_experiment(client, method, results)
        run = client.create_run(exp_id, run_name=f"pipeline-{inv['id']}",
                                tags=base_tags(role="pipeline", invocation=inv["id"], scale=inv["scale"]))
        inv["parents"][method] = run.info.run_id
        atomic_write_text(results / STATE_DIR_NAME / "invocation.json", json.dumps(inv, indent=1, default=str))
        return run.info.run_id


def finish_invocation(results: Path, status: str) -> None:
    """Close parent runs; children still RUNNING (killed jobs) are marked FAILED."""
    inv = read_invocation(results)
    if inv is None or not inv["parents"]:
        return
    try:
        client = _client(inv["uri"])
        for method, run_id in inv["parents"].items():
            exp_id = client.get_run(run_id).info.experiment_id
            children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'")
            for child in children:
                client.set_terminated(child.info.run_id, "FAILED")
            client.set_terminated(run_id, status)
    except Exception as exc:  # noqa: BLE001
        print(f"[reprozoo.tracking] WARNING: could not close parent runs: {exc}", file=sys.stderr)


# --- per-job runs ----------------------------------------------------------------------------

def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


class JobRun:
    """One MLflow run for one job. Use as a context manager around the job's work.

    Result files are written by the job before :meth:`log` is called; if tracking fails after the
    retries, the payload is saved to ``pending_path`` so it can be replayed by ``reprozoo sync``.
    """

    def __init__(self, *, method: str, run_name: str, results: Path, tags: dict, pending_path: Path,
                 uri: str | None = None, retries: int = 3, nested: bool = True, deferred: bool = False):
        self.method, self.run_name, self.results = method, run_name, results
        self.deferred = deferred
        self.tags = {**base_tags(), **tags}
        self.pending_path, self.retries = pending_path, retries
        self.uri = resolve_uri(uri)
        self.nested = nested
        self.client = None
        self.run_id: str | None = None
        self.payload: dict[str, Any] = {"params": {}, "metrics": [], "artifacts": [], "tags": {}}
        self.error: str | None = None

    def __enter__(self):
        if self.deferred:  # no MLflow in this process: the payload says RUNNING until the job ends
            inv = read_invocation(self.results) or {}
            self.tags.setdefault("invocation", inv.get("id", "none"))
            self._save_pending("RUNNING")
            return self
        try:
            self.client = _client(self.uri)

            def start():
                exp_id = get_or_create_experiment(self.client, self.method, self.results)
                tags = dict(self.tags)
                parent = parent_run_id(self.client, self.method, self.results) if self.nested else None
                if parent:
                    tags["mlflow.parentRunId"] = parent
                return self.client.create_run(exp_id, run_name=self.run_name, tags=tags).info.run_id

            self.run_id = retry(start, self.retries, what=f"start run {self.run_name}")
        except Exception as exc:  # noqa: BLE001
            self._warn(f"could not start MLflow run: {exc}")
        return self

    def log_params(self, params: dict) -> None:
        self.payload["params"].update(flatten(params))

    def log_metrics(self, scalars: dict[str, float], curves: dict[str, tuple] | None = None) -> None:
        ts = int(time.time() * 1000)
        for k, v in scalars.items():
            self.payload["metrics"].append((k, float(v), ts, 0))
        for name, (xs, ys) in (curves or {}).items():
            integer_x = all(float(x).is_integer() for x in xs)
            for i, (x, y) in enumerate(zip(xs, ys)):
                self.payload["metrics"].append((name, float(y), ts, int(x) if integer_x else i))

    def log_artifact(self, path: Path) -> None:
        self.payload["artifacts"].append(str(path))

    def set_datasets(self, cards: dict[str, dict]) -> None:
        """Record the datasets this run consumed (their cards) as MLflow run inputs."""
        self.payload["datasets"] = {name: {"digest": _card_digest(c), "source": c.get("source", "?"),
                                           "scale": c.get("scale", "?")} for name, c in cards.items()}

    def set_tags(self, tags: dict) -> None:
        self.payload["tags"].update({k: str(v) for k, v in tags.items() if v is not None})

    def _flush(self) -> None:
        from mlflow.entities import Metric, Param, RunTag

        params = [Param(k, str(v)[:6000]) for k, v in self.payload["params"].items()]
        metrics = [Metric(k, v, ts, step) for k, v, ts, step in self.payload["metrics"]
                   if v == v and abs(v) != float("inf")]
        tags = [RunTag(k, v) for k, v in self.payload["tags"].items()]
        for chunk in _chunks(params, 100):
            retry(lambda c=chunk: self.client.log_batch(self.run_id, params=c), self.retries, "log params")
        for chunk in _chunks(metrics, 1000):
            retry(lambda c=chunk: self.client.log_batch(self.run_id, metrics=c), self.retries, "log metrics")
        if tags:
            retry(lambda: self.client.log_batch(self.run_id, tags=tags), self.retries, "log tags")
        if self.payload.get("datasets"):
            from mlflow.entities import Dataset, DatasetInput

            inputs = [DatasetInput(Dataset(name=n, digest=d["digest"], source_type="reprozoo",
                                           source=f"results/data/{n}/{d['scale']}"))
                      for n, d in self.payload["datasets"].items()]
            retry(lambda: self.client.log_inputs(self.run_id, datasets=inputs), self.retries, "log inputs")
        for art in self.payload["artifacts"]:
            p = Path(art)
            if p.is_dir():
                retry(lambda: self.client.log_artifacts(self.run_id, str(p), p.name), self.retries, "log artifacts")
            elif p.exists():
                retry(lambda: self.client.log_artifact(self.run_id, str(p)), self.retries, "log artifact")

    def _warn(self, msg: str) -> None:
        self.error = msg
        bar = "!" * 78
        print(f"\n{bar}\n[reprozoo.tracking] WARNING: {msg}\n"
              f"Result files are intact; the tracking payload is kept in {self.pending_path}\n"
              f"Replay it later with `reprozoo sync`.\n{bar}", file=sys.stderr, flush=True)

    def _save_pending(self, status: str) -> None:
        data = dict(self.payload, status=status, method=self.method, run_name=self.run_name,
                    run_tags=self.tags, error=self.error, uri=self.uri, nested=self.nested,
                    start_time=getattr(self, "_t_start", int(time.time() * 1000)),
                    end_time=int(time.time() * 1000))
        self._t_start = data["start_time"]
        atomic_write_text(self.pending_path, json.dumps(data, indent=1, default=str))

    def __exit__(self, exc_type, exc, tb):
        status = "FINISHED" if exc_type is None else "FAILED"
        if exc_type is not None:
            self.payload["tags"]["error"] = f"{exc_type.__name__}: {exc}"[:5000]
        if self.deferred:
            self._save_pending(status)
            return False
        if self.run_id is None:
            self._save_pending(status)
            return False
        try:
            self._flush()
            retry(lambda: self.client.set_terminated(self.run_id, status), self.retries, "end run")
        except Exception as e:  # noqa: BLE001
            self._warn(f"logging run {self.run_name} failed after {self.retries} retries: {e}")
            self._save_pending(status)
            with contextlib.suppress(Exception):
                self.client.set_terminated(self.run_id, "FAILED" if status == "FAILED" else status)
        return False  # never swallow the job's own exception


def _card_digest(card: dict) -> str:
    import hashlib

    files = card.get("files") or card.get("raw_files") or {}
    blob = "".join(f"{k}:{v.get('sha256', '')}" for k, v in sorted(files.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _parent_for(client, method: str, results: Path, invocation: str | None) -> str | None:
    """The parent run of ``method`` for ``invocation``: the current invocation's (created on
    demand), or an earlier one's looked up by tag (created if it never reached MLflow)."""
    inv = read_invocation(results)
    if inv is not None and (invocation in (None, "none") or invocation == inv["id"]):
        return parent_run_id(client, method, results)
    exp_id = get_or_create_experiment(client, method, results)
    found = client.search_runs([exp_id], f"tags.role = 'pipeline' and tags.invocation = '{invocation}'",
                               max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(exp_id, run_name=f"pipeline-{invocation}",
                            tags=base_tags(role="pipeline", invocation=invocation, replayed="true"))
    return run.info.run_id


def _replay_child(client, data: dict, results: Path, retries: int) -> None:
    run = JobRun(method=data["method"], run_name=data["run_name"], results=results,
                 tags=dict(data["run_tags"]), pending_path=Path(os.devnull), uri=client.tracking_uri,
                 retries=retries, nested=False)
    run.client = client
    exp_id = get_or_create_experiment(client, data["method"], results)
    tags = dict(run.tags)
    if data.get("nested", True):
        parent = _parent_for(client, data["method"], results, tags.get("invocation"))
        if parent:
            tags["mlflow.parentRunId"] = parent
    status = data.get("status", "FAILED")
    if status == "RUNNING":  # the job was killed before it could say how it ended
        status = "FAILED"
        data.setdefault("tags", {})["error"] = "job ended without reporting (killed?)"
    run.run_id = client.create_run(exp_id, run_name=data["run_name"], tags=tags,
                                   start_time=data.get("start_time")).info.run_id
    run.payload = {k: data.get(k, {} if k in ("params", "tags") else []) for k in ("params", "metrics", "artifacts", "tags")}
    if data.get("datasets"):
        run.payload["datasets"] = data["datasets"]
    run._flush()
    client.set_terminated(run.run_id, status, end_time=data.get("end_time"))


def _replay_parent(client, data: dict, results: Path, retries: int) -> None:
    from mlflow.entities import Metric, Param, RunTag

    parent = _parent_for(client, data["method"], results, data.get("invocation"))
    ts = int(time.time() * 1000)
    metrics = [Metric(k, float(v), ts, 0) for k, v in data.get("metrics", {}).items()
               if v is not None and v == v and abs(float(v)) != float("inf")]
    tags = [RunTag(k, str(v)) for k, v in data.get("tags", {}).items()]
    client.log_batch(parent, metrics=metrics, tags=tags)
    params = [Param(k, str(v)[:6000]) for k, v in flatten(data.get("params", {})).items()]
    if params:
        with contextlib.suppress(Exception):  # params are write-once per run
            client.log_batch(parent, params=params)
    if data.get("claims_table"):
        client.log_table(parent, data=data["claims_table"], artifact_file="claims_table.json")
    for art in data.get("artifacts", []):
        p = Path(art)
        if p.is_dir():
            client.log_artifacts(parent, str(p), p.name)
        elif p.exists():
            client.log_artifact(parent, str(p))


def replay_or_warn(results: Path, tracking: dict | None = None) -> int:
    """The end hook: log every pending payload; an unreachable store only warns (payloads stay)."""
    tracking = tracking or {}
    pending = list(Path(results).rglob(PENDING)) + list(Path(results).rglob(PARENT_PENDING))
    if not pending:
        return 0
    t0 = time.perf_counter()
    try:
        n = replay_pending(results, tracking.get("uri"), int(tracking.get("retries", 3)))
    except Exception as exc:  # noqa: BLE001
        print(f"[reprozoo.tracking] WARNING: tracking store unavailable ({exc}); {len(pending)} run payload(s) "
              "stay under results/; replay them with `reprozoo sync`.", file=sys.stderr, flush=True)
        return 0
    print(f"reprozoo: logged {n} run(s) to MLflow in {time.perf_counter() - t0:.1f}s", flush=True)
    return n


def replay_pending(results: Path, uri: str | None = None, retries: int = 3) -> int:
    """Log every pending payload under ``results`` (child runs, then method parents) into MLflow;
    return how many. A payload that logs is renamed ``*_logged.json`` (kept as the record of what
    MLflow holds); one that fails stays for the next ``reprozoo sync``."""
    children = sorted(Path(results).rglob(PENDING))
    parents = sorted(Path(results).rglob(PARENT_PENDING))
    if not children and not parents:
        return 0
    client = _client(resolve_uri(uri))
    n = 0
    for path in children + parents:
        data = json.loads(path.read_text())
        try:
            if path.name == PENDING:
                retry(lambda: _replay_child(client, data, Path(results), retries), retries, f"replay {path}")
            else:
                retry(lambda: _replay_parent(client, data, Path(results), retries), retries, f"replay {path}")
        except Exception as exc:  # noqa: BLE001 - keep the payload; say so
            print(f"[reprozoo.tracking] WARNING: could not replay {path}: {exc}", file=sys.stderr, flush=True)
            continue
        path.replace(path.with_name(path.name.replace("_pending", "_logged")))
        n += 1
    return n
