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
def test_runs_rule_keeps_every_nonblank_argmax_position_and_one_per_run(tau):
    """The former rule (ablation ``mode="runs"``): kept positions pass unmerged, every
    confident-blank run becomes ONE position holding its mean."""
    feat, logp = _random_case(int(tau * 100))
    pooled, n, keep, seg = ctc_guided_reduce(feat, logp, tau, mode="runs")
    nonblank = logp.argmax(-1) != 0
    for b in range(feat.shape[0]):
        counts = torch.bincount(seg[b], minlength=int(n[b]))
        for w in torch.nonzero(nonblank[b]).flatten().tolist():
            assert keep[b, w]
            assert counts[seg[b, w]] == 1                                # its own position, unmerged
            assert torch.allclose(pooled[b, seg[b, w]], feat[b, w])
        runs = sum(1 for w in range(feat.shape[1]) if not keep[b, w] and (w == 0 or keep[b, w - 1]))
        assert int(n[b]) == int(keep[b].sum()) + runs
        for s in range(int(n[b])):
            members = seg[b] == s
            assert torch.allclose(pooled[b, s], feat[b, members].mean(0), atol=1e-6)
        assert (seg[b, 1:] >= seg[b, :-1]).all()


@pytest.mark.parametrize("tau", [0.5, 0.9, 0.99])
def test_ctc_aware_reducer_segments(tau):
    """The method's rule on random heads: every kept position anchors its own segment; a
    confident-blank run is its own segment only between two kept positions with the same
    character argmax (else it joins the nearer kept neighbour); segments are contiguous, ordered,
    and pooled as means; the reducer never keeps more than the former rule."""
    feat, logp = _random_case(int(tau * 100) + 1)
    pooled, n, keep, seg = ctc_guided_reduce(feat, logp, tau)
    _, n_runs, _, _ = ctc_guided_reduce(feat, logp, tau, mode="runs")
    lab = logp.argmax(-1)
    L = feat.shape[1]
    for b in range(feat.shape[0]):
        assert (seg[b, 1:] - seg[b, :-1]).le(1).all() and (seg[b, 1:] >= seg[b, :-1]).all()
        assert int(seg[b, 0]) == 0 and int(seg[b, -1]) == int(n[b]) - 1
        kept = torch.nonzero(keep[b]).flatten().tolist()
        assert len(set(seg[b, kept].tolist())) == len(kept)            # one kept position per segment
        own = 0
        for w in range(L):
            if keep[b, w]:
                continue
            left = max([k for k in kept if k < w], default=None)
            right = min([k for k in kept if k > w], default=None)
            if left is not None and right is not None and lab[b, left] != 0 and lab[b, left] == lab[b, right]:
                assert not (seg[b] == seg[b, w])[kept].any()            # a blank segment of its own
                own += int(bool(keep[b, w - 1]))                          # first of its run
            elif left is None and right is None:
                own += int(w == 0)
            else:
                near = right if left is None else left if right is None else (left if w - left <= right - w else right)
                assert seg[b, w] == seg[b, near]
        assert int(n[b]) == len(kept) + own
        assert int(n[b]) <= int(n_runs[b])
        for s in range(int(n[b])):
            assert torch.allclose(pooled[b, s], feat[b, seg[b] == s].mean(0), atol=1e-6)


def _one_hot_case(path, K):
    """A confident aux head on a hand-made best path, and features that are the one-hot of the
    path's characters (zero at blanks): the argmax of a pooled segment is the character it holds
    (blank for a segment of blanks only)."""
    p = torch.tensor([path])
    logp = torch.nn.functional.one_hot(p, K + 1).float().mul(30).log_softmax(-1)
    feat = torch.nn.functional.one_hot(p, K + 1).float() * (p != 0).unsqueeze(-1)
    return feat, logp


