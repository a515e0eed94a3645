"""The shared table of rates chosen once on validation (blocks.rate_table)."""
import pytest

from reprozoo.blocks.rate_table import fit_with_table_rate, grid_edge, stamp_source, table_rate

FIT = {"lr_grid": [1e-3, 3e-3, 1e-2], "pilot_steps": 100}


def test_grid_edge_names_the_edges_and_not_the_interior():
    assert grid_edge(1e-2, FIT["lr_grid"]) == "top"
    assert grid_edge(1e-3, FIT["lr_grid"]) == "bottom"
    assert grid_edge(3e-3, FIT["lr_grid"]) is None
    assert grid_edge(3e-3, [3e-3]) is None  # one rate brackets nothing


def test_table_rate_walks_nested_keys_and_names_a_missing_entry():
    table = {"cbit": {"co2": 3e-3}, "brits": 1e-2}
    assert table_rate(table, "cbit", "co2") == 3e-3
    assert table_rate(table, "brits") == 1e-2
    with pytest.raises(KeyError, match=r"lr\.cbit\.lorenz96.*\['co2'\]"):
        table_rate(table, "cbit", "lorenz96")
    assert table_rate(table, "saits", required=False) is None
    with pytest.raises(ValueError, match="must be positive"):
        table_rate({"x": 0}, "x")


def test_fit_with_table_rate_fixes_one_rate_and_keeps_the_grid_for_the_edge():
    fit, rec = fit_with_table_rate(FIT, {"ann": 1e-2}, "ann")
    assert fit["lr_grid"] == [1e-2] and fit["pilot_steps"] == 100
    assert FIT["lr_grid"] == [1e-3, 3e-3, 1e-2]  # the config is not modified
    assert rec == {"lr_source": "table", "lr_edge": "top"}
    same, rec = fit_with_table_rate(FIT, None, "ann")
    assert same is FIT and rec == {"lr_source": "grid", "lr_edge": None}
    same, rec = fit_with_table_rate(FIT, {"snn": 1e-3}, "ann", required=False)
    assert same is FIT and rec["lr_source"] == "grid"


def test_a_one_rate_grid_runs_the_shared_rule_without_discarded_pilots():
    """With the table's one rate, fit_to_plateau trains one run: its step count is the run's own."""
    import torch

    from reprozoo.blocks.fitting import fit_to_plateau

    x = torch.linspace(-1, 1, 64)[:, None]
    y = 3 * x
    built = []

    def build(gen):
        m = torch.nn.Linear(1, 1)
        built.append(m)
        return m

    fit, _ = fit_with_table_rate({"lr_grid": [1e-3, 3e-2, 1e-1], "pilot_steps": 20, "eval_every": 10,
                                  "min_steps": 40, "max_steps": 400, "flat_tol": 0.01, "lr_drop": 0},
                                 {"lin": 3e-2}, "lin")
    model, rec = fit_to_plateau(build, lambda m, g: ((m(x) - y) ** 2).mean(),
                                lambda m: float(((m(x) - y) ** 2).mean().detach()), fit, seed=0, progress=lambda s: None)
    assert len(built) == 1 and rec["lr"] == pytest.approx(3e-2) and rec["lr_edge"] is None
    assert rec["vals"][-1] < rec["vals"][0]


def test_stamp_source_gives_a_table_rate_its_edge_on_the_configured_grid_and_keeps_a_piloted_edge():
    _, src = fit_with_table_rate(FIT, {"ann": 1e-2}, "ann")
    rec = {"lr": 1e-2, "lr_edge": None}          # what the rule reports after its one-rate grid
    assert stamp_source(rec, src) is rec and rec == {"lr": 1e-2, "lr_edge": "top", "lr_source": "table"}
    _, src = fit_with_table_rate(FIT, None, "ann")
    rec = {"lr": 1e-3, "lr_edge": "bottom"}      # the rule piloted the whole grid: its own edge stands
    assert stamp_source(rec, src)["lr_edge"] == "bottom" and rec["lr_source"] == "grid"
