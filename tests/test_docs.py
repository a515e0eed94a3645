"""Method pages are written only from results a rerun of a named commit reproduces."""
import json
import shutil
from pathlib import Path

import pytest

from reprozoo import docs
from reprozoo.codehash import provenance

ROOT = Path(__file__).resolve().parents[1]
METHOD = "ftrl_regret"


@pytest.fixture()
def project(tmp_path):
    page = tmp_path / "src" / "reprozoo" / "methods" / METHOD / "README.md"
    page.parent.mkdir(parents=True)
    shutil.copy(ROOT / "src" / "reprozoo" / "methods" / METHOD / "README.md", page)
    return tmp_path


def _claims(project, **over):
    prov = provenance(METHOD)
    data = {"method": METHOD, "title": "t", "paper": "p", "scale": "smoke", "variants": ["x"], "complete": True,
            "seeds": [0, 1, 2], "git_commit": prov["git_commit"], "code_hash": prov["code_hash"], "dirty_files": [],
            "convergence": {"x": {"converged": False, "reason": "val_loss: seed 0: still improving by 9.0 %"}},
            "claims": [{"id": "c1", "text": "a claim", "expr": "v@x", "op": ">", "threshold": 0.0,
                        "paper_value": "1", "value_mean": 0.5, "value_std": 0.1, "n_seeds": 3, "ci_low": 0.3,
                        "ci_high": 0.7, "per_seed": {"0": 0.4, "1": 0.5, "2": 0.6}, "verdict": "not converged",
                        "reason": "variant 'x' did not converge",
                        "control": {"kind": "A/A", "condition": "v@b > 0", "value_mean": 0.0, "verdict": "fails"}}]}
    data.update(over)
    f = project / "results" / "smoke" / METHOD / "claims.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(data))
    return data


def test_a_clean_measurement_becomes_the_table_naming_its_commit(project):
    data = _claims(project)
    page = docs.method_page(METHOD, project / "results", "smoke", project)
    assert f"commit `{data['git_commit'][:12]}` (clean" in page
    assert "**not converged**" in page and "control (A/A) v@b > 0" in page
    assert "uncommitted" not in page


@pytest.mark.parametrize("over, why", [
    ({"dirty_files": ["src/reprozoo/methods/ftrl_regret/method.py"]}, "uncommitted changes to src/reprozoo"),
    ({"code_hash": "0000000000000000"}, "the code changed since it was measured"),
    ({"code_hash": None}, "no code hash"),
])
def test_results_a_rerun_would_not_reproduce_are_refused(project, over, why):
    data = _claims(project, **over)
    if over.get("code_hash", 1) is None:
        data.pop("code_hash")
        (project / "results" / "smoke" / METHOD / "claims.json").write_text(json.dumps(data))
    with pytest.raises(docs.StaleResults, match=why):
        docs.method_page(METHOD, project / "results", "smoke", project)
    refused = []
    before = (project / "src" / "reprozoo" / "methods" / METHOD / "README.md").read_text()
    docs.write_all(project, "smoke", refused=refused)
    assert any(METHOD in r for r in refused)
    assert (project / "src" / "reprozoo" / "methods" / METHOD / "README.md").read_text() == before


def test_check_lists_pages_that_differ_and_writes_nothing(project):
    _claims(project)
    page = project / "src" / "reprozoo" / "methods" / METHOD / "README.md"
    before = page.read_text()
    changed = docs.write_all(project, "smoke", check=True)
    assert page in changed and page.read_text() == before
    docs.write_all(project, "smoke")
    assert page not in docs.write_all(project, "smoke", check=True)


