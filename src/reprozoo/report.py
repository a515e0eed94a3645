"""The cross-method report: summary.md, summary.parquet and a self-contained report.html."""
from __future__ import annotations

import base64
import json
import html
import math
from pathlib import Path

import pandas as pd

from .io import atomic_path, atomic_write_text, read_json, results_root

COLUMNS = ["method", "title", "scale", "claim", "text", "expr", "op", "threshold", "paper_value",
           "value_mean", "value_std", "n_seeds", "ci_low", "ci_high", "per_seed", "holds_every_seed",
           "verdict", "reason", "control_value", "control_verdict", "interval"]
# every verdict class, in the order a reader should meet them (docs/verdicts.md)
from .claims import VERDICTS  # noqa: E402


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return str(x)
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "nan"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.3g}"
    return f"{x:.4g}"


def summary_table(claims_files: list[Path]) -> pd.DataFrame:
    rows = []
    for f in claims_files:
        data = read_json(f)
        for c in data["claims"]:
            rows.append({"method": data["method"], "title": data["title"], "scale": data["scale"],
                         "claim": c["id"], "text": c["text"], "expr": c["expr"], "op": c["op"],
                         "threshold": c["threshold"], "paper_value": str(c.get("paper_value")),
                         "value_mean": c["value_mean"], "value_std": c["value_std"], "n_seeds": c["n_seeds"],
                         "ci_low": c.get("ci_low", float("nan")), "ci_high": c.get("ci_high", float("nan")),
                         "per_seed": ", ".join(fmt(v) for v in c.get("per_seed", {}).values()),
                         "holds_every_seed": c["holds_every_seed"], "verdict": c["verdict"],
                         "reason": c.get("reason") or "", "interval": c.get("interval") or "",
                         "control_value": (c.get("control") or {}).get("value_mean", float("nan")),
                         "control_verdict": (c.get("control") or {}).get("verdict", "")})
    return pd.DataFrame(rows, columns=COLUMNS)


def measured(c) -> str:
    """A claim's measurement as a reader should see it: the one-sided 95 % bound that decides the
    verdict and the per-seed values (a single seed is shown as such, never as "± 0")."""
    get = c.get if isinstance(c, dict) else lambda k, d=None: getattr(c, k, d)
    n = int(get("n_seeds", 0) or 0)
    if get("verdict") == "not measured":
        return "not measured (variants " + ", ".join(get("missing_variants", []) or []) + " not run)"
    if n == 0:
        return "-" if not get("error") else "error: " + str(get("error"))
    per = get("per_seed")
    per = ", ".join(fmt(v) for v in per.values()) if isinstance(per, dict) else per
    if n == 1:
        return f"{fmt(get('value_mean'))} (single seed)"
    # the bound that decides: a claim holds when its bound on the claim's side clears the threshold and
    # fails when the bound on the other side misses it (a failed "< 1" is shown by its lower bound)
    low_side = (get("op") in (">=", ">")) != (get("verdict") == "fails")
    bound = f"lower bound {fmt(get('ci_low'))}" if low_side else f"upper bound {fmt(get('ci_high'))}"
    units = get("n_units")
    how = f"; {int(units)} units per seed, {get('interval')}" if units and units == units and "bootstrap" in str(get("interval")) else ""
    return f"{fmt(get('value_mean'))} ± {fmt(get('value_std'))} (95 % {bound}; seeds: {per}{how})"


def why(c) -> str:
    """The reason a verdict is what it is (a failed precondition, a stalled variant, a control
    that holds too, what an inconclusive claim lacks), and the control's value next to it."""
    get = c.get if isinstance(c, dict) else lambda k, d=None: getattr(c, k, d)
    parts = []
    ctl = get("control")
    if isinstance(ctl, dict) and ctl:
        parts.append(f"control ({ctl.get('kind')}) {ctl.get('condition')}: {fmt(ctl.get('value_mean'))}, "
                     f"{ctl.get('verdict')}")
    if get("reason"):
        parts.append(str(get("reason")))
    return "; ".join(parts)


