"""The shared training rule (blocks/fitting.py): picks the rate on validation and stops on a plateau."""
import pytest
import torch

from reprozoo.blocks.fitting import fit_to_plateau, log_fit
from reprozoo.claims import plateau
from reprozoo.runtime import Metrics

FIT = {"lr_grid": [1e-4, 3e-2, 50.0], "pilot_steps": 40, "eval_every": 10, "min_steps": 100,
       "max_steps": 3000, "flat_tol": 0.01}


def _problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(256, generator=g)
    xv, yv = x[200:], y[200:]
    x, y = x[:200], y[:200]

    def train_loss(m, gen):
        i = torch.randint(0, len(x), (32,), generator=gen)
        return ((m(x[i]).squeeze(-1) - y[i]) ** 2).mean()

    def val_loss(m):
        with torch.no_grad():
            return float(((m(xv).squeeze(-1) - yv) ** 2).mean())

    return (lambda gen: torch.nn.Linear(4, 1)), train_loss, val_loss


def test_the_rule_picks_a_working_rate_and_stops_on_a_plateau_the_gate_accepts():
    build, tl, vl = _problem()
    torch.manual_seed(0)
    model, rec = fit_to_plateau(build, tl, vl, FIT, seed=0, progress=lambda s: None)
    assert rec["lr"] == 3e-2  # 1e-4 is too slow in the pilot, 50 diverges (scored 1e6, not a crash)
    assert rec["plateau"] and rec["stop"] < FIT["max_steps"]
    assert plateau(rec["steps"], rec["vals"], 0.02)
    assert vl(model) == pytest.approx(min(rec["vals"]))  # best-validation weights kept
    assert vl(model) < 0.05  # noise variance 0.01: the fit is real
    m = Metrics()
    log_fit(m, "lin", rec)
    assert set(m.curves) == {"val_lin", "lr_lin"} and m.scalars["lr_chosen_lin"] == 3e-2


def test_missing_keys_and_unknown_optimizers_are_refused():
    build, tl, vl = _problem()
    with pytest.raises(ValueError, match="missing key"):
        fit_to_plateau(build, tl, vl, {"lr_grid": [1e-2]}, seed=0)
    with pytest.raises(ValueError, match="optimizer"):
        fit_to_plateau(build, tl, vl, {**FIT, "optimizer": "sgd9"}, seed=0)
