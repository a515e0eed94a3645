"""Time-series datasets: Lorenz-96 physics, statsmodels series, ETT remote path (loopback server)."""
from __future__ import annotations

import hashlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from loopback import serve  # noqa: E402

from reprozoo.data import registry as dreg  # noqa: E402
from reprozoo.data.download import DownloadError  # noqa: E402
from reprozoo.data.timeseries import ett, lorenz96, statsmodels_series  # noqa: E402


def infer_freq(index) -> str | None:
    with warnings.catch_warnings():  # pandas 3 announces an offset return type; compare strings
        warnings.simplefilter("ignore")
        f = pd.infer_freq(index)
    return getattr(f, "freqstr", f)


def build(module, params, tmp: Path, seed=0, source="offline"):
    raw, out = tmp / "raw", tmp / "out"
    raw.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    info = module.acquire(source=source, params=params, raw_dir=raw, seed=seed, path=None)
    card = module.preprocess(raw_dir=raw, out_dir=out, params=params)
    return raw, out, info, card


# --- Lorenz-96 ---------------------------------------------------------------------------------

def test_lorenz96_quadratic_term_conserves_energy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 40))
    # the advection term alone is energy-neutral: sum_i x_i (x_{i+1} - x_{i-2}) x_{i-1} = 0
    assert np.abs(np.sum(x * lorenz96.tendency(x, forcing=0.0, damping=0.0), -1)).max() < 1e-12
    # unforced, inviscid limit through the dataset code: E = 1/2 sum x^2 stays constant along trajectories
    params = {"n_vars": 40, "forcing": 0.0, "damping": 0.0, "n_traj": 2, "n_obs": 200, "dt": 0.005,
              "dt_obs": 0.05, "t_burn": 0.0}
    clean = lorenz96.simulate(params, seed=1)["clean"]
    e = 0.5 * np.sum(clean**2, -1)
    assert np.abs(e / e[:, :1] - 1).max() < 1e-7
    assert np.abs(clean[:, -1] - clean[:, 0]).max() > 0.5  # while the state itself moves


def test_lorenz96_climatology_for_f8():
    params = {"n_vars": 40, "forcing": 8.0, "n_traj": 4, "n_obs": 2000, "dt": 0.01, "dt_obs": 0.05, "t_burn": 10.0}
    clean = lorenz96.simulate(params, seed=2)["clean"]
    mean, std = clean.mean(), clean.std()
    assert 2.2 < mean < 2.5, mean  # known: ~2.34 for F = 8
    assert 3.4 < std < 3.9, std  # known: ~3.6


