"""MLflow tracking that never endangers the result files.

Design (see docs/tracking.md):
- The store and one experiment per method are created once, before jobs fan out
  (:func:`init_store`, called from the Snakefile's ``onstart``), because concurrent
  first-time schema creation and duplicate experiment creation race in MLflow.
- Each pipeline invocation has an id and its own state file
  (``results/.tracking/invocations/<id>.json``, exported to jobs as ``REPROZOO_INVOCATION``). The parent run of a
  method in that invocation is created lazily, under a file lock, by the first job of the method
  that needs it, so a no-op rerun leaves no empty parent runs.
- Two modes (config ``tracking.mode``). **live** (paper scale, clusters): every job opens its own
  run at start (so a crash marks it FAILED), writes its result files first, and logs in batches
  at the end. **deferred** (ci, smoke): jobs never import MLflow (about 3-6 s a job on 2 cores);
  each writes its run as a payload file beside its outputs (status RUNNING at start, FINISHED or
  FAILED at the end), and one thread of the Snakemake process logs every finished payload while
  the run goes on (:class:`BackgroundReplay`; the store has a single writer, and on 2 cores the
  logging fills the gaps between jobs instead of adding minutes at the end); the end hook logs
  what is left: parents, children, dataset inputs and artifacts, exactly as live jobs would have.
  A job killed before it could write its status stays RUNNING in its payload and is logged
  FAILED. An invocation whose Snakemake died (kill -9) is reaped by the next one, by
  ``reprozoo run`` or by ``reprozoo sync`` (:func:`reap_orphans`): its parents end KILLED, its
  unfinished children FAILED; ``reprozoo sync`` also closes runs an earlier version left RUNNING
  (:func:`repair_runs`). Tracking calls are retried; if they still fail, the job
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
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from .io import atomic_write_text, pid_alive

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
    uri = os.environ.get("MLFLOW_TRACKING_URI") or uri or ""  # the environment wins, as in resolve_uri
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


_CLIENTS: dict = {}
_SQLITE_TUNED = {"done": False}


def _tune_sqlite() -> None:
    """Every SQLite connection SQLAlchemy opens in this process: write-ahead log, synchronous=NORMAL.

    MLflow commits each call on its own (about 16 commits a run), and with SQLite's default
    rollback journal each commit waits for fsync: 204 ms a run against 68 ms in WAL mode
    (`python -m benchmarks tracking_store`). WAL with synchronous=NORMAL
    cannot corrupt the database on a crash (a power cut may lose the last commits, which the
    payloads under results/ still hold), and readers (the UI) no longer block the writer. WAL needs
    a local filesystem, as SQLite does anyway: on clusters use a tracking server (docs/cluster.md)."""
    if _SQLITE_TUNED["done"]:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(dbapi_con, _record):  # noqa: ANN001
        if isinstance(dbapi_con, sqlite3.Connection):
            cur = dbapi_con.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error:  # a read-only or busy database keeps its mode
                pass
            finally:
                cur.close()

    _SQLITE_TUNED["done"] = True


def _client(uri: str):
    """An MLflow client whose store exists. A SQLite store is created (schema and migrations)
    under a file lock beside the database: concurrent first uses otherwise corrupt it for good
    (``table _alembic_tmp_params already exists``)."""
    if uri in _CLIENTS:
        return _CLIENTS[uri]
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        _tune_sqlite()
        db = Path(uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{db}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:  # the constructor builds the store (schema, migrations): one process at a time
                client = MlflowClient(tracking_uri=uri)
                client._tracking_client.store  # noqa: B018
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    else:
        client = MlflowClient(tracking_uri=uri)
    _CLIENTS[uri] = client
    return client


# Each MLflow HTTP call is bounded (MLflow's defaults retry for about 4 minutes against a dead
# server), and a process spends at most TRACKING_BUDGET_S seconds on tracking in total: past it,
# every call fails at once and the job spools its payload (``reprozoo sync`` replays it).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
TRACKING_BUDGET_S = float(os.environ.get("REPROZOO_TRACKING_BUDGET_S", "15"))
_BUDGET = {"spent": 0.0, "limit": None}


class TrackingBudgetExceeded(RuntimeError):
    pass


def start_budget(seconds: float | None = None) -> None:
    """(Re)start this process's tracking budget: the seconds its tracking calls may take in total,
    waits between retries included (a job calls it once; a batch job once for all its cells)."""
    _BUDGET["spent"] = 0.0
    _BUDGET["limit"] = TRACKING_BUDGET_S if seconds is None else seconds


def _budget_left() -> float:
    limit = _BUDGET["limit"]
    return float("inf") if limit is None else limit - _BUDGET["spent"]


def retry(fn: Callable, retries: int = 3, what: str = "tracking call", base_delay: float = 0.5):
    """Call ``fn``; on failure wait and retry, printing each failure so nothing fails silently.
    Once the process's tracking budget is spent, fail at once."""
    for attempt in range(retries + 1):
        if _budget_left() <= 0:
            raise TrackingBudgetExceeded(f"{what}: tracking budget of {_BUDGET['limit']:g} s spent")
        t0 = time.monotonic()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - any tracking backend error is retried
            delay = base_delay * 2**attempt
            if attempt == retries or _budget_left() - (time.monotonic() - t0) < delay:
                raise
            print(f"[reprozoo.tracking] {what} failed ({type(exc).__name__}: {exc}); "
                  f"retry {attempt + 1}/{retries} in {delay:.1f}s", file=sys.stderr, flush=True)
            time.sleep(delay)
        finally:
            _BUDGET["spent"] += time.monotonic() - t0  # every call counts, slow successes too


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
    """The experiment ``name``, created if missing. It carries ``mlflow.experimentKind`` =
    ``custom_model_development`` (set on an existing one that lacks it): MLflow 3 opens experiments
    without a kind in its GenAI view (traces, judges), not the model-training view."""
    kind_tag, kind = "mlflow.experimentKind", "custom_model_development"
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if (exp.tags or {}).get(kind_tag) != kind:
            try:
                client.set_experiment_tag(exp.experiment_id, kind_tag, kind)
            except Exception as exc:  # noqa: BLE001 - only the UI's default view depends on it
                print(f"[reprozoo.tracking] WARNING: could not tag experiment {name}: {exc}",
                      file=sys.stderr, flush=True)
        return exp.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:"):
        location = (artifact_root(results) / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location,
                                        tags={kind_tag: kind})
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


