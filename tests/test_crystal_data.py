"""Crystal tensor datasets: EMT elastic tensors (physics), synthetic equivariant targets, JARVIS and MP paths.

The EMT dataset is generated once at ci scale through the real acquire/preprocess stages.
"""
import json
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from loopback import serve
from reprozoo import stages
from reprozoo.data import registry as dreg
from reprozoo.data.crystals import common, emt_elastic, jarvis, mp
from reprozoo.data.download import DownloadError, sha256_file


def _random_rotation(rng):
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] *= -1
    return q


def _rotated(structure, r):
    from pymatgen.core import Lattice, Structure

    return Structure(Lattice(structure.lattice.matrix @ r.T), structure.species, structure.cart_coords @ r.T,
                     coords_are_cartesian=True)


@pytest.fixture(scope="module")
def emt_ci(tmp_path_factory):
    base = tmp_path_factory.mktemp("results") / "data" / "crystals_emt_elastic" / "ci"
    stages.acquire("crystals_emt_elastic", "ci", "offline", base / "raw", base / "raw" / "manifest.json")
    card = stages.preprocess("crystals_emt_elastic", "ci", base / "raw", base / "raw" / "manifest.json", base,
                             base / "card.json", base / "preview.png")
    return base, card, emt_elastic.load(base)


# --- layout --------------------------------------------------------------------------------------

def test_registered_names_and_sources():
    assert dreg.get("crystals_emt_elastic").sources == ["offline"]
    assert dreg.get("jarvis_dft_elastic").sources == ["offline", "remote", "path"]  # offline: flagged surrogate
    assert dreg.get("mp_elastic").sources == ["offline", "remote", "path"]
    for name in ("crystals_emt_elastic", "jarvis_dft_elastic", "mp_elastic"):
        spec = dreg.get(name)
        assert spec.family == "crystals" and set(spec.scales) == {"ci", "smoke", "paper"}


def test_layout_card_and_loader(emt_ci):
    base, card, data = emt_ci
    assert (base / "preview.png").stat().st_size > 10_000
    assert set(card["files"]) == {"structures.json", "tensors.npz", "structures.parquet"}
    m = len(data)
    assert 8 <= m <= 15 and card["sizes"]["n_structures"] == m
    assert data.C_voigt.shape == (m, 6, 6) and data.C_full.shape == (m, 3, 3, 3, 3)
    assert data.eps_like.shape == (m, 3, 3) and data.piezo_like.shape == (m, 3, 3, 3)
    assert data.extra["C_voigt_clamped"].shape == (m, 6, 6)
    assert list(data.table.id) == list(data.ids) and len(data.structures) == m
    for col in ("formula", "prototype", "spacegroup_symbol", "spacegroup_number", "crystal_system", "n_atoms",
                "energy_per_atom", "k_vrh", "g_vrh", "split"):
        assert col in data.table
    assert set(data.table.split) <= {"train", "val", "test"} and (data.table.split == "train").any()
    atoms = data.atoms([0])
    assert len(atoms[0]) == len(data.structures[0])
    assert card["version"] == emt_elastic.GENERATOR_VERSION and card["seed"] == dreg.get("crystals_emt_elastic").seed
    assert {"fcc", "hcp", "random"} <= set(data.table.prototype)
    assert any(p.endswith("-distorted") for p in data.table.prototype)


# --- elastic tensor physics ----------------------------------------------------------------------

def test_index_symmetries_and_voigt_roundtrip(emt_ci):
    from pymatgen.analysis.elasticity import ElasticTensor

    c = emt_ci[2].C_full
    assert np.allclose(c, c.transpose(0, 2, 1, 3, 4))  # C_ijkl = C_jikl
    assert np.allclose(c, c.transpose(0, 1, 2, 4, 3))  # C_ijkl = C_ijlk
    assert np.allclose(c, c.transpose(0, 3, 4, 1, 2))  # C_ijkl = C_klij
    assert np.allclose(common.full_to_voigt(c), emt_ci[2].C_voigt)
    for cv, cf in zip(emt_ci[2].C_voigt, c):
        assert np.allclose(ElasticTensor.from_voigt(cv), cf)  # same convention as pymatgen
    # the finite differences themselves were (nearly) symmetric before symmetrisation
    assert emt_ci[2].table.fd_asymmetry.max() < 2e-3


