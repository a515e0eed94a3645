"""Benchmarks: speed and memory as ratios against a baseline measured in the same run."""

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def save_report(name: str, report: dict) -> dict:
    """Write ``benchmarks/results/<name>.json`` (the numbers a README or note may quote) and return it."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2, default=str))
    return report
