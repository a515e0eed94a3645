"""Expression trees for equation discovery: evaluation, printing, parsing, edits, distance.

A hypothesis is a formula f(x) over the task's named variables, stored as nested tuples:

    ("x", i)                 variable i
    ("k", v)                 a constant from the small set CONSTANTS (discrete, so that two
                             hypotheses are the same structure or not: no near-duplicate constants)
    (op, a)                  unary op in UNARY: neg, sq, sqrt, exp, log, sin, cos
    (op, a, b)               binary op in BINARY: add, sub, mul, div

The oracle fits y ~ a * f(x) + b by least squares (linear scaling, Keijzer 2003), so overall
factors such as 1/(4 pi eps0) need not be spelled out. Printing gives a Python expression over the
variable names ("q1 * q2 / r**2"), which is what an LLM proposer reads and writes back; ``parse``
turns such text into a tree through Python's ``ast`` (no ``eval``) and rejects anything outside the
grammar. ``subtree_set`` is the structure used by the diversity metric: two formulas are close when
they share many subtrees (Jaccard distance over the sets of subtrees).
"""
from __future__ import annotations

import ast
import math
from typing import Sequence

import numpy as np

UNARY = ("neg", "sq", "sqrt", "exp", "log", "sin", "cos")
BINARY = ("add", "sub", "mul", "div")
CONSTANTS = (0.5, 1.0, 2.0, 3.0)
_BIN_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_PREC = {"add": 1, "sub": 1, "mul": 2, "div": 2}


class ParseError(ValueError):
    """Text that is not a formula of the grammar (unknown name, function or syntax)."""


# --- evaluation --------------------------------------------------------------------------------

def evaluate(tree, X: np.ndarray) -> np.ndarray:
    """f(X) for X of shape (n_points, n_vars); non-finite values are left for the caller to reject."""
    op = tree[0]
    if op == "x":
        return X[:, tree[1]]
    if op == "k":
        return np.full(len(X), float(tree[1]))
    a = evaluate(tree[1], X)
    if op in BINARY:
        b = evaluate(tree[2], X)
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        return a / b
    if op == "neg":
        return -a
    if op == "sq":
        return a * a
    if op == "sqrt":
        return np.sqrt(a)
    if op == "exp":
        return np.exp(np.minimum(a, 50.0))
    if op == "log":
        return np.log(a)
    if op == "sin":
        return np.sin(a)
    if op == "cos":
        return np.cos(a)
    raise ValueError(f"unknown operator {op!r}")


# --- printing and parsing ------------------------------------------------------------------------

def _fmt_const(v: float) -> str:
    return repr(float(v)).rstrip("0").rstrip(".") if float(v) != int(v) else str(int(v))


def to_str(tree, names: Sequence[str], parent_prec: int = 0) -> str:
    """Python-syntax text of the formula with minimal parentheses."""
    op = tree[0]
    if op == "x":
        return names[tree[1]]
    if op == "k":
        return _fmt_const(tree[1])
    if op in BINARY:
        prec = _PREC[op]
        left = to_str(tree[1], names, prec)
        # right operand of - and / needs brackets at equal precedence (a - (b - c))
        right = to_str(tree[2], names, prec + (op in ("sub", "div")))
        s = f"{left} {_BIN_SYM[op]} {right}"
        return f"({s})" if prec < parent_prec else s
    if op == "neg":
        s = "-" + to_str(tree[1], names, 3)
        return f"({s})" if parent_prec > 0 else s
    if op == "sq":
        return f"{to_str(tree[1], names, 4)}**2"
    return f"{op}({to_str(tree[1], names)})"


_FUNCS = {"sqrt", "exp", "log", "sin", "cos"}
_NAMED_CONSTS = {"pi": math.pi, "e": math.e}


def _extract_formula(text: str) -> str:
    """The formula inside a model's reply: code fences, 'y = ...', 'return ...' and prose stripped."""
    t = text.strip()
    if "```" in t:
        parts = t.split("```")
        t = parts[1] if len(parts) > 1 else parts[0]
        t = t.split("\n", 1)[1] if t.split("\n", 1)[0].strip().isalpha() else t
    lines = [ln.strip() for ln in t.strip().splitlines() if ln.strip()]
    if not lines:
        raise ParseError("empty reply")
    line = lines[-1]
    for ln in lines:  # prefer a line that states the formula explicitly
        if ln.startswith(("y =", "f =", "y=", "f=", "return ", "formula:", "Formula:")):
            line = ln
    for prefix in ("return ", "formula:", "Formula:"):
        if line.startswith(prefix):
            line = line[len(prefix):]
    if "=" in line:
        line = line.split("=", 1)[1]
    return line.strip().rstrip(";").strip()