def test_tensors_have_the_lattice_symmetry(emt_ci):
    data = emt_ci[2]
    for k, s in enumerate(data.structures):
        rots = common.symmetry_info(s)["rotations"]
        assert common.point_group_residual(data.C_full[k], rots) < 2e-3, data.table.id[k]
    tab = data.table
    cubic = np.flatnonzero(tab.prototype.isin(["fcc", "bcc", "L12", "B2"]).to_numpy())
    assert len(cubic) >= 4 and (tab.crystal_system.iloc[cubic] == "cubic").all()
    for k in cubic:  # these cells are built along the cubic axes
        c = data.C_voigt[k]
        scale = np.abs(c).max()
        tol = 1e-6 * scale
        assert np.ptp([c[0, 0], c[1, 1], c[2, 2]]) < tol
        assert np.ptp([c[0, 1], c[0, 2], c[1, 2]]) < tol
        assert np.ptp([c[3, 3], c[4, 4], c[5, 5]]) < tol
        assert np.abs(c[:3, 3:]).max() < tol
        assert np.abs(c[3:, 3:] - np.diag(np.diag(c[3:, 3:]))).max() < tol
    for k in np.flatnonzero((tab.prototype == "hcp").to_numpy()):  # c along z: transversely isotropic
        c = data.C_voigt[k]
        tol = 2e-3 * np.abs(c).max()
        assert abs(c[0, 0] - c[1, 1]) < tol and abs(c[0, 2] - c[1, 2]) < tol and abs(c[3, 3] - c[4, 4]) < tol
        assert abs(c[5, 5] - 0.5 * (c[0, 0] - c[0, 1])) < tol
        assert np.abs(c[:3, 3:]).max() < tol


def test_born_stability_of_fcc_metals(emt_ci):
    data = emt_ci[2]
    fcc = np.flatnonzero((data.table.prototype == "fcc").to_numpy())
    assert len(fcc) >= 3
    for k in fcc:
        c = data.C_voigt[k]
        assert np.linalg.eigvalsh(c).min() > 0
        assert c[0, 0] > abs(c[0, 1]) and c[0, 0] + 2 * c[0, 1] > 0 and c[3, 3] > 0
        assert bool(data.table.born_stable.iloc[k])


def test_emt_copper_values_and_bulk_modulus_from_eos(emt_ci):
    from ase.eos import EquationOfState
    from ase.units import GPa

    data = emt_ci[2]
    k = int(np.flatnonzero(((data.table.prototype == "fcc") & (data.table.reduced_formula == "Cu")).to_numpy())[0])
    c = data.C_voigt[k]
    # EMT copper: C11 ~ 172, C12 ~ 116, C44 ~ 90 GPa (experiment: 168, 121, 75)
    assert 150 < c[0, 0] < 200 and 100 < c[0, 1] < 135 and 70 < c[3, 3] < 105
    assert 120 < data.table.k_vrh.iloc[k] < 150
    # an independent route to the bulk modulus: energy-volume curve of the relaxed cell
    at = data.atoms([k])[0]
    vols, ens = [], []
    for f in np.linspace(0.98, 1.02, 7):
        a = at.copy()
        a.set_cell(at.cell * f, scale_atoms=True)
        emt_elastic._calc(a)
        vols.append(a.get_volume())
        ens.append(a.get_potential_energy())
    v0, e0, b = EquationOfState(vols, ens).fit()
    b_gpa = b / GPa
    assert abs(b_gpa - (c[0, 0] + 2 * c[0, 1]) / 3) / b_gpa < 0.02


def test_relaxed_ion_tensor_is_softer_than_clamped(emt_ci):
    data = emt_ci[2]
    for k in range(len(data)):
        diff = data.extra["C_voigt_clamped"][k] - data.C_voigt[k]
        assert np.linalg.eigvalsh(diff).min() > -1e-3 * np.abs(data.C_voigt[k]).max()
        if not data.table.ions_relaxed.iloc[k]:  # atoms on inversion centres: no internal relaxation
            assert np.allclose(diff, 0, atol=1e-9)
    assert data.table.ions_relaxed.any()