INVOCATION_ENV = "REPROZOO_INVOCATION"


def _inv_path(results: Path, inv_id: str) -> Path:
    d = state_dir(results) / "invocations"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{inv_id}.json"


def start_invocation(uri: str, results: Path, scale: str, config: dict, inv_id: str | None = None) -> dict:
    """Record this invocation's state in its own file (two invocations in one checkout never
    share one), export its id to the jobs (``REPROZOO_INVOCATION``: local jobs and SLURM jobs
    inherit the environment), and first reap invocations that died without finishing."""
    inv_id = inv_id or uuid.uuid4().hex[:12]  # never inherited: every invocation is its own
    os.environ[INVOCATION_ENV] = inv_id
    reap_orphans(results, uri)
    info = {"id": inv_id, "uri": uri, "scale": scale, "started": time.time(), "pid": os.getpid(),
            "host": socket.gethostname(), "parents": {}, "config": config,
            "tags": base_tags()}  # the parents' provenance, as of the invocation (a rebuild reuses it)
    atomic_write_text(_inv_path(results, inv_id), json.dumps(info, indent=1, default=str))
    return info


@contextlib.contextmanager
def _locked(results: Path):
    with open(state_dir(results) / "invocation.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_invocation(results: Path, inv_id: str | None = None) -> dict | None:
    inv_id = inv_id or os.environ.get(INVOCATION_ENV)
    if not inv_id:
        return None
    path = Path(results) / STATE_DIR_NAME / "invocations" / f"{inv_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _write_invocation(results: Path, inv: dict) -> None:
    atomic_write_text(_inv_path(results, inv["id"]), json.dumps(inv, indent=1, default=str))


def _alive(inv: dict) -> bool:
    if inv.get("finished"):
        return False
    if inv.get("host") != socket.gethostname():
        return True  # cannot tell from here: leave it alone
    return pid_alive(inv.get("pid", -1))


def _invocations(results: Path) -> Iterable[dict]:
    """Every invocation record under ``results`` (unreadable ones skipped), oldest id first."""
    d = Path(results) / STATE_DIR_NAME / "invocations"
    for f in sorted(d.glob("*.json")) if d.exists() else []:
        try:
            yield json.loads(f.read_text())
        except (OSError, ValueError):
            continue


def interrupted_invocations(results: Path) -> list[dict]:
    """Invocations of this host that died without finishing (their Snakemake process is gone,
    e.g. kill -9) and are not reaped yet: what the next invocation's start, or ``reprozoo sync``,
    reaps. Reads the records only (no MLflow)."""
    return [inv for inv in _invocations(results) if not inv.get("finished") and not _alive(inv)]


def running_invocations(results: Path) -> list[dict]:
    """Invocations not finished that may still run: a live process on this host, or any on
    another host (which cannot be told from here)."""
    return [inv for inv in _invocations(results) if _alive(inv)]


def snakemake_processes(root: Path) -> dict[int, str | None] | None:
    """Live processes of a Snakemake run in ``root``, read from /proc: Snakemake itself, and the
    jobs it started (a local job is a script or shell process of its own; a reprozoo job carries
    ``REPROZOO_INVOCATION`` in its environment), each with the invocation its environment names.
    A job whose Snakemake was killed (kill -9 of Snakemake alone) runs on and is found too.
    ``None`` where there is no /proc: then nothing can be told. Processes of other users, whose
    directory and environment cannot be read, count only when their command line names ``root``."""
    root = Path(root).resolve()
    proc = Path("/proc")
    if not (proc / "self" / "cmdline").exists():
        return None
    me = {os.getpid()}
    found: dict[int, str | None] = {}
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) in me:
            continue
        try:
            argv = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue  # gone meanwhile
        if not argv:
            continue  # a zombie (or a kernel thread)
        inv = None
        try:
            for entry in (d / "environ").read_bytes().split(b"\0"):
                if entry.startswith(INVOCATION_ENV.encode() + b"="):
                    inv = entry.split(b"=", 1)[1].decode(errors="replace")
        except OSError:
            pass
        is_snakemake = any(os.path.basename(a) == "snakemake" for a in argv[:2]) or any(
            a == "-m" and argv[i + 1:i + 2] == ["snakemake"] for i, a in enumerate(argv[:4]))
        if not (is_snakemake or inv or any("/.snakemake/" in a for a in argv)):
            continue
        try:
            cwd = Path(os.readlink(d / "cwd"))
        except OSError:
            cwd = None
        dirs = [cwd] if cwd else []
        for i, a in enumerate(argv):
            if a in ("-d", "--directory") and i + 1 < len(argv):
                dirs.append((cwd or Path("/")) / argv[i + 1])
            elif a.startswith("--directory="):
                dirs.append((cwd or Path("/")) / a.split("=", 1)[1])
            elif "/.snakemake/" in a:  # a job's script: .snakemake/scripts/tmp*.py of its workdir
                dirs.append((cwd or Path("/")) / a.split("/.snakemake/", 1)[0])
        if any(Path(os.path.realpath(p)) == root for p in dirs):
            found[int(d.name)] = inv
    return found


