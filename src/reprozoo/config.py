"""Turn the run configuration into a plan: which methods, variants, seeds and datasets to run.

Validation happens in two layers: the JSON schema (``config/config.schema.yaml``, applied with
``snakemake.utils.validate``) checks shapes and enums; :func:`plan` checks names against the
method and dataset registries. Both raise :class:`ConfigError` naming the offending key and the
allowed values, because a researcher's typo should never surface as a KeyError deep in a job.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import registry

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "config" / "config.schema.yaml"
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"


class ConfigError(ValueError):
    pass


def _deep_update(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = value
    return base


def validate(config: dict) -> dict:
    """Validate against the JSON schema and fill defaults; return the config.

    Wraps ``snakemake.utils.validate`` so the message names the key path and the allowed values.
    """
    import jsonschema
    from snakemake.utils import validate as sm_validate

    for key in config:
        allowed = yaml.safe_load(SCHEMA.read_text())["properties"]
        if key not in allowed:
            raise ConfigError(f"unknown config key '{key}'; allowed keys: {', '.join(allowed)}")
    _coerce_command_line_types(config)
    schema = yaml.safe_load(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        inner = errors[0]
        path = ".".join(str(p) for p in inner.absolute_path) or "(top level)"
        allowed = ""
        if inner.validator == "enum":
            allowed = f"; allowed values: {inner.validator_value}"
        elif inner.validator == "oneOf":
            allowed = f"; expected: {inner.schema.get('description') or [s.get('type') for s in inner.validator_value]}"
        raise ConfigError(f"invalid config key '{path}': {inner.message}{allowed}")
    sm_validate(config, str(SCHEMA), set_default=True)  # fills the schema's defaults
    return config


def _coerce_command_line_types(config: dict) -> None:
    """``snakemake --config seeds=[0,1]`` hands over strings; accept them where a number is meant."""
    seeds = config.get("seeds")
    if isinstance(seeds, str) and seeds.replace(",", "").replace(" ", "").isdigit():
        seeds = [s for s in seeds.replace(" ", "").split(",") if s]
    if isinstance(seeds, list) and all(isinstance(s, str) and s.strip().isdigit() for s in seeds):
        config["seeds"] = [int(s) for s in seeds]
    elif isinstance(seeds, str) and seeds.isdigit():
        config["seeds"] = int(seeds)


def load(overrides: dict | None = None, path: Path = DEFAULT_CONFIG) -> dict:
    config = yaml.safe_load(path.read_text())
    _deep_update(config, copy.deepcopy(overrides or {}))
    return validate(config)


@dataclass(frozen=True)
class Job:
    method: str
    variant: str
    seed: int


@dataclass
class Plan:
    scale: str
    methods: list[str]
    variants: dict[str, list[str]]
    seeds: dict[str, list[int]]
    datasets: dict[str, list[str]]

    def jobs(self) -> list[Job]:
        return [Job(m, v, s) for m in self.methods for v in self.variants[m] for s in self.seeds[m]]

    def all_datasets(self) -> list[str]:
        return sorted({d for m in self.methods for d in self.datasets[m]})


def selected_methods(config: dict) -> list[str]:
    wanted = config.get("methods", "all")
    known = registry.method_ids()
    if wanted == "all":
        return known
    if isinstance(wanted, str):
        wanted = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise ConfigError(f"config key 'methods': unknown method(s) {unknown}; known methods: {known}")
    return list(wanted)


def method_params(config: dict, method: str) -> dict[str, Any]:
    """Hyper-parameters of a method at the configured scale, with user overrides applied."""
    spec = registry.get(method)
    params = spec.config(config["scale"])
    overrides = config.get("params", {}).get(method, {})
    unknown = [k for k in overrides if k not in params]
    if unknown:
        raise ConfigError(
            f"config key 'params.{method}': unknown hyper-parameter(s) {unknown}; "
            f"allowed: {sorted(params)}"
        )
    return _deep_update(params, copy.deepcopy(overrides))


def plan(config: dict) -> Plan:
    methods = selected_methods(config)
    scale = config["scale"]
    for key in config.get("variants", {}):
        if key not in methods:
            raise ConfigError(f"config key 'variants.{key}': method not selected; selected: {methods}")
    for key in config.get("params", {}):
        if key not in registry.method_ids():
            raise ConfigError(f"config key 'params.{key}': unknown method; known methods: {registry.method_ids()}")
    variants, seeds, datasets = {}, {}, {}
    for m in methods:
        spec = registry.get(m)
        chosen = config.get("variants", {}).get(m) or spec.variant_ids
        bad = [v for v in chosen if v not in spec.variant_ids]
        if bad:
            raise ConfigError(f"config key 'variants.{m}': unknown variant(s) {bad}; allowed: {spec.variant_ids}")
        variants[m] = list(chosen)
        s = config.get("seeds")
        if s is None:
            s = spec.config(scale).get("seeds", [0])
        seeds[m] = [s] if isinstance(s, int) else list(s)
        datasets[m] = spec.datasets_for(scale)
    return Plan(scale=scale, methods=methods, variants=variants, seeds=seeds, datasets=datasets)
