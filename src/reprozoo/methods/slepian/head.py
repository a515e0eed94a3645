"""The classifier head every encoder gets: the same MLP, optimiser, budget and input scaling.

embedding e (D) -> standardise with train-set mean/std -> Linear(D, w) -> SiLU -> Linear(w, w)
-> SiLU -> Linear(w, C) -> softmax; cross-entropy (or Linear(w, 1) and squared error for the
coastal-index regression), Adam at a peak rate ``lr`` (chosen per encoder from one grid on seed 0's
validation split by ``lr_sweep.py``) with a FLOORED schedule (:func:`lr_factor`: the peak for the
first ``hold`` of the steps, a cosine down to ``floor`` x peak by ``anneal_end``, then constant, so the
convergence gate's window, the last 30 %, runs at a rate that is still up), a fixed number of
mini-batch steps (or, with ``stop_on_plateau_after``, a constant rate and a stop once the validation
curve is flat by the convergence gate's own test with no new best in its last 30 %: :func:`_stop`),
the validation loss and the rate recorded every ``eval_every`` steps, and the
weights of the lowest validation loss kept (model selection on validation data, the same for every
encoder; the test points are never seen before the end). Standardising
every feature is what the paper's released code does for its Slepian rasters; here every encoder
gets it, so the comparison isolates the embedding.
"""
from __future__ import annotations

import numpy as np

from ...claims import plateau

PLATEAU_POINTS = 6  # evaluations in the last 30 % before a plateau stop may fire (the gate needs 5)


class Classifier:
    def __init__(self, net, mean: np.ndarray, std: np.ndarray, device: str = "cpu"):
        self.net, self.mean, self.std, self.device = net, mean, std, device

    def proba(self, X: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            z = torch.from_numpy(((X - self.mean) / self.std).astype(np.float32)).to(self.device)
            return torch.softmax(self.net(z), dim=1).double().cpu().numpy()


class Regressor(Classifier):
    """The same head with one linear output, trained on squared error."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            z = torch.from_numpy(((X - self.mean) / self.std).astype(np.float32)).to(self.device)
            return self.net(z)[:, 0].double().cpu().numpy()


def fit_classifier(X_tr, y_tr, X_val, y_val, n_classes: int, cfg: dict, seed: int):
    """Train the head; returns (Classifier at the best validation loss, eval steps, val losses, mean
    train losses over each eval interval)."""
    import torch

    return _fit(X_tr, y_tr, X_val, y_val, n_classes, torch.nn.CrossEntropyLoss(), np.int64, Classifier, cfg, seed)


def fit_regressor(X_tr, y_tr, X_val, y_val, cfg: dict, seed: int):
    """The same head, optimiser and model selection on a real target: one output, mean squared error
    (the validation curve is the validation MSE)."""
    import torch

    mse = torch.nn.MSELoss()
    return _fit(X_tr, y_tr, X_val, y_val, 1, lambda out, y: mse(out[:, 0], y), np.float32, Regressor, cfg, seed)


def _fit(X_tr, y_tr, X_val, y_val, n_classes: int, loss_fn, y_dtype, kind, cfg: dict, seed: int):
    import torch

    torch.manual_seed(seed)
    mean = X_tr.mean(0)
    std = X_tr.std(0)
    std = np.where(std > 1e-8 * max(std.max(), 1e-300), std, 1.0)  # constant feature (Y_00) -> 0
    w, dev = int(cfg["width"]), cfg.get("device", "cpu")
    net = torch.nn.Sequential(torch.nn.Linear(X_tr.shape[1], w), torch.nn.SiLU(),
                              torch.nn.Linear(w, w), torch.nn.SiLU(), torch.nn.Linear(w, n_classes)).to(dev)
    peak = float(cfg["lr"])
    opt = torch.optim.Adam(net.parameters(), lr=peak, weight_decay=cfg.get("weight_decay", 0.0))
    steps = int(cfg["steps"])
    sched_cfg = cfg.get("schedule", {})
    min_steps = int(cfg.get("stop_on_plateau_after", steps))  # plateau stopping from this step on (default: off)
    def tensor(a, dtype):
        return torch.from_numpy(np.asarray(a, dtype)).to(dev)

    xt, yt = tensor((X_tr - mean) / std, np.float32), tensor(y_tr, y_dtype)
    xv, yv = tensor((X_val - mean) / std, np.float32), tensor(y_val, y_dtype)
    gen = torch.Generator().manual_seed(seed)
    eval_steps, val_losses, train_losses, lrs, running = [], [], [], [], []
    best = (np.inf, 0, None)
    for step in range(1, steps + 1):
        lr = peak * lr_factor(step - 1, steps, **sched_cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(len(xt), (int(cfg["batch"]),), generator=gen).to(dev)
        loss = loss_fn(net(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        running.append(loss.item())
        if step % int(cfg["eval_every"]) == 0 or step == steps:
            with torch.no_grad():
                val_losses.append(loss_fn(net(xv), yv).item())
            eval_steps.append(step)
            lrs.append(lr)
            train_losses.append(float(np.mean(running)))
            running = []
            if val_losses[-1] < best[0]:
                best = (val_losses[-1], step, {k: v.clone() for k, v in net.state_dict().items()})
            if step >= min_steps and step < steps and _stop(eval_steps, val_losses, best[1]):
                break
    net.load_state_dict(best[2])
    net.eval()
    clf = kind(net, mean, std, dev)
    clf.best_step = best[1]
    clf.steps_run = eval_steps[-1]
    clf.lr_history = lrs  # the rate of the step before each validation (the gate's lr curve)
    return clf, eval_steps, val_losses, train_losses


def _stop(eval_steps, val_losses, best_step) -> bool:
    """Plateau stop: flat by the convergence gate's own test (reprozoo.claims.plateau) AND no new best
    validation loss in the last 30 % (a condition of our own: a noisy curve that is flat by its fitted
    slope but still finds new minima keeps training)."""
    tail_start = eval_steps[0] + 0.7 * (eval_steps[-1] - eval_steps[0])
    return best_step < tail_start and plateau(eval_steps, val_losses, min_points=PLATEAU_POINTS)


def lr_factor(step: int, steps: int, hold: float = 0.3, anneal_end: float = 0.6, floor: float = 0.2) -> float:
    """The rate at ``step`` (0-based) of ``steps``, relative to the peak: 1 for the first ``hold`` of
    training, a half cosine down to ``floor`` by ``anneal_end``, then ``floor`` to the end. The
    convergence gate's window (the last 30 %) lies after ``anneal_end`` <= 0.7, at a constant rate
    ``floor`` >= 0.1 x peak: the curve must be flat there while the rate is still up."""
    t = step / max(steps, 1)
    if t < hold:
        return 1.0
    if t >= anneal_end:
        return floor
    u = (t - hold) / (anneal_end - hold)
    return floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * u))


def final_slope(steps, losses, frac: float = 0.2) -> float:
    """Change of the loss per 1000 steps over the last ``frac`` of training (least squares)."""
    steps, losses = np.asarray(steps, float), np.asarray(losses, float)
    keep = steps >= steps[-1] * (1 - frac)
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(steps[keep], losses[keep], 1)[0] * 1000)
