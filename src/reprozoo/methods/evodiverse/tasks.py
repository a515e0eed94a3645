"""The two discovery tasks: what a hypothesis is, what the oracle scores, how far apart two are.

Equation discovery (Feynman-style formulas, AI Feynman ranges, Udrescu & Tegmark 2020)
    hypothesis  a formula f over the named variables (``expressions.py``)
    oracle      linear scaling y ~ a f(x) + b by least squares on the sampled points, then
                quality q = -log10(NMSE) clipped to [0, 12] (decades of normalised MSE;
                12 = exact up to round-off); non-finite or constant f scores 0
    same        two formulas are the same hypothesis when their fitted predictions agree on the
                data (rounded to 1e-8 of std y): x*y and y*x are one hypothesis, not two
    distance    Jaccard distance of the sets of subtrees, in [0, 1]

Circle packing in the unit square (n circles, maximise the sum of radii; AlphaEvolve/OpenEvolve)
    hypothesis  the n centres, an (n, 2) array in [0, 1]^2
    oracle      the best radii for those centres, an LP: max sum r s.t. r_i + r_j <= |c_i - c_j|,
                0 <= r_i <= distance of c_i to the nearest wall; quality = sum of radii
                (best known for n = 26: 2.635, AlphaEvolve 2025)
    distance    mean distance between matched centres (optimal assignment), minimised over the
                8 symmetries of the square (unit-square lengths)

No temperature is ours: each task states the reference code's reward and score, and the search
uses them as they are (fixed before any measurement, no knob):
    ``log_reward(q)``  log r, the energy of the replica-exchange rule and of the tempered target
                       r^beta. Equations: the reference's log MSE (LLM-SR pools), here
                       -ln NMSE = q ln 10 (the normalisation by var y cancels in differences).
                       Packing: the reference's log combined_score, ln(sum of radii / 2.635).
    ``ref_score(q)``   the raw score the reference feeds to softmax(beta * score) when it draws
                       the members of a swap: -NMSE for equations (the reference: -MSE),
                       sum of radii / 2.635 for packing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from . import expressions as ex

Q_MAX = 12.0  # decades of NMSE: float64 round-off

# Feynman formulas: (id, variable names, sampling range per variable, ground truth in Python syntax).
# Constant prefactors (1/(4 pi eps0), 1/sqrt(2 pi)) are absorbed by the linear scaling.
FEYNMAN = {
    "I.6.20a": (("theta",), ((1.0, 3.0),), "exp(-theta**2 / 2)"),
    "I.12.2": (("q1", "q2", "r"), ((1.0, 5.0), (1.0, 5.0), (1.0, 5.0)), "q1 * q2 / r**2"),
    "I.10.7": (("m0", "v", "c"), ((1.0, 5.0), (1.0, 2.0), (3.0, 10.0)), "m0 / sqrt(1 - v**2 / c**2)"),
    "I.13.4": (("m", "v", "u", "w"), ((1.0, 5.0),) * 4, "m * (v**2 + u**2 + w**2)"),
    "I.34.8": (("q", "v", "B", "p"), ((1.0, 5.0),) * 4, "q * v * B / p"),
    "I.27.6": (("d1", "d2", "n"), ((1.0, 5.0),) * 3, "1 / (1 / d1 + n / d2)"),
    "I.8.14": (("x1", "x2", "y1", "y2"), ((1.0, 5.0),) * 4, "sqrt((x2 - x1)**2 + (y2 - y1)**2)"),
    "I.38.12": (("eps", "h", "m", "q"), ((1.0, 5.0),) * 4, "eps * h**2 / (m * q**2)"),
}


def metric_name(formula_id: str) -> str:
    """'I.6.20a' -> 'i6_20a' (metric names are identifiers)."""
    return formula_id.lower().replace(".", "", 1).replace(".", "_")


@dataclass
class EquationTask:
    formula_id: str
    X: np.ndarray
    y: np.ndarray
    max_size: int = 15
    max_depth: int = 6
    kind: str = "equation"
    names: tuple = field(init=False)

    def __post_init__(self):
        self.names = FEYNMAN[self.formula_id][0]
        self._yc = self.y - self.y.mean()
        self._yvar = float(np.mean(self._yc**2))
        self._ystd = float(np.sqrt(self._yvar))

    @classmethod
    def sample(cls, formula_id: str, n_points: int, rng: np.random.Generator, noise: float = 0.0, **kw):
        """Points uniform in the formula's ranges, y from the ground truth (+ relative noise)."""
        names, ranges, truth = FEYNMAN[formula_id]
        lo, hi = np.array(ranges).T
        X = rng.uniform(lo, hi, size=(n_points, len(names)))
        y = ex.evaluate(ex.parse(truth, names), X)
        if noise > 0:
            y = y + noise * np.std(y) * rng.standard_normal(n_points)
        return cls(formula_id, X, y, **kw)

    @property
    def truth(self):
        return ex.parse(FEYNMAN[self.formula_id][2], self.names)

    # -- the oracle --
    def score(self, tree) -> tuple[float, str]:
        """(quality in decades of NMSE, semantic key)."""
        with np.errstate(all="ignore"):
            f = ex.evaluate(tree, self.X)
            if f.shape != self.y.shape or not np.all(np.isfinite(f)):
                return 0.0, "invalid"
            fc = f - f.mean()
            var_f = float(np.mean(fc * fc))
            if not np.isfinite(var_f) or var_f <= 1e-24 * max(1.0, float(np.mean(f * f))):
                return 0.0, "constant"
            a = float(np.mean(fc * self._yc)) / var_f
            pred_c = a * fc
            nmse = float(np.mean((self._yc - pred_c) ** 2)) / self._yvar
        if not np.isfinite(nmse):
            return 0.0, "invalid"
        q = float(np.clip(-np.log10(max(nmse, 10.0**-Q_MAX)), 0.0, Q_MAX))
        skey = np.round(pred_c[:32] / self._ystd, 8).tobytes().hex()
        return q, skey

    def key(self, tree) -> str:
        return ex.key(tree)

    # -- the reference's reward and score (see the module docstring) --
    @staticmethod
    def log_reward(q):
        """-ln NMSE: the reference's log-MSE energy, in nats (q is in decades)."""
        return np.log(10.0) * np.asarray(q, dtype=float)

    @staticmethod
    def ref_score(q):
        """-NMSE: the reference's score (-MSE) on our normalised scale."""
        return -(10.0 ** -np.asarray(q, dtype=float))

    def valid(self, tree) -> bool:
        return ex.size(tree) <= self.max_size and ex.depth(tree) <= self.max_depth

    # -- distance --
    def features(self, tree):
        return ex.subtree_set(tree)

    def distance(self, fa, fb, symmetric: bool = True) -> float:
        return ex.jaccard_distance(fa, fb)

    def similarity(self, fa, fb) -> float:
        return 1.0 - ex.jaccard_distance(fa, fb)

    # -- offline moves and text --
    def random(self, rng):
        while True:
            t = ex.random_tree(rng, len(self.names), max_depth=3)
            if self.valid(t):
                return t

    def mutate(self, tree, rng):
        return ex.mutate(tree, rng, len(self.names))

    def crossover(self, a, b, rng):
        return ex.crossover(a, b, rng)

    def to_text(self, tree) -> str:
        return ex.to_str(tree, self.names)

    def parse(self, text: str):
        return ex.parse(text, self.names)

    def describe(self) -> str:
        return (f"Find a formula y = f({', '.join(self.names)}) that fits measured data; y is fitted as "
                f"a*f + b, so overall constant factors do not matter. Use only + - * / **2, sqrt, exp, "
                f"log, sin, cos, the variables and the constants {list(ex.CONSTANTS)}. "
                f"Score: decades of normalised MSE (higher is better, {Q_MAX:g} is exact).")


