"""The generic pipeline stages, called by the Snakemake rules in ``workflows/`` (and by tests).

acquire -> preprocess -> train_shared (optional) -> train (variant x seed) -> evaluate -> verify -> report

Every stage writes its declared outputs atomically, and only the method code is method-specific.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import registry
from .io import read_json, write_json
from .io import results_root as _results  # the results root of an output path
from .runtime import Metrics, RunContext, seed_everything


@contextlib.contextmanager
def log_to(log_path: str | Path | None):
    """Send this process's stdout/stderr (and its children's) to the rule's log file."""
    if not log_path:
        yield
        return
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "a") as fh:
        os.dup2(fh.fileno(), 1), os.dup2(fh.fileno(), 2)
        try:
            yield
        except BaseException:
            traceback.print_exc()
            raise
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


# --- data ------------------------------------------------------------------------------------

def acquire(dataset: str, scale: str, source: str, raw_dir: Path, manifest: Path, path: str | None = None,
            overrides: dict | None = None) -> dict:
    from .data import registry as dreg
    from .data.download import sha256_file

    spec = dreg.get(dataset)
    params = spec.params(scale, overrides)
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"acquire {dataset} ({scale}) from {source}", flush=True)
    info = spec.module().acquire(source=source, params=params, raw_dir=raw_dir, seed=spec.seed, path=path) or {}
    files = sorted(p for p in raw_dir.rglob("*") if p.is_file() and p.name != Path(manifest).name)
    card = {"dataset": dataset, "family": spec.family, "description": spec.description, "scale": scale,
            "source": source, "seed": spec.seed, "params": params,
            "raw_files": {str(p.relative_to(raw_dir)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                          for p in files},
            "acquire_seconds": round(time.perf_counter() - t0, 3), **info}
    write_json(manifest, card)
    return card


def preprocess(dataset: str, scale: str, raw_dir: Path, manifest: Path, out_dir: Path, card_path: Path,
               preview_path: Path, overrides: dict | None = None) -> dict:
    from .data import registry as dreg
    from .data.download import sha256_file

    spec = dreg.get(dataset)
    params = spec.params(scale, overrides)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    info = spec.module().preprocess(raw_dir=Path(raw_dir), out_dir=out_dir, params=params) or {}
    spec.module().preview(out_dir, Path(preview_path))
    card = read_json(manifest)
    files = info.pop("files", None) or sorted(
        str(p.relative_to(out_dir)) for p in out_dir.iterdir()
        if p.is_file() and p.suffix in {".npz", ".parquet", ".h5", ".json", ".fif", ".csv"} and p.name != "card.json")
    card.update(info)
    card["files"] = {f: {"sha256": sha256_file(out_dir / f), "bytes": (out_dir / f).stat().st_size} for f in files}
    card["preprocess_seconds"] = round(time.perf_counter() - t0, 3)
    write_json(card_path, card)
    return card


# --- methods ---------------------------------------------------------------------------------

def _tags(rule: str, method: str, scale: str, extra: dict | None = None, data_cards: dict | None = None):
    from .tracking import base_tags

    sources = sorted({c.get("source", "?") for c in (data_cards or {}).values()}) or ["none"]
    return base_tags(rule=rule, method=method, scale=scale, data_source=",".join(sources), **(extra or {}))


def _cards(data_dirs: dict[str, Path]) -> dict[str, dict]:
    return {name: read_json(Path(d) / "card.json") for name, d in data_dirs.items() if (Path(d) / "card.json").exists()}


def _run_inputs(method: str, scale: str, seed: int, params: dict, cards: dict[str, dict]) -> dict[str, dict]:
    """The datasets a run consumed; a method that generates its own data (``datasets: []``) gets
    one input naming its generator, with a digest of the parameters and seed that produced it."""
    if cards:
        return cards
    import hashlib

    digest = hashlib.sha256(json.dumps([params, seed], sort_keys=True, default=str).encode()).hexdigest()
    return {f"{method}-generated": {"source": "generated", "scale": scale,
                                    "files": {"params": {"sha256": digest}}}}


def train_shared(method: str, seed: int, scale: str, params: dict, data_dirs: dict[str, Path], done: Path,
                 threads: int = 1, tracking: dict | None = None) -> None:
    from .tracking import JobRun

    spec = registry.get(method)
    module = spec.module()
    shared_dir = Path(done).parent
    shared_dir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(method=method, variant="shared", seed=seed, scale=scale, params=params,
                     data={k: Path(v) for k, v in data_dirs.items()}, outdir=shared_dir,
                     shared_dir=shared_dir, threads=threads)
    seed_everything(seed, threads)
    cards = _cards(ctx.data)
    run = JobRun(method=method, run_name=run_name(method, "shared", seed, scale), results=_results(done),
                 tags=_tags("train_shared", method, scale, {"seed": seed, "variant": "shared"}, cards),
                 pending_path=shared_dir / "tracking_pending.json", **_tracking_kw(tracking))
    with run:
        run.log_params(params)
        run.set_datasets(_run_inputs(method, scale, seed, params, cards))
        t0 = time.perf_counter()
        module.train_shared(ctx)
        ctx.metrics.scalar("wall_seconds", time.perf_counter() - t0)
        write_json(Path(done), ctx.metrics.to_json())
        run.log_metrics(ctx.metrics.scalars, ctx.metrics.curves)


def run_name(method: str, variant: str, seed: int, scale: str) -> str:
    return f"{method}.{variant}.seed{seed}.{scale}"


def train_batch(method: str, cells: list[tuple[str, int]], seeds: list[int], scale: str, params: dict,
                data_dirs: dict[str, Path], results_dir: Path, threads: int = 1, tracking: dict | None = None,
                attempt: int = 1, inject_failure: list | None = None, mem_mb: int | None = None,
                log_path: str | None = None) -> None:
    """All of a method's cells in one process (FANOUT "method"): the per-seed shared training,
    then every variant x seed cell, each with its own MLflow child run and output folder, exactly
    as the one-job-per-cell rules would write them. Job start-up is paid once."""
    spec = registry.get(method)
    results_dir = Path(results_dir)
    n = len(cells) + (len(seeds) if spec.train_shared else 0)
    k = 0
    t0 = time.perf_counter()
    for seed in seeds:
        if spec.train_shared:
            k += 1
            print(f"[{method}] {k}/{n} train_shared seed {seed} ({time.perf_counter() - t0:.1f}s)", flush=True)
            train_shared(method, seed, scale, params, data_dirs,
                         results_dir / "_shared" / f"seed{seed}" / "done.json", threads, tracking)
        for variant, s in cells:
            if s != seed:
                continue
            k += 1
            print(f"[{method}] {k}/{n} train {variant} seed {seed} ({time.perf_counter() - t0:.1f}s)", flush=True)
            train(method, variant, seed, scale, params, data_dirs,
                  results_dir / variant / f"seed{seed}" / "metrics.json",
                  results_dir / "_shared" / f"seed{seed}" if spec.train_shared else None,
                  threads, tracking, attempt, inject_failure, mem_mb, log_path)
    print(f"[{method}] {n} cells done in {time.perf_counter() - t0:.1f}s", flush=True)


def _tracking_kw(tracking: dict | None) -> dict:
    tracking = tracking or {}
    return {"uri": tracking.get("uri"), "retries": int(tracking.get("retries", 3)),
            "deferred": tracking.get("mode") == "deferred"}


class InjectedFailure(MemoryError):
    """Raised on purpose (config ``inject_failure``) to test retries and FAILED runs."""


class InjectedBug(RuntimeError):
    """A deterministic injected failure (``kind: bug``): must not be retried."""


def _maybe_fail(inject: list | None, method: str, variant: str, seed: int, attempt: int) -> None:
    for rule in inject or []:
        if (rule["method"] == method and rule.get("variant", variant) == variant
                and rule.get("seed", seed) == seed and attempt <= rule.get("attempts", 1)):
            cls = InjectedBug if rule.get("kind") == "bug" else InjectedFailure
            raise cls(f"injected failure for {method}/{variant}/seed{seed} on attempt {attempt}")


def train(method: str, variant: str, seed: int, scale: str, params: dict, data_dirs: dict[str, Path],
          metrics_path: Path, shared_dir: Path | None = None, threads: int = 1, tracking: dict | None = None,
          attempt: int = 1, inject_failure: list | None = None, mem_mb: int | None = None,
          log_path: str | None = None) -> Metrics:
    from .tracking import JobRun

    spec = registry.get(method)
    module = spec.module()
    outdir = Path(metrics_path).parent
    outdir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(method=method, variant=variant, seed=seed, scale=scale, params=params,
                     data={k: Path(v) for k, v in data_dirs.items()}, outdir=outdir,
                     shared_dir=Path(shared_dir) if shared_dir else None, threads=threads)
    seed_everything(seed, threads)
    cards = _cards(ctx.data)
    run = JobRun(method=method, run_name=run_name(method, variant, seed, scale), results=_results(metrics_path),
                 # attempt and memory are tags of the run from its start: a killed attempt carries them too
                 tags=_tags("train", method, scale, {"variant": variant, "seed": seed, "role": _role(spec, variant),
                                                     "attempt": attempt, "mem_mb": mem_mb}, cards),
                 pending_path=outdir / "tracking_pending.json", **_tracking_kw(tracking))
    with run:
        run.log_params({**params, "variant": variant, "seed": seed})
        run.set_datasets(_run_inputs(method, scale, seed, params, cards))
        _maybe_fail(inject_failure, method, variant, seed, attempt)
        t0 = time.perf_counter()
        module.train(ctx)
        ctx.metrics.scalar("wall_seconds", time.perf_counter() - t0)
        write_json(Path(metrics_path), ctx.metrics.to_json())  # results first, tracking second
        run.log_metrics(ctx.metrics.scalars, ctx.metrics.curves)
        run.log_artifact(Path(metrics_path))
        if log_path:
            run.log_artifact(Path(log_path))
        for p in sorted(outdir.glob("*.png")):
            run.log_artifact(p)
    return ctx.metrics


def _role(spec, variant: str) -> str:
    return next((v.role for v in spec.variants if v.id == variant), "?")


def collect(method: str, scale: str, metrics_files: list[Path]):
    """Gather every variant x seed ``metrics.json`` into the long table."""
    import pandas as pd

    rows = []
    for f in metrics_files:
        f = Path(f)
        seed = int(f.parent.name.removeprefix("seed"))
        variant = f.parent.parent.name
        for r in Metrics.from_json(read_json(f)).rows():
            rows.append({"method": method, "variant": variant, "seed": seed, "scale": scale, **r})
    table = pd.DataFrame(rows, columns=["method", "variant", "seed", "scale", "metric", "x", "value"])
    return table.astype({"seed": "int64", "x": "float64", "value": "float64"})


def evaluate(method: str, scale: str, params: dict, metrics_files: list[Path], table_path: Path,
             plots_dir: Path) -> None:
    from .io import atomic_path
    from .plotting import generic_plots

    spec = registry.get(method)
    table = collect(method, scale, metrics_files)
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    module = spec.module()
    if hasattr(module, "plot"):
        module.plot(table, plots_dir, params)
    generic_plots(table, plots_dir, spec, getattr(module, "GENERIC_CURVES", None))
    with atomic_path(table_path) as tmp:
        table.to_parquet(tmp, index=False)


class ClaimsError(RuntimeError):
    """A claim could not be evaluated: a pipeline bug (never retried, never a scientific verdict)."""


def verify(method: str, scale: str, table_path: Path, claims_path: Path, tracking: dict | None = None,
           variants: list[str] | None = None, seeds: list[int] | None = None,
           run_config: dict | None = None) -> list[dict]:
    """Claim verdicts of the selection that ran (``variants``, ``seeds``); claims that read a
    variant outside it are "not measured". Convergence of every training variant comes first
    (spec ``convergence:``). Logs the table, plots and claims to the parent run; a claim with
    verdict "error" fails the job after its claims.json is written beside it as ``claims.error.json``."""
    import pandas as pd

    from .claims import convergence, count
    from .claims import verify as verify_claims
    from .codehash import provenance

    spec = registry.get(method)
    table = pd.read_parquet(table_path)
    variants = list(variants) if variants is not None else sorted(table.variant.unique())
    conv = convergence(spec.convergence, table, variants)
    results = verify_claims(spec.claims, table, selected_variants=variants, roles=spec.roles, converged=conv)
    complete = set(variants) == set(spec.variant_ids)
    prov = provenance(method)
    record = {"method": method, "title": spec.title, "paper": spec.paper, "scale": scale,
              "variants": sorted(variants), "complete": complete,
              "seeds": sorted(int(s) for s in (seeds if seeds is not None else table.seed.unique())),
              "git_commit": prov["git_commit"] + ("-dirty" if prov["dirty_files"] else ""),
              "code_hash": prov["code_hash"], "dirty_files": prov["dirty_files"],
              "convergence": conv, "claims": results}
    counts = count(results)
    print(f"{method} ({scale}): " + ", ".join(f"{n} {v}" for v, n in counts.items() if n), flush=True)
    for v, c in conv.items():
        if not c["converged"]:
            print(f"  not converged: {v}: {c.get('reason')}", flush=True)
    errors = [c for c in results if c["verdict"] == "error"]
    if errors:
        write_json(Path(claims_path).with_name("claims.error.json"), record)
        raise ClaimsError(f"{method}: {len(errors)} claim(s) cannot be evaluated (a pipeline bug, not a "
                          "verdict): " + "; ".join(f"'{c['id']}': {c['error']}" for c in errors))
    write_json(claims_path, record)
    metrics = {f"claim.{c['id']}": c["value_mean"] for c in results}
    metrics.update({f"claim.{c['id']}.ci_low": c["ci_low"] for c in results})
    metrics.update({f"claim.{c['id']}.ci_high": c["ci_high"] for c in results})
    metrics.update({f"claim.{c['id']}.control": c["control"]["value_mean"] for c in results if c.get("control")})
    tags = {f"claim.{c['id']}": c["verdict"] for c in results}
    tags.update({f"claims.{v.replace(' ', '_')}": n for v, n in counts.items()})
    tags.update({f"converged.{v}": str(c["converged"]).lower() for v, c in conv.items()})
    params = {f"config.{k}": v for k, v in (run_config or {}).items()}
    plots = Path(table_path).parent / "plots"
    _log_parent(method, scale, Path(claims_path),
                artifacts=[Path(table_path), Path(claims_path)] + ([plots] if plots.is_dir() else []),
                metrics=metrics, tags=tags, params=params, claims=results, tracking=tracking)
    return results


def _log_parent(method: str, scale: str, anchor: Path, artifacts: list[Path], metrics: dict | None = None,
                tags: dict | None = None, params: dict | None = None, claims: list[dict] | None = None,
                tracking: dict | None = None) -> None:
    """Attach method-level results (table, plots, claims) to the invocation's parent run: as a
    payload the end hook logs (deferred), or now (live). Either way the payload stays beside the
    claims as the record ``reprozoo sync --rebuild`` reads."""
    from .tracking import PARENT_PENDING, _client, _replay_parent, flatten, read_invocation, resolve_uri, retry

    kw = _tracking_kw(tracking)
    results = _results(anchor)
    inv = read_invocation(results) or {}
    table = None
    if claims:
        table = {key: [c.get(key) if not isinstance(c.get(key), dict) else json.dumps(c[key]) for c in claims]
                 for key in ("id", "text", "op", "threshold", "paper_value", "value_mean", "ci_low",
                             "ci_high", "per_seed", "verdict", "reason", "control")}
        table["paper_value"] = [str(v) for v in table["paper_value"]]
    payload = {"method": method, "scale": scale, "invocation": inv.get("id"), "metrics": metrics or {},
               "tags": tags or {}, "params": flatten(params or {}), "claims_table": table,
               "artifacts": [str(a) for a in artifacts]}
    pending = Path(anchor).parent / PARENT_PENDING
    write_json(pending, payload)
    if kw["deferred"] or not inv:  # deferred, or a stage run outside an invocation
        return
    try:
        client = _client(resolve_uri(kw["uri"]))
        retry(lambda: _replay_parent(client, payload, results, kw["retries"]), kw["retries"], "log to parent")
        pending.replace(pending.with_name("tracking_parent_logged.json"))
    except Exception as exc:  # noqa: BLE001 - the files are the source of truth
        print(f"[reprozoo.tracking] WARNING: could not log {method} results to MLflow: {exc}. "
              f"They are kept in {pending} for `reprozoo sync`.", file=sys.stderr, flush=True)


def report(claims_files: list[Path], tables: list[Path], summary_md: Path, summary_parquet: Path,
           html: Path, scale: str | None = None, complete: bool = False,
           tracking_uri: str | None = None) -> None:
    """The scale's summary. A complete run also lists every other method whose complete results
    already sit in ``results/<scale>/`` (so ``methods=[rex]`` does not drop the rest)."""
    from .report import build_report

    files = [Path(p) for p in claims_files]
    if complete:
        root = Path(summary_md).parent
        ran = {f.resolve() for f in files}
        files += sorted(f for f in root.glob("*/claims.json") if f.resolve() not in ran)
    build_report(files, [Path(p) for p in tables], Path(summary_md), Path(summary_parquet), Path(html),
                 tracking_uri=tracking_uri)


# --- Snakemake entry point --------------------------------------------------------------------

def _failure_record(log: str | None) -> Path | None:
    return Path(f"{log}.failure.json") if log else None


class JobTimeLimit(RuntimeError):
    """A job ran past RUNTIME_FACTOR x its spec's runtime for the scale (e.g. a typo'd
    ``steps: 1e9``): stopped with a clear message and a FAILED run, not retried."""


RUNTIME_FACTOR = 2.0


@contextlib.contextmanager
def time_limit(minutes: float | None, what: str):
    """Stop the job past ``RUNTIME_FACTOR * minutes`` of wall time (SIGALRM; main thread)."""
    import signal

    if not minutes or minutes <= 0:
        yield
        return
    seconds = int(RUNTIME_FACTOR * minutes * 60)

    def on_alarm(signum, frame):
        raise JobTimeLimit(f"{what} ran past {RUNTIME_FACTOR:g} x its runtime of {minutes:g} min for this scale "
                           f"({seconds} s); check its hyper-parameters or raise `resources.runtime` in its spec")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def retryable(exc: BaseException) -> bool:
    """Only resource exhaustion is worth a retry with more memory/time; a deterministic
    exception (TypeError, a failed assertion, bad data) would fail the same way again."""
    return isinstance(exc, MemoryError)


def from_snakemake(sm: Any) -> None:
    """Dispatch a Snakemake ``script:`` job to its stage (the rule name picks it).

    Retries: Snakemake retries every failed job. A job killed by the kernel or by SLURM for memory
    or time leaves no record and is retried for real; a job that raised writes
    ``<log>.failure.json``, and a retry of a deterministic failure stops at once with one line."""
    rule = sm.rule
    w, p = sm.wildcards, sm.params
    log = sm.log[0] if len(sm.log) else None
    attempt = int(getattr(sm.resources, "attempt", 1))
    record = _failure_record(log)
    if record is not None and record.exists():
        if attempt > 1:
            prev = read_json(record)
            if not prev.get("retryable"):
                msg = (f"reprozoo: {rule} {dict(w.items())} not retried: attempt {prev.get('attempt')} failed "
                       f"with {prev.get('error')} (a deterministic error, not resource exhaustion)")
                print(msg, file=sys.stderr, flush=True)
                Path(log).parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a") as fh:
                    fh.write(msg + "\n" + prev.get("traceback", "") + "\n")
                raise SystemExit(1)
        record.unlink()
    runtime = getattr(sm.resources, "runtime", None) if rule.startswith("train") else None
    try:
        with time_limit(float(runtime) if isinstance(runtime, (int, float)) else None,
                        f"{rule} {dict(w.items())}"):
            _dispatch(sm, rule, w, p, log, attempt)
        _write_usage(log)
    except BaseException as exc:
        if record is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            write_json(record, {"rule": rule, "attempt": attempt, "retryable": retryable(exc),
                                "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                                "traceback": traceback.format_exc()[-4000:]})
        raise


def _write_usage(log: str | None) -> None:
    """CPU seconds (this process and its children, from interpreter start, imports included)
    and peak memory, beside the rule's benchmark file (which has the wall time).
    Snakemake's own benchmark samples CPU too coarsely for jobs of a few seconds."""
    if not log or "/logs/" not in str(log):
        return
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    usage = {"cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
             "max_rss_mb": max(me.ru_maxrss, kids.ru_maxrss) / 1024.0}
    head, _, tail = str(log).rpartition("/logs/")
    out = Path(f"{head}/benchmarks/{tail}").with_suffix(".usage.json")
    write_json(out, usage)


def _dispatch(sm: Any, rule: str, w, p, log: str | None, attempt: int) -> None:
    with log_to(log):
        print(f"== {rule} {dict(w.items())} pid={os.getpid()} host={os.uname().nodename} attempt={attempt}",
              flush=True)
        if rule == "acquire":
            acquire(w.dataset, w.scale, p.source, Path(sm.output.manifest).parent, Path(sm.output.manifest),
                    p.path, dict(p.overrides))
        elif rule == "preprocess":
            preprocess(w.dataset, w.scale, Path(sm.input.manifest).parent, Path(sm.input.manifest),
                       Path(sm.output.card).parent, Path(sm.output.card), Path(sm.output.preview),
                       dict(p.overrides))
        elif rule in ("train_shared", "train_shared_override"):
            train_shared(w.method, int(w.seed), p.scale, p.hp, dict(p.data), Path(sm.output.done),
                         sm.threads, p.tracking)
        elif rule in ("train", "train_override"):
            train(w.method, w.variant, int(w.seed), p.scale, p.hp, dict(p.data), Path(sm.output.metrics),
                  p.shared_dir, sm.threads, p.tracking, attempt,
                  sm.config.get("inject_failure"), getattr(sm.resources, "mem_mb", None), log)
        elif rule.startswith("train_batch_"):
            first = Path(sm.output.metrics[0])  # results/<scale>/<method>/<variant>/seed<S>/metrics.json
            train_batch(p.method, [(v, int(s)) for v, s in p.cells], [int(s) for s in p.seeds], p.scale, p.hp,
                        dict(p.data), first.parents[2], sm.threads, p.tracking, attempt,
                        sm.config.get("inject_failure"), getattr(sm.resources, "mem_mb", None), log)
        elif rule == "evaluate":
            evaluate(w.method, p.scale, p.hp, list(sm.input.metrics), Path(sm.output.table),
                     Path(sm.output.plots))
        elif rule == "verify":
            verify(w.method, p.scale, Path(sm.input.table), Path(sm.output.claims), p.tracking,
                   list(p.variants), [int(s) for s in p.seeds], dict(p.config))
        elif rule == "report":
            report(list(sm.input.claims), list(sm.input.tables), Path(sm.output.md), Path(sm.output.parquet),
                   Path(sm.output.html), scale=p.scale, complete=bool(p.complete),
                   tracking_uri=getattr(p, "tracking_uri", None))
        elif rule == "noop":  # benchmarks/bench_overhead.py: the platform's own cost per job
            Path(sm.output[0]).write_text("{}")
        elif rule == "noop_tracked":  # the same plus one MLflow run with a metric (tracking cost per job)
            from .tracking import JobRun

            out = Path(sm.output[0])
            with JobRun(method="overhead", run_name=out.stem, results=_results(out), tags={"rule": rule},
                        pending_path=out.with_suffix(".pending.json"), uri=p.uri, nested=False) as run:
                run.log_metrics({"x": 1.0})
            out.write_text("{}")
        else:
            raise ValueError(f"no stage for rule '{rule}'")
