"""Turn the run configuration into a plan: which methods, variants, seeds and datasets to run.

Validation happens in two layers: the JSON schema (``config/config.schema.yaml``, applied with
``snakemake.utils.validate``) checks shapes and enums; :func:`plan` checks names against the
method and dataset registries. Both raise :class:`ConfigError` naming the offending key and the
allowed values, because a researcher's typo should never surface as a KeyError deep in a job.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
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
    _ints_where_the_schema_says_integer(config, yaml.safe_load(SCHEMA.read_text()))


def _ints_where_the_schema_says_integer(value, schema: dict):
    """Digit strings become ints wherever the schema expects an integer, at any depth (nested
    command-line values such as ``inject_failure=[{seed: 0, attempts: 5}]`` arrive as strings)."""
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k, extra if isinstance(extra, dict) else {})
            value[k] = _ints_where_the_schema_says_integer(v, sub)
        return value
    if isinstance(value, list):
        items = schema.get("items", {})
        return [_ints_where_the_schema_says_integer(v, items) for v in value]
    if isinstance(value, str) and schema.get("type") == "integer" and value.strip().isdigit():
        return int(value)
    return value


def load(overrides: dict | None = None, path: Path = DEFAULT_CONFIG) -> dict:
    from .strict_yaml import load as strict_load

    config = strict_load(path)  # a duplicate key is an error naming file and line, never a silent override
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
    complete: dict[str, bool] = field(default_factory=dict)
    # methods whose hyper-parameters were overridden: their cells live apart (never overwriting
    # the default configuration's), under partial/params-<hash of the override>/
    params_tag: dict[str, str] = field(default_factory=dict)

    def cell_root(self, method: str) -> str:
        """Below ``results/<scale>/<method>/``: ``""``, or ``partial/params-<hash>/`` for a run with
        overridden hyper-parameters (its training cells, shared training and tables)."""
        tag = self.params_tag.get(method)
        return f"partial/params-{tag}/" if tag else ""

    def jobs(self) -> list[Job]:
        return [Job(m, v, s) for m in self.methods for v in self.variants[m] for s in self.seeds[m]]

    def all_datasets(self) -> list[str]:
        return sorted({d for m in self.methods for d in self.datasets[m]})

    def selection(self, method: str) -> str:
        """Where a method's evaluate/verify outputs go, below ``results/<scale>/<method>/``:
        ``""`` for the complete selection (every variant, the scale's seeds), else
        ``partial/<variants>_seeds<seeds>/`` so that a subset run cannot overwrite complete results."""
        root = self.cell_root(method)
        spec = registry.get(method)
        default_seeds = spec.config(self.scale).get("seeds", [0])
        default_seeds = [default_seeds] if isinstance(default_seeds, int) else list(default_seeds)
        if set(self.variants[method]) == set(spec.variant_ids) and self.seeds[method] == default_seeds:
            return root  # every variant, the scale's seeds (of the default or the overridden config)
        vs = self.variants[method]
        vpart = "all" if set(vs) == set(spec.variant_ids) else "+".join(sorted(vs))
        if len(vpart) > 80:
            import hashlib

            vpart = f"{len(vs)}variants-{hashlib.sha1(vpart.encode()).hexdigest()[:8]}"
        seeds = '-'.join(str(s) for s in self.seeds[method])
        if root:  # one level below partial/: partial/params-<hash>-<variants>_seeds<seeds>/
            return f"{root[:-1]}-{vpart}_seeds{seeds}/"
        return f"partial/{vpart}_seeds{seeds}/"

    def report_selection(self) -> str:
        """``""`` when every selected method ran completely, else ``partial/<tag>/``: the summary
        of a subset run never replaces the scale's summary."""
        if self.is_complete:
            return ""
        import hashlib

        key = ";".join(f"{m}:{','.join(self.variants[m])}:{self.seeds[m]}" for m in self.methods)
        return f"partial/{hashlib.sha1(key.encode()).hexdigest()[:10]}/"

    @property
    def is_complete(self) -> bool:
        return all(self.complete.get(m, True) for m in self.methods)


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


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)


