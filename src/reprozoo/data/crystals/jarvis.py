"""jarvis_dft_elastic: JARVIS-DFT 3D entries with an elastic tensor.

Remote: the very file ``jarvis-tools`` downloads for ``jarvis.db.figshare.data('dft_3d')``
(figshare file 38521619, ``jdft_3d-12-12-2022.json.zip`` holding one JSON list,
``jdft_3d-12-12-2022.json``), fetched with :func:`reprozoo.data.download.fetch` (pinned SHA-256,
retries, no partial file) and parsed the way jarvis-tools parses it
(``json.loads(zipfile.ZipFile(path).read(member))``). jarvis-tools itself is not needed: its loader
hard-codes the URL, writes into its own package folder and checks no checksum. The base URL can
be overridden with the dataset parameter ``base_url`` or the environment variable
``REPROZOO_JARVIS_BASE_URL`` (a mirror or a test server must serve ``<base>/38521619``).

Path: ``data.paths.jarvis_dft_elastic`` names a local copy of the zip (or the extracted JSON).

Offline: a SURROGATE (card ``surrogate: true``): a few EMT cells from
:mod:`.emt_elastic` written in the dft_3d record format and parsed by the same code. It keeps
workflows that list this dataset runnable without the internet; it is not JARVIS data.

Record fields used: ``jid``, ``atoms`` (``lattice_mat`` rows, ``coords``, ``elements``,
``cartesian``), ``elastic_tensor`` (6x6, GPa, VASP order xx,yy,zz,xy,yz,zx, reordered here to the
standard Voigt order xx,yy,zz,yz,xz,xy), ``spg_number``, ``spg_symbol``, ``crys``,
``optb88vdw_total_energy``, ``formation_energy_peratom``, ``bulk_modulus_kv``,
``shear_modulus_gv``, ``epsx/epsy/epsz``, ``dfpt_piezo_max_eij``, ``dfpt_piezo_max_dielectric``.
Missing values are the string ``"na"`` in dft_3d and become NaN.

Frame caveat: JARVIS computes elastic tensors on the conventional standard cell; the structure
stored with the entry may be another setting of the same crystal. ``symmetry_residual`` in the
table (|R.C - C| / |C| over the structure's point group) flags entries whose tensor is not
expressed in the structure's Cartesian frame.
"""
from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np

from . import common

FILE_ID = "38521619"
ZIP_NAME = "jdft_3d-12-12-2022.json.zip"
MEMBER = "jdft_3d-12-12-2022.json"
# SHA-256 of the figshare file as pinned (identically) by two independent public projects; the
# file is 40,811,489 bytes with figshare MD5 fb3e1eb80339a70ff313af1c644c1777. Not downloaded here.
SHA256 = "d4c64660e9e1fa45c82bd8868a96ec10162195eed69636445972c05550d8d0d6"
BASE_URL = "https://ndownloader.figshare.com/files/"
ENV_BASE_URL = "REPROZOO_JARVIS_BASE_URL"
VERSION = "dft_3d 12-12-2022 (figshare 10.6084/m9.figshare.6815699, file 38521619)"

SURROGATE_PARAMS = {"elements": ["Cu", "Ni", "Al"], "elemental": ["fcc"], "ordered": ["B2", "L12"],
                    "n_ordered": 3, "n_random": 1, "n_distorted": 1, "random_sizes": [3]}


def _na(v):
    if v is None or (isinstance(v, str) and v.strip().lower() in ("na", "nan", "")):
        return float("nan")
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def url_for(params: dict) -> str:
    base = params.get("base_url") or os.environ.get(ENV_BASE_URL) or BASE_URL
    return base.rstrip("/") + "/" + FILE_ID


# --- the dft_3d format ---------------------------------------------------------------------------