def counts(verdicts, zeros: bool = False) -> str:
    vs = list(verdicts)
    return ", ".join(f"{vs.count(v)} {v}" for v in VERDICTS if zeros or vs.count(v))


def print_verdicts(claims_files) -> None:
    """The verdict table of what was run, printed at the end of a Snakemake invocation."""
    rows = []
    for f in claims_files:
        f = Path(f)
        if not f.exists():
            continue
        data = read_json(f)
        for c in data["claims"]:
            rows.append((data["method"], c["id"], c["verdict"], measured(c), f"{c['op']} {fmt(c['threshold'])}"))
    if not rows:
        return
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    print("\nreprozoo verdicts (" + counts((r[2] for r in rows), zeros=True) + ")")
    for m, cid, v, meas, thr in rows:
        print(f"  {m:<{w[0]}}  {cid:<{w[1]}}  {v:<{w[2]}}  {meas[:70]}  [{thr}]")
    print()


def markdown(df: pd.DataFrame) -> str:
    lines = ["# reprozoo summary", ""]
    if df.empty:
        return "\n".join(lines + ["No claims were evaluated.", ""])
    scales = sorted(df.scale.unique())
    lines += [f"{len(df)} claims over {df.method.nunique()} method(s) at scale `{', '.join(scales)}`: "
              f"{counts(df.verdict, zeros=True)}. Verdict classes: docs/verdicts.md.", ""]
    if "ci" in scales:
        lines += ["> **ci scale: plumbing only.** These numbers test that the pipeline runs; the claims are "
                  "tested at `smoke`.", ""]
    lines += ["| method | claim | measured | threshold | paper | verdict | why |",
              "|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        d = r._asdict()
        reason = "; ".join(x for x in ((f"control {fmt(r.control_value)}: {r.control_verdict}" if r.control_verdict
                                        else ""), r.reason) if x)
        lines.append(f"| {r.method} | {r.claim}: {r.text} | {measured(d)} | {r.op} {fmt(r.threshold)} | "
                     f"{r.paper_value} | **{r.verdict}** | {reason.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img src="data:image/png;base64,{data}"><figcaption>{html.escape(path.name)}</figcaption></figure>'


def _provenance(claims_files: list[Path]) -> dict:
    """Commit(s), date and the invocation's config, for the report's header."""
    import datetime
    import json
    import os

    commits = sorted({read_json(f).get("git_commit", "unknown") for f in claims_files})
    config = None
    inv = os.environ.get("REPROZOO_INVOCATION")
    if inv and claims_files:
        state = results_root(claims_files[0]) / ".tracking" / "invocations" / f"{inv}.json"
        if state.exists():
            config = json.loads(state.read_text()).get("config")
    return {"commits": commits, "date": datetime.datetime.now().isoformat(timespec="seconds"), "config": config}


def _datasets_html(data: dict, claims_file: Path) -> list[str]:
    """Each dataset's card (source, version, sizes) and preview for the method's scale."""
    from . import registry

    try:
        names = registry.get(data["method"]).datasets_for(data["scale"])
    except ValueError:
        return []
    results = results_root(claims_file)
    out = []
    for name in names:
        d = results / "data" / name / data["scale"]
        if not (d / "card.json").exists():
            continue
        card = read_json(d / "card.json")
        keep = {k: card[k] for k in ("source", "version", "description", "sizes", "surrogate") if k in card}
        out.append(f"<details><summary>dataset <code>{html.escape(name)}</code> ({html.escape(str(card.get('source')))})"
                   f"</summary><pre>{html.escape(json.dumps(keep, indent=1, default=str))}</pre>"
                   + (_img(d / "preview.png") if (d / "preview.png").exists() else "") + "</details>")
    return out


STYLE = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 6px}"
         ".holds{background:#d9f2d9}.fails{background:#f8d7d7}.inconclusive{background:#fff3cd}"
         ".not.converged,.non-discriminative,.untestable{background:#e8dcf5}.error{background:#f5b7b7}"
         ".banner{background:#fff3cd;border:1px solid #e0c36c;padding:8px}"
         "figure{display:inline-block;margin:6px}img{max-width:520px;border:1px solid #eee}")


