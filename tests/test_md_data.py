"""Molecular-dynamics datasets (src/reprozoo/data/md): physics of the generated data, the common
format and loader, determinism, and the remote path (sGDML npz, rMD17 archive) on 127.0.0.1."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from loopback import serve
from reprozoo.data import registry as dreg
from reprozoo.data.download import DownloadError, sha256_file
from reprozoo.data.md import alloy_pool, ase_md, frames as fmt, sgdml, surrogate
from reprozoo.data.md.potentials import FastEMT, FastLJ, neighbor_pairs

MD_DATASETS = ["md_emt_cu_bulk", "md_emt_pt_cluster", "md_emt_nanoclusters", "md_emt_alloy_pool", "md_lj_argon",
               "md17_aspirin", "rmd17_aspirin", "md22_ac_ala3"]

# tiny versions of the dataset parameters (the ci ones, shortened further)
CU = {"systems": [{"name": "cu32", "structure": "bulk", "element": "Cu", "repeat": [2, 2, 2]}],
      "timestep_fs": 4.0, "friction_per_fs": 0.02, "stride": 5,
      "segments": [{"ensemble": "langevin", "temperature_K": 500, "equilibrate": 20, "steps": 30},
                   {"ensemble": "nve", "steps": 150}]}
CLUSTERS = {"systems": [{"name": "cu13", "structure": "icosahedron", "element": "Cu", "shells": 2},
                        {"name": "cuau55", "structure": "icosahedron", "element": "Cu", "shells": 3,
                         "substitute": {"element": "Au", "fraction": 0.3}}],
            "timestep_fs": 4.0, "friction_per_fs": 0.02, "stride": 5,
            "segments": [{"ensemble": "langevin", "temperature_K": 400, "equilibrate": 10, "steps": 20}]}
LJ = {"calculator": {"name": "lj", "sigma": 3.405, "epsilon": 0.0104, "rc_sigma": 3.0, "ro_sigma": 2.5, "smooth": True},
      "systems": [{"name": "ar32", "structure": "bulk", "element": "Ar", "a": 5.82, "repeat": [2, 2, 2]}],
      "timestep_fs": 5.0, "friction_per_fs": 0.01, "stride": 5,
      "segments": [{"ensemble": "langevin", "temperature_K": 100, "equilibrate": 20, "steps": 20},
                   {"ensemble": "nve", "steps": 200}]}
POOL = {"n_structures": 12, "max_atoms": 16}


def _build(module, params, root: Path, seed: int = 0, source: str = "offline", path=None):
    raw, out = root / "raw", root / "out"
    raw.mkdir(parents=True, exist_ok=True)
    info = module.acquire(source=source, params=params, raw_dir=raw, seed=seed, path=path)
    summary = module.preprocess(raw_dir=raw, out_dir=out, params=params)
    return info, summary, fmt.load(out)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("md")
    return {"cu": _build(ase_md, CU, root / "cu", seed=3)[2],
            "clusters": _build(ase_md, CLUSTERS, root / "cl", seed=4)[2],
            "lj": _build(ase_md, LJ, root / "lj", seed=5)[2],
            "pool": _build(alloy_pool, POOL, root / "pool", seed=6)[2],
            "root": root}


# --- registry ----------------------------------------------------------------------------------

def test_registry_entries():
    for name in MD_DATASETS:
        spec = dreg.get(name)
        assert spec.family == "md" and "offline" in spec.sources
        assert set(spec.scales) == {"ci", "smoke", "paper"}
        mod = spec.module()
        for fn in ("acquire", "preprocess", "preview", "load"):
            assert callable(getattr(mod, fn))
    for name in ("md17_aspirin", "rmd17_aspirin", "md22_ac_ala3"):
        assert {"remote", "path"} <= set(dreg.get(name).sources)


def test_structure_builders():
    rng = np.random.default_rng(0)
    cases = [({"structure": "bulk", "element": "Cu", "repeat": [3, 3, 3]}, 108, True),
             ({"structure": "bulk", "element": "Ni", "crystal": "hcp", "repeat": [2, 2, 2]}, 32, True),
             ({"structure": "icosahedron", "element": "Pt", "shells": 4}, 147, False),
             ({"structure": "cuboctahedron", "element": "Au", "shells": 4}, 147, False),
             ({"structure": "slab", "element": "Cu", "facet": "111", "size": [4, 4, 3], "vacuum": 6.0}, 48, None)]
    for spec, n, periodic in cases:
        at = ase_md.build(spec, rng)
        assert len(at) == n, spec
        if periodic is None:
            assert list(at.pbc) == [True, True, False]
        else:
            assert at.pbc.all() == periodic and (periodic or np.all(at.cell.array == 0))
    # EMT lattice constants are EMT's equilibrium: a perfect crystal has no forces and ~no stress
    cu = ase_md.build({"structure": "bulk", "element": "Cu"}, rng)
    cu.calc = FastEMT()
    assert np.abs(cu.get_forces()).max() < 1e-10 and np.abs(cu.get_stress()).max() < 1e-5


# --- potentials ----------------------------------------------------------------------------

def _structures():
    from ase.build import bulk, fcc111
    from ase.cluster import Icosahedron

    rng = np.random.default_rng(0)
    a = bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 2, 2)
    a.numbers[rng.choice(32, 10, replace=False)] = 79
    a.rattle(0.1, seed=1)
    a.set_cell(a.cell.array @ np.array([[1.02, 0.03, 0], [0, 0.98, 0], [0.01, 0, 1.0]]), scale_atoms=True)
    b = a.copy()
    b.positions += [7.3, -14.0, 3.1]  # atoms outside the cell
    c = Icosahedron("Pt", 3)
    c.rattle(0.05, seed=2)
    d = fcc111("Ni", (3, 3, 3), vacuum=6.0)
    d.numbers[:4] = 13
    d.rattle(0.05, seed=3)
    return [a, b, c, d]


def test_fast_emt_matches_ase_emt():
    from ase.calculators.emt import EMT

    for at in _structures():
        ref, new = at.copy(), at.copy()
        ref.calc, new.calc = EMT(), FastEMT()
        assert abs(ref.get_potential_energy() - new.get_potential_energy()) < 1e-9
        assert np.abs(ref.get_forces() - new.get_forces()).max() < 1e-9
        if at.pbc.all():
            assert np.abs(ref.get_stress() - new.get_stress()).max() < 1e-10


def test_fast_lj_matches_ase_lj():
    from ase.build import bulk
    from ase.calculators.lj import LennardJones
    from ase.cluster import Icosahedron

    box = bulk("Ar", "fcc", a=5.5, cubic=True) * (2, 2, 2)
    box.rattle(0.2, seed=5)
    cl = Icosahedron("Ar", 3, latticeconstant=5.3)
    cl.rattle(0.1, seed=6)
    for at in (box, cl):
        for smooth in (True, False):
            kw = dict(sigma=3.405, epsilon=0.0104, rc=10.2, ro=8.5, smooth=smooth)
            ref, new = at.copy(), at.copy()
            ref.calc, new.calc = LennardJones(**kw), FastLJ(**kw)
            assert abs(ref.get_potential_energy() - new.get_potential_energy()) < 1e-12
            assert np.abs(ref.get_forces() - new.get_forces()).max() < 1e-12


def test_neighbor_pairs_skewed_cell_against_brute_force():
    rng = np.random.default_rng(1)
    cell = np.array([[4.0, 0.0, 0.0], [1.5, 3.5, 0.0], [0.7, -0.9, 3.2]])
    pos = rng.uniform(-3, 9, (7, 3))
    i, j, s = neighbor_pairs(pos, cell, [True, True, True], 5.0)
    got = sorted((a, b, round(float(np.linalg.norm(pos[b] + sh - pos[a])), 8)) for a, b, sh in zip(i, j, s))
    want = []
    for a in range(7):
        for b in range(7):
            for n in np.ndindex(9, 9, 9):
                sh = (np.array(n) - 4) @ cell
                r = np.linalg.norm(pos[b] + sh - pos[a])
                if r < 5.0 and (a != b or np.any(np.array(n) != 4)):
                    want.append((a, b, round(float(r), 8)))
    assert got == sorted(want)


# --- forces are minus the gradient of the energy (finite differences on stored frames) -------

def _fd_check(frame: dict, calc, rng, n_checks: int = 6, h: float = 1e-4, tol: float = 1e-4):
    from ase import Atoms

    at = Atoms(numbers=frame["numbers"], positions=frame["positions"], cell=frame["cell"], pbc=frame["pbc"])
    at.calc = calc
    assert abs(at.get_potential_energy() - frame["energy"]) < 1e-8  # stored energy belongs to stored positions
    for _ in range(n_checks):
        i, k = int(rng.integers(len(at))), int(rng.integers(3))
        p = at.positions.copy()
        p[i, k] += h
        at.positions = p
        ep = at.get_potential_energy()
        p[i, k] -= 2 * h
        at.positions = p
        em = at.get_potential_energy()
        p[i, k] += h
        at.positions = p
        fd = -(ep - em) / (2 * h)
        assert abs(fd - frame["forces"][i, k]) < tol, (i, k, fd, frame["forces"][i, k])


def test_emt_forces_equal_minus_energy_gradient(built):
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(0)
    cu, cl, pool = built["cu"], built["clusters"], built["pool"]
    _fd_check(cu.frame(len(cu) - 1), EMT(), rng)  # ASE's own EMT as the reference energy
    for s, name, sub in cl.systems():  # both cluster sizes, unpadded
        _fd_check(sub.frame(0), FastEMT(), rng)
    for i in range(0, len(pool), 4):
        _fd_check(pool.frame(i), FastEMT(), rng, n_checks=3)


def test_lj_forces_equal_minus_energy_gradient(built):
    lj = built["lj"]
    calc = ase_md.make_calculator(LJ["calculator"])
    _fd_check(lj.frame(0), calc, np.random.default_rng(1), tol=1e-6)
    from ase.calculators.lj import LennardJones

    ref = LennardJones(sigma=3.405, epsilon=0.0104, rc=3 * 3.405, ro=2.5 * 3.405, smooth=True)
    _fd_check(lj.frame(len(lj) - 1), ref, np.random.default_rng(2), tol=1e-6)


def test_surrogate_forces_equal_minus_energy_gradient():
    rng = np.random.default_rng(0)
    for name in surrogate.MOLECULES:
        atoms, bonds = surrogate.molecule(name)
        ff = surrogate.ValenceFF(atoms.positions, bonds)
        atoms.positions += rng.normal(0, 0.08, atoms.positions.shape)
        atoms.calc = ff
        fr = {"numbers": atoms.numbers, "positions": atoms.positions.copy(), "cell": np.zeros((3, 3)),
              "pbc": np.zeros(3, bool), "energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
        _fd_check(fr, ff, rng, n_checks=12, h=1e-5, tol=1e-6)
        # the reference geometry is the minimum: zero forces there
        ref, _ = surrogate.molecule(name)
        ref.calc = surrogate.ValenceFF(ref.positions, bonds)
        assert np.abs(ref.get_forces()).max() < 1e-10 and abs(ref.get_potential_energy()) < 1e-12


def test_surrogate_molecules():
    for name, formula, n in (("aspirin", "C9H8O4", 21), ("ac_ala3_nhme", "C12H22N4O4", 42)):
        atoms, bonds = surrogate.molecule(name)
        assert atoms.get_chemical_formula(mode="hill") == formula and len(atoms) == n
        assert len(bonds) == n - 1 + (1 if name == "aspirin" else 0)  # one ring in aspirin
        d = atoms.get_all_distances()
        bonded = {tuple(sorted(b)) for b in bonds}
        far = [d[i, j] for i in range(n) for j in range(i + 1, n) if (i, j) not in bonded]
        assert min(far) > 1.5  # no clashes between non-bonded atoms
        assert all(0.9 < d[i, j] < 1.6 for i, j in bonds)


# --- dynamics -------------------------------------------------------------------------------

def _nve_ok(data: fmt.MDFrames):
    t = data.table
    nve = (t["ensemble"] == "nve").to_numpy()
    assert nve.sum() >= 20 and np.array_equal(nve, data.extras["nve"])
    etot = data.energy[nve] + t["kinetic_energy"].to_numpy()[nve]
    ke_std = t["kinetic_energy"].to_numpy()[nve].std()
    time_fs = t["time_fs"].to_numpy()[nve]
    drift = abs(np.polyfit(time_fs, etot, 1)[0]) * (time_fs[-1] - time_fs[0])
    assert ke_std > 0
    assert drift < 0.05 * ke_std, (drift, ke_std)
    assert etot.std() < 0.05 * ke_std, (etot.std(), ke_std)
    # kinetic energy from the stored velocities (A/fs) matches the table
    from ase.data import atomic_masses
    from ase import units

    m = atomic_masses[data.numbers_per_frame[nve]]
    v = data.velocities[nve] / units.fs
    ke = 0.5 * (m[..., None] * v ** 2).sum(axis=(1, 2))
    assert np.allclose(ke, t["kinetic_energy"].to_numpy()[nve], rtol=1e-10)


def test_nve_energy_conservation_emt(built):
    _nve_ok(built["cu"])


def test_nve_energy_conservation_lj(built):
    _nve_ok(built["lj"])


def test_langevin_reaches_target_temperature():
    p = {**CU, "segments": [{"ensemble": "langevin", "temperature_K": 600, "equilibrate": 100, "steps": 300}],
         "stride": 2}
    arrays, table, _ = ase_md.generate(p, 0, progress=None)
    assert abs(table["temperature"].mean() - 600) < 90  # 32 atoms: large instantaneous fluctuations


def test_generators_are_deterministic():
    small = {**CU, "segments": [{"ensemble": "langevin", "temperature_K": 500, "steps": 10},
                                {"ensemble": "nve", "steps": 10}]}
    a1, t1, _ = ase_md.generate(small, 7, progress=None)
    a2, t2, _ = ase_md.generate(small, 7, progress=None)
    a3, _, _ = ase_md.generate(small, 8, progress=None)
    for k in a1:
        assert np.array_equal(a1[k], a2[k]), k
    assert np.array_equal(t1["temperature"], t2["temperature"])
    assert not np.allclose(a1["positions"], a3["positions"])
    p1, _ = alloy_pool.generate({"n_structures": 6}, 3, progress=None)
    p2, _ = alloy_pool.generate({"n_structures": 6}, 3, progress=None)
    p3, _ = alloy_pool.generate({"n_structures": 6}, 4, progress=None)
    assert all(np.array_equal(p1[k], p2[k]) for k in p1)
    assert not (p1["n_atoms"].shape == p3["n_atoms"].shape and np.array_equal(p1["energy"], p3["energy"]))
    s1 = surrogate.simulate("aspirin", 5, 3, 500.0, 0.5, 0.02, 10, np.random.default_rng(1))
    s2 = surrogate.simulate("aspirin", 5, 3, 500.0, 0.5, 0.02, 10, np.random.default_rng(1))
    assert all(np.array_equal(s1[k], s2[k]) for k in s1)


# --- format and loader ------------------------------------------------------------------------

def test_common_format_and_loader(built):
    for key in ("cu", "clusters", "lj", "pool"):
        d = built[key]
        F, N = d.positions.shape[:2]
        assert d.forces.shape == (F, N, 3) and d.cells.shape == (F, 3, 3) and d.energy.shape == (F,)
        assert d.pbc.shape == (3,) and d.pbc.dtype == bool
        assert d.numbers.shape in ((N,), (F, N))
        assert d.positions.dtype == np.float64 and d.energy.dtype == np.float64
        assert np.all(d.forces[~d.mask] == 0) and np.all(d.numbers_per_frame[~d.mask] == 0)
        assert np.all(d.numbers_per_frame[d.mask] > 0)
        t = d.table
        assert list(t.columns[:6]) == list(fmt.TABLE_COLUMNS) and len(t) == F
        assert set(t["split"]) <= set(fmt.SPLITS) and (t["frame"].to_numpy() == np.arange(F)).all()
        sizes = sum(len(d.split(s)) for s in fmt.SPLITS)
        assert sizes == F
        if not d.pbc.any():
            assert np.all(d.cells == 0)
    cl = built["clusters"]
    assert cl.padded and cl.numbers.ndim == 2
    subs = list(cl.systems())
    assert [s[1] for s in subs] == ["cu13", "cuau55"]
    assert [s[2].positions.shape[1] for s in subs] == [13, 55]
    assert all(not s[2].padded and s[2].numbers.ndim == 1 for s in subs)
    assert (subs[1][2].numbers == 79).sum() == round(0.3 * 55)
    at = cl.to_atoms(0)
    assert len(at) == cl.n_atoms[0] and np.allclose(at.get_forces(), cl.frame(0)["forces"])
    cu = built["cu"]
    assert not cu.padded and cu.numbers.shape == (32,) and cu.pbc.all()
    assert set(cu.table["segment"]) == {"langevin_500K", "nve"}
    pool = built["pool"]
    assert pool.extras["prototype"].shape == (len(pool),) and pool.extras["composition"].shape[0] == len(pool)
    assert np.allclose(pool.extras["composition"].sum(axis=1), 1.0)
    assert set(pool.table["prototype"]) <= set(alloy_pool.PROTOTYPES)


def test_preview_writes_png(built, tmp_path):
    for key in ("clusters", "pool"):
        png = tmp_path / f"{key}.png"
        fmt.preview(built["root"] / ("cl" if key == "clusters" else "pool") / "out", png)
        assert png.stat().st_size > 10_000


# --- remote path: sGDML npz and the rMD17 archive on 127.0.0.1 ------------------------------

ASPIRIN_Z = np.array([6] * 9 + [8] * 4 + [1] * 8)


def _fake_sgdml(path: Path, n_frames: int = 30, seed: int = 0) -> dict:
    """A small npz in the real sGDML key layout (kcal/mol, Angstrom)."""
    rng = np.random.default_rng(seed)
    R = rng.normal(0, 1.5, (n_frames, 21, 3))
    E = rng.normal(-406000.0, 5.0, (n_frames, 1))
    F = rng.normal(0, 30.0, (n_frames, 21, 3))
    arrays = {"R": R, "z": ASPIRIN_Z, "E": E, "F": F, "name": np.array("aspirin"),
              "theory": np.array("DFT: PBE+TS"), "md5": np.array("0" * 32), "type": np.array("d")}
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    return arrays


def _fake_rmd17_archive(folder: Path, n_frames: int = 25) -> tuple[Path, dict, str]:
    rng = np.random.default_rng(1)
    arrays = {"nuclear_charges": ASPIRIN_Z, "coords": rng.normal(0, 1.5, (n_frames, 21, 3)),
              "energies": rng.normal(-406000.0, 5.0, n_frames), "forces": rng.normal(0, 30.0, (n_frames, 21, 3)),
              "old_indices": np.arange(n_frames) * 7, "old_energies": rng.normal(size=n_frames),
              "old_forces": rng.normal(size=(n_frames, 21, 3))}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    member = buf.getvalue()
    other = io.BytesIO()
    np.savez(other, nuclear_charges=np.array([6] * 6 + [1] * 6))
    archive = folder / "rmd17.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tar:
        for name, data in (("rmd17/readme.txt", b"revised MD17\n"),
                           ("rmd17/npz_data/rmd17_benzene.npz", other.getvalue()),
                           ("rmd17/npz_data/rmd17_aspirin.npz", member),
                           ("rmd17/splits/index_train_01.csv", b"1\n2\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    import hashlib

    return archive, arrays, hashlib.sha256(member).hexdigest()


def _remote_params(entry: str, base_url: str, **kw) -> dict:
    return {"entry": entry, "base_url": base_url, "expect_frames": None, "n_frames": None, "retries": 2,
            "backoff": 0.01, "timeout": 10, **kw}


def test_remote_sgdml_npz_success(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    fake = _fake_sgdml(srv / "md17_aspirin.npz")
    sha = sha256_file(srv / "md17_aspirin.npz")
    with serve(srv) as url:
        info, summary, d = _build(sgdml, _remote_params("md17_aspirin", url, sha256=sha), tmp_path / "ds",
                                  source="remote")
    assert info["checksum_pinned"] and info["sha256"] == sha and not info["surrogate"]
    assert info["url"] == url + "md17_aspirin.npz"
    kcal = sgdml.KCAL_PER_MOL
    from ase import units

    assert abs(kcal - units.kcal / units.mol) < 1e-15
    assert np.allclose(d.energy, fake["E"][:, 0] * kcal) and np.allclose(d.forces, fake["F"] * kcal)
    assert np.array_equal(d.positions, fake["R"]) and np.array_equal(d.numbers, ASPIRIN_Z)
    assert not d.pbc.any() and len(d) == 30 and summary["sizes"]["n_frames_source"] == 30
    assert np.isnan(d.table["temperature"]).all()
    # subsampling is reproducible and keeps the source index
    params = _remote_params("md17_aspirin", "http://127.0.0.1:9/unused/", n_frames=10)
    out2 = sgdml.preprocess(tmp_path / "ds" / "raw", tmp_path / "ds" / "sub", params)
    sub = fmt.load(tmp_path / "ds" / "sub")
    assert len(sub) == 10 and out2["sizes"]["n_frames"] == 10
    assert np.array_equal(sub.positions, fake["R"][sub.extras["source_index"]])
    sgdml.preprocess(tmp_path / "ds" / "raw", tmp_path / "ds" / "sub2", params)
    assert np.array_equal(fmt.load(tmp_path / "ds" / "sub2").extras["source_index"], sub.extras["source_index"])


def test_remote_checksum_mismatch_leaves_nothing(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    _fake_sgdml(srv / "md17_aspirin.npz")
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(srv) as url:
        with pytest.raises(DownloadError, match="checksum mismatch"):
            sgdml.acquire("remote", _remote_params("md17_aspirin", url, sha256="0" * 64), raw, 0)
    assert list(raw.iterdir()) == []


def test_remote_interrupted_download_leaves_nothing(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    _fake_sgdml(srv / "md17_aspirin.npz")
    raw = tmp_path / "raw"
    raw.mkdir()
    sha = sha256_file(srv / "md17_aspirin.npz")
    with serve(srv, truncate=("md17_aspirin.npz",)) as url:
        with pytest.raises(DownloadError, match="could not download"):
            sgdml.acquire("remote", _remote_params("md17_aspirin", url, sha256=sha), raw, 0)
    assert list(raw.iterdir()) == []


def test_remote_unpinned_is_verified_by_structure(tmp_path, capsys):
    srv = tmp_path / "srv"
    srv.mkdir()
    _fake_sgdml(srv / "md22_Ac-Ala3-NHMe.npz")  # aspirin content under the MD22 name
    _fake_sgdml(srv / "md17_aspirin.npz")
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(srv) as url:
        with pytest.raises(DownloadError, match="does not look like Ac-Ala3-NHMe"):
            sgdml.acquire("remote", _remote_params("md22_ac_ala3", url, sha256=None), raw, 0)
        assert list(raw.iterdir()) == []
        with pytest.raises(DownloadError, match="30 frames, expected 211762"):
            sgdml.acquire("remote", {**_remote_params("md17_aspirin", url, sha256=None), "expect_frames": 211762},
                          raw, 0)
        assert list(raw.iterdir()) == []
        info = sgdml.acquire("remote", _remote_params("md17_aspirin", url, sha256=None), raw, 0)
    assert info["checksum_pinned"] is False and info["sha256"] == sha256_file(srv / "md17_aspirin.npz")
    assert info["sha256"] in capsys.readouterr().out  # printed so it can be pinned


def test_remote_rmd17_extracts_only_aspirin(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    archive, fake, member_sha = _fake_rmd17_archive(srv)
    params = _remote_params("rmd17_aspirin", None, url=None, sha256=sha256_file(archive), member_sha256=member_sha)
    with serve(srv) as url:
        params["base_url"] = url
        info, summary, d = _build(sgdml, params, tmp_path / "ds", source="remote")
    raw = tmp_path / "ds" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == ["raw_meta.json", "rmd17_aspirin.npz"]  # archive removed
    assert info["checksum_pinned"] and info["sha256"] == member_sha
    assert np.allclose(d.energy, fake["energies"] * sgdml.KCAL_PER_MOL)
    assert np.allclose(d.forces, fake["forces"] * sgdml.KCAL_PER_MOL)
    assert np.array_equal(d.extras["md17_index"], fake["old_indices"])
    # wrong member checksum: clear error, nothing left behind
    raw2 = tmp_path / "raw2"
    raw2.mkdir()
    with serve(srv) as url:
        with pytest.raises(DownloadError, match="checksum mismatch for rmd17/npz_data/rmd17_aspirin.npz"):
            sgdml.acquire("remote", {**params, "base_url": url, "member_sha256": "1" * 64}, raw2, 0)
    assert list(raw2.iterdir()) == []


def test_path_source(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    fake = _fake_sgdml(mine / "md17_aspirin.npz", n_frames=12)
    info, _, d = _build(sgdml, {"entry": "md17_aspirin", "expect_frames": None, "sha256": None},
                        tmp_path / "ds", source="path", path=str(mine))
    assert len(d) == 12 and np.allclose(d.energy, fake["E"][:, 0] * sgdml.KCAL_PER_MOL)
    archive, fake2, sha = _fake_rmd17_archive(mine)
    info, _, d2 = _build(sgdml, {"entry": "rmd17_aspirin", "expect_frames": None, "member_sha256": sha},
                         tmp_path / "ds2", source="path", path=str(archive))
    assert len(d2) == 25 and info["checksum_pinned"]


def test_offline_surrogate_is_labelled(tmp_path):
    params = {"entry": "md22_ac_ala3", "n_frames": None,
              "surrogate": {"n_frames": 8, "stride": 2, "equilibrate": 10}}
    info, summary, d = _build(sgdml, params, tmp_path, seed=1)
    assert info["surrogate"] is True and "STAND-IN" in info["surrogate_note"]
    assert summary["surrogate"] is True and len(d) == 8 and d.positions.shape[1] == 42
    assert np.isfinite(d.table["temperature"]).all()
