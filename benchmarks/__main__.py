"""Run every benchmarks/bench_*.py (or the ones named) and print their reports.

    python -m benchmarks            # all
    python -m benchmarks workflow   # bench_workflow.py only
"""
import importlib
import sys
from pathlib import Path

names = sys.argv[1:] or sorted(p.stem.removeprefix("bench_") for p in Path(__file__).parent.glob("bench_*.py"))
for name in names:
    print(f"\n=== benchmarks/bench_{name}.py ===", flush=True)
    importlib.import_module(f"benchmarks.bench_{name}").main()
