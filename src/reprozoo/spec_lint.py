"""Rules a spec must pass before any job runs, kept apart from the spec loader and the verdict code.

Why apart: a lint refuses specs; it never changes the verdict of a spec it accepts. Results carry a
hash of the code that computes verdicts (``codehash.VERDICT_CODE``), and a page whose hash no longer
matches must be rerun. Tightening what specs may say should not invalidate every measured table,
so lints live here and run where runs start (``config.plan``, hence the workflow and ``reprozoo
run``) and in ``tests/test_registry.py`` over every method.

The rule so far: a comparison between variants that holds, or sits exactly on its threshold, when
every variant measures the same (a "tie") cannot discriminate. ``ratio <= 1`` passes on a tie like
``difference >= 0`` (which the loader already refuses); a non-inferiority ``ratio <= 1.05`` holds
on a tie, so its default A/A control holds by construction and it must declare a control of its own.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import Claim, MethodSpec, RegistryError


def tie_value(expr: str) -> float | None:
    """The value of a comparison between variants when every variant measures the same: each metric
    gets one value shared by all variants, drawn twice at random. None when the expression reads a
    single variant or its value at a tie depends on the draw (then it is not a pure comparison)."""
    from .claims import FUNCS, _compile

    code, names = _compile(expr)
    if len({v for _, v in names.values()}) < 2:
        return None
    metrics = sorted({m for m, _ in names.values()})
    got = []
    for seed in (1, 2):
        draw = dict(zip(metrics, np.random.default_rng(seed).uniform(0.5, 2.0, len(metrics))))
        env = {**FUNCS, **{k: draw[m] for k, (m, _) in names.items()}}
        try:
            with np.errstate(all="ignore"):
                got.append(float(np.asarray(eval(code, {"__builtins__": {}}, env),  # noqa: S307 - AST checked
                                            dtype=float).reshape(())))
        except Exception:  # noqa: BLE001 - a shape the draw cannot express: no verdict on ties
            return None
    if not all(map(math.isfinite, got)) or not math.isclose(got[0], got[1], rel_tol=1e-9, abs_tol=1e-12):
        return None
    return got[0]


def tie_problem(claim: Claim) -> str | None:
    """Why ``claim`` cannot discriminate at a tie, or None."""
    from .claims import compare

    tie = tie_value(claim.expr)
    if tie is None:
        return None
    where = f"'{claim.expr} {claim.op} {claim.effective_threshold:g}'"
    if (claim.margin is None and claim.op in (">=", "<=")
            and math.isclose(tie, claim.threshold, rel_tol=1e-9, abs_tol=1e-12)):
        return (f"{where} passes on a tie (the expression is {tie:g} when every variant measures the same); "
                f"say '{claim.op[0]} {claim.threshold:g}' for a strict improvement, or state a "
                "non-inferiority margin (margin:) with the control it must fail")
    if compare(tie, claim.op, claim.effective_threshold) and claim.control is None:
        return (f"{where} holds when every variant measures the same (the expression is {tie:g} then), so its "
                "default A/A control holds too and the claim cannot discriminate; declare a control: a "
                "variant or setting known to be worse, on which it must not hold "
                "(control: {method_variant: worse_variant} or control: {expr, op, threshold})")
    return None


def check(spec: MethodSpec) -> None:
    """Raise RegistryError naming the spec, the claim and the fix for the first rule it breaks."""
    for claim in spec.claims:
        why = tie_problem(claim)
        if why:
            raise RegistryError(f"{spec.folder / 'spec.yaml'}: claim '{claim.id}': {why}")