def reap_orphans(results: Path, uri: str | None = None, say: bool = True) -> list[str]:
    """Invocations whose Snakemake process is gone without finishing (kill -9): log what their
    jobs left (finished payloads as they are, unfinished ones FAILED), close their parent runs as
    KILLED (their children still RUNNING as FAILED), and record them as finished with status
    KILLED. Returns their ids. A store that cannot be reached leaves runs RUNNING that
    ``reprozoo sync`` closes later (:func:`repair_runs`). One whose jobs still run here (kill -9
    of Snakemake alone leaves them running) is not reaped until they end: their runs would be
    logged FAILED while they go on and finish."""
    reaped = []
    dead = interrupted_invocations(results)
    procs = (snakemake_processes(Path(results).resolve().parent) or {}) if dead else {}
    for inv in dead:
        jobs = sorted(pid for pid, of in procs.items() if of == inv["id"])
        if jobs:
            print(f"[reprozoo.tracking] invocation {inv['id']} died but its job(s) (pid "
                  f"{', '.join(map(str, jobs))}) still run: reaped once they end", file=sys.stderr, flush=True)
            continue
        try:
            replay_pending(results, uri or inv.get("uri"), invocation=inv["id"], orphaned=True)
            finish_invocation(results, "KILLED", inv_id=inv["id"])
        except Exception as exc:  # noqa: BLE001
            print(f"[reprozoo.tracking] WARNING: could not reap invocation {inv['id']}: {exc}",
                  file=sys.stderr, flush=True)
            continue
        reaped.append(inv["id"])
        if say:
            print(f"reprozoo: invocation {inv['id']} (pid {inv.get('pid')}) died without finishing: "
                  "reaped (its parent runs end KILLED, its unfinished runs FAILED)", flush=True)
    return reaped


