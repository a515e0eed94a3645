"""Waveform-conditional transformer: raw breathing, cut in 5-s patches, -> one label per patch.

The paper's model keeps the fine respiratory dynamics by reading the waveform itself (not a
breathing-rate summary) and predicts discrete EEG tokens. Here every 5-s patch of the 8-Hz
breathing (40 samples, globally standardised so that depth differences survive) is embedded
linearly (together with its log magnitude spectrum, :func:`patch_inputs`), a learned position is added, a bidirectional pre-LN transformer encoder
(``torch.nn.TransformerEncoder``) mixes a window of L patches (L x 5 s of context), and a linear
head gives per-patch logits (dropout ``dropout`` on the residual and feed-forward paths and
``attn_dropout`` on the attention weights; 0.1 and 0 at ci / smoke / paper):

    h = LN(Encoder(W_in p_{1..L} + pos)),   logits_i = W_out h_i,   loss = CE(logits_i, token_i)

The same network with 5 outputs trained on the stage of each patch is the breathing-only
transformer baseline (same size and the same training rule).

Training rule (:func:`train_encoder`, one rule for every network of every variant): AdamW at a
constant learning rate chosen on the validation subjects from one grid (every grid value trains
``pilot_steps`` from the same initial weights; the lowest validation cross-entropy is kept), then
training continues until the validation curve is flat (:func:`plateau`) or ``max_steps``. The rate
stays constant, so a flat curve is a plateau and not a schedule that ran out; the weights with the
best validation value are returned. Predictions are the per-patch argmax (the mode of the
predicted token distribution), i.e. non-autoregressive decoding: an assumption, the paper's
decoding order is not given in the abstract.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class BreathEncoder(nn.Module):
    def __init__(self, patch_len: int, seq_len: int, n_out: int, dim: int = 48, depth: int = 2, heads: int = 4,
                 dropout: float = 0.1, attn_dropout: float | None = None):
        super().__init__()
        self.embed = nn.Linear(patch_len, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        # dropout on the attention weights (default: ``dropout``) apart from the residual / feed-forward
        # one: attention-weight dropout keeps torch's CPU attention off its fused kernel
        layer.self_attn.dropout = dropout if attn_dropout is None else float(attn_dropout)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_out)
        nn.init.normal_(self.pos, std=0.02)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, patch_len) -> (B, L, dim) after the final LayerNorm."""
        return self.norm(self.encoder(self.embed(x) + self.pos[:, : x.shape[1]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(x))


def patch_inputs(patches: np.ndarray) -> np.ndarray:
    """Per 5-s patch: the standardised waveform itself and its log magnitude spectrum (|rFFT|),
    which is invariant to where in the patch a breath starts (the raw samples alone are not)."""
    mag = np.log(np.abs(np.fft.rfft(patches, axis=-1)) + 1e-3)
    return np.concatenate([patches, mag], axis=-1).astype(np.float32)


def windows(a: np.ndarray, seq_len: int) -> np.ndarray:
    """(S, T, ...) -> (S * T // seq_len, seq_len, ...): non-overlapping windows along axis 1."""
    s, t = a.shape[:2]
    n = t // seq_len
    return a[:, : n * seq_len].reshape(s * n, seq_len, *a.shape[2:])


def plateau(steps, vals, min_delta: float, flat_tol: float, tail: float = 0.3, min_points: int = 5) -> bool:
    """The validation curve is flat over the last ``tail`` of its steps (at least ``min_points``
    evaluations there): no value in the tail improves on the best before it by more than
    ``min_delta`` (relative), and a Theil-Sen line through the tail improves by at most
    ``flat_tol`` of the tail's median level over the tail: the platform's own plateau test
    (:func:`reprozoo.claims.plateau`, whose gate allows 2 %)."""
    from ...claims import plateau as gate_plateau

    xs, ys = np.asarray(steps, float), np.asarray(vals, float)
    if len(xs) < 2:
        return False
    m = xs >= xs[0] + (1 - tail) * (xs[-1] - xs[0])
    if m.sum() < min_points or (~m).sum() == 0:
        return False
    if ys[m].min() < ys[~m].min() - min_delta * abs(ys[~m].min()):
        return False
    return gate_plateau(xs, ys, flat_tol, tail=tail, min_points=min_points)


def train_encoder(patches: np.ndarray, target: np.ndarray, n_out: int, p: dict, seed: int,
                  val_frac: float = 0.15, log=None):
    """Train on random windows of (S, T, patch_len) patches with (S, T) integer targets.

    The last ``val_frac`` of the subjects is held out: it chooses the learning rate from
    ``p["lrs"]`` (each trains ``pilot_steps`` from the same initial weights) and gives the
    validation curve, on which training stops once flat (:func:`plateau`, from ``min_steps``) or at
    ``max_steps``. Returns the model (the weights at the best validation value) and a history:
    curves {"train_loss", "val_loss", "lr"} as (steps, values), ``lr_chosen``, ``lr_pilot_val``
    (each rate's best validation CE in its pilot), ``stop_step`` and ``plateau`` (stopped flat)."""
    import copy

    patches = patch_inputs(patches)
    L = int(p["seq_len"])
    n_val = max(1, int(round(val_frac * len(patches))))
    tr_x, tr_y = torch.tensor(patches[:-n_val]), torch.tensor(target[:-n_val].astype(np.int64))
    va_x = torch.tensor(windows(patches[-n_val:], L))
    va_y = torch.tensor(windows(target[-n_val:].astype(np.int64), L))
    bs, every = int(p["batch"]), int(p["eval_every"])
    lrs = [float(v) for v in p["lrs"]]
    pilot, min_steps, max_steps = int(p["pilot_steps"]), int(p["min_steps"]), int(p["max_steps"])
    min_delta, flat_tol = float(p.get("min_delta", 0.002)), float(p.get("flat_tol", 0.01))
    torch.manual_seed(seed)
    init = BreathEncoder(tr_x.shape[-1], L, n_out, dim=int(p["dim"]), depth=int(p["depth"]),
                         heads=int(p["heads"]), dropout=float(p.get("dropout", 0.1)),
                         attn_dropout=p.get("attn_dropout"))

    def val_ce(model):
        model.eval()
        with torch.no_grad():
            return float(nn.functional.cross_entropy(model(va_x).reshape(-1, n_out), va_y.reshape(-1)))

    class Run:
        def __init__(self, lr):
            self.model = copy.deepcopy(init)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
            self.lr, self.step, self.run = lr, 0, []
            self.rng = np.random.default_rng(seed)  # the same batches for every rate
            self.hist = {"step": [], "train": [], "val": []}
            self.best, self.best_state = float("inf"), None

        def advance(self, until, stop_flat):
            while self.step < until:
                self.step += 1
                si = self.rng.integers(0, len(tr_x), bs)
                t0 = self.rng.integers(0, tr_x.shape[1] - L + 1, bs)
                idx = torch.as_tensor(t0[:, None] + np.arange(L)[None])
                xb = tr_x[torch.as_tensor(si)[:, None], idx]
                yb = tr_y[torch.as_tensor(si)[:, None], idx]
                self.model.train()
                loss = nn.functional.cross_entropy(self.model(xb).reshape(-1, n_out), yb.reshape(-1))
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                self.run.append(float(loss.detach()))
                if self.step % every == 0 or self.step == until:
                    vl = val_ce(self.model)
                    self.hist["step"].append(self.step)
                    self.hist["train"].append(float(np.mean(self.run)))
                    self.hist["val"].append(vl)
                    self.run = []
                    if vl < self.best:
                        self.best, self.best_state = vl, copy.deepcopy(self.model.state_dict())
                    if log:
                        log(f"lr {self.lr:.1e} step {self.step}/{max_steps} val CE {vl:.3f}")
                    if stop_flat and self.step >= min_steps and plateau(self.hist["step"], self.hist["val"],
                                                                        min_delta, flat_tol):
                        return True
            return False

    runs = []
    for lr in lrs:
        r = Run(lr)
        r.advance(pilot, stop_flat=False)
        runs.append(r)
    run = min(runs, key=lambda r: r.best)
    flat = run.advance(max_steps, stop_flat=True) or plateau(run.hist["step"], run.hist["val"], min_delta, flat_tol)
    run.model.load_state_dict(run.best_state)
    run.model.eval()
    st = run.hist["step"]
    hist = {"curves": {"train_loss": (st, run.hist["train"]), "val_loss": (st, run.hist["val"]),
                       "lr": (st, [run.lr] * len(st))},
            "lr_chosen": run.lr, "lr_pilot_val": {str(r.lr): r.best for r in runs},
            "stop_step": run.step, "plateau": bool(flat)}
    return run.model, hist


@torch.no_grad()
def predict(model: BreathEncoder, patches: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(S, T, patch_len) -> logits (S, T, n_out) and hidden states (S, T, dim), window by window."""
    s, t = patches.shape[:2]
    x = torch.tensor(windows(patch_inputs(patches), seq_len))
    h = model.hidden(x)
    logits = model.head(h)
    return logits.reshape(s, t, -1).numpy(), h.reshape(s, t, -1).numpy()
