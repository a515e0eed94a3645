"""Expressions: prefix token lists, the Symbolic Perfect Binary Tree (SPBT) scaffold, rewards,
structural constraints and the exact-recovery check. numpy only (sympy imported lazily).

Library (Koza set of the Nguyen benchmarks, as in DSR, Petersen et al. ICLR 2021)::

    binary: add sub mul div      unary: sin cos exp log      terminal: x

An expression is a prefix (pre-order) list of token ids, e.g. x*x + x -> [add, mul, x, x, x].

SPBT scaffold of depth D (edges root -> leaf): a perfect binary tree with N = 2^(D+1) - 1 node
slots in heap order (node i has children 2i+1 and 2i+2, level(i) = floor(log2(i+1))). An
expression of depth <= D is the node-attribute vector ``a in {tokens, EMPTY}^N``: the root slot
holds the root symbol, a binary node's two children hold its operands, a unary node's operand sits
in its LEFT child and its right child is EMPTY, a terminal's children are EMPTY, and the subtree
below an EMPTY slot is EMPTY. The topology is the same for every expression, so a batch of
expressions of different shapes is one ``(B, N)`` integer array and a graph network runs on all of
them at once; the map prefix <-> SPBT is a bijection on expressions of depth <= D.

Reward (DSR): R = 1 / (1 + NRMSE), NRMSE = RMSE(y_hat, y) / std(y); non-finite outputs give R = 0.
Operators are unprotected (a division by zero or log of a negative number is non-finite and
scores 0): the Nguyen targets never need protection on their domains.

Structural constraints (DSR's in-situ priors, applied while sampling by both neural policies):
a slot at level D must be a terminal; the child of exp is not log and vice versa; sin/cos never
appear below sin/cos. They depend only on a slot's ancestors, which every decoder has already
fixed when it decodes that slot.
"""
from __future__ import annotations

import numpy as np

NAMES = ("add", "sub", "mul", "div", "sin", "cos", "exp", "log", "x")
ARITY = np.array([2, 2, 2, 2, 1, 1, 1, 1, 0])
ADD, SUB, MUL, DIV, SIN, COS, EXP, LOG, X = range(9)
V = len(NAMES)          # choosable symbols
EMPTY = V               # SPBT slot not used by the expression
UNASSIGNED = V + 1      # SPBT slot not decoded yet (GCN input only)
TRIG = (SIN, COS)
INVERSE = {EXP: LOG, LOG: EXP}


# --- prefix lists --------------------------------------------------------------------------------

def evaluate(prefix, x: np.ndarray) -> np.ndarray:
    """Value of a prefix expression at the points ``x`` (unprotected operators)."""
    stack = []
    with np.errstate(all="ignore"):
        for t in reversed(prefix):
            if t == X:
                stack.append(x)
            elif ARITY[t] == 1:
                a = stack.pop()
                stack.append(np.sin(a) if t == SIN else np.cos(a) if t == COS else
                             np.exp(a) if t == EXP else np.log(a))
            else:
                a, b = stack.pop(), stack.pop()
                stack.append(a + b if t == ADD else a - b if t == SUB else a * b if t == MUL else a / b)
    out = stack.pop()
    return np.broadcast_to(out, x.shape)


def reward(prefix, x: np.ndarray, y: np.ndarray) -> float:
    """1 / (1 + NRMSE) on the data (x, y); 0 for non-finite predictions."""
    yh = evaluate(prefix, x)
    if not np.all(np.isfinite(yh)):
        return 0.0
    with np.errstate(all="ignore"):
        nrmse = np.sqrt(np.mean((yh - y) ** 2)) / np.std(y)
    return float(1.0 / (1.0 + nrmse)) if np.isfinite(nrmse) else 0.0


