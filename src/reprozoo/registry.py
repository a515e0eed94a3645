"""Method registry: every folder under ``reprozoo/methods/`` with a ``spec.yaml`` is a method.

Discovery is by folder, not by import, so that Snakemake can build the whole DAG
(variants, seeds, datasets, resources) without importing torch or any method code.
Adding a method therefore means adding one folder; no workflow file changes.
"""
from __future__ import annotations

import copy
import functools
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

METHODS_DIR = Path(__file__).resolve().parent / "methods"
SCALES = ("ci", "smoke", "paper")
ENVS_DIR = Path(__file__).resolve().parents[2] / "envs"


class RegistryError(ValueError):
    """A method folder or a name given by the user does not fit the registry."""


@dataclass(frozen=True)
class Variant:
    id: str
    role: str  # "method" or "baseline"
    description: str = ""


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    expr: str
    op: str
    threshold: float
    paper_value: Any = None
    unit: str = ""


@dataclass
class MethodSpec:
    id: str
    title: str
    paper: str
    wave: str
    datasets_by_scale: dict[str, list[str]]
    variants: list[Variant]
    claims: list[Claim]
    env: str
    resources: dict[str, dict[str, Any]]
    train_shared: bool
    folder: Path
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def datasets_for(self, scale: str) -> list[str]:
        """Datasets the method reads at ``scale`` (spec ``datasets``: a list, or a mapping with
        ``default`` and per-scale entries, e.g. offline EMT data for smoke and MD17 for paper)."""
        return list(self.datasets_by_scale.get(scale, self.datasets_by_scale.get("default", [])))

    @property
    def datasets(self) -> list[str]:
        """Every dataset the method may read, over all scales."""
        return sorted({d for ds in self.datasets_by_scale.values() for d in ds})

    @property
    def variant_ids(self) -> list[str]:
        return [v.id for v in self.variants]

    def config(self, scale: str) -> dict[str, Any]:
        if scale not in self.configs:
            raise RegistryError(
                f"method '{self.id}' has no config for scale '{scale}'; allowed: {sorted(self.configs)}"
            )
        return copy.deepcopy(self.configs[scale])

    def resources_for(self, scale: str) -> dict[str, Any]:
        base = {"threads": 1, "mem_mb": 2000, "runtime": 10, "gpu": 0}
        base.update(self.resources.get("default", {}))
        base.update(self.resources.get(scale, {}))
        return base

    def module(self):
        """Import the method's code (only inside jobs: it may pull in torch)."""
        return importlib.import_module(f"reprozoo.methods.{self.id}.method")


REQUIRED_KEYS = ("id", "title", "paper", "wave", "datasets", "variants", "claims", "env")
OPS = ("<=", "<", ">=", ">")


def _load_spec(folder: Path) -> MethodSpec:
    raw = yaml.safe_load((folder / "spec.yaml").read_text())
    where = f"{folder / 'spec.yaml'}"
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise RegistryError(f"{where}: missing keys {missing}")
    if raw["id"] != folder.name:
        raise RegistryError(f"{where}: id '{raw['id']}' must equal the folder name '{folder.name}'")
    variants = [Variant(**v) for v in raw["variants"]]
    roles = {v.role for v in variants}
    if not roles <= {"method", "baseline"} or "method" not in roles:
        raise RegistryError(f"{where}: variants need role 'method' or 'baseline', and at least one 'method'")
    claims = []
    for c in raw["claims"]:
        if c.get("op") not in OPS:
            raise RegistryError(f"{where}: claim '{c.get('id')}' op must be one of {OPS}")
        try:
            c["threshold"] = float(c["threshold"])  # YAML 1.1 reads 1.0e6 as a string
        except (KeyError, TypeError, ValueError):
            raise RegistryError(f"{where}: claim '{c.get('id')}' needs a numeric threshold") from None
        claims.append(Claim(**c))
    ds = raw["datasets"]
    if isinstance(ds, list):
        ds = {"default": ds}
    if not isinstance(ds, dict) or not set(ds) <= {"default", *SCALES}:
        raise RegistryError(f"{where}: datasets must be a list or a mapping with keys default/{'/'.join(SCALES)}")
    env = raw["env"]
    if not (ENVS_DIR / f"{env}.yaml").exists():
        raise RegistryError(f"{where}: env '{env}' has no file envs/{env}.yaml")
    configs = {}
    for scale in SCALES:
        path = folder / "configs" / f"{scale}.yaml"
        if not path.exists():
            raise RegistryError(f"{where}: missing configs/{scale}.yaml (every method needs {SCALES})")
        configs[scale] = yaml.safe_load(path.read_text()) or {}
    return MethodSpec(
        id=raw["id"], title=raw["title"], paper=raw["paper"], wave=raw["wave"],
        datasets_by_scale={k: list(v) for k, v in ds.items()}, variants=variants, claims=claims, env=env,
        resources=raw.get("resources", {}), train_shared=bool(raw.get("train_shared", False)),
        folder=folder, configs=configs,
    )


_BROKEN: dict[str, RegistryError] = {}


@functools.lru_cache(maxsize=1)
def _all() -> dict[str, MethodSpec]:
    """Every method folder that loads. A folder whose spec does not load is left out with a
    warning (one half-written method must not stop every other method from running), and naming
    it raises its error; ``tests/test_registry.py`` fails while any folder is broken."""
    specs = {}
    for folder in sorted(METHODS_DIR.iterdir()):
        if (folder / "spec.yaml").exists():
            try:
                specs[folder.name] = _load_spec(folder)
            except (RegistryError, yaml.YAMLError, TypeError, KeyError) as exc:
                err = exc if isinstance(exc, RegistryError) else RegistryError(f"{folder / 'spec.yaml'}: {exc}")
                _BROKEN[folder.name] = err
                import sys

                print(f"reprozoo: WARNING: method '{folder.name}' left out: {err}", file=sys.stderr)
    return specs


def broken() -> dict[str, RegistryError]:
    """Method folders whose spec did not load, with the reason."""
    _all()
    return dict(_BROKEN)


def method_ids() -> list[str]:
    return list(_all())


def get(method_id: str) -> MethodSpec:
    specs = _all()
    if method_id in _BROKEN:
        raise _BROKEN[method_id]
    if method_id not in specs:
        raise RegistryError(f"unknown method '{method_id}'; known methods: {', '.join(specs) or '(none)'}")
    return specs[method_id]


def all_specs() -> list[MethodSpec]:
    return list(_all().values())
