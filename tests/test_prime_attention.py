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


def test_channel_embedding_breaks_the_channel_symmetry():
    """Standard attention without a channel embedding is permutation-equivariant (its channels are
    interchangeable: a target cannot tell which channel is its driver); ``standard_id``'s learned per-channel
    embedding breaks that, with N x d extra parameters, and permuting the embedding with the channels
    restores equivariance."""
    torch.manual_seed(5)
    N, L, H, d = 4, 10, 3, 8
    std = build(N, L, H, d, 2, 1, 2, prime=False, norm=False).double()
    sid = build(N, L, H, d, 2, 1, 2, prime=False, norm=False, channel_id=True).double()
    assert n_params(sid) - n_params(std) == N * d
    x = torch.randn(2, L, N, dtype=torch.float64)
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.allclose(std(x[..., perm]), std(x)[..., perm], atol=1e-12)
    with torch.no_grad():
        sid.chan.normal_(0, 1.0)
    y = sid(x)
    assert not torch.allclose(sid(x[..., perm]), y[..., perm], atol=1e-3)
    with torch.no_grad():
        sid.chan.copy_(sid.chan[perm])
    assert torch.allclose(sid(x[..., perm]), y[..., perm], atol=1e-12)


def test_homogeneous_system_one_law_one_lag():
    """The control system: every target is a delayed copy of its driver at one common lag."""
    rng = np.random.default_rng(3)
    system = D.draw_system(rng, 4, lags=(34, 42), noise=0.05, homogeneous=True)
    assert len(set(system["lag"])) == 1 and 34 <= system["lag"][0] <= 42
    cmap = system["cmap"]
    assert set(cmap[cmap > 0].tolist()) == {D.LAWS.index("delayed")} and (cmap > 0).sum() == 4
    x = D.simulate(system, rng, 1, 20000)[0]
    lag = system["lag"][0]
    for i, j in np.argwhere(cmap > 0):
        assert np.corrcoef(x[:-lag, j], x[lag:, i])[0, 1] > 0.95


def test_unpaired_system_has_no_cross_channel_information():
    """The must-fail control (round 5): every target echoes a hidden, independent copy of its driver through
    the same law and lag, so each channel keeps its marginal law (the echo's lag-90 memory, its variance) but
    no observed channel predicts another at any lag; in the paired system the echo correlation is > 0.85."""
    rng = np.random.default_rng(7)
    system = D.draw_system(rng, 4, lags=(34, 42), noise=0.05, unpaired=True)
    assert (system["cmap"] == 0).all()
    # independent episodes: correlations across 3000 episodes at fixed rows (sd ~ 0.018 where there is none)
    x = D.simulate(system, rng, 3000, 200)
    xp = D.simulate(dict(system, unpaired=False), np.random.default_rng(8), 3000, 200)
    t = 199
    for k in range(4):
        j, lag, i = system["source"][k], system["lag"][k], 4 + k
        assert abs(np.corrcoef(xp[:, t - lag, j], xp[:, t, i])[0, 1]) > 0.85  # the pair (signed square: ~0.92)
        assert abs(np.corrcoef(x[:, t - lag, j], x[:, t, i])[0, 1]) < 0.1  # gone without pairs
        for lag2 in range(0, 100, 3):  # no observed driver carries the target, at any lag
            for jj in range(4):
                assert abs(np.corrcoef(x[:, t - lag2, jj], x[:, t, i])[0, 1]) < 0.1
        assert abs(x[:, t, i].var() - xp[:, t, i].var()) < 0.15 * xp[:, t, i].var()  # same marginal scale
        r90 = np.corrcoef(x[:, t - 90, i], x[:, t, i])[0, 1]
        r90p = np.corrcoef(xp[:, t - 90, i], xp[:, t, i])[0, 1]
        assert abs(r90 - r90p) < 0.1  # same seasonal memory


