"""Numerics of prime attention (per-pair primed keys/values) and of the coupled synthetic system."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.methods.prime_attention import data as D  # noqa: E402
from reprozoo.methods.prime_attention.model import (ChannelAttention, build, matched_width,  # noqa: E402
                                                    n_params)


def _pair_loop(att: ChannelAttention, e: torch.Tensor) -> torch.Tensor:
    """The definition, one pair at a time: s_ij = <q_i, k_j * FK_ij>/sqrt(dh), o_i = sum_j a_ij v_j * FV_ij."""
    B, N, d = e.shape
    h, dh = att.h, d // att.h
    fk, fv = att.filters()
    q, k, v = att.q(e), att.k(e), att.v(e)
    out = torch.zeros(B, N, d, dtype=e.dtype)
    for b in range(B):
        for i in range(N):
            for hh in range(h):
                sl = slice(hh * dh, (hh + 1) * dh)
                s = torch.stack([(q[b, i, sl] * k[b, j, sl] * fk[i, j, sl]).sum() / math.sqrt(dh) for j in range(N)])
                a = s.softmax(0)
                out[b, i, sl] = sum(a[j] * v[b, j, sl] * fv[i, j, sl] for j in range(N))
    return att.o(out)


@pytest.mark.parametrize("rank", [None, 2])
def test_prime_matches_pairwise_definition(rank):
    torch.manual_seed(0)
    att = ChannelAttention(4, 8, 2, prime=True, filter_rank=rank).double()
    with torch.no_grad():  # non-trivial filters
        for name, p in att.named_parameters():
            if name in ("pk", "pv", "c"):
                p.normal_(0, 0.5)
    e = torch.randn(2, 4, 8, dtype=torch.float64)
    assert torch.allclose(att(e), _pair_loop(att, e), atol=1e-12)


def test_prime_at_init_equals_standard_attention():
    """F = 1 at initialisation: prime attention with the standard model's weights gives its output."""
    torch.manual_seed(1)
    std = ChannelAttention(5, 8, 2, prime=False).double()
    pr = ChannelAttention(5, 8, 2, prime=True).double()
    pr.load_state_dict(std.state_dict(), strict=False)
    e = torch.randn(3, 5, 8, dtype=torch.float64)
    assert torch.allclose(std(e), pr(e), atol=1e-13)


def test_sign_flip_filter_reverses_the_message():
    """A single key (a_00 = 1): F^V = -1 turns the message W_o v into -W_o v; F^K leaves it unchanged."""
    torch.manual_seed(2)
    att = ChannelAttention(1, 4, 2, prime=True).double()
    e = torch.randn(3, 1, 4, dtype=torch.float64)
    plain = att(e) - att.o.bias
    with torch.no_grad():
        att.pv.fill_(-2.0)
        att.pk.normal_(0, 3.0)
    assert torch.allclose(att(e) - att.o.bias, -plain, atol=1e-12)


def test_filter_gradients_finite_difference():
    torch.manual_seed(3)
    att = ChannelAttention(3, 4, 2, prime=True).double()
    with torch.no_grad():
        att.pk.normal_(0, 0.3)
        att.pv.normal_(0, 0.3)
    e = torch.randn(2, 3, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda pk, pv: torch.func.functional_call(att, {"pk": pk, "pv": pv}, (e,)),
                                    (att.pk.detach().clone().requires_grad_(), att.pv.detach().clone().requires_grad_()))


def test_channel_permutation_equivariance():
    """Relabelling channels, with the pair filter table permuted alike, permutes the forecasts alike."""
    torch.manual_seed(4)
    m = build(4, 10, 3, 8, 2, 2, 2, prime=True).double()
    with torch.no_grad():
        for layer in m.layers:
            layer.attn.pk.normal_(0, 0.5)
            layer.attn.pv.normal_(0, 0.5)
    x = torch.randn(2, 10, 4, dtype=torch.float64)
    perm = torch.tensor([2, 0, 3, 1])
    y = m(x)
    with torch.no_grad():
        for layer in m.layers:
            layer.attn.pk.copy_(layer.attn.pk[perm][:, perm])
            layer.attn.pv.copy_(layer.attn.pv[perm][:, perm])
    assert torch.allclose(m(x[..., perm]), y[..., perm], atol=1e-12)


def test_matched_width_counts():
    """Standard width is the one whose count is closest to the prime model's; prime adds 2 N^2 d per layer."""
    N, L, H, d, heads, layers = 8, 58, 24, 24, 4, 2
    base = n_params(build(N, L, H, d, heads, layers, 2, prime=False))
    prime = n_params(build(N, L, H, d, heads, layers, 2, prime=True))
    assert prime - base == layers * 2 * N * N * d
    (ds, dff), cp, cs = matched_width(N, L, H, d, heads, layers, 2)
    assert cp == prime and ds > d and ds % heads == 0
    assert n_params(build(N, L, H, ds, heads, layers, 2, prime=False, d_ff=dff)) == cs
    assert abs(cs - cp) <= layers * (2 * ds + 1)  # one FFN unit per layer is the finest step
    assert abs(cs - cp) / cp < 0.01


def test_coupled_system_laws():
    rng = np.random.default_rng(0)
    x, cmap = D.coupled_system(rng, 4000, n_drivers=4, short_lag=6, long_lag=72, noise=0.05)
    assert x.shape == (4000, 8) and (cmap > 0).sum() == 4
    for i, j in np.argwhere(cmap > 0):
        law = D.LAWS[cmap[i, j]]
        lag = 72 if law == "delayed" else 6
        src, tgt = x[:-lag, j], x[lag:, i]
        if law == "nonlinear":
            r = np.corrcoef(src ** 2, tgt)[0, 1]
            assert r > 0.95 and abs(np.corrcoef(src, tgt)[0, 1]) < 0.2  # invisible to linear correlation
        else:
            r = np.corrcoef(src, tgt)[0, 1]
            assert (r < -0.95) if law == "sign_flipped" else (r > 0.95)


def test_windows_respect_split_borders():
    z = np.arange(100, dtype=np.float32)[:, None]
    _, (n_tr, n_va) = D.split_standardise(np.random.default_rng(0).normal(size=(100, 1)))
    assert (n_tr, n_va) == (70, 80)
    tr = D.window_starts(0, n_tr, 20, 5)
    va = D.window_starts(n_tr, n_va, 20, 5, targets_from=n_tr)
    X, Y = D.windows(z, tr, 20, 5)
    assert Y.max() < n_tr and len(tr) == 70 - 25 + 1
    Xv, Yv = D.windows(z, va, 20, 5)
    assert Yv.min() == n_tr and Yv.max() < n_va and Xv.min() == n_tr - 20


def test_macrodata_growth_rates():
    x, cols = D.load_macrodata(None)
    assert x.shape == (202, 12) and cols[0] == "realgdp"
    assert 0.6 < x[:, 0].mean() < 1.0  # US real GDP grew ~0.8 % per quarter 1959-2009