def _head(title: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            f"{STYLE}</style></head><body>")


def html_page(df: pd.DataFrame, claims_files: list[Path], links: dict[str, str] | None = None) -> str:
    """The report; ``links`` maps a method (its MLflow experiment) to its runs in the MLflow UI."""
    import json as _json

    prov = _provenance(claims_files)
    parts = [_head("reprozoo report"), "<h1>reprozoo report</h1>"]
    scales = sorted(set(df.scale)) if not df.empty else []
    parts.append(f"<p>scale <b>{', '.join(scales) or '-'}</b>; generated {prov['date']}; git commit "
                 f"{', '.join(f'<code>{html.escape(c)}</code>' for c in prov['commits'])}. Runs: "
                 "<code>reprozoo ui</code>, one MLflow experiment per method (named as below).</p>")
    if prov["config"] is not None:
        parts.append("<details><summary>configuration of this run</summary><pre>"
                     f"{html.escape(_json.dumps(prov['config'], indent=1, default=str))}</pre></details>")
    if not df.empty:
        parts.append(f"<p>{html.escape(counts(df.verdict, zeros=True))} ({len(df)} claims). The verdict classes "
                     "are explained in <code>docs/verdicts.md</code>.</p>")
        if "ci" in set(df.scale):
            parts.append("<p class='banner'><b>ci scale: plumbing only.</b> These verdicts test that the "
                         "pipeline runs; the claims are tested at <code>smoke</code>.</p>")
    datas = sorted(((f, read_json(f)) for f in claims_files), key=lambda fd: fd[1]["method"])
    parts.append("<h2>Contents</h2><ul>" + "".join(
        f"<li><a href='#{html.escape(d['method'])}'>{html.escape(d['method'])}</a>: "
        f"{html.escape(counts(c['verdict'] for c in d['claims']))}</li>" for _, d in datas) + "</ul>")
    for f, data in datas:
        parts += method_html(f, data, links)
    parts.append("</body></html>")
    return "\n".join(parts)


def method_html(f: Path, data: dict, links: dict[str, str] | None = None, plots: bool = True) -> list[str]:
    """One method's section of the report: header, convergence, claims table, datasets and (with
    ``plots``) its figures."""
    parts = []
    parts.append(f"<h2 id='{html.escape(data['method'])}'>{html.escape(data['method'])}: {html.escape(data['title'])}</h2>")
    parts.append(f"<p>{html.escape(data['paper'])}; scale <code>{data['scale']}</code>; "
                 f"seeds {data['seeds']}; variants {', '.join(data['variants'])}; "
                 + _runs_link(data["method"], (links or {}).get(data["method"])) + "</p>")
    conv = data.get("convergence") or {}
    if conv:
        parts.append("<p>convergence of the trained variants (validation curve over the last 30 % of "
                     "training): " + ", ".join(
                         f"<code>{html.escape(v)}</code> " + ("flat" if c["converged"] else
                                                             f"<b>not converged</b> ({html.escape(str(c.get('reason')))})")
                         for v, c in sorted(conv.items())) + "</p>")
    parts.append("<table><tr><th>claim</th><th>measured</th><th>threshold</th><th>paper</th>"
                 "<th>verdict</th><th>control, reason</th></tr>")
    for c in data["claims"]:
        parts.append(
            f"<tr class='{c['verdict']}'><td>{html.escape(c['text'])}<br><code>{html.escape(c['expr'])}</code>"
            f"</td><td>{html.escape(measured(c))}</td>"
            f"<td>{c['op']} {fmt(c['threshold'])}</td><td>{html.escape(str(c.get('paper_value')))}</td>"
            f"<td><b>{c['verdict']}</b></td><td>{html.escape(why(c))}</td></tr>")
    parts.append("</table>")
    parts += _datasets_html(data, f)
    if plots:
        parts += [_img(p) for p in sorted((f.parent / "plots").glob("*.png"))]
    return parts


