"""Spatial compression of kept snapshots with a neural field, and the per-frame scratch baseline.

A kept frame w(x), x in [0, 1)^2, is stored as a coordinate MLP f_theta (Fourier features + MLP,
``blocks.neural_field.CoordinateMLP``) with w ~ m + s f_theta(x) (m, s the frame's mean and std).

Continual residual fine-tuning (ANTIC): the first kept frame is fitted in full (base theta_0, all
parameters stored); every later kept frame k starts from theta_{k-1} and learns only a residual

    W_l <- W_l + U_l V_l^T   (rank r, every linear layer l),   b_l <- b_l + db_l,

so the stored bytes per frame are those of (U, V, db), not of the network. Everything stored is
rounded to float16, and the encoder merges the *rounded* delta before the next frame, so the
decoder replays exactly the encoder's chain of parameters (no drift between them). The rate of the
codec is set by the rank r: ``ContinualCodec.branch`` replays the kept frames at another rank from
the same float16 base network (the rate sweep).

Scratch baseline: each kept frame gets its own network trained from a fresh initialisation, with
ANTIC's Fourier encoding (the same number of features) and the widest hidden layers that store at
most as many bytes per kept frame as ANTIC does on average (base included): the two are compared
at equal storage, which is the same statement as "fewer bytes at equal error" for monotone
rate-error curves.

Optimisation (every fit, every codec): Adam on the whole grid (full batch: at 64 x 64 the grid has
4096 points, so minibatches only add noise) at a constant learning rate (``lr_floor`` = 1: the
rate is recorded with the curve and stays at its peak, so the convergence gate reads a curve whose
rate is up; ``lr_floor`` < 1 gives a cosine to ``lr_floor`` x peak), the rate chosen per fit type
on the encoder's own frame from one grid (``choose_lrs``). ``batch`` smaller than the grid gives
random minibatches instead. Each fit records its validation curve: the MSE on the *whole* grid (what the
decoder reconstructs, in normalised units) every ``eval_every`` steps, with the rate at that step.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from ...blocks.neural_field import CoordinateMLP, grid_coordinates

BYTES_STORED = 2  # float16
NORM_NUMBERS = 2  # mean and std of the frame, stored per kept frame


def _linears(model: CoordinateMLP) -> list[nn.Linear]:
    return [m for m in model.net if isinstance(m, nn.Linear)]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def round_half_(model: nn.Module) -> None:
    """Round the stored parameters to float16 in place (what a decoder would read back)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def forward_with_delta(model: CoordinateMLP, x: torch.Tensor, deltas, feats: torch.Tensor | None = None) -> torch.Tensor:
    """f_{theta + delta}(x) with delta = [(U, V, db)] per linear layer (None: no delta). ``feats``: the
    Fourier features of ``x`` computed beforehand (they are fixed, not trained: the codecs compute them
    once per grid instead of at every step; the same numbers)."""
    h = model.features(x) if feats is None else feats
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


def lr_at(step: int, steps: int, peak: float, floor: float) -> float:
    """Cosine from ``peak`` at step 0 to ``floor * peak`` at ``steps`` (never below the floor)."""
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(1, steps))))


def _fit(params, loss_fn, steps: int, lr: float, batch_idx, floor: float, eval_every: int) -> dict:
    """Adam at the rate ``lr_at`` gives (constant for floor 1); ``loss_fn(idx)`` is the MSE on grid points ``idx``
    (``slice(None)``: the whole grid). Returns the fit's curve: step, whole-grid MSE, rate."""
    opt = torch.optim.Adam(params, lr=lr)
    xs, ys, lrs = [], [], []
    for s in range(steps + 1):
        cur = lr_at(s, steps, lr, floor)
        idx = batch_idx(s) if s < steps else None
        full = isinstance(idx, slice) and idx == slice(None)  # full batch: the step's loss is the whole-grid MSE
        loss = loss_fn(idx) if s < steps else None
        if s % eval_every == 0 or s == steps:
            xs.append(s)
            if full:
                ys.append(float(loss.detach()))
            else:
                with torch.no_grad():
                    ys.append(float(loss_fn(slice(None))))
            lrs.append(cur)
        if s == steps:
            break
        for g in opt.param_groups:
            g["lr"] = cur
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"x": xs, "y": ys, "lr": lrs}


