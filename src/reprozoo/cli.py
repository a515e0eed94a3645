"""``reprozoo``: the command line around the Snakemake workflow.

    reprozoo list                       methods, their variants and claims
    reprozoo run [METHOD ...] [--scale S] [--seeds 0 1] [--variants v ...] [-j N] [-- SNAKEMAKE ARGS]
    reprozoo datasets list | fetch NAME [--scale S] [--source offline|remote] | card NAME [--scale S]
    reprozoo ui [--port 5000]           MLflow UI on the embedded store, bound to 127.0.0.1
    reprozoo server [...]               an MLflow tracking server for cluster runs (see docs/cluster.md)
    reprozoo sync                       replay tracking payloads that could not be logged
    reprozoo budget [--scale S]         wall, CPU and memory per method and stage; what is over budget
    reprozoo docs [--scale S]           rewrite the method pages' result tables and the README index
    reprozoo docs --stale [M ...]       pages whose table was measured on other code than the tree's

Every command works on the project in the current directory (or ``-C/--directory DIR``), never on
the checkout the package was installed from.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path.cwd()  # replaced by main() with --directory or the working directory


def project_root(directory: str | None) -> Path:
    """The project a command works on: ``--directory`` or the working directory, which must hold a
    Snakefile (so that an installed package never silently uses another checkout's results/)."""
    root = Path(directory or os.getcwd()).resolve()
    if not (root / "Snakefile").exists():
        raise SystemExit(f"error: {root} is not a reprozoo project (no Snakefile); "
                         "run from the project root or pass --directory")
    return root


def _snakemake_cmd(targets: list[str], config: dict, cores: int | None, extra: list[str]) -> list[str]:
    """Targets go before ``--config``: Snakemake reads every word after ``--config`` as a config
    entry, so a target placed after it would be taken for one."""
    cmd = [sys.executable, "-m", "snakemake", *targets, "--directory", str(ROOT)]
    if cores:
        cmd += ["--cores", str(cores)]
    cmd += extra
    if config:
        cmd += ["--config"] + [f"{k}={json.dumps(v)}" for k, v in config.items()]
    return cmd


def cmd_list(args) -> int:
    from . import registry

    for spec in registry.all_specs():
        print(f"{spec.id:20s} {spec.title}")
        print(f"{'':20s} variants: {', '.join(v.id + ('*' if v.role == 'method' else '') for v in spec.variants)}")
        print(f"{'':20s} datasets: {', '.join(spec.datasets)}; env: {spec.env}")
        last = {}
        f = ROOT / "results" / args.scale / spec.id / "claims.json"
        if f.exists():
            last = {c["id"]: c["verdict"] for c in json.loads(f.read_text())["claims"]}
        for c in spec.claims:
            verdict = f"  [{last[c.id]}]" if c.id in last else ""
            print(f"{'':20s} claim {c.id}: {c.expr} {c.op} {c.effective_threshold:g}{verdict}")
    print(f"\n(* = the paper's method; the others are baselines; [verdict] = last complete run at "
          f"{args.scale}, classes in docs/verdicts.md)")
    return 0


def _snakemake_locked(root: Path) -> bool:
    """Whether Snakemake's (file) lock is held on ``root``: lock files under .snakemake/locks."""
    return any((root / ".snakemake" / "locks").glob("*.lock"))


def _resume_command(args, unlock: bool = False) -> str:
    import shlex

    words = ["reprozoo", "run", *args.methods, "--scale", args.scale]
    if args.seeds:
        words += ["--seeds", *map(str, args.seeds)]
    if args.variants:
        words += ["--variants", *args.variants]
    if args.cores:
        words += ["-j", str(args.cores)]
    if unlock:
        words.append("--unlock")
    if args.snakemake_args:
        words += ["--", *args.snakemake_args]
    return " ".join(shlex.quote(w) for w in words)


def _touches(invocation: dict, config: dict) -> bool:
    """Whether a recorded invocation may write outputs this run writes: the same scale and a
    shared method (an invocation whose record names no methods ran them all)."""
    theirs = invocation.get("config") or {}
    if theirs.get("scale", config.get("scale")) != config.get("scale"):
        return False
    mine, done = set(config.get("methods") or []), set(theirs.get("methods") or [])
    return not mine or not done or bool(mine & done)


def _prepare_resume(args, targets: list[str], config: dict) -> int | None:
    """Before Snakemake starts, after an interrupted run: say in one line that the previous
    invocation died and how this run resumes, and remove Snakemake's stale lock when that is safe.

    Safe means: an invocation of this checkout on this host died (its record says unfinished and
    its Snakemake pid is gone), no other invocation may still run (none unfinished with a live pid
    or on another host), and /proc shows no Snakemake process working in this directory (neither
    a main process nor an orphaned job of the dead one). ``--unlock`` removes the lock without a
    dead invocation's record (a Snakemake killed before it started any job, or not through
    reprozoo), but never while a Snakemake process works here. Snakemake's ``--unlock`` removes
    every lock of the directory, a live run's too: hence these checks. Returns an exit status
    to stop with, or None to go on."""
    import time

    from .tracking import interrupted_invocations, reap_orphans, running_invocations, snakemake_processes

    results = ROOT / "results"
    args.unlock = getattr(args, "unlock", False)
    dead = interrupted_invocations(results)
    locked = _snakemake_locked(ROOT)
    if not dead and not args.unlock:
        return None
    procs = snakemake_processes(ROOT)
    running = running_invocations(results)
    what = ""
    if dead:
        last = max(dead, key=lambda d: d.get("started", 0))
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(last.get("started", 0)))
        what = (f"the previous invocation {last['id']} (pid {last.get('pid')}, started {started}) "
                f"died without finishing")
        if len(dead) > 1:
            what += f" (and {len(dead) - 1} earlier one(s))"
    orphans = sorted(pid for pid, inv in (procs or {}).items() if inv in {d["id"] for d in dead})
    if orphans and not any(_touches(d, config) for d in dead
                           if any((procs or {}).get(pid) == d["id"] for pid in orphans)):
        # the dead invocation's jobs write other outputs (another scale, or only other methods):
        # go on without resuming it, so one helper's killed run does not hold every other run
        print(f"reprozoo: {what}; {len(orphans)} of its job(s) still run (pid {', '.join(map(str, orphans))}) on "
              "other methods or another scale: this run goes on; a later run resumes that one", flush=True)
        return None
    if orphans:
        print(f"reprozoo: {what}, but {len(orphans)} of its job(s) still run (pid "
              f"{', '.join(map(str, orphans))}): wait for them to end or stop them (kill PID), then run "
              f"`{_resume_command(args)}` again", file=sys.stderr, flush=True)
        return 1
    blocker = None
    if procs is None:
        blocker = "this system has no /proc to tell whether a Snakemake still works here"
    elif procs:
        blocker = f"Snakemake process(es) {', '.join(map(str, sorted(procs)))} work in {ROOT}"
    elif running and not args.unlock:
        other = running[-1]
        blocker = (f"invocation {other['id']} (pid {other.get('pid')} on {other.get('host')}) has not "
                   "finished and may still run")
    if args.unlock and procs:
        print(f"reprozoo: not removing Snakemake's lock: {blocker}; wait for them to end",
              file=sys.stderr, flush=True)
        return 1
    unlocked = False
    if (locked or args.unlock) and (blocker is None or args.unlock):
        proc = subprocess.run(_snakemake_cmd(targets, config, None, ["--unlock"]), cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
            print(f"reprozoo: `snakemake --unlock` failed (exit {proc.returncode})", file=sys.stderr, flush=True)
            return proc.returncode
        unlocked = True
    if not dead:
        if unlocked:
            print(f"reprozoo: removed Snakemake's lock on {ROOT} (--unlock); no Snakemake process works here",
                  flush=True)
        return None
    # reaped here, not left to the onstart hook: Snakemake runs no hook when nothing is left to do
    reaped = set(reap_orphans(results, say=False))
    runs = ("its MLflow runs are closed (parents KILLED, unfinished children FAILED)"
            if {d["id"] for d in dead} <= reaped else
            "its MLflow runs could not be closed now (see the warning): the run's start or `reprozoo sync` will")
    if unlocked:
        how = "removed its stale Snakemake lock and resuming: finished jobs are kept, unfinished ones rerun"
    elif locked and procs:
        how = f"its Snakemake lock is kept while {blocker}: run this again once they have ended"
    elif locked:
        how = (f"its Snakemake lock is kept ({blocker}); if no Snakemake runs on {ROOT} any more, "
               f"resume with `{_resume_command(args, unlock=True)}`")
    else:
        how = "resuming: finished jobs are kept, unfinished ones rerun"
    print(f"reprozoo: {what}; {runs}; {how}", flush=True)
    return None


def cmd_run(args) -> int:
    from . import config as rz_config

    config: dict = {"scale": args.scale}
    if args.methods:
        config["methods"] = args.methods
    if args.seeds:
        config["seeds"] = args.seeds
    if args.variants:
        if len(args.methods or []) != 1:
            print("--variants needs exactly one method", file=sys.stderr)
            return 2
        config["variants"] = {args.methods[0]: args.variants}
    try:  # fail fast with the schema's message, before Snakemake starts
        rz_config.plan(rz_config.load(config))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plan = rz_config.plan(rz_config.load(config))
    targets = [f"results/{args.scale}/{m}/{plan.selection(m)}claims.json" for m in args.methods] if args.methods else []
    stop = _prepare_resume(args, targets, config)  # after an interrupted run: say so, unlock if safe
    if stop is not None:
        return stop
    cmd = _snakemake_cmd(targets, config, args.cores, args.snakemake_args)
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc != 0 and _snakemake_locked(ROOT):  # refused by a lock (a normal end removes the locks)
        from .tracking import snakemake_processes

        procs = snakemake_processes(ROOT)
        if procs:
            print(f"reprozoo: another Snakemake works in {ROOT} (pid {', '.join(map(str, sorted(procs)))}) "
                  "and holds its lock: wait for it to end, then run this again", file=sys.stderr, flush=True)
        elif procs is not None:
            print(f"reprozoo: no Snakemake process works in {ROOT}: its lock is stale (a killed run?); if none "
                  f"runs on this directory from another machine either, resume with "
                  f"`{_resume_command(args, unlock=True)}`", file=sys.stderr, flush=True)
    return rc


def cmd_datasets(args) -> int:
    from .data import registry as dreg

    if args.action == "list":
        for name in dreg.names():
            spec = dreg.get(name)
            print(f"{name:28s} {spec.family:11s} sources={','.join(spec.sources):22s} {spec.description[:70]}")
        return 0
    if not args.name:
        print("a dataset name is required", file=sys.stderr)
        return 2
    try:
        spec = dreg.get(args.name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    card = ROOT / "results" / "data" / args.name / args.scale / "card.json"
    if args.action == "fetch":
        config = {"scale": args.scale, "methods": [], "data": {"source": "offline", "sources": {}, "paths": {}}}
        if args.source:
            config["data"]["sources"] = {args.name: args.source}
        if args.path:
            config["data"]["paths"] = {args.name: args.path}
        cmd = _snakemake_cmd([str(card.relative_to(ROOT))], config, args.cores, [])
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
        if rc == 0:
            print(card.read_text())
        return rc
    if args.action == "card":
        if not card.exists():
            print(f"no card yet for {spec.name} at scale {args.scale}; run `reprozoo datasets fetch {spec.name}`",
                  file=sys.stderr)
            return 1
        print(card.read_text())
        return 0
    return 2


def cmd_ui(args) -> int:
    """The MLflow UI on the project's store, in the foreground (Ctrl-C stops it).

    ``mlflow ui`` alone starts four uvicorn workers and a job runner (GenAI evaluation jobs, huey
    consumers): 17 processes, about 2.9 GB. For browsing, one worker with job execution off is
    enough. The URL is printed once the server answers ``/health``.
    """
    import signal
    import time

    from .server import free_port, wait_healthy
    from .tracking import artifact_root, resolve_uri

    uri = resolve_uri(args.uri, ROOT)
    if not uri.startswith(("sqlite:", "postgresql", "mysql", "mssql", "file:", "/")):
        print(f"the tracking store {uri} is a server already: open {uri}", flush=True)
        return 0
    port = args.port or free_port(args.host)
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
           "--artifacts-destination", str(artifact_root(ROOT / "results")),
           "--host", args.host, "--port", str(port), "--workers", "1",
           *getattr(args, "snakemake_args", [])]
    env = dict(os.environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")  # no job runner / huey workers
    print("+", " ".join(cmd), flush=True)
    # own session: Ctrl-C and SIGTERM reach this process, which stops the server's whole group
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)

    def _stop(signum=None, _frame=None):
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, _stop)
    try:
        local = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
        local = f"[{local}]" if ":" in local else local  # IPv6 literal in a URL
        if not wait_healthy(f"http://{local}:{port}", proc, args.wait):
            code = proc.poll()
            why = f"exited with status {code}" if code is not None else f"did not answer within {args.wait:g} s"
            print(f"error: the MLflow UI {why}", file=sys.stderr, flush=True)
            return 1
        print(f"open http://{local}:{port}\n(MLflow 3.17 opens its GenAI view by default: pick 'Model training' "
              f"in the sidebar, or open http://{local}:{port}/#/experiments?workflowType=machine_learning)",
              flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if proc.poll() is None:
            for sig, seconds in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + seconds
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                if proc.poll() is not None:
                    break


def cmd_server(args) -> int:
    from .server import main as server_main

    return server_main(args.server_args)


def cmd_sync(args) -> int:
    from .tracking import PARENT_PENDING, PENDING, reap_orphans, rebuild, repair_runs, replay_pending

    results = ROOT / "results"
    if args.rebuild:
        if not args.uri:
            print("error: --rebuild needs --uri (the store to write the view into)", file=sys.stderr)
            return 2
        n = rebuild(results, args.uri)
        print(f"rebuilt {n} run payload(s) from {results} into {args.uri}")
        return 0

    def pending():
        return len(list(results.rglob(PENDING))) + len(list(results.rglob(PARENT_PENDING)))

    reap_orphans(results)  # invocations that died and no later one reaped: KILLED, as a rerun would
    left_before = pending()
    n = replay_pending(results)
    left = pending()
    print(f"replayed {n} of {left_before} pending tracking payload(s)")
    try:  # runs an earlier version (or an unreachable store) left RUNNING after their invocation ended
        parents, children = repair_runs(results)
    except Exception as exc:  # noqa: BLE001
        print(f"error: could not close the runs of ended invocations: {exc}", file=sys.stderr)
        return 1
    if parents:
        print(f"closed {parents} parent run(s) left RUNNING by invocations that had ended (KILLED where "
              f"the invocation died) and {children} unfinished child run(s) as FAILED")
    if left:
        print(f"error: {left} payload(s) could not be replayed; they are kept for the next `reprozoo sync`",
              file=sys.stderr)
        return 1
    return 0


def cmd_budget(args) -> int:
    from .budget import report

    text, ok = report(ROOT / "results", args.scale)
    print(text)
    return 0 if ok or not args.strict else 1


def cmd_converge(args) -> int:
    """Rerun a method's training with every step count multiplied by ``--factor`` (into
    partial/params-<hash>/) and tabulate each claim's verdict at 1x and at the factor."""
    from . import config as rz_config
    from . import converge
    from .io import read_json

    try:
        override, keys = converge.plan_override(args.method, args.scale, args.factor)
    except (ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = ROOT / "results"
    runs = [("1x", {}), (f"{args.factor:g}x", {args.method: override})]
    claims = []
    for label, params in runs:
        config = {"scale": args.scale, "methods": [args.method]}
        if params:
            config["params"] = params
        plan = rz_config.plan(rz_config.load(config), check_specs=False)
        target = f"results/{args.scale}/{args.method}/{plan.selection(args.method)}claims.json"
        print(f"[converge] {args.method} at {label}: {target}", flush=True)
        rc = subprocess.call(_snakemake_cmd([target], config, args.cores, list(args.snakemake_args or [])),
                             cwd=ROOT)
        if rc != 0:
            print(f"error: the {label} run failed (exit {rc}); its log is under results/{args.scale}/logs/",
                  file=sys.stderr)
            return rc
        claims.append(read_json(ROOT / target))
    out = converge.write(results, args.method, args.scale, args.factor, keys, *claims)
    print(out.read_text())
    print(f"written to {out.relative_to(ROOT)} (and converge.json); `reprozoo docs` adds it to the method's page")
    return 0


def cmd_docs(args) -> int:
    from .docs import stale_pages, write_all

    if args.stale:
        try:
            stale = stale_pages(ROOT, args.methods or None)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for method, then, now in stale:
            print(f"stale: {method}: page measured on code {then or '(none)'}, tree is {now}: rerun it, then "
                  f"`reprozoo docs {method}`")
        if not stale:
            print("every page's table was measured on the code in the tree")
        return 1 if stale else 0
    refused: list[str] = []
    try:
        changed = write_all(ROOT, args.scale, check=args.check, refused=refused, methods=args.methods or None)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in changed:
        print(f"{'differs from results' if args.check else 'updated'}: {p.relative_to(ROOT)}")
    for r in refused:
        print(f"refused (page kept): {r}", file=sys.stderr)
    if not changed and not refused:
        print("pages match results/" if args.check else "pages already up to date")
    return 1 if (args.check and (changed or refused)) else 0


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="reprozoo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"reprozoo {__version__}")
    parser.add_argument("-C", "--directory", help="project root (default: the working directory)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    lst = sub.add_parser("list", help="methods, variants, claims (with their last verdicts)")
    lst.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"])
    lst.set_defaults(fn=cmd_list)

    run = sub.add_parser("run", help="run the workflow (all methods, or the ones named)")
    run.add_argument("methods", nargs="*", help="method ids (default: every method; see `reprozoo list`)")
    run.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"],
                     help="ci (seconds, plumbing), smoke (default: claims tested), paper (published setting)")
    run.add_argument("--seeds", type=int, nargs="+", help="seeds (default: the method's own for the scale)")
    run.add_argument("--variants", nargs="+", help="a subset of variants (one method only); results go to partial/")
    run.add_argument("-j", "--cores", type=int, help="cores Snakemake may use (default: the profile's)")
    run.add_argument("--unlock", action="store_true",
                     help="remove a stale Snakemake lock (a killed run) first, unless a Snakemake works here; "
                          "after an invocation died on this host, run does so by itself")
    run.set_defaults(fn=cmd_run)

    ds = sub.add_parser("datasets", help="list datasets, fetch one, show its card")
    ds.add_argument("action", choices=["list", "fetch", "card"],
                    help="list: every dataset; fetch: build one (acquire + preprocess); card: show its card")
    ds.add_argument("name", nargs="?", help="dataset name (for fetch and card)")
    ds.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"], help="the dataset's size")
    ds.add_argument("--source", choices=["offline", "remote", "path"],
                    help="offline generator (default), the public download, or a local path")
    ds.add_argument("--path", help="with --source path: where the restricted data lives")
    ds.add_argument("-j", "--cores", type=int, help="cores Snakemake may use")
    ds.set_defaults(fn=cmd_datasets)

    ui = sub.add_parser("ui", help="MLflow UI on the results store (127.0.0.1); one worker, no job runner",
                        description="The MLflow UI on the project's store, in the foreground (Ctrl-C stops "
                                    "it): one uvicorn worker, job execution off. The URL is printed once "
                                    "the server answers. Arguments after `--` go to `mlflow server`.")
    ui.add_argument("--port", type=int, default=5000, help="0 picks a free port (default 5000)")
    ui.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    ui.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///results/mlflow.db"),
                    help="the store (default sqlite:///results/mlflow.db, relative to the project)")
    ui.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the server to answer")
    ui.set_defaults(fn=cmd_ui)

    srv = sub.add_parser("server", help="MLflow tracking server for cluster runs (`reprozoo server --help`)",
                         add_help=False)
    srv.add_argument("server_args", nargs=argparse.REMAINDER, help="see `reprozoo server --help`")
    srv.set_defaults(fn=cmd_server)

    sync = sub.add_parser("sync", help="replay tracking payloads saved when MLflow was unreachable")
    sync.add_argument("--rebuild", action="store_true",
                      help="write the whole MLflow view anew from results/ (every run, logged or not)")
    sync.add_argument("--uri", help="with --rebuild: the tracking store to write into, e.g. sqlite:///new.db")
    sync.set_defaults(fn=cmd_sync)

    bud = sub.add_parser("budget", help="wall/CPU/memory per method and stage from the benchmark files")
    bud.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"], help="results/<scale>/ to read")
    bud.add_argument("--strict", action="store_true", help="exit 1 when a method is over budget")
    bud.set_defaults(fn=cmd_budget)

    conv = sub.add_parser("converge", help="budget audit: rerun with every training step count x FACTOR, "
                                           "tabulate each claim's verdict at 1x and FACTORx")
    conv.add_argument("method")
    conv.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"])
    conv.add_argument("--factor", type=float, default=2.0)
    conv.add_argument("-j", "--cores", type=int, default=2)
    conv.add_argument("snakemake_args", nargs="*", help="passed to snakemake (after --)")
    conv.set_defaults(fn=cmd_converge)
    docs = sub.add_parser("docs", help="rewrite method pages' result tables and the README method index")
    docs.add_argument("methods", nargs="*", help="only these methods' pages and index rows (default: all)")
    docs.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"], help="results/<scale>/ to read")
    docs.add_argument("--check", action="store_true",
                      help="write nothing; list pages that differ from results/ and results refused (exit 1 if any)")
    docs.add_argument("--stale", action="store_true",
                      help="write nothing, read no results: list pages whose table was measured on other code "
                           "than the tree's (exit 1 if any)")
    docs.set_defaults(fn=cmd_docs)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["server"]:  # REMAINDER would reject leading options (--detach): hand them over as is
        from .server import main as server_main

        return server_main(argv[1:])
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if argv and argv[0] != "server" and "--" in argv:  # `reprozoo run rex -- --dry-run`: rest goes to snakemake
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    args.snakemake_args = extra
    global ROOT
    if args.cmd not in ("list",) and not (args.cmd == "datasets" and args.action == "list"):
        ROOT = project_root(args.directory)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
