"""Sample efficiency read off an ESS-vs-N curve at a FIXED quality level ESS*.

The paper's headline ("sample-efficiency gains of up to one order of magnitude") compares how
many training samples each model needs to reach a given quality. The level ESS* is a constant of
the benchmark's config, fixed before the pipeline measures anything (configs/*.yaml, rule in
calibrate.py: 0.9 x the ML baseline's plateau ESS, averaged over calibration seeds that the
pipeline never uses). It is NOT the maximum of the baseline's curve on the seed being scored:
the maximum of a flat, noisy plateau falls at a random N, and the ratio then measures noise.

N(ESS*) is the smallest N at which the curve reaches ESS*, by linear interpolation of ESS in
log N between the grid points around the first crossing. Two censored cases:
* the curve is already at or above ESS* at the smallest N: N(ESS*) is reported as that N (the
  model needs at most that many samples; ``censored = -1``);
* the curve never reaches ESS* on the grid: N(ESS*) is reported as 2 x the largest N (it needs
  more than the largest N; ``censored = +1``).
The sample-efficiency gain of a method over the baseline is N_baseline(ESS*) / N_method(ESS*),
formed in the claim (spec.yaml) from the two variants' values on the same seed.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def samples_to_reach(ns: Sequence[float], ess: Sequence[float], level: float) -> float:
    """Smallest N (log-linear interpolation) with ESS(N) >= level; inf if never reached."""
    ns, ess = np.asarray(ns, float), np.asarray(ess, float)
    if np.any(np.diff(ns) <= 0):
        raise ValueError("training-set sizes must be strictly increasing")
    hit = np.flatnonzero(ess >= level)
    if len(hit) == 0:
        return math.inf
    i = int(hit[0])
    if i == 0:
        return float(ns[0])
    e0, e1 = ess[i - 1], ess[i]
    frac = (level - e0) / (e1 - e0)
    return float(math.exp(math.log(ns[i - 1]) + frac * (math.log(ns[i]) - math.log(ns[i - 1]))))


def n_to_reach(ns: Sequence[float], ess: Sequence[float], level: float) -> tuple[float, int]:
    """(N(ESS*), censored): censored -1 if reached at the smallest N already, +1 if never
    reached (N reported as 2 x the largest N), 0 otherwise."""
    n = samples_to_reach(ns, ess, level)
    if math.isinf(n):
        return 2.0 * float(ns[-1]), 1
    return n, -1 if ess[0] >= level else 0
