"""The classifier head every encoder gets: the same MLP, optimiser, budget and input scaling.

embedding e (D) -> standardise with train-set mean/std -> Linear(D, w) -> SiLU -> Linear(w, w)
-> SiLU -> Linear(w, C) -> softmax; cross-entropy (or Linear(w, 1) and squared error for the
coastal-distance regression), Adam with cosine learning-rate decay, fixed
number of mini-batch steps, validation loss recorded every ``eval_every`` steps and the weights of
the lowest validation loss kept (model selection on validation data, the same for every encoder;
the test points are never seen before the end). Standardising
every feature is what the paper's released code does for its Slepian rasters; here every encoder
gets it, so the comparison isolates the embedding.
"""
from __future__ import annotations

import numpy as np


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
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"], weight_decay=cfg.get("weight_decay", 0.0))
    steps = int(cfg["steps"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    def tensor(a, dtype):
        return torch.from_numpy(np.asarray(a, dtype)).to(dev)

    xt, yt = tensor((X_tr - mean) / std, np.float32), tensor(y_tr, y_dtype)
    xv, yv = tensor((X_val - mean) / std, np.float32), tensor(y_val, y_dtype)
    gen = torch.Generator().manual_seed(seed)
    eval_steps, val_losses, train_losses, running = [], [], [], []
    best = (np.inf, 0, None)
    for step in range(1, steps + 1):
        idx = torch.randint(len(xt), (int(cfg["batch"]),), generator=gen).to(dev)
        loss = loss_fn(net(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        running.append(loss.item())
        if step % int(cfg["eval_every"]) == 0 or step == steps:
            with torch.no_grad():
                val_losses.append(loss_fn(net(xv), yv).item())
            eval_steps.append(step)
            train_losses.append(float(np.mean(running)))
            running = []
            if val_losses[-1] < best[0]:
                best = (val_losses[-1], step, {k: v.clone() for k, v in net.state_dict().items()})
    net.load_state_dict(best[2])
    net.eval()
    clf = kind(net, mean, std, dev)
    clf.best_step = best[1]
    return clf, eval_steps, val_losses, train_losses


def final_slope(steps, losses, frac: float = 0.2) -> float:
    """Change of the loss per 1000 steps over the last ``frac`` of training (least squares)."""
    steps, losses = np.asarray(steps, float), np.asarray(losses, float)
    keep = steps >= steps[-1] * (1 - frac)
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(steps[keep], losses[keep], 1)[0] * 1000)
