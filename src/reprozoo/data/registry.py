"""Dataset registry: every ``reprozoo/data/<family>/datasets.yaml`` lists datasets of a family.

Each entry names the module that implements it and its parameters per scale. Like the method
registry it is read without importing the implementation, so Snakemake builds its DAG quickly.

A dataset module provides::

    acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None) -> dict
        # write raw files into raw_dir; return card fields (source, version, checksums, ...)
    preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict
        # write processed arrays/tables into out_dir; return {"files": [...], "sizes": {...}}
    preview(out_dir: Path, png: Path) -> None
        # a plot a person can glance at
    load(out_dir: Path) -> object            # what methods consume (optional)
"""
from __future__ import annotations

import copy
import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).resolve().parent
SOURCES = ("offline", "remote", "path")
# software environment (envs/<name>.yaml) of each family's acquire/preprocess rules; a dataset may
# override it with an `env:` key in its datasets.yaml entry
FAMILY_ENVS = {"eeg": "eeg", "md": "atomistic", "crystals": "atomistic", "pde": "torch", "timeseries": "torch",
               "synthetic": "core"}


# keys a user may set in data.params.<dataset> though no scale lists them: a mirror, and the download
# deadline in seconds per file (reprozoo.data.download.fetch; default DEFAULT_TIMEOUT there)
EXTRA_PARAMS = ("base_url", "url", "timeout")


class DatasetError(ValueError):
    pass


@dataclass
class DatasetSpec:
    name: str
    family: str
    description: str
    module_name: str
    sources: list[str]
    scales: dict[str, dict[str, Any]]
    seed: int = 0
    env: str = "core"

    def params(self, scale: str, overrides: dict | None = None) -> dict[str, Any]:
        """Parameters at ``scale`` with the user's ``data.params.<name>`` overrides applied."""
        if scale not in self.scales:
            raise DatasetError(f"dataset '{self.name}' has no parameters for scale '{scale}'; "
                               f"allowed: {sorted(self.scales)}")
        params = copy.deepcopy(self.scales[scale])
        for key, value in (overrides or {}).items():
            if key not in params and key not in EXTRA_PARAMS:
                raise DatasetError(f"config key 'data.params.{self.name}.{key}': unknown parameter; "
                                   f"allowed: {sorted(params) + list(EXTRA_PARAMS)}")
            params[key] = value
        return params

    def module(self):
        return importlib.import_module(self.module_name)


@functools.lru_cache(maxsize=1)
def _all() -> dict[str, DatasetSpec]:
    specs: dict[str, DatasetSpec] = {}
    for path in sorted(DATA_DIR.glob("*/datasets.yaml")):
        family = path.parent.name
        for name, raw in (yaml.safe_load(path.read_text()) or {}).items():
            if name in specs:
                raise DatasetError(f"dataset '{name}' defined twice ({path})")
            sources = raw.get("sources", ["offline"])
            bad = [s for s in sources if s not in SOURCES]
            if bad:
                raise DatasetError(f"{path}: dataset '{name}' sources {bad} not in {SOURCES}")
            specs[name] = DatasetSpec(name=name, family=family, description=raw.get("description", ""),
                                      module_name=raw["module"], sources=sources,
                                      scales=raw.get("scales", {}), seed=raw.get("seed", 0),
                                      env=raw.get("env", FAMILY_ENVS.get(family, "core")))
    return specs


def names() -> list[str]:
    return list(_all())


def get(name: str) -> DatasetSpec:
    specs = _all()
    if name not in specs:
        raise DatasetError(f"unknown dataset '{name}'; known datasets: {', '.join(specs)}")
    return specs[name]


def source_for(name: str, data_config: dict) -> str:
    spec = get(name)
    src = data_config.get("sources", {}).get(name) or data_config.get("source", "offline")
    if src == "remote" and "remote" not in spec.sources:
        # a global "remote" switch falls back to offline for datasets with no public source
        if name not in data_config.get("sources", {}):
            return "offline"
    if src not in spec.sources:
        raise DatasetError(f"config key 'data.sources.{name}': source '{src}' not available; "
                           f"allowed: {spec.sources}")
    if src == "path" and name not in data_config.get("paths", {}):
        raise DatasetError(f"config key 'data.paths.{name}' is required when its source is 'path'")
    return src


def buildable(name: str, data_config: dict) -> bool:
    """Whether ``name`` can be built with the configured sources (no user path missing)."""
    try:
        source_for(name, data_config)
        return True
    except DatasetError:
        return False
