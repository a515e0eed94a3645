"""Numerics of Spike-HTR's pieces: CER, CTC greedy decoding, the length reducer, InkCoder, costs."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.methods.spike_htr import ctc as C  # noqa: E402
from reprozoo.methods.spike_htr import data as D  # noqa: E402
from reprozoo.methods.spike_htr.model import Recognizer, ctc_guided_reduce, gaussian_kernel, inkcoder  # noqa: E402


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
