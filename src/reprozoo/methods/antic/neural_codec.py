"""Spatial compression of kept snapshots with a neural field, and the per-frame scratch baseline.

A kept frame w(x), x in [0, 1)^2, is stored as a coordinate MLP f_theta (Fourier features + MLP,
``blocks.neural_field.CoordinateMLP``) with w ~ m + s f_theta(x) (m, s the frame's mean and std).

Continual residual fine-tuning (ANTIC): the first kept frame is fitted in full (base theta_0, all
parameters stored); every later kept frame k starts from theta_{k-1} and learns only a residual

    W_l <- W_l + U_l V_l^T   (rank r, every linear layer l),   b_l <- b_l + db_l,

so the stored bytes per frame are those of (U, V, db), not of the network. Everything stored is
rounded to float16, and the encoder merges the *rounded* delta before the next frame, so the
decoder replays exactly the encoder's chain of parameters (no drift between them).

Scratch baseline: each kept frame gets its own network trained from a fresh initialisation, sized
so that it stores as many bytes per kept frame as ANTIC does on average (base included): the two
are compared at equal storage, which is the same statement as "fewer bytes at equal error" for
monotone rate-error curves.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...blocks.neural_field import CoordinateMLP, grid_coordinates

BYTES_STORED = 2  # float16


def _linears(model: CoordinateMLP) -> list[nn.Linear]:
    return [m for m in model.net if isinstance(m, nn.Linear)]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def round_half_(model: nn.Module) -> None:
    """Round the stored parameters to float16 in place (what a decoder would read back)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def forward_with_delta(model: CoordinateMLP, x: torch.Tensor, deltas) -> torch.Tensor:
    """f_{theta + delta}(x) with delta = [(U, V, db)] per linear layer (None: no delta)."""
    h = model.features(x)
    k = 0
    for m in model.net:
        if isinstance(m, nn.Linear):
            w, b = m.weight, m.bias
            if deltas is not None:
                u, v, db = deltas[k]
                w, b = w + u @ v.T, b + db
            h = h @ w.T + b
            k += 1
        else:
            h = m(h)
    return h


def delta_size(model: CoordinateMLP, rank: int) -> int:
    """Parameters stored per residual update: rank (in + out) + out per linear layer."""
    return sum(rank * (lin.in_features + lin.out_features) + lin.out_features for lin in _linears(model))


def _fit(params, loss_fn, steps: int, lr: float, batch_idx):
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, steps))
    losses = []
    for s in range(steps):
        loss = loss_fn(batch_idx(s))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


class FieldCodec:
    """Common state: the grid, per-frame normalisation and minibatches of grid points."""

    def __init__(self, n: int, cfg: dict, seed: int):
        self.n, self.cfg, self.seed = n, cfg, seed
        self.x = grid_coordinates(n, n)
        self.gen = torch.Generator().manual_seed(seed)
        self.batch = min(int(cfg["batch"]), n * n)
        self.losses: list[float] = []
        self.stored_bytes = 0
        self.kept_idx: list[int] = []
        self.recon: list[np.ndarray] = []

    def _target(self, w: np.ndarray):
        m, s = float(w.mean()), float(w.std())
        m, s = float(np.float16(m)), float(np.float16(s))
        self.stored_bytes += 2 * BYTES_STORED
        return torch.tensor(((w - m) / s).reshape(-1, 1), dtype=torch.float32), m, s

    def _batches(self):
        npts = self.n * self.n
        return lambda _s: torch.randint(npts, (self.batch,), generator=self.gen)

    def _decode(self, model, deltas, m, s) -> np.ndarray:
        with torch.no_grad():
            f = forward_with_delta(model, self.x, deltas).numpy().reshape(self.n, self.n)
        return m + s * f.astype(np.float64)


