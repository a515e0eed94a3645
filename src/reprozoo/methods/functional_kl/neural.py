"""The neural candidate of the regressor choice: one small MLP noise predictor per half of the paths.

The ridge candidates (fkl.py) are linear in fixed features; the denoisers of the bifurcating chains
are not in their span. This candidate is a small MLP (``width`` x ``depth``, SiLU) shared across the
lambda nodes (lambda is an input) and across the two measures (a 0/1 measure input), so a pair (A, B)
costs two fits, one per half of each measure's paths:

    eps_hat_h(x, lambda, m) = s x / (a^2 + s^2) + MLP_h([x / sqrt(a^2 + s^2), lambda / 10, m]),

with x = a z + s eps (a, s from lambda, fkl._alpha_sigma). The first term is the exact noise
predictor when the whitened clean paths are N(0, I) (the reference measure), so the network learns
the departure from it. Each half's net is trained by the shared rule (blocks/fitting.fit_to_plateau:
the rate grid piloted on validation, constant rate to the plateau, best weights kept) on the
denoising loss at lambda drawn uniformly over [lambda_min, lambda_max], validated on the last
``val_frac`` of that half's paths (fixed noise draws at every quadrature node), so that the net of
half h depends on half h only.

What it returns per node (the quantities the ridge candidates have, so one rule chooses among all):
the two-fold held-out denoising loss (net of half h scored on the other half, with ``n_noise``
fresh draws per path, summed over A and B: fkl.heldout_loss's definition), and the forward and
reverse integrands of both estimators from fresh evaluation interpolants (``n_eval_noise`` per path):
``crossfit`` 1/2 E <D_0, D_1> with D_h = eps_hat_h(., A) - eps_hat_h(., B); ``plain``
1/2 E ||(D_0 + D_1) / 2||^2 (the plug-in square of the two halves' averaged predictor: a bagged
fit on all the paths, not one fit on all of them as for the ridge candidates).
"""
from __future__ import annotations

import numpy as np

from .fkl import FKLConfig, _alpha_sigma, lambda_nodes

# the setting measured in the README (neural_probe.py): the best of the few tried on bif_onset at the
# TI's 1000 paths (width 32-64 or the full lambda range overfitted: validation loss rose from step 0)
DEFAULT_FIT = {"width": 16, "depth": 2, "lr_grid": [1.0e-3, 3.0e-3], "pilot_steps": 100, "min_steps": 1000,
               "max_steps": 3000, "eval_every": 40, "flat_tol": 0.001, "batch": 1024, "val_frac": 0.2,
               "val_noise": 2, "pilot_score": "tail", "lam_range": [-3.0, 3.0]}


def _build(d: int, width: int, depth: int, gen):
    import torch

    layers, k = [], d + 2
    for _ in range(depth):
        lin = torch.nn.Linear(k, width)
        layers += [lin, torch.nn.SiLU()]
        k = width
    out = torch.nn.Linear(k, d)
    layers.append(out)
    net = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for m in net:
            if isinstance(m, torch.nn.Linear):
                bound = 1.0 / np.sqrt(m.in_features)
                m.weight.uniform_(-bound, bound, generator=gen)
                m.bias.zero_()
        out.weight.mul_(0.1)
    return net


class Gaussian:
    """The moment-matched Gaussian of each measure's clean whitened paths (mean mu_m, covariance
    U_m diag(e_m) U_m^T): its noise predictor s S^{-1} (x - a mu_m), S = a^2 Sigma_m + s^2 I, is the
    affine candidate's population limit and the base the network corrects."""

    def __init__(self, zs: list[np.ndarray]):
        import torch

        mus, Us, es = [], [], []
        for z in zs:
            mu = z.mean(0)
            e, U = np.linalg.eigh(np.cov(z, rowvar=False) + 1e-6 * np.eye(z.shape[1]))
            mus.append(mu)
            Us.append(U)
            es.append(np.maximum(e, 1e-6))
        self.mu, self.U, self.e = (torch.as_tensor(np.stack(v), dtype=torch.float32) for v in (mus, Us, es))

    def __call__(self, x, a, s, m):
        mi = m.long()
        y = torch_bmv(self.U[mi].transpose(1, 2), x - a[:, None] * self.mu[mi])
        y = y / (a[:, None] ** 2 * self.e[mi] + s[:, None] ** 2)
        return s[:, None] * torch_bmv(self.U[mi], y)


def torch_bmv(A, v):
    return (A @ v[:, :, None])[:, :, 0]


def _predict(net, x, lam, m):
    """eps_hat for rows x (n, d) at log-SNR lam (n,) of measure m (n,) (torch tensors)."""
    import torch

    a = torch.sigmoid(lam / 2.0)
    s = 1.0 - a
    v = (a * a + s * s)[:, None]
    inp = torch.cat([x / torch.sqrt(v), (lam / 10.0)[:, None], m[:, None]], dim=1)
    return net.base(x, a, s, m) + net(inp)


def _fixed_rows(zs: list[np.ndarray], lams: np.ndarray, reps: int, rng: np.random.Generator):
    """Interpolants of every path of each measure at every node, ``reps`` draws each (numpy)."""
    xs, es, ls, ms = [], [], [], []
    for m, z in enumerate(zs):
        for lam in lams:
            a, s = _alpha_sigma(lam)
            zz = np.repeat(z, reps, axis=0)
            eps = rng.standard_normal(zz.shape)
            xs.append(a * zz + s * eps)
            es.append(eps)
            ls.append(np.full(len(zz), lam))
            ms.append(np.full(len(zz), float(m)))
    return [np.concatenate(v) for v in (xs, es, ls, ms)]