def test_elastic_tensor_rotates_with_the_cell(emt_ci):
    """Recompute the tensor of a rotated low-symmetry cell from scratch: C' = R.C (ions relaxed each strain)."""
    data = emt_ci[2]
    k = int(np.flatnonzero((data.table.prototype == "random").to_numpy())[0])
    r = _random_rotation(np.random.default_rng(3))
    at = data.atoms([k])[0]
    rot = at.copy()
    rot.set_cell(at.cell.array @ r.T, scale_atoms=True)
    c_rot = emt_elastic.elastic_tensor(rot)["C"]
    expect = common.rotate(data.C_full[k], r)
    assert np.linalg.norm(common.voigt_to_full(c_rot) - expect) / np.linalg.norm(expect) < 2e-3


# --- synthetic order-2 / order-3 targets ----------------------------------------------------------

def test_synthetic_targets_are_equivariant(emt_ci):
    from pymatgen.core.tensors import Tensor

    data = emt_ci[2]
    rng = np.random.default_rng(0)
    for k, s in enumerate(data.structures):
        r = _random_rotation(rng)
        eps, p3 = common.structure_targets(_rotated(s, r))
        assert np.allclose(eps, common.rotate(data.eps_like[k], r), atol=1e-10)
        assert np.allclose(p3, common.rotate(data.piezo_like[k], r), atol=1e-10)
        assert np.allclose(eps, Tensor(data.eps_like[k]).rotate(r), atol=1e-10)
        assert np.allclose(p3, Tensor(data.piezo_like[k]).rotate(r), atol=1e-10)
        # invariant to a translation and to the order of the atoms
        moved = s.copy()
        moved.translate_sites(list(range(len(s))), [0.13, -0.27, 0.31], frac_coords=True)
        perm = s.copy()
        perm = perm.get_sorted_structure(key=lambda site: -site.frac_coords[0])
        for other in (moved, perm):
            e2, p2 = common.structure_targets(other)
            assert np.allclose(e2, data.eps_like[k], atol=1e-10) and np.allclose(p2, data.piezo_like[k], atol=1e-10)


def test_synthetic_target_properties(emt_ci):
    data = emt_ci[2]
    eps, p3 = data.eps_like, data.piezo_like
    assert np.allclose(eps, eps.transpose(0, 2, 1))
    assert np.linalg.eigvalsh(eps).min() > 1.0  # I + positive semidefinite
    assert np.allclose(p3, p3.transpose(0, 1, 3, 2))  # piezo-like: symmetric in the last two indices
    centro = data.table.centrosymmetric.to_numpy(bool)
    norms = np.linalg.norm(p3.reshape(len(data), -1), axis=1)
    assert np.all(norms[centro] < 1e-12)  # vanishes with an inversion centre, as a piezo tensor must
    assert (~centro).any() and np.all(norms[~centro] > 1e-6)
    cubic = (data.table.crystal_system == "cubic").to_numpy()
    dev = eps - np.trace(eps, axis1=1, axis2=2)[:, None, None] / 3 * np.eye(3)
    assert np.abs(dev[cubic]).max() < 1e-12  # an order-2 tensor of a cubic crystal is isotropic
    assert np.abs(dev[~cubic]).max() > 1e-6


# --- determinism ---------------------------------------------------------------------------------

TINY = {"elements": ["Cu", "Al", "Ni"], "elemental": ["fcc"], "ordered": ["B2"], "n_ordered": 1, "n_random": 1,
        "n_distorted": 1, "random_sizes": [3], "random_species": [2, 3]}


def test_generation_is_deterministic_for_a_seed():
    a, _ = emt_elastic.generate(TINY, 5, progress=lambda m: None)
    b, _ = emt_elastic.generate(TINY, 5, progress=lambda m: None)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert any(r["ions_relaxed"] for r in a)  # the relaxations under strain are deterministic too

    def cells(seed):
        return [(c["prototype"], c["atoms"].get_chemical_symbols(), c["atoms"].cell.array.round(6).tolist())
                for c in emt_elastic.candidates(TINY, np.random.default_rng(seed))]

    assert cells(5) == cells(5) and cells(5) != cells(6)


