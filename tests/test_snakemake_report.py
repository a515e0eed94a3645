"""Snakemake's own report (`snakemake --report report.zip` / `report.html`) after a ci run of two quick
methods, in a temporary copy: every method's claims page (each claim and its verdict) and each of its
figures, filed by wave (category) and method (subcategory), and the verdict table of every claim."""
import base64
from html import escape
import json
import zipfile
from pathlib import Path

import pytest

from reprozoo import registry
from test_workflow import snakemake
from workcopy import copy_workflow

pytestmark = pytest.mark.integration
# quick at ci (no torch import), from different waves
PREFERRED = ["ftrl_regret", "milcci", "iterated_erm", "evodiverse", "verbalized_bp"]


def _methods() -> list[str]:
    known = registry.method_ids()
    chosen = [m for m in PREFERRED if m in known][:2]
    return chosen if len(chosen) == 2 else known[:2]


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("wf_report"))
    methods = _methods()
    config = ["--config", "scale=ci", f"methods=[{','.join(methods)}]"]
    snakemake(work, *config)
    return work, methods, config


def _js_object(text: str, name: str) -> dict:
    """A JSON object the report's page declares as ``var <name> = {...}``."""
    i = text.index(f"var {name} = {{") + len(f"var {name} = ")
    return json.JSONDecoder().raw_decode(text, i)[0]


def _check(work: Path, methods: list[str], page: str, read) -> None:
    """``read(entry)``: the bytes of a result entry of the report."""
    results, categories = _js_object(page, "results"), _js_object(page, "categories")
    summary = [p for p in categories["Summary"]["Other"] if p.endswith("summary.html")]
    assert summary, categories["Summary"]
    summary_html = read(results[summary[0]]).decode()
    for m in methods:
        spec = registry.get(m)
        res = work / "results" / "ci" / m
        assert m in categories[spec.wave], (m, spec.wave, list(categories))
        files = categories[spec.wave][m]
        plots = sorted(p.name for p in (res / "plots").glob("*.png"))
        assert plots, f"{m} drew no figure"
        assert sorted(Path(f).name for f in files if f.endswith(".png")) == plots
        for f in files:
            assert results[f]["labels"]["method"] == m
            if f.endswith(".png"):
                assert read(results[f]) == (res / "plots" / Path(f).name).read_bytes()
        page_file = f"results/ci/{m}/claims.html"
        assert page_file in files
        html = read(results[page_file]).decode()
        claims = json.loads((res / "claims.json").read_text())
        assert claims["claims"]
        for c in claims["claims"]:
            for text in (html, summary_html):
                assert f"<b>{c['verdict']}</b>" in text
            assert escape(c["expr"]) in html
            assert f"{c['id']}:" in summary_html


def test_report_zip_holds_every_methods_claims_and_figures(ci_run):
    work, methods, config = ci_run
    snakemake(work, "--report", "report.zip", *config)
    with zipfile.ZipFile(work / "report.zip") as z:
        page = z.read("report/report.html").decode()
        _check(work, methods, page, lambda entry: z.read("report/" + entry["data_uri"]))


def test_report_html_holds_every_methods_claims_and_figures(ci_run):
    work, methods, config = ci_run
    snakemake(work, "--report", "report.html", *config)
    page = (work / "report.html").read_text()
    _check(work, methods, page, lambda entry: base64.b64decode(entry["data_uri"].split(",", 1)[1]))