class ContinualCodec(FieldCodec):
    """ANTIC's spatial module: a full base fit, then rank-r residual fine-tuning per kept frame."""

    def __init__(self, n: int, cfg: dict, seed: int):
        super().__init__(n, cfg, seed)
        torch.manual_seed(seed)
        self.model = CoordinateMLP(2, 1, width=cfg["width"], depth=cfg["depth"], n_features=cfg["n_features"],
                                   sigma=cfg["sigma"], seed=seed)
        self.rank = int(cfg["rank"])

    def add(self, i: int, w: np.ndarray) -> None:
        y, m, s = self._target(w)
        cfg = self.cfg
        if not self.kept_idx:  # base network: every parameter stored
            losses = _fit(list(self.model.parameters()),
                          lambda idx: ((self.model(self.x[idx]) - y[idx]) ** 2).mean(),
                          int(cfg["base_steps"]), float(cfg["lr"]), self._batches())
            round_half_(self.model)
            # the Fourier matrix B is a buffer regenerated from the seed: not stored
            self.stored_bytes += BYTES_STORED * n_params(self.model)
        else:
            deltas = []
            for lin in _linears(self.model):
                u = torch.zeros(lin.out_features, self.rank, requires_grad=True)
                v = (torch.randn(lin.in_features, self.rank, generator=self.gen) / lin.in_features**0.5).requires_grad_(True)
                db = torch.zeros(lin.out_features, requires_grad=True)
                deltas.append((u, v, db))
            flat = [t for d in deltas for t in d]
            losses = _fit(flat, lambda idx: ((forward_with_delta(self.model, self.x[idx], deltas) - y[idx]) ** 2).mean(),
                          int(cfg["delta_steps"]), float(cfg["delta_lr"]), self._batches())
            with torch.no_grad():  # merge the float16-rounded residual: the decoder replays the same chain
                for lin, (u, v, db) in zip(_linears(self.model), deltas):
                    lin.weight += u.half().float() @ v.half().float().T
                    lin.bias += db.half().float()
            self.stored_bytes += BYTES_STORED * delta_size(self.model, self.rank)
        self.losses += losses
        self.kept_idx.append(i)
        self.recon.append(self._decode(self.model, None, m, s))


def scratch_width(target_params: int, depth: int, max_width: int = 128) -> int:
    """Width of a scratch network (n_features = width / 2) with at most ``target_params`` parameters."""
    best = 2
    for w in range(2, max_width + 1, 2):
        f = w // 2
        p = 2 * f * w + w + (depth - 1) * (w * w + w) + w + 1
        if p <= target_params:
            best = w
    return best


class ScratchCodec(FieldCodec):
    """Baseline: a fresh network per kept frame, trained from its own initialisation."""

    def __init__(self, n: int, cfg: dict, seed: int, width: int):
        super().__init__(n, cfg, seed)
        self.width = width

    def add(self, i: int, w: np.ndarray) -> None:
        y, m, s = self._target(w)
        cfg = self.cfg
        torch.manual_seed(self.seed * 1000 + len(self.kept_idx))
        model = CoordinateMLP(2, 1, width=self.width, depth=cfg["depth"], n_features=max(1, self.width // 2),
                              sigma=cfg["sigma"], seed=self.seed)
        losses = _fit(list(model.parameters()), lambda idx: ((model(self.x[idx]) - y[idx]) ** 2).mean(),
                      int(cfg["scratch_steps"]), float(cfg["lr"]), self._batches())
        round_half_(model)
        self.stored_bytes += BYTES_STORED * (n_params(model))
        self.losses += losses
        self.kept_idx.append(i)
        self.recon.append(self._decode(model, None, m, s))
        self.last_losses = losses


def antic_bytes(cfg: dict, n_keep: int) -> int:
    """Bytes ANTIC stores for ``n_keep`` kept frames (from the architecture alone)."""
    model = CoordinateMLP(2, 1, width=cfg["width"], depth=cfg["depth"], n_features=cfg["n_features"], sigma=cfg["sigma"])
    return BYTES_STORED * (n_params(model) + (n_keep - 1) * delta_size(model, int(cfg["rank"])) + 2 * n_keep)
