"""Waveform-conditional transformer: raw breathing, cut in 5-s patches, -> one label per patch.

The paper's model keeps the fine respiratory dynamics by reading the waveform itself (not a
breathing-rate summary) and predicts discrete EEG tokens. Here every 5-s patch of the 8-Hz
breathing (40 samples, globally standardised so that depth differences survive) is embedded
linearly (together with its log magnitude spectrum, :func:`patch_inputs`), a learned position is added, a bidirectional pre-LN transformer encoder
(``torch.nn.TransformerEncoder``) mixes a window of L patches (L x 5 s of context), and a linear
head gives per-patch logits:

    h = LN(Encoder(W_in p_{1..L} + pos)),   logits_i = W_out h_i,   loss = CE(logits_i, token_i)

The same network with 5 outputs trained on the stage of each patch is the breathing-only
transformer baseline (same budget). Predictions are the per-patch argmax (the mode of the
predicted token distribution), i.e. non-autoregressive decoding: an assumption, the paper's
decoding order is not given in the abstract.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class BreathEncoder(nn.Module):
    def __init__(self, patch_len: int, seq_len: int, n_out: int, dim: int = 48, depth: int = 2, heads: int = 4,
                 dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Linear(patch_len, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
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


def train_encoder(patches: np.ndarray, target: np.ndarray, n_out: int, p: dict, seed: int,
                  val_frac: float = 0.15, log=None):
    """Train on random windows of (S, T, patch_len) patches with (S, T) integer targets.

    The last ``val_frac`` of the subjects is held out for the validation curve. Returns the model
    and curves {"train_loss", "val_loss"} as (steps, values)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    patches = patch_inputs(patches)
    L = int(p["seq_len"])
    n_val = max(1, int(round(val_frac * len(patches))))
    tr_x, tr_y = torch.tensor(patches[:-n_val]), torch.tensor(target[:-n_val].astype(np.int64))
    va_x = torch.tensor(windows(patches[-n_val:], L))
    va_y = torch.tensor(windows(target[-n_val:].astype(np.int64), L))
    model = BreathEncoder(tr_x.shape[-1], L, n_out, dim=int(p["dim"]), depth=int(p["depth"]),
                          heads=int(p["heads"]), dropout=float(p.get("dropout", 0.1)))
    steps, bs = int(p["steps"]), int(p["batch"])
    opt = torch.optim.AdamW(model.parameters(), lr=float(p["lr"]), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=float(p["lr"]), total_steps=steps, pct_start=0.1)
    every = max(1, steps // 20)
    curves = {"train_loss": ([], []), "val_loss": ([], [])}
    run = 0.0
    for step in range(1, steps + 1):
        si = rng.integers(0, len(tr_x), bs)
        t0 = rng.integers(0, tr_x.shape[1] - L + 1, bs)
        idx = torch.as_tensor(t0[:, None] + np.arange(L)[None])
        xb = tr_x[torch.as_tensor(si)[:, None], idx]
        yb = tr_y[torch.as_tensor(si)[:, None], idx]
        model.train()
        loss = nn.functional.cross_entropy(model(xb).reshape(-1, n_out), yb.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        run += float(loss.detach())
        if step % every == 0 or step == steps:
            model.eval()
            with torch.no_grad():
                vl = float(nn.functional.cross_entropy(model(va_x).reshape(-1, n_out), va_y.reshape(-1)))
            k = every if step % every == 0 else step % every
            curves["train_loss"][0].append(step)
            curves["train_loss"][1].append(run / k)
            curves["val_loss"][0].append(step)
            curves["val_loss"][1].append(vl)
            run = 0.0
            if log:
                log(f"step {step}/{steps} val CE {vl:.3f}")
    model.eval()
    return model, curves


@torch.no_grad()
def predict(model: BreathEncoder, patches: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(S, T, patch_len) -> logits (S, T, n_out) and hidden states (S, T, dim), window by window."""
    s, t = patches.shape[:2]
    x = torch.tensor(windows(patch_inputs(patches), seq_len))
    h = model.hidden(x)
    logits = model.head(h)
    return logits.reshape(s, t, -1).numpy(), h.reshape(s, t, -1).numpy()
