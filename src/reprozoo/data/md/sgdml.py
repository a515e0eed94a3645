"""sGDML benchmark molecules: MD17 (aspirin), revised MD17 (aspirin), MD22 (Ac-Ala3-NHMe).

Sources
- ``remote``: the published files. MD17/MD22 are single ``.npz`` files on quantum-machine.org in
  the sGDML key layout (R, z, E, F, name, theory, md5, ...; kcal/mol and Angstrom). Revised MD17
  is one 1 GB ``rmd17.tar.bz2`` on figshare; only ``rmd17/npz_data/rmd17_aspirin.npz`` is
  extracted (keys nuclear_charges, coords, energies, forces, old_indices, ...), the archive is
  deleted afterwards unless ``keep_archive``. Base URL overridable (``base_url``; or ``url``).
- ``path``: a folder (or file) the user already has: the npz, or for rMD17 the npz or the archive.
- ``offline`` (default): a clearly labelled surrogate, the same molecule on a classical valence
  force field (see surrogate.py), written in the same raw layout and processed by the same code.

Checksums: the rMD17 archive and its aspirin member are pinned (sha256 and size). No sha256 for
the MD17 and MD22 npz files could be confirmed offline, so they are verified by structure (keys,
atom count, composition, frame count); the computed sha256 is printed and stored in the card
(``checksum_pinned: false``) and should be pinned in CATALOGUE on first real download.

Processed: frames.npz / frames.parquet in the common MD layout (eV, Angstrom, eV/A), optionally
subsampled to ``n_frames`` (random, sorted, reproducible); ``source_index`` keeps each frame's
index in the original file.
"""
from __future__ import annotations

import os
import shutil
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ...io import save_npz, write_json
from ..download import DownloadError, fetch, sha256_file
from . import frames as fmt

VERSION = "sgdml-1"
KCAL_PER_MOL = 0.04336410390059322  # eV, = ase.units.kcal / ase.units.mol (CODATA 2014)
QM = "http://www.quantum-machine.org/gdml"

CATALOGUE: dict[str, dict[str, Any]] = {
    "md17_aspirin": {
        "kind": "npz", "url": f"{QM}/data/npz/md17_aspirin.npz", "file": "md17_aspirin.npz",
        "sha256": None, "layout": "sgdml", "molecule": "aspirin", "formula": "C9H8O4", "n_atoms": 21,
        "n_frames": 211762, "surrogate": "aspirin",
        "citation": "Chmiela et al., Sci. Adv. 3, e1603015 (2017)", "homepage": "http://www.sgdml.org/#datasets"},
    "rmd17_aspirin": {
        "kind": "tar_member", "url": "https://figshare.com/ndownloader/files/23950376", "file": "rmd17.tar.bz2",
        "sha256": "cddeea2ec2c4b22a9de16a9a65a3eeedac5b29da9c99c20bbff0153912bf922b", "bytes": 1066301513,
        "member": "rmd17/npz_data/rmd17_aspirin.npz",
        "member_sha256": "6efe3d2454c1a9215efe2bf271c58084ae556afa188a740ae06955bf43456ee8",
        "member_bytes": 153601803, "layout": "rmd17", "molecule": "aspirin", "formula": "C9H8O4",
        "n_atoms": 21, "n_frames": 100000, "surrogate": "aspirin",
        "citation": "Christensen & von Lilienfeld, Mach. Learn.: Sci. Technol. 1, 045018 (2020)",
        "homepage": "https://doi.org/10.6084/m9.figshare.12672038", "license": "CC0"},
    "md22_ac_ala3": {
        "kind": "npz", "url": f"{QM}/repo/datasets/md22_Ac-Ala3-NHMe.npz", "file": "md22_Ac-Ala3-NHMe.npz",
        "sha256": None, "layout": "sgdml", "molecule": "Ac-Ala3-NHMe", "formula": "C12H22N4O4", "n_atoms": 42,
        "n_frames": 85109, "surrogate": "ac_ala3_nhme",
        "citation": "Chmiela et al., Sci. Adv. 9, eadf0873 (2023)", "homepage": "http://www.sgdml.org/#datasets"},
}

LAYOUTS = {  # our name -> key in the raw file
    "sgdml": {"R": "R", "z": "z", "E": "E", "F": "F"},
    "rmd17": {"R": "coords", "z": "nuclear_charges", "E": "energies", "F": "forces"},
}
ENERGY_UNITS = {"kcal/mol": KCAL_PER_MOL, "ev": 1.0, "ha": 27.211386245988, "hartree": 27.211386245988,
                "kj/mol": KCAL_PER_MOL / 4.184}
