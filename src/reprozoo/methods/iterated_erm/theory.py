r"""Sharp asymptotics of two-stage ridge ERM on a two-class Gaussian mixture: the fixed point.

Model (proportional limit n, d -> infinity, n/d fixed). Samples x = y mu / sqrt(d) + z, y = +-1
equiprobable, z ~ N(0, I_d), ||mu||^2 / d = r^2. A linear predictor w scores z = w.x / sqrt(d);
its test error is Phi(-m / sqrt(q)) with m = w.mu / d, q = ||w||^2 / d.

Stage 1:  w1 = argmin sum_a  l1_a(w.x_a/sqrt d)          + lam1/2 ||w||^2
Stage 2:  w2 = argmin sum_a  s_a(z1_a) l2(w.x_a/sqrt d)  + lam2/2 ||w||^2
with square losses l(y, z) = (y - z)^2 / 2. l1_a = 0 for samples not labelled at stage 1 (the
unlabelled pool). The stage-2 weight s_a in {0, 1} depends on the stage-1 prediction z1_a of the
SAME sample: keep it always, keep it when |z1_a| < t (margin / uncertainty selection), or keep it
with probability pi (random selection). t is the data-dependent quantile that keeps n2 samples.

Cavity fields. Remove sample a from both stages; its fields (omega1, omega2) = x_a.(w1, w2)/sqrt d
under the cavity weights are jointly Gaussian, mean y (m1, m2), covariance [[q1, q12], [q12, q2]].
Putting a back (linear response):
    z1 = prox_{V1 l1}(omega1),                       f1 = (z1 - omega1) / V1 = -l1'(z1)
    z2 = prox_{V2 s l2}(omega2 - V21 f1),            f2 = -s l2'(z2)
V1, V2 are the trace-normalised inverse Hessians; V21 = tr(H2^-1 B H1^-1)/d is the cross response
of stage 2 to the stage-1 perturbation caused by sample a (B = d^2 L2 / dw2 dw1). V21 is what data
reuse adds: a sample that trained w1 has an in-sample z1 (prox-shifted), and w2 feels it twice.

Output channel (sums over samples / d, i.e. alpha-weighted means over the sample types):
    V1^ = -E d f1/d omega1,  m1^ = E y f1,  Q11^ = E f1^2
    V2^ = -E d f2/d omega2,  m2^ = E y f2,  Q22^ = E f2^2,  Q12^ = E f1 f2,
    A21 = E d f2 / d omega1      (total derivative, incl. the moving selection boundary)
Weight channel (ridge: Gaussian effective problem, xi^ ~ N(0, Q^ (x) I)):
    w1 = V1 (m1^ mu + xi1^),            V1 = 1 / (lam1 + V1^)
    w2 = V2 (m2^ mu + xi2^ + A21 w1),   V2 = 1 / (lam2 + V2^),   V21 = -V1 V2 A21
giving m1 = V1 m1^ r^2, q1 = V1^2 (m1^2 r^2 + Q11^), m2 = V2 (m2^ r^2 + A21 m1),
q12 = V2 (m2^ m1 + V1 Q12^ + A21 q1),
q2 = V2^2 (m2^2 r^2 + Q22^ + A21^2 q1 + 2 m2^ A21 m1 + 2 A21 V1 Q12^).

This derivation is ours (cavity method, following the single-stage Gaussian-mixture analyses); the
paper states the general convex-loss version. ``reuse=False`` gives the sample-splitting
prediction that the paper's analysis replaces: stage 2 sees a fresh copy of every sample (fields
omega1 = z1 un-shifted, V21 = Q12^ = 0); the selection-boundary part of A21 stays, since it is there
for fresh data too.

For square losses every expectation is a truncated Gaussian moment, computed in closed form; by the
symmetry (y, x) -> (-y, -x) it suffices to take y = +1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq


class norm:  # scalar standard-normal pdf/cdf; scipy.stats' per-call overhead dominates the solver
    @staticmethod
    def pdf(x: float) -> float:
        return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)

    @staticmethod
    def cdf(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2.0))


@dataclass
class SampleType:
    """A family of samples: ``alpha`` = count / d; ``labelled1``: used by stage 1; ``rule``: stage-2
    weight, one of "all" (always kept), "margin" (kept when |z1| < t), "random" (kept w.p. pi),
    "none" (never). Margin-selected types share one threshold t (the quota n2)."""

    alpha: float
    labelled1: bool
    rule: str


def _trunc_moments(a: float, b: float):
    """Unnormalised moments of g ~ N(0,1) on (a, b): E[1 g^k], k = 0, 1, 2."""
    pa, pb = (0.0 if np.isinf(a) else norm.pdf(a)), (0.0 if np.isinf(b) else norm.pdf(b))
    apa = 0.0 if np.isinf(a) else a * pa
    bpb = 0.0 if np.isinf(b) else b * pb
    m0 = norm.cdf(b) - norm.cdf(a)
    return m0, pa - pb, m0 + apa - bpb


def _interval(tp: SampleType, t: float, m1: float, q1: float, V1: float):
    """Selection interval in omega1 for y = +1, standardised: g = (omega1 - m1)/sqrt(q1) in (a, b).
    In-sample selection acts on z1 = (omega1 + V1)/(1 + V1) (square-loss prox), fresh samples on
    z1 = omega1."""
    if tp.rule != "margin":
        return -np.inf, np.inf
    scale, shift = (1.0 + V1, V1) if tp.labelled1 else (1.0, 0.0)
    lo, hi = -t * scale - shift, t * scale - shift
    s1 = np.sqrt(q1)
    return (lo - m1) / s1, (hi - m1) / s1


def _keep_prob(tp, t, pi, m1, q1, V1):
    if tp.rule == "all":
        return 1.0
    if tp.rule == "none":
        return 0.0
    if tp.rule == "random":
        return pi
    a, b = _interval(tp, t, m1, q1, V1)
    return norm.cdf(b) - norm.cdf(a)


def selection_threshold(types, n2_over_d, m1, q1, V1):
    """t such that the expected number of margin-selected samples is n2 (per d)."""
    sel = [tp for tp in types if tp.rule == "margin"]
    if not sel:
        return np.inf

    def excess(t):
        return sum(tp.alpha * _keep_prob(tp, t, 0, m1, q1, V1) for tp in sel) - n2_over_d

    hi = 1.0
    while excess(hi) < 0:
        hi *= 2.0
    return brentq(excess, 0.0, hi, xtol=1e-13)


def random_keep_fraction(types, n2_over_d):
    pool = sum(tp.alpha for tp in types if tp.rule == "random")
    return n2_over_d / pool if pool > 0 else 0.0


@dataclass
class Overlaps:
    m1: float
    q1: float
    m2: float
    q2: float
    q12: float
    V1: float
    V2: float
    V21: float
    t: float
    iterations: int

    @property
    def err1(self) -> float:
        return norm.cdf(-self.m1 / math.sqrt(self.q1))

    @property
    def err2(self) -> float:
        return norm.cdf(-self.m2 / math.sqrt(self.q2))


def stage1(types, r2, lam1, tol=1e-13, max_iter=10_000):
    """Single-stage ridge fixed point (closed-form output channel)."""
    a1 = sum(tp.alpha for tp in types if tp.labelled1)
    V1 = 1.0 / lam1
    for _ in range(max_iter):  # V1 = 1/(lam1 + a1/(1+V1)) is a contraction
        V_new = 1.0 / (lam1 + a1 / (1.0 + V1))
        if abs(V_new - V1) < tol:
            V1 = V_new
            break
        V1 = V_new
    # m1 = V1 mhat r2, mhat = a1 (1 - m1)/(1+V1): linear in m1
    k = V1 * a1 * r2 / (1.0 + V1)
    m1 = k / (1.0 + k)
    # q1 = V1^2 (mhat^2 r2 + a1 ((1-m1)^2 + q1)/(1+V1)^2): linear in q1
    mhat = a1 * (1.0 - m1) / (1.0 + V1)
    c = V1**2 * a1 / (1.0 + V1) ** 2
    q1 = (V1**2 * (mhat**2 * r2 + a1 * (1.0 - m1) ** 2 / (1.0 + V1) ** 2)) / (1.0 - c)
    return m1, q1, V1


def solve(types, r2: float, lam1: float, lam2: float, n2_over_d: float, reuse: bool = True,
          tol: float = 1e-11) -> Overlaps:
    """Solve the two-stage fixed point. ``n2_over_d``: number of samples the selection keeps, / d.
    Damped iteration; a diverging run (sharp selection, small lam2) is retried with more damping."""
    for damping in (0.5, 0.2, 0.05):
        try:
            with np.errstate(over="raise", invalid="raise"):
                return _solve(types, r2, lam1, lam2, n2_over_d, reuse, damping, tol, int(4000 / damping))
        except (RuntimeError, FloatingPointError, ValueError):
            continue
    raise RuntimeError(f"two-stage fixed point did not converge (alpha2 = {n2_over_d}, lam2 = {lam2})")


def _solve(types, r2, lam1, lam2, n2_over_d, reuse, damping, tol, max_iter) -> Overlaps:
    m1, q1, V1 = stage1(types, r2, lam1)
    sel_types = types if reuse else [SampleType(tp.alpha, False, tp.rule) for tp in types]
    t = selection_threshold(sel_types, n2_over_d, m1, q1, V1)
    pi = random_keep_fraction(types, n2_over_d)
    s1 = np.sqrt(q1)
    # stage 2 starts from the stage-1 solution
    m2, q2, q12, V2, V21 = m1, q1, q1, V1, 0.0
    for it in range(max_iter):
        beta = q12 / q1
        sig2 = max(q2 - q12**2 / q1, 0.0)
        A1, A2 = 1.0 - m1, 1.0 - m2
        c = V21 / (1.0 + V1) if reuse else 0.0
        V2h = m2h = Q22 = Q12 = A21 = 0.0
        for tp in types:
            if tp.rule == "none":
                continue
            # in-sample: the sample also trained w1 (reuse); without reuse stage 2 sees a fresh copy
            ins = tp.labelled1 and reuse
            k = c if ins else 0.0
            a, b = _interval(SampleType(tp.alpha, ins, tp.rule), t, m1, q1, V1)
            M0, M1, M2 = _trunc_moments(a, b)
            w = pi if tp.rule == "random" else 1.0  # random keeping is independent of the fields
            B0, B1 = A2 + k * A1, (beta + k) * s1       # h = e2 + k e1 = B0 - B1 g - sigma xi
            Eh = B0 * M0 - B1 * M1
            Eh2 = B0**2 * M0 - 2 * B0 * B1 * M1 + B1**2 * M2 + sig2 * M0
            den = 1.0 + V2
            V2h += tp.alpha * w * M0 / den
            m2h += tp.alpha * w * Eh / den
            Q22 += tp.alpha * w * Eh2 / den**2
            if ins:
                Ee1h = A1 * B0 * M0 - (A1 * B1 + s1 * B0) * M1 + s1 * B1 * M2
                Q12 += tp.alpha * w * Ee1h / ((1.0 + V1) * den)
                A21 += tp.alpha * w * M0 * (-k) / den  # d f2/d omega1 through f1' = -1/(1+V1)
            # moving selection boundary: d s/d omega1 = delta(omega1 - lo) - delta(omega1 - hi);
            # the density of omega1 at an edge g is pdf(g)/sqrt(q1), E[h | edge] = B0 - B1 g
            for g_edge, sign in ((a, 1.0), (b, -1.0)):
                if not np.isinf(g_edge):
                    A21 += tp.alpha * w * sign * norm.pdf(g_edge) / s1 * (B0 - B1 * g_edge) / den
        V2n = 1.0 / (lam2 + V2h)
        V21n = -V1 * V2n * A21 if reuse else 0.0
        m2n = V2n * (m2h * r2 + A21 * m1)
        q12n = V2n * (m2h * m1 + V1 * Q12 + A21 * q1)
        q2n = V2n**2 * (m2h**2 * r2 + Q22 + A21**2 * q1 + 2 * m2h * A21 * m1 + 2 * A21 * V1 * Q12)
        new = np.array([m2n, q2n, q12n, V2n, V21n])
        old = np.array([m2, q2, q12, V2, V21])
        upd = damping * new + (1 - damping) * old
        m2, q2, q12, V2, V21 = upd
        if not np.all(np.isfinite(new)):
            raise FloatingPointError("non-finite iterate")
        if np.max(np.abs(new - old)) < tol:
            return Overlaps(m1, q1, m2, q2, q12, V1, V2, V21, t, it + 1)
    raise RuntimeError(f"two-stage fixed point did not converge in {max_iter} iterations: {new} vs {old}")


# --- the two protocols of the miniature ------------------------------------------------------------

def active_learning_types(n1_over_d, pool_over_d, rule="margin"):
    """Pool-based active learning: n1 random pool points labelled for stage 1; stage 2 trains on
    them plus the n2 points of the rest of the pool chosen by ``rule`` from w1's predictions."""
    return [SampleType(n1_over_d, True, "all"), SampleType(pool_over_d - n1_over_d, False, rule)]


def reweighting_types(n_over_d, rule="margin"):
    """Iterated ERM on one labelled set: stage 1 on all n, stage 2 on the n2 of the SAME samples
    that ``rule`` keeps (margin: smallest in-sample |z1|)."""
    return [SampleType(n_over_d, True, rule)]


def candidate_types(n_over_d, cand_over_d, rule="margin"):
    """Selection strength at fixed n2: stage 1 on all n; stage 2 keeps n2 of a random candidate
    subset of c <= n of the SAME samples (``rule`` on the candidates; the others are never kept).
    The candidates are independent of the fields, so they are a sample type of their own."""
    if cand_over_d >= n_over_d:
        return [SampleType(n_over_d, True, rule)]
    return [SampleType(cand_over_d, True, rule), SampleType(n_over_d - cand_over_d, True, "none")]
