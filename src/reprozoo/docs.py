"""Pages written from results, never by hand: each method's measured table and the top README's
method index.

``reprozoo docs`` reads ``results/<scale>/<method>/claims.json`` (``smoke`` by default) and
rewrites the text between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in
``src/reprozoo/methods/<method>/README.md``, and between ``<!-- methods:begin -->`` and
``<!-- methods:end -->`` in the top ``README.md``. A method without results says so.

A table is written only from results that a rerun of a named commit reproduces: results whose
code (the method's closure, spec, configs and the verdict code; ``codehash.provenance``) had
uncommitted changes, or whose code hash differs from the code in the tree now, are refused with the
reason, and the page keeps its previous table. ``reprozoo docs --check`` lists every page whose
table differs from what ``results/`` would write, and every refusal. ``reprozoo docs --stale`` needs no
results: it lists every page whose table names a code hash other than the tree's now (a block or
config changed since the table was measured), which is what a checkout without ``results/`` can say.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import registry
from .io import atomic_write_text, read_json
from .report import counts, fmt, measured, why

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
MBEGIN, MEND = "<!-- methods:begin -->", "<!-- methods:end -->"
MEASURED = "Measured at `"  # how a results block written from claims.json begins (claims_table)
BBEGIN, BEND = "<!-- budget:begin -->", "<!-- budget:end -->"


class StaleResults(ValueError):
    """Results a rerun of a named commit would not reproduce."""


def refusal(data: dict) -> str | None:
    """Why a method's results may not become its page's table, or None."""
    from .codehash import provenance

    if data.get("dirty_files"):
        return (f"measured with uncommitted changes to {', '.join(data['dirty_files'][:5])}"
                + (" ..." if len(data["dirty_files"]) > 5 else "") + ": commit, rerun, then `reprozoo docs`")
    if str(data.get("git_commit", "")).endswith("-dirty") and "code_hash" not in data:
        return "measured on a dirty tree by a version that did not record which files were dirty: rerun"
    if "code_hash" not in data:
        return "results carry no code hash (written before provenance was recorded): rerun"
    now = provenance(data["method"])
    if now["code_hash"] != data["code_hash"]:
        return (f"the code changed since it was measured (hash {data['code_hash']} then, {now['code_hash']} now): "
                "rerun the method")
    return None


def _check_methods(methods: list[str] | None) -> None:
    """Refuse method names the registry does not know, naming the known ones."""
    known = [spec.id for spec in registry.all_specs()]
    unknown = sorted(set(methods or []) - set(known))
    if unknown:
        raise ValueError(f"docs: unknown method(s) {unknown}; expected some of {known}")


PAGE_HASH = re.compile(r"code hash `([0-9a-f]{16})`")


def stale_pages(root: Path, methods: list[str] | None = None) -> list[tuple[str, str | None, str]]:
    """``(method, hash on the page or None, hash of the tree now)`` for every page (of ``methods``) whose
    results table was not measured on the code in the tree: its recorded code hash differs, or it
    records none (not measured yet). Reads pages only, so it works without ``results/``."""
    from .codehash import provenance

    _check_methods(methods)
    out = []
    for spec in registry.all_specs():
        if methods and spec.id not in methods:
            continue
        page = page_path(root, spec.id)
        if not page.exists():
            continue
        m = PAGE_HASH.search(page.read_text().partition(BEGIN)[2].partition(END)[0])
        now = provenance(spec.id)["code_hash"]
        if m is None or m.group(1) != now:
            out.append((spec.id, m.group(1) if m else None, now))
    return out


def claims_table(data: dict) -> str:
    commit = str(data.get("git_commit", "unknown")).split("-")[0][:12]
    lines = [f"Measured at `{data['scale']}` scale, seeds {data['seeds']}, commit `{commit}` (clean; code hash "
             f"`{data.get('code_hash', '?')}`; `results/{data['scale']}/{data['method']}/claims.json`; verdict "
             "classes: [docs/verdicts.md](../../../../docs/verdicts.md)):", "",
             "| claim | measured | threshold | paper | verdict | control, reason |", "|---|---|---|---|---|---|"]
    for c in data["claims"]:
        text = c["text"].replace("|", "\\|")
        lines.append(f"| `{c['id']}`: {text} | {measured(c)} | {c['op']} {fmt(c['threshold'])} | "
                     f"{str(c.get('paper_value')).replace('|', '/')} | **{c['verdict']}** | "
                     f"{why(c).replace('|', '/')} |")
    lines += ["", f"Summary: {counts(c['verdict'] for c in data['claims'])}."]
    conv = data.get("convergence") or {}
    if conv:
        lines += ["", "Convergence (validation curve over the last 30 % of training): " + "; ".join(
            f"`{v}` " + ("flat" if r["converged"] else f"**not converged** ({r.get('reason')})")
            for v, r in sorted(conv.items())) + "."]
    budget = Path(data.get("_path", "")).parent / "converge.md" if data.get("_path") else None
    if budget is not None and budget.exists():
        lines += ["", budget.read_text().strip()]
    return "\n".join(lines)


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    block = f"{begin}\n{body}\n{end}"
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return text.rstrip() + "\n\n## Results\n\n" + block + "\n"


def page_path(root: Path, method: str) -> Path:
    """The page in the project at ``root`` (not in the installed package)."""
    return Path(root) / "src" / "reprozoo" / "methods" / method / "README.md"


def method_page(method: str, results: Path, scale: str, root: Path) -> str | None:
    """The method page with its results section rewritten; None if the page does not exist."""
    page = page_path(root, method)
    if not page.exists():
        return None
    f = Path(results) / scale / method / "claims.json"
    if not f.exists():
        text = page.read_text()
        if MEASURED in text.partition(BEGIN)[2].partition(END)[0]:
            return text  # measured elsewhere (a checkout holding some methods' results): keep it
        body = f"Not measured yet at `{scale}` (run `snakemake --config scale={scale} methods=[{method}]`)."
        return replace_between(text, BEGIN, END, body)
    data = read_json(f)
    why_not = refusal(data)
    if why_not:
        raise StaleResults(f"{method}: {why_not}")
    data["_path"] = str(f)
    return replace_between(page.read_text(), BEGIN, END, claims_table(data))


def methods_index(results: Path, scale: str, previous: str = "", only: set[str] | None = None) -> str:
    """The index of method pages; a method with no results here keeps its row from ``previous``
    (the index as it stands), as its page keeps its table; with ``only``, every other method keeps
    its row too."""
    kept = {m.group(1): m.group(0) for m in re.finditer(r"^\| \[(\w+)\]\(.*$", previous, re.M)}
    lines = [f"| method | wave | claims at `{scale}` | page |", "|---|---|---|---|"]
    for spec in registry.all_specs():
        f = Path(results) / scale / spec.id / "claims.json"
        if not f.exists() and spec.id in kept and "| not measured |" not in kept[spec.id]:
            lines.append(kept[spec.id])
            continue
        data = read_json(f) if f.exists() else None
        verdicts = "not measured" if data is None else (
            "results not reproducible at this commit (rerun)" if refusal(data) else counts(c["verdict"] for c in data["claims"]))
        page = f"src/reprozoo/methods/{spec.id}/README.md"
        lines.append(f"| [{spec.id}]({page}) | {spec.wave} | {verdicts} | {spec.title.replace('|', '/')} |")
    if only is not None:  # a subset: the index as it stands, with only the named rows replaced
        rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| \[(\w+)\]\(.*$", "\n".join(lines), re.M)}
        if previous.strip():
            return re.sub(r"^\| \[(\w+)\]\(.*$", lambda m: rows[m.group(1)] if m.group(1) in only and m.group(1) in rows
                          else m.group(0), previous, flags=re.M).strip("\n")
    return "\n".join(lines)


def budget_block(root: Path) -> str | None:
    """None unless every method was measured at ci and smoke here and the overhead benchmark ran
    (a partial results tree never replaces the block). The measured budgets: per method at ci and smoke (from the jobs' benchmark files) and the
    per-job overhead (benchmarks/results/overhead.json), with where each number comes from."""
    import json

    from .budget import table

    out = []
    for scale, col, limit in (("ci", "wall_s", "30 s wall"), ("smoke", "cpu_s", "8 CPU-min per method")):
        df = table(Path(root) / "results", scale)
        if set(df.method) != set(registry.method_ids()) if not df.empty else True:
            return None  # not every method measured at this scale here: keep the block as it is
        over = list(df.method[df.over])
        out.append(f"`{scale}` ({len(df)} methods, `reprozoo budget --scale {scale}`; budget {limit}): "
                   f"wall per method {df.wall_s.min():.0f}-{df.wall_s.max():.0f} s, CPU per method "
                   f"{df.cpu_s.min():.0f}-{df.cpu_s.max():.0f} s (mean {df.cpu_s.mean():.0f} s); over budget: "
                   f"{', '.join(over) if over else 'none'}.")
    f = Path(root) / "benchmarks" / "results" / "overhead.json"
    if not f.exists():
        return None  # the overhead benchmark has not run here: keep the block as it is
    if f.exists():
        o = json.loads(f.read_text())
        out.append(f"Job overhead (`python -m benchmarks overhead`): {o['overhead_per_job_s']['noop']:.2f} s per job "
                   f"for our dispatch over Snakemake's own {o['bare_per_job_s']:.2f} s floor "
                   f"(`python -c pass`), {o['overhead_per_job_s']['noop_tracked']:.2f} s with one live MLflow run.")
    return "\n\n".join(out)


def write_all(root: Path, scale: str = "smoke", check: bool = False,
              refused: list[str] | None = None, methods: list[str] | None = None) -> list[Path]:
    """Rewrite every method page and the top README's index; return the files changed (with
    ``check``, the files that would change, writing nothing). Methods whose results are refused
    (:func:`refusal`) keep their page and are appended to ``refused``. ``methods``: only those
    pages and those rows of the index (the others stay as they are, e.g. pages being edited)."""
    results = Path(root) / "results"
    changed = []
    refused = refused if refused is not None else []
    _check_methods(methods)
    only = set(methods) if methods else None
    for spec in registry.all_specs():
        if only is not None and spec.id not in only:
            continue
        try:
            new = method_page(spec.id, results, scale, root)
        except StaleResults as exc:
            refused.append(str(exc))
            continue
        page = page_path(root, spec.id)
        if new is not None and new != page.read_text():
            if not check:
                atomic_write_text(page, new)
            changed.append(page)
    top = Path(root) / "README.md"
    if top.exists():
        text = top.read_text()
        new = text
        if MBEGIN in new:
            new = replace_between(new, MBEGIN, MEND,
                                  methods_index(results, scale, new.partition(MBEGIN)[2].partition(MEND)[0], only))
        block = budget_block(root) if BBEGIN in new and only is None else None  # a subset: the suite block stays
        if block is not None:
            new = replace_between(new, BBEGIN, BEND, block)
        if new != text:
            if not check:
                atomic_write_text(top, new)
            changed.append(top)
    return changed
