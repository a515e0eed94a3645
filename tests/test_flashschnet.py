"""FlashSchNet: both flash kernels (the paper's memory pattern and our recompute kernel) reproduce
the baseline SchNet exactly (energies, forces, weight gradients, gradcheck), with and without the
pair-symmetry trick, so does the pair-symmetric baseline (our ablation); the recompute kernel never
allocates an (E, F) tensor, the paper's pattern keeps the filter but lies between it and the
baseline in peak memory; its CSR chunking is consistent; W16A16 is the plain fp16 cast and the weight
formats order by force error; the paired ABBA timing alternates order and reads 1 on an A/A fake
clock, also with a planted order effect; 16-bit weights are accurate, the MD observables are right on a closed-form case and detect a real change
of the force field, the chain potential and integrators are physical, and the method runs end to end."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.blocks.atomistic import AtomsData, SchNet, make_emt_frames, radius_graph  # noqa: E402
from reprozoo.methods.flashschnet.cgchain import (ChainPotential, compact_start, kinetic, make_chain,  # noqa: E402
                                                   maxwell_boltzmann, velocity_verlet, KB)
from reprozoo.methods.flashschnet.flash import (FlashCFConv, FlashSchNet, build_graph, dequantize,  # noqa: E402
                                                quantize_per_channel)
from reprozoo.methods.flashschnet.baseline_pairs import PairBaselineSchNet, unordered_pairs  # noqa: E402
from reprozoo.methods.flashschnet.measure import largest_allocation, peak_bytes  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _perturbed_schnet(dtype=torch.float64, seed=0, cutoff=6.0, F=16, T=2, K=12, max_z=100):
    torch.manual_seed(seed)
    m = SchNet(F, T, K, cutoff, max_z=max_z).to(dtype)
    with torch.no_grad():  # default init has zero-ish biases; make every term matter
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return m.eval()


def _chain_batch(n_beads=40, R=3, cutoff=6.0, dtype=torch.float64, seed=0):
    s = make_chain(n_beads, seed)
    rng = np.random.default_rng(seed)
    X = torch.from_numpy(np.concatenate([compact_start(s, rng) for _ in range(R)])).to(dtype)
    numbers = torch.from_numpy(np.tile(s.types, R))
    batch = torch.repeat_interleave(torch.arange(R), n_beads)
    ei = radius_graph(X, batch, cutoff)
    return numbers, X, batch, ei, R


# --- exactness ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pairs", [True, False])
@pytest.mark.parametrize("chunk", [5, 64, 100000])
def test_flash_equals_baseline_float64_chain(pairs, chunk):
    numbers, X, batch, ei, R = _chain_batch()
    m = _perturbed_schnet(max_z=20)
    e0, f0 = m.energy_and_forces(numbers, X, batch, ei, None, R, create_graph=False)
    fm = FlashSchNet(m, chunk_size=chunk, pairs=pairs)
    e1, f1 = fm.energy_and_forces(numbers, X, batch, ei, None, R)
    assert f0.abs().max() > 1e-3
    np.testing.assert_allclose(e1.numpy(), e0.detach().numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(f1.numpy(), f0.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pairs", [True, False])
def test_flash_equals_baseline_periodic_with_self_images(pairs):
    """Small Cu/Au cell (4 atoms) with a cutoff beyond the cell: periodic self images."""
    fr = make_emt_frames("cuau_bulk", n_frames=2, rattle=0.1, seed=3, size=1)
    b = AtomsData(fr, 4.5).collate([0, 1], dtype=torch.float64)
    assert bool((b.edge_index[0] == b.edge_index[1]).any())
    m = _perturbed_schnet(cutoff=4.5)
    e0, f0 = m.batch_forward(b)
    e1, f1 = FlashSchNet(m, chunk_size=17, pairs=pairs).energy_and_forces(
        b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures)
    np.testing.assert_allclose(e1.numpy(), e0.detach().numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(f1.numpy(), f0.numpy(), rtol=1e-10, atol=1e-12)


def test_pair_baseline_equals_baseline_chain_and_periodic():
    """The baseline with the pair trick (filter once per unordered pair, message both ways) is the
    same function: energies and forces equal the plain baseline's in float64, also with periodic
    self images (a pair i-i whose two directions are the shifts +s and -s)."""
    numbers, X, batch, ei, R = _chain_batch()
    m = _perturbed_schnet(max_z=20)
    e0, f0 = m.energy_and_forces(numbers, X, batch, ei, None, R, create_graph=False)
    pi, _ = unordered_pairs(ei)
    assert pi.shape[1] * 2 == ei.shape[1] and bool((pi[0] < pi[1]).all())
    e1, f1 = PairBaselineSchNet(m).energy_and_forces(numbers, X, batch, pi, None, R)
    np.testing.assert_allclose(e1.detach().numpy(), e0.detach().numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(f1.numpy(), f0.numpy(), rtol=1e-10, atol=1e-12)
    fr = make_emt_frames("cuau_bulk", n_frames=2, rattle=0.1, seed=3, size=1)
    b = AtomsData(fr, 4.5).collate([0, 1], dtype=torch.float64)
    m = _perturbed_schnet(cutoff=4.5)
    e0, f0 = m.batch_forward(b)
    pi, sh = unordered_pairs(b.edge_index, b.shifts)
    e1, f1 = PairBaselineSchNet(m).energy_and_forces(b.numbers, b.positions, b.batch, pi, sh, b.n_structures)
    np.testing.assert_allclose(e1.detach().numpy(), e0.detach().numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(f1.numpy(), f0.numpy(), rtol=1e-10, atol=1e-12)


def test_weight_gradients_equal_baseline():
    numbers, X, batch, ei, R = _chain_batch(R=2)
    m = _perturbed_schnet(max_z=20)
    m.zero_grad()
    m(numbers, X, batch, ei, None, R).sum().backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    for pairs in (True, False):
        m.zero_grad()
        FlashSchNet(m, chunk_size=50, pairs=pairs)(numbers, X, batch, ei, None, R).sum().backward()
        for n, p in m.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), ref[n].numpy(), rtol=1e-9, atol=1e-11, err_msg=n)


@pytest.mark.parametrize("pairs", [True, False])
def test_custom_function_gradcheck(pairs):
    numbers, X, batch, ei, R = _chain_batch(n_beads=14, R=2, cutoff=7.0)
    m = _perturbed_schnet(cutoff=7.0, max_z=20)
    g = build_graph(ei, X.shape[0], None, chunk_size=9, pairs=pairs)
    blk = m.interactions[0]
    h = torch.randn(X.shape[0], 16, dtype=torch.float64, requires_grad=True)
    pos = X.clone().requires_grad_(True)

    def fn(h, pos, W1, b1, W2, b2):
        dist = torch.linalg.vector_norm(pos[g.src] - pos[g.dst], dim=-1).detach()
        return FlashCFConv.apply(h, pos, W1, b1, W2, b2, g, dist, m.rbf.centers.double(), m.rbf.gamma.double(), 7.0)

    args = [h, pos] + [t.detach().clone().requires_grad_(True)
                       for t in (blk.filter1.weight, blk.filter1.bias, blk.filter2.weight, blk.filter2.bias)]
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)


def test_float32_forces_within_fp32_tolerance_and_first_order_only():
    numbers, X, batch, ei, R = _chain_batch(n_beads=60, R=4, cutoff=8.0, dtype=torch.float32)
    m = _perturbed_schnet(torch.float32, cutoff=8.0, F=32, max_z=20)
    _, f0 = m.energy_and_forces(numbers, X, batch, ei, None, R, create_graph=False)
    _, f1 = FlashSchNet(m, chunk_size=256).energy_and_forces(numbers, X, batch, ei, None, R)
    assert (f1 - f0).abs().max() <= 1e-5 * f0.abs().max()   # the claim's tolerance
    with pytest.raises(NotImplementedError):
        FlashSchNet(m).energy_and_forces(numbers, X, batch, ei, None, R, create_graph=True)


# --- memory ---------------------------------------------------------------------------------------------

def test_profiler_peak_memory_counts_torch_allocations():
    def fn():
        a = torch.empty(1000, 1000)      # 4 MB
        b = a * 2                        # 4 MB
        del a
        c = torch.empty(2000, 1000)      # 8 MB -> peak 12 MB
        return (b, c)

    peak, _ = peak_bytes(fn)
    assert 12_000_000 <= peak < 12_100_000
    assert 8_000_000 <= largest_allocation(fn) < 8_000_100


def test_no_edge_by_feature_tensor_and_lower_peak():
    numbers, X, batch, ei, R = _chain_batch(n_beads=120, R=4, cutoff=8.0, dtype=torch.float32)
    m = _perturbed_schnet(torch.float32, cutoff=8.0, F=64, max_z=20)
    E, F = ei.shape[1], 64
    fm = FlashSchNet(m, chunk_size=512)
    g = fm.graph(ei, X.shape[0])
    run_flash = lambda: fm.energy_and_forces(numbers, X, batch, n_structures=R, graph=g)  # noqa: E731
    run_base = lambda: m.energy_and_forces(numbers, X, batch, ei, None, R, create_graph=False)  # noqa: E731
    run_flash()
    big = largest_allocation(run_flash)
    assert big < E * F * 4 / 4, (big, E * F * 4)            # never one (E, F) fp32 tensor, not even a quarter
    assert largest_allocation(run_base) >= E * F * 4        # the baseline does materialise them
    pf, _ = peak_bytes(run_flash)
    pb, _ = peak_bytes(run_base)
    assert pb > 3 * pf


# --- graph ------------------------------------------------------------------------------------------------

def test_csr_graph_chunks_and_pairs():
    numbers, X, batch, ei, R = _chain_batch(n_beads=50, R=2, cutoff=7.0)
    n = X.shape[0]
    for pairs in (False, True):
        g = build_graph(ei, n, None, chunk_size=37, pairs=pairs)
        assert g.n_edges == (ei.shape[1] // 2 if pairs else ei.shape[1])
        assert torch.all(g.dst[1:] >= g.dst[:-1])
        assert int(g.rowptr[-1]) == g.n_edges
        prev_a, prev_e = 0, 0
        for a0, a1, e0, e1 in g.chunks:      # whole rows, contiguous, within the size (or one row)
            assert a0 >= prev_a and e0 == prev_e and e1 > e0
            assert int(g.rowptr[a0]) == e0 and int(g.rowptr[a1]) == e1
            assert e1 - e0 <= 37 or a1 - a0 == 1
            prev_a, prev_e = a1, e1
        assert prev_e == g.n_edges
        if pairs:
            assert torch.all(g.dst < g.src)
            und = {(min(a, b), max(a, b)) for a, b in ei.t().tolist()}
            assert set(zip(g.dst.tolist(), g.src.tolist())) == und
    with pytest.raises(ValueError):
        build_graph(ei[:, :-1], n)  # one direction of a pair missing


# --- 16-bit weights -------------------------------------------------------------------------------------

def test_per_channel_quantisation_error_bounds():
    torch.manual_seed(0)
    w = torch.randn(32, 24) * torch.logspace(-3, 1, 32)[:, None]  # channels of very different scale
    amax = w.abs().amax(1, keepdim=True)
    q, s = quantize_per_channel(w, "float16")
    assert q.dtype == torch.float16
    assert torch.all((dequantize(q, s) - w).abs() <= amax * 2.0**-11)
    q, s = quantize_per_channel(w, "int16")
    assert q.dtype == torch.int16
    assert torch.all((dequantize(q, s) - w).abs() <= amax / 32767 * 0.5 + 1e-12)
    q, s = quantize_per_channel(w, "bfloat16")
    assert torch.all((dequantize(q, s) - w).abs() <= amax * 2.0**-8)
    q, s = quantize_per_channel(w, "int8")
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.all((dequantize(q, s) - w).abs() <= amax / 127 * 0.5 + 1e-12)
    q, s = quantize_per_channel(w, "int2")  # ternary: every weight becomes -amax, 0 or +amax of its row
    assert set(torch.unique(q).tolist()) <= {-1, 0, 1}
    d = dequantize(q, s)
    assert torch.all((d.abs() < 1e-30) | ((d.abs() - amax).abs() <= 1e-6 * amax))
    with pytest.raises(ValueError):
        quantize_per_channel(w, "int1")


def test_quantised_flash_forces_close_and_weights_smaller():
    numbers, X, batch, ei, R = _chain_batch(n_beads=60, R=2, cutoff=8.0, dtype=torch.float32)
    m = _perturbed_schnet(torch.float32, cutoff=8.0, F=32, max_z=20)
    _, f32 = FlashSchNet(m).energy_and_forces(numbers, X, batch, ei, None, R)
    q = FlashSchNet(m, quantize="float16")
    _, f16 = q.energy_and_forces(numbers, X, batch, ei, None, R)
    err = (f16 - f32).abs().max() / f32.pow(2).mean().sqrt()
    assert 0 < err < 1e-2
    assert q.weight_bytes() < 0.6 * FlashSchNet(m).weight_bytes()


# --- the paper's memory pattern and its W16A16 scheme -------------------------------------------------------

@pytest.mark.parametrize("chunk", [5, 64, 100000])
def test_paper_kernel_equals_baseline_float64(chunk):
    numbers, X, batch, ei, R = _chain_batch()
    m = _perturbed_schnet(max_z=20)
    e0, f0 = m.energy_and_forces(numbers, X, batch, ei, None, R, create_graph=False)
    e1, f1 = FlashSchNet(m, chunk_size=chunk, kernel="paper").energy_and_forces(numbers, X, batch, ei, None, R)
    np.testing.assert_allclose(e1.numpy(), e0.detach().numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(f1.numpy(), f0.detach().numpy(), rtol=1e-10, atol=1e-10)


def test_paper_kernel_periodic_weight_gradients_and_gradcheck():
    """Small Cu/Au cell with periodic self images: forces and weight gradients equal the baseline's,
    and the hand-written backward passes of the three Functions pass gradcheck in positions."""
    fr = make_emt_frames("cuau_bulk", n_frames=2, rattle=0.1, seed=3, size=1)
    b = AtomsData(fr, 4.5).collate([0, 1], dtype=torch.float64)
    m = _perturbed_schnet(cutoff=4.5)
    e0, f0 = m.batch_forward(b)
    fm = FlashSchNet(m, chunk_size=17, kernel="paper")
    e1, f1 = fm.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures)
    np.testing.assert_allclose(e1.numpy(), e0.detach().numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(f1.numpy(), f0.numpy(), rtol=1e-10, atol=1e-12)
    g = fm.graph(b.edge_index, b.positions.shape[0], b.shifts)
    params = [q for q in m.parameters() if q.requires_grad]
    ga = torch.autograd.grad(fm(b.numbers, b.positions, b.batch, n_structures=b.n_structures, graph=g).sum(),
                             params, allow_unused=True)
    gb = torch.autograd.grad(m(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures).sum(),
                             params, allow_unused=True)
    for x, y in zip(ga, gb):
        if y is not None:
            np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-9, atol=1e-10)
    pos = b.positions.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda q: fm(b.numbers, q, b.batch, n_structures=b.n_structures, graph=g), (pos,), eps=1e-6, atol=1e-6)


def test_paper_kernel_keeps_edge_filter_but_not_messages_and_lies_between():
    """The paper's pattern materialises the (E, F) filter (so its largest allocation is one (E, F)
    tensor) but not the baseline's extra (E, F) tensors: its peak lies between the recompute
    kernel's and the baseline's."""
    numbers, X, batch, ei, R = _chain_batch(n_beads=120, R=4, cutoff=8.0, dtype=torch.float32)
    m = _perturbed_schnet(torch.float32, cutoff=8.0, F=64, max_z=20)
    E, F = ei.shape[1], 64
    runs = {}
    for name, fm in (("paper", FlashSchNet(m, chunk_size=512, kernel="paper")), ("recompute", FlashSchNet(m, chunk_size=512))):
        g = fm.graph(ei, X.shape[0])
        runs[name] = (lambda fm=fm, g=g: fm.energy_and_forces(numbers, X, batch, n_structures=R, graph=g))
    runs["base"] = lambda: m.energy_and_forces(numbers, X, batch, ei, None, R, create_graph=False)
    for r in runs.values():
        r()
    assert largest_allocation(runs["paper"]) >= E * F * 4
    peak = {k: peak_bytes(r)[0] for k, r in runs.items()}
    assert peak["recompute"] < peak["paper"] < peak["base"] / 1.2, peak


def test_w16a16_is_the_public_cast_and_formats_order_by_error():
    numbers, X, batch, ei, R = _chain_batch(n_beads=60, R=2, cutoff=8.0, dtype=torch.float32)
    m = _perturbed_schnet(torch.float32, cutoff=8.0, F=32, max_z=20)
    fm = FlashSchNet(m, kernel="paper", quantize="w16a16")
    blk = m.interactions[0]
    assert fm.weight("interactions.0.filter1", blk.filter1).equal(blk.filter1.weight.half().float())  # no scale
    assert fm.bias("interactions.0.filter2", blk.filter2).equal(blk.filter2.bias.half().float())
    assert fm.weight("interactions.0.in2f", blk.in2f) is blk.in2f.weight  # only filter and output networks
    assert fm.weight("head.0", m.head[0]).equal(m.head[0].weight.half().float())
    _, f32 = FlashSchNet(m, kernel="paper").energy_and_forces(numbers, X, batch, ei, None, R)
    rms = f32.pow(2).mean().sqrt()
    err = {}
    for q in ("w16a16", "float16", "int4", "int2"):
        _, fq = FlashSchNet(m, kernel="paper", quantize=q).energy_and_forces(numbers, X, batch, ei, None, R)
        err[q] = float((fq - f32).abs().max() / rms)
    assert 0 < err["w16a16"] < 1e-2 and 0 < err["float16"] < 1e-2
    assert max(err["w16a16"], err["float16"]) < err["int4"] < err["int2"], err
    with pytest.raises(ValueError):
        FlashSchNet(m, quantize="w16a16")  # fp16 activations: the paper's kernel only


# --- the timing procedure ------------------------------------------------------------------------------

class _FakeClockEvaluator:
    """A force call that advances a shared fake clock by its cost and records the order of calls; a
    planted order effect: whoever runs first in a timed round is ``bonus`` cheaper (warm-up: 2 calls
    each, then segments of ``steps`` calls)."""

    def __init__(self, name, cost, st, steps, bonus=0.0):
        self.name, self.cost, self.st, self.steps, self.bonus, self.device = name, cost, st, steps, bonus, "cpu"

    def forces(self, pos):
        st = self.st
        k = len(st["calls"]) - 4
        first = k >= 0 and (k % (2 * self.steps)) < self.steps
        st["calls"].append(self.name)
        st["t"] += self.cost * ((1.0 - self.bonus) if first else 1.0)
        return torch.zeros_like(pos)


def _fake_rounds(cost_a, cost_b, bonus=0.0, repeats=8, steps=3):
    from reprozoo.methods.flashschnet.md import paired_rounds

    s = make_chain(10, 0)
    st = {"t": 0.0, "calls": []}
    a = _FakeClockEvaluator("a", cost_a, st, steps, bonus)
    b = _FakeClockEvaluator("b", cost_b, st, steps, bonus)
    cfg = {"md_steps": steps, "repeats": repeats, "warmup": 1, "dt": 0.01, "gamma": 2.0, "T": 300.0}
    res = paired_rounds(a, b, np.zeros((1, 10, 3)), 2, cfg, s, seed=0, clock=(lambda: st["t"], lambda: st["t"]))
    return res, st["calls"]


def test_paired_rounds_alternate_order_and_aa_is_one():
    res, calls = _fake_rounds(1.0, 1.0)
    timed = calls[4:]                       # warm-up: 2 force calls each (initial forces + 1 step)
    rounds = [timed[6 * r:6 * r + 6] for r in range(8)]
    assert all(r == ["a"] * 3 + ["b"] * 3 for r in rounds[0::2]) and all(r == ["b"] * 3 + ["a"] * 3 for r in rounds[1::2])
    assert np.median(res["ratio_cpu"]) == pytest.approx(1.0) and len(res["ratio_cpu"]) == 8
    res, _ = _fake_rounds(2.0, 1.0)        # a twice as slow: speed-up of a over b is 0.5 in every round
    assert np.allclose(res["ratio_cpu"], 0.5) and np.allclose(res["ratio_wall"], 0.5)
    # a planted 10 % bonus for whoever runs first in a round: ABBA keeps the A/A median at about 1
    res, _ = _fake_rounds(1.0, 1.0, bonus=0.1)
    r = np.asarray(res["ratio_cpu"])
    assert r.max() > 1.05 and r.min() < 0.95
    assert abs(np.median(r) - 1.0) < 0.01


# --- the chain system -----------------------------------------------------------------------------------

def test_chain_forces_are_minus_gradient_and_nve_conserves_energy():
    s = make_chain(30, 1)
    pot = ChainPotential(s, rc=10.0)
    X = torch.from_numpy(compact_start(s, np.random.default_rng(0))[None])
    for which in ("prior", "learned", "reference"):
        _, f = pot.energy_forces(X, which)
        h = 1e-5
        for a, k in [(0, 0), (7, 1), (29, 2)]:
            xp, xm = X.clone(), X.clone()
            xp[0, a, k] += h
            xm[0, a, k] -= h
            fd = -(pot.energy(xp, which) - pot.energy(xm, which)).item() / (2 * h)
            assert abs(fd - f[0, a, k].item()) < 1e-5 * max(1.0, abs(fd)), (which, a, k)
    gen = torch.Generator().manual_seed(0)
    kT = KB * 300.0
    vel = maxwell_boltzmann(X.shape, s.mass, kT, gen)
    _, _, tot = velocity_verlet(X, vel, lambda p: pot.energy_forces(p, "reference"), s.mass, 0.002, 300, every=10)
    assert (tot - tot[0]).abs().max().item() < 0.02 * kT * s.n  # small fluctuation, no drift
    assert abs(kinetic(vel, s.mass).item() / (1.5 * s.n * kT) - 1) < 0.5


# --- MD observables ------------------------------------------------------------------------------------

def test_chain_observables_closed_form():
    """A straight chain with bond b: bond mean b, width 0, Rg^2 = b^2 (N^2 - 1) / 12, no contacts
    (every non-bonded pair is >= 3 b apart); a folded hairpin has the contacts counted by hand."""
    from reprozoo.methods.flashschnet.md import chain_observables

    N, b = 11, 3.8
    line = torch.zeros(N, 3, dtype=torch.float64)
    line[:, 0] = torch.arange(N, dtype=torch.float64) * b
    traj = torch.stack([torch.stack([line, line + 5.0])] * 3)   # (T=3, R=2, N, 3)
    o = chain_observables(traj)
    assert o["rg"].shape == (3, 2)
    np.testing.assert_allclose(o["bond_mean"], b, rtol=1e-12)
    np.testing.assert_allclose(o["bond_width"], 0, atol=1e-12)
    np.testing.assert_allclose(o["rg"], b * np.sqrt((N**2 - 1) / 12), rtol=1e-12)
    np.testing.assert_allclose(o["contacts"], 0)
    # hairpin: two parallel strands of 4 beads, 5 A apart: bead k faces bead 7 - k (|i - j| >= 3 except
    # the turn 3-4, which is bonded): 4 facing pairs within 6.5 A (5 A; diagonals 6.3 A count too)
    hp = torch.zeros(8, 3, dtype=torch.float64)
    hp[:4, 0] = torch.arange(4, dtype=torch.float64) * b
    hp[4:, 0] = torch.arange(3, -1, -1, dtype=torch.float64) * b
    hp[4:, 1] = 5.0
    d = torch.cdist(hp, hp)
    i = torch.arange(8)
    expect = ((d < 6.5) & ((i[:, None] - i[None, :]).abs() >= 3)).sum().item() / 8
    assert expect > 0
    np.testing.assert_allclose(chain_observables(hp[None, None])["contacts"], expect)


def test_integrated_autocorrelation_time_of_ar1():
    """AR(1) x_t = phi x_{t-1} + e_t has tau_int = (1 + phi) / (1 - phi); white noise has 1."""
    from reprozoo.methods.flashschnet.md import integrated_autocorr_time

    rng = np.random.default_rng(0)
    for phi in (0.0, 0.8, 0.95):
        e = rng.normal(size=(20000, 4))
        x = np.zeros_like(e)
        for t in range(1, len(e)):
            x[t] = phi * x[t - 1] + e[t]
        tau = integrated_autocorr_time(x)
        assert tau == pytest.approx((1 + phi) / (1 - phi), rel=0.1), phi


def test_observables_shift_detects_coarse_weights_and_a_changed_force_field_but_not_fp16():
    """The quantised_accuracy yardstick has power: from independent equilibrated starts, with the
    same noise, ternary weights (the control) and a 30 % stiffer bond prior move an observable by
    several standard errors over the replicas; 16-bit weights do not."""
    import dataclasses

    from reprozoo.methods.flashschnet.cgchain import ChainPotential, equilibrated_starts
    from reprozoo.methods.flashschnet.md import Evaluator, observables_run, summarise_observables

    s = make_chain(12, 2)
    start = equilibrated_starts(s, 8, 400, 0.02, 300.0, 2.0, seed=1)
    m = _perturbed_schnet(torch.float32, cutoff=6.0, F=16, max_z=20)
    with torch.no_grad():  # a SchNet correction about 1/10 of the prior's forces (as in the method)
        m.e_std.mul_(50.0)
    cfg = {"replicas": 8, "burn": 10, "steps": 80, "every": 2, "dt": 0.02, "gamma": 2.0, "T": 300.0}

    def run(q=None, k_bond=s.k_bond):
        sys_ = dataclasses.replace(s, k_bond=k_bond)
        ev = Evaluator("flash", m, s.types, 8, skin=1.0, quantize=q, pairs=True, prior=ChainPotential(sys_))
        return summarise_observables(observables_run(ev, start, cfg, sys_, seed=5), 0.04)

    def shift(a, b):
        return max(abs(a[k]["mean"] - b[k]["mean"]) / b[k]["sem"] for k in a)

    ref = run()
    assert all(v["sem"] > 0 and v["tau_ps"] >= 0.04 for v in ref.values())
    ev = Evaluator("flash", m, s.types, 8, skin=1.0, prior=ChainPotential(s))
    f_model = ev.energy_forces(torch.from_numpy(start), with_prior=False)[1]
    f_prior = ChainPotential(s).energy_forces(torch.from_numpy(start), "prior")[1]
    assert 0.03 < f_model.pow(2).mean().sqrt() / f_prior.pow(2).mean().sqrt() < 0.3
    assert shift(run("float16"), ref) < 0.1
    assert shift(run("int2"), ref) > 1.0
    assert shift(run(k_bond=1.3 * s.k_bond), ref) > 1.0


# --- the method end to end, tiny --------------------------------------------------------------------------

def test_method_runs_end_to_end(tmp_path):
    from reprozoo.methods.flashschnet import method
    from reprozoo.runtime import RunContext

    p = {"device": "cpu", "system": {"n_beads": 40, "seed": 0},
         "data": {"n_replicas": 3, "n_equil": 10, "n_frames_per_replica": 2, "every": 2, "dt": 0.01, "T": 300.0,
                  "gamma": 2.0},
         "model": {"n_features": 16, "n_interactions": 2, "n_rbf": 8, "cutoff": 7.0},
         "train": {"epochs": 1, "batch_size": 2, "max_steps": 2},
         "flash": {"chunk_size": 256, "quantize": "float16"},
         "bench": {"replicas": [1, 2], "speedup_replicas": 2,
                   "interleaved": {v: {"md_steps": 2, "repeats": 2} for v in
                                   ("flashschnet", "baseline_schnet", "flash_recompute", "flash_pairs", "baseline_pairs")},
                   "dt": 0.01, "gamma": 2.0, "T": 300.0, "skin": 1.0},
         "observables": {"variants": ["flashschnet", "flashschnet_w16a16", "flashschnet_int4w", "flashschnet_int2w"],
                         "n_beads": 10, "replicas": 3, "equil_steps": 20, "dt": 0.02, "gamma": 2.0, "burn": 2, "steps": 4,
                         "every": 1, "pairs": False},
         "controls": ["flashschnet_int4w", "flashschnet_int2w"],
         "nve": {"variants": ["flashschnet", "baseline_schnet"], "replicas": 1, "steps": 4, "dt": 0.005, "every": 1}}
    shared = tmp_path / "shared"
    shared.mkdir()
    ctx = RunContext("flashschnet", "shared", 0, "ci", p, {}, shared, shared)
    method.train_shared(ctx)
    out = {}
    variants = ("flashschnet", "flashschnet_w16a16", "flashschnet_fp16w", "flash_recompute", "flash_pairs",
                "baseline_schnet", "baseline_pairs", "flashschnet_int4w", "flashschnet_int2w")
    for v in variants:
        (tmp_path / v).mkdir()
        c = RunContext("flashschnet", v, 0, "ci", p, {}, tmp_path / v, shared)
        method.train(c)
        out[v] = c.metrics
    for v in ("flashschnet", "flash_recompute", "flash_pairs", "baseline_pairs"):
        assert out[v].scalars["force_maxdiff_rel"] <= 1e-5, v
        assert out[v].scalars["force_mae"] == pytest.approx(out["baseline_schnet"].scalars["force_mae"], rel=1e-5)
    for v in ("flashschnet", "baseline_schnet", "flash_recompute", "flash_pairs", "baseline_pairs"):
        assert out[v].scalars["speedup"] > 0 and out[v].scalars["speedup_wall"] > 0, v
        assert len(out[v].curves["speedup_rounds"][1]) == 2
    assert out["flashschnet_fp16w"].scalars["force_maxdiff_rel"] > 1e-5   # identical_forces' control
    for v in ("flashschnet_w16a16", "flashschnet_fp16w"):
        assert 0 < out[v].scalars["quant_force_err"] < 1e-2
    assert out["flashschnet"].curves["peak_mem_mb"][0] == [1.0, 2.0]
    assert np.isfinite(out["baseline_schnet"].scalars["nve_drift"]) and "nve_drift" not in out["flash_pairs"].scalars
    assert out["baseline_schnet"].scalars["train_steps"] == 2
    for v in variants:  # the convergence gate reads the shared training curve and its rate in every variant
        assert "train_val_force_mae" in out[v].curves and "train_lr" in out[v].curves
    for k in ("md_rg", "md_bond_mean", "md_bond_width", "md_contacts"):
        assert out["flashschnet_w16a16"].scalars[k] == pytest.approx(out["flashschnet"].scalars[k], rel=1e-3)
        assert out["flashschnet"].scalars[k + "_sem"] > 0
    assert out["flashschnet"].scalars["md_decorrelation"] > 0
    ctrl = out["flashschnet_int2w"]  # the controls: force error and observables only
    assert ctrl.scalars["quant_force_err"] > out["flashschnet_int4w"].scalars["quant_force_err"] \
        > out["flashschnet_w16a16"].scalars["quant_force_err"]
    assert "md_rg" in ctrl.scalars and "peak_mem_mb" not in ctrl.curves and "nve_drift" not in ctrl.scalars
