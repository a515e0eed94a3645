"""Pages written from results, never by hand: each method's measured table and the top README's
method index.

``reprozoo docs`` reads ``results/<scale>/<method>/claims.json`` (``smoke`` by default) and
rewrites the text between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in
``src/reprozoo/methods/<method>/README.md``, and between ``<!-- methods:begin -->`` and
``<!-- methods:end -->`` in the top ``README.md``. A method without results says so.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import registry
from .io import atomic_write_text, read_json
from .report import counts, fmt, measured

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
MBEGIN, MEND = "<!-- methods:begin -->", "<!-- methods:end -->"
BBEGIN, BEND = "<!-- budget:begin -->", "<!-- budget:end -->"


def claims_table(data: dict) -> str:
    commit = data.get("git_commit", "unknown")
    shown = commit.split("-")[0][:12] + (" + uncommitted changes" if commit.endswith("-dirty") else "")
    lines = [f"Measured at `{data['scale']}` scale, seeds {data['seeds']}, commit `{shown}`"
             f" (`results/{data['scale']}/{data['method']}/claims.json`; verdicts from the one-sided 95 % "
             "Student-t interval over seeds):", "",
             "| claim | measured | threshold | paper | verdict |", "|---|---|---|---|---|"]
    for c in data["claims"]:
        text = c["text"].replace("|", "\\|")
        lines.append(f"| `{c['id']}`: {text} | {measured(c)} | {c['op']} {fmt(c['threshold'])} | "
                     f"{str(c.get('paper_value')).replace('|', '/')} | **{c['verdict']}** |")
    lines += ["", f"Summary: {counts(c['verdict'] for c in data['claims'])}."]
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
    body = claims_table(read_json(f)) if f.exists() else f"Not measured yet at `{scale}` (run `snakemake --config scale={scale} methods=[{method}]`)."
    return replace_between(page.read_text(), BEGIN, END, body)


def methods_index(results: Path, scale: str) -> str:
    lines = [f"| method | wave | claims at `{scale}` | page |", "|---|---|---|---|"]
    for spec in registry.all_specs():
        f = Path(results) / scale / spec.id / "claims.json"
        verdicts = counts(c["verdict"] for c in read_json(f)["claims"]) if f.exists() else "not measured"
        page = f"src/reprozoo/methods/{spec.id}/README.md"
        lines.append(f"| [{spec.id}]({page}) | {spec.wave} | {verdicts} | {spec.title.replace('|', '/')} |")
    return "\n".join(lines)


def budget_block(root: Path) -> str:
    """The measured budgets: per method at ci and smoke (from the jobs' benchmark files) and the
    per-job overhead (benchmarks/results/overhead.json), with where each number comes from."""
    import json

    from .budget import table

    out = []
    for scale, col, limit in (("ci", "wall_s", "30 s wall"), ("smoke", "cpu_s", "2 CPU-min mean, 5 max")):
        df = table(Path(root) / "results", scale)
        if df.empty:
            out.append(f"`{scale}`: not measured yet (`reprozoo budget --scale {scale}` after a run).")
            continue
        over = list(df.method[df.over])
        out.append(f"`{scale}` ({len(df)} methods, `reprozoo budget --scale {scale}`; budget {limit}): "
                   f"wall per method {df.wall_s.min():.0f}-{df.wall_s.max():.0f} s, CPU per method "
                   f"{df.cpu_s.min():.0f}-{df.cpu_s.max():.0f} s (mean {df.cpu_s.mean():.0f} s); over budget: "
                   f"{', '.join(over) if over else 'none'}.")
    f = Path(root) / "benchmarks" / "results" / "overhead.json"
    if f.exists():
        o = json.loads(f.read_text())
        out.append(f"Job overhead (`python -m benchmarks overhead`): {o['overhead_per_job_s']['noop']:.2f} s per job "
                   f"for our dispatch over Snakemake's own {o['bare_per_job_s']:.2f} s floor "
                   f"(`python -c pass`), {o['overhead_per_job_s']['noop_tracked']:.2f} s with one live MLflow run.")
    return "\n\n".join(out)


def write_all(root: Path, scale: str = "smoke") -> list[Path]:
    """Rewrite every method page and the top README's index; return the files changed."""
    results = Path(root) / "results"
    changed = []
    for spec in registry.all_specs():
        new = method_page(spec.id, results, scale, root)
        page = page_path(root, spec.id)
        if new is not None and new != page.read_text():
            atomic_write_text(page, new)
            changed.append(page)
    top = Path(root) / "README.md"
    if top.exists():
        text = top.read_text()
        new = text
        if MBEGIN in new:
            new = replace_between(new, MBEGIN, MEND, methods_index(results, scale))
        if BBEGIN in new:
            new = replace_between(new, BBEGIN, BEND, budget_block(root))
        if new != text:
            atomic_write_text(top, new)
            changed.append(top)
    return changed