def test_ctc_aware_reducer_hand_made_path_length_and_decoding():
    """A hand-made CTC path with a known reduced length: "1 _ _ _ 1 _ 2 2 _ _ 3 _ 3 _ _" decodes
    to 1 1 2 3 3 (n = 5, 2 repeats); the CTC-aware reducer keeps the 6 character positions and the
    2 blank runs between equal characters (8 = n + repeats + 1: "2 2" spans two positions), merges
    the leading, trailing and unequal-neighbour runs, and the reduced path decodes to the same
    string as the full path. The former rule keeps one position per run: 6 + 6 = 12."""
    K = 4
    path = [0, 1, 0, 0, 0, 1, 0, 2, 2, 0, 0, 3, 0, 3, 0, 0]
    feat, logp = _one_hot_case(path, K)
    pooled, n, keep, seg = ctc_guided_reduce(feat, logp, 0.9)
    assert int(n[0]) == 8
    reduced = pooled[0, :int(n[0])].argmax(-1).tolist()
    assert reduced == [1, 0, 1, 2, 2, 3, 0, 3]
    assert C.greedy_collapse(reduced) == C.greedy_collapse(path) == [1, 1, 2, 3, 3]
    _, n_runs, _, _ = ctc_guided_reduce(feat, logp, 0.9, mode="runs")
    assert int(n_runs[0]) == 12
    # an all-blank line is one position; a line without equal neighbours keeps its characters only
    _, n, _, _ = ctc_guided_reduce(*_one_hot_case([0] * 7, K), 0.9)
    assert int(n[0]) == 1
    feat, logp = _one_hot_case([0, 0, 1, 0, 0, 2, 0, 3, 0, 4, 0, 0], K)
    pooled, n, _, _ = ctc_guided_reduce(feat, logp, 0.9)
    assert pooled[0, :int(n[0])].argmax(-1).tolist() == [1, 2, 3, 4]


def test_ctc_aware_reducer_preserves_decoding_on_random_paths():
    """On random confident best paths the reduced path decodes like the full path, its length is
    at least what CTC needs (n + repeats) and at most the former rule's."""
    from reprozoo.methods.spike_htr.method import ctc_need

    g = torch.Generator().manual_seed(3)
    K = 3                                                     # few classes: many equal neighbours
    for _ in range(200):
        L = int(torch.randint(3, 25, (1,), generator=g))
        path = torch.randint(1, K + 1, (L,), generator=g) * (torch.rand(L, generator=g) < 0.4)
        path = path.tolist()
        feat, logp = _one_hot_case(path, K)
        pooled, n, _, _ = ctc_guided_reduce(feat, logp, 0.9)
        reduced = pooled[0, :int(n[0])].argmax(-1).tolist()
        text = C.greedy_collapse(path)
        assert C.greedy_collapse(reduced) == text
        assert int(n[0]) >= max(1, ctc_need([text])[0])
        assert int(n[0]) <= int(ctc_guided_reduce(feat, logp, 0.9, mode="runs")[1][0])