def _find_parent(client, exp_id: str, inv_id: str) -> str | None:
    found = client.search_runs([exp_id], f"tags.role = 'pipeline' and tags.invocation = '{inv_id}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def _same_store(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and a.rstrip("/") == b.rstrip("/")


def parent_run_id(client, method: str, results: Path, inv_id: str | None = None) -> str | None:
    """Parent run of ``method`` for the invocation ``inv_id`` (default: the current one), created
    on first use and recorded in the invocation's state, so that the invocation's end (or its
    reaping) closes it. For an earlier invocation (a replay after it ended or died) a parent
    already in the store is found by its tag rather than created twice."""
    current = os.environ.get(INVOCATION_ENV)
    with _locked(results):
        inv = read_invocation(results, inv_id)
        if inv is None:
            return None
        if method in inv["parents"]:
            return inv["parents"][method]
        exp_id = get_or_create_experiment(client, method, results)
        earlier = inv["id"] != current
        run_id = _find_parent(client, exp_id, inv["id"]) if earlier else None
        if run_id is None:
            run_id = client.create_run(
                exp_id, run_name=f"pipeline-{inv['scale']}-{inv['id']}",
                tags={**(inv.get("tags") or base_tags()), "role": "pipeline",
                      "invocation": inv["id"], "scale": inv["scale"],
                      **({"replayed": "true"} if earlier else {}),
                      # the SLURM job that created it, where one did
                      **({"slurm_job_id": os.environ["SLURM_JOB_ID"]}
                         if os.environ.get("SLURM_JOB_ID") else {})}).info.run_id
        inv["parents"][method] = run_id
        _write_invocation(results, inv)
        return run_id


UNREPORTED = "job ended without reporting (killed?)"  # the error tag of a run its job never ended


def _close_parent(client, run_id: str, status: str, exp_id: str | None = None) -> int:
    """End a parent run with ``status``; its children still RUNNING (jobs killed with their
    invocation) end FAILED. Returns how many children it ended."""
    exp_id = exp_id or client.get_run(run_id).info.experiment_id
    children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'",
                                  max_results=1000)
    for child in children:
        if "error" not in child.data.tags:
            client.set_tag(child.info.run_id, "error", UNREPORTED)
        client.set_terminated(child.info.run_id, "FAILED")
    client.set_terminated(run_id, status)
    return len(children)


def finish_invocation(results: Path, status: str, inv_id: str | None = None) -> None:
    """Close parent runs; children still RUNNING (killed jobs) are marked FAILED. ``KILLED``
    (an invocation reaped after its Snakemake died) closes its parents as KILLED."""
    with _locked(results):
        inv = read_invocation(results, inv_id)
        if inv is None:
            return
        inv["finished"], inv["status"] = time.time(), status
        _write_invocation(results, inv)
    if not inv["parents"]:
        return
    try:
        client = _client(inv["uri"])
        for run_id in inv["parents"].values():
            _close_parent(client, run_id, status)
    except Exception as exc:  # noqa: BLE001
        print(f"[reprozoo.tracking] WARNING: could not close parent runs: {exc}; "
              "`reprozoo sync` closes them later", file=sys.stderr)


