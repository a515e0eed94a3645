"""Learning rates chosen once on validation and fixed in a config table, shared by every method.

Piloting the whole rate grid in every fit of every seed is the largest cost that decides nothing at
smoke: the pilots of seeds 1 and 2 mostly repeat seed 0's choice. The cheaper protocol, still the
same for every model of a comparison, is to pilot the grid once (one seed, validation data only),
write the chosen rate per variant (and per dataset, where a method has several) into the config's
``lr`` table, and train every seed at that rate under the same plateau rule. The grid stays in the
config (``fit.lr_grid``) so the choice can be rerun and so an edge choice stays visible: a rate at
the grid's edge means the grid did not bracket it, whether it was piloted now or once before.

``fit_with_table_rate`` turns a ``fit`` config into the one-rate config the shared rule
(``blocks.fitting.fit_to_plateau``) then runs without pilots (a one-rate grid has no pilot to
discard: its pilot steps are the first steps of the run itself). The rule's own record then says
nothing about the grid (one rate brackets nothing), so ``stamp_source`` writes the rate's source and
its edge on the configured grid into that record: one place, not one patch per method.
"""
from __future__ import annotations


def grid_edge(rate: float, grid) -> str | None:
    """``"top"`` or ``"bottom"`` when ``rate`` is the grid's largest or smallest rate, else None (also
    for a grid of fewer than two rates, which brackets nothing)."""
    g = sorted(float(x) for x in grid)
    if len(g) < 2:
        return None
    return "top" if float(rate) == g[-1] else "bottom" if float(rate) == g[0] else None


def table_rate(table: dict | None, *keys: str, required: bool = True, where: str = "lr") -> float | None:
    """The rate at ``table[keys[0]][keys[1]]...``; a missing entry raises (naming the path and the
    entries the table has) when ``required``, else returns None (the caller pilots the grid)."""
    node = table
    for depth, k in enumerate(keys):
        if not isinstance(node, dict) or k not in node:
            if not required:
                return None
            have = sorted(node) if isinstance(node, dict) else []
            path = ".".join([where, *keys[: depth + 1]])
            raise KeyError(f"config `{path}`: no rate (the table has {have}); pilot the grid on validation "
                           f"and add the chosen rate")
        node = node[k]
    rate = float(node)
    if not rate > 0:
        raise ValueError(f"config `{'.'.join([where, *keys])}`: rate {node!r} must be positive")
    return rate


def fit_with_table_rate(fit: dict, table: dict | None, *keys: str, required: bool = True,
                        where: str = "lr") -> tuple[dict, dict]:
    """``(fit config, record)``: with a table entry, a copy of ``fit`` whose ``lr_grid`` is that one
    rate, and the record ``{"lr_source": "table", "lr_edge": its edge on fit's grid}``; without a
    table (or, when not ``required``, without the entry) ``fit`` unchanged and ``lr_source: grid``
    (the shared rule pilots the grid and reports its own edge)."""
    rate = table_rate(table, *keys, required=required, where=where) if table else None
    if rate is None:
        return fit, {"lr_source": "grid", "lr_edge": None}
    out = dict(fit)
    out["lr_grid"] = [rate]
    return out, {"lr_source": "table", "lr_edge": grid_edge(rate, fit.get("lr_grid", [rate]))}


def stamp_source(rec: dict, source: dict) -> dict:
    """Write ``source`` (the record of ``fit_with_table_rate``) into ``rec`` (the shared rule's record of
    the fit that used it): ``lr_source`` always, and for a table rate its ``lr_edge`` on the configured
    grid, which the rule could not see (it ran a one-rate grid); a piloted grid keeps the rule's own
    edge. Returns ``rec``."""
    rec["lr_source"] = source["lr_source"]
    if source["lr_source"] == "table":
        rec["lr_edge"] = source["lr_edge"]
    return rec