def test_uniform_pool_control_has_the_given_length_and_ignores_the_head():
    from reprozoo.methods.spike_htr.model import uniform_pool

    feat = torch.arange(12.0).view(1, 12, 1).repeat(2, 1, 1)
    pooled, n, seg = uniform_pool(feat, torch.tensor([4, 12]))
    assert n.tolist() == [4, 12]
    assert seg[0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert pooled[0, :4, 0].tolist() == [1.0, 4.0, 7.0, 10.0]
    assert torch.equal(pooled[1, :, 0], feat[1, :, 0])
    # through the network: the uniform control has the reducer's lengths, not its segments
    m = Recognizer(8, 10, (4, 4, 4), 8, heads=2, mlp=8, blocks=1, reducer=True, T=2, threshold=0.5)
    x = torch.rand(3, 1, 8, 32)
    with torch.no_grad():
        a, u = m(x), m(x, reduce="uniform")
    assert torch.equal(a["lengths"], u["lengths"])


def test_drop_reducer_loses_double_letters_merge_keeps_them():
    """The former control of reducer_cer_margin: removing the confident-blank runs lets two equal
    characters touch, and CTC then reads one; the CTC-aware merge keeps their blank."""
    K = 3
    path = [0, 0, 1, 0, 0, 0, 1, 0, 2, 0]
    feat, logp = _one_hot_case(path, K)
    pooled, n, keep, seg = ctc_guided_reduce(feat, logp, 0.9, mode="drop")
    assert int(n[0]) == 3 and (seg[0][~keep[0]] == -1).all()
    assert C.greedy_collapse(pooled[0, :3].argmax(-1).tolist()) == [1, 2]    # "1 1 2" read as "1 2"
    assert torch.allclose(pooled[0, :3], feat[0, keep[0]])                   # kept positions unchanged
    pooled, n, keep, seg = ctc_guided_reduce(feat, logp, 0.9, mode="merge")
    assert C.greedy_collapse(pooled[0, :int(n[0])].argmax(-1).tolist()) == [1, 1, 2]
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


def test_blur_as_matrices_equals_the_padded_separable_convolution():
    """The blur (since round 11: two matrix products with the replicate padding folded into the
    border rows) gives the same values and sigma-gradient as the padded 1 x k / k x 1 convolution."""
    def padded_conv(x, sigma, radius):
        k = gaussian_kernel(sigma, radius)
        y = torch.nn.functional.pad(x, (radius, radius, radius, radius), mode="replicate")
        y = torch.nn.functional.conv2d(y, k.view(1, 1, 1, -1))
        return torch.nn.functional.conv2d(y, k.view(1, 1, -1, 1))

    torch.manual_seed(0)
    x = torch.rand(5, 1, 8, 30)
    for sigma in (0.0, 0.15, 0.7, 2.0):
        for radius in (1, 3, 6, 12):                    # 12: the kernel is wider than the image
            assert torch.allclose(blur(x, sigma, radius), padded_conv(x, sigma, radius), atol=1e-6)
    grads = []
    for fn in (blur, padded_conv):
        s = torch.tensor(0.7, requires_grad=True)
        fn(x, s, 6).pow(2).sum().backward()
        grads.append(float(s.grad))
    assert grads[0] == pytest.approx(grads[1], rel=1e-4)


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
    snn = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, spiking=True, reducer=False, threshold=0.5,
                     readout="spikes").eval()
    c = snn.costs(x)
    out = c["out"]
    s1, s2, s3 = out["acts"]
    enc = (float(s1.sum()) * 6 * 9 + float(s2.sum()) * 8 * 9 + float(s3.sum()) * 12) / 3
    assert c["ac"] - c["mixer_ac"] == pytest.approx(enc)
    assert c["mixer_mac"] == 0.0 and c["mixer_ac"] > 0              # the spiking mixer only adds
    # the analog input side: InkCoder's filters, the first conv and the CTC head are MACs
    L = out["L"]
    assert c["mac"] == pytest.approx(snn.coder.macs(8, 24) + 2 * 8 * 24 * 4 * 9 + L * 12 * 11)
    # membrane readout: the projection runs at every step on real membranes (MACs)
    mem = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, spiking=True, readout="membrane", threshold=0.5).eval()
    cm = mem.costs(x)
    s1, s2, v3 = cm["out"]["acts"]
    assert cm["ac"] - cm["mixer_ac"] == pytest.approx((float(s1.sum()) * 6 * 9 + float(s2.sum()) * 8 * 9) / 3)
    assert cm["mac"] == pytest.approx(mem.coder.macs(8, 24) + 2 * 8 * 24 * 4 * 9 + 2 * v3[0, 0].numel() * 12
                                      + L * 12 * 11)
    # a silent network (huge threshold) performs no synaptic operation
    silent = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, spiking=True, threshold=1e6, readout="spikes").eval()
    assert silent.costs(x)["ac"] == 0.0
    # the ANN mixer: per position 4 d^2 + 2 d m MACs per block, attention 2 L^2 d per block
    ann = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, blocks=2, spiking=False).eval()
    ca = ann.costs(x)
    assert ca["mixer_mac"] == pytest.approx(2 * (L * (4 * 144 + 2 * 12 * 16) + 2 * L * L * 12))
    # the reducer: the mixer's cost falls with the positions it keeps
    red = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, spiking=False, reducer=True).eval()
    full, few = red.costs(x, reduce="off"), red.costs(x, tau=0.0)
    n = few["out"]["lengths"].float()
    assert few["mixer_mac"] == pytest.approx(2 * (float(n.mean()) * (4 * 144 + 2 * 12 * 16)
                                                  + 2 * float((n ** 2).mean()) * 12))
    assert few["mixer_mac"] <= full["mixer_mac"]