def _paged(fetch: Callable) -> list:
    """Every item of an MLflow paged search (``fetch(page_token)``), page by page."""
    items, token = [], None
    for _ in range(10_000):  # bounded: 10 million items
        page = fetch(token)
        items.extend(page)
        token = page.token
        if not token:
            break
    return items


def repair_runs(results: Path, uri: str | None = None) -> tuple[int, int]:
    """Close the parent runs left RUNNING in the store by invocations that are over, as their
    record says: KILLED for one that died (an earlier version reaped the invocation but left its
    parent RUNNING), FAILED or FINISHED for one whose store was unreachable when it ended. Their
    children still RUNNING end FAILED. Parents of invocations that may still run, or with no
    record under ``results``, are left alone. Returns (parents closed, children ended)."""
    over = {inv["id"]: inv for inv in _invocations(results) if inv.get("finished")}
    uri = resolve_uri(uri)
    if not over or (uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists()):
        return 0, 0  # nothing ended, or no store yet: never create an empty one
    client = _client(uri)
    exp_ids = [e.experiment_id for e in _paged(lambda t: client.search_experiments(max_results=1000, page_token=t))]
    parents = children = 0
    for i in range(0, len(exp_ids), 100):
        running = _paged(lambda t, ids=exp_ids[i:i + 100]: client.search_runs(
            ids, "tags.role = 'pipeline' and attributes.status = 'RUNNING'", max_results=1000, page_token=t))
        for run in running:
            inv = over.get(run.data.tags.get("invocation"))
            if inv is None:
                continue
            children += _close_parent(client, run.info.run_id, inv.get("status") or "FAILED",
                                      run.info.experiment_id)
            parents += 1
    return parents, children


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
            if _BUDGET["limit"] is None:  # the budget counts calls to the store, not its import
                start_budget()

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

            inputs = [DatasetInput(Dataset(
                name=n, digest=d["digest"],
                source_type="generator" if d.get("source") == "generated" else "reprozoo",
                source=(f"generated in the method from its parameters and seed ({d['scale']})"
                        if d.get("source") == "generated" else f"results/data/{n}/{d['scale']}")))
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

    def _save_pending(self, status: str, path: Path | None = None) -> None:
        data = dict(self.payload, status=status, method=self.method, run_name=self.run_name,
                    run_tags=self.tags, error=self.error, uri=self.uri, nested=self.nested,
                    start_time=getattr(self, "_t_start", int(time.time() * 1000)),
                    end_time=int(time.time() * 1000))
        self._t_start = data["start_time"]
        atomic_write_text(path or self.pending_path, json.dumps(data, indent=1, default=str))

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
            if Path(self.pending_path).name == PENDING:  # the record `reprozoo sync --rebuild` reads
                self._save_pending(status, Path(self.pending_path).with_name("tracking_logged.json"))
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
    demand), an earlier one's whose record is here and writes to this store (found by tag or
    created, and recorded so that its end or reaping closes it), else one looked up by tag in
    this store (a rebuild into another store), created if it never reached MLflow."""
    inv = read_invocation(results)
    if inv is not None and (invocation in (None, "none") or invocation == inv["id"]):
        return parent_run_id(client, method, results)
    state = read_invocation(results, invocation) if invocation not in (None, "none") else None
    if state is not None and _same_store(client.tracking_uri, state.get("uri")):
        return parent_run_id(client, method, results, inv_id=invocation)
    exp_id = get_or_create_experiment(client, method, results)
    found = _find_parent(client, exp_id, str(invocation))
    if found:
        return found
    scale = (state or {}).get("scale", "?")
    run = client.create_run(exp_id, run_name=f"pipeline-{scale}-{invocation}",
                            tags={**((state or {}).get("tags") or base_tags()), "role": "pipeline",
                                  "invocation": str(invocation), "scale": scale, "replayed": "true"})
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
        data.setdefault("tags", {})["error"] = UNREPORTED
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


class BackgroundReplay:
    """Deferred tracking logged while the run goes on, by one daemon thread of the Snakemake process.

    Every ``interval_s`` it logs the payloads of this invocation whose jobs have ended (a RUNNING
    payload is a job still at work, left alone), exactly as the end hook would, so the end hook
    only logs the last few. One process stays the store's only writer; the thread's CPU is
    counted in :attr:`cpu_s` (the scheduler benchmark keeps it apart from the scheduler's). If
    the store fails, the thread warns once and stops: the payloads stay for the end hook."""

    def __init__(self, results: Path, tracking: dict | None = None, interval_s: float | None = None):
        tracking = tracking or {}
        self.results, self.uri = Path(results), tracking.get("uri")
        self.retries = int(tracking.get("retries", 3))
        self.invocation = os.environ.get(INVOCATION_ENV)
        self.interval_s = float(interval_s if interval_s is not None
                                else os.environ.get("REPROZOO_TRACKING_INTERVAL_S", 30))
        self.cpu_s, self.logged, self.failed = 0.0, 0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reprozoo-tracking", daemon=True)

    def start(self) -> "BackgroundReplay":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            t0 = time.thread_time()
            try:
                self.logged += replay_pending(self.results, self.uri, self.retries, invocation=self.invocation,
                                              should_stop=self._stop.is_set)
            except Exception as exc:  # noqa: BLE001 - the end hook and `reprozoo sync` still log them
                print(f"[reprozoo.tracking] WARNING: logging runs during the run stopped ({exc}); "
                      "the end hook logs them.", file=sys.stderr, flush=True)
                self.failed = True
                return
            finally:
                self.cpu_s += time.thread_time() - t0

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop after the payload being logged (bounded wait), before the end hook logs the rest."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


_BACKGROUND: dict[str, BackgroundReplay] = {}


def start_background_replay(results: Path, tracking: dict | None = None,
                            interval_s: float | None = None) -> BackgroundReplay:
    """Start logging finished payloads during the run (the deferred mode's ``onstart``)."""
    stop_background_replay()
    bg = _BACKGROUND["current"] = BackgroundReplay(results, tracking, interval_s).start()
    return bg


def stop_background_replay() -> BackgroundReplay | None:
    bg = _BACKGROUND.pop("current", None)
    if bg is not None:
        bg.stop()
        _BACKGROUND["last"] = bg  # its logged count and CPU, for the scheduler benchmark
    return bg


def replay_or_warn(results: Path, tracking: dict | None = None) -> int:
    """The end hook: log every pending payload; an unreachable store only warns (payloads stay)."""
    tracking = tracking or {}
    bg = stop_background_replay()
    during = f" ({bg.logged} more while the run went on)" if bg is not None and bg.logged else ""
    pending = list(Path(results).rglob(PENDING)) + list(Path(results).rglob(PARENT_PENDING))
    if not pending:
        if during:
            print(f"reprozoo: logged {bg.logged} run(s) to MLflow while the run went on", flush=True)
        return 0
    t0 = time.perf_counter()
    try:
        n = replay_pending(results, tracking.get("uri"), int(tracking.get("retries", 3)),
                           invocation=os.environ.get(INVOCATION_ENV), orphaned=True)
    except Exception as exc:  # noqa: BLE001
        print(f"[reprozoo.tracking] WARNING: tracking store unavailable ({exc}); {len(pending)} run payload(s) "
              "stay under results/; replay them with `reprozoo sync`.", file=sys.stderr, flush=True)
        return 0
    print(f"reprozoo: logged {n} run(s) to MLflow in {time.perf_counter() - t0:.1f}s{during}", flush=True)
    return n


def _payload_invocation(data: dict) -> str | None:
    return data.get("invocation") or (data.get("run_tags") or {}).get("invocation")


def replay_pending(results: Path, uri: str | None = None, retries: int = 3, invocation: str | None = None,
                   orphaned: bool = False, should_stop: Callable[[], bool] | None = None) -> int:
    """Log pending payloads under ``results`` (child runs, then method parents) into MLflow;
    return how many. ``invocation``: only that invocation's payloads (the end hook), else all
    except those of invocations still running (``reprozoo sync``). A payload still RUNNING is
    logged FAILED only when its invocation is over. A payload that logs is renamed
    ``*_logged.json`` (the record of what MLflow holds); one that fails stays for the next sync."""
    children = sorted(Path(results).rglob(PENDING))
    parents = sorted(Path(results).rglob(PARENT_PENDING))
    if not children and not parents:
        return 0
    client = None
    n = 0
    for path in children + parents:
        if should_stop is not None and should_stop():
            break
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        inv_id = _payload_invocation(data)
        if invocation is not None and inv_id != invocation:
            continue
        if invocation is None:
            state = read_invocation(results, inv_id) if inv_id not in (None, "none") else None
            if state is not None and _alive(state):
                continue  # its invocation is still running: its end hook will log it
        if data.get("status") == "RUNNING" and invocation is not None and not orphaned:
            continue  # a job of this invocation still running? (end hook: every job is done)
        client = client or _client(resolve_uri(uri))
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


def rebuild(results: Path, uri: str, retries: int = 3) -> int:
    """Recreate the whole MLflow view from ``results/`` into the store at ``uri`` (e.g. an empty
    one): every run payload, logged or pending, with its parent link, params, metrics, tags,
    dataset inputs and artifacts, and every method's claims, table and plots on its parent.
    ``results/`` is the source of truth; MLflow is a view of it. Returns the runs written."""
    client = _client(resolve_uri(uri))
    files = (sorted(Path(results).rglob("tracking_logged.json")) + sorted(Path(results).rglob(PENDING))
             + sorted(Path(results).rglob("tracking_parent_logged.json")) + sorted(Path(results).rglob(PARENT_PENDING)))
    saved = os.environ.pop(INVOCATION_ENV, None)  # parents are found by their invocation tag
    n = 0
    try:
        for path in files:
            data = json.loads(path.read_text())
            if path.name in (PENDING, "tracking_logged.json"):
                retry(lambda: _replay_child(client, data, Path(results), retries), retries, f"rebuild {path}")
            else:
                retry(lambda: _replay_parent(client, data, Path(results), retries), retries, f"rebuild {path}")
            n += 1
        # parents take the status their invocation ended with
        for f in sorted((Path(results) / STATE_DIR_NAME / "invocations").glob("*.json")):
            inv = json.loads(f.read_text())
            for method in inv.get("parents", {}):
                exp = client.get_experiment_by_name(method)
                if exp is None:
                    continue
                for r in client.search_runs([exp.experiment_id],
                                            f"tags.role = 'pipeline' and tags.invocation = '{inv['id']}'"):
                    client.set_terminated(r.info.run_id, inv.get("status", "FINISHED") or "FINISHED")
    finally:
        if saved:
            os.environ[INVOCATION_ENV] = saved
    return n


UI_BASE = "http://127.0.0.1:5000"  # where ``reprozoo ui`` serves the embedded store by default


def experiment_links(names: list[str], uri: str | None = None, ui_base: str = UI_BASE,
                     timeout_s: float = 2.0) -> dict[str, str]:
    """MLflow UI links to the experiments that exist, by name, without importing MLflow.

    A SQLite store is read directly (read-only); a tracking server is asked through its REST API
    (bounded by ``timeout_s``) and its own address is the UI. Experiments not created yet (a first
    run with deferred tracking logs them at the end of the invocation) get no link."""
    import sqlite3
    import urllib.parse
    import urllib.request

    uri = resolve_uri(uri)
    found: dict[str, str] = {}
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if not db.exists():
            return {}
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout_s)
            try:
                rows = con.execute("SELECT experiment_id, name FROM experiments WHERE lifecycle_stage = 'active'").fetchall()
            finally:
                con.close()
        except sqlite3.Error:
            return {}
        found = {name: str(i) for i, name in rows if name in set(names)}
        base = ui_base
    elif uri.startswith(("http://", "https://")):
        base = uri.rstrip("/")
        for name in names:
            q = urllib.parse.urlencode({"experiment_name": name})
            try:
                with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?{q}",
                                            timeout=timeout_s) as resp:
                    found[name] = str(json.loads(resp.read())["experiment"]["experiment_id"])
            except Exception:  # noqa: BLE001 - no link is the answer to any failure here
                continue
    else:
        return {}
    return {name: f"{base}/#/experiments/{i}?workflowType=machine_learning" for name, i in found.items()}