LENGTH_UNITS = {"ang": 1.0, "angstrom": 1.0, "a": 1.0, "bohr": 0.529177210903}


def entry(params: dict) -> dict:
    """The catalogue entry of a dataset with the overrides given in its parameters."""
    e = dict(CATALOGUE[params["entry"]])
    for k in ("sha256", "member_sha256", "bytes", "member_bytes"):
        if k in params:
            e[k] = params[k]
    if "expect_frames" in params:  # frame count of the source file (null: do not check)
        e["n_frames"] = params["expect_frames"]
    if params.get("url"):
        e["url"] = params["url"]
    elif params.get("base_url"):
        e["url"] = params["base_url"].rstrip("/") + "/" + e["file"]
    return e


# --- validation ------------------------------------------------------------------------------

def _formula(z) -> str:
    from ase import Atoms

    return Atoms(numbers=np.asarray(z, int)).get_chemical_formula(mode="hill")


def validate(npz_path: Path, e: dict) -> dict:
    """Check keys, shapes, composition and (when known) frame count; return a summary."""
    keys = LAYOUTS[e["layout"]]
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            missing = [v for v in keys.values() if v not in z.files]
            if missing:
                raise DownloadError(f"{npz_path.name}: keys {missing} missing (found {sorted(z.files)}); "
                                    f"not the {e['layout']} layout")
            zz = np.asarray(z[keys["z"]]).reshape(-1)
            shape_r = z[keys["R"]].shape
            shape_f = z[keys["F"]].shape
            n_e = np.asarray(z[keys["E"]]).reshape(-1).shape[0]
    except DownloadError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a bad download
        raise DownloadError(f"{npz_path.name}: not a readable npz ({exc})") from exc
    n = e["n_atoms"]
    problems = []
    if zz.shape[0] != n or shape_r[1:] != (n, 3) or shape_f != shape_r or n_e != shape_r[0]:
        problems.append(f"shapes z{zz.shape} R{shape_r} F{shape_f} E({n_e},) for {n} atoms")
    if _formula(zz) != e["formula"]:
        problems.append(f"composition {_formula(zz)} != {e['formula']}")
    if e.get("n_frames") and shape_r[0] != e["n_frames"]:
        problems.append(f"{shape_r[0]} frames, expected {e['n_frames']}")
    if problems:
        raise DownloadError(f"{npz_path.name} does not look like {e['molecule']} ({'; '.join(problems)})")
    return {"n_frames_source": int(shape_r[0]), "n_atoms": int(n), "formula": e["formula"]}


# --- remote / path ---------------------------------------------------------------------------

