"""ETT (Electricity Transformer Temperature, Zhou et al., Informer, AAAI 2021): the ETT-small CSVs.

Remote only: ``https://raw.githubusercontent.com/zhouhaoyi/ETDataset/main/ETT-small/<name>.csv``.
The base URL can be overridden with the dataset parameter ``base_url`` or the environment variable
``REPROZOO_ETT_BASE_URL`` (a mirror, a pinned commit, or a test server).

SHA-256 pins: taken from the tsdm package's ETT dataset definition (``rawdata_hashes``), which hashes
the same files from the ETDataset ``main`` branch; they were not recomputed here (no network). A
changed upstream file therefore fails loudly with a checksum mismatch instead of being used silently.

Each CSV (columns date, HUFL, HULL, MUFL, MULL, LUFL, LULL, OT) becomes ``<name>.parquet`` with a
``timestamp`` column and the seven float columns. Frequencies: ETTh* hourly (17420 rows), ETTm*
15-minute (69680 rows). The card also records the usual Informer split borders (12/4/4 months).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..download import fetch
from .common import plt_agg, read_parquet, write_parquet
from reprozoo.figures import save_figure

BASE_URL = "https://raw.githubusercontent.com/zhouhaoyi/ETDataset/main/ETT-small/"
ENV_BASE_URL = "REPROZOO_ETT_BASE_URL"
SHA256 = {  # source: tsdm (github.com/randolf-scholz/tsdm) src/tsdm/datasets/ett.py, rawdata_hashes
    "ETTh1": "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066",
    "ETTh2": "a3dc2c597b9218c7ce1cd55eb77b283fd459a1d09d753063f944967dd6b9218b",
    "ETTm1": "6ce1759b1a18e3328421d5d75fadcb316c449fcd7cec32820c8dafda71986c9e",
    "ETTm2": "db973ca252c6410a30d0469b13d696cf919648d0f3fd588c60f03fdbdbadd1fd",
}
COLUMNS = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
FREQ = {"ETTh1": "h", "ETTh2": "h", "ETTm1": "15min", "ETTm2": "15min"}
EXPECTED_ROWS = {"ETTh1": 17420, "ETTh2": 17420, "ETTm1": 69680, "ETTm2": 69680}


def base_url(params: dict) -> str:
    url = params.get("base_url") or os.environ.get(ENV_BASE_URL) or BASE_URL
    return url if url.endswith("/") else url + "/"


def split_borders(name: str) -> dict:
    """Informer's fixed train/val/test row ranges (12/4/4 months of 30 days)."""
    per_day = 24 if FREQ[name] == "h" else 96
    m = 30 * per_day
    return {"train": [0, 12 * m], "val": [12 * m, 16 * m], "test": [16 * m, 20 * m]}


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    if source != "remote":
        raise ValueError("ts_ett has no offline source: set data.sources.ts_ett=remote")
    names = params.get("files", list(SHA256))
    pins = {**SHA256, **(params.get("sha256") or {})}
    base = base_url(params)
    urls = {}
    for n in names:
        if n not in SHA256:
            raise KeyError(f"unknown ETT file '{n}'; known: {list(SHA256)}")
        urls[n] = base + f"{n}.csv"
        fetch(urls[n], Path(raw_dir) / f"{n}.csv", pins.get(n), retries=int(params.get("retries", 3)),
              timeout=params.get("timeout"), backoff=float(params.get("backoff", 1.0)))
    return {"url": base, "urls": urls, "version": "ETDataset main branch (ETT-small)",
            "pinned_sha256": {n: pins.get(n) for n in names},
            "checksum_source": "tsdm ETT rawdata_hashes (not recomputed here)",
            "license": "CC BY-ND 4.0 (ETDataset)"}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    import pandas as pd

    names = params.get("files", list(SHA256))
    files, sizes, freq, info = [], {}, {}, {}
    for n in names:
        raw = pd.read_csv(Path(raw_dir) / f"{n}.csv")
        missing = [c for c in ["date"] + COLUMNS if c not in raw.columns]
        if missing:
            raise KeyError(f"{n}.csv: columns {missing} missing (have {list(raw.columns)})")
        ts = pd.to_datetime(raw["date"])
        step = pd.Timedelta(1, unit="h") if FREQ[n] == "h" else pd.Timedelta(15, unit="min")
        irregular = int((ts.diff().iloc[1:] != step).sum())
        df = pd.DataFrame({"timestamp": ts.values, **{c: raw[c].astype("float64").values for c in COLUMNS}})
        write_parquet(df, Path(out_dir) / f"{n}.parquet")
        files.append(f"{n}.parquet")
        sizes[n] = {"rows": len(df), "columns": COLUMNS}
        freq[n] = FREQ[n]
        info[n] = {"start": str(df["timestamp"].iloc[0]), "end": str(df["timestamp"].iloc[-1]),
                   "irregular_steps": irregular, "missing": int(df[COLUMNS].isna().sum().sum()),
                   "informer_split_rows": split_borders(n), "target": "OT"}
    return {"files": files, "sizes": sizes, "frequency": freq, "series_info": info}


def preview(out_dir: Path, png: Path) -> None:
    plt = plt_agg()
    tables = load(out_dir)
    fig, axes = plt.subplots(len(tables), 1, figsize=(10, 2.2 * len(tables)), squeeze=False)
    for ax, (n, df) in zip(axes[:, 0], tables.items()):
        for c in ("OT", "HUFL"):
            ax.plot(df.index, df[c], lw=0.5, label=c)
        ax.set_title(f"{n} ({FREQ[n]}, {len(df)} rows)", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    save_figure(fig, png, dpi=80)


def load(out_dir: Path) -> dict:
    """{"ETTh1": DataFrame indexed by timestamp, ...} for the files present."""
    return {p.stem: read_parquet(p).set_index("timestamp") for p in sorted(Path(out_dir).glob("ETT*.parquet"))}
