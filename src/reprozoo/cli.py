"""``reprozoo``: the command line around the Snakemake workflow.

    reprozoo list                       methods, their variants and claims
    reprozoo run [METHOD ...] [--scale S] [--seeds 0 1] [--variants v ...] [-j N] [-- SNAKEMAKE ARGS]
    reprozoo datasets list | fetch NAME [--scale S] [--source offline|remote] | card NAME [--scale S]
    reprozoo ui [--port 5000]           MLflow UI on the embedded store, bound to 127.0.0.1
    reprozoo server [...]               an MLflow tracking server for cluster runs (see docs/cluster.md)
    reprozoo sync                       replay tracking payloads that could not be logged
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _snakemake_cmd(targets: list[str], config: dict, cores: int | None, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "--profile", str(ROOT / "profiles" / "default")]
    if cores:
        cmd += ["--cores", str(cores)]
    if config:
        cmd += ["--config"] + [f"{k}={json.dumps(v)}" for k, v in config.items()]
    return cmd + targets + extra


def cmd_list(args) -> int:
    from . import registry

    for spec in registry.all_specs():
        print(f"{spec.id:20s} {spec.title}")
        print(f"{'':20s} variants: {', '.join(v.id + ('*' if v.role == 'method' else '') for v in spec.variants)}")
        print(f"{'':20s} datasets: {', '.join(spec.datasets)}; env: {spec.env}")
        for c in spec.claims:
            print(f"{'':20s} claim {c.id}: {c.expr} {c.op} {c.threshold:g}")
    print("\n(* = the paper's method; the others are baselines)")
    return 0


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
    targets = [f"results/{m}/claims.json" for m in args.methods] if args.methods else []
    cmd = _snakemake_cmd(targets, config, args.cores, args.snakemake_args)
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


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
    from .tracking import resolve_uri

    uri = resolve_uri(args.uri, ROOT)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
           "--port", str(args.port)]
    print("+", " ".join(cmd), f"\nopen http://{args.host}:{args.port}", flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def cmd_server(args) -> int:
    from .server import main as server_main

    return server_main(args.server_args)


def cmd_sync(args) -> int:
    from .tracking import replay_pending

    n = replay_pending(ROOT / "results")
    print(f"replayed {n} pending tracking payload(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reprozoo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="methods, variants, claims").set_defaults(fn=cmd_list)

    run = sub.add_parser("run", help="run the workflow (all methods, or the ones named)")
    run.add_argument("methods", nargs="*")
    run.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"])
    run.add_argument("--seeds", type=int, nargs="+")
    run.add_argument("--variants", nargs="+")
    run.add_argument("-j", "--cores", type=int)
    run.set_defaults(fn=cmd_run)

    ds = sub.add_parser("datasets", help="list datasets, fetch one, show its card")
    ds.add_argument("action", choices=["list", "fetch", "card"])
    ds.add_argument("name", nargs="?")
    ds.add_argument("--scale", default="smoke", choices=["ci", "smoke", "paper"])
    ds.add_argument("--source", choices=["offline", "remote", "path"])
    ds.add_argument("--path")
    ds.add_argument("-j", "--cores", type=int)
    ds.set_defaults(fn=cmd_datasets)

    ui = sub.add_parser("ui", help="MLflow UI on the results store (127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///results/mlflow.db"))
    ui.set_defaults(fn=cmd_ui)

    srv = sub.add_parser("server", help="MLflow tracking server for cluster runs", add_help=False)
    srv.add_argument("server_args", nargs=argparse.REMAINDER)
    srv.set_defaults(fn=cmd_server)

    sub.add_parser("sync", help="replay tracking payloads saved when MLflow was unreachable").set_defaults(fn=cmd_sync)
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
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