def test_spiking_attention_ops_are_counted_spike_by_spike_and_quadratic():
    """Q K^T with binary Q, K costs one addition per coinciding spike pair, (Q K^T) V one per value
    spike and query position: brute force on a random block agrees, and a line twice as long with
    the same spikes repeated costs four times as many attention additions."""
    from reprozoo.methods.spike_htr.model import SpikingBlock, spiking_block_acs
    from reprozoo.blocks.spiking import arctan

    torch.manual_seed(0)
    blk = SpikingBlock(8, 2, 16, 0.5, 0.3, arctan(2.0)).eval()
    x = torch.randn(2, 3, 5, 8) * 2
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    ops = []
    with torch.no_grad():
        blk(x, valid, ops)
    r = ops[0]
    r["n"] = valid.sum(1)
    q, k, v = r["q"], r["k"], r["v"]
    brute = 0.0
    for t in range(2):
        for b in range(3):
            n = int(valid[b].sum())
            brute += sum(float((q[t, b, i] * k[t, b, j]).sum()) for i in range(n) for j in range(n))
            brute += n * float(v[t, b].sum())
    linear = (float(r["s"].sum()) * 24 + float(r["y"].sum()) * 8 + float(r["s2"].sum()) * 16 + float(r["z"].sum()) * 8)
    assert spiking_block_acs(r, 8, 16) == pytest.approx(linear + brute)
    # padded positions never spike into the count
    assert float(q[:, 1, 3:].sum() + k[:, 1, 3:].sum() + v[:, 1, 3:].sum()) == 0.0
    # quadratic: the same spikes at twice the length -> 4x the attention additions
    att = lambda q, k, v, n: float((q.sum(2) * k.sum(2)).sum()) + float((v.sum(2) * n).sum())
    one = att(q[:, :1], k[:, :1], v[:, :1], 5)
    two = att(q[:, :1].repeat(1, 1, 2, 1), k[:, :1].repeat(1, 1, 2, 1), v[:, :1].repeat(1, 1, 2, 1), 10)
    assert two == pytest.approx(4 * one)


@pytest.mark.parametrize("spiking", [True, False])
def test_mixer_ignores_what_follows_a_line_and_order_matters(spiking):
    """Padded positions (beyond a line's reduced length) never change the outputs at its valid
    positions; the mixer is not a bag of positions (permuting a line's features changes them,
    through the sinusoidal positions added before the reducer in forward)."""
    from reprozoo.methods.spike_htr.model import positional_encoding

    torch.manual_seed(0)
    m = Recognizer(8, 10, (4, 6, 8), 16, heads=2, mlp=16, spiking=spiking, threshold=0.3).eval()
    T = m.T if spiking else 1
    seq = torch.randn(T, 3, 7, 16) * 2
    valid = torch.arange(7)[None] < torch.tensor([7, 3, 5])[:, None]
    with torch.no_grad():
        out = m.mix(seq, valid)
        seq2 = seq.clone()
        seq2[:, 1, 3:] = torch.randn(T, 4, 16) * 5
        assert torch.allclose(m.mix(seq2, valid)[1, :3], out[1, :3], atol=1e-5)
    pe = positional_encoding(7, 16)
    assert torch.allclose(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, torch.ones(7, 8), atol=1e-6)
    assert not torch.allclose(pe[1], pe[2])


def test_confident_reducer_keeps_at_most_2n_plus_1_and_ink_control():
    """By construction: a confident aux head that marks each character at one position keeps at
    most 2n + 1 positions (n characters + n + 1 merged blank runs), so on sparse lines (n <= 4 of
    L = 20) the kept fraction can never exceed 0.45; that is why the claim reads dense lines. The
    ink-column control keeps every inked position plus one per ink-free run."""
    from reprozoo.methods.spike_htr.model import ink_reduce_lengths

    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        L, n = 20, int(torch.randint(1, 5, (1,), generator=g))
        pos = torch.randperm(L, generator=g)[:n].sort().values
        path = torch.zeros(1, L, dtype=torch.long)
        path[0, pos] = torch.randint(1, 11, (n,), generator=g)
        logp = torch.nn.functional.one_hot(path, 11).float().mul(30).log_softmax(-1)
        _, kept, _, _ = ctc_guided_reduce(torch.randn(1, L, 2), logp, 0.9)
        assert int(kept[0]) <= 2 * n + 1 and int(kept[0]) / L <= 0.45
    x = torch.zeros(2, 1, 4, 12)
    x[0, 0, 1, [0, 1, 6, 7]] = 1.0                  # stride 2: positions 0 and 3 inked of 6
    x[1, 0, 2, :] = 1.0                             # every position inked
    assert ink_reduce_lengths(x, 2).tolist() == [4, 6]   # 0 | 1-2 merged | 3 | 4-5 merged


