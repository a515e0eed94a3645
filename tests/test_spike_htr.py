"""Numerics of Spike-HTR's pieces: CER, CTC greedy decoding, the length reducer, InkCoder, costs."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.methods.spike_htr import ctc as C  # noqa: E402
from reprozoo.methods.spike_htr import data as D  # noqa: E402
from reprozoo.methods.spike_htr.model import (InkCoder, Recognizer, blur, ctc_guided_reduce,  # noqa: E402
                                               gaussian_kernel, inkcoder)


def test_edit_distance_known_strings():
    assert C.edit_distance("kitten", "sitting") == 3
    assert C.edit_distance("", "abc") == 3
    assert C.edit_distance("flaw", "lawn") == 2
    assert C.edit_distance("12345", "12345") == 0
    # corpus CER: (1 substitution + 2 deletions) / (4 + 3) reference characters
    assert C.cer([[1, 2, 3, 5], [7]], [[1, 2, 3, 4], [7, 8, 9]]) == pytest.approx(3 / 7)


def test_greedy_decoding_collapses_repeats_and_blanks():
    assert C.greedy_collapse([1, 1, 0, 1, 2, 2, 0, 0, 3]) == [1, 1, 2, 3]
    assert C.greedy_collapse([0, 0, 0]) == []
    assert C.greedy_collapse([4, 4, 4, 4]) == [4]          # no blank between: one character
    # through log-probs and lengths: the padded tail beyond the length is ignored
    path = torch.tensor([[2, 0, 2, 2, 5, 5]])
    logp = torch.nn.functional.one_hot(path, 6).float().log_softmax(-1)
    assert C.greedy_decode(logp, torch.tensor([4])) == [[2, 2]]


def _random_case(seed, B=6, L=30, K=5, d=4):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, L, K + 1, generator=g) * 3
    logits[:, :, 0] += 2.5 * (torch.rand(B, L, generator=g) > 0.4)   # long blank-dominated stretches
    return torch.randn(B, L, d, generator=g), logits.log_softmax(-1)


@pytest.mark.parametrize("tau", [0.5, 0.9, 0.99])
def test_reducer_keeps_every_nonblank_argmax_position(tau):
    feat, logp = _random_case(int(tau * 100))
    pooled, n, keep, seg = ctc_guided_reduce(feat, logp, tau)
    nonblank = logp.argmax(-1) != 0
    for b in range(feat.shape[0]):
        counts = torch.bincount(seg[b], minlength=int(n[b]))
        for w in torch.nonzero(nonblank[b]).flatten().tolist():
            assert keep[b, w]
            assert counts[seg[b, w]] == 1                                # its own position, unmerged
            assert torch.allclose(pooled[b, seg[b, w]], feat[b, w])
        # every confident-blank run became ONE position holding its mean
        runs = sum(1 for w in range(feat.shape[1]) if not keep[b, w] and (w == 0 or keep[b, w - 1]))
        assert int(n[b]) == int(keep[b].sum()) + runs
        for s in range(int(n[b])):
            members = seg[b] == s
            assert torch.allclose(pooled[b, s], feat[b, members].mean(0), atol=1e-6)
        # order is preserved: segment ids are non-decreasing along the width
        assert (seg[b, 1:] >= seg[b, :-1]).all()


def test_reducer_all_blank_line_is_one_position_and_keeps_double_letters():
    L, K = 10, 3
    logp = torch.full((1, L, K + 1), -20.0)
    logp[..., 0] = 0.0
    _, n, _, _ = ctc_guided_reduce(torch.randn(1, L, 2), logp, 0.9)
    assert int(n[0]) == 1
    # "1 1" separated by a blank run: the blank must survive so that CTC can still emit "11"
    path = torch.tensor([[0, 0, 1, 0, 0, 0, 1, 0, 0, 0]])
    logp = torch.nn.functional.one_hot(path, K + 1).float().mul(30).log_softmax(-1)
    pooled, n, keep, seg = ctc_guided_reduce(torch.randn(1, L, 2), logp, 0.9)
    reduced_path = [int(path[0][seg[0] == s][0]) for s in range(int(n[0]))]
    assert reduced_path == [0, 1, 0, 1, 0]
    assert C.greedy_collapse(reduced_path) == [1, 1]


def test_drop_reducer_loses_double_letters_merge_keeps_them():
    """The control of reducer_cer_margin: removing the confident-blank runs (instead of merging
    each into one position) lets two equal characters touch, and CTC then reads one."""
    K = 3
    path = torch.tensor([[0, 0, 1, 0, 0, 0, 1, 0, 2, 0]])
    logp = torch.nn.functional.one_hot(path, K + 1).float().mul(30).log_softmax(-1)
    feat = torch.randn(1, path.shape[1], 2)
    _, n, keep, seg = ctc_guided_reduce(feat, logp, 0.9, mode="drop")
    assert int(n[0]) == 3 and (seg[0][~keep[0]] == -1).all()
    dropped_path = [int(path[0][seg[0] == s][0]) for s in range(int(n[0]))]
    assert C.greedy_collapse(dropped_path) == [1, 2]                # "1 1 2" read as "1 2"
    pooled, n, keep, seg = ctc_guided_reduce(feat, logp, 0.9, mode="merge")
    merged_path = [int(path[0][seg[0] == s][0]) for s in range(int(n[0]))]
    assert C.greedy_collapse(merged_path) == [1, 1, 2]
    # kept positions pass through unchanged in both modes
    pooled_d, *_ = ctc_guided_reduce(feat, logp, 0.9, mode="drop")
    assert torch.allclose(pooled_d[0], feat[0, keep[0]])
    # an all-blank line keeps one position when dropping (the mixer needs a non-empty sequence)
    blank = torch.full((1, 6, K + 1), -30.0)
    blank[..., 0] = 0.0
    _, n, _, _ = ctc_guided_reduce(torch.randn(1, 6, 2), blank, 0.9, mode="drop")
    assert int(n[0]) == 1


def _response(coder, n=64):
    """Frequency response r_t(ω) = d_t + (1 - d_t) Ĝ_{σ_t}(ω) of each step (1-d, on n frequencies)."""
    out = []
    for s, d in zip(coder.sigmas().tolist(), coder.details().tolist()):
        k = torch.zeros(n)
        g = gaussian_kernel(s, coder.radius)
        k[:len(g)] = g
        k = torch.roll(k, -coder.radius)                           # centred: a real, even kernel
        out.append(d + (1 - d) * torch.fft.rfft(k).real)
    return torch.stack(out)


def test_learned_inkcoder_is_coarse_to_fine_by_construction():
    torch.manual_seed(0)
    x = torch.rand(3, 1, 8, 20)
    coder = InkCoder(T=3, sigma_max=1.2, learned=True, sigma_last=0.3)
    with torch.no_grad():
        s, d = coder.sigmas(), coder.details()
        out = coder(x)
    assert torch.allclose(s, torch.tensor([1.2, 0.75, 0.3]), atol=1e-5)      # init: the blur pyramid
    assert torch.allclose(d, torch.full((3,), 0.02), atol=1e-3)
    for t in range(3):
        assert torch.allclose(out[t], blur(x, float(s[t]), coder.radius) * 0.98 + 0.02 * x, atol=2e-3)
    # whatever the parameters: σ_1 >= σ_2 >= σ_3 > 0, 0 <= d_1 <= d_2 <= d_3 <= 1, and every later
    # step passes at least as much of every spatial frequency as the step before
    for _ in range(30):
        with torch.no_grad():
            coder.u.copy_(torch.randn(3) * 3)
            coder.v.copy_(torch.randn(()) * 3)
            coder.w.copy_(torch.randn(3) * 3)
            s, d, r = coder.sigmas(), coder.details(), _response(coder)
        assert (s[:-1] >= s[1:]).all() and (s > 0).all() and (s <= coder.sigma_cap + 1e-6).all()
        assert (d[:-1] <= d[1:]).all() and (d >= 0).all() and (d <= 1).all()
        assert (r[1:] >= r[:-1] - 1e-6).all()
        assert torch.allclose(r[:, 0], torch.ones(3), atol=1e-5)           # ink (DC) is passed unchanged
    # a sinusoidal stroke pattern: the sharp step keeps more of its contrast than the coarse one
    w = torch.arange(40, dtype=torch.float32)
    stripes = (0.5 + 0.5 * torch.cos(2 * torch.pi * w / 4)).expand(1, 1, 8, 40)
    fresh = InkCoder(T=2, sigma_max=1.0, learned=True, sigma_last=0.3)
    with torch.no_grad():
        st = fresh(stripes)[:, 0, 0, 4, 8:-8]
    assert float(st[0].std()) < 0.5 * float(st[1].std())
    # the fixed coder is the old pyramid (last step sharp)
    fixed = InkCoder(T=2, sigma_max=1.0, learned=False)
    assert torch.allclose(fixed(x), inkcoder(x, 2, 1.0))
    assert list(fixed.parameters()) == []


def test_learned_inkcoder_gradient_matches_finite_differences():
    """dL/d(u, v, w) (blur widths and detail shares): autograd against central differences."""
    torch.manual_seed(1)
    x = torch.rand(2, 1, 8, 16)
    wts = torch.randn(2, 2, 1, 8, 16)
    coder = InkCoder(T=2, sigma_max=1.0, learned=True, sigma_last=0.5)
    with torch.no_grad():
        coder.v.fill_(-1.0)
    (coder(x) * wts).sum().backward()
    for name in ("u", "v", "w"):
        par = getattr(coder, name)
        for i in range(par.numel()):
            eps = 1e-2
            with torch.no_grad():
                par.view(-1)[i] += eps
                up = float((coder(x) * wts).sum())
                par.view(-1)[i] -= 2 * eps
                dn = float((coder(x) * wts).sum())
                par.view(-1)[i] += eps
            fd = (up - dn) / (2 * eps)
            assert abs(float(par.grad.view(-1)[i]) - fd) <= 0.02 * abs(fd) + 2e-3, (name, i)


def test_inkcoder_coarse_to_fine():
    x = torch.from_numpy(D.render_lines(4, np.random.default_rng(0), *D.glyph_bank(), 56, (3, 4), (0, 3), 4, 0.0)[0])
    x = x.unsqueeze(1)
    stream = inkcoder(x, T=2, sigma_max=1.0)
    assert stream.shape == (2, 4, 1, 8, 56)
    assert torch.allclose(stream[-1], x)                       # last step = the sharp image
    assert gaussian_kernel(1.0, 3).sum() == pytest.approx(1.0)
    # first step: blurred (less high-frequency energy: smaller horizontal gradients), same mean ink
    grad = lambda y: (y[..., 1:] - y[..., :-1]).pow(2).sum()
    assert grad(stream[0]) < 0.6 * grad(stream[1])
    inner = (slice(None), slice(None), slice(None), slice(4, -4))
    assert stream[0][inner].mean() == pytest.approx(float(stream[1][inner].mean()), rel=0.1)


def test_costs_count_spikes_and_mixer_length():
    torch.manual_seed(0)
    x = torch.rand(3, 1, 8, 24)
    snn = Recognizer(8, 10, (4, 6, 8), 12, 10, spiking=True, reducer=False, threshold=0.5).eval()
    out = snn(x)
    c = snn.costs(x, out)
    s1, s2, s3 = out["acts"]
    expect = (float(s1.detach().sum()) * 6 * 9 + float(s2.detach().sum()) * 8 * 9 + float(s3.detach().sum()) * 12) / 3
    assert c["ac"] == pytest.approx(expect)
    assert c["mixer_mac"] == pytest.approx(out["L"] * (2 * 4 * 10 * (12 + 10) + 2 * 10 * 11))
    # the analog input side: InkCoder's filters and the first conv are MACs
    c1 = snn.convs[0].out_channels
    assert c["mac"] >= snn.coder.macs(8, 24) + 2 * 8 * 24 * c1 * 9
    # membrane readout: the projection runs once on the time-mean (MACs), the mean costs T adds
    mem = Recognizer(8, 10, (4, 6, 8), 12, 10, spiking=True, readout="membrane", threshold=0.5).eval()
    om = mem(x)
    cm = mem.costs(x, om)
    s1, s2, v3 = om["acts"]
    ac = (float(s1.detach().sum()) * 6 * 9 + float(s2.detach().sum()) * 8 * 9) / 3 + v3[:, 0].numel()
    assert cm["ac"] == pytest.approx(ac)
    assert cm["mac"] - cm["mixer_mac"] == pytest.approx(mem.coder.macs(8, 24) + 2 * 8 * 24 * 4 * 9 + v3[0, 0].numel() * 12)
    # a silent network (huge threshold) performs no synaptic operation
    silent = Recognizer(8, 10, (4, 6, 8), 12, 10, spiking=True, threshold=1e6).eval()
    assert silent.costs(x, silent(x))["ac"] == 0.0
    # the reducer's mixer cost is proportional to the positions it keeps
    red = Recognizer(8, 10, (4, 6, 8), 12, 10, spiking=True, reducer=True, threshold=0.5).eval()
    o = red(x, tau=0.0)                                        # keep only argmax-nonblank positions
    assert red.costs(x, o)["mixer_mac"] == pytest.approx(float(o["lengths"].float().mean())
                                                         * (2 * 4 * 10 * 22 + 2 * 10 * 11))


def test_ctc_trains_on_planted_two_glyph_task():
    """Recovery of a planted signal: lines of one or two digits among {0, 1}; a few dozen steps of
    the ANN CRNN with torch's CTCLoss must beat the best constant guess."""
    rng = np.random.default_rng(0)
    glyphs, labels = D.glyph_bank()
    sel = labels < 2
    X, texts = D.render_lines(128, rng, glyphs[sel], labels[sel], 24, (1, 2), (1, 3), 2, 0.05)
    X = torch.from_numpy(X).unsqueeze(1)
    torch.manual_seed(0)
    m = Recognizer(8, 2, (4, 8, 8), 16, 16, spiking=False)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    ctc = torch.nn.CTCLoss(zero_infinity=True)
    y = torch.tensor([c + 1 for t in texts for c in t])
    ylen = torch.tensor([len(t) for t in texts])
    for _ in range(200):
        out = m(X)
        loss = ctc(out["logp"].transpose(0, 1), y, out["lengths"], ylen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        out = m(X)
    preds = [[c - 1 for c in p] for p in C.greedy_decode(out["logp"], out["lengths"])]
    assert C.cer(preds, texts) < 0.25


def test_fit_stops_only_at_a_plateau_the_gate_accepts():
    """The stopping rule is the convergence gate's own test, and the rate stays at its peak."""
    from reprozoo.claims import plateau
    from reprozoo.methods.spike_htr import method as M

    p = {"alphabet": "0123456789",
         "data": {"upsample": 1, "height": 8, "width": 40, "n_train": 96, "n_val": 24, "n_test": 8,
                  "n_chars": [1, 3], "gap": [1, 3], "margin": 2, "noise": 0.05},
         "model": {"T": 2, "channels": [4, 8, 8], "d_model": 16, "hidden": 16, "sigma_max": 1.0, "beta": 0.5,
                   "threshold": 0.5, "tau": 0.9, "readout": "membrane"},
         "optim": {"batch": 16, "lr": 1e-2, "warmup": 5, "ema": 0.9, "aux_weight": 0.3, "eval_every": 5, "min_steps": 30,
                   "max_steps": 150, "min_tail_points": 6}}
    raw = M._splits(p, 0)
    splits = {}
    for s in ("train", "val"):
        X, texts = raw[s]
        splits[s] = (torch.from_numpy(X).unsqueeze(1), [[c + 1 for c in t] for t in texts])
    torch.manual_seed(0)
    rec = M.fit(M.build(p, "ann_crnn", 8), splits, p, 0, 1e-2)
    steps, val = rec["steps"], rec["val_ctc"]
    assert steps[-1] >= 30 and all(lr == pytest.approx(1e-2) for lr in rec["lr"])
    if steps[-1] < 150:
        assert plateau(steps, val, min_points=6) and plateau(steps[:-1], val[:-1], min_points=6)
    assert np.isfinite(val).all() and min(val) < val[0]


def test_mixer_equals_a_packed_bidirectional_lstm():
    """``Recognizer.mix`` (two directions over padded lines, the backward one reversed inside each
    line's length) gives the packed BiLSTM's outputs on every valid position."""
    torch.manual_seed(0)
    m = Recognizer(8, 10, (4, 6, 8), 12, 10, spiking=False)
    ref = torch.nn.LSTM(12, 10, batch_first=True, bidirectional=True)
    with torch.no_grad():
        for k in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(ref, k).copy_(getattr(m.mixer_f, k))
            getattr(ref, k + "_reverse").copy_(getattr(m.mixer_b, k))
    seq, lengths = torch.randn(4, 9, 12), torch.tensor([9, 3, 6, 1])
    out = m.mix(seq, lengths)
    packed = torch.nn.utils.rnn.pack_padded_sequence(seq, lengths, batch_first=True, enforce_sorted=False)
    expect, _ = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], batch_first=True, total_length=9)
    valid = torch.arange(9)[None] < lengths[:, None]
    assert torch.allclose(out[valid], expect[valid], atol=1e-6)
    # what follows a line's end never changes its outputs
    seq2 = seq.clone()
    seq2[1, 3:] = torch.randn(6, 12)
    assert torch.allclose(m.mix(seq2, lengths)[1, :3], out[1, :3], atol=1e-6)