def test_a_method_without_results_here_keeps_its_measured_page_and_index_row(project):
    """A checkout holding some methods' results (a helper's single-method smoke run) must not wipe
    the measured tables of the others: their page and their row of the README index stay."""
    page = project / "src" / "reprozoo" / "methods" / METHOD / "README.md"
    measured = page.read_text()
    assert docs.MEASURED in measured.partition(docs.BEGIN)[2]  # the committed page carries a table
    assert docs.method_page(METHOD, project / "results", "smoke", project) == measured
    row = f"| [{METHOD}](src/reprozoo/methods/{METHOD}/README.md) | theory | 9 holds | t |"
    assert row in docs.methods_index(project / "results", "smoke", f"| a | b |\n{row}\n")
    # a page that was never measured still says so
    page.write_text(docs.replace_between(measured, docs.BEGIN, docs.END, "nothing yet"))
    assert "Not measured yet" in docs.method_page(METHOD, project / "results", "smoke", project)


def test_named_methods_only_leave_every_other_page_and_index_row_alone(project):
    """`reprozoo docs rex`: only the named pages and index rows are written (other pages may be
    mid-edit); an unknown name is refused with the known ones."""
    _claims(project)
    page = project / "src" / "reprozoo" / "methods" / METHOD / "README.md"
    before = page.read_text()
    other = "| [rex](src/reprozoo/methods/rex/README.md) | diffusion | 7 holds | hand-kept row |"
    top = project / "README.md"
    top.write_text(f"x\n{docs.MBEGIN}\n| a | b |\n{other}\n{docs.MEND}\n")
    assert docs.write_all(project, "smoke", methods=["rex"]) in ([], [top])
    assert page.read_text() == before and other in top.read_text()
    changed = docs.write_all(project, "smoke", methods=[METHOD])
    assert page in changed and page.read_text() != before and other in top.read_text()
    with pytest.raises(ValueError, match="unknown method.*nosuch"):
        docs.write_all(project, "smoke", methods=["nosuch"])


@pytest.mark.parametrize("op,verdict,shown", [
    ("<", "holds", "upper bound 0.9"), ("<", "fails", "lower bound 1.2"), ("<", "inconclusive", "upper bound 0.9"),
    (">", "holds", "lower bound 1.2"), (">", "fails", "upper bound 0.9"), (">=", "inconclusive", "lower bound 1.2"),
])
def test_the_table_shows_the_bound_that_decides_the_verdict(op, verdict, shown):
    """A claim holds by its bound on the claim's side and fails by the bound on the other side: a failed
    "x < 1" is shown by its lower bound (above 1), not by an upper bound that says nothing about it."""
    from reprozoo.report import measured

    c = {"n_seeds": 3, "op": op, "verdict": verdict, "value_mean": 1.05, "value_std": 0.1,
         "ci_low": 1.2 if shown.startswith("lower") else 0.5, "ci_high": 0.9 if shown.startswith("upper") else 1.5,
         "per_seed": {"0": 1.0, "1": 1.05, "2": 1.1}}
    assert f"95 % {shown};" in measured(c)


def test_stale_lists_pages_measured_on_other_code_without_reading_results(project):
    """`reprozoo docs --stale`: a checkout without results/ can still tell which tables were measured
    on code other than the tree's (a block they import changed since), from the hash the page names."""
    page = project / "src" / "reprozoo" / "methods" / METHOD / "README.md"
    _claims(project)
    docs.write_all(project, "smoke", methods=[METHOD])
    shutil.rmtree(project / "results")
    assert docs.stale_pages(project, [METHOD]) == []
    now = provenance(METHOD)["code_hash"]
    page.write_text(page.read_text().replace(f"code hash `{now}`", "code hash `0000000000000000`"))
    assert docs.stale_pages(project, [METHOD]) == [(METHOD, "0000000000000000", now)]
    page.write_text(docs.replace_between(page.read_text(), docs.BEGIN, docs.END, "Not measured yet."))
    assert docs.stale_pages(project, [METHOD]) == [(METHOD, None, now)]
    with pytest.raises(ValueError, match="unknown method.*nosuch"):
        docs.stale_pages(project, ["nosuch"])