def test_processing_is_deterministic(emt_ci, tmp_path):
    base, card, data = emt_ci
    info = emt_elastic.preprocess(base / "raw", tmp_path, dreg.get("crystals_emt_elastic").params("ci"))
    again = emt_elastic.load(tmp_path)
    assert info["sizes"] == card["sizes"]
    for name in ("C_voigt", "C_full", "eps_like", "piezo_like"):
        assert np.array_equal(getattr(again, name), getattr(data, name))
    assert again.table.equals(data.table)
    assert (tmp_path / "structures.json").read_bytes() == (base / "structures.json").read_bytes()


# --- JARVIS: the dft_3d file, served locally -----------------------------------------------------

def _jarvis_fixture(folder: Path, data) -> tuple[Path, dict]:
    """A tiny dft_3d zip in the real format: 3 converted EMT entries, one without a tensor, one by hand."""
    recs = [jarvis.structure_to_record(f"JVASP-{900 + k}", data.structures[k], data.C_voigt[k]) for k in range(3)]
    recs.append({**recs[0], "jid": "JVASP-1", "elastic_tensor": "na"})
    # written by hand the way dft_3d stores it: VASP order (xx, yy, zz, xy, yz, zx), fractional coords
    hand = np.diag([200.0, 210.0, 220.0, 40.0, 50.0, 60.0])
    hand[0, 1] = hand[1, 0] = 100.0
    recs.append({"jid": "JVASP-2", "formula": "Cu", "spg_number": 225, "spg_symbol": "Fm-3m", "crys": "cubic",
                 "atoms": {"lattice_mat": [[0.0, 1.8, 1.8], [1.8, 0.0, 1.8], [1.8, 1.8, 0.0]],
                           "coords": [[0.0, 0.0, 0.0]], "elements": ["Cu"], "abc": [2.55, 2.55, 2.55],
                           "angles": [60.0, 60.0, 60.0], "cartesian": False, "props": [""]},
                 "elastic_tensor": hand.tolist(), "optb88vdw_total_energy": -3.7, "formation_energy_peratom": 0.0,
                 "bulk_modulus_kv": "na", "shear_modulus_gv": "na", "epsx": 1.5, "epsy": "na", "epsz": "na",
                 "dfpt_piezo_max_eij": "na", "dfpt_piezo_max_dielectric": "na"})
    folder.mkdir(parents=True, exist_ok=True)
    path = jarvis.write_zip(recs, folder / jarvis.FILE_ID)
    return path, {"hand": hand}


def test_jarvis_remote_download_and_parse(emt_ci, tmp_path, monkeypatch):
    data = emt_ci[2]
    path, extra = _jarvis_fixture(tmp_path / "srv", data)
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(tmp_path / "srv") as url:
        monkeypatch.setenv(jarvis.ENV_BASE_URL, url)
        info = jarvis.acquire("remote", {"sha256": sha256_file(path)}, raw, seed=0)
    assert info["url"] == url.rstrip("/") + "/" + jarvis.FILE_ID and info["surrogate"] is False
    assert zipfile.ZipFile(raw / jarvis.ZIP_NAME).namelist() == [jarvis.MEMBER]
    out = tmp_path / "out"
    res = jarvis.preprocess(raw, out, {"max_records": None})
    assert res["sizes"]["n_records_in_file"] == 5 and res["sizes"]["n_with_elastic_tensor"] == 4
    got = jarvis.load(out)
    assert sorted(got.ids) == ["JVASP-2", "JVASP-900", "JVASP-901", "JVASP-902"]
    for k in range(3):
        j = list(got.ids).index(f"JVASP-{900 + k}")
        assert np.allclose(got.C_voigt[j], data.C_voigt[k], atol=0.051)  # dft_3d rounds to 0.1 GPa
        assert np.allclose(got.structures[j].cart_coords, data.structures[k].cart_coords, atol=1e-8)
    j = list(got.ids).index("JVASP-2")
    c = got.C_voigt[j]  # VASP's xy (4th) moved to Voigt's 6th, yz (5th) to 4th, zx (6th) to 5th
    assert (c[3, 3], c[4, 4], c[5, 5]) == (50.0, 60.0, 40.0) and c[0, 1] == 100.0
    row = got.table.iloc[j]
    assert row.energy_per_atom == -3.7 and row.epsx == 1.5 and np.isnan(row.epsy)
    assert row.spacegroup_symbol == "Fm-3m" and row.jarvis_spg_number == 225
    # subsampling is deterministic
    jarvis.preprocess(raw, tmp_path / "o2", {"max_records": 2})
    jarvis.preprocess(raw, tmp_path / "o3", {"max_records": 2})
    assert list(jarvis.load(tmp_path / "o2").ids) == list(jarvis.load(tmp_path / "o3").ids)


