"""GP-only baseline: gplearn's SymbolicRegressor under the same evaluation budget.

gplearn evaluates every program of every generation, so ``population * generations = budget``
evaluations. Its operators are protected (division by |b| < 0.001 gives 1, log|a|), exp is added
as a protected unary (clipped argument). Selection runs on gplearn's fitness; the run's answer is
picked exactly as for the neural variants: every program gplearn evaluated is re-scored with our
unprotected reward 1/(1 + NRMSE) and the best one is checked for exact recovery.

gplearn 0.4.2 calls ``BaseEstimator._validate_data``, which scikit-learn 1.6 removed; the shim
below forwards it to ``sklearn.utils.validation.validate_data`` (same arguments).
"""
from __future__ import annotations

import numpy as np

from .expressions import NAMES, X, reward
from .search import EXACT_REWARD, Hall


def _regressor_class():
    from gplearn.genetic import SymbolicRegressor
    from sklearn.utils.validation import validate_data

    class _SymbolicRegressor(SymbolicRegressor):
        def _validate_data(self, *args, **kwargs):
            return validate_data(self, *args, **kwargs)

    return _SymbolicRegressor


def _protected_exp(a):
    with np.errstate(over="ignore"):
        return np.exp(np.clip(a, -50.0, 50.0))


def _inv_nrmse(y, y_pred, w):
    with np.errstate(all="ignore"):
        nrmse = np.sqrt(np.average((y_pred - y) ** 2, weights=w)) / np.std(y)
    return float(1.0 / (1.0 + nrmse)) if np.isfinite(nrmse) else 0.0


def program_to_prefix(program) -> list[int]:
    """gplearn program (list of _Function / feature index) -> our prefix token ids."""
    out = []
    for node in program:
        if isinstance(node, (int, np.integer)):
            if node != 0:
                raise ValueError("single-variable tasks only")
            out.append(X)
        elif hasattr(node, "name"):
            out.append(NAMES.index(node.name))
        else:
            raise ValueError(f"constant {node!r} in a constant-free run")
    return out


def run_gplearn(x: np.ndarray, y: np.ndarray, cfg: dict, seed: int) -> Hall:
    from gplearn.fitness import make_fitness
    from gplearn.functions import make_function

    g = cfg["gplearn"]
    pop = g["population"]
    generations = max(1, cfg["budget"] // pop)
    exp = make_function(function=_protected_exp, name="exp", arity=1)
    est = _regressor_class()(
        population_size=pop, generations=1, tournament_size=g["tournament"],
        function_set=("add", "sub", "mul", "div", "sin", "cos", exp, "log"),
        metric=make_fitness(function=_inv_nrmse, greater_is_better=True),
        init_depth=(2, cfg["max_depth"]), init_method="half and half", const_range=None,
        p_crossover=g["p_crossover"], p_subtree_mutation=g["p_subtree_mutation"],
        p_hoist_mutation=g["p_hoist_mutation"], p_point_mutation=g["p_point_mutation"],
        parsimony_coefficient=g["parsimony"], max_samples=1.0, n_jobs=1, random_state=seed,
        verbose=0, warm_start=True, low_memory=True)
    hall = Hall()
    # one generation per fit call (warm start): with low_memory gplearn keeps only the latest
    # population, so each population is read right after it is evaluated; the run stops at an
    # exact fit under our reward, as the neural variants do
    for gen in range(1, generations + 1):
        est.set_params(generations=gen)
        with np.errstate(all="ignore"):
            est.fit(x[:, None], y)
        prefixes = [program_to_prefix(p.program) for p in est._programs[-1]]
        hall.add(prefixes, [reward(p, x, y) for p in prefixes])
        if hall.exact:
            break
    return hall