class FieldCodec:
    """Common state: the grid, per-frame normalisation and minibatches of grid points."""

    def __init__(self, n: int, cfg: dict, seed: int):
        self.n, self.cfg, self.seed = n, cfg, seed
        self.x = grid_coordinates(n, n)
        self.gen = torch.Generator().manual_seed(seed)
        self.batch = min(int(cfg["batch"]), n * n)
        self.fits: list[dict] = []  # one validation curve per fit, in stream order
        self.stored_bytes = 0
        self.kept_idx: list[int] = []
        self.recon: list[np.ndarray] = []
        self.norms: list[tuple[float, float]] = []  # the stored (mean, std) of every kept frame

    def _features(self, model: CoordinateMLP) -> torch.Tensor:
        """The model's Fourier features of the whole grid, computed once (a fixed buffer, not trained):
        every step of a fit reuses them instead of recomputing the same numbers."""
        with torch.no_grad():
            return model.features(self.x)

    def _target(self, w: np.ndarray):
        m, s = float(w.mean()), float(w.std())
        m, s = float(np.float16(m)), float(np.float16(s))
        self.stored_bytes += NORM_NUMBERS * BYTES_STORED
        self.norms.append((m, s))
        return torch.tensor(((w - m) / s).reshape(-1, 1), dtype=torch.float32), m, s

    def _batches(self):
        npts = self.n * self.n
        if self.batch >= npts:  # full batch: every step sees the whole grid
            return lambda _s: slice(None)
        return lambda _s: torch.randint(npts, (self.batch,), generator=self.gen)

    def _run(self, params, loss_fn, steps_key: str, lr_key: str, kind: str, frame: int) -> None:
        cfg = self.cfg
        fit = _fit(params, loss_fn, int(cfg[steps_key]), float(cfg[lr_key]), self._batches(),
                   float(cfg.get("lr_floor", 0.1)), int(cfg.get("eval_every", 5)))
        fit.update(kind=kind, frame=frame)
        self.fits.append(fit)

    def _decode(self, model, deltas, m, s, feats=None) -> np.ndarray:
        with torch.no_grad():
            f = forward_with_delta(model, self.x, deltas, feats).numpy().reshape(self.n, self.n)
        return m + s * f.astype(np.float64)


class ContinualCodec(FieldCodec):
    """ANTIC's spatial module: a full base fit, then rank-r residual fine-tuning per kept frame."""

    def __init__(self, n: int, cfg: dict, seed: int, rank: int | None = None):
        super().__init__(n, cfg, seed)
        torch.manual_seed(seed)
        self.model = CoordinateMLP(2, 1, width=cfg["width"], depth=cfg["depth"], n_features=cfg["n_features"],
                                   sigma=cfg["sigma"], seed=seed)
        self.rank = int(cfg["rank"] if rank is None else rank)
        self._base = None
        self.feat = self._features(self.model)  # fixed for the codec's life (B is a seeded buffer)

    def add(self, i: int, w: np.ndarray) -> None:
        y, m, s = self._target(w)
        if not self.kept_idx:  # base network: every parameter stored
            net, feat = self.model.net, self.feat
            self._run(list(self.model.parameters()), lambda idx: ((net(feat[idx]) - y[idx]) ** 2).mean(),
                      "base_steps", "lr", "base", i)
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
            self._run(flat, lambda idx: ((forward_with_delta(self.model, self.x[idx], deltas, self.feat[idx])
                                          - y[idx]) ** 2).mean(), "delta_steps", "delta_lr", "delta", i)
            with torch.no_grad():  # merge the float16-rounded residual: the decoder replays the same chain
                for lin, (u, v, db) in zip(_linears(self.model), deltas):
                    lin.weight += u.half().float() @ v.half().float().T
                    lin.bias += db.half().float()
            self.stored_bytes += BYTES_STORED * delta_size(self.model, self.rank)
        self.kept_idx.append(i)
        self.recon.append(self._decode(self.model, None, m, s, self.feat))
        if self._base is None:
            self._base = (copy.deepcopy(self.model.state_dict()), self.stored_bytes)

    def stale_recon(self) -> list[np.ndarray]:
        """The control without residuals: the float16 base network alone, decoded on every kept
        frame with that frame's own stored mean and std (what the stream would give if no
        residual were ever learned)."""
        if self._base is None:
            raise ValueError("stale_recon() needs the base frame first")
        base = copy.deepcopy(self.model)
        base.load_state_dict(self._base[0])
        return [self._decode(base, None, m, s) for m, s in self.norms]

    def branch(self, rank: int, cfg: dict | None = None) -> "ContinualCodec":
        """A codec at another rank (or config) that shares this one's base: the same float16 base
        network, first kept frame, its reconstruction and bytes. Later frames are added to it."""
        if self._base is None:
            raise ValueError("branch() needs the base frame first")
        c = ContinualCodec(self.n, cfg or self.cfg, self.seed, rank)
        c.model.load_state_dict(self._base[0])
        c.feat = c._features(c.model)
        c.stored_bytes = self._base[1]
        c.kept_idx, c.recon, c.fits = self.kept_idx[:1], self.recon[:1], self.fits[:1]
        c.norms = self.norms[:1]
        c.gen = torch.Generator().manual_seed(1000 * self.seed + 17 * rank + 1)
        return c


