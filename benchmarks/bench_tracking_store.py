"""The embedded MLflow store's write cost: SQLite's default rollback journal against WAL mode.

A `ci` run of 6 quick methods in a temporary copy leaves its run payloads under results/; each
variant then rebuilds all of them (`tracking.rebuild`, what the end hook and the tracking thread do
per payload) into an empty store in a fresh process, after the store's schema is created, so only
the logging is timed. ``before``: the default journal (tracking's tuning switched off in that
process); ``after``: what `tracking._client` does (WAL, synchronous=NORMAL). Repeated 3 times,
alternating; reports the median seconds per run and the ratio after/before.

Writes benchmarks/results/tracking_store.json.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["rex", "slepian", "ftrl_regret", "iterated_erm", "tfmpe", "dkmp"]
CHILD = r'''
import json, sys, time
from pathlib import Path
from reprozoo import tracking
if sys.argv[2] == "before":
    tracking._SQLITE_TUNED["done"] = True  # no WAL, no synchronous=NORMAL: SQLite's defaults
uri = f"sqlite:///{sys.argv[3]}"
tracking._client(uri)  # schema and migrations, not timed
t0 = time.perf_counter()
n = tracking.rebuild(Path(sys.argv[1]), uri)
print(json.dumps({"runs": n, "s": time.perf_counter() - t0}))
'''


def main() -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from workcopy import copy_workflow

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "w").mkdir()
        work = copy_workflow(Path(tmp) / "w")
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--config", "scale=ci",
                        f"methods=[{','.join(METHODS)}]"], cwd=work, check=True, capture_output=True, timeout=1800)
        times: dict[str, list[float]] = {"before": [], "after": []}
        runs = 0
        for rep in range(3):
            for variant in ("before", "after"):
                db = Path(tmp) / f"{variant}{rep}.db"
                out = subprocess.run([sys.executable, "-c", CHILD, str(work / "results"), variant, str(db)],
                                     cwd=work, check=True, capture_output=True, text=True, timeout=900)
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                runs = rec["runs"]
                times[variant].append(rec["s"])
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"methods": METHODS, "runs": runs, "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
           "median_s_before": round(med["before"], 2), "median_s_after": round(med["after"], 2),
           "ms_per_run_before": round(1000 * med["before"] / runs, 1),
           "ms_per_run_after": round(1000 * med["after"] / runs, 1),
           "ratio_after_to_before": round(med["after"] / med["before"], 3)}
    print(f"{runs} runs into an empty store: {res['median_s_before']} s with SQLite's default journal, "
          f"{res['median_s_after']} s in WAL mode (ratio {res['ratio_after_to_before']}; "
          f"{res['ms_per_run_before']} -> {res['ms_per_run_after']} ms a run)")
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tracking_store.json").write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