def test_jarvis_checksum_mismatch_leaves_no_file(emt_ci, tmp_path):
    _jarvis_fixture(tmp_path / "srv", emt_ci[2])
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(tmp_path / "srv") as url:
        with pytest.raises(DownloadError, match="checksum mismatch"):
            jarvis.acquire("remote", {"base_url": url, "sha256": "0" * 64}, raw, seed=0)
    assert list(raw.iterdir()) == []


def test_jarvis_interrupted_download_leaves_no_file(emt_ci, tmp_path):
    path, _ = _jarvis_fixture(tmp_path / "srv", emt_ci[2])
    raw = tmp_path / "raw"
    raw.mkdir()
    with serve(tmp_path / "srv", truncate=(jarvis.FILE_ID,)) as url:
        with pytest.raises(DownloadError, match="could not download"):
            jarvis.acquire("remote", {"base_url": url, "sha256": sha256_file(path)}, raw, seed=0)
    assert list(raw.iterdir()) == []


def test_jarvis_default_url_is_the_jarvis_tools_file():
    url = jarvis.url_for({})  # compared as text only: tests never connect outside 127.0.0.1
    assert url.startswith("https://") and url.endswith("ndownloader.figshare.com/files/38521619")
    assert jarvis.MEMBER == "jdft_3d-12-12-2022.json" and len(jarvis.SHA256) == 64


def test_jarvis_path_source(emt_ci, tmp_path):
    path, _ = _jarvis_fixture(tmp_path / "srv", emt_ci[2])
    raw = tmp_path / "raw"
    raw.mkdir()
    jarvis.acquire("path", {}, raw, seed=0, path=str(path))
    jarvis.preprocess(raw, tmp_path / "out", {"max_records": None})
    assert len(jarvis.load(tmp_path / "out")) == 4


# --- Materials Project: the key, the card, the document conversion --------------------------------

SECRET = "mpkey-SENTINEL-0123456789abcdef"


def _doc(data, k, mpid):
    return mp.structure_to_doc(mpid, data.structures[k], data.C_voigt[k])


class _Model:
    """Stands in for an emmet pydantic document."""

    def __init__(self, d):
        self._d = d

    def model_dump(self):
        return self._d


def _fake_mp_api(monkeypatch, docs, seen, error=None):
    class Elasticity:
        def search(self, **kwargs):
            seen["kwargs"] = kwargs
            if error:
                raise error
            return docs

    class MPRester:
        def __init__(self, api_key=None, **kw):
            seen["api_key"] = api_key
            self.materials = types.SimpleNamespace(elasticity=Elasticity())

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    pkg = types.ModuleType("mp_api")
    pkg.__version__ = "0.46.5-fake"
    client = types.ModuleType("mp_api.client")
    client.MPRester = MPRester
    pkg.client = client
    monkeypatch.setitem(sys.modules, "mp_api", pkg)
    monkeypatch.setitem(sys.modules, "mp_api.client", client)


def test_mp_requires_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("MP_API_KEY", raising=False)
    with pytest.raises(mp.MissingAPIKey, match="MP_API_KEY"):
        mp.acquire("remote", {"max_docs": 5}, tmp_path, seed=0)
    assert list(tmp_path.iterdir()) == []