def scratch_params(width: int, depth: int, n_features: int) -> int:
    """Parameters of ``CoordinateMLP(2, 1, width, depth, n_features)`` (the Fourier matrix is a buffer)."""
    return 2 * n_features * width + width + (depth - 1) * (width * width + width) + width + 1


def scratch_width(target_params: int, depth: int, n_features: int, max_width: int = 256) -> int:
    """The widest scratch network with ``n_features`` Fourier features and at most ``target_params``
    parameters (at least 1)."""
    best = 1
    for w in range(1, max_width + 1):
        if scratch_params(w, depth, n_features) <= target_params:
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
        model = CoordinateMLP(2, 1, width=self.width, depth=cfg["depth"], n_features=cfg["n_features"],
                              sigma=cfg["sigma"], seed=self.seed)
        feat = self._features(model)
        self._run(list(model.parameters()), lambda idx: ((model.net(feat[idx]) - y[idx]) ** 2).mean(),
                  "scratch_steps", "scratch_lr", "scratch", i)
        round_half_(model)
        self.stored_bytes += BYTES_STORED * n_params(model)
        self.kept_idx.append(i)
        self.recon.append(self._decode(model, None, m, s, feat))


def _architecture(cfg: dict) -> CoordinateMLP:
    return CoordinateMLP(2, 1, width=cfg["width"], depth=cfg["depth"], n_features=cfg["n_features"], sigma=cfg["sigma"])


def antic_bytes(cfg: dict, n_keep: int, rank: int | None = None) -> int:
    """Bytes ANTIC stores for ``n_keep`` kept frames at ``rank`` (default: the config's), from the
    architecture alone."""
    model = _architecture(cfg)
    r = int(cfg["rank"] if rank is None else rank)
    return BYTES_STORED * (n_params(model) + (n_keep - 1) * delta_size(model, r) + NORM_NUMBERS * n_keep)


def scratch_config(cfg: dict, n_keep: int) -> tuple[int, int]:
    """(width, stored bytes) of the scratch baseline: the widest network with ANTIC's Fourier encoding
    that stores at most ANTIC's bytes per kept frame (at the config's rank)."""
    target = antic_bytes(cfg, n_keep) // (BYTES_STORED * n_keep) - NORM_NUMBERS
    width = scratch_width(target, int(cfg["depth"]), int(cfg["n_features"]))
    per_frame = scratch_params(width, int(cfg["depth"]), int(cfg["n_features"])) + NORM_NUMBERS
    return width, BYTES_STORED * per_frame * n_keep


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def choose_lrs(frames: list[np.ndarray], kept: list[int], n: int, cfg: dict, seed: int, grid) -> dict:
    """The peak learning rate of each fit type, chosen from one grid on the encoder's own frames
    (an encoder may try several rates on the frame it holds and keep the best): the base fit on the
    first kept frame, the residual on the second (from the chosen base), the scratch network on the
    first. Returns ``{"lr", "delta_lr", "scratch_lr"}`` and the errors behind each choice."""
    grid = [float(g) for g in grid]
    f0, f1 = frames[0], frames[1]
    base = {}
    for lr in grid:
        c = ContinualCodec(n, {**cfg, "lr": lr}, seed)
        c.add(kept[0], f0)
        base[lr] = (rel_err(c.recon[0], f0), c)
    lr_b = min(grid, key=lambda g: base[g][0])
    delta = {}
    for lr in grid:
        c = base[lr_b][1].branch(int(cfg["rank"]), {**cfg, "lr": lr_b, "delta_lr": lr})
        c.add(kept[1], f1)
        delta[lr] = rel_err(c.recon[1], f1)
    width, _ = scratch_config(cfg, len(kept))
    scratch = {}
    for lr in grid:
        c = ScratchCodec(n, {**cfg, "scratch_lr": lr}, seed, width)
        c.add(kept[0], f0)
        scratch[lr] = rel_err(c.recon[0], f0)
    return {"lr": lr_b, "delta_lr": min(grid, key=delta.get), "scratch_lr": min(grid, key=scratch.get),
            "errors": {"lr": {str(k): v[0] for k, v in base.items()}, "delta_lr": {str(k): v for k, v in delta.items()},
                       "scratch_lr": {str(k): v for k, v in scratch.items()}}}
