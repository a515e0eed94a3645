"""``reprozoo server``: an MLflow tracking server for runs on a cluster.

On a cluster, many jobs on many nodes must not write one SQLite file on a shared filesystem
(SQLite locking is unsafe on NFS/Lustre). Instead one ``mlflow server`` process owns the database
and the jobs log to it over HTTP (``MLFLOW_TRACKING_URI=http://host:port``); artifacts are uploaded
through the server (``--serve-artifacts``), so the jobs need no access to the artifact store.

    reprozoo server                       # foreground, 127.0.0.1:5000, Ctrl-C stops it
    reprozoo server --detach              # background; waits until it answers, prints the URI
    reprozoo server --status              # the recorded server and whether it answers
    reprozoo server --stop                # stop the recorded server (by its process id)

    --backend-store-uri URI   runs, params, metrics (default sqlite:///results/mlflow.db, made
                              absolute; put it on a local disk, or use postgresql://...)
    --artifacts-destination   where uploaded artifacts go (default results/mlartifacts)
    --host 127.0.0.1          the interface to bind; 0.0.0.0 only when jobs run on other nodes.
                              Off loopback the server warns that it has NO authentication (anyone
                              who reaches the port reads and changes every run) and accepts the
                              Host headers localhost, 127.0.0.1, this machine's name (long and
                              short) and the private ranges 10.*, 172.*, 192.168.* (any port);
                              `-- --allowed-hosts LIST` replaces that list
    --auth                    MLflow's basic-auth app (mlflow server --app-name basic-auth; needs
                              the Flask-WTF package: pip install 'mlflow[auth]'). Admin user
                              MLFLOW_AUTH_ADMIN_USERNAME (default admin), password
                              MLFLOW_AUTH_ADMIN_PASSWORD, else MLFLOW_TRACKING_PASSWORD, else a
                              random one written to <state dir>/credentials (mode 600) on first
                              start. Clients send MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD.
                              Users live in <state dir>/basic_auth.db unless MLFLOW_AUTH_CONFIG_PATH
                              names an ini of your own. Plain HTTP: passwords cross the network
                              in clear text, so keep it to a trusted network or put TLS in front
    --port 5000               0 picks a free port
    --state-file PATH         where the server's URI and pid are recorded
                              (default results/.tracking/server.json; profiles/slurm reads it)
    -- ARGS                   passed on to ``mlflow server`` unchanged

Relative paths are taken from the current directory: run it from the checkout, where Snakemake runs.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .io import pid_alive as _alive

DEFAULT_BACKEND = "sqlite:///results/mlflow.db"
DEFAULT_ARTIFACTS = "results/mlartifacts"
DEFAULT_STATE = "results/.tracking/server.json"
DEFAULT_LOG = "results/logs/mlflow-server.log"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _abs_sqlite(uri: str) -> str:
    """``sqlite:///rel/path.db`` -> absolute path (from the current directory), folder created."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = (Path.cwd() / uri[len("sqlite:///"):]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    if uri.startswith("sqlite:////"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return uri


def _abs_location(loc: str) -> str:
    if "://" in loc:
        return loc
    path = Path(loc).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def advertised_host(bind: str) -> str:
    """The name jobs use to reach the server: the bound address, or this machine's name for 0.0.0.0."""
    if bind in ("0.0.0.0", "::", ""):
        return socket.getfqdn()
    return bind


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http proxy