def test_ctc_feasibility_counts_repeats():
    from reprozoo.methods.spike_htr.method import ctc_feasible

    assert ctc_feasible([3, 2, 4, 1], [[1, 2, 3], [1, 1], [1, 1], []]) == [True, False, True, True]


def _two_glyph_lines():
    """The planted task of the learning tests: 128 lines of one or two digits among {0, 1} on 24 px,
    as images (N, 1, H, W), label lists, and CTC targets (labels + 1, the blank is 0) with lengths."""
    rng = np.random.default_rng(0)
    glyphs, labels = D.glyph_bank()
    sel = labels < 2
    X, texts = D.render_lines(128, rng, glyphs[sel], labels[sel], 24, (1, 2), (1, 3), 2, 0.05)
    y = torch.tensor([c + 1 for t in texts for c in t])
    ylen = torch.tensor([len(t) for t in texts])
    return torch.from_numpy(X).unsqueeze(1), texts, y, ylen


def test_ctc_trains_on_planted_two_glyph_task():
    """Recovery of a planted signal: lines of one or two digits among {0, 1}; a few dozen steps of
    the ANN with torch's CTCLoss must beat the best constant guess."""
    X, texts, y, ylen = _two_glyph_lines()
    torch.manual_seed(0)
    m = Recognizer(8, 2, (4, 8, 8), 16, heads=2, mlp=32, spiking=False)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    ctc = torch.nn.CTCLoss(zero_infinity=True)
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


