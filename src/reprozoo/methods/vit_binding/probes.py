"""Conditioned probes and the binding ratio (the paper's information-theoretic estimator).

A probe q(Y | Z) for a multi-hot label Y = (y_1..y_K) factorises by the chain rule,

    log q(Y | Z) = sum_k log q(y_k | y_<k, Z),

with head k fed the earlier labels (teacher forcing: ``masked_labels`` gives head k the centred
y_i - 1/2 for i < k and 0 otherwise). Its test cross-entropy CE(Y) = -E log2 q(Y | Z) is an upper
bound on H(Y | Z) (bits per scene), and likewise CE(F) >= H(F | Z) for the features F. Since F is
a function of Y,

    I(Y; Z | F) = I(Y; Z) - I(F; Z) = H(Y | F) - [H(Y | Z) - H(F | Z)],

so the binding information is estimated as  B = H(Y|F) - (CE(Y) - CE(F))  and the binding ratio
as  B / H(Y|F): 1 when Z says which features go together, 0 when it holds only the features.

Probe families (same Y / F conditioning; the nonconvex ones fitted by the shared rule ``blocks.fitting.fit_to_plateau``):

* ``linear``: logit_k = w_k . z + u_k . ymask_k + b_k on one vector z ([CLS]); a convex problem,
  fitted to its optimum by full-batch Newton (IRLS) with an L2 chosen on validation (``fit_linear_convex``),
  not by the shared minibatch rule;
* ``quadratic``: x_k = [z, ymask_k], logit_k = w_k . x_k + <A_k x_k, C_k x_k> / sqrt(dim x) + b_k
  (low-rank quadratic form: lets the earlier labels gate how z is read);
* ``attention``: one query per head, q_k = W_q (e_k + sum_i ymask_ik u_i), softmax attention over
  the spatial tokens (never [CLS]), pooled_k = sum_n a_kn t_n, then the quadratic readout on
  [pooled_k, ymask_k]: the head looks up the object its conjunction is about.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

LN2 = math.log(2.0)


def masked_labels(y: torch.Tensor) -> torch.Tensor:
    """(B, K) in {0, 1} -> (B, K, K) with [b, i, k] = y[b, i] - 1/2 if i < k else 0."""
    k = y.shape[-1]
    mask = torch.triu(torch.ones(k, k, dtype=y.dtype, device=y.device), diagonal=1)
    return (y - 0.5).unsqueeze(-1) * mask


class _Quadratic(nn.Module):
    """Per-head linear + low-rank quadratic readout of x (B, K, D) -> logits (B, K)."""

    def __init__(self, in_dim: int, heads: int, rank: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(heads, in_dim) * 0.02)
        self.a = nn.Parameter(torch.randn(heads, rank, in_dim) / math.sqrt(in_dim))
        self.c = nn.Parameter(torch.randn(heads, rank, in_dim) * 0.02)
        self.b = nn.Parameter(torch.zeros(heads))
        self.scale = 1.0 / math.sqrt(in_dim)

    def forward(self, x):
        quad = (torch.einsum("bkd,krd->bkr", x, self.a) * torch.einsum("bkd,krd->bkr", x, self.c)).sum(-1)
        return (x * self.w).sum(-1) + self.scale * quad + self.b


class LinearProbe(nn.Module):
    def __init__(self, z_dim: int, heads: int, rank: int = 0):
        super().__init__()
        self.wz = nn.Linear(z_dim, heads)
        self.wy = nn.Parameter(torch.zeros(heads, heads))  # [k, i], used where i < k

    def forward(self, z, y):
        return self.wz(z) + torch.einsum("bik,ki->bk", masked_labels(y), self.wy)


class QuadraticProbe(nn.Module):
    def __init__(self, z_dim: int, heads: int, rank: int = 8):
        super().__init__()
        self.readout = _Quadratic(z_dim + heads, heads, rank)

    def forward(self, z, y):
        ym = masked_labels(y).transpose(1, 2)  # (B, K, K): row k = head k's conditioning
        x = torch.cat([z.unsqueeze(1).expand(-1, ym.shape[1], -1), ym], dim=-1)
        return self.readout(x)


class AttentionProbe(nn.Module):
    def __init__(self, token_dim: int, heads: int, rank: int = 8):
        super().__init__()
        self.query = nn.Parameter(torch.randn(heads, token_dim) * 0.1)
        self.query_from_y = nn.Parameter(torch.randn(heads, token_dim) * 0.1)
        self.wq = nn.Linear(token_dim, token_dim, bias=False)
        self.readout = _Quadratic(token_dim + heads, heads, rank)
        self.scale = 1.0 / math.sqrt(token_dim)

    def attention(self, tokens, y):
        """Attention weights (B, K, N) of each head over the spatial tokens (B, N, d)."""
        ym = masked_labels(y)  # (B, i, k)
        q = self.wq(self.query + torch.einsum("bik,id->bkd", ym, self.query_from_y))
        return torch.softmax(torch.einsum("bkd,bnd->bkn", q, tokens) * self.scale, dim=-1)

    def forward(self, tokens, y):
        pooled = torch.einsum("bkn,bnd->bkd", self.attention(tokens, y), tokens)
        return self.readout(torch.cat([pooled, masked_labels(y).transpose(1, 2)], dim=-1))


PROBES = {"linear": LinearProbe, "quadratic": QuadraticProbe, "attention": AttentionProbe}


def cross_entropy_bits(probe, z, y, batch: int = 1024) -> np.ndarray:
    """-log2 q(y | z) per scene (sum over heads), teacher-forced on y itself."""
    out = []
    with torch.no_grad():
        for i in range(0, len(z), batch):
            logits = probe(z[i:i + batch], y[i:i + batch])
            nll = nn.functional.binary_cross_entropy_with_logits(logits, y[i:i + batch], reduction="none")
            out.append(nll.sum(-1) / LN2)
    return torch.cat(out).numpy()


def fit_probe(kind: str, z_train, y_train, z_val, y_val, cfg: dict, seed: int, progress=None):
    """Train a probe by the shared rule ``blocks.fitting.fit_to_plateau`` (Adam at every rate of
    ``cfg["fit"]["lr_grid"]`` for a pilot, the best on validation continued at that constant rate until
    the validation cross-entropy passes the platform's plateau test, best-validation weights kept);
    minibatches of ``cfg["batch"]`` scenes. Returns (probe, fit record: ``steps``, ``vals`` (bits per
    scene), ``lrs``, ``lr``, ``stop``, ``plateau``)."""
    from ...blocks.fitting import fit_to_plateau

    def build(gen):
        torch.manual_seed(seed)
        return PROBES[kind](z_train.shape[-1], y_train.shape[-1], cfg.get("rank", 8))

    def train_loss(probe, gen):
        idx = torch.randint(len(z_train), (cfg["batch"],), generator=gen)
        logits = probe(z_train[idx], y_train[idx])
        return nn.functional.binary_cross_entropy_with_logits(logits, y_train[idx], reduction="sum") / len(idx)

    def val_loss(probe):
        return float(cross_entropy_bits(probe, z_val, y_val).mean())

    probe, rec = fit_to_plateau(build, train_loss, val_loss, cfg["fit"], seed, label=f"{kind} probe",
                                progress=progress or (lambda *_: None))
    return probe.eval(), rec


def fit_linear_convex(z_train, y_train, z_val, y_val, cfg: dict, seed: int):
    """The linear probe fitted to its optimum. Head k's logit is linear in x_k = [z, ymask_k, 1], so
    each head is an L2-penalised logistic regression (strictly convex for l2 > 0):

        L_k(w) = mean_scenes BCE(x_k . w, y_k) + (l2 / 2) |w without the bias|^2,

    solved jointly for all heads by damped Newton (IRLS: exact Hessian, Armijo backtracking per head)
    in float64 on z standardised by its training mean and std (folded back into the returned probe's
    weights), from zero until the largest gradient entry is below ``grad_tol`` (quadratic convergence:
    a few dozen iterations). At least ``min_iter`` iterations are recorded (once at the optimum a Newton
    step is a no-op, so the curve stays flat), at most ``max_iter``. Every L2 of ``cfg["l2_grid"]`` is
    solved; the one with the lowest validation cross-entropy at its optimum is kept (standard probing
    practice; no learning rate or step budget to tune). Returns (probe, record): ``steps`` (Newton
    iterations), ``vals`` (validation CE in bits per scene after each), ``lrs`` (1.0: Newton's unit step,
    no schedule), ``grads`` (largest gradient entry after each), ``l2``, ``grad_norm`` (at the end),
    ``stop``, ``plateau`` (gradient below ``grad_tol``), ``lr`` (1.0), ``l2_vals`` and ``l2_edge``."""
    grid = [float(v) for v in cfg["l2_grid"]]
    tol, min_iter, max_iter = float(cfg["grad_tol"]), int(cfg.get("min_iter", 20)), int(cfg["max_iter"])
    dt = torch.float64
    zt, yt = z_train.to(dt), y_train.to(dt)
    mu, sd = zt.mean(0), zt.std(0).clamp_min(1e-8)

    def design(z, y):  # (K, n, D): head k reads [standardised z, its earlier labels, 1]
        zs = (z.to(dt) - mu) / sd
        ym = masked_labels(y.to(dt)).permute(2, 0, 1)  # (K, n, K): [k, b, i]
        k = y.shape[-1]
        return torch.cat([zs.unsqueeze(0).expand(k, -1, -1), ym, torch.ones(k, len(z), 1, dtype=dt)], -1)

    X, T = design(zt, yt), yt.T  # T: (K, n)
    n, dim, heads = X.shape[1], X.shape[2], X.shape[0]
    pen = torch.ones(dim, dtype=dt)
    pen[-1] = 0.0  # the bias is not penalised

    def losses(w, l2):  # (K,) penalised loss per head
        logits = torch.einsum("knd,kd->kn", X, w)
        bce = nn.functional.binary_cross_entropy_with_logits(logits, T, reduction="none").mean(1)
        return bce + 0.5 * l2 * (pen * w * w).sum(1)

    def to_probe(w):
        probe = LinearProbe(z_train.shape[-1], heads)
        wz = w[:, :z_train.shape[-1]] / sd
        with torch.no_grad():
            probe.wz.weight.copy_(wz.float())
            probe.wz.bias.copy_((w[:, -1] - (wz * mu).sum(1)).float())
            # wy[k, i] multiplies ymask[b, i, k]; columns i >= k read zeros
            probe.wy.copy_(w[:, z_train.shape[-1]:z_train.shape[-1] + heads].float())
        return probe.eval()

    best, l2_vals = None, {}
    for l2 in grid:
        w = torch.zeros(heads, dim, dtype=dt)
        steps, vals, grads = [], [], []
        for it in range(1, max_iter + 1):
            logits = torch.einsum("knd,kd->kn", X, w)
            p = torch.sigmoid(logits)
            g = torch.einsum("knd,kn->kd", X, p - T) / n + l2 * pen * w
            gmax = float(g.abs().max())
            if gmax > tol:  # a Newton step; at the optimum none is taken
                h = torch.einsum("knd,kn,kne->kde", X, p * (1 - p), X) / n + torch.diag_embed(
                    (l2 * pen + 1e-12).expand(heads, -1))
                step = torch.linalg.solve(h, g.unsqueeze(-1)).squeeze(-1)
                f0, slope = losses(w, l2), -(g * step).sum(1)
                t = torch.ones(heads, dtype=dt)
                for _ in range(40):  # Armijo backtracking, per head
                    bad = losses(w - t[:, None] * step, l2) > f0 + 1e-4 * t * slope
                    if not bool(bad.any()):
                        break
                    t = torch.where(bad, 0.5 * t, t)
                w = w - t[:, None] * step
                logits = torch.einsum("knd,kd->kn", X, w)
                g = torch.einsum("knd,kn->kd", X, torch.sigmoid(logits) - T) / n + l2 * pen * w
                gmax = float(g.abs().max())
            steps.append(it)
            grads.append(gmax)
            vals.append(float(cross_entropy_bits(to_probe(w), z_val, y_val).mean()))
            if gmax <= tol and it >= min_iter:
                break
        l2_vals[l2] = vals[-1]
        rec = {"steps": steps, "vals": vals, "lrs": [1.0] * len(steps), "grads": grads, "l2": l2,
               "grad_norm": grads[-1], "stop": steps[-1], "plateau": bool(grads[-1] <= tol), "lr": 1.0}
        if best is None or vals[-1] < best[1]["vals"][-1]:
            best = (w, rec)
    w, rec = best
    rec["l2_vals"] = l2_vals
    rec["l2_edge"] = bool(len(grid) > 1 and rec["l2"] in (min(grid), max(grid)))
    return to_probe(w), rec


def candidate_accuracy(probe, z, candidates: list[torch.Tensor], truth: torch.Tensor) -> float:
    """Fraction of scenes whose true Y has the highest q(Y | z) among the label sets consistent
    with the true features (the probe's binding choice; chance = 1 / number of candidates)."""
    hits = []
    with torch.no_grad():
        for zi, cand, yt in zip(z, candidates, truth):
            zz = zi.unsqueeze(0).expand(len(cand), *zi.shape)
            nll = nn.functional.binary_cross_entropy_with_logits(probe(zz, cand), cand, reduction="none").sum(-1)
            hits.append(bool(torch.equal(cand[int(nll.argmin())], yt)))
    return float(np.mean(hits))


def binding_ratio(h_y_given_f: float, ce_y: float, ce_f: float) -> tuple[float, float]:
    """(binding information in bits, binding ratio) from H(Y|F) and the two probe cross-entropies."""
    info = h_y_given_f - (ce_y - ce_f)
    return info, info / h_y_given_f