def test_pair_bias_starts_at_standard_id_and_routes_per_pair():
    """``standard_id_bias``: a per-pair, per-head score bias, zero at init (the model equals ``standard_id``
    with the same weights); a large bias on (i, j) routes query i to key j alone, whatever the content;
    it adds n_layers x heads x N^2 parameters."""
    torch.manual_seed(6)
    N, L, H, d, h = 4, 10, 3, 8, 2
    sid = build(N, L, H, d, h, 1, 2, prime=False, norm=False, channel_id=True).double()
    sib = build(N, L, H, d, h, 1, 2, prime=False, norm=False, channel_id=True, pair_bias=True).double()
    assert n_params(sib) - n_params(sid) == h * N * N
    sib.load_state_dict(sid.state_dict(), strict=False)
    x = torch.randn(2, L, N, dtype=torch.float64)
    assert torch.allclose(sib(x), sid(x), atol=1e-13)
    att = ChannelAttention(N, d, h, prime=False, pair_bias=True).double()
    with torch.no_grad():
        att.bias.zero_()
        att.bias[:, 1, 3] = 60.0
    e = torch.randn(3, N, d, dtype=torch.float64)
    _, a = att(e, return_attention=True)  # (b, h, i, j)
    assert torch.allclose(a[:, :, 1, 3], torch.ones(3, h, dtype=torch.float64), atol=1e-12)
    assert not torch.allclose(a[:, :, 0, 3], torch.ones(3, h, dtype=torch.float64), atol=1e-2)


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
    """Each target echoes one driver at its own lag in [34, 42] through its law (the signed square is
    invertible: it keeps the driver's sign, so the echo carries the driver's value, nonlinearly)."""
    rng = np.random.default_rng(0)
    x, system = D.coupled_system(rng, 20000, n_drivers=4, lags=(34, 42), noise=0.05, season_share=0.4)
    cmap = system["cmap"]
    assert x.shape == (20000, 8) and (cmap > 0).sum() == 4
    assert all(34 <= lag <= 42 for lag in system["lag"])
    for i, j in np.argwhere(cmap > 0):
        law = D.LAWS[cmap[i, j]]
        lag = system["lag"][i - 4]
        src, tgt = x[:-lag, j], x[lag:, i]
        if law == "nonlinear":
            r_nl = np.corrcoef(src * np.abs(src), tgt)[0, 1]
            assert r_nl > 0.95 and r_nl > np.corrcoef(src, tgt)[0, 1] + 0.02  # better fitted by the signed square
        else:
            r = np.corrcoef(src, tgt)[0, 1]
            assert (r < -0.95) if law == "sign_flipped" else (r > 0.95)
        # the echo is at that lag and no other
        assert abs(np.corrcoef(x[:-lag - 3, j], x[lag + 3:, i])[0, 1]) < abs(np.corrcoef(src, tgt)[0, 1]) - 0.05
    # drivers: 40 % of the variance seasonal (phi = 0.9, period 90), so lag-90 correlation ~ 0.36
    for j in range(4):
        r90 = np.corrcoef(x[90:, j], x[:-90, j])[0, 1]
        assert 0.2 < r90 < 0.5


def test_last_cycle_reachable_only_across_channels():
    """The short-lookback design: at L = 58 a driver's last cycle, d_{t+h-P}, is not in its own window
    for any h <= 24 but is in its echo's window for every h <= 48 (echo lag 34-42); at L = 96 it is in
    both. Checked on a noise-free simulation: the echo's row in the short window equals the law of the
    driver's last-cycle value."""
    P, L_short, L_long = 90, 58, 96
    for lag in range(34, 43):
        for h in range(1, 49):
            own_back, echo_back = P - h, P - h - lag  # rows back from the last input row
            assert 0 <= echo_back <= L_short - 1
            assert own_back <= L_long - 1
            if h <= 24:
                assert own_back > L_short - 1
    rng = np.random.default_rng(7)
    system = D.draw_system(rng, 4, lags=(34, 42), noise=0.0)
    ep = D.simulate(system, rng, 8, 200)
    origin = 150
    X, Y = D.episode_windows(ep, origin, L_short, 48)
    for k, (law, src, lag) in enumerate(zip(system["types"], system["source"], system["lag"])):
        for h in (1, 24, 48):
            d_past = ep[:, origin + h - 1 - P, src]  # the driver's value one period before the target row
            echo = X[:, L_short - 1 - (P - h - lag), 4 + k]
            f = {"linear": 0.9 * d_past, "delayed": d_past, "sign_flipped": -d_past,
                 "nonlinear": d_past * np.abs(d_past) / np.sqrt(3)}[D.LAWS[law]]
            assert np.allclose(echo, f, atol=1e-5)


