import os
import sys
from pathlib import Path

# one BLAS/OpenMP thread per test process: tiny tensor work oversubscribed on 2 cores runs many times slower
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "src", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_inherited_invocation(monkeypatch):
    """A test that starts an invocation must not leak its id into the next test's processes."""
    monkeypatch.delenv("REPROZOO_INVOCATION", raising=False)
    yield
