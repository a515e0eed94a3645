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
    assert rec["plateau"] and rec["stop"] < 400  # a rate too small to move: the bare rule calls its start a plateau
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
    assert rec["lrs"][0] == pytest.approx(3e-2 / 20) and max(rec["lrs"]) == pytest.approx(3e-2)
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
    fit = {**FIT, "keep_from": 200, "pilot_score": "best"}  # longer than the 40-step pilot: no kept point
    model, rec = fit_to_plateau(build, tl, vl, fit, seed=0, progress=lambda s: None)
    assert rec["lr"] == 3e-2 and all(v < float("inf") for v in rec["pilot_best"].values())
    assert rec["pilot_best"][50.0] > rec["pilot_best"][3e-2] < rec["pilot_best"][1e-4]
    # the chosen rate's record is its score at the end of its pilot, not over the whole run
    pilot = [v for s, v in zip(rec["steps"], rec["vals"]) if 0 < s <= FIT["pilot_steps"]]
    assert rec["pilot_best"][3e-2] == pytest.approx(min(pilot))
    assert min(rec["vals"]) < rec["pilot_best"][3e-2]


def _noisy_problem():
    """Linear regression with unit noise and batches of 8: a constant Adam rate of 0.3 bounces around the
    optimum, so its plateau is that rate's gradient-noise floor (validation MSE about 1.3 against a Bayes
    error of 1.0), which a lower rate leaves behind."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, generator=g)
    x = torch.randn(2000, 16, generator=g)
    y = x @ w + torch.randn(2000, generator=g)
    xv, yv, x, y = x[1500:], y[1500:], x[:1500], y[:1500]

    def build(gen):
        m = torch.nn.Linear(16, 1)
        with torch.no_grad():
            m.weight.copy_(0.1 * torch.randn(1, 16, generator=gen))
            m.bias.zero_()
        return m

    def train_loss(m, gen):
        i = torch.randint(0, len(x), (8,), generator=gen)
        return ((m(x[i]).squeeze(-1) - y[i]) ** 2).mean()

    def val_loss(m):
        with torch.no_grad():
            return float(((m(xv).squeeze(-1) - yv) ** 2).mean())

    return build, train_loss, val_loss


NOISY = {"lr_grid": [0.3], "pilot_steps": 60, "eval_every": 10, "min_steps": 150, "max_steps": 3000,
         "flat_tol": 0.01}


def test_the_default_rate_drop_leaves_a_constant_rates_noise_floor_and_the_gate_still_accepts_the_rate():
    from reprozoo.claims import LR_FLOOR, TAIL

    build, tl, vl = _noisy_problem()
    floor_model, floor = fit_to_plateau(build, tl, vl, {**NOISY, "lr_drop": 0}, seed=0, progress=lambda s: None)
    model, rec = fit_to_plateau(build, tl, vl, NOISY, seed=0, progress=lambda s: None)
    assert floor["plateau"] and floor["drop_step"] is None and floor["drop_gain"] is None
    assert vl(floor_model) > 1.2  # the constant rate's plateau: the bare plateau test accepts it
    assert rec["plateau"] and rec["drop_step"] == floor["stop"]  # the same run, dropped at its first plateau
    assert vl(model) < 1.15 and rec["drop_gain"] > 0.1  # the drop moves the loss by more than 10 %
    assert rec["drop_gain"] == pytest.approx((min(floor["vals"]) - min(rec["vals"])) / min(floor["vals"]))
    tail = [lr for s, lr in zip(rec["steps"], rec["lrs"]) if s >= (1 - TAIL) * rec["stop"]]
    assert min(tail) >= LR_FLOOR * max(rec["lrs"])  # the dropped rate is still above the gate's floor
    m = Metrics()
    log_fit(m, "lin", rec)
    assert m.scalars["drop_gain_lin"] == pytest.approx(rec["drop_gain"])
    with pytest.raises(ValueError, match="lr_drop"):
        fit_to_plateau(build, tl, vl, {**NOISY, "lr_drop": 0.05}, seed=0, progress=lambda s: None)


def _fit_noisy(**extra):
    build, tl, vl = _noisy_problem()
    model, rec = fit_to_plateau(build, tl, vl, {**NOISY, **extra}, seed=0, progress=lambda s: None)
    return model, rec, vl


def test_weight_averaging_also_leaves_the_floor_and_the_kept_weights_are_the_average():
    model, rec, vl = _fit_noisy(lr_drop=0, ema_decay=0.95)
    assert rec["plateau"] and vl(model) < 1.15
    assert vl(model) == pytest.approx(min(rec["vals"]))  # validation read the average, and it is what is kept
    with pytest.raises(ValueError, match="ema_decay"):
        _fit_noisy(ema_decay=1.0)


def test_patience_waits_for_an_old_best_and_the_record_flags_a_rate_at_the_grid_edge():
    _, rec, _ = _fit_noisy(lr_drop=0, patience=6)
    vals = rec["vals"]
    assert rec["plateau"] and len(vals) - 1 - vals.index(min(vals[1:])) >= 6
    _, rec, _ = _fit_noisy(lr_grid=[1e-3, 3e-3, 0.1])
    assert rec["lr"] == 0.1 and rec["lr_edge"] == "top"


def test_pilots_are_ranked_by_the_mean_of_their_second_half_by_default():
    import numpy as np

    _, rec, _ = _fit_noisy(lr_grid=[0.03, 0.1, 0.3])
    pilot = [v for s, v in zip(rec["steps"], rec["vals"]) if s <= NOISY["pilot_steps"]]
    assert rec["pilot_best"][rec["lr"]] == pytest.approx(np.mean(pilot[len(pilot) // 2:]))
    assert rec["pilot_best"][rec["lr"]] == min(rec["pilot_best"].values())
    assert rec["lr_edge"] is None or rec["lr"] in (0.03, 0.3)