def test_spiking_reducer_network_learns_a_planted_task_and_drops_positions():
    """Planted signal through the spiking path: lines of one or two digits among {0, 1} on 24 px;
    spike_htr's wiring (learned InkCoder, LIF CNN, CTC-guided reducer, spiking mixer) trained with
    the method's loss (CTC + 0.3 aux CTC) must read them (CER falls from the untrained network's to
    below 0.15; 0.59 untrained, 0.015 in the run that fixed the test) while its reducer passes
    fewer than half of the positions to the mixer (0.25)."""
    X, texts, y, ylen = _two_glyph_lines()
    torch.manual_seed(0)
    m = Recognizer(8, 2, (4, 8, 8), 16, heads=2, mlp=32, blocks=1, spiking=True, reducer=True, threshold=0.5,
                   sigma_max=1.0)
    ctc = torch.nn.CTCLoss(zero_infinity=True)

    def read():
        m.eval()
        with torch.no_grad():
            out = m(X)
        m.train()
        preds = [[c - 1 for c in p] for p in C.greedy_decode(out["logp"], out["lengths"])]
        return C.cer(preds, texts), float((out["lengths"].float() / out["L"]).mean())

    cer0, _ = read()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(300):
        out = m(X)
        full = torch.full((len(X),), out["L"], dtype=torch.long)
        loss = ctc(out["logp"].transpose(0, 1), y, out["lengths"], ylen) \
            + 0.3 * ctc(out["aux_logp"].transpose(0, 1), y, full, ylen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    cer1, kept = read()
    assert cer1 < 0.15 and cer1 < cer0 - 0.3, (cer0, cer1)
    assert kept < 0.5, kept


def test_training_rule_keeps_the_best_averaged_network_by_validation_cer():
    """``train_model``: the shared rule (one grid, constant rate, plateau test), the validation
    curve is the CER of the averaged weights, and the returned network is the averaged one with
    the best validation CER (re-evaluating it reproduces the curve's minimum)."""
    from reprozoo.methods.spike_htr import method as M

    p = {"alphabet": "0123456789",
         "data": {"upsample": 1, "height": 8, "width": 40, "n_train": 96, "n_val": 24, "n_test": 8,
                  "n_chars": [2, 4], "gap": [0, 2], "margin": 2, "noise": 0.05},
         "model": {"T": 2, "channels": [4, 8, 8], "d_model": 16, "heads": 2, "mlp": 16, "blocks": 1,
                   "sigma_max": 1.0, "beta": 0.5, "threshold": 0.5, "tau": 0.9},
         "fit": {"lr_grid": [3e-3, 1e-2], "pilot_steps": 10, "eval_every": 5, "min_steps": 30, "max_steps": 60,
                 "flat_tol": 0.01, "ctc_tiebreak": 0.01, "batch": 16, "ema": 0.9, "aux_weight": 0.3}}
    raw = M._splits(p, 0)
    splits = {}
    for s in ("train", "val"):
        X, texts = raw[s]
        splits[s] = (torch.from_numpy(X).unsqueeze(1), [[c + 1 for c in t] for t in texts])
    net, rec, early, zeroed = M.train_model(p, "spike_htr", splits, 0, progress=lambda s: None, control_step=12)
    assert set(rec["pilot_best"]) == {3e-3, 1e-2} and rec["stop"] >= 30
    assert all(lr == rec["lr"] for lr in rec["lrs"])                    # constant rate
    assert len(rec["val_ctc"]) == len(rec["vals"]) == len(rec["val_cer"])
    # the score is the CER with the CTC loss per character as a tie-break (weight 0.01)
    n_chars = sum(len(t) for t in splits["val"][1])
    assert rec["steps"][0] == 0 and rec["vals"][0] == M.UNTRAINED       # the untrained net is never kept
    for sc, c, l in zip(rec["vals"][1:], rec["val_cer"][1:], rec["val_ctc"][1:]):
        assert sc == pytest.approx(c + 0.01 * l * len(splits["val"][1]) / n_chars)
    ctc = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    ev = M._evaluate(net, *splits["val"], ctc, costs=False)
    best = int(np.argmin(rec["vals"]))
    assert ev["cer"] == pytest.approx(rec["val_cer"][best]) and ev["loss"] == pytest.approx(rec["val_ctc"][best], rel=1e-4)
    assert early is not None and zeroed >= 0


def test_a_fixed_rate_reproduces_the_run_the_grid_pilot_chose():
    """``fit.lr`` (a rate per variant fixed once from a pilot of the grid) skips the pilots but
    trains the same run: same initial weights, same batches, so the same validation curve as the
    grid's chosen rate; the grid edge is still reported against ``fit.lr_grid``."""
    from reprozoo.blocks.rate_table import grid_edge
    from reprozoo.methods.spike_htr import method as M

    p = {"alphabet": "0123456789",
         "data": {"upsample": 1, "height": 8, "width": 40, "n_train": 64, "n_val": 16, "n_test": 8,
                  "n_chars": [2, 4], "gap": [0, 2], "margin": 2, "noise": 0.05},
         "model": {"T": 2, "channels": [4, 8, 8], "d_model": 16, "heads": 2, "mlp": 16, "blocks": 1,
                   "sigma_max": 1.0, "beta": 0.5, "threshold": 0.5, "tau": 0.9},
         "fit": {"lr_grid": [3e-3, 1e-2, 3e-2], "pilot_steps": 10, "eval_every": 5, "min_steps": 20, "max_steps": 30,
                 "flat_tol": 0.01, "ctc_tiebreak": 0.01, "batch": 8, "ema": 0.9, "aux_weight": 0.3}}
    raw = M._splits(p, 0)
    splits = {s: (torch.from_numpy(raw[s][0]).unsqueeze(1), [[c + 1 for c in t] for t in raw[s][1]])
              for s in ("train", "val")}
    _, grid, _, _ = M.train_model(p, "snn_full", splits, 0, progress=lambda s: None)
    p["fit"]["lr"] = {"snn_full": grid["lr"], "ann": 1.0}
    _, fixed, _, _ = M.train_model(p, "snn_full", splits, 0, progress=lambda s: None)
    assert list(fixed["pilot_best"]) == [grid["lr"]] and fixed["lr"] == grid["lr"]
    assert fixed["steps"] == grid["steps"] and fixed["vals"] == pytest.approx(grid["vals"], abs=1e-6)
    assert fixed["lr_edge"] == grid["lr_edge"] == grid_edge(grid["lr"], p["fit"]["lr_grid"])
    p["fit"]["lr"] = {"snn_full": 3e-2}  # the grid's top rate, fixed: the edge is still reported
    _, top, _, _ = M.train_model(p, "snn_full", splits, 0, progress=lambda s: None)
    assert top["lr"] == 3e-2 and top["lr_edge"] == "top"
    _, other, _, _ = M.train_model(p, "ann", splits, 0, progress=lambda s: None)  # a variant not named: the grid
    assert sorted(other["pilot_best"]) == [3e-3, 1e-2, 3e-2]


def test_direct_variant_feeds_the_same_image_at_every_step():
    """The `direct` ablation: no coder, the static image repeated over the T steps."""
    from reprozoo.methods.spike_htr import method as M

    p = {"alphabet": "0123456789",
         "model": {"T": 2, "channels": [4, 8, 8], "d_model": 16, "heads": 2, "mlp": 16, "blocks": 1,
                   "sigma_max": 1.0, "beta": 0.5, "threshold": 0.5, "tau": 0.9}}
    m = M.build(p, "direct", 8)
    x = torch.rand(3, 1, 8, 16)
    st = m.stream(x)
    assert m.coder is None and st.shape == (2, 3, 1, 8, 16)
    assert torch.equal(st[0], x) and torch.equal(st[1], x)
    assert M.build(p, "spike_htr", 8).coder.learned and not M.build(p, "fixed_inkcoder", 8).coder.learned


@pytest.mark.parametrize("shape", [(2, 5, 3, 4, 6), (3, 4, 7)])
def test_lif_fast_equals_the_shared_lif(shape):
    """Round 13 (budget): the encoder and the mixer use ``model.lif_fast``, which skips the shared
    ``lif``'s work at t = 1 on a zero state; spikes, membranes and gradients are the same."""
    from reprozoo.blocks.spiking import arctan, lif
    from reprozoo.methods.spike_htr.model import lif_fast

    torch.manual_seed(0)
    cur = (torch.randn(*shape) * 0.8).requires_grad_(True)
    sur = arctan(2.0)
    s, v = lif(cur, 0.5, 0.5, sur)
    s2, v2 = lif_fast(cur, 0.5, 0.5, sur, mems=True)
    assert torch.equal(s, s2) and torch.equal(v, v2) and s.sum() > 0 and s.sum() < s.numel()
    w = torch.randn(*shape)
    g = torch.autograd.grad(((s + v) * w).sum(), cur)[0]
    g2 = torch.autograd.grad(((s2 + v2) * w).sum(), cur)[0]
    assert torch.allclose(g, g2, atol=0, rtol=0)
    assert torch.equal(lif_fast(cur, 0.5, 0.5, sur), s2)


def test_test_passes_sharing_one_encoder_pass_give_the_same_numbers():
    """Round 13 (budget): the seven test passes of a reducer network share one encoder pass
    (``method.encode_batches``); every mode gives the numbers of a pass that encodes afresh."""
    from reprozoo.methods.spike_htr.method import _evaluate, encode_batches

    torch.manual_seed(0)
    x = torch.rand(7, 1, 8, 24)
    texts = [[1, 2, 2, 3], [4], [5, 6, 7], [1, 1], [2, 3, 4, 5, 6], [7, 8], [9]]
    net = Recognizer(8, 10, (4, 6, 8), 12, heads=2, mlp=16, spiking=True, reducer=True, threshold=0.5)
    for _ in range(2):                      # batch-norm statistics away from their initial values
        net(x)
    ctc = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    encs = encode_batches(net, x, batch=3)
    assert net.training                     # the model's mode is restored
    for kw in (dict(), dict(reduce="drop", costs=False), dict(reduce="uniform"), dict(reduce="runs", costs=False),
               dict(reduce="off"), dict(tau=0.5, costs=False)):
        a = _evaluate(net, x, texts, ctc, batch=3, **kw)
        b = _evaluate(net, x, texts, ctc, batch=3, encs=encs, **kw)
        for k in ("edits", "chars", "kept_lines", "preds"):
            assert a[k] == b[k], (kw, k)
        for k in ("loss", "cer") + (("ac", "mac", "mixer_ac", "energy_nj") if kw.get("costs", True) else ()):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), (kw, k)