def extract_member(archive: Path, member: str, dest: Path, sha256: str | None = None) -> Path:
    """Stream ``member`` out of a tar archive (any compression) into ``dest``; nothing else is
    extracted, and ``dest`` appears only complete and (if pinned) with the right checksum."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    want = PurePosixPath(member)
    try:
        with tarfile.open(archive, "r|*") as tar:
            for info in tar:
                name = PurePosixPath(info.name.lstrip("./"))
                if name == want or (name.name == want.name and "npz_data" in name.parts):
                    if not info.isfile():
                        raise DownloadError(f"{member} in {archive.name} is not a regular file")
                    src = tar.extractfile(info)
                    with src, open(tmp, "wb") as fh:
                        shutil.copyfileobj(src, fh, length=1 << 20)
                    break
            else:
                raise DownloadError(f"{member} not found in {archive.name}")
        if sha256:
            actual = sha256_file(tmp)
            if actual != sha256:
                raise DownloadError(f"checksum mismatch for {member} extracted from {archive.name}: "
                                    f"expected sha256 {sha256}, got {actual}")
        os.replace(tmp, dest)
        return dest
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DownloadError(f"could not extract {member} from {archive.name}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def _fetch_kw(params: dict) -> dict:
    return {"retries": int(params.get("retries", 3)), "backoff": float(params.get("backoff", 1.0)),
            "timeout": params.get("timeout")}


def _remote(e: dict, params: dict, raw_dir: Path) -> tuple[Path, dict]:
    info: dict[str, Any] = {"url": e["url"], "citation": e["citation"], "homepage": e["homepage"]}
    if e["kind"] == "npz":
        dest = raw_dir / e["file"]
        fetch(e["url"], dest, e.get("sha256"), **_fetch_kw(params))
        actual = sha256_file(dest)
        try:
            info.update(validate(dest, e))
        except DownloadError:
            dest.unlink(missing_ok=True)
            raise
        info.update({"sha256": actual, "bytes": dest.stat().st_size, "checksum_pinned": bool(e.get("sha256"))})
        if not e.get("sha256"):
            info["checksum_note"] = ("no published sha256 could be confirmed: the file was verified by structure "
                                     "(keys, atoms, composition, frame count); pin this sha256 in "
                                     "reprozoo/data/md/sgdml.py CATALOGUE after checking it")
            print(f"sha256 of {e['file']}: {actual} (pin it in CATALOGUE['{params['entry']}'])", flush=True)
        return dest, info
    # one member of an archive
    dest = raw_dir / PurePosixPath(e["member"]).name
    if not (dest.exists() and e.get("member_sha256") and sha256_file(dest) == e["member_sha256"]):
        archive = raw_dir / e["file"]
        fetch(e["url"], archive, e.get("sha256"), **_fetch_kw(params))
        info["archive_sha256"] = sha256_file(archive)
        try:
            extract_member(archive, e["member"], dest, e.get("member_sha256"))
        finally:
            if not params.get("keep_archive", False):
                archive.unlink(missing_ok=True)
    try:
        info.update(validate(dest, e))
    except DownloadError:
        dest.unlink(missing_ok=True)
        raise
    info.update({"member": e["member"], "sha256": sha256_file(dest), "bytes": dest.stat().st_size,
                 "checksum_pinned": bool(e.get("member_sha256")), "archive_sha256_pinned": e.get("sha256")})
    return dest, info


def _from_path(e: dict, path: str, raw_dir: Path) -> tuple[Path, dict]:
    p = Path(path).expanduser()
    names = [e["file"]] + ([PurePosixPath(e["member"]).name] if e["kind"] == "tar_member" else [])
    cands = [p] if p.is_file() else [c for n in names for c in sorted(p.rglob(n))]
    if not cands:
        raise FileNotFoundError(f"none of {names} found under {p}")
    src = cands[0]
    if src.name.endswith((".tar", ".tar.bz2", ".tar.gz", ".tar.xz", ".tgz")):
        dest = raw_dir / PurePosixPath(e["member"]).name
        extract_member(src, e["member"], dest, e.get("member_sha256"))
    else:
        dest = raw_dir / src.name
        if dest.exists() or dest.is_symlink():
            dest.unlink()
        try:
            dest.symlink_to(src.resolve())
        except OSError:
            shutil.copyfile(src, dest)
    pinned = e.get("member_sha256") if e["kind"] == "tar_member" else e.get("sha256")
    actual = sha256_file(dest)
    if pinned and actual != pinned:
        dest.unlink(missing_ok=True)
        raise DownloadError(f"checksum mismatch for {src}: expected sha256 {pinned}, got {actual}")
    info = validate(dest, e)
    info.update({"path": str(src), "sha256": actual, "checksum_pinned": bool(pinned), "citation": e["citation"]})
    return dest, info


# --- offline surrogate -----------------------------------------------------------------------

def _surrogate(e: dict, params: dict, raw_dir: Path, seed: int) -> tuple[Path, dict]:
    from . import surrogate

    s = {"n_frames": 200, "stride": 5, "temperature_K": 500.0, "timestep_fs": 0.5, "friction_per_fs": 0.02,
         "equilibrate": 400, **(params.get("surrogate") or {})}
    out = surrogate.simulate(e["surrogate"], int(s["n_frames"]), int(s["stride"]), float(s["temperature_K"]),
                             float(s["timestep_fs"]), float(s["friction_per_fs"]), int(s["equilibrate"]),
                             np.random.default_rng(seed))
    keys = LAYOUTS[e["layout"]]
    raw = {keys["R"]: out["R"], keys["z"]: out["z"], keys["E"]: out["E"] / KCAL_PER_MOL,
           keys["F"]: out["F"] / KCAL_PER_MOL, "T": out["T"], "bonds": out["bonds"]}
    if e["layout"] == "sgdml":
        raw.update({"name": np.array(f"surrogate {e['molecule']}"), "theory": np.array("valence force field"),
                    "type": np.array("d"), "e_unit": np.array("kcal/mol"), "r_unit": np.array("Ang")})
    dest = raw_dir / f"surrogate_{e['file'] if e['kind'] == 'npz' else PurePosixPath(e['member']).name}"
    save_npz(dest, **raw)
    info = validate(dest, {**e, "n_frames": None})
    info.update({"surrogate": True, "surrogate_model": "Morse bonds + cosine angles + harmonic 1-4 (surrogate.py)",
                 "surrogate_params": s,
                 "surrogate_note": (f"OFFLINE STAND-IN, not {params['entry']}: same molecule and topology, classical "
                                    "force field; for plumbing, not for comparison with published numbers")})
    return dest, info


# --- dataset interface -----------------------------------------------------------------------

def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    raw_dir = Path(raw_dir)
    e = entry(params)
    tic = time.perf_counter()
    if source == "remote":
        dest, info = _remote(e, params, raw_dir)
        info["surrogate"] = False
    elif source == "path":
        if not path:
            raise ValueError("source 'path' needs data.paths.<dataset>")
        dest, info = _from_path(e, path, raw_dir)
        info["surrogate"] = False
    elif source == "offline":
        dest, info = _surrogate(e, params, raw_dir, seed)
    else:
        raise ValueError(f"unknown source {source!r}")
    write_json(raw_dir / "raw_meta.json", {"seed": seed, "raw_file": dest.name, "layout": e["layout"],
                                           "molecule": e["molecule"], "surrogate": info["surrogate"]})
    return {"version": VERSION, "entry": params["entry"], "molecule": e["molecule"],
            "seconds": round(time.perf_counter() - tic, 2), **info}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    raw_dir = Path(raw_dir)
    meta = fmt.read_raw_meta(raw_dir)
    keys = LAYOUTS[meta["layout"]]
    with np.load(raw_dir / meta["raw_file"], allow_pickle=False) as z:
        n_src = z[keys["R"]].shape[0]
        n_want = params.get("n_frames")
        rng = np.random.default_rng(int(meta.get("seed", 0)))
        idx = np.arange(n_src) if not n_want or n_want >= n_src else np.sort(rng.choice(n_src, int(n_want), replace=False))
        e_unit = str(z["e_unit"]).lower() if "e_unit" in z.files else "kcal/mol"
        r_unit = str(z["r_unit"]).lower() if "r_unit" in z.files else "ang"
        ef, rf = ENERGY_UNITS[e_unit], LENGTH_UNITS[r_unit]
        R = np.asarray(z[keys["R"]][idx], np.float64) * rf
        E = np.asarray(z[keys["E"]], np.float64).reshape(-1)[idx] * ef
        Fo = np.asarray(z[keys["F"]][idx], np.float64) * (ef / rf)
        numbers = np.asarray(z[keys["z"]], np.int64).reshape(-1)
        T = np.asarray(z["T"], float)[idx] if "T" in z.files else np.full(len(idx), np.nan)
        extras = {"source_index": idx.astype(np.int64)}
        if "old_indices" in z.files:
            extras["md17_index"] = np.asarray(z["old_indices"]).reshape(-1)[idx].astype(np.int64)
        if "bonds" in z.files:
            extras["bonds"] = np.asarray(z["bonds"], np.int64)
    F = len(idx)
    arrays = {"positions": R, "numbers": numbers, "cells": np.zeros((F, 3, 3)), "pbc": np.zeros(3, bool),
              "energy": E, "forces": Fo, "n_atoms": np.full(F, len(numbers), np.int64),
              "system": np.zeros(F, np.int64), "system_names": np.array([meta["molecule"]], dtype=str), **extras}
    table = {"temperature": T, "split": fmt.assign_splits(arrays["system"], params.get("split", (0.8, 0.1, 0.1)),
                                                          int(meta.get("seed", 0)) + 1),
             "source_index": idx}
    out = fmt.write(out_dir, arrays, table, meta={"molecule": meta["molecule"], "surrogate": bool(meta.get("surrogate")),
                                                  "n_frames_source": int(n_src)})
    out["sizes"]["n_frames_source"] = int(n_src)
    out["unit_conversion"] = {"energy_unit_raw": e_unit, "length_unit_raw": r_unit, "energy_factor_to_eV": ef}
    out["surrogate"] = bool(meta.get("surrogate", False))
    return out


def preview(out_dir: Path, png: Path) -> None:
    fmt.preview(out_dir, png)


def load(out_dir: Path) -> fmt.MDFrames:
    return fmt.load(out_dir)