def fit_half(za: np.ndarray, zb: np.ndarray, cfg: FKLConfig, fit: dict, seed: int, progress=print):
    """One MLP noise predictor for both measures, from whitened clean paths za, zb of one half."""
    import torch

    from ...blocks.fitting import fit_to_plateau

    fit = {**DEFAULT_FIT, **(fit or {})}
    lams, _ = lambda_nodes(cfg)
    lo, hi = float(lams.min()), float(lams.max())
    if fit.get("lam_range"):  # train (and validate) on this band of log SNR only
        lo, hi = (float(v) for v in fit["lam_range"])
        lams = lams[(lams >= lo) & (lams <= hi)]
    rng = np.random.default_rng(seed)
    parts = []
    for z in (za, zb):
        k = max(1, int(round(len(z) * float(fit["val_frac"]))))
        parts.append((z[:-k], z[-k:]))
    tr = [torch.as_tensor(t, dtype=torch.float32) for t, _ in parts]
    xv, ev, lv, mv = (torch.as_tensor(v, dtype=torch.float32)
                      for v in _fixed_rows([v for _, v in parts], lams, int(fit["val_noise"]), rng))
    d, B = za.shape[1], int(fit["batch"])
    base = Gaussian([t for t, _ in parts])

    def build(g):
        net = _build(d, int(fit["width"]), int(fit["depth"]), g)
        net.base = base  # a plain attribute (not a module): no parameters, not in the state dict
        return net

    def train_loss(net, g):
        rows = []
        for m, z in enumerate(tr):
            idx = torch.randint(len(z), (B // 2,), generator=g)
            rows.append((z[idx], torch.full((B // 2,), float(m))))
        z = torch.cat([r[0] for r in rows])
        m = torch.cat([r[1] for r in rows])
        lam = lo + (hi - lo) * torch.rand(len(z), generator=g)
        a = torch.sigmoid(lam / 2.0)[:, None]
        eps = torch.randn(z.shape, generator=g)
        x = a * z + (1.0 - a) * eps
        return ((_predict(net, x, lam, m) - eps) ** 2).sum(1).mean()

    def val_loss(net):
        with torch.no_grad():
            return float(((_predict(net, xv, lv, mv) - ev) ** 2).sum(1).mean())

    net, rec = fit_to_plateau(build, train_loss, val_loss,
                              fit, seed, label="fkl_mlp", progress=progress)
    net.eval()
    return net, rec


def _eval(net, x: np.ndarray, lam: float, m: int) -> np.ndarray:
    import torch

    with torch.no_grad():
        xt = torch.as_tensor(x, dtype=torch.float32)
        n = len(xt)
        return _predict(net, xt, torch.full((n,), float(lam)), torch.full((n,), float(m))).double().numpy()


def neural_pair(za: np.ndarray, zb: np.ndarray, cfg: FKLConfig, fit: dict, seed: int, progress=print) -> dict:
    """The neural candidate's per-node held-out loss and integrands for whitened paths za of A, zb of B.

    Halves as in fkl.pair_stats (first, second). Returns ``heldout`` (n_nodes,), ``forward_<est>`` /
    ``reverse_<est>`` (n_nodes,) for est in plain, crossfit, ``units_<est>`` (n_nodes, n_A): the per
    path of A share of the forward integrand, and ``records``: the two fits' records."""
    halves = [(z[: len(z) // 2], z[len(z) // 2: 2 * (len(z) // 2)]) for z in (za, zb)]
    nets, recs = [], []
    for h in (0, 1):
        net, rec = fit_half(halves[0][h], halves[1][h], cfg, fit, seed + 101 * h, progress)
        nets.append(net)
        recs.append(rec)
    lams, _ = lambda_nodes(cfg)
    rng = np.random.default_rng(seed + 7)
    n_a = len(za)
    out = {k: np.zeros(len(lams)) for k in ("heldout", "forward_plain", "reverse_plain",
                                             "forward_crossfit", "reverse_crossfit")}
    out.update(units_plain=np.zeros((len(lams), n_a)), units_crossfit=np.zeros((len(lams), n_a)))
    for i, lam in enumerate(lams):
        a, s = _alpha_sigma(lam)
        for m in (0, 1):
            for h in (0, 1):
                z = np.repeat(halves[m][1 - h], cfg.n_noise, axis=0)
                eps = rng.standard_normal(z.shape)
                r = _eval(nets[h], a * z + s * eps, lam, m) - eps
                out["heldout"][i] += float(np.mean(np.sum(r * r, 1)))
        for m, z in enumerate((za, zb)):
            reps = cfg.n_eval_noise
            x = a * np.repeat(z, reps, axis=0) + s * rng.standard_normal((len(z) * reps, z.shape[1]))
            D = [_eval(net, x, lam, 0) - _eval(net, x, lam, 1) for net in nets]
            cross = 0.5 * np.sum(D[0] * D[1], 1)
            Dbar = 0.5 * (D[0] + D[1])
            plain = 0.5 * np.sum(Dbar * Dbar, 1)
            key = "forward" if m == 0 else "reverse"
            out[f"{key}_crossfit"][i], out[f"{key}_plain"][i] = cross.mean(), plain.mean()
            if m == 0:
                out["units_crossfit"][i] = cross.reshape(n_a, reps).mean(1)
                out["units_plain"][i] = plain.reshape(n_a, reps).mean(1)
    out["records"] = recs
    return out
