"""PDE datasets: physics of our solvers, determinism, and the PDEBench remote path (loopback server)."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from loopback import serve  # noqa: E402

from reprozoo.data import registry as dreg  # noqa: E402
from reprozoo.data.download import DownloadError  # noqa: E402
from reprozoo.data.pde import allen_cahn, burgers, heat_poisson, kolmogorov, pdebench  # noqa: E402
from reprozoo.data.pde import pdebench_burgers, pdebench_ns  # noqa: E402
from reprozoo.data.pde.common import read_h5  # noqa: E402


def build(module, params, tmp: Path, seed=0, source="offline"):
    raw, out = tmp / "raw", tmp / "out"
    raw.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    info = module.acquire(source=source, params=params, raw_dir=raw, seed=seed, path=None)
    card = module.preprocess(raw_dir=raw, out_dir=out, params=params)
    return raw, out, info, card


def d_dt(e: np.ndarray, dt: float) -> np.ndarray:
    """4th-order central difference along the last axis (interior points 2..-3)."""
    return (-e[..., 4:] + 8 * e[..., 3:-1] - 8 * e[..., 1:-3] + e[..., :-4]) / (12 * dt)


# --- Kolmogorov flow -----------------------------------------------------------------------------

KOLMO = {"n": 32, "nu": 0.02, "drag": 0.1, "k_f": 4, "forcing_amplitude": 1.0, "n_traj": 2, "t_burn": 0.5,
         "t_end": 3.0, "dt_save": 0.05, "ic_velocity_rms": 1.0}


@pytest.fixture(scope="module")
def kolmo(tmp_path_factory):
    _, out, _, card = build(kolmogorov, KOLMO, tmp_path_factory.mktemp("kolmo"), seed=3)
    return kolmogorov.load(out), card


def _budget(d, nu=None):
    a = d.attrs
    return kolmogorov.energy_budget(d["vorticity"], d["velocity"], d.coords["y"], a["nu"] if nu is None else nu,
                                    a["drag"], a["forcing_k"], a["forcing_amplitude"], a["length"])


def test_kolmogorov_energy_balance_from_saved_fields(kolmo):
    d, card = kolmo
    assert d["vorticity"].dtype == np.float32 and d["vorticity"].shape == (2, 61, 32, 32)
    assert d.dims["vorticity"] == ("traj", "time", "x", "y")
    b = _budget(d)
    dedt = d_dt(b["energy"], KOLMO["dt_save"])
    rhs = (b["injection"] - b["dissipation"] - b["drag_loss"])[:, 2:-2]
    scale = np.abs(b["dissipation"]).mean()
    resid = np.abs(dedt - rhs).max() / scale
    assert np.abs(dedt).max() > 0.05 * scale  # the energy really changes: the balance is not trivial
    assert resid < 1e-3, f"dE/dt - (injection - dissipation - drag) = {resid:.2e} of the dissipation"
    # the check bites: a wrong viscosity breaks the balance by orders of magnitude more
    b2 = _budget(d, nu=1.2 * KOLMO["nu"])
    resid2 = np.abs(dedt - (b2["injection"] - b2["dissipation"] - b2["drag_loss"])[:, 2:-2]).max() / scale
    assert resid2 > 50 * resid
    # the diagnostics stored by the solver agree with the saved fields
    np.testing.assert_allclose(d.diagnostics["energy"], b["energy"], rtol=1e-5)


def test_kolmogorov_velocity_divergence_free_and_consistent(kolmo):
    d, _ = kolmo
    vel = d["velocity"].astype(np.float64)
    n, length = d.attrs["n"], d.attrs["length"]
    k = 2 * np.pi * np.fft.fftfreq(n, length / n)
    kx, ky = np.meshgrid(k, k, indexing="ij")
    u_hat, v_hat = np.fft.fft2(vel[..., 0]), np.fft.fft2(vel[..., 1])
    div = np.real(np.fft.ifft2(1j * kx * u_hat + 1j * ky * v_hat))
    curl = np.real(np.fft.ifft2(1j * kx * v_hat - 1j * ky * u_hat))
    grad_scale = np.abs(np.real(np.fft.ifft2(1j * kx * u_hat))).max()
    assert np.abs(div).max() < 1e-5 * grad_scale
    w = d["vorticity"].astype(np.float64)
    assert np.abs(curl - w).max() < 1e-5 * np.abs(w).max()


def test_kolmogorov_laminar_state_is_steady():
    nu, drag, kf = 0.05, 0.1, 4
    n = 32
    solver = kolmogorov.Vorticity2D(n, 2 * np.pi, nu, drag, kolmogorov.kolmogorov_curl(n, 2 * np.pi, kf, 1.0))
    y = solver.x
    w_lam = np.broadcast_to(-kf * np.cos(kf * y) / (nu * kf**2 + drag), (1, n, n)).copy()
    w, _ = solver.run(w_lam, np.array([0.0, 2.0]))
    # the forcing sits in the RK4 part of the Lawson scheme, so the fixed point holds to O(dt^4) only
    assert np.abs(w[:, -1] - w_lam).max() < 1e-7 * np.abs(w_lam).max()


# --- Burgers -----------------------------------------------------------------------------------

def test_burgers_converges_to_cole_hopf_with_resolution():
    nu, t = 0.1, 1.0
    xf = np.arange(4096) * 2 * np.pi / 4096
    ref = burgers.cole_hopf(np.sin(xf), t, nu)
    errs = {}
    for n in (32, 64, 128):
        s = burgers.Burgers1D(n, 2 * np.pi, nu)
        u = s.run(np.sin(s.x), np.array([0.0, t]), cfl=0.1)[0, -1]
        errs[n] = np.abs(u - ref[:: 4096 // n]).max()
    assert errs[32] > 1e-4  # coarse grid visibly wrong, so the comparison is meaningful
    assert errs[64] < errs[32] / 20 and errs[128] < errs[64] / 20  # spectral convergence
    assert errs[128] < 1e-7


def test_burgers_time_stepping_is_fourth_order():
    nu, t, n = 0.1, 1.0, 256
    xf = np.arange(4096) * 2 * np.pi / 4096
    ref = burgers.cole_hopf(np.sin(xf), t, nu)[:: 4096 // n]
    errs = []
    for cfl in (0.8, 0.4):
        s = burgers.Burgers1D(n, 2 * np.pi, nu)
        errs.append(np.abs(s.run(np.sin(s.x), np.array([0.0, t]), cfl=cfl)[0, -1] - ref).max())
    assert 8 < errs[0] / errs[1] < 32  # ~16 for a 4th-order scheme


def test_burgers_dataset_matches_cole_hopf(tmp_path):
    params = dreg.get("pde_burgers1d").params("ci")
    _, out, _, card = build(burgers, params, tmp_path, seed=5)
    d = burgers.load(out)
    u, t, nu = d["u"], d.coords["t"], d.attrs["nu"]
    assert u.shape == (params["n_traj"], len(t), params["n"]) and card["grid"]["n"] == params["n"]
    for j in range(3):
        u0 = u[j, 0].astype(np.float64)
        u0 -= u0.mean()  # float32 rounding leaves a ~1e-8 mean
        fine = np.fft.irfft(np.fft.rfft(u0), n=2048) * (2048 / len(u0))  # exact: u0 is band-limited
        ref = burgers.cole_hopf(fine, t[-1], nu)[:: 2048 // len(u0)]
        assert np.abs(u[j, -1] - ref).max() < 1e-4 * max(1.0, np.abs(u0).max())


# --- heat / Poisson ----------------------------------------------------------------------------

def test_heat_single_mode_matches_exact_decay():
    n, kappa = 32, 0.07
    x = np.arange(n) * 2 * np.pi / n
    u0 = (np.sin(2 * x)[:, None] * np.cos(3 * x)[None, :])[None]
    t = np.array([0.0, 0.5, 2.0])
    u = heat_poisson.heat_exact(u0, t, kappa)
    for i, ti in enumerate(t):
        np.testing.assert_allclose(u[0, i], u0[0] * np.exp(-kappa * 13 * ti), atol=1e-13)


def test_heat_dataset_modes_decay_exactly_and_solve_pde(tmp_path):
    params = dreg.get("pde_heat_poisson").params("ci")
    _, out, _, _ = build(heat_poisson, params, tmp_path, seed=2)
    d = heat_poisson.load(out)["heat"]
    u, t, kappa = d["u"].astype(np.float64), d.coords["t"], d.attrs["kappa"]
    n = u.shape[-1]
    k = 2 * np.pi * np.fft.fftfreq(n, d.attrs["length"] / n)
    k2 = k[:, None] ** 2 + k[None, :] ** 2
    uh = np.fft.fft2(u)
    big = np.abs(uh[:, 0]) > 1e-2 * np.abs(uh[:, 0]).max()
    ratio = uh[:, -1][big] / uh[:, 0][big]
    expected = np.broadcast_to(np.exp(-kappa * k2 * t[-1]), uh[:, 0].shape)[big]
    np.testing.assert_allclose(ratio.real, expected, rtol=0, atol=1e-5)
    # PDE residual from the saved frames, u_t (4th-order differences in time) vs kappa * spectral
    # Laplacian, on the modes the frame spacing resolves (kappa |k|^2 dt_save <= 0.2; the filter commutes with the PDE)
    low = kappa * k2 * (t[1] - t[0]) <= 0.2
    ul = np.real(np.fft.ifft2(uh * low))
    lap = np.real(np.fft.ifft2(-k2 * uh * low))
    ut = d_dt(np.moveaxis(ul, 1, -1), t[1] - t[0])
    resid = np.abs(ut - kappa * np.moveaxis(lap, 1, -1)[..., 2:-2]).max()
    assert resid < 1e-3 * np.abs(kappa * lap).max()


def test_poisson_exact_and_second_order_finite_differences():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((1, 6, 6)) / (1 + np.arange(6)[:, None] + np.arange(6)[None, :]) ** 2
    errs = []
    for n in (15, 31, 63):
        coef = np.zeros((1, n, n))
        coef[:, :6, :6] = base
        f, u = heat_poisson.poisson_dirichlet(coef)
        h = 1.0 / (n + 1)
        up = np.pad(u[0], 1)  # zero Dirichlet boundary
        lap = (up[2:, 1:-1] + up[:-2, 1:-1] + up[1:-1, 2:] + up[1:-1, :-2] - 4 * up[1:-1, 1:-1]) / h**2
        errs.append(np.abs(-lap - f[0]).max())
    assert 3.5 < errs[0] / errs[1] < 4.5 and 3.5 < errs[1] / errs[2] < 4.5  # O(h^2) -> exact solution


def test_poisson_dataset_layout(tmp_path):
    params = dreg.get("pde_heat_poisson").params("ci")
    _, out, _, card = build(heat_poisson, params, tmp_path, seed=2)
    p = heat_poisson.load(out)["poisson"]
    n = params["poisson"]["n"]
    assert p["f"].shape == p["u"].shape == (params["poisson"]["n_samples"], n, n)
    np.testing.assert_allclose(p.coords["x"], np.arange(1, n + 1) / (n + 1))
    # the stored solution is the exact one for the stored source coefficients
    f, u = heat_poisson.poisson_dirichlet(p.diagnostics["source_sine_coefficients"][:4])
    np.testing.assert_allclose(p["u"][:4], u, atol=1e-6 * np.abs(u).max())
    assert set(p.split) == {"train", "val", "test"} and card["files"] == ["heat.h5", "poisson.h5"]


# --- Allen-Cahn --------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [0.05, 1.0])
def test_allen_cahn_energy_decreases_monotonically(tmp_path, dt):
    params = {**dreg.get("pde_allen_cahn").params("ci"), "dt": dt}
    _, out, _, _ = build(allen_cahn, params, tmp_path, seed=4)
    d = allen_cahn.load(out)
    e = d.diagnostics["energy"]
    assert e[:, 0].min() > 3 * e[:, -1].max()  # real coarsening happened
    assert np.all(np.diff(e, axis=1) <= 1e-12 * np.abs(e[:, :-1]))  # solver energy (float64) never rises
    solver = allen_cahn.AllenCahn(d.attrs["n"], d.attrs["ndim"], d.attrs["length"], d.attrs["eps"])
    e32 = np.stack([solver.energy(d["u"][j]) for j in range(d["u"].shape[0])])
    assert np.all(np.diff(e32, axis=1) <= 1e-5 * np.abs(e32[:, :-1]))  # also from the saved float32 fields
    assert np.abs(d["u"]).max() <= 1.0 + 1e-3  # discrete maximum principle (approximately)


# --- determinism -------------------------------------------------------------------------------

OFFLINE = ["pde_kolmogorov2d", "pde_burgers1d", "pde_allen_cahn", "pde_heat_poisson", "pdebench_burgers1d",
           "pdebench_ns2d"]


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_datasets_are_deterministic(tmp_path, name):
    spec = dreg.get(name)
    params, module = spec.params("ci"), spec.module()
    _, out_a, _, card_a = build(module, params, tmp_path / "a", seed=spec.seed)
    _, out_b, _, _ = build(module, params, tmp_path / "b", seed=spec.seed)
    _, out_c, _, _ = build(module, params, tmp_path / "c", seed=spec.seed + 1)
    files = card_a["files"]
    for f in files:
        a, b, c = read_h5(out_a / f), read_h5(out_b / f), read_h5(out_c / f)
        for k in a.fields:
            np.testing.assert_array_equal(a.fields[k], b.fields[k])
        assert any(not np.array_equal(a.fields[k], c.fields[k]) for k in a.fields)
        assert (out_a / f).read_bytes() == (out_b / f).read_bytes()  # byte-identical, so card checksums match


# --- PDEBench remote path ----------------------------------------------------------------------

def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()  # noqa: S324


def _fake_pdebench_burgers(path: Path, n=5, nt=11, nx=64):
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as h:
        h["tensor"] = rng.standard_normal((n, nt, nx)).astype(np.float32)
        h["x-coordinate"] = ((np.arange(nx) + 0.5) / nx).astype(np.float32)
        h["t-coordinate"] = (np.arange(nt + 1) * 0.01).astype(np.float32)  # PDEBench's extra stamp


def _fake_pdebench_ns(path: Path, b=3, nt=9, n=32):
    import h5py

    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as h:
        h["velocity"] = rng.standard_normal((b, nt, n, n, 2)).astype(np.float32)
        h["particles"] = rng.random((b, nt, n, n, 1)).astype(np.float32)
        h["force"] = rng.standard_normal((b, n, n, 2)).astype(np.float32)
        h["t"] = np.broadcast_to(np.arange(nt) * 0.005, (b, nt)).astype(np.float32)


@pytest.fixture
def served(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    bid, _ = pdebench.FILES["1D_Burgers_Sols_Nu0.1.hdf5"]
    nid, _ = pdebench.FILES["ns_incom_inhom_2d_512-0.h5"]
    _fake_pdebench_burgers(folder / bid)
    _fake_pdebench_ns(folder / nid)
    return folder, bid, nid


BURGERS_REMOTE = {"file": "1D_Burgers_Sols_Nu0.1.hdf5", "n_traj": 4, "nx": 32, "dt_save": 0.02, "backoff": 0.0}


def test_pdebench_burgers_remote_success_and_layout(served, tmp_path):
    folder, bid, _ = served
    with serve(folder) as url:
        params = {**BURGERS_REMOTE, "base_url": url, "md5": _md5(folder / bid)}
        raw, out, info, card = build(pdebench_burgers, params, tmp_path, source="remote")
    assert info["url"] == url + bid and info["downloaded_md5"] == params["md5"]
    assert [p.name for p in raw.iterdir()] == ["1D_Burgers_Sols_Nu0.1.hdf5"]
    again = pdebench_burgers.acquire("remote", params, raw, 0)  # server gone: the verified file is reused
    assert again["downloaded_md5"] == params["md5"]
    d = pdebench_burgers.load(out)
    import h5py

    with h5py.File(folder / bid) as h:
        src = h["tensor"][()]
    np.testing.assert_array_equal(d["u"], src[:4, ::2, ::2])
    assert d["u"].shape == (4, 6, 32) and len(d.coords["t"]) == 6  # 11 frames, extra t stamp dropped
    np.testing.assert_allclose(d.coords["t"], np.arange(0, 11, 2) * 0.01, atol=1e-7)
    np.testing.assert_allclose(d.coords["x"], (np.arange(0, 64, 2) + 0.5) / 64, atol=1e-7)
    assert d.attrs["nu"] == 0.1 and d.attrs["origin"] == "PDEBench (DaRUS)"
    assert "dropped" in d.attrs["t_coordinate_note"]


def test_pdebench_checksum_mismatch_leaves_nothing(served, tmp_path):
    folder, bid, _ = served
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(folder) as url:
        params = {**BURGERS_REMOTE, "base_url": url}  # the pinned (real) PDEBench MD5 cannot match
        with pytest.raises(DownloadError) as exc:
            pdebench_burgers.acquire("remote", params, raw, 0)
    msg = str(exc.value)
    assert "checksum mismatch" in msg and pdebench.FILES["1D_Burgers_Sols_Nu0.1.hdf5"][1] in msg
    assert url + bid in msg
    assert list(raw.iterdir()) == []  # no partial or unverified file


def test_pdebench_interrupted_download_leaves_nothing(served, tmp_path):
    folder, bid, _ = served
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(folder, truncate=(bid,)) as url:
        params = {**BURGERS_REMOTE, "base_url": url, "md5": _md5(folder / bid), "retries": 2}
        with pytest.raises(DownloadError) as exc:
            pdebench_burgers.acquire("remote", params, raw, 0)
    assert "could not download" in str(exc.value)
    assert list(raw.iterdir()) == []


def test_pdebench_ns_remote_and_env_override(served, tmp_path, monkeypatch):
    folder, _, nid = served
    with serve(folder) as url:
        monkeypatch.setenv(pdebench.ENV_BASE_URL, url)
        params = {"file": "ns_incom_inhom_2d_512-0.h5", "n_traj": 2, "n": 16, "dt_save": 0.01, "t_end": 0.03,
                  "md5": _md5(folder / nid), "backoff": 0.0}
        _, out, info, _ = build(pdebench_ns, params, tmp_path, source="remote")
    assert info["url"] == url + nid
    d = pdebench_ns.load(out)
    assert d["velocity"].shape == (2, 4, 16, 16, 2) and d["particles"].shape == (2, 4, 16, 16)
    assert d["force"].shape == (2, 16, 16, 2)
    np.testing.assert_allclose(d.coords["t"], [0, 0.01, 0.02, 0.03], atol=1e-6)
    assert d.dims["velocity"] == ("traj", "time", "x", "y", "component")


def test_pdebench_offline_standin_is_labelled(tmp_path):
    params = dreg.get("pdebench_burgers1d").params("ci")
    _, out, info, card = build(pdebench_burgers, params, tmp_path, seed=1)
    d = pdebench_burgers.load(out)
    assert "not PDEBench data" in info["origin"] and "not PDEBench data" in d.attrs["origin"]
    assert d["u"].shape == (params["n_traj"], 41, params["nx"])
    # the stand-in solves PDEBench's equation: compare with Cole-Hopf for nu/pi on [0, 1]
    u0 = d["u"][0, 0].astype(np.float64)
    u0 -= u0.mean()
    fine = np.fft.irfft(np.fft.rfft(u0), n=2048) * (2048 / len(u0))
    ref = burgers.cole_hopf(fine, d.coords["t"][-1], 0.1 / np.pi, length=1.0)[:: 2048 // len(u0)]
    assert np.abs(d["u"][0, -1] - ref).max() < 1e-3


def test_stage_writes_card_and_preview(tmp_path):
    from reprozoo import stages

    base = tmp_path / "data" / "pde_burgers1d" / "ci"
    stages.acquire("pde_burgers1d", "ci", "offline", base / "raw", base / "raw" / "manifest.json")
    card = stages.preprocess("pde_burgers1d", "ci", base / "raw", base / "raw" / "manifest.json", base,
                             base / "card.json", base / "preview.png")
    assert card["grid"]["n"] == 128 and card["time"]["n_t"] == 41 and "burgers1d.h5" in card["files"]
    assert (base / "preview.png").stat().st_size > 5000