def spbt_rewards(a: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`reward` of every SPBT of ``a (B, N)`` at once (bit-identical to the per-expression
    stack machine: the same operations on the same operands in the same order). Slots are
    evaluated bottom-up, one level at a time, for the whole batch; an EMPTY slot's value is never
    read by its parent (a unary node reads its left child only)."""
    a = np.atleast_2d(a)
    bsz, n = a.shape
    lev = levels(int(np.log2(n + 1)) - 1)
    val = np.zeros((bsz, n, len(x)))
    with np.errstate(all="ignore"):
        for d in range(int(lev.max()), -1, -1):
            sl = np.flatnonzero(lev == d)
            t = a[:, sl][..., None]
            out = np.where(t == X, x, 0.0)
            if 2 * sl[-1] + 2 < n:
                l, r = val[:, 2 * sl + 1], val[:, 2 * sl + 2]
                for tok, f in ((ADD, np.add), (SUB, np.subtract), (MUL, np.multiply), (DIV, np.divide)):
                    m = t[..., 0] == tok
                    if m.any():
                        out[m] = f(l[m], r[m])
                for tok, f in ((SIN, np.sin), (COS, np.cos), (EXP, np.exp), (LOG, np.log)):
                    m = t[..., 0] == tok
                    if m.any():
                        out[m] = f(l[m])
            val[:, sl] = out
        yh = val[:, 0]
        finite = np.all(np.isfinite(yh), axis=1)
        nrmse = np.sqrt(np.mean((yh - y) ** 2, axis=1)) / np.std(y)
        r = 1.0 / (1.0 + nrmse)
    return np.where(finite & np.isfinite(nrmse), r, 0.0)


def prefix_rewards(prefixes, x: np.ndarray, y: np.ndarray, max_depth: int) -> np.ndarray:
    """:func:`reward` of prefix expressions of depth <= ``max_depth``, batched via the SPBT."""
    if len(prefixes) == 0:
        return np.zeros(0)
    return spbt_rewards(np.array([prefix_to_spbt(p, max_depth) for p in prefixes]), x, y)


def subtree_end(prefix, start: int) -> int:
    """Index one past the subtree rooted at ``prefix[start]``."""
    need, i = 1, start
    while need:
        need += ARITY[prefix[i]] - 1
        i += 1
    return i


def depth(prefix) -> int:
    """Edges on the longest root -> leaf path."""
    best, pending = 0, [0]   # depth of each operand slot still to be filled
    for t in prefix:
        d = pending.pop()
        best = max(best, d)
        pending.extend([d + 1] * int(ARITY[t]))
    return best


def to_string(prefix) -> str:
    """Infix string, e.g. 'add(mul(x, x), x)'."""
    def rec(i):
        t = prefix[i]
        if ARITY[t] == 0:
            return NAMES[t], i + 1
        args, j = [], i + 1
        for _ in range(ARITY[t]):
            s, j = rec(j)
            args.append(s)
        return f"{NAMES[t]}({', '.join(args)})", j
    return rec(0)[0]


def to_sympy(prefix, x_sym):
    """The expression as a sympy object (pure, unprotected operators)."""
    import sympy as sp

    fns = {ADD: lambda a, b: a + b, SUB: lambda a, b: a - b, MUL: lambda a, b: a * b,
           DIV: lambda a, b: a / b, SIN: sp.sin, COS: sp.cos, EXP: sp.exp, LOG: sp.log}
    stack = []
    for t in reversed(prefix):
        if t == X:
            stack.append(x_sym)
        elif ARITY[t] == 1:
            stack.append(fns[t](stack.pop()))
        else:
            a, b = stack.pop(), stack.pop()
            stack.append(fns[t](a, b))
    return stack.pop()


# --- SPBT scaffold -------------------------------------------------------------------------------

def n_nodes(max_depth: int) -> int:
    return 2 ** (max_depth + 1) - 1


def levels(max_depth: int) -> np.ndarray:
    """Level (depth) of each heap slot."""
    return np.floor(np.log2(np.arange(n_nodes(max_depth)) + 1)).astype(int)


def tree_adjacency(max_depth: int) -> np.ndarray:
    """Undirected parent-child adjacency of the perfect binary tree."""
    n = n_nodes(max_depth)
    a = np.zeros((n, n))
    for i in range(1, n):
        p = (i - 1) // 2
        a[i, p] = a[p, i] = 1.0
    return a


def prefix_to_spbt(prefix, max_depth: int) -> np.ndarray:
    """Heap-ordered SPBT attributes of a prefix expression of depth <= max_depth."""
    n = n_nodes(max_depth)
    a = np.full(n, EMPTY, dtype=np.int64)
    slots = [0]
    for t in prefix:
        i = slots.pop()
        if i >= n:
            raise ValueError(f"expression deeper than the scaffold (depth {max_depth})")
        a[i] = t
        if ARITY[t] == 2:
            slots.extend([2 * i + 2, 2 * i + 1])   # left operand popped first
        elif ARITY[t] == 1:
            slots.append(2 * i + 1)
    return a


def spbt_to_prefix(a: np.ndarray) -> list[int]:
    """Pre-order read-out of an SPBT (inverse of :func:`prefix_to_spbt`)."""
    return [int(a[i]) for i in preorder_slots(a)]


def preorder_slots(a: np.ndarray) -> list[int]:
    """Heap slots of the used nodes of an SPBT in pre-order (the order an RNN decodes them)."""
    out, stack = [], [0]
    while stack:
        i = stack.pop()
        out.append(i)
        t = int(a[i])
        if ARITY[t] == 2:
            stack.extend([2 * i + 2, 2 * i + 1])
        elif ARITY[t] == 1:
            stack.append(2 * i + 1)
    return out


def spbt_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Positional similarity on the scaffold: |slots where both agree on a symbol| /
    |slots used by either|, in [0, 1], 1 iff identical. ``a (B, N)``, ``b (K, N)`` -> ``(B, K)``."""
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    used_a, used_b = a != EMPTY, b != EMPTY
    agree = ((a[:, None, :] == b[None, :, :]) & used_a[:, None, :]).sum(-1)
    union = (used_a[:, None, :] | used_b[None, :, :]).sum(-1)
    return agree / np.maximum(union, 1)


# --- structural constraints ----------------------------------------------------------------------

def allowed_symbols(parent: np.ndarray, trig_above: np.ndarray, level: np.ndarray, max_depth: int) -> np.ndarray:
    """Boolean ``(..., V)`` mask of the symbols a slot may take, from its parent's symbol
    (-1 for the root), whether sin/cos occurs among its ancestors, and its level."""
    parent, trig_above, level = np.broadcast_arrays(np.asarray(parent), np.asarray(trig_above), np.asarray(level))
    m = np.ones(parent.shape + (V,), dtype=bool)
    m[level >= max_depth, :] = ARITY == 0
    m[parent == EXP, LOG] = False
    m[parent == LOG, EXP] = False
    m[trig_above, SIN] = False
    m[trig_above, COS] = False
    return m


def scaffold_context(a: np.ndarray, max_depth: int):
    """For every slot of SPBTs ``a (B, N)``: whether it is used given its ancestors (``active``),
    its parent's symbol, whether sin/cos is above it, and the allowed-symbol mask ``(B, N, V)``.
    Slots whose ancestors are not decoded yet (UNASSIGNED) come out inactive."""
    a = np.atleast_2d(a)
    bsz, n = a.shape
    lev = levels(max_depth)
    active = np.zeros((bsz, n), dtype=bool)
    parent = np.full((bsz, n), -1, dtype=np.int64)
    trig = np.zeros((bsz, n), dtype=bool)
    active[:, 0] = True
    idx = np.arange(1, n)
    p = (idx - 1) // 2
    is_left = (idx % 2) == 1
    for d in range(1, max_depth + 1):
        sl = (lev[idx] == d)
        ci, pi, left = idx[sl], p[sl], is_left[sl]
        pt = a[:, pi]
        known = pt < V
        ar = np.where(known, ARITY[np.minimum(pt, V - 1)], 0)
        active[:, ci] = active[:, pi] & known & ((ar == 2) | ((ar == 1) & left[None, :]))
        parent[:, ci] = pt
        trig[:, ci] = trig[:, pi] | (pt == SIN) | (pt == COS)
    mask = allowed_symbols(parent, trig, lev[None, :], max_depth)
    return active, parent, trig, mask


def satisfies_constraints(a: np.ndarray, max_depth: int) -> bool:
    """True if a complete SPBT obeys the constraints the neural policies sample under."""
    return bool(constraints_ok(a[None], max_depth)[0])


def constraints_ok(a: np.ndarray, max_depth: int) -> np.ndarray:
    """:func:`satisfies_constraints` for every SPBT of ``a (B, N)`` at once."""
    active, _, _, mask = scaffold_context(a, max_depth)
    used = a != EMPTY
    tok = np.where(used, a, 0)
    ok = np.take_along_axis(mask, tok[..., None], -1)[..., 0] | ~used
    return np.all(used == active, axis=1) & np.all(ok, axis=1)


def prefix_ok(prefix, max_depth: int) -> bool:
    """:func:`satisfies_constraints` on a prefix expression, without building its SPBT (the GP's
    per-child check): depth <= ``max_depth``, no exp(log(.)) / log(exp(.)), no sin/cos below
    sin/cos."""
    pending = [(0, -1, False)]            # (depth, parent symbol, sin/cos above) of open slots
    for t in prefix:
        d, parent, trig = pending.pop()
        if d > max_depth or (trig and t in TRIG) or INVERSE.get(parent) == t:
            return False
        ar = ARITY[t]
        if ar:
            below = trig or t in TRIG
            pending.extend([(d + 1, t, below)] * int(ar))
    return True


class Scorer:
    """Rewards on the data (x, y) with a cache: every distinct expression is evaluated and
    charged to the evaluation budget once, whoever proposes it (a generator sample, a GP child,
    an elite copy); repeats are free. The same rule for every variant.

    ``score(prefixes)`` (or ``score_spbt(a)``) returns the rewards of the longest leading part of
    the list whose new expressions fit in the budget left, so ``len(result) < len(input)`` means
    the budget ran out inside this call.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, max_depth: int, budget: int):
        self.x, self.y, self.max_depth, self.budget = x, y, max_depth, int(budget)
        self.cache: dict[tuple, float] = {}
        self.evals = 0          # distinct expressions charged
        self.proposed = 0       # expressions scored, repeats included

    @property
    def spent(self) -> bool:
        return self.evals >= self.budget

    def _new(self, keys):
        new, cut = {}, len(keys)
        for i, k in enumerate(keys):
            if k not in self.cache and k not in new:
                if self.evals + len(new) >= self.budget:
                    cut = i
                    break
                new[k] = i
        return new, cut

    def _finish(self, keys, new, r_new, cut) -> np.ndarray:
        for k, r in zip(new, r_new):
            self.cache[k] = float(r)
        self.evals += len(new)
        self.proposed += cut
        return np.array([self.cache[k] for k in keys[:cut]], dtype=float)

    def __call__(self, prefixes) -> np.ndarray:
        keys = [tuple(p) for p in prefixes]
        new, cut = self._new(keys)
        r_new = prefix_rewards([prefixes[i] for i in new.values()], self.x, self.y, self.max_depth)
        return self._finish(keys, new, r_new, cut)

    def score_spbt(self, a: np.ndarray, prefixes) -> np.ndarray:
        """Rewards of SPBTs ``a (B, N)`` whose prefixes are ``prefixes`` (cache keys)."""
        keys = [tuple(p) for p in prefixes]
        new, cut = self._new(keys)
        idx = list(new.values())
        r_new = spbt_rewards(a[idx], self.x, self.y) if idx else np.zeros(0)
        return self._finish(keys, new, r_new, cut)


# --- exact recovery -------------------------------------------------------------------------------

def symbolically_equal(prefix, truth: str, domain: tuple[float, float], n_check: int = 400) -> bool:
    """Exact recovery: the candidate equals the target expression after sympy simplification.

    A numeric screen on ``n_check`` points of the domain first rejects non-matches cheaply (and
    candidates that are undefined on the domain); then ``simplify(candidate - truth) == 0``, with
    log expansion as a second try (sympy expands log(ab) = log(a) + log(b) only where it can prove
    a, b > 0, hence the symbol is declared nonnegative on domains such as Nguyen-7's [0, 2]).
    """
    import sympy as sp

    sign = {"positive": True} if domain[0] > 0 else {"nonnegative": True} if domain[0] == 0 else {}
    x = sp.Symbol("x", real=True, **sign)
    target = sp.sympify(truth, locals={"x": x})
    cand = to_sympy(prefix, x)
    if cand.has(sp.zoo, sp.nan, sp.oo, -sp.oo):      # e.g. x / (x - x): undefined everywhere
        return False
    xs = np.linspace(domain[0], domain[1], n_check)
    with np.errstate(all="ignore"):
        yc = np.broadcast_to(np.asarray(sp.lambdify(x, cand, "numpy")(xs), dtype=float), xs.shape)
        yt = np.broadcast_to(np.asarray(sp.lambdify(x, target, "numpy")(xs), dtype=float), xs.shape)
    ok = np.isfinite(yt)
    if not np.all(np.isfinite(yc[ok])) or not np.allclose(yc[ok], yt[ok], rtol=1e-6, atol=1e-9):
        return False
    diff = sp.simplify(cand - target)
    if diff == 0:
        return True
    return sp.simplify(sp.expand_log(sp.expand(diff))) == 0