# --- circle packing -------------------------------------------------------------------------------

SYMMETRIES = [  # the dihedral group of the square acting on centred coordinates
    np.array(m, dtype=float) for m in
    ([[1, 0], [0, 1]], [[0, -1], [1, 0]], [[-1, 0], [0, -1]], [[0, 1], [-1, 0]],
     [[-1, 0], [0, 1]], [[1, 0], [0, -1]], [[0, 1], [1, 0]], [[0, -1], [-1, 0]])
]


def lp_radii(centres: np.ndarray) -> np.ndarray:
    """The radii that maximise their sum for fixed centres (HiGHS LP, scipy)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix
    from scipy.spatial.distance import pdist

    n = len(centres)
    iu, ju = np.triu_indices(n, 1)
    m = len(iu)
    rows = np.repeat(np.arange(m), 2)
    A = csr_matrix((np.ones(2 * m), (rows, np.stack([iu, ju], 1).ravel())), shape=(m, n))
    wall = np.minimum(centres, 1.0 - centres).min(axis=1).clip(0.0)
    res = linprog(-np.ones(n), A_ub=A, b_ub=pdist(centres), bounds=np.stack([np.zeros(n), wall], 1),
                  method="highs")
    if res.status != 0:
        return np.zeros(n)
    return np.clip(res.x, 0.0, None)


def matched_distance(a: np.ndarray, b: np.ndarray, symmetric: bool = True) -> float:
    """Mean distance between optimally matched centres; with ``symmetric`` the minimum over the
    8 symmetries of the square applied to ``b`` (a rotated packing is the same packing)."""
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    best = np.inf
    for S in (SYMMETRIES if symmetric else SYMMETRIES[:1]):
        bb = (b - 0.5) @ S.T + 0.5
        D = cdist(a, bb)
        r, c = linear_sum_assignment(D)
        best = min(best, float(D[r, c].mean()))
    return best


@dataclass
class CirclePackingTask:
    n_circles: int = 26
    crowd_sigma: float = 0.05
    kind: str = "packing"
    best_known: float = 2.635  # n = 26, AlphaEvolve (2025)

    def score(self, centres) -> tuple[float, str]:
        r = lp_radii(centres)
        return float(r.sum()), self.key(centres)

    def key(self, centres) -> str:
        return np.round(centres, 5).tobytes().hex()

    # -- the reference's reward and score: OpenEvolve's combined_score = sum of radii / 2.635 --
    def ref_score(self, q):
        return np.asarray(q, dtype=float) / self.best_known

    def log_reward(self, q):
        return np.log(np.maximum(self.ref_score(q), 1e-12))

    def valid(self, centres) -> bool:
        return centres.shape == (self.n_circles, 2) and bool(np.all((centres >= 0) & (centres <= 1)))

    def features(self, centres):
        return centres

    def distance(self, fa, fb, symmetric: bool = True) -> float:
        return matched_distance(fa, fb, symmetric)

    def similarity(self, fa, fb) -> float:
        # the crowding penalty skips the 8 symmetries (8x cheaper): offspring share their
        # parents' orientation, so near-copies are found without them
        return float(np.exp(-matched_distance(fa, fb, symmetric=False) / self.crowd_sigma))

    def random(self, rng):
        return rng.uniform(0.0, 1.0, size=(self.n_circles, 2))

    def mutate(self, centres, rng):
        """Parameter perturbation: jitter every centre, jitter one, or move one anywhere."""
        c = centres.copy()
        move = rng.choice(["all", "one", "teleport"], p=[0.5, 0.3, 0.2])
        if move == "all":
            c += 10.0 ** rng.uniform(-3.0, -1.3) * rng.standard_normal(c.shape)
        elif move == "one":
            i = rng.integers(len(c))
            c[i] += 0.1 * rng.standard_normal(2)
        else:
            c[rng.integers(len(c))] = rng.uniform(0.0, 1.0, 2)
        return np.clip(c, 0.0, 1.0)

    def crossover(self, a, b, rng):
        """Left of a random vertical cut from ``a``, right of it from ``b``; surplus centres dropped
        at random, missing ones placed uniformly."""
        cut = rng.uniform(0.2, 0.8)
        c = np.concatenate([a[a[:, 0] < cut], b[b[:, 0] >= cut]])
        n = self.n_circles
        if len(c) > n:
            c = c[rng.choice(len(c), n, replace=False)]
        elif len(c) < n:
            c = np.concatenate([c, rng.uniform(0.0, 1.0, size=(n - len(c), 2))])
        return c

    def to_text(self, centres) -> str:
        return json.dumps([[round(float(x), 4), round(float(y), 4)] for x, y in centres])

    def parse(self, text: str):
        start, stop = text.find("[["), text.rfind("]]")
        if start < 0 or stop < start:
            raise ex.ParseError("no [[x, y], ...] list in the reply")
        try:
            c = np.asarray(json.loads(text[start:stop + 2]), dtype=float)
        except (ValueError, TypeError) as err:
            raise ex.ParseError("the centre list is not valid JSON numbers") from err
        if c.shape != (self.n_circles, 2):
            raise ex.ParseError(f"expected {self.n_circles} centres [x, y], got shape {c.shape}")
        return np.clip(c, 0.0, 1.0)

    def describe(self) -> str:
        return (f"Place {self.n_circles} circle centres in the unit square; the radii that maximise "
                f"their sum without overlap are then computed. Score: the sum of radii (higher is "
                f"better; best known for 26 circles 2.635). Reply with a JSON list [[x, y], ...] of "
                f"{self.n_circles} centres in [0, 1].")