def read_records(path: Path) -> list[dict]:
    """The JSON list of a dft_3d zip (or of the extracted JSON file)."""
    path = Path(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            member = MEMBER if MEMBER in names else next((n for n in names if n.endswith(".json")), None)
            if member is None:
                raise ValueError(f"{path}: no JSON member in the zip (members: {names})")
            return json.loads(z.read(member))
    return json.loads(path.read_text())


def record_structure(rec: dict):
    from pymatgen.core import Lattice, Structure

    at = rec["atoms"]
    return Structure(Lattice(np.asarray(at["lattice_mat"], float)), list(at["elements"]),
                     np.asarray(at["coords"], float), coords_are_cartesian=bool(at.get("cartesian", False)))


def record_tensor(rec: dict) -> np.ndarray | None:
    """The stiffness of a record in standard Voigt order (GPa), or None if absent/invalid."""
    et = rec.get("elastic_tensor")
    if not isinstance(et, list | tuple):
        return None
    try:
        c = np.asarray(et, dtype=float)
    except (TypeError, ValueError):
        return None
    if c.shape != (6, 6) or not np.all(np.isfinite(c)) or not np.any(c):
        return None
    return common.vasp_to_voigt(c)


def structure_to_record(jid: str, structure, c_voigt: np.ndarray, extra: dict | None = None) -> dict:
    """A dft_3d-style record (used for the offline surrogate and for test fixtures)."""
    inv = np.argsort(common.VASP_TO_VOIGT)  # standard -> VASP order
    c_vasp = np.asarray(c_voigt, float)[np.ix_(inv, inv)]
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    sga = SpacegroupAnalyzer(structure, symprec=1e-3)
    kv, gv = common.vrh_moduli(c_voigt)
    rec = {
        "jid": jid,
        "atoms": {"lattice_mat": structure.lattice.matrix.tolist(), "coords": structure.frac_coords.tolist(),
                  "elements": [s.specie.symbol for s in structure], "abc": list(structure.lattice.abc),
                  "angles": list(structure.lattice.angles), "cartesian": False, "props": [""] * len(structure)},
        "formula": structure.composition.reduced_formula, "spg_number": sga.get_space_group_number(),
        "spg_symbol": sga.get_space_group_symbol(), "crys": sga.get_crystal_system(),
        "elastic_tensor": np.round(c_vasp, 1).tolist(), "bulk_modulus_kv": round(kv, 3),
        "shear_modulus_gv": round(gv, 3),
        "optb88vdw_total_energy": "na", "formation_energy_peratom": "na", "epsx": "na", "epsy": "na", "epsz": "na",
        "dfpt_piezo_max_eij": "na", "dfpt_piezo_max_dielectric": "na",
    }
    rec.update(extra or {})
    return rec


def write_zip(records: list[dict], path: Path) -> Path:
    """Write records as jarvis-tools' figshare zip (one JSON member)."""
    from ...io import atomic_path

    with atomic_path(path) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(MEMBER, json.dumps(records))
    return Path(path)


# --- the dataset interface -----------------------------------------------------------------------

def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    from ..download import fetch

    raw_dir = Path(raw_dir)
    dest = raw_dir / ZIP_NAME
    if source == "remote":
        url = url_for(params)
        sha = params.get("sha256", SHA256)
        print(f"downloading JARVIS dft_3d from {url}", flush=True)
        fetch(url, dest, sha256=sha, timeout=params.get("timeout"))
        return {"version": VERSION, "url": url, "sha256": sha, "surrogate": False,
                "loader": "same file and parsing as jarvis-tools jarvis.db.figshare.data('dft_3d')"}
    if source == "path":
        if not path:
            raise ValueError("jarvis_dft_elastic: source 'path' needs data.paths.jarvis_dft_elastic")
        src = Path(path).expanduser()
        if not src.exists():
            raise FileNotFoundError(f"jarvis_dft_elastic: data.paths.jarvis_dft_elastic={src} does not exist")
        shutil.copyfile(src, dest if zipfile.is_zipfile(src) else raw_dir / MEMBER)
        return {"version": VERSION, "path": str(src), "surrogate": False}
    if source == "offline":
        from pymatgen.core import Structure

        from . import emt_elastic

        sp = {**SURROGATE_PARAMS, **(params.get("surrogate") or {})}
        recs, stats = emt_elastic.generate(sp, seed, progress=lambda m: print(m, flush=True))
        out = [structure_to_record(f"EMT-SURROGATE-{k}", Structure.from_dict(r["structure"]), np.array(r["C_voigt"]),
                                   {"optb88vdw_total_energy": r["energy_per_atom"]})
               for k, r in enumerate(recs)]
        write_zip(out, dest)
        return {"version": "surrogate: EMT cells in the dft_3d record format", "surrogate": True,
                "surrogate_note": "NOT JARVIS data: EMT elastic tensors of a few metal cells, for offline plumbing",
                "surrogate_params": sp, "n_surrogate": stats["n_structures"]}
    raise ValueError(f"jarvis_dft_elastic: unknown source '{source}'")


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    raw_dir = Path(raw_dir)
    src = raw_dir / ZIP_NAME if (raw_dir / ZIP_NAME).exists() else raw_dir / MEMBER
    seed = common.manifest_seed(raw_dir)
    records = read_records(src)
    n_total = len(records)
    usable = []
    for rec in records:
        c = record_tensor(rec)
        if c is not None and isinstance(rec.get("atoms"), dict):
            usable.append((str(rec.get("jid")), rec, c))
    usable.sort(key=lambda t: t[0])
    n_usable = len(usable)
    max_records = params.get("max_records")
    if max_records is not None and max_records < n_usable:
        pick = np.sort(np.random.default_rng(seed).choice(n_usable, size=int(max_records), replace=False))
        usable = [usable[k] for k in pick]
    ids, structures, cs, rows = [], [], [], []
    n_bad = 0
    for jid, rec, c in usable:
        try:
            s = record_structure(rec)
        except (KeyError, ValueError, TypeError):
            n_bad += 1
            continue
        ids.append(jid)
        structures.append(s)
        cs.append(c)
        spg = _na(rec.get("spg_number"))
        rows.append({"prototype": str(rec.get("crys", "")),
                     "energy_per_atom": _na(rec.get("optb88vdw_total_energy")),
                     "formation_energy_per_atom": _na(rec.get("formation_energy_peratom")),
                     "jarvis_spg_number": int(spg) if np.isfinite(spg) else -1,
                     "jarvis_spg_symbol": str(rec.get("spg_symbol", "")),
                     "jarvis_bulk_modulus_kv": _na(rec.get("bulk_modulus_kv")),
                     "jarvis_shear_modulus_gv": _na(rec.get("shear_modulus_gv")),
                     "epsx": _na(rec.get("epsx")), "epsy": _na(rec.get("epsy")), "epsz": _na(rec.get("epsz")),
                     "dfpt_piezo_max_eij": _na(rec.get("dfpt_piezo_max_eij")),
                     "dfpt_piezo_max_dielectric": _na(rec.get("dfpt_piezo_max_dielectric"))})
    if not ids:
        raise ValueError(f"jarvis_dft_elastic: no usable record with an elastic tensor in {src.name}")
    info = common.write_processed(out_dir, ids, structures, np.array(cs), rows, seed=seed)
    info["sizes"].update({"n_records_in_file": n_total, "n_with_elastic_tensor": n_usable, "n_unparseable": n_bad})
    info["voigt_order_note"] = "JARVIS/VASP order xx,yy,zz,xy,yz,zx reordered to xx,yy,zz,yz,xz,xy"
    return info


def preview(out_dir: Path, png: Path) -> None:
    common.preview(out_dir, png, "JARVIS-DFT elastic")


def load(out_dir: Path) -> common.CrystalTensorData:
    return common.load(out_dir)
