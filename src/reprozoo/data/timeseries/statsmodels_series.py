"""Real time series that ship inside the statsmodels wheel (no download).

acquire copies the bundled CSV files into raw/ (so the card carries their checksums and the
statsmodels version); preprocess turns each into a parquet table with a ``timestamp`` column:

==========  =====================================================  =========  =======
series      columns                                                frequency  rows
==========  =====================================================  =========  =======
co2         co2 (ppm, NaN in gaps), observed, co2_interpolated     W-SAT      2284
sunspots    sunactivity (yearly mean sunspot number), year          YS-JAN     309
elnino      sst (Nino sea-surface temperature, deg C)              MS         732
macrodata   realgdp ... realint (US quarterly macro), year, quarter QS-JAN     203
nile        volume (annual Nile flow at Aswan, 1e8 m^3), year       YS-JAN     100
==========  =====================================================  =========  =======

Gaps: only co2 has missing values (59 weeks of the Mauna Loa weekly record). They are kept as NaN
in ``co2`` with ``observed = False``; ``co2_interpolated`` fills them by linear interpolation in time
(no extrapolation is needed: the first and last weeks are observed). Nothing else is altered.
elnino is reshaped from its wide year x month table to one monthly series.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from .common import plt_agg, read_parquet, write_parquet
from reprozoo.figures import save_figure

SERIES = ("co2", "sunspots", "elnino", "macrodata", "nile")
FREQ = {"co2": "W-SAT", "sunspots": "YS-JAN", "elnino": "MS", "macrodata": "QS-JAN", "nile": "YS-JAN"}  # pandas aliases
EXPECTED_ROWS = {"co2": 2284, "sunspots": 309, "elnino": 732, "macrodata": 203, "nile": 100}
DESCRIPTION = {
    "co2": "Mauna Loa atmospheric CO2, weekly, 1958-03-29 .. 2001-12-29 (ppm)",
    "sunspots": "yearly mean sunspot numbers 1700-2008",
    "elnino": "monthly El Nino sea-surface temperatures 1950-2010 (deg C)",
    "macrodata": "US macroeconomic data, quarterly 1959Q1-2009Q3",
    "nile": "annual flow of the Nile at Aswan 1871-1970 (1e8 m^3)",
}


def _csv_path(name: str) -> Path:
    import statsmodels.datasets as smd

    return Path(smd.__file__).parent / name / f"{name}.csv"


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    import statsmodels

    names = params.get("series", list(SERIES))
    bad = [n for n in names if n not in SERIES]
    if bad:
        raise KeyError(f"unknown statsmodels series {bad}; known: {list(SERIES)}")
    for n in names:
        shutil.copyfile(_csv_path(n), Path(raw_dir) / f"{n}.csv")
    return {"version": f"statsmodels {statsmodels.__version__}", "origin": "CSV files bundled in statsmodels.datasets",
            "series": names}


def _table(name: str, raw_dir: Path):
    import pandas as pd

    raw = pd.read_csv(Path(raw_dir) / f"{name}.csv")
    if name == "co2":
        ts = pd.to_datetime(raw["date"].astype(str), format="%Y%m%d")
        expected = pd.date_range(ts.iloc[0], periods=len(ts), freq="W-SAT")
        if not (ts.values == expected.values).all():
            raise ValueError("co2: dates are not a gap-free weekly (Saturday) grid")
        co2 = raw["co2"].astype("float64")
        filled = pd.Series(co2.values, index=ts).interpolate(method="time").values
        return pd.DataFrame({"timestamp": ts.values, "co2": co2.values, "observed": co2.notna().values,
                             "co2_interpolated": filled})
    if name == "sunspots":
        year = raw["YEAR"].astype(int)
        return pd.DataFrame({"timestamp": pd.to_datetime(year.astype(str), format="%Y"), "year": year,
                             "sunactivity": raw["SUNACTIVITY"].astype("float64")})
    if name == "nile":
        year = raw["year"].astype(int)
        return pd.DataFrame({"timestamp": pd.to_datetime(year.astype(str), format="%Y"), "year": year,
                             "volume": raw["volume"].astype("float64")})
    if name == "elnino":
        months = [c for c in raw.columns if c != "YEAR"]
        long = raw.melt(id_vars="YEAR", value_vars=months, var_name="month", value_name="sst")
        long["m"] = long["month"].map({m: i + 1 for i, m in enumerate(months)})
        long = long.sort_values(["YEAR", "m"]).reset_index(drop=True)
        ts = pd.to_datetime({"year": long["YEAR"].astype(int), "month": long["m"], "day": 1})
        return pd.DataFrame({"timestamp": ts.values, "sst": long["sst"].astype("float64").values})
    if name == "macrodata":
        year, q = raw["year"].astype(int), raw["quarter"].astype(int)
        ts = pd.to_datetime({"year": year, "month": 3 * (q - 1) + 1, "day": 1})
        df = raw.drop(columns=["year", "quarter"]).astype("float64")
        df.insert(0, "quarter", q)
        df.insert(0, "year", year)
        df.insert(0, "timestamp", ts.values)
        return df
    raise KeyError(name)


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    names = params.get("series", list(SERIES))
    files, sizes, freq, info = [], {}, {}, {}
    for n in names:
        df = _table(n, Path(raw_dir))
        write_parquet(df, Path(out_dir) / f"{n}.parquet")
        files.append(f"{n}.parquet")
        values = [c for c in df.columns if c not in ("timestamp", "year", "quarter", "observed")]
        sizes[n] = {"rows": len(df), "columns": values}
        freq[n] = FREQ[n]
        info[n] = {"description": DESCRIPTION[n], "start": str(df["timestamp"].iloc[0].date()),
                   "end": str(df["timestamp"].iloc[-1].date()),
                   "missing": int(df[values].isna().sum().sum())}
    return {"files": files, "sizes": sizes, "frequency": freq, "series_info": info,
            "gaps": "co2: 59 missing weeks kept as NaN (observed=False), co2_interpolated = time-linear fill; "
                    "other series have no gaps"}


def preview(out_dir: Path, png: Path) -> None:
    plt = plt_agg()
    tables = load(out_dir)
    fig, axes = plt.subplots(len(tables), 1, figsize=(10, 2.0 * len(tables)))
    axes = np.atleast_1d(axes)
    main = {"co2": "co2_interpolated", "sunspots": "sunactivity", "elnino": "sst", "macrodata": "realgdp",
            "nile": "volume"}
    for ax, (n, df) in zip(axes, tables.items()):
        ax.plot(df.index, df[main[n]], lw=0.8)
        if n == "co2":
            gaps = df[~df["observed"]]
            ax.plot(gaps.index, gaps["co2_interpolated"], "r.", ms=3, label="interpolated gaps")
            ax.legend(fontsize=7)
        ax.set_ylabel(main[n], fontsize=8)
        ax.set_title(f"{n} ({FREQ[n]}, {len(df)} rows)", fontsize=9)
    save_figure(fig, png, dpi=80)


def load(out_dir: Path) -> dict:
    """{series name: DataFrame indexed by timestamp}."""
    out = {}
    for p in sorted(Path(out_dir).glob("*.parquet")):
        if p.stem in SERIES:
            out[p.stem] = read_parquet(p).set_index("timestamp")
    return {n: out[n] for n in SERIES if n in out}
