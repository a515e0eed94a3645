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

Training rule (:func:`train_encoder`, one rule for every network of every variant): the platform's
shared rule :func:`reprozoo.blocks.fitting.fit_to_plateau` with AdamW: a constant learning rate
chosen on the validation subjects from one grid (every grid value trains ``pilot_steps`` from the
same initial weights and batches; the lowest validation cross-entropy is kept), then training
continues until the validation curve passes the convergence gate's own plateau test
(``reprozoo.claims.plateau`` at ``flat_tol``, half the gate's tolerance) or ``max_steps``. The rate
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


def fit_config(p: dict) -> dict:
    """The method's ``transformer`` config -> the shared rule's ``fit`` keys (AdamW, weight decay 0.01)."""
    return {"lr_grid": [float(v) for v in p.get("lr_grid", p.get("lrs"))], "pilot_steps": int(p["pilot_steps"]),
            "eval_every": int(p["eval_every"]), "min_steps": int(p["min_steps"]), "max_steps": int(p["max_steps"]),
            "flat_tol": float(p.get("flat_tol", 0.01)), "optimizer": "adamw",
            "weight_decay": float(p.get("weight_decay", 0.01))}


def train_encoder(patches: np.ndarray, target: np.ndarray, n_out: int, p: dict, seed: int,
                  val_frac: float = 0.15, log=None, label: str = "encoder"):
    """Train on random windows of (S, T, patch_len) patches with (S, T) integer targets by the
    platform's one training rule (:func:`reprozoo.blocks.fitting.fit_to_plateau`).

    The last ``val_frac`` of the subjects is held out: it chooses the learning rate from
    ``p["lrs"]`` (each trains ``pilot_steps`` from the same initial weights and batches) and gives
    the validation curve; the chosen rate then trains at a constant rate until the gate's own
    plateau test holds (from ``min_steps``, tolerance ``flat_tol``) or ``max_steps``. Returns the
    model (the weights at the best validation value) and a history: curves {"train_loss",
    "val_loss", "lr"} as (steps, values), ``lr_chosen``, ``lr_pilot_val`` (each rate's best
    validation CE in its pilot), ``stop_step`` and ``plateau`` (stopped flat)."""
    from ...blocks.fitting import fit_to_plateau

    patches = patch_inputs(patches)
    L = int(p["seq_len"])
    n_val = max(1, int(round(val_frac * len(patches))))
    tr_x, tr_y = torch.tensor(patches[:-n_val]), torch.tensor(target[:-n_val].astype(np.int64))
    va_x = torch.tensor(windows(patches[-n_val:], L))
    va_y = torch.tensor(windows(target[-n_val:].astype(np.int64), L))
    bs = int(p["batch"])
    n_sub, n_t = tr_x.shape[:2]

    def build(gen):
        torch.manual_seed(seed)  # the same initial weights for every rate of the grid
        return BreathEncoder(tr_x.shape[-1], L, n_out, dim=int(p["dim"]), depth=int(p["depth"]),
                             heads=int(p["heads"]), dropout=float(p.get("dropout", 0.1)),
                             attn_dropout=p.get("attn_dropout"))

    def train_loss(model, gen):
        si = torch.randint(0, n_sub, (bs, 1), generator=gen)
        idx = torch.randint(0, n_t - L + 1, (bs, 1), generator=gen) + torch.arange(L)[None]
        return nn.functional.cross_entropy(model(tr_x[si, idx]).reshape(-1, n_out), tr_y[si, idx].reshape(-1))

    @torch.no_grad()
    def val_loss(model):
        return float(nn.functional.cross_entropy(model(va_x).reshape(-1, n_out), va_y.reshape(-1)))

    model, rec = fit_to_plateau(build, train_loss, val_loss, fit_config(p), seed, label=label,
                                progress=log or (lambda *_: None))
    model.eval()
    st, every = rec["steps"], int(p["eval_every"])
    losses = np.asarray(rec["losses"], float)
    # mean training loss over the steps since the previous evaluation (the step-0 point: the first batch)
    train = [float(losses[max(0, s - every): max(1, s)].mean()) if len(losses) else float("nan") for s in st]
    hist = {"curves": {"train_loss": (st, train), "val_loss": (st, rec["vals"]), "lr": (st, rec["lrs"])},
            "lr_chosen": float(rec["lr"]), "lr_pilot_val": {str(k): v for k, v in rec["pilot_best"].items()},
            "stop_step": int(rec["stop"]), "plateau": bool(rec["plateau"])}
    return model, hist


@torch.no_grad()
def predict(model: BreathEncoder, patches: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(S, T, patch_len) -> logits (S, T, n_out) and hidden states (S, T, dim), window by window."""
    s, t = patches.shape[:2]
    x = torch.tensor(windows(patch_inputs(patches), seq_len))
    h = model.hidden(x)
    logits = model.head(h)
    return logits.reshape(s, t, -1).numpy(), h.reshape(s, t, -1).numpy()