def test_seasonal_process_is_stationary_with_lag_period_memory():
    """s_t = phi s_{t-P} + sqrt(1 - phi^2) e_t: unit variance from the first row, autocorrelation
    phi at lag P, none half a period away (e is smooth over 5 steps only), and a fresh shape per episode."""
    rng = np.random.default_rng(1)
    P, phi = 90, 0.9
    s = D.seasonal_ar(rng, 400, 4 * P, 2, P, phi, smooth=5)
    assert abs(s[:, :P].var() - 1) < 0.03 and abs(s[:, 3 * P:].var() - 1) < 0.03
    x, y = s[:, P:], s[:, :-P]
    assert abs((x * y).mean() - phi) < 0.02
    assert abs((s[:, P // 2:] * s[:, :-(P // 2)]).mean()) < 0.02
    assert abs((s[:, 1:] * s[:, :-1]).mean() - 0.8) < 0.03  # MA(5): lag-1 correlation 4/5
    assert abs((s[:200, 0] * s[200:, 0]).mean()) < 0.1  # episodes independent


def test_ar2_oscillators_unit_variance_and_period():
    rng = np.random.default_rng(2)
    r, period = np.array([0.97]), 30.0
    a1, a2 = 2 * r * np.cos(2 * np.pi / period), -r ** 2
    x = D.ar2_oscillators(rng, a1, a2, 64, 2000)[:, :, 0]
    assert abs(x.var() - 1) < 0.05
    spec = np.abs(np.fft.rfft(x, axis=1)) ** 2
    f = np.fft.rfftfreq(2000)[np.argmax(spec.mean(0))]
    assert abs(1 / f - period) < 2


def test_only_the_long_lookback_sees_last_cycle():
    """The planted lookback effect: the seasonal forecast phi * s_{t+h-P} needs lag P - h, which a
    lookback of 96 holds for every h <= 48 and one of 58 for no h <= 24: its MSE is 1 - phi^2 against
    1 for the seasonal part that the short window cannot see."""
    rng = np.random.default_rng(3)
    P, phi, L_long, L_short = 90, 0.9, 96, 58
    s = D.seasonal_ar(rng, 2000, L_long + 48, 1, P, phi, smooth=5)[..., 0]
    origin = L_long
    for h in range(1, 25):
        lag = P - h  # rows back from the last input row (origin - 1) to t + h - P
        assert lag <= L_long - 1 and lag > L_short - 1
        pred = phi * s[:, origin + h - 1 - P]
        assert abs(((pred - s[:, origin + h - 1]) ** 2).mean() - (1 - phi ** 2)) < 0.03


def test_episode_windows_share_the_forecast_targets():
    ep = np.arange(2 * 20 * 3, dtype=np.float32).reshape(2, 20, 3)
    Xs, Ys = D.episode_windows(ep, 12, 7, 4)
    Xl, Yl = D.episode_windows(ep, 12, 12, 8)
    assert Xs.shape == (2, 7, 3) and Xl.shape == (2, 12, 3)
    assert np.array_equal(Xs, Xl[:, -7:]) and np.array_equal(Ys, Yl[:, :4])
    assert np.array_equal(Yl[:, 0], ep[:, 12])


def test_unit_mse_is_the_mean_over_units():
    from reprozoo.methods.prime_attention.method import Task

    rng = np.random.default_rng(4)
    train = rng.normal(size=(100, 3)).astype(np.float32)
    Xte, Yte = rng.normal(size=(5, 10, 3)), rng.normal(size=(5, 4, 3))
    pred = rng.normal(size=Yte.shape)
    for axis, n in (("window", 5), ("channel", 3)):
        t = Task(train, 10, 4, Xte, Yte, Xte, Yte, axis)
        u = t.unit_mse(pred)
        assert u.shape == (n,) and np.isclose(u.mean(), ((pred - Yte) ** 2).mean())


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


def _planted_task(n=600, L=12, H=4, seed=0):
    """Channel 1 is channel 0 delayed by 8 steps (plus a little noise); channel 0 is an AR(1)."""
    from reprozoo.methods.prime_attention.method import Task

    rng = np.random.default_rng(seed)
    a = np.zeros(n + 8)
    for t in range(1, n + 8):
        a[t] = 0.5 * a[t - 1] + rng.standard_normal()
    x = np.stack([a[8:], a[:-8] + 0.01 * rng.standard_normal(n)], axis=1).astype(np.float32)
    te = D.window_starts(n // 2, n, L, H)
    Xte, Yte = D.windows(x, te, L, H)
    return Task(x[: n // 2], L, H, Xte, Yte, Xte, Yte, "window")


def test_ridge_recovers_a_planted_cross_channel_echo():
    """All-channel ridge reads channel 1's future (channel 0 eight steps back) from channel 0's past
    almost exactly; the own-channel ridge cannot, and its channel-0 forecast equals a ridge fitted on
    channel 0 alone."""
    from reprozoo.methods.prime_attention.method import ridge

    task = _planted_task()
    rng = np.random.default_rng(0)
    full = ridge(task, [1e-4], 10_000, rng)
    own = ridge(task, [1e-4], 10_000, rng, own=True)
    err_full = ((full["pred"] - task.Yte) ** 2).mean(axis=(0, 1))
    err_own = ((own["pred"] - task.Yte) ** 2).mean(axis=(0, 1))
    assert err_full[1] < 0.01 and err_own[1] > 0.3
    X, Y = task.train_windows(task.tr)
    A = np.concatenate([X[:, :, 0], np.ones((len(X), 1))], axis=1).astype(np.float64)
    G = A.T @ A / len(A) + 1e-4 * np.diag([1.0] * (A.shape[1] - 1) + [0.0])
    W = np.linalg.solve(G, A.T @ Y[:, :, 0] / len(A))
    ref = np.concatenate([task.Xte[:, :, 0], np.ones((len(task.Xte), 1))], axis=1) @ W
    assert np.allclose(own["pred"][:, :, 0], ref, atol=1e-4)


def test_window_norm_follows_the_window_level():
    """With iTransformer's per-window normalisation a constant shift of the input shifts the forecast
    by the same constant (the window mean is restored); without it (stationary synthetic data) the
    forecast is a function of the raw values."""
    torch.manual_seed(5)
    x = torch.randn(3, 10, 4, dtype=torch.float64)
    m = build(4, 10, 3, 8, 2, 1, 2, prime=True).double()
    assert torch.allclose(m(x + 2.0), m(x) + 2.0, atol=1e-9)
    m0 = build(4, 10, 3, 8, 2, 1, 2, prime=True, norm=False).double()
    assert not torch.allclose(m0(x + 2.0), m0(x) + 2.0, atol=1e-3)


def test_fit_stops_on_the_gates_plateau_independent_of_the_cap():
    """The shared rule (blocks.fitting.fit_to_plateau) stops a fit where the gate's plateau test holds,
    with the rate recorded for the gate; the same fit under a doubled max_steps is the same fit, so
    only fits at the cap can change under `reprozoo converge --factor 2` (whose halved tolerance
    trains the others on)."""
    from reprozoo.claims import LR_FLOOR, tail_fit
    from reprozoo.methods.prime_attention.method import fit_and_score

    task = _planted_task(n=400)
    mp = {"dim": 8, "n_heads": 2, "n_layers": 1, "ff_mult": 2, "filter_rank": None}
    runs = []
    for cap in (600, 1200):
        fp = {"lr_grid": [3e-3, 1e-2], "pilot_steps": 20, "eval_every": 10, "min_steps": 40, "max_steps": cap,
              "flat_tol": 0.01, "batch": 16}
        runs.append(fit_and_score(task, "prime", mp, fp, 0, "t", progress=lambda *a: None, norm=False))
    r1, r2 = runs
    assert r1["plateau"] and r1["stop"] < 600
    assert r1["steps"] == r2["steps"] and r1["vals"] == r2["vals"]
    assert np.array_equal(r1["pred"], r2["pred"])
    assert tail_fit(r1["steps"], r1["vals"])["improvement"] <= 0.02
    tail = [lr for s, lr in zip(r1["steps"], r1["lrs"]) if s >= 0.7 * r1["steps"][-1]]
    assert min(tail) >= LR_FLOOR * max(r1["lrs"]) - 1e-12
    assert r1["units"].mean() < float((task.Yte ** 2).mean())  # better than the zero forecast


# ------------------------------------------------------------------ round 6 (cold review of 6d9c01f)

def _configs():
    from pathlib import Path

    import yaml

    folder = Path(__file__).parents[1] / "src/reprozoo/methods/prime_attention/configs"
    return {f.stem: yaml.safe_load(f.read_text()) for f in sorted(folder.glob("*.yaml"))}


def test_window_norm_names_every_dataset_and_is_off_on_every_synthetic_system():
    """Review item 1: the control without pairs fell through to a default of ``on`` while the system it
    controls ran with it off. A dataset the ``model.norm`` table does not name now raises, and every
    config runs every synthetic system (the claim's and its controls) with the normalisation off."""
    from reprozoo.methods.prime_attention.method import window_norm

    with pytest.raises(KeyError, match="nopair"):
        window_norm({"norm": {"syn": False, "macro": True}}, "nopair")
    assert window_norm({"norm": False}, "anything") is False
    for name, p in _configs().items():
        for ds in p["datasets"]:
            assert window_norm(p["model"], ds) is (ds == "macro"), (name, ds)


def test_every_dataset_records_both_ridges_in_a_cell_that_trains_it():
    """The linear references are recorded in ``configs.<ds>.ridge_in`` (default ``standard``): on the system
    without pairs (trained by prime and prime_sep only) that cell must be one of its variants, so both
    ridges exist there (review item 1)."""
    for name, p in _configs().items():
        for ds in p["datasets"]:
            cfg = p["configs"][ds]
            assert cfg.get("ridge_in", "standard") in (cfg.get("variants") or ["standard"]), (name, ds)


def test_separable_filters_start_as_standard_attention_and_have_no_pair_term():
    """``prime_sep``: F_ij = (1 + a_i)(1 + b_j), 4 N d parameters per layer, zero at init (the standard model's
    output with its weights); its output matches the pair-by-pair definition; and every separable table
    obeys F_11 * F_22 = F_12 * F_21 (elementwise), the identity that a per-pair table breaks."""
    torch.manual_seed(7)
    N, d, h = 4, 8, 2
    std = ChannelAttention(N, d, h, prime=False).double()
    sep = ChannelAttention(N, d, h, prime=True, separable=True).double()
    full = ChannelAttention(N, d, h, prime=True).double()
    assert n_params(sep) - n_params(std) == 4 * N * d
    assert n_params(full) - n_params(std) == 2 * N * N * d
    sep.load_state_dict(std.state_dict(), strict=False)
    e = torch.randn(3, N, d, dtype=torch.float64)
    assert torch.allclose(sep(e), std(e), atol=1e-13)
    with torch.no_grad():
        for n in ("ak", "bk", "av", "bv"):
            getattr(sep, n).normal_(0, 0.7)
    assert torch.allclose(sep(e), _pair_loop(sep, e), atol=1e-12)
    for f in sep.filters():
        assert torch.allclose(f[0, 0] * f[1, 1], f[0, 1] * f[1, 0], atol=1e-12)
        assert torch.allclose(f[1, 2] * f[3, 0], f[1, 0] * f[3, 2], atol=1e-12)
    m = build(N, 10, 3, d, h, 1, 2, prime=True, separable=True)
    assert {n for n, _ in m.named_parameters() if n.startswith("layers.0.attn.")} >= {
        "layers.0.attn.ak", "layers.0.attn.bk", "layers.0.attn.av", "layers.0.attn.bv"}
    assert not any(n.endswith((".pk", ".pv")) for n, _ in m.named_parameters())


def test_planted_sign_table_only_a_per_pair_filter_represents():
    """Review item 7, a pattern only a per-pair filter represents. Two targets read two drivers through
    the value filter with signs (+, +) and (+, -). (The review's pattern, (+, -) and (-, +), is the outer
    product (1, -1)^T (1, -1): separable, so it would not separate the two.) Fitting only the filters of
    a fixed attention layer to the messages of the planted table: the per-pair table reaches them, the
    separable one cannot get below a clear floor, because (1+a_1)(1+b_1)(1+a_2)(1+b_2) is the same product
    for the pairs (1,1)(2,2) as for (1,2)(2,1), while the plant's products have opposite signs."""
    torch.manual_seed(8)
    N, d, h = 2, 4, 1
    teacher = ChannelAttention(N, d, h, prime=True).double()
    sign = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    with torch.no_grad():
        teacher.pv.copy_(sign[:, :, None].expand(N, N, d) - 1)  # F^V_ij = sign_ij, F^K = 1
    e = torch.randn(256, N, d, dtype=torch.float64)
    with torch.no_grad():
        target = teacher(e)
    losses = {}
    for separable in (False, True):
        student = ChannelAttention(N, d, h, prime=True, separable=separable).double()
        student.load_state_dict({k: v for k, v in teacher.state_dict().items() if k[:2] in ("q.", "k.", "v.", "o.")},
                                strict=False)
        filt = [p for n, p in student.named_parameters() if n in ("pk", "pv", "ak", "bk", "av", "bv")]
        for p in student.parameters():
            p.requires_grad_(any(p is q for q in filt))
        opt = torch.optim.Adam(filt, lr=0.05)
        for _ in range(600):
            opt.zero_grad()
            loss = ((student(e) - target) ** 2).mean()
            loss.backward()
            opt.step()
        losses[separable] = loss.item()
    scale = float((target - teacher.o.bias.detach()).pow(2).mean())
    assert losses[False] < 1e-6 * scale
    assert losses[True] > 0.05 * scale  # 0.027 of 0.094 (29 %) when written


def test_rate_table_covers_every_trained_model_and_records_its_edge():
    """Review item 4: each model's rate is chosen once on validation (``pilot_rates.py``, pilot seed 100, a
    full fit to plateau per rate) and read from the config's ``lr`` table through ``blocks.rate_table``; the
    grid stays in the config. Every (dataset, variant) a config with a table trains has an entry inside its
    grid; a missing entry raises; the edge of a table rate is the grid's, not the one-rate grid's None."""
    from reprozoo.methods.prime_attention.method import VARIANTS, fit_config

    p = {"fit": {"lr_grid": [1e-3, 1e-2], "batch": 8, "per_dataset": {"macro": {"lr_grid": [1e-4, 1e-3, 1e-2]}}},
         "lr": {"syn": {"prime": 1e-2}, "macro": {"prime": 1e-3}}}
    fp, how = fit_config(p, "syn", "prime")
    assert fp["lr_grid"] == [1e-2] and how == {"lr_source": "table", "lr_edge": "top"} and fp["batch"] == 8
    fp, how = fit_config(p, "macro", "prime")
    assert fp["lr_grid"] == [1e-3] and how["lr_edge"] is None
    with pytest.raises(KeyError, match="standard"):
        fit_config(p, "syn", "standard")
    fp, how = fit_config({"fit": p["fit"]}, "syn", "standard")  # no table: the grid is piloted in every fit
    assert fp["lr_grid"] == [1e-3, 1e-2] and how["lr_source"] == "grid"
    for name, cfg in _configs().items():
        if "lr" not in cfg:
            continue
        for ds in cfg["datasets"]:
            grid = ((cfg["fit"].get("per_dataset") or {}).get(ds) or {}).get("lr_grid", cfg["fit"]["lr_grid"])
            assert len(grid) > 1, (name, ds)  # the grid stays, so the choice can be rerun and an edge is seen
            for v in cfg["configs"][ds].get("variants") or [v for v in VARIANTS if v != "standard_wide"]:
                assert cfg["lr"][ds][v] in grid, (name, ds, v)