def _runs_link(method: str, url: str | None) -> str:
    if url:
        return (f"<a href='{html.escape(url)}'>its runs in MLflow</a> (experiment <code>{html.escape(method)}"
                "</code>; the link opens while <code>reprozoo ui</code> or the tracking server runs)")
    return (f"MLflow experiment <code>{html.escape(method)}</code> (logged at the end of this invocation; "
            "open with <code>reprozoo ui</code>, or rebuild the report for a direct link)")


def build_report(claims_files: list[Path], tables: list[Path], summary_md: Path, summary_parquet: Path,
                 html_path: Path, tracking_uri: str | None = None) -> pd.DataFrame:
    from .tracking import experiment_links

    df = summary_table(claims_files)
    links = experiment_links([read_json(f)["method"] for f in claims_files], tracking_uri)
    with atomic_path(summary_parquet) as tmp:
        df.to_parquet(tmp, index=False)
    atomic_write_text(summary_md, markdown(df))
    atomic_write_text(html_path, html_page(df, claims_files, links))
    return df


def write_claims_pages(claims_files: list[Path], pages: list[Path], summary_html: Path) -> None:
    """Pages for Snakemake's own report (``snakemake --report``), which shows HTML and images but
    not JSON: each method's claims (``pages[i]`` from ``claims_files[i]``: the section of our
    report.html without its figures, which the report lists as files of their own) and the
    cross-method verdict table (``summary_html``, the table of summary.md)."""
    datas = []
    for f, page in zip(claims_files, pages, strict=True):
        f = Path(f)
        data = read_json(f)
        datas.append(data)
        body = method_html(f, data, plots=False)
        banner = (["<p class='banner'><b>ci scale: plumbing only.</b> These verdicts test that the pipeline "
                   "runs; the claims are tested at <code>smoke</code>.</p>"] if data["scale"] == "ci" else [])
        atomic_write_text(Path(page), "\n".join([_head(f"{data['method']}: claims"), *banner, *body,
                                                 "</body></html>"]) + "\n")
    rows = []
    for data in sorted(datas, key=lambda d: d["method"]):
        for c in data["claims"]:
            rows.append(f"<tr class='{c['verdict']}'><td>{html.escape(data['method'])}</td>"
                        f"<td>{html.escape(c['id'])}: {html.escape(c['text'])}</td><td>{html.escape(measured(c))}</td>"
                        f"<td>{c['op']} {fmt(c['threshold'])}</td><td>{html.escape(str(c.get('paper_value')))}</td>"
                        f"<td><b>{c['verdict']}</b></td><td>{html.escape(why(c))}</td></tr>")
    verdicts = [c["verdict"] for d in datas for c in d["claims"]]
    scales = sorted({d["scale"] for d in datas})
    parts = [_head("reprozoo summary"), "<h1>reprozoo summary</h1>",
             f"<p>{len(verdicts)} claims over {len(datas)} method(s) at scale <code>{', '.join(scales)}</code>: "
             f"{html.escape(counts(verdicts, zeros=True))}. Verdict classes: <code>docs/verdicts.md</code>.</p>"]
    if "ci" in scales:
        parts.append("<p class='banner'><b>ci scale: plumbing only.</b> These numbers test that the pipeline "
                     "runs; the claims are tested at <code>smoke</code>.</p>")
    parts += ["<table><tr><th>method</th><th>claim</th><th>measured</th><th>threshold</th><th>paper</th>"
              "<th>verdict</th><th>control, reason</th></tr>", *rows, "</table></body></html>"]
    atomic_write_text(Path(summary_html), "\n".join(parts) + "\n")
