"""mp_elastic: Materials Project elasticity documents through mp-api.

Remote: ``mp_api.client.MPRester(api_key=...).materials.elasticity.search(...)`` with the key read
from the environment variable ``MP_API_KEY`` only. The key is never printed, logged, written to
the raw files or the card, and is scrubbed from any error message raised while talking to the
server. mp-api is not a pinned dependency (install ``mp-api==0.46.5`` for this source); the
module imports it only when the remote source runs.

Path: ``data.paths.mp_elastic`` names a JSON file holding a list of elasticity documents as
mp-api returns them (``doc.model_dump()``), or records already in this module's raw format.

Offline: a SURROGATE (card ``surrogate: true``): a few EMT cells from :mod:`.emt_elastic` written
as elasticity documents and converted by the same code; not Materials Project data.

Document fields used (emmet ``ElasticityDoc``): ``material_id``, ``formula_pretty``, ``structure``,
``elastic_tensor.raw`` (GPa, in the orientation of ``structure``: the target paired with the
structure), ``elastic_tensor.ieee_format`` (kept as ``C_voigt_ieee``), ``bulk_modulus.vrh``,
``shear_modulus.vrh``, ``symmetry`` (symbol, number, crystal_system), ``state``. Older documents
with ``elasticity.elastic_tensor`` are understood too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from . import common

ENV_KEY = "MP_API_KEY"
MP_API_PIN = "mp-api==0.46.5"
FIELDS = ["material_id", "formula_pretty", "structure", "elastic_tensor", "bulk_modulus", "shear_modulus",
          "symmetry", "state"]
RAW_NAME = "mp_elasticity.json"
SURROGATE_PARAMS = {"elements": ["Cu", "Ni", "Al"], "elemental": ["fcc"], "ordered": ["B2", "L12"],
                    "n_ordered": 3, "n_random": 1, "n_distorted": 1, "random_sizes": [3]}


class MissingAPIKey(RuntimeError):
    pass


def api_key() -> str:
    key = os.environ.get(ENV_KEY, "").strip()
    if not key:
        raise MissingAPIKey(f"mp_elastic (source remote) needs a Materials Project API key in the environment "
                            f"variable {ENV_KEY} (get one at materialsproject.org > dashboard); it is read from "
                            f"there only and never written to logs or cards")
    return key


def _scrub(text: str, key: str) -> str:
    return text.replace(key, "***") if key else text


def _plain(obj: Any) -> Any:
    """pydantic model / pymatgen object / MSONable -> plain dicts and lists."""
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    if hasattr(obj, "model_dump"):
        return _plain(obj.model_dump())
    if hasattr(obj, "as_dict") and not isinstance(obj, dict):
        return obj.as_dict()
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "value") and hasattr(obj, "name"):  # enums (state, crystal system)
        return obj.value
    return str(obj)  # MPID and friends


def doc_to_record(doc: Any) -> dict | None:
    """One elasticity document (pydantic model or dict) -> this module's raw record; None if unusable."""
    d = _plain(doc)
    if str(d.get("state") or "successful").lower() not in ("successful", "status.successful"):
        return None
    et = d.get("elastic_tensor")
    if et is None and isinstance(d.get("elasticity"), dict):  # legacy documents
        et = {"raw": d["elasticity"].get("elastic_tensor_original") or d["elasticity"].get("elastic_tensor"),
              "ieee_format": d["elasticity"].get("elastic_tensor")}
    if not isinstance(et, dict):
        return None
    raw = et.get("raw") if et.get("raw") is not None else et.get("ieee_format")
    if raw is None or d.get("structure") is None:
        return None
    c = np.asarray(raw, dtype=float)
    if c.shape != (6, 6) or not np.all(np.isfinite(c)):
        return None
    sym = d.get("symmetry") or {}
    bulk = d.get("bulk_modulus") or {}
    shear = d.get("shear_modulus") or {}
    ieee = et.get("ieee_format")
    return {
        "id": str(d.get("material_id")), "formula_pretty": d.get("formula_pretty"),
        "structure": d["structure"], "C_voigt": c.tolist(),
        "C_voigt_ieee": np.asarray(ieee, float).tolist() if ieee is not None else None,
        "mp_k_vrh": bulk.get("vrh") if isinstance(bulk, dict) else None,
        "mp_g_vrh": shear.get("vrh") if isinstance(shear, dict) else None,
        "mp_spacegroup_symbol": sym.get("symbol"), "mp_spacegroup_number": sym.get("number"),
        "mp_crystal_system": sym.get("crystal_system"),
    }


def structure_to_doc(material_id: str, structure, c_voigt: np.ndarray) -> dict:
    """An ElasticityDoc-shaped dict (offline surrogate and test fixtures)."""
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    sga = SpacegroupAnalyzer(structure, symprec=1e-3)
    k, g = common.vrh_moduli(c_voigt)
    return {"material_id": material_id, "formula_pretty": structure.composition.reduced_formula,
            "structure": structure.as_dict(), "state": "successful",
            "elastic_tensor": {"raw": np.asarray(c_voigt, float).tolist(),
                               "ieee_format": np.round(np.asarray(c_voigt, float)).tolist()},
            "bulk_modulus": {"voigt": None, "reuss": None, "vrh": k},
            "shear_modulus": {"voigt": None, "reuss": None, "vrh": g},
            "symmetry": {"symbol": sga.get_space_group_symbol(), "number": sga.get_space_group_number(),
                         "crystal_system": sga.get_crystal_system().capitalize()}}