def _largest_lyapunov(forcing: float, n: int = 40, t: float = 20.0, dt: float = 0.01, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    x = forcing + 0.01 * rng.standard_normal(n)
    for _ in range(1000):  # spin-up
        x = lorenz96.rk4_step(x, dt, forcing)
    d0 = 1e-8
    y = x + d0 * rng.standard_normal(n) / np.sqrt(n)
    log_growth, steps = 0.0, int(t / dt)
    for k in range(steps):
        x, y = lorenz96.rk4_step(x, dt, forcing), lorenz96.rk4_step(y, dt, forcing)
        if (k + 1) % 10 == 0:  # Benettin renormalisation
            d = np.linalg.norm(y - x)
            log_growth += np.log(d / d0)
            y = x + (y - x) * (d0 / d)
    return log_growth / t


def test_lorenz96_is_chaotic_at_f8_not_at_f1():
    lam8 = _largest_lyapunov(8.0)
    assert 1.2 < lam8 < 2.3, lam8  # known: ~1.7 for N = 40
    assert _largest_lyapunov(1.0, t=5.0) < 0.0  # F = 1 decays to the fixed point x_i = F


def test_lorenz96_graph_is_the_jacobian_sparsity():
    n = 12
    g = lorenz96.coupling_graph(n)
    rng = np.random.default_rng(3)
    x = 8 + rng.standard_normal(n)
    jac = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = 1e-6
        jac[:, j] = (lorenz96.tendency(x + e) - lorenz96.tendency(x - e)) / 2e-6
    off = np.abs(jac) > 1e-6
    np.fill_diagonal(off, False)
    np.testing.assert_array_equal(off.astype(int), np.array(g["adjacency"]))
    assert len(g["edges"]) == 3 * n


def test_lorenz96_dataset_noise_mask_and_determinism(tmp_path):
    spec = dreg.get("ts_lorenz96")
    params = spec.params("ci")
    _, out, _, card = build(lorenz96, params, tmp_path / "a", seed=spec.seed)
    _, out_b, _, _ = build(lorenz96, params, tmp_path / "b", seed=spec.seed)
    _, out_c, _, _ = build(lorenz96, params, tmp_path / "c", seed=spec.seed + 1)
    d = lorenz96.load(out)
    xcols = [f"x{i:02d}" for i in range(params["n_vars"])]
    clean, obs, mask = (d[k][xcols].to_numpy() for k in ("clean", "observed", "mask"))
    assert clean.shape == (params["n_traj"] * params["n_obs"], params["n_vars"])
    assert list(d["clean"].columns[:3]) == ["traj", "step", "t"]
    np.testing.assert_array_equal(np.isnan(obs), ~mask)
    assert abs((~mask).mean() - params["missing_rate"]) < 0.02
    assert abs(np.nanstd(obs - clean) - params["noise_std"]) < 0.03
    assert card["sizes"]["n_vars"] == params["n_vars"] and "frequency" in card
    for f in card["files"]:
        assert (out / f).read_bytes() == (out_b / f).read_bytes()
    assert not d["clean"].equals(lorenz96.load(out_c)["clean"])


# --- statsmodels series --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sm_tables(tmp_path_factory):
    params = dreg.get("ts_statsmodels").params("ci")
    _, out, info, card = build(statsmodels_series, params, tmp_path_factory.mktemp("sm"))
    return statsmodels_series.load(out), info, card


def test_statsmodels_series_lengths_and_frequencies(sm_tables):
    tables, info, card = sm_tables
    assert set(tables) == {"co2", "sunspots", "elnino", "macrodata", "nile"}
    for name, df in tables.items():
        assert len(df) == statsmodels_series.EXPECTED_ROWS[name], name
        assert card["sizes"][name]["rows"] == len(df)
        assert df.index.is_monotonic_increasing and df.index.is_unique
        assert infer_freq(df.index) == card["frequency"][name], name
    assert info["version"].startswith("statsmodels ")


def test_statsmodels_values_match_the_package_and_gaps_are_documented(sm_tables):
    import statsmodels.api as sm

    tables, _, card = sm_tables
    co2 = tables["co2"]
    ref = sm.datasets.co2.load_pandas().data["co2"]
    np.testing.assert_array_equal(co2.index.values, ref.index.values)
    np.testing.assert_array_equal(co2["co2"].to_numpy(), ref.to_numpy())
    assert (~co2["observed"]).sum() == 59 == co2["co2"].isna().sum()
    assert co2["co2_interpolated"].notna().all()
    obs = co2["observed"].to_numpy()
    np.testing.assert_array_equal(co2["co2_interpolated"].to_numpy()[obs], co2["co2"].to_numpy()[obs])
    assert card["series_info"]["co2"]["missing"] == 59 and "co2" in card["gaps"]
    el = sm.datasets.elnino.load_pandas().data
    np.testing.assert_allclose(tables["elnino"]["sst"].to_numpy(), el.drop(columns="YEAR").to_numpy().ravel())
    mac = sm.datasets.macrodata.load_pandas().data
    np.testing.assert_allclose(tables["macrodata"]["realgdp"].to_numpy(), mac["realgdp"].to_numpy())
    assert tables["macrodata"].index[0] == pd.Timestamp("1959-01-01")
    assert tables["macrodata"].index[-1] == pd.Timestamp("2009-07-01")
    np.testing.assert_allclose(tables["sunspots"]["sunactivity"].to_numpy(),
                               sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy())


# --- ETT remote ----------------------------------------------------------------------------------

def _fake_ett(path: Path, rows: int, freq: str) -> None:
    rng = np.random.default_rng(0)
    ts = pd.date_range("2016-07-01 00:00:00", periods=rows, freq=freq)
    df = pd.DataFrame({"date": ts.strftime("%Y-%m-%d %H:%M:%S"),
                       **{c: np.round(rng.normal(size=rows), 3) for c in ett.COLUMNS}})
    df.to_csv(path, index=False)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def ett_server(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    _fake_ett(folder / "ETTh1.csv", 96, "h")
    _fake_ett(folder / "ETTm1.csv", 192, "15min")
    return folder


def test_ett_remote_success(ett_server, tmp_path):
    with serve(ett_server) as url:
        params = {"files": ["ETTh1", "ETTm1"], "base_url": url, "backoff": 0.0,
                  "sha256": {n: _sha(ett_server / f"{n}.csv") for n in ("ETTh1", "ETTm1")}}
        raw, out, info, card = build(ett, params, tmp_path, source="remote")
    assert info["urls"]["ETTh1"] == url + "ETTh1.csv"
    assert sorted(p.name for p in raw.iterdir()) == ["ETTh1.csv", "ETTm1.csv"]
    tables = ett.load(out)
    assert list(tables["ETTh1"].columns) == ett.COLUMNS and len(tables["ETTh1"]) == 96
    assert infer_freq(tables["ETTh1"].index) == "h" and infer_freq(tables["ETTm1"].index) == "15min"
    assert card["frequency"] == {"ETTh1": "h", "ETTm1": "15min"}
    assert card["series_info"]["ETTh1"]["irregular_steps"] == 0
    assert card["series_info"]["ETTm1"]["informer_split_rows"]["train"] == [0, 12 * 30 * 96]
    src = pd.read_csv(ett_server / "ETTh1.csv")
    np.testing.assert_array_equal(tables["ETTh1"]["OT"].to_numpy(), src["OT"].to_numpy())
    ett.preview(out, tmp_path / "preview.png")
    assert (tmp_path / "preview.png").stat().st_size > 5000


def test_ett_checksum_mismatch_leaves_nothing(ett_server, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(ett_server) as url:
        with pytest.raises(DownloadError) as exc:  # the pinned upstream SHA-256 cannot match the fake file
            ett.acquire("remote", {"files": ["ETTh1"], "base_url": url, "backoff": 0.0}, raw, 0)
    assert "checksum mismatch" in str(exc.value) and ett.SHA256["ETTh1"] in str(exc.value)
    assert list(raw.iterdir()) == []


def test_ett_truncated_download_leaves_nothing(ett_server, tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(ett_server, truncate=("ETTh1.csv",)) as url:
        monkeypatch.setenv(ett.ENV_BASE_URL, url)  # the environment override works too
        params = {"files": ["ETTh1"], "backoff": 0.0, "retries": 2, "sha256": {"ETTh1": _sha(ett_server / "ETTh1.csv")}}
        with pytest.raises(DownloadError) as exc:
            ett.acquire("remote", params, raw, 0)
    assert "could not download" in str(exc.value) and url + "ETTh1.csv" in str(exc.value)
    assert list(raw.iterdir()) == []


def test_ett_is_remote_only():
    assert dreg.get("ts_ett").sources == ["remote"]
    with pytest.raises(ValueError, match="remote"):
        ett.acquire("offline", {"files": ["ETTh1"]}, Path("/nonexistent"), 0)


def test_stage_card_records_frequency(tmp_path):
    from reprozoo import stages

    base = tmp_path / "data" / "ts_lorenz96" / "ci"
    stages.acquire("ts_lorenz96", "ci", "offline", base / "raw", base / "raw" / "manifest.json")
    card = stages.preprocess("ts_lorenz96", "ci", base / "raw", base / "raw" / "manifest.json", base,
                             base / "card.json", base / "preview.png")
    assert "frequency" in card and set(card["files"]) == {"clean.parquet", "observed.parquet", "mask.parquet",
                                                          "graph.json"}
    assert (base / "preview.png").stat().st_size > 5000
