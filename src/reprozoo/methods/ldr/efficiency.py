"""Sample efficiency read off ESS-vs-N curves.

The paper's headline ("sample-efficiency gains of up to one order of magnitude") compares how
many training samples each model needs to reach a given quality. We take the quality level to be
the BASELINE's best ESS over the training-set grid, ESS* = max_N ESS_ml(N), reached at N_ml. The
method needs N_ldr = the smallest N at which its ESS curve reaches ESS*, found by linear
interpolation of ESS in log N between the grid points around the first crossing. The ratio
N_ml / N_ldr is the sample-efficiency gain (1: none; 0 when the method never reaches ESS*).
If the method is already above ESS* at the smallest N, N_ldr is taken as that N: the ratio is
then a lower bound (``censored``).
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


def sample_efficiency(ns, ess_baseline, ess_method) -> tuple[float, bool]:
    """(N_baseline(ESS*) / N_method(ESS*), censored) with ESS* the baseline's best ESS."""
    best = float(np.max(ess_baseline))
    n_base = samples_to_reach(ns, ess_baseline, best)
    n_method = samples_to_reach(ns, ess_method, best)
    if math.isinf(n_method):
        return 0.0, False
    return n_base / n_method, bool(n_method <= ns[0] and ess_method[0] > best)
