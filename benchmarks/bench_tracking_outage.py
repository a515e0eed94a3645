"""The operator's figures for a tracking outage: one method at ci with its tracking server down
(a closed loopback port: live mode, every call refused) against the same run with the embedded
store, in the same session; then how many runs `reprozoo sync` recovers once a store is back.

Prints wall seconds for both runs, the payload files left, and runs recovered / expected.
Writes benchmarks/results/tracking_outage.json.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHOD = os.environ.get("REPROZOO_OUTAGE_METHOD", "iterated_erm")


def _copy(dst: Path) -> None:
    for name in ("Snakefile", "workflows", "envs", "config", "profiles", "src"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, dst / name)


def _run(work: Path, env: dict, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1800)
    return time.perf_counter() - t0, proc


def main() -> dict:
    base_env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "REPROZOO_INVOCATION")}
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "ok").mkdir(), (tmp / "down").mkdir()
        _copy(tmp / "ok"), _copy(tmp / "down")
        t_ok, p_ok = _run(tmp / "ok", base_env, "--config", "scale=ci", f"methods=[{METHOD}]")
        env = dict(base_env, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{dead}")
        t_down, p_down = _run(tmp / "down", env, "--config", "scale=ci", f"methods=[{METHOD}]")
        res = tmp / "down" / "results"
        left = [str(p.relative_to(res)) for p in res.rglob("tracking*_pending.json")]
        claims_ok = (res / "ci" / METHOD / "claims.json").exists()
        sync_env = dict(base_env, MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'recovered.db'}")
        sync = subprocess.run([sys.executable, "-m", "reprozoo.cli", "sync"], cwd=tmp / "down", env=sync_env,
                              capture_output=True, text=True, timeout=900)
        left_after = len(list(res.rglob("tracking*_pending.json")))
    out = {"method": METHOD, "wall_s_store_up": round(t_ok, 1), "wall_s_server_down": round(t_down, 1),
           "rc_server_down": p_down.returncode, "results_written_with_server_down": claims_ok,
           "payloads_left": len(left), "sync_rc": sync.returncode, "payloads_left_after_sync": left_after,
           "sync_output": sync.stdout.strip()}
    print(f"{METHOD} at ci: {t_ok:.1f} s with the embedded store, {t_down:.1f} s with the tracking server down "
          f"(rc {p_down.returncode}, results written: {claims_ok}); {len(left)} run payload(s) spooled; "
          f"`reprozoo sync` into a store that answers: {sync.stdout.strip()} (rc {sync.returncode}), "
          f"{left_after} left")
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "tracking_outage.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
