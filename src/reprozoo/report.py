"""The cross-method report: summary.md, summary.parquet and a self-contained report.html."""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import pandas as pd

from .io import atomic_path, atomic_write_text, read_json

COLUMNS = ["method", "title", "scale", "claim", "text", "expr", "op", "threshold", "paper_value",
           "value_mean", "value_std", "n_seeds", "holds_every_seed", "verdict"]


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
                         "holds_every_seed": c["holds_every_seed"], "verdict": c["verdict"]})
    return pd.DataFrame(rows, columns=COLUMNS)


def markdown(df: pd.DataFrame) -> str:
    lines = ["# reprozoo summary", ""]
    if df.empty:
        return "\n".join(lines + ["No claims were evaluated.", ""])
    n_hold = int((df.verdict == "holds").sum())
    lines += [f"{n_hold} of {len(df)} claims hold in miniature, over {df.method.nunique()} method(s) "
              f"at scale `{', '.join(sorted(df.scale.unique()))}`.", ""]
    lines += ["| method | claim | measured (mean ± std, n seeds) | threshold | paper | verdict |",
              "|---|---|---|---|---|---|"]
    for r in df.itertuples():
        measured = f"{fmt(r.value_mean)} ± {fmt(r.value_std)} (n={r.n_seeds})"
        lines.append(f"| {r.method} | {r.claim}: {r.text} | {measured} | {r.op} {fmt(r.threshold)} | "
                     f"{r.paper_value} | **{r.verdict}** |")
    return "\n".join(lines) + "\n"


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img src="data:image/png;base64,{data}"><figcaption>{html.escape(path.name)}</figcaption></figure>'


def html_page(df: pd.DataFrame, claims_files: list[Path]) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>reprozoo report</title><style>",
             "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 6px}"
             ".holds{background:#d9f2d9}.fails{background:#f8d7d7}"
             "figure{display:inline-block;margin:6px}img{max-width:520px;border:1px solid #eee}",
             "</style></head><body><h1>reprozoo report</h1>"]
    if not df.empty:
        parts.append(f"<p>{int((df.verdict == 'holds').sum())} of {len(df)} claims hold.</p>")
    for f in claims_files:
        data = read_json(f)
        parts.append(f"<h2>{html.escape(data['method'])}: {html.escape(data['title'])}</h2>")
        parts.append(f"<p>{html.escape(data['paper'])}; scale <code>{data['scale']}</code>; "
                     f"seeds {data['seeds']}; variants {', '.join(data['variants'])}</p>")
        parts.append("<table><tr><th>claim</th><th>measured</th><th>threshold</th><th>paper</th>"
                     "<th>verdict</th></tr>")
        for c in data["claims"]:
            parts.append(
                f"<tr class='{c['verdict']}'><td>{html.escape(c['text'])}<br><code>{html.escape(c['expr'])}</code>"
                f"</td><td>{fmt(c['value_mean'])} ± {fmt(c['value_std'])}</td>"
                f"<td>{c['op']} {fmt(c['threshold'])}</td><td>{html.escape(str(c.get('paper_value')))}</td>"
                f"<td><b>{c['verdict']}</b>{'<br>' + html.escape(c['error']) if c.get('error') else ''}</td></tr>")
        parts.append("</table>")
        plots = sorted((f.parent / "plots").glob("*.png"))
        parts += [_img(p) for p in plots]
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(claims_files: list[Path], tables: list[Path], summary_md: Path, summary_parquet: Path,
                 html_path: Path) -> pd.DataFrame:
    df = summary_table(claims_files)
    with atomic_path(summary_parquet) as tmp:
        df.to_parquet(tmp, index=False)
    atomic_write_text(summary_md, markdown(df))
    atomic_write_text(html_path, html_page(df, claims_files))
    return df
