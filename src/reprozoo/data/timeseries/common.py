"""Helpers shared by the time-series datasets: atomic parquet writes and small plotting helpers."""
from __future__ import annotations

from pathlib import Path

from ...io import atomic_path


def write_parquet(df, path: Path | str) -> None:
    """Write a DataFrame to parquet atomically (pyarrow engine, no pandas index unless named)."""
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, engine="pyarrow", index=False)


def read_parquet(path: Path | str):
    import pandas as pd

    return pd.read_parquet(path, engine="pyarrow")


def plt_agg():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