def coerce_override(value: Any, like: Any, key: str) -> Any:
    """``value`` converted to the type of the scale config's ``like``, or a ConfigError naming
    ``key``, the expected type and (for mappings) the allowed keys.

    Snakemake's ``--config params='{rex: {zeta: 0.99}}'`` hands nested values over as strings;
    a job would otherwise crash on ``'0.99' * x`` after minutes of other work.
    """
    if isinstance(value, str) and not isinstance(like, str) and like is not None:
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        value = value if parsed is None else parsed
    if like is None:
        return value
    if isinstance(like, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(like, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif isinstance(like, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(like, str):
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif isinstance(like, list):
        if isinstance(value, (list, tuple)):
            if like:
                return [coerce_override(v, like[0], f"{key}[{i}]") for i, v in enumerate(value)]
            return list(value)
    elif isinstance(like, dict):
        if isinstance(value, dict):
            out = copy.deepcopy(like)
            unknown = [k for k in value if k not in like]
            if unknown:
                raise ConfigError(f"config key '{key}': unknown key(s) {unknown}; allowed: {sorted(like)}")
            for k, v in value.items():
                out[k] = coerce_override(v, like[k], f"{key}.{k}")
            return out
    else:
        return value
    raise ConfigError(f"config key '{key}': {value!r} is not {_type_name(like)} "
                      f"(expected {_type_name(like)}, like the scale's default {like!r})")


def method_params(config: dict, method: str) -> dict[str, Any]:
    """Hyper-parameters of a method at the configured scale, with user overrides checked and
    coerced against the keys and types of the scale config (nested keys included)."""
    spec = registry.get(method)
    params = spec.config(config["scale"])
    overrides = config.get("params", {}).get(method, {})
    if isinstance(overrides, str):
        overrides = yaml.safe_load(overrides) or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"config key 'params.{method}': expected a mapping of hyper-parameters; "
                          f"allowed keys: {sorted(params)}")
    unknown = [k for k in overrides if k not in params]
    if unknown:
        raise ConfigError(
            f"config key 'params.{method}': unknown hyper-parameter(s) {unknown}; "
            f"allowed: {sorted(params)}"
        )
    return coerce_override(overrides, params, f"params.{method}") if overrides else params


def plan(config: dict, check_specs: bool = True) -> Plan:
    """What to run. ``check_specs`` (the invocation's main process; jobs re-planning on a cluster
    node skip it) also checks that every metric a selected claim reads is recorded by its code and
    that every selected spec passes ``spec_lint`` (claims that cannot discriminate on a tie)."""
    methods = selected_methods(config)
    if check_specs:
        from . import spec_lint

        for m in methods:
            registry.check_metrics(registry.get(m))
            spec_lint.check(registry.get(m))
    scale = config["scale"]
    for key in config.get("variants", {}):
        if key not in methods:
            raise ConfigError(f"config key 'variants.{key}': method not selected; selected: {methods}")
    for key in config.get("params", {}):
        if key not in registry.method_ids():
            raise ConfigError(f"config key 'params.{key}': unknown method; known methods: {registry.method_ids()}")
    variants, seeds, datasets, complete, tags = {}, {}, {}, {}, {}
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
        method_params(config, m)  # a bad override fails here, before any job starts
        default_seeds = spec.config(scale).get("seeds", [0])
        default_seeds = [default_seeds] if isinstance(default_seeds, int) else list(default_seeds)
        override = config.get("params", {}).get(m)
        if override:
            import hashlib
            import json

            # the hash of the coerced configuration: the same override typed on the command line
            # (strings) or passed as a mapping gives the same folder
            merged = method_params(config, m)
            tags[m] = hashlib.sha1(json.dumps(merged, sort_keys=True, default=str).encode()).hexdigest()[:8]
        complete[m] = (set(variants[m]) == set(spec.variant_ids) and seeds[m] == default_seeds
                       and m not in tags)
    return Plan(scale=scale, methods=methods, variants=variants, seeds=seeds, datasets=datasets,
                complete=complete, params_tag=tags)
