"""Rate RNN with Dale's principle and the optimal-transport projection of its magnitudes.

Dynamics (Euler step of tau dr/dt = -r + relu(W r + W_in u + b) + noise, alpha = dt/tau):

    r_{t+1} = (1 - alpha) r_t + alpha relu(W r_t + W_in u_t + b + sigma_rec sqrt(2/alpha) xi_t)
    z_t     = W_out r_{t+1} + b_out                              (logits of the choices)

Dale's principle: the first n_E = f_E N units are excitatory, the rest inhibitory, and
W = M diag(s) with magnitudes M >= 0 and s_j = +1 (j excitatory) or -1 (j inhibitory): every
outgoing weight of a unit has that unit's sign.

Heavy-tailed magnitudes by optimal transport. Let the block B of M (post-synaptic type a,
pre-synaptic type b; four blocks EE, EI, IE, II) hold n values m_1..m_n, and let the target be
a distribution with quantile function F^{-1}. The Wasserstein-2 projection of the empirical
distribution of the m_i onto the n-point quantization of the target,

    min_{pi permutation} sum_i (m_i - q_{pi(i)})^2,   q_k = c_b F^{-1}((k - 1/2) / n),

is solved in 1-D by the monotone (rank-matching) map: the k-th smallest m_i becomes q_k. After
every gradient step each block is projected this way, so the magnitudes always have exactly the
target distribution (log-normal for the heavy-tailed RNN; Gamma with the log-normal's mean and
RMS, or half-normal, for the light-tailed ones) and learning moves only *which* synapse carries
which magnitude.

Scale. The block scales c_E, c_I = c_E n_E / n_I make every row E/I balanced in expectation
(mean excitatory input = mean inhibitory input), and c_E puts the bulk of the spectrum of the
random matrix at radius g (Rajan & Abbott 2006: r^2 = sum over columns of the entries' variance),
so every magnitude law starts from the same radius. The log-normal and the matched Gamma law also
have the same block means (hence the same rank-<=2 E/I mean part): they differ only in shape.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import gamma, norm


LAWS = ("lognormal", "gamma", "halfnormal")


def gamma_shape(sigma_ln: float = 1.0) -> float:
    """Shape k of the Gamma law whose mean / RMS equals the log-normal's (log-std sigma_ln).

    Gamma(k, theta): mean k theta, E[X^2] = k (k + 1) theta^2, so mean / RMS = sqrt(k / (k + 1));
    the log-normal's is exp(-sigma^2 / 2). Equal when k = m^2 / (1 - m^2), m = exp(-sigma^2 / 2)
    (sigma = 1: k = 1 / (e - 1) = 0.582). Same mean and RMS per block, exponential (light) tail."""
    m2 = math.exp(-sigma_ln**2)
    return m2 / (1.0 - m2)


def unit_quantiles(dist: str, n: int, sigma_ln: float = 1.0) -> np.ndarray:
    """n mid-point quantiles of the magnitude law scaled to unit root-mean-square, E[X^2] = 1.

    dist: 'lognormal' (log-std sigma_ln: heavy right tail; E[X^2] = exp(2 sigma^2) before
    scaling), 'gamma' (shape :func:`gamma_shape`: the log-normal's mean / RMS with an
    exponential, light tail) or 'halfnormal' (|N(0,1)|, E[X^2] = 1).
    """
    u = (np.arange(n) + 0.5) / n
    if dist == "lognormal":
        return np.exp(sigma_ln * norm.ppf(u) - sigma_ln**2)
    if dist == "gamma":
        k = gamma_shape(sigma_ln)
        return gamma.ppf(u, k) / math.sqrt(k * (k + 1.0))
    if dist == "halfnormal":
        return norm.ppf(0.5 + 0.5 * u)
    raise ValueError(f"unknown magnitude law '{dist}' ({' | '.join(LAWS)})")


def unit_mean(dist: str, sigma_ln: float = 1.0) -> float:
    """E[X] of the unit-RMS law: exp(-sigma^2 / 2) (log-normal and its matched Gamma),
    sqrt(2 / pi) (half-normal)."""
    if dist not in LAWS:
        raise ValueError(f"unknown magnitude law '{dist}' ({' | '.join(LAWS)})")
    return math.sqrt(2 / math.pi) if dist == "halfnormal" else math.exp(-sigma_ln**2 / 2)


def ei_signs(n: int, frac_exc: float) -> np.ndarray:
    n_exc = int(round(frac_exc * n))
    return np.concatenate([np.ones(n_exc), -np.ones(n - n_exc)])


def block_slices(n: int, n_exc: int):
    """(rows, cols) slices of the four E/I blocks of an n x n matrix, post x pre."""
    e, i = slice(0, n_exc), slice(n_exc, n)
    return [(e, e), (e, i), (i, e), (i, i)]


def block_targets(n: int, frac_exc: float, dist: str, g: float, sigma_ln: float = 1.0) -> list[np.ndarray]:
    """Sorted target magnitudes of each block (order of :func:`block_slices`)."""
    n_exc = int(round(frac_exc * n))
    n_inh = n - n_exc
    # unit-RMS law: mean m, variance 1 - m^2; radius^2 = n_E c_E^2 (1 - m^2) + n_I c_I^2 (1 - m^2)
    m = unit_mean(dist, sigma_ln)
    ratio = n_exc / n_inh  # c_I / c_E for E/I balance
    c_e = g / math.sqrt((1 - m**2) * (n_exc + n_inh * ratio**2))
    out = []
    for rows, cols in block_slices(n, n_exc):
        size = (rows.stop - rows.start) * (cols.stop - cols.start)
        c = c_e if cols.start == 0 else c_e * ratio
        out.append(c * unit_quantiles(dist, size, sigma_ln))
    return out


@torch.no_grad()
def ot_project_(mag: torch.Tensor, slices, targets: list[torch.Tensor]) -> None:
    """In place: each block's entries replaced by the target values of the same rank
    (the 1-D optimal-transport map onto the quantized target law)."""
    for (rows, cols), tgt in zip(slices, targets):
        block = mag[rows, cols]
        flat = block.reshape(-1)
        order = torch.argsort(flat, stable=True)
        new = torch.empty_like(flat)
        new[order] = tgt
        block.copy_(new.view_as(block))


class RateRNN(torch.nn.Module):
    """Continuous-time rate RNN; ``dale`` None (unconstrained) or the magnitude law."""

    def __init__(self, n_in: int, n_hidden: int, n_out: int, dale: str | None, g: float = 1.0,
                 frac_exc: float = 0.8, sigma_ln: float = 1.0, alpha: float = 0.5, sigma_rec: float = 0.05):
        super().__init__()
        self.n, self.alpha, self.sigma_rec, self.dale = n_hidden, alpha, sigma_rec, dale
        self.w_in = torch.nn.Parameter(torch.randn(n_hidden, n_in) / math.sqrt(n_in))
        self.b = torch.nn.Parameter(torch.zeros(n_hidden))
        self.w_out = torch.nn.Parameter(torch.randn(n_out, n_hidden) / math.sqrt(n_hidden))
        self.b_out = torch.nn.Parameter(torch.zeros(n_out))
        if dale is None:
            self.w_rec = torch.nn.Parameter(g * torch.randn(n_hidden, n_hidden) / math.sqrt(n_hidden))
            return
        signs = ei_signs(n_hidden, frac_exc)
        self.n_exc = int((signs > 0).sum())
        self.register_buffer("signs", torch.tensor(signs, dtype=torch.float32))
        self.slices = block_slices(n_hidden, self.n_exc)
        for k, t in enumerate(block_targets(n_hidden, frac_exc, dale, g, sigma_ln)):
            self.register_buffer(f"target{k}", torch.tensor(t, dtype=torch.float32))
        self.mag = torch.nn.Parameter(torch.rand(n_hidden, n_hidden))  # random ranks
        self.project()

    def project(self) -> None:
        """The OT step (no-op for the unconstrained RNN)."""
        if self.dale is not None:
            ot_project_(self.mag, self.slices, [getattr(self, f"target{k}") for k in range(4)])

    def recurrent_weights(self) -> torch.Tensor:
        return self.w_rec if self.dale is None else self.mag * self.signs[None, :]

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None):
        """x: (T, B, n_in) -> logits (T, B, n_out), rates (T, B, N)."""
        W = self.recurrent_weights()
        r = x.new_zeros(x.shape[1], self.n)
        drive = x @ self.w_in.T + self.b
        noise_std = self.sigma_rec * math.sqrt(2.0 / self.alpha)
        rates = []
        for t in range(x.shape[0]):
            pre = r @ W.T + drive[t]
            if noise_std > 0:
                pre = pre + noise_std * torch.randn(pre.shape, generator=generator, device=pre.device)
            r = (1 - self.alpha) * r + self.alpha * torch.relu(pre)
            rates.append(r)
        rates = torch.stack(rates)
        return rates @ self.w_out.T + self.b_out, rates