def test_mp_key_never_reaches_card_log_or_files(emt_ci, tmp_path, monkeypatch, capsys):
    data = emt_ci[2]
    docs = [_Model(_doc(data, 0, "mp-30")), _doc(data, 3, "mp-1234"),
            {**_doc(data, 1, "mp-99"), "state": "failed"}]
    seen = {}
    _fake_mp_api(monkeypatch, docs, seen)
    monkeypatch.setenv("MP_API_KEY", SECRET)
    base = tmp_path / "results" / "data" / "mp_elastic" / "ci"
    log = tmp_path / "logs" / "mp.log"
    with stages.log_to(log):
        stages.acquire("mp_elastic", "ci", "remote", base / "raw", base / "raw" / "manifest.json")
        card = stages.preprocess("mp_elastic", "ci", base / "raw", base / "raw" / "manifest.json", base,
                                 base / "card.json", base / "preview.png")
    assert seen["api_key"] == SECRET  # the key was used ...
    assert seen["kwargs"]["num_chunks"] == 1 and "elastic_tensor" in seen["kwargs"]["fields"]
    captured = capsys.readouterr()
    texts = [captured.out, captured.err, log.read_text(), json.dumps(card)]
    texts += [p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file()]
    assert all(SECRET not in t for t in texts)  # ... and written nowhere
    assert card["n_records"] == 2 and card["surrogate"] is False
    got = mp.load(base)
    assert sorted(got.ids) == ["mp-1234", "mp-30"]
    j = list(got.ids).index("mp-1234")
    assert np.allclose(got.C_voigt[j], data.C_voigt[3])


def test_mp_errors_are_scrubbed_of_the_key(tmp_path, monkeypatch):
    seen = {}
    _fake_mp_api(monkeypatch, [], seen, error=ValueError(f"401 for key {SECRET}: invalid"))
    monkeypatch.setenv("MP_API_KEY", SECRET)
    with pytest.raises(RuntimeError) as err:
        mp.acquire("remote", {"max_docs": 5}, tmp_path, seed=0)
    assert SECRET not in str(err.value) and "***" in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_mp_document_conversion_by_hand():
    from pymatgen.core import Lattice, Structure

    s = Structure(Lattice.cubic(3.6), ["Cu"] * 4, [[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]])
    c = np.array([[176.0, 125, 125, 0, 0, 0], [125, 176, 125, 0, 0, 0], [125, 125, 176, 0, 0, 0],
                  [0, 0, 0, 82, 0, 0], [0, 0, 0, 0, 82, 0], [0, 0, 0, 0, 0, 82]])
    doc = {"material_id": "mp-30", "formula_pretty": "Cu", "structure": s.as_dict(), "state": "successful",
           "elastic_tensor": {"raw": c.tolist(), "ieee_format": c.round().tolist()},
           "bulk_modulus": {"voigt": 142.0, "reuss": 142.0, "vrh": 142.0},
           "shear_modulus": {"voigt": 59.0, "reuss": 52.0, "vrh": 55.5},
           "symmetry": {"symbol": "Fm-3m", "number": 225, "crystal_system": "Cubic"}}
    rec = mp.doc_to_record(doc)
    assert rec["id"] == "mp-30" and rec["mp_k_vrh"] == 142.0 and rec["mp_spacegroup_number"] == 225
    assert np.array_equal(rec["C_voigt"], c)
    assert Structure.from_dict(rec["structure"]) == s
    legacy = {"material_id": "mp-30", "structure": s, "elasticity": {"elastic_tensor": c.tolist()}}
    assert np.array_equal(mp.doc_to_record(legacy)["C_voigt"], c)
    assert mp.doc_to_record({**doc, "elastic_tensor": None}) is None
    assert mp.doc_to_record({**doc, "state": "failed"}) is None


def test_offline_surrogates_are_flagged(tmp_path):
    tiny = {"surrogate": {"elements": ["Cu"], "elemental": ["fcc"], "ordered": [], "n_random": 0, "n_distorted": 0}}
    (tmp_path / "j").mkdir()
    info = jarvis.acquire("offline", tiny, tmp_path / "j", seed=0)
    assert info["surrogate"] is True and "NOT JARVIS" in info["surrogate_note"]
    jarvis.preprocess(tmp_path / "j", tmp_path / "jo", {"max_records": None})
    assert list(jarvis.load(tmp_path / "jo").ids) == ["EMT-SURROGATE-0"]
    (tmp_path / "m").mkdir()
    info = mp.acquire("offline", tiny, tmp_path / "m", seed=0)
    assert info["surrogate"] is True and "NOT Materials Project" in info["surrogate_note"]
    mp.preprocess(tmp_path / "m", tmp_path / "mo", {"max_docs": None})
    assert len(mp.load(tmp_path / "mo")) == 1
