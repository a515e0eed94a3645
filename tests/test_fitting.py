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


def test_several_curves_stop_only_when_every_one_is_flat_and_select_picks_the_weights():
    build, tl, vl = _problem()
    seen = []

    def curves(m):
        v = vl(m)
        return {"mse": v, "neg": 1.0 / (1.0 + v)}  # the second is better when higher: not selectable as-is

    model, rec = fit_to_plateau(build, tl, curves, {**FIT, "lr_grid": [3e-2], "select": "mse"}, seed=0,
                                progress=lambda s: None, after_step=lambda m, k: seen.append(k))
    assert set(rec["curves"]) == {"mse", "neg"} and rec["vals"] == rec["curves"]["mse"]
    assert rec["plateau"] and all(plateau(rec["steps"], c, FIT["flat_tol"]) for c in rec["curves"].values())
    assert seen[:3] == [0, 1, 2] and len(seen) == FIT["pilot_steps"] + rec["stop"] - FIT["pilot_steps"]
    m = Metrics()
    log_fit(m, "lin", rec)
    assert {"val_lin", "val_lin_mse", "val_lin_neg"} <= set(m.curves)
    with pytest.raises(ValueError, match="select"):
        fit_to_plateau(build, tl, curves, {**FIT, "select": "cer"}, seed=0, progress=lambda s: None)


def test_min_progress_refuses_a_stop_on_the_initial_plateau_and_keep_from_skips_early_weights():
    build, tl, vl = _problem()
    stuck = {**FIT, "lr_grid": [1e-6], "max_steps": 400, "min_steps": 100}
    _, rec = fit_to_plateau(build, tl, vl, stuck, seed=0, progress=lambda s: None)
    assert rec["plateau"] and rec["stop"] < 200  # a rate too small to move: the bare rule calls its start a plateau
    _, rec = fit_to_plateau(build, tl, vl, {**stuck, "min_progress": 0.5}, seed=0, progress=lambda s: None)
    assert rec["stop"] == 400 and not rec["plateau"]  # with min_progress it trains on to the cap
    model, rec = fit_to_plateau(build, tl, vl, {**FIT, "lr_grid": [3e-2], "keep_from": 200}, seed=0,
                                progress=lambda s: None)
    kept = [v for s, v in zip(rec["steps"], rec["vals"]) if s >= 200]
    assert vl(model) == pytest.approx(min(kept))


def test_range_scale_warmup_clip_and_pilot_tail_score():
    build, tl, vl = _problem()
    fit = {**FIT, "scale": "range", "warmup": 20, "clip": 1.0, "pilot_score": "tail"}
    model, rec = fit_to_plateau(build, tl, vl, fit, seed=0, progress=lambda s: None)
    assert rec["lr"] == 3e-2 and rec["plateau"]
    assert plateau(rec["steps"], rec["vals"], FIT["flat_tol"], scale="range")
    assert rec["lrs"][0] == pytest.approx(3e-2 / 20) and rec["lrs"][-1] == pytest.approx(3e-2)
    assert vl(model) < 0.05
    with pytest.raises(ValueError, match="scale"):
        fit_to_plateau(build, tl, vl, {**FIT, "scale": "log"}, seed=0, progress=lambda s: None)
    with pytest.raises(ValueError, match="pilot_score"):
        fit_to_plateau(build, tl, vl, {**FIT, "pilot_score": "mean"}, seed=0, progress=lambda s: None)


def test_after_a_rate_drop_the_stop_waits_until_the_plateau_window_is_past_the_drop():
    build, tl, vl = _problem()
    fit = {**FIT, "lr_grid": [3e-2], "lr_drop": 0.3, "max_steps": 3000}
    _, rec = fit_to_plateau(build, tl, vl, fit, seed=0, progress=lambda s: None)
    drop = rec["drop_step"]
    assert drop is not None and rec["plateau"]
    # the gate reads the last 30 % of the curve: at the stop, all of it was trained at the dropped rate
    tail_start = 0.7 * rec["stop"]
    assert tail_start >= drop
    assert all(lr == pytest.approx(3e-2 * 0.3) for s, lr in zip(rec["steps"], rec["lrs"]) if s >= tail_start)


def test_pilots_shorter_than_keep_from_are_still_ranked_and_pilot_scores_are_the_pilots_own():
    build, tl, vl = _problem()
    fit = {**FIT, "keep_from": 200}  # longer than the 40-step pilot: no pilot has a kept point
    model, rec = fit_to_plateau(build, tl, vl, fit, seed=0, progress=lambda s: None)
    assert rec["lr"] == 3e-2 and all(v < float("inf") for v in rec["pilot_best"].values())
    assert rec["pilot_best"][50.0] > rec["pilot_best"][3e-2] < rec["pilot_best"][1e-4]
    # the chosen rate's record is its score at the end of its pilot, not over the whole run
    pilot = [v for s, v in zip(rec["steps"], rec["vals"]) if 0 < s <= FIT["pilot_steps"]]
    assert rec["pilot_best"][3e-2] == pytest.approx(min(pilot))
    assert min(rec["vals"]) < rec["pilot_best"][3e-2]
