"""The head every encoder gets: the same MLP, optimiser, input scaling and training rule.

embedding e (D) -> standardise with train-set mean/std -> Linear(D, w) -> SiLU -> Linear(w, w)
-> SiLU -> Linear(w, C) -> softmax; cross-entropy (or Linear(w, 1) and squared error for the
coastal-index regression). Training is the platform's shared rule,
:func:`reprozoo.blocks.fitting.fit_to_plateau`, the same for every encoder and both tasks: every
rate of one grid (``fit.lr_grid``) is piloted from the same initial weights and ranked on the
validation loss (the mean of the pilot's second half); the chosen rate trains at a constant rate
until the validation curve is flat by the convergence gate's own test, then once more after one rate
drop (x ``lr_drop``, the gate's floor) until a plateau whose window lies after the drop; the weights
of the lowest validation loss are kept (model selection on validation data; the test points are
never seen before the end). Standardising every feature is what the paper's released code does for
its Slepian rasters; here every encoder gets it, so the comparison isolates the embedding.
"""
from __future__ import annotations

import numpy as np

from ...blocks.fitting import fit_to_plateau


class Classifier:
    def __init__(self, net, mean: np.ndarray, std: np.ndarray):
        self.net, self.mean, self.std = net, mean, std

    def _z(self, X):
        import torch

        return torch.from_numpy(((X - self.mean) / self.std).astype(np.float32))

    def proba(self, X: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return torch.softmax(self.net(self._z(X)), dim=1).double().numpy()


class Regressor(Classifier):
    """The same head with one linear output, trained on squared error."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.net(self._z(X))[:, 0].double().numpy()


def fit_classifier(X_tr, y_tr, X_val, y_val, n_classes: int, cfg: dict, seed: int, label: str = "land",
                   progress=print):
    """Train the head on cross-entropy; returns (Classifier with the best validation weights, the
    fit record of :func:`fit_to_plateau`, with ``train`` the mean training loss per validation
    interval)."""
    import torch

    ce = torch.nn.CrossEntropyLoss()
    return _fit(X_tr, y_tr, X_val, y_val, n_classes, ce, np.int64, Classifier, cfg, seed, label, progress)


def fit_regressor(X_tr, y_tr, X_val, y_val, cfg: dict, seed: int, label: str = "coast", progress=print):
    """The same head, rule and model selection on a real target: one output, mean squared error
    (the validation curve is the validation MSE)."""
    import torch

    mse = torch.nn.MSELoss()
    return _fit(X_tr, y_tr, X_val, y_val, 1, lambda out, y: mse(out[:, 0], y), np.float32, Regressor, cfg, seed,
                label, progress)


def standardiser(X_tr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = X_tr.mean(0), X_tr.std(0)
    return mean, np.where(std > 1e-8 * max(std.max(), 1e-300), std, 1.0)  # constant feature (Y_00) -> 0


def _fit(X_tr, y_tr, X_val, y_val, n_out: int, loss_fn, y_dtype, kind, cfg: dict, seed: int, label, progress):
    import torch

    mean, std = standardiser(X_tr)
    w, batch = int(cfg["width"]), int(cfg["batch"])
    xt = torch.from_numpy(((X_tr - mean) / std).astype(np.float32))
    yt = torch.from_numpy(np.asarray(y_tr, y_dtype))
    xv = torch.from_numpy(((X_val - mean) / std).astype(np.float32))
    yv = torch.from_numpy(np.asarray(y_val, y_dtype))

    def build(gen):
        torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=gen)))
        return torch.nn.Sequential(torch.nn.Linear(xt.shape[1], w), torch.nn.SiLU(),
                                   torch.nn.Linear(w, w), torch.nn.SiLU(), torch.nn.Linear(w, n_out))

    def train_loss(net, gen):
        idx = torch.randint(len(xt), (batch,), generator=gen)
        return loss_fn(net(xt[idx]), yt[idx])

    def val_loss(net):
        with torch.no_grad():
            return float(loss_fn(net(xv), yv))

    net, rec = fit_to_plateau(build, train_loss, val_loss, cfg["fit"], seed, label=label, progress=progress)
    net.eval()
    every = int(cfg["fit"]["eval_every"])
    losses = np.asarray(rec["losses"], float)
    rec["train"] = [float(losses[max(0, s - every):s].mean()) if s > 0 else float("nan") for s in rec["steps"]]
    return kind(net, mean, std), rec


def final_slope(steps, losses, frac: float = 0.2) -> float:
    """Change of the loss per 1000 steps over the last ``frac`` of training (least squares)."""
    steps, losses = np.asarray(steps, float), np.asarray(losses, float)
    keep = steps >= steps[-1] * (1 - frac)
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(steps[keep], losses[keep], 1)[0] * 1000)
