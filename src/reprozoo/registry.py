"""Method registry: every folder under ``reprozoo/methods/`` with a ``spec.yaml`` is a method.

Discovery is by folder, not by import, so that Snakemake can build the whole DAG
(variants, seeds, datasets, resources) without importing torch or any method code.
Adding a method therefore means adding one folder; no workflow file changes.
"""
from __future__ import annotations

import copy
import functools
import importlib
import re
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
class Condition:
    """``expr op threshold``: a precondition (``requires:``) or an explicit negative control."""
    expr: str
    op: str
    threshold: float

    def __str__(self) -> str:
        return f"{self.expr} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, tested in miniature (see ``docs/verdicts.md``).

    ``control``: what the claim must *not* hold on. Either a substitution ``{method_variant:
    baseline_variant}`` (the same expression, op and threshold with the method replaced), or a
    :class:`Condition` of its own (e.g. a quantisation known to be too coarse must be flagged).
    Comparison claims without one get the A/A control (every method variant replaced by the first
    baseline the expression reads). ``requires``: conditions that must hold before the claim is read.
    ``exact``: a deterministic quantity, where zero spread over seeds is expected. ``margin``: the
    stated non-inferiority margin of a ``>= 0`` / ``<= 0`` claim (tested as ``>= -margin`` /
    ``<= +margin``)."""
    id: str
    text: str
    expr: str
    op: str
    threshold: float
    paper_value: Any = None
    unit: str = ""
    control: Any = None  # dict[str, str] | Condition | None
    requires: tuple = ()  # tuple[Condition, ...]
    exact: bool = False
    margin: float | None = None

    @property
    def effective_threshold(self) -> float:
        if self.margin is None:
            return self.threshold
        return self.threshold - self.margin if self.op in (">=", ">") else self.threshold + self.margin


@dataclass(frozen=True)
class Convergence:
    """Which curve shows that a variant trained to a plateau (spec ``convergence:``).

    ``curve``: the validation curve's metric name (``{variant}`` is replaced by the variant id);
    ``mode``: ``min`` (a loss) or ``max`` (an accuracy); ``lr``: the learning-rate curve's metric,
    if the method records it; ``variants``: the variants that train (default: every variant that
    records the curve); ``tol``: the largest relative improvement over the last 30 % of training
    that still counts as flat; ``scale``: relative to the curve's level (``value``) or to its whole
    improvement since the first point (``range``, for losses that cross zero such as an NLL);
    ``claims``: the claim ids this curve gates (default: every claim that reads the variant). A
    variant that trains several heads (one per tensor order, pre-training and fine-tuning) declares
    one curve per head, and a claim is held back only by the heads it reads: an unfinished order-2
    head says nothing about an order-4 verdict."""
    curve: str
    mode: str = "min"
    lr: str | None = None
    variants: tuple = ()
    tol: float = 0.02
    scale: str = "value"
    claims: tuple = ()

    def gates(self, claim_id: str) -> bool:
        return not self.claims or claim_id in self.claims

    def curve_for(self, variant: str) -> str:
        return self.curve.replace("{variant}", variant)

    def lr_for(self, variant: str) -> str | None:
        return self.lr.replace("{variant}", variant) if self.lr else None


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
    convergence: list[Convergence] = field(default_factory=list)
    training_budget: list[str] = field(default_factory=list)  # dotted config keys `reprozoo converge` scales

    @property
    def roles(self) -> dict[str, str]:
        return {v.id: v.role for v in self.variants}

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
SPEC_KEYS = REQUIRED_KEYS + ("train_shared", "resources", "convergence", "training_budget")
OPS = ("<=", "<", ">=", ">")
CLAIM_REQUIRED = ("id", "text", "expr", "op", "threshold", "paper_value")
CLAIM_KEYS = CLAIM_REQUIRED + ("unit", "control", "requires", "exact", "margin")
CONVERGENCE_KEYS = ("curve", "mode", "lr", "variants", "tol", "scale", "claims")
_COND = re.compile(r"^(?P<expr>.+?)\s*(?P<op><=|>=|<|>)\s*(?P<thr>[-+0-9.eE]+|inf|-inf)\s*$")


def _number(value, where: str) -> float:
    try:
        return float(value)  # YAML 1.1 reads 1.0e6 as a string
    except (TypeError, ValueError):
        raise RegistryError(f"{where} needs a number, got {value!r}") from None


def _condition(raw, where: str) -> Condition:
    """``"expr op number"`` or ``{expr, op, threshold}``."""
    if isinstance(raw, str):
        m = _COND.match(raw.strip())
        if not m:
            raise RegistryError(f"{where}: '{raw}' is not 'expression op number' (op one of {OPS})")
        return Condition(m["expr"].strip(), m["op"], _number(m["thr"], where))
    if isinstance(raw, dict) and set(raw) == {"expr", "op", "threshold"}:
        if raw["op"] not in OPS:
            raise RegistryError(f"{where}: op must be one of {OPS}")
        return Condition(str(raw["expr"]), raw["op"], _number(raw["threshold"], where))
    raise RegistryError(f"{where}: expected 'expression op number' or a mapping with keys expr, op, threshold")


def _metric_patterns(folder: Path) -> list[re.Pattern]:
    """Metric names a method can record: every string constant in its code and the blocks it
    imports (an f-string's fields match anything), plus what the stages record themselves."""
    import ast

    from .codehash import closure

    here = Path(__file__).resolve().parent
    files = closure(sorted(folder.rglob("*.py"))) + [here / "stages.py"]
    pats = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                pats.add(re.escape(node.value))
            elif isinstance(node, ast.JoinedStr):
                literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
                if literal.strip():  # f"{name}" alone would match any metric
                    parts = [re.escape(v.value) if isinstance(v, ast.Constant) else r"[\w.]+" for v in node.values]
                    pats.add("".join(parts))
    return [re.compile(p) for p in pats]


def check_metrics(spec: "MethodSpec") -> None:
    """Every metric a claim, control or precondition reads must be recorded somewhere in the
    method's code: a typo is an error before any job runs, not an "error" verdict after an hour.
    Run by the workflow's plan (not at every registry load: it parses the method's code)."""
    from .claims import tokens

    where = f"{spec.folder / 'spec.yaml'}"
    patterns = None
    for c in spec.claims:
        exprs = [("expr", c.expr)] + [(f"requires[{i}]", r.expr) for i, r in enumerate(c.requires)]
        if isinstance(c.control, Condition):
            exprs.append(("control", c.control.expr))
        for field_name, expr in exprs:
            for metric, _ in tokens(expr):
                if patterns is None:
                    patterns = _metric_patterns(spec.folder)
                if not any(p.fullmatch(metric) for p in patterns):
                    raise RegistryError(
                        f"{where}: claim '{c.id}' {field_name}: metric '{metric}' is recorded nowhere in the "
                        "method's code (no string constant or f-string of its folder or blocks matches it)")


def _check_tokens(expr: str, where: str, variants: set[str]) -> None:
    from .claims import ClaimError, check_syntax, tokens

    try:
        check_syntax(expr)
    except ClaimError as exc:
        raise RegistryError(f"{where}: {exc}") from None
    for metric, variant in tokens(expr):
        if variant not in variants:
            raise RegistryError(f"{where}: '{metric}@{variant}' reads unknown variant '{variant}'; "
                                f"variants: {sorted(variants)}")


def _claim(c: Any, where: str, variants: set[str]) -> Claim:
    from .claims import tokens as read_tokens

    if not isinstance(c, dict):
        raise RegistryError(f"{where}: every claim is a mapping, got {c!r}")
    where = f"{where}: claim '{c.get('id')}'"
    unknown = sorted(set(c) - set(CLAIM_KEYS))
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {unknown}; allowed: {list(CLAIM_KEYS)}")
    missing = [k for k in CLAIM_REQUIRED if c.get(k) in (None, "")]
    if missing:
        raise RegistryError(f"{where}: missing {missing} (every claim states the paper's value in paper_value)")
    if c["op"] not in OPS:
        raise RegistryError(f"{where}: op must be one of {OPS}")
    threshold = _number(c["threshold"], f"{where} threshold")
    margin = c.get("margin")
    if margin is not None:
        margin = _number(margin, f"{where} margin")
        if margin < 0:
            raise RegistryError(f"{where}: margin must be >= 0")
    if threshold == 0 and c["op"] in (">=", "<=") and margin is None:
        raise RegistryError(
            f"{where}: '{c['op']} 0' passes on a tie; say '{c['op'][0]} 0' for a strict improvement, or "
            f"state a non-inferiority margin (margin: tested as {c['op']} -margin / +margin)")
    _check_tokens(c["expr"], f"{where} expr", variants)
    control = c.get("control")
    if isinstance(control, dict) and "expr" not in control:
        for a, b in control.items():
            for v in (a, b):
                if v not in variants:
                    raise RegistryError(f"{where} control: unknown variant '{v}'; variants: {sorted(variants)}")
            if a not in {v for _, v in read_tokens(c["expr"])}:
                raise RegistryError(f"{where} control: '{a}' is not read by the claim's expression")
        control = dict(control)
    elif control is not None:
        control = _condition(control, f"{where} control")
        _check_tokens(control.expr, f"{where} control", variants)
    reqs = c.get("requires") or []
    if isinstance(reqs, (str, dict)):
        reqs = [reqs]
    requires = []
    for i, r in enumerate(reqs):
        cond = _condition(r, f"{where} requires[{i}]")
        _check_tokens(cond.expr, f"{where} requires[{i}]", variants)
        requires.append(cond)
    exact = c.get("exact", False)
    if not isinstance(exact, bool):
        raise RegistryError(f"{where}: exact must be true or false")
    return Claim(id=str(c["id"]), text=str(c["text"]), expr=str(c["expr"]), op=c["op"], threshold=threshold,
                 paper_value=c["paper_value"], unit=str(c.get("unit", "")), control=control,
                 requires=tuple(requires), exact=exact, margin=margin)


def _convergence(raw: Any, where: str, variants: set[str], claim_ids: set[str] = frozenset()) -> list[Convergence]:
    if raw is None:
        return []
    entries = raw if isinstance(raw, list) else [raw]
    out = []
    for i, e in enumerate(entries):
        w = f"{where}: convergence[{i}]"
        if not isinstance(e, dict) or "curve" not in e:
            raise RegistryError(f"{w}: expected a mapping with at least 'curve' (keys {list(CONVERGENCE_KEYS)})")
        unknown = sorted(set(e) - set(CONVERGENCE_KEYS))
        if unknown:
            raise RegistryError(f"{w}: unknown key(s) {unknown}; allowed: {list(CONVERGENCE_KEYS)}")
        if e.get("mode", "min") not in ("min", "max"):
            raise RegistryError(f"{w}: mode must be 'min' or 'max'")
        if e.get("scale", "value") not in ("value", "range"):
            raise RegistryError(f"{w}: scale must be 'value' or 'range'")
        vs = e.get("variants") or []
        bad = [v for v in vs if v not in variants]
        if bad:
            raise RegistryError(f"{w}: unknown variant(s) {bad}; variants: {sorted(variants)}")
        cs = e.get("claims") or []
        if not isinstance(cs, list):
            raise RegistryError(f"{w}: claims must be a list of claim ids")
        bad = [c for c in cs if c not in claim_ids]
        if bad:
            raise RegistryError(f"{w}: unknown claim(s) {bad}; claims: {sorted(claim_ids)}")
        out.append(Convergence(curve=str(e["curve"]), mode=e.get("mode", "min"), lr=e.get("lr"),
                               variants=tuple(vs), tol=_number(e.get("tol", 0.02), f"{w} tol"),
                               scale=e.get("scale", "value"), claims=tuple(cs)))
    return out


def _load_spec(folder: Path) -> MethodSpec:
    from .strict_yaml import load as strict_load

    where = f"{folder / 'spec.yaml'}"
    raw = strict_load(folder / "spec.yaml")
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: expected a mapping")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise RegistryError(f"{where}: missing keys {missing}")
    unknown = sorted(set(raw) - set(SPEC_KEYS))
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {unknown}; allowed: {list(SPEC_KEYS)}")
    if raw["id"] != folder.name:
        raise RegistryError(f"{where}: id '{raw['id']}' must equal the folder name '{folder.name}'")
    variants = [Variant(**v) for v in raw["variants"]]
    roles = {v.role for v in variants}
    if not roles <= {"method", "baseline"} or "method" not in roles:
        raise RegistryError(f"{where}: variants need role 'method' or 'baseline', and at least one 'method'")
    vids = {v.id for v in variants}
    claims = [_claim(c, where, vids) for c in raw["claims"]]
    ids = [c.id for c in claims]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise RegistryError(f"{where}: claim id(s) {dupes} appear twice")
    convergence = _convergence(raw.get("convergence"), where, vids, set(ids))
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
        configs[scale] = strict_load(path) or {}
    return MethodSpec(
        id=raw["id"], title=raw["title"], paper=raw["paper"], wave=raw["wave"],
        datasets_by_scale={k: list(v) for k, v in ds.items()}, variants=variants, claims=claims, env=env,
        resources=raw.get("resources", {}), train_shared=bool(raw.get("train_shared", False)),
        folder=folder, configs=configs, convergence=convergence,
        training_budget=[str(k) for k in raw.get("training_budget") or []],
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
