"""The budget audit: would the verdicts change if every model trained twice as long?

A validation curve that looks flat can still be a schedule that ran out, and a slope over the last
few points can be noise. The audit that cannot be argued with is to train longer and look again:
``reprozoo converge METHOD --factor 2`` reruns the method with every training step count multiplied
by the factor (as a hyper-parameter override, so its cells go to
``results/<scale>/<method>/partial/params-<hash>/`` and never overwrite the default run), then
tabulates each claim's value and verdict at 1x and at the factor. A claim whose verdict changes is
**budget-sensitive**. The table is written to ``results/<scale>/<method>/converge.md`` (and
``converge.json``), and ``reprozoo docs`` puts it on the method's page.

Which keys are step counts: the spec's ``training_budget:`` (dotted paths into the scale config,
e.g. ``[denoiser.steps]``), else every integer under a key named like a training budget
(:data:`BUDGET_NAMES`) at any depth. Solver step counts (``steps_conv``, ``sw_steps``) are not
training and are left alone by that rule.

A cap's floor moves with it: the ``min_steps`` beside a scaled ``max_steps`` is scaled too, declared or
not (a fit that stops at its floor would otherwise rerun unchanged).

Plateau tolerances: a model that stops on its plateau (the shared rule, ``blocks/fitting.py``) before
its step floor or cap does not train longer when those are doubled, so the audit would rerun the same
fit. Every float under a key named like a stopping tolerance (:data:`TOLERANCE_NAMES`, e.g.
``fit.flat_tol``) is therefore divided by the factor: twice the steps and half the tolerance, so the
audit tests the plateau where it is decided.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

BUDGET_NAMES = {"steps", "epochs", "iters", "iterations", "n_epochs", "n_steps", "max_steps", "train_steps",
                "pretrain_steps", "finetune_steps", "n_iter", "updates", "epochs_pretrain", "epochs_finetune"}


TOLERANCE_NAMES = {"flat_tol"}


def _find(config: dict, match) -> list[str]:
    """Dotted paths of the leaves ``match(key, value)`` accepts, at any depth."""
    out = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if match(k, v):
                    out.append(f"{prefix}{k}")
                else:
                    walk(v, f"{prefix}{k}.")

    walk(config, "")
    return out


def tolerance_keys(config: dict) -> list[str]:
    """Dotted paths of the plateau tolerances (floats under :data:`TOLERANCE_NAMES`) in a scale config."""
    return _find(config, lambda k, v: k in TOLERANCE_NAMES and isinstance(v, (int, float))
                 and not isinstance(v, bool) and v > 0)


def budget_keys(config: dict, declared: list[str] | None = None) -> list[str]:
    """Dotted paths of the training step counts in a scale config: the declared ones (or those found by
    name), each cap followed by its floor (:func:`floor_keys`)."""
    if declared:
        for key in declared:
            _get(config, key)  # raises with the key's name when it is not there
        keys = list(declared)
    else:
        keys = _find(config, lambda k, v: k in BUDGET_NAMES and isinstance(v, int) and not isinstance(v, bool)
                     and v > 1)
    return keys + [k for k in floor_keys(config, keys) if k not in keys]


def floor_keys(config: dict, keys: list[str]) -> list[str]:
    """The ``min_steps`` beside each ``max_steps`` in ``keys``. A fit that stops at its floor (the shared
    rule's ``min_steps``) trains exactly as long when only its cap is doubled, so an audit that scales
    the cap alone reruns the same fit and calls an early stop budget-insensitive (mind_omni's spec
    listed ``fit.max_steps`` without its ``fit.min_steps``): the floor always moves with its cap."""
    out = []
    for key in keys:
        parts = key.split(".")
        if "max_steps" not in parts:
            continue
        # the cap may be per part (``fit.max_steps.o4``, ceitnet's per-order caps): its floor is the
        # same part of ``fit.min_steps`` when that is per part too, else the one ``fit.min_steps``
        at = len(parts) - 1 - parts[::-1].index("max_steps")
        head, tail = parts[:at], parts[at + 1:]
        for floor in (".".join(head + ["min_steps"] + tail), ".".join(head + ["min_steps"])):
            try:
                value = _get(config, floor)
            except KeyError:
                continue
            if isinstance(value, int) and not isinstance(value, bool) and value > 1 and floor not in out:
                out.append(floor)
            break
    return out


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"training_budget key '{dotted}' is not in the scale config")
        node = node[part]
    return node


def scaled_override(config: dict, keys: list[str], factor: float, tolerances: list[str] = ()) -> dict:
    """A nested params override with each budget key multiplied by ``factor`` and each plateau
    tolerance divided by it."""
    override: dict = {}
    for key in list(keys) + list(tolerances):
        parts = key.split(".")
        node = override
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        value = _get(config, key)
        node[parts[-1]] = float(value) / factor if key in tolerances else int(round(value * factor))
    return override


def compare(base: dict, longer: dict, factor: float) -> list[dict]:
    """One row per claim: value and verdict at 1x and at ``factor``, and whether it is
    budget-sensitive (its verdict changed)."""
    by_id = {c["id"]: c for c in longer["claims"]}
    rows = []
    for c in base["claims"]:
        o = by_id.get(c["id"], {})
        rows.append({"id": c["id"], "value_1x": c.get("value_mean"), "verdict_1x": c["verdict"],
                     "value_fx": o.get("value_mean"), "verdict_fx": o.get("verdict", "not measured"),
                     "budget_sensitive": c["verdict"] != o.get("verdict", "not measured"), "factor": factor})
    return rows


def markdown(rows: list[dict], factor: float, keys: list[str], commit: str) -> str:
    from .report import fmt

    n = sum(r["budget_sensitive"] for r in rows)
    steps = [k for k in keys if k.rpartition(".")[2] not in TOLERANCE_NAMES]
    tols = [k for k in keys if k.rpartition(".")[2] in TOLERANCE_NAMES]
    tol_text = (f" and every plateau tolerance ({', '.join(f'`{k}`' for k in tols)}) divided by it"
                if tols else "")
    lines = [f"Budget audit (`reprozoo converge`, commit `{commit[:12]}`): every training step count "
             f"({', '.join(f'`{k}`' for k in steps) or 'none found'}) multiplied by {factor:g}{tol_text}; "
             f"{n} of {len(rows)} verdicts change (budget-sensitive).", "",
             f"| claim | value 1x | verdict 1x | value {factor:g}x | verdict {factor:g}x | budget-sensitive |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['id']}` | {fmt(r['value_1x'])} | {r['verdict_1x']} | {fmt(r['value_fx'])} | "
                     f"{r['verdict_fx']} | {'**yes**' if r['budget_sensitive'] else 'no'} |")
    return "\n".join(lines)


def plan_override(method: str, scale: str, factor: float) -> tuple[dict, list[str]]:
    from . import registry

    spec = registry.get(method)
    config = spec.config(scale)
    keys = budget_keys(config, spec.training_budget)
    if not keys:
        raise ValueError(f"method '{method}': no training step counts found in configs/{scale}.yaml; declare "
                         "them in its spec as training_budget: [dotted.key, ...]")
    tols = [k for k in tolerance_keys(config) if k not in keys]
    return scaled_override(config, keys, factor, tols), keys + tols


def write(results: Path, method: str, scale: str, factor: float, keys: list[str], base: dict,
          longer: dict) -> Path:
    import json

    from .io import atomic_write_text

    rows = compare(base, longer, factor)
    out = Path(results) / scale / method / "converge.md"
    atomic_write_text(out, markdown(rows, factor, keys, str(base.get("git_commit", "unknown"))) + "\n")
    atomic_write_text(out.with_suffix(".json"), json.dumps({"factor": factor, "keys": keys, "rows": rows},
                                                           indent=1, default=str))
    return out