def search(key: str, params: dict) -> list:
    try:
        from mp_api.client import MPRester
    except ImportError as exc:
        raise RuntimeError(f"mp_elastic (source remote) needs mp-api: pip install {MP_API_PIN}") from exc
    kwargs: dict[str, Any] = {"fields": list(params.get("fields", FIELDS))}
    if params.get("max_docs") is not None:
        kwargs.update(num_chunks=1, chunk_size=int(params["max_docs"]))
    try:
        with MPRester(api_key=key) as mpr:
            return list(mpr.materials.elasticity.search(**kwargs))
    except Exception as exc:  # noqa: BLE001 - re-raised without the key and without the chained original
        raise RuntimeError(f"Materials Project query failed: {_scrub(f'{type(exc).__name__}: {exc}', key)}") from None


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    from ...io import atomic_path

    raw_dir = Path(raw_dir)
    info: dict[str, Any]
    if source == "remote":
        key = api_key()
        docs = search(key, params)
        records = [r for r in (doc_to_record(d) for d in docs) if r is not None]
        try:
            import mp_api

            ver = getattr(mp_api, "__version__", "unknown")
        except ImportError:  # pragma: no cover
            ver = "unknown"
        info = {"version": f"mp-api {ver}", "n_docs": len(docs), "surrogate": False,
                "api_key": f"read from ${ENV_KEY} (not recorded)"}
    elif source == "path":
        if not path or not Path(path).expanduser().exists():
            raise FileNotFoundError(f"mp_elastic: data.paths.mp_elastic={path} does not exist")
        docs = json.loads(Path(path).expanduser().read_text())
        records = [r if "C_voigt" in r else doc_to_record(r) for r in docs]
        records = [r for r in records if r is not None]
        info = {"path": str(path), "n_docs": len(docs), "surrogate": False}
    elif source == "offline":
        from pymatgen.core import Structure

        from . import emt_elastic

        sp = {**SURROGATE_PARAMS, **(params.get("surrogate") or {})}
        recs, stats = emt_elastic.generate(sp, seed, progress=lambda m: print(m, flush=True))
        docs = [structure_to_doc(f"emt-surrogate-{k}", Structure.from_dict(r["structure"]), np.array(r["C_voigt"]))
                for k, r in enumerate(recs)]
        records = [r for r in (doc_to_record(d) for d in docs) if r is not None]
        info = {"version": "surrogate: EMT cells as elasticity documents", "surrogate": True,
                "surrogate_note": "NOT Materials Project data: EMT elastic tensors of a few metal cells, "
                                  "for offline plumbing",
                "surrogate_params": sp, "n_docs": len(docs)}
    else:
        raise ValueError(f"mp_elastic: unknown source '{source}'")
    with atomic_path(raw_dir / RAW_NAME) as tmp:
        tmp.write_text(json.dumps(records))
    info["n_records"] = len(records)
    return info


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    from pymatgen.core import Structure

    raw_dir = Path(raw_dir)
    seed = common.manifest_seed(raw_dir)
    records = sorted(json.loads((raw_dir / RAW_NAME).read_text()), key=lambda r: r["id"])
    n_all = len(records)
    max_docs = params.get("max_docs")
    if max_docs is not None and max_docs < n_all:
        pick = np.sort(np.random.default_rng(seed).choice(n_all, size=int(max_docs), replace=False))
        records = [records[k] for k in pick]
    if not records:
        raise ValueError("mp_elastic: no usable elasticity document")
    structures = [Structure.from_dict(r["structure"]) for r in records]
    rows = [{"prototype": str(r.get("mp_crystal_system") or ""),
             "mp_k_vrh": float(r["mp_k_vrh"] if r.get("mp_k_vrh") is not None else np.nan),
             "mp_g_vrh": float(r["mp_g_vrh"] if r.get("mp_g_vrh") is not None else np.nan),
             "mp_spacegroup_symbol": str(r.get("mp_spacegroup_symbol") or ""),
             "mp_spacegroup_number": int(r.get("mp_spacegroup_number") or -1)} for r in records]
    ieee = np.array([r["C_voigt_ieee"] if r.get("C_voigt_ieee") is not None else np.full((6, 6), np.nan)
                     for r in records], dtype=float).reshape(-1, 6, 6)
    info = common.write_processed(out_dir, [r["id"] for r in records], structures,
                                  np.array([r["C_voigt"] for r in records]).reshape(-1, 6, 6), rows, seed=seed,
                                  extra_arrays={"C_voigt_ieee": ieee})
    info["sizes"]["n_documents"] = n_all
    info["tensor_frame_note"] = ("C_voigt = elastic_tensor.raw (orientation of the stored structure); "
                                 "IEEE form in C_voigt_ieee")
    return info


def preview(out_dir: Path, png: Path) -> None:
    common.preview(out_dir, png, "Materials Project elastic")


def load(out_dir: Path) -> common.CrystalTensorData:
    return common.load(out_dir)
