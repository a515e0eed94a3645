"""Tokenised flow matching over hierarchical (global + exchangeable site) variables.

Tokens. A data set with S sites becomes 1 + S tokens of a common width D = max(G, Lp + X):

    token 0      [g (G) | 0 ...]             the global parameters          (type 0)
    token 1..S   [l_s (Lp) | x_s (X) | 0 ...]  site s: its parameters and its observation (type 1)

Each entry carries two flags: present (not padding) and generated (the flow acts on it) versus
conditioning (held fixed, read as context). The same network therefore serves both estimators
LF needs, only the flags change:

    likelihood q(x | g, l)           S = 1,  generated = the x entries
    posterior  q(g, l_1..S | x_1..S)  any S, generated = the g and l entries

There is no positional embedding, so the network is permutation-equivariant over sites (sites are
exchangeable) and accepts any S: the posterior trained at S sites is one network, not one per S.
The encoder layers are torch's ``nn.TransformerEncoderLayer`` (pre-LayerNorm, GELU), full
attention over the 1 + S tokens; flow time t enters every token through Fourier features.

Flow matching (conditional OT path, Lipman et al. 2023, with sigma_min as in the reference code):

    x_t = (1 - (1 - sigma_min) t) z + t x_1,  z ~ N(0, I),  u_t = x_1 - (1 - sigma_min) z
    loss = E_{t ~ U(0,1)} mean over generated entries of |v(x_t, t) - u_t|^2

Sampling integrates dx/dt = v(x, t) * generated from t = 0 (noise on the generated entries, the
context on the others) to t = 1 with ``blocks.flows.ode_sample`` (RK4 of blocks/ode.py).
Values are standardised per variable kind (global, local, obs) with statistics of the training set.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

SIGMA_MIN = 1e-3  # reference implementation's cfm_loss


# --- tokens ---------------------------------------------------------------------------------------

@dataclass
class Layout:
    """Where each variable sits in the (1 + S, D) token grid."""

    G: int
    Lp: int
    X: int

    @property
    def D(self) -> int:
        return max(self.G, self.Lp + self.X)

    def masks(self, n_sites: int, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(present, generated) float masks of shape (1 + S, D) for mode 'posterior' | 'likelihood'."""
        present = torch.zeros(1 + n_sites, self.D)
        present[0, :self.G] = 1
        present[1:, :self.Lp + self.X] = 1
        gen = torch.zeros_like(present)
        if mode == "posterior":
            gen[0, :self.G] = 1
            gen[1:, :self.Lp] = 1
        elif mode == "likelihood":
            gen[1:, self.Lp:self.Lp + self.X] = 1
        else:
            raise ValueError(f"mode must be 'posterior' or 'likelihood', not {mode!r}")
        return present, gen

    def pack(self, g: torch.Tensor, l: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(n, G), (n, S, Lp), (n, S, X) -> tokens (n, 1 + S, D)."""
        n, s = l.shape[:2]
        out = torch.zeros(n, 1 + s, self.D, dtype=g.dtype)
        out[:, 0, :self.G] = g
        out[:, 1:, :self.Lp] = l
        out[:, 1:, self.Lp:self.Lp + self.X] = x
        return out

    def unpack(self, tok: torch.Tensor):
        return tok[:, 0, :self.G], tok[:, 1:, :self.Lp], tok[:, 1:, self.Lp:self.Lp + self.X]


class Standardizer:
    """Affine z-scoring per variable kind; statistics pooled over sites (sites are exchangeable)."""

    def __init__(self, g: np.ndarray, l: np.ndarray, x: np.ndarray):
        self.stats = {k: (v.reshape(-1, v.shape[-1]).mean(0), v.reshape(-1, v.shape[-1]).std(0) + 1e-6)
                      for k, v in (("g", g), ("l", l), ("x", x))}

    def fwd(self, kind: str, v: np.ndarray) -> np.ndarray:
        m, s = self.stats[kind]
        return (v - m) / s

    def inv(self, kind: str, v: np.ndarray) -> np.ndarray:
        m, s = self.stats[kind]
        return v * s + m


# --- network --------------------------------------------------------------------------------------

class TokenVelocityField(nn.Module):
    """v(tokens, t): per-token embedding [values, present, generated, Fourier(t)] + type -> encoder -> D."""

    def __init__(self, D: int, dim: int = 32, depth: int = 2, heads: int = 4, mlp_ratio: float = 2.0,
                 n_time: int = 4, n_types: int = 2):
        super().__init__()
        self.D, self.n_time = D, n_time
        self.embed = nn.Linear(3 * D + 2 * n_time, dim)
        self.type_embed = nn.Embedding(n_types, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, int(mlp_ratio * dim), 0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, D)
        self.register_buffer("freqs", math.pi * 2.0 ** torch.arange(n_time).float())

    def forward(self, tok: torch.Tensor, t: torch.Tensor, present: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
        """tok (n, N, D), t (n,), masks (N, D) -> velocity (n, N, D), zero off the generated entries."""
        n, n_tok, _ = tok.shape
        tf = t[:, None] * self.freqs
        tf = torch.cat([torch.sin(tf), torch.cos(tf)], -1)[:, None, :].expand(n, n_tok, -1)
        masks = torch.cat([present, gen], -1)[None].expand(n, -1, -1)
        h = self.embed(torch.cat([tok * present, masks, tf], -1))
        types = torch.ones(n_tok, dtype=torch.long, device=tok.device)
        types[0] = 0
        h = h + self.type_embed(types)[None]
        return self.out(self.norm(self.encoder(h))) * gen


def cfm_loss(net: TokenVelocityField, x1: torch.Tensor, present: torch.Tensor, gen: torch.Tensor,
             z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Conditional flow-matching loss with given noise z and times t (so validation can fix them)."""
    tb = t[:, None, None]
    xt = torch.where(gen.bool(), (1 - (1 - SIGMA_MIN) * tb) * z + tb * x1, x1)
    u = x1 - (1 - SIGMA_MIN) * z
    err = (net(xt, t, present, gen) - u * gen) ** 2
    return err.sum() / (gen.sum() * len(x1))


class _Run:
    """One training run at a constant learning rate that can be advanced in stages (see
    :func:`fit_lr_grid`). ``module`` is trained; ``ema`` (an exponential moving average of its
    weights, decay ``ema_decay`` with the usual warm-up min(decay, (1 + t) / (10 + t))) is what
    the validation loss reads and what is kept."""

    def __init__(self, module: nn.Module, ema: nn.Module, train_idx, batch_loss, val_loss, lr: float, batch: int,
                 eval_every: int, ema_decay: float, generator: torch.Generator):
        self.module, self.ema, self.train_idx, self.batch_loss, self.val_loss = module, ema, train_idx, batch_loss, val_loss
        self.opt = torch.optim.Adam(module.parameters(), lr=lr)
        self.params, self.ema_params = list(module.parameters()), list(ema.parameters())
        self.lr, self.batch, self.eval_every, self.ema_decay, self.generator = lr, batch, eval_every, ema_decay, generator
        self.step, self.window = 0, []
        self.best, self.best_step, self.best_state = float("inf"), 0, None
        self.hist = {"step": [], "train": [], "val": [], "lr": []}

    def flat(self, min_delta: float, flat_tol: float, tail: float = 0.3, min_points: int = 5) -> bool:
        """The validation curve is flat over the last ``tail`` of training (at least ``min_points``
        evaluations there): no new best by more than ``min_delta`` (relative), and a Theil-Sen line
        through the tail improves by at most ``flat_tol`` of the tail's median level over it (the
        platform's convergence gate, :func:`reprozoo.claims.plateau`, which allows 2 %)."""
        from ...claims import plateau

        xs, ys = np.asarray(self.hist["step"], float), np.asarray(self.hist["val"], float)
        start = xs[0] + (1 - tail) * (xs[-1] - xs[0])
        m = xs >= start
        if m.sum() < min_points or self.best_step >= start:
            return False
        return plateau(xs, ys, flat_tol, tail=tail, min_points=min_points)

    def advance(self, until: int, min_steps: int | None = None, min_delta: float = 0.0, flat_tol: float = 0.0) -> bool:
        """Train up to step ``until``; with ``min_steps`` stop early (returning True) once the
        validation curve is flat (:meth:`flat`) at or after ``min_steps``."""
        while self.step < until:
            self.step += 1
            idx = self.train_idx[torch.randint(len(self.train_idx), (min(self.batch, len(self.train_idx)),),
                                               generator=self.generator)]
            loss = self.batch_loss(idx)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            with torch.no_grad():
                decay = min(self.ema_decay, (1 + self.step) / (10 + self.step))
                torch._foreach_lerp_(self.ema_params, self.params, 1 - decay)
            self.window.append(float(loss.detach()))
            if self.step % self.eval_every == 0 or self.step == until:
                with torch.no_grad():
                    vl = float(self.val_loss())
                for k, val in (("step", self.step), ("train", float(np.mean(self.window))), ("val", vl),
                               ("lr", float(self.opt.param_groups[0]["lr"]))):
                    self.hist[k].append(val)
                self.window = []
                if vl < self.best - min_delta * abs(self.best):
                    self.best_step = self.step
                if vl < self.best:
                    self.best, self.best_state = vl, copy.deepcopy(self.ema.state_dict())
                if min_steps is not None and self.step >= min_steps and self.flat(min_delta, flat_tol):
                    return True
        return False


def fit_lr_grid(make_module, train_idx: torch.Tensor, batch_loss_for, val_loss_for, *, lrs, pilot_steps: int,
                min_steps: int, max_steps: int, batch: int, eval_every: int, min_delta: float, flat_tol: float,
                ema_decay: float, generator: torch.Generator) -> tuple[nn.Module, dict]:
    """Constant-learning-rate Adam with the learning rate chosen on validation, then training until
    the validation curve is flat. Shared by every network of every variant, so all follow one rule.

    1. Each learning rate of ``lrs`` trains ``pilot_steps`` steps from the same initial weights
       (``make_module()``) on the same split and validation draws; the one with the lowest
       validation loss so far is kept (the others are dropped).
    2. The kept run continues until, at or after ``min_steps``, no validation value improved on the
       best by more than ``min_delta`` (relative) over the last 30 % of its steps (at least 5
       evaluations there) and a Theil-Sen line through them improves by at most ``flat_tol``
       (:meth:`_Run.flat`), or to ``max_steps``. The learning rate stays constant, so a flat curve
       is a plateau and not a schedule that ran out.

    Validation reads an exponential moving average of the weights (``ema_decay``), which damps the
    weight noise a constant learning rate leaves; the average with the best validation value is
    returned.

    ``batch_loss_for(module)`` / ``val_loss_for(module)`` build the losses. Returns the module and
    its history: curves (step, train, val, lr), best_val, best_step, stop_step, plateau (stopped
    flat before max_steps), lr_chosen and every learning rate's validation value after step 1."""
    runs = []
    for lr in lrs:
        module = make_module()
        ema = copy.deepcopy(module)
        for q in ema.parameters():
            q.requires_grad_(False)
        run = _Run(module, ema, train_idx, batch_loss_for(module), val_loss_for(ema), float(lr), batch, eval_every,
                   ema_decay, generator)
        run.advance(pilot_steps)
        runs.append(run)
    run = min(runs, key=lambda r: r.best)
    plateau = (run.advance(max_steps, min_steps=min_steps, min_delta=min_delta, flat_tol=flat_tol)
               or run.flat(min_delta, flat_tol))
    run.ema.load_state_dict(run.best_state)
    hist = dict(run.hist)
    hist.update(best_val=run.best, best_step=hist["step"][int(np.argmin(hist["val"]))], stop_step=run.step,
                plateau=bool(plateau), lr_chosen=run.lr, lr_pilot_vals={r.lr: r.best for r in runs})
    return run.ema, hist


def fit_cfm(make_net, tok: torch.Tensor, present: torch.Tensor, gen: torch.Tensor, *, lrs, max_steps: int,
            pilot_steps: int, min_steps: int, batch: int, val_frac: float, eval_every: int, min_delta: float,
            flat_tol: float, ema_decay: float, generator: torch.Generator,
            val_items: int = 384) -> tuple[TokenVelocityField, dict]:
    """CFM training of ``make_net()`` with :func:`fit_lr_grid` on a random (1 - val_frac) / val_frac
    split (at least one item each way).

    The validation loss uses fixed draws of (z, t), repeated so that about ``val_items`` (item, z, t)
    triples enter it (at least 2 and at most 32 per item): a low-variance, common-random-numbers
    comparison between evaluations and between learning rates, also for the tiny validation splits
    of small simulation budgets.
    """
    n_val = min(len(tok) - 1, max(1, int(round(val_frac * len(tok)))))
    perm = torch.randperm(len(tok), generator=generator)
    reps = int(np.clip(val_items // n_val, 2, 32))
    val = tok[perm[:n_val]].repeat(reps, 1, 1)
    zv = torch.randn(val.shape, generator=generator)
    tv = torch.rand(len(val), generator=generator)

    def batch_loss_for(net):
        def batch_loss(idx):
            xb = tok[idx]
            return cfm_loss(net, xb, present, gen, torch.randn(xb.shape, generator=generator),
                            torch.rand(len(xb), generator=generator))
        return batch_loss

    def val_loss_for(net):
        return lambda: cfm_loss(net, val, present, gen, zv, tv)

    return fit_lr_grid(make_net, perm[n_val:], batch_loss_for, val_loss_for, lrs=lrs, generator=generator,
                       pilot_steps=pilot_steps, min_steps=min_steps, max_steps=max_steps, batch=batch,
                       eval_every=eval_every, min_delta=min_delta, flat_tol=flat_tol, ema_decay=ema_decay)


def sample_cfm(net: TokenVelocityField, context: torch.Tensor, present: torch.Tensor, gen: torch.Tensor,
               n_steps: int, generator: torch.Generator, chunk: int = 8192) -> torch.Tensor:
    """Tokens with the generated entries drawn by integrating the learned flow (context kept fixed)."""
    from ...blocks.flows import ode_sample

    net.eval()
    outs = []
    for i in range(0, len(context), chunk):
        c = context[i:i + chunk]
        x0 = torch.where(gen.bool(), torch.randn(c.shape, generator=generator), c)

        def velocity(x, t, _n=len(c)):
            return net(x, torch.full((_n,), float(t)), present, gen)

        outs.append(ode_sample(velocity, x0, 0.0, 1.0, n_steps, "rk4"))
    net.train()
    return torch.cat(outs)