def parse(text: str, names: Sequence[str]):
    """Tree of a formula written in Python syntax over ``names`` (np./math. prefixes allowed)."""
    src = _extract_formula(text)
    try:
        node = ast.parse(src, mode="eval").body
    except SyntaxError as err:
        raise ParseError(f"not a Python expression: {src!r}") from err
    index = {n: i for i, n in enumerate(names)}

    def conv(n):
        if isinstance(n, ast.BinOp):
            a = conv(n.left)
            if isinstance(n.op, ast.Pow):
                p = _number(n.right)
                if p == 2:
                    return ("sq", a)
                if p == 0.5:
                    return ("sqrt", a)
                if p == 3:
                    return ("mul", ("sq", a), a)
                if p == -1:
                    return ("div", ("k", 1.0), a)
                if p == -2:
                    return ("div", ("k", 1.0), ("sq", a))
                raise ParseError(f"power {p} is outside the grammar (2, 3, 0.5, -1, -2)")
            ops = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
            if type(n.op) not in ops:
                raise ParseError(f"operator {type(n.op).__name__} is outside the grammar")
            return (ops[type(n.op)], a, conv(n.right))
        if isinstance(n, ast.UnaryOp):
            if isinstance(n.op, ast.USub):
                return ("neg", conv(n.operand))
            if isinstance(n.op, ast.UAdd):
                return conv(n.operand)
            raise ParseError("unary operator outside the grammar")
        if isinstance(n, ast.Call):
            fn = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
            if fn not in _FUNCS or len(n.args) != 1 or n.keywords:
                raise ParseError(f"function {fn!r} is outside the grammar ({sorted(_FUNCS)})")
            return (fn, conv(n.args[0]))
        if isinstance(n, ast.Name):
            if n.id in index:
                return ("x", index[n.id])
            if n.id in _NAMED_CONSTS:
                return ("k", _NAMED_CONSTS[n.id])
            raise ParseError(f"unknown variable {n.id!r}; the variables are {list(names)}")
        if isinstance(n, ast.Attribute) and n.attr in _NAMED_CONSTS:
            return ("k", _NAMED_CONSTS[n.attr])
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return ("k", float(n.value))
        raise ParseError(f"{type(n).__name__} is outside the grammar")

    return conv(node)


def _number(n) -> float:
    if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
        return float(n.value)
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
        return -_number(n.operand)
    raise ParseError("exponents must be numbers")


# --- structure -----------------------------------------------------------------------------------

def subtrees(tree, path=()):
    """(path, subtree) for every node, pre-order; a path is the tuple of child indices (1 or 2)."""
    yield path, tree
    if tree[0] in BINARY or tree[0] in UNARY:
        for i in range(1, len(tree)):
            yield from subtrees(tree[i], path + (i,))


def size(tree) -> int:
    return sum(1 for _ in subtrees(tree))


def depth(tree) -> int:
    if tree[0] in ("x", "k"):
        return 1
    return 1 + max(depth(c) for c in tree[1:])


def replace(tree, path, new):
    if not path:
        return new
    i = path[0]
    return tree[:i] + (replace(tree[i], path[1:], new),) + tree[i + 1:]


def key(tree) -> str:
    """Canonical text of the tree (constants by value): equal keys, equal formulas as written."""
    op = tree[0]
    if op == "x":
        return f"x{tree[1]}"
    if op == "k":
        return _fmt_const(tree[1])
    return f"{op}(" + ",".join(key(c) for c in tree[1:]) + ")"


def subtree_set(tree) -> frozenset:
    """The set of distinct subtrees (as keys): the structural fingerprint for diversity."""
    return frozenset(key(t) for _, t in subtrees(tree))


def jaccard_distance(a: frozenset, b: frozenset) -> float:
    union = len(a | b)
    return 0.0 if union == 0 else 1.0 - len(a & b) / union


# --- random trees and edits (the offline symbolic proposer's moves) --------------------------------

def random_tree(rng: np.random.Generator, n_vars: int, max_depth: int = 3, p_leaf: float = 0.3):
    """Grow method: a node is a leaf with probability p_leaf (always at max_depth)."""
    if max_depth <= 1 or rng.random() < p_leaf:
        if rng.random() < 0.75:
            return ("x", int(rng.integers(n_vars)))
        return ("k", float(rng.choice(CONSTANTS)))
    if rng.random() < 0.6:
        op = str(rng.choice(BINARY))
        return (op, random_tree(rng, n_vars, max_depth - 1, p_leaf), random_tree(rng, n_vars, max_depth - 1, p_leaf))
    return (str(rng.choice(UNARY)), random_tree(rng, n_vars, max_depth - 1, p_leaf))


def _point(node, rng, n_vars):
    op = node[0]
    if op == "x":
        return ("x", int(rng.integers(n_vars))) if n_vars > 1 else ("k", float(rng.choice(CONSTANTS)))
    if op == "k":
        return ("k", float(rng.choice([c for c in CONSTANTS if c != node[1]])))
    pool = BINARY if op in BINARY else UNARY
    return (str(rng.choice([o for o in pool if o != op])),) + node[1:]


def mutate(tree, rng: np.random.Generator, n_vars: int):
    """One random edit: subtree replacement, point change, wrapping in an operator, or hoisting."""
    nodes = list(subtrees(tree))
    path, node = nodes[int(rng.integers(len(nodes)))]
    move = rng.choice(["subtree", "point", "wrap", "hoist"], p=[0.3, 0.3, 0.25, 0.15])
    if move == "subtree":
        new = random_tree(rng, n_vars, max_depth=2 + int(rng.integers(2)))
    elif move == "point":
        new = _point(node, rng, n_vars)
    elif move == "wrap":
        if rng.random() < 0.4:
            new = (str(rng.choice(UNARY)), node)
        else:
            leaf = random_tree(rng, n_vars, max_depth=1)
            op = str(rng.choice(BINARY))
            new = (op, node, leaf) if rng.random() < 0.5 else (op, leaf, node)
    else:  # hoist: replace the node by one of its children (shrinks bloated trees)
        new = node[1 + int(rng.integers(len(node) - 1))] if node[0] not in ("x", "k") else _point(node, rng, n_vars)
    return replace(tree, path, new)


def crossover(a, b, rng: np.random.Generator):
    """A random subtree of ``a`` replaced by a random subtree of ``b``."""
    na, nb = list(subtrees(a)), list(subtrees(b))
    path, _ = na[int(rng.integers(len(na)))]
    _, donor = nb[int(rng.integers(len(nb)))]
    return replace(a, path, donor)