def healthy(uri: str, timeout: float = 2.0) -> bool:
    try:
        with _DIRECT.open(f"{uri.rstrip('/')}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def proxy_warning(uri: str) -> str | None:
    """Jobs talk to the server with `requests`, which honours http_proxy: the server's host must be
    in no_proxy, or every tracking call goes to the proxy (and fails)."""
    proxy = any(os.environ.get(k) for k in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"))
    if not proxy:
        return None
    host = urllib.parse.urlsplit(uri).hostname or ""
    if urllib.request.proxy_bypass_environment(host):
        return None
    hosts = ",".join(dict.fromkeys([host, "localhost", "127.0.0.1"]))
    return (f"warning: an http proxy is set and {host} is not in no_proxy/NO_PROXY: jobs would send "
            f"their tracking calls to the proxy. export NO_PROXY={hosts} no_proxy={hosts}")


def wait_healthy(uri: str, proc: subprocess.Popen | None, seconds: float) -> bool:
    """Bounded wait until ``uri`` answers; False on timeout or when ``proc`` exits first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        if healthy(uri, timeout=1.0):
            return True
        time.sleep(0.25)
    return False


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None




def _is_mlflow(pid: int) -> bool:
    """Guard against pid reuse: the recorded pid must still be an mlflow server."""
    try:
        return b"mlflow" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _alive(pid)  # no /proc (macOS): trust the pid


def stop(state_file: Path, seconds: float = 15.0) -> bool:
    """Stop the server recorded in ``state_file`` (its process group, led by the recorded pid)."""
    info = read_state(state_file)
    if info is None:
        print(f"no server recorded in {state_file}", file=sys.stderr)
        return False
    pid = int(info.get("pid") or 0)
    stopped = False
    if _alive(pid) and _is_mlflow(pid):
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and _alive(pid):
            _reap(pid)
            time.sleep(0.1)
        if _alive(pid):
            _signal_group(pid, signal.SIGKILL)
            _reap(pid)
        stopped = True
        print(f"stopped the MLflow server at {info.get('uri')} (pid {pid})")
    else:
        print(f"the server recorded in {state_file} (pid {pid}) is not running")
    with contextlib.suppress(OSError):
        Path(state_file).unlink()
    return stopped


def _signal_group(pid: int, sig: int) -> None:
    """The server runs in its own session (we start it so): signal its group, i.e. its workers too."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)


def allowed_hosts(bind: str) -> list[str]:
    """Host headers the server accepts when bound off loopback (jobs call it by this machine's name
    or a private address)."""
    name = advertised_host(bind)
    allowed = ["localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*", name, f"{name}:*",
               "10.*", "192.168.*", "172.*"]
    short = name.split(".")[0]
    if short != name:
        allowed += [short, f"{short}:*"]
    return allowed


def exposure_warning(host: str, port: int, auth: bool, hosts: list[str] | None) -> str | None:
    """What binding off loopback means, or None on loopback."""
    if host in LOOPBACK:
        return None
    where = f"{host}:{port}" + (" (every interface)" if host in ("0.0.0.0", "::", "") else "")
    allowed = f"; Host headers allowed: {','.join(hosts)}" if hosts else ""
    if auth:
        return (f"warning: the MLflow server listens on {where} with basic auth over plain HTTP: passwords "
                f"cross the network unencrypted{allowed}")
    return (f"WARNING: the MLflow server listens on {where} and has NO authentication: anyone who can reach "
            f"this port can read, change and delete every run and artifact{allowed}. Use it only on a "
            f"trusted network; --auth turns on MLflow's basic-auth app")


AUTH_INI = """[mlflow]
default_permission = READ
database_uri = {database_uri}
admin_username = {admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
grant_default_workspace_access = false
"""


def auth_env(state_dir: Path, env: dict) -> tuple[dict, dict]:
    """Environment for ``mlflow server --app-name basic-auth`` and what to record about it.

    Writes ``state_dir/basic_auth.ini`` (users in ``state_dir/basic_auth.db``) unless
    MLFLOW_AUTH_CONFIG_PATH is set; on the first start without a configured password, makes one and
    writes ``state_dir/credentials`` (mode 600) as shell exports for the clients."""
    env = dict(env)
    info: dict = {"auth": "basic-auth"}
    state_dir.mkdir(parents=True, exist_ok=True)
    admin = env.get("MLFLOW_AUTH_ADMIN_USERNAME") or "admin"
    env["MLFLOW_AUTH_ADMIN_USERNAME"] = admin
    db = state_dir / "basic_auth.db"
    if env.get("MLFLOW_AUTH_CONFIG_PATH"):
        info["auth_config"] = env["MLFLOW_AUTH_CONFIG_PATH"]
        first = True  # unknown store: let mlflow decide whether the admin exists
    else:
        ini = state_dir / "basic_auth.ini"
        ini.write_text(AUTH_INI.format(database_uri=f"sqlite:///{db}", admin=admin))
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
        info["auth_config"] = str(ini)
        first = not db.exists()
    if not env.get("MLFLOW_AUTH_ADMIN_PASSWORD") and env.get("MLFLOW_TRACKING_PASSWORD") \
            and env.get("MLFLOW_TRACKING_USERNAME", admin) == admin:
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = env["MLFLOW_TRACKING_PASSWORD"]
    if not env.get("MLFLOW_AUTH_ADMIN_PASSWORD") and first:
        password = secrets.token_urlsafe(18)
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = password
        cred = state_dir / "credentials"
        fd = os.open(cred, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"export MLFLOW_TRACKING_USERNAME={admin}\nexport MLFLOW_TRACKING_PASSWORD={password}\n")
        os.chmod(cred, 0o600)
        info["credentials"] = str(cred)
    elif (state_dir / "credentials").exists():
        info["credentials"] = str(state_dir / "credentials")
    # CSRF protection of the auth app's forms needs a key shared by the workers: one per start
    env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secrets.token_hex(32))
    return env, info


def build_command(args, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "mlflow", "server",
           "--backend-store-uri", args.backend_store_uri,
           "--artifacts-destination", args.artifacts_destination,
           "--serve-artifacts",
           "--host", args.host, "--port", str(port), "--workers", str(args.workers)]
    extra = list(args.mlflow_args)
    if getattr(args, "auth", False) and "--app-name" not in extra:
        cmd += ["--app-name", "basic-auth"]
    if args.host not in LOOPBACK and not any(a.startswith("--allowed-hosts") for a in extra):
        # jobs on other nodes call the server by this machine's name: let that Host header in
        cmd += ["--allowed-hosts", ",".join(allowed_hosts(args.host))]
    return cmd + extra


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(prog="reprozoo server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend-store-uri", default=os.environ.get("REPROZOO_MLFLOW_BACKEND", DEFAULT_BACKEND))
    p.add_argument("--artifacts-destination",
                   default=os.environ.get("REPROZOO_MLFLOW_ARTIFACTS", DEFAULT_ARTIFACTS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000, help="0: a free port")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--state-file", type=Path, default=Path(DEFAULT_STATE))
    p.add_argument("--log", type=Path, default=Path(DEFAULT_LOG), help="server log (with --detach)")
    p.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the server to answer")
    p.add_argument("--auth", action="store_true",
                   help="MLflow's basic-auth app (users and passwords; see above)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true", help="run in the background and return")
    mode.add_argument("--stop", action="store_true", help="stop the recorded server")
    mode.add_argument("--status", action="store_true", help="show the recorded server")
    p.add_argument("mlflow_args", nargs=argparse.REMAINDER, help="after --: passed to mlflow server")
    args = p.parse_args(argv)
    if args.mlflow_args and args.mlflow_args[0] == "--":
        args.mlflow_args = args.mlflow_args[1:]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    state_file = args.state_file.expanduser().resolve()

    if args.stop:  # exit 1 when nothing was running, so scripts can tell
        return 0 if stop(state_file) else 1
    info = read_state(state_file)
    if args.status:
        if info is None:
            print(f"no server recorded in {state_file}")
            return 1
        up = _alive(int(info.get("pid") or 0)) and healthy(info["uri"])
        print(json.dumps(dict(info, answering=up), indent=1))
        return 0 if up else 1
    if info is not None and _alive(int(info.get("pid") or 0)) and healthy(info["uri"]):
        print(f"an MLflow server is already running at {info['uri']} (pid {info['pid']}, {state_file})")
        print(f"export MLFLOW_TRACKING_URI={info['uri']}")
        return 0 if args.detach else 1

    if args.auth and importlib.util.find_spec("flask_wtf") is None:
        print("error: --auth runs MLflow's basic-auth app, which needs the Flask-WTF package: "
              "pip install 'mlflow[auth]'", file=sys.stderr)
        return 2
    args.backend_store_uri = _abs_sqlite(args.backend_store_uri)
    args.artifacts_destination = _abs_location(args.artifacts_destination)
    port = args.port or free_port(args.host if args.host not in ("0.0.0.0", "") else "0.0.0.0")
    uri = f"http://{advertised_host(args.host)}:{port}"
    local_uri = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '') else args.host}:{port}"
    cmd = build_command(args, port)
    print("+", " ".join(cmd), flush=True)
    hosts = None
    if "--allowed-hosts" in cmd:
        hosts = cmd[cmd.index("--allowed-hosts") + 1].split(",")
    if (warn := exposure_warning(args.host, port, args.auth, hosts)):
        print(warn, file=sys.stderr, flush=True)

    log_path = args.log.expanduser().resolve()
    if args.detach:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")
    else:
        out = None
    # own session: the pid we record leads a process group holding the server and its workers
    env = dict(os.environ)
    # MLflow 3 also starts a job runner with several huey worker processes (GenAI evaluation
    # jobs): not needed for tracking, and costly on a login node. MLFLOW_SERVER_ENABLE_JOB_EXECUTION
    # set in the environment wins.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    auth_info: dict = {}
    if args.auth:
        env, auth_info = auth_env(state_file.parent, env)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None,
                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    if out:
        out.close()
    if not wait_healthy(local_uri, proc, args.wait):
        rc = proc.poll()
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        where = f"; see {log_path}" if args.detach else ""
        why = f"exited with status {rc}" if rc is not None else f"did not answer within {args.wait:g} s"
        print(f"error: the MLflow server {why}{where}", file=sys.stderr)
        if args.detach and log_path.exists():
            print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
        return 1

    state = {"uri": uri, "pid": proc.pid, "host": args.host, "port": port,
             "backend_store_uri": args.backend_store_uri, "artifacts_destination": args.artifacts_destination,
             "log": str(log_path) if args.detach else None, "started": time.time(),
             "machine": socket.gethostname(), **auth_info}
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, state_file)
    print(f"MLflow server answering at {uri} (pid {proc.pid}); recorded in {state_file}")
    if (warn := proxy_warning(uri)):
        print(warn, file=sys.stderr)
    print(f"browse: {local_uri}   jobs: export MLFLOW_TRACKING_URI={uri}  (profiles/slurm reads {state_file})",
          flush=True)
    if args.auth:
        cred = auth_info.get("credentials")
        print("basic auth: clients set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
              + (f" (admin's, made on first start: source {cred})" if cred else ""), flush=True)
    if (warn := exposure_warning(args.host, port, args.auth, hosts)):
        print(warn, file=sys.stderr, flush=True)  # again, last: it must not scroll away
    if args.detach:
        print(f"stop it with: reprozoo server --stop --state-file {state_file}")
        return 0

    try:
        return proc.wait()
    except KeyboardInterrupt:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        return 0
    finally:
        info = read_state(state_file)
        if info and info.get("pid") == proc.pid:
            with contextlib.suppress(OSError):
                state_file.unlink()


if __name__ == "__main__":
    sys.exit(main())
