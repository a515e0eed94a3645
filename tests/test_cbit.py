"""CBiT numerics: what each model may and may not see, and the shared training objective.

Structural facts of the algorithm that a wrong implementation breaks:
* CBiT is conditional temporal inference: the imputation of partition k depends on the long past
  (through the compressed memory), on the previous partition's observed entries (raw left context), on
  partition k and on the observed look-ahead partition k+1, and on nothing later; the memory really
  carries information across many partitions; one positional code runs across the partitions; the
  memory-less ablation sees nothing older than partition k - 1, and its batched partitions are the
  same maths as the loop.
* Boundary holes: a planted series whose hidden steps at a partition boundary are a copy of their left
  neighbour: trained briefly, CBiT imputes them at the noise floor, while the reading of the earlier
  rounds (no raw left context, the positional code restarted per partition) stays at E|x| ~ 0.8.
* SAITS' diagonal masking: no step attends to itself; hidden values never enter.
* BRITS' delta is the closed-form time since the last observation.
* BRITS' two directions in one loop are the same maths as two plain nn.GRUCell RITS; time reversal
  with swapped directions reverses the output.
* The MIT + ORT objective has zero gradient on entries that are neither shown nor hidden.
* Linear time (a property of the construction, so a test and not a claim): CBiT's FLOPs are affine in
  T and every encoder call sees S + 3 chunk tokens; global attention (SAITS) is super-linear.
* Planted signal: trained through the pipeline's own ``fit``, every learned model recovers a hidden
  channel that is a known function of an observed white-noise channel (linear interpolation cannot).
* Planted temporal inference: (a) a level shown in the first two partitions and hidden in the later
  ones, which in partition 3 (beyond the raw left context) only the history memory can carry: a briefly trained CBiT beats the same model without
  memory (``cbit_nomem``) by a wide margin; (b) an AR(1) series with phi = -0.8 and isolated holes, whose
  optimal imputation is known in closed form (phi / (1 + phi^2) x the sum of the two neighbours): a
  briefly trained CBiT comes within 10 % of the optimal MAE (linear interpolation is 4x worse).
* The test windows' masks: every window has hidden entries, random holes hide an exact fraction,
  masks are a function of the generator only; per-window MAE / RMSE.
* The per-series gap length: the quarter-cycle rule finds a planted 52-step cycle (gap 13) and declines
  on series without a cycle; each series' block holes (test, validation, training) have its own length.
* The cheaper paths are the same maths: fused attention and CBiT's written-out memory update equal
  the explicit attention and nn.MultiheadAttention; ``fit`` trains at the config's ``lr`` table (and
  lr_grid.py pilots the grid).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.methods.cbit import models  # noqa: E402
from reprozoo.methods.cbit.method import train_windows  # noqa: E402


def _inputs(T=64, C=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, T, C, generator=g)
    m = (torch.rand(1, T, C, generator=g) > 0.3).float()
    return x, m


def test_cbit_sees_no_further_than_one_partition_ahead():
    torch.manual_seed(0)
    net = models.CBiT(3, d=16, heads=2, chunk=8, slots=2).eval()
    x, m = _inputs()
    y = net(x, m)["impute"]
    x2 = x.clone()
    x2[:, 40:] += 5.0  # partitions 5..7
    y2 = net(x2, m)["impute"]
    # partitions 0..3 (steps < 32) cannot see partition 5; partition 4 sees it as look-ahead
    assert torch.allclose(y[:, :32], y2[:, :32], atol=1e-6)
    assert (y[:, 32:40] - y2[:, 32:40]).abs().max() > 1e-4


def test_cbit_history_memory_carries_information_across_partitions():
    torch.manual_seed(0)
    net = models.CBiT(3, d=16, heads=2, chunk=8, slots=2).eval()
    x, m = _inputs()
    x2 = x.clone()
    x2[:, :8] += 5.0  # only partition 0 changes
    d = (net(x, m)["impute"] - net(x2, m)["impute"]).abs()
    assert d[:, 48:].max() > 1e-5  # 6 partitions later, only through the compressed memory


def test_cbit_sees_the_previous_partition_raw_and_nothing_older_without_memory():
    """The historical context of partition k is the compressed memory and the raw observed entries of
    partition k - 1. Without memory (cbit_nomem) partition k depends on partition k - 1 and on nothing
    older; the earlier reading (lookback=False) gave partition k no raw left context at all."""
    x, m = _inputs()
    x2 = x.clone()
    x2[:, 16:24] += 5.0  # partition 2 (chunk 8)
    for lookback, left in ((True, True), (False, False)):
        torch.manual_seed(0)
        net = models.CBiT(3, d=16, heads=2, chunk=8, slots=2, memory=False, lookback=lookback).eval()
        d = (net(x, m)["impute"] - net(x2, m)["impute"]).abs()
        assert d[:, :8].max() < 1e-6  # partition 0 sees partition 1 as look-ahead, never partition 2
        assert d[:, 8:24].max() > 1e-4  # partition 1 (look-ahead) and 2 (itself)
        assert (d[:, 24:32].max() > 1e-4) == left  # partition 3: partition 2 is its left context
        assert d[:, 32:].max() < 1e-6  # nothing older than k - 1 without the memory


def test_cbit_positional_code_runs_across_partitions():
    """One positional code over the sequence: the token of step t carries pos(t + chunk) (the empty
    partition in front takes positions 0..chunk-1), not the code of its place inside the partition."""
    torch.manual_seed(0)
    net = models.CBiT(3, d=16, heads=2, chunk=8, slots=2).eval()
    x, m = _inputs(T=32)
    with torch.no_grad():
        tok = net.tokens(x, m).reshape(1, -1, 16)
        e = net.embed(torch.nn.functional.pad(torch.cat([x * m, m], -1), (0, 0, 8, 8)))
    assert torch.allclose(tok - e, models.sinusoid(48, 16)[None], atol=1e-6)
    old = models.CBiT(3, d=16, heads=2, chunk=8, slots=2, lookback=False).eval()
    with torch.no_grad():
        tok = old.tokens(x, m).reshape(1, -1, 16)
        e = old.embed(torch.nn.functional.pad(torch.cat([x * m, m], -1), (0, 0, 8, 8)))
    assert torch.allclose(tok - e, models.sinusoid(8, 16).repeat(6, 1)[None], atol=1e-6)


def test_cbit_nomem_batched_partitions_are_the_loop():
    """cbit_nomem runs its independent partitions as one batch: the same outputs (and gradients) as
    the encoder called partition by partition."""
    torch.manual_seed(0)
    net = models.CBiT(3, d=16, heads=2, chunk=8, slots=2, memory=False)
    x, m = _inputs(T=37)
    y = net(x, m)["impute"]
    tok = net.tokens(x, m)
    mem = net.mem0.expand(1, 2, -1)
    outs = []
    for k in range(tok.shape[1] - 2):
        z = net._window(mem, tok, k)
        for layer in net.enc:
            z, _ = layer(z)
        outs.append(z[:, 2 + 8:2 + 16])
    ref = net.out(torch.cat(outs, 1)[:, :37])
    assert torch.allclose(y, ref, atol=1e-5)
    g = torch.autograd.grad(y.sum(), net.embed.weight)[0]
    g_ref = torch.autograd.grad(ref.sum(), net.embed.weight)[0]
    assert torch.allclose(g, g_ref, atol=1e-4)


def test_cbit_handles_lengths_not_multiple_of_chunk():
    net = models.CBiT(2, d=16, heads=2, chunk=8, slots=2).eval()
    x, m = _inputs(T=37, C=2)
    assert net(x, m)["impute"].shape == (1, 37, 2)


def test_saits_attention_is_diagonally_masked():
    torch.manual_seed(0)
    layer = models.AttnLayer(16, 2)
    z = torch.randn(2, 12, 16)
    _, a = layer(z, block_diag=True)
    assert torch.allclose(torch.diagonal(a, dim1=1, dim2=2), torch.zeros(2, 12))
    assert torch.allclose(a.sum(-1), torch.ones(2, 12), atol=1e-6)
    _, a_full = layer(z, block_diag=False)
    assert torch.diagonal(a_full, dim1=1, dim2=2).min() > 0


def test_saits_hidden_value_does_not_leak():
    torch.manual_seed(0)
    net = models.SAITS(3, d=16, heads=2).eval()
    x, m = _inputs(T=20)
    x2 = x.clone()
    x2[m == 0] += 3.0  # values the model is told are missing
    assert torch.allclose(net(x * m, m)["impute"], net(x2 * m, m)["impute"])


def test_brits_time_gaps_closed_form():
    m = torch.tensor([[1, 0, 0, 1, 0, 1]], dtype=torch.float32)[..., None]
    d = models.time_gaps(m)[0, :, 0].tolist()
    assert d == [0, 1, 2, 3, 1, 2]  # BRITS Eq. 1: delta_t = s_t - s_{t-1} + delta_{t-1} if m_{t-1} = 0


class _ReferenceRITS(torch.nn.Module):
    """BRITS' RITS written plainly, one direction, with nn.GRUCell (the maths of Cao et al. 2018)."""

    def __init__(self, C, d):
        super().__init__()
        self.cell = torch.nn.GRUCell(2 * C, d)
        self.decay_h, self.decay_x = torch.nn.Linear(C, d), torch.nn.Linear(C, C)
        self.hist, self.feat = torch.nn.Linear(d, C), torch.nn.Linear(C, C)
        self.combine = torch.nn.Linear(2 * C, C)
        self.d = d

    def load_direction(self, net, k):
        C = net.C
        with torch.no_grad():
            self.cell.weight_ih.copy_(net.w_ih[k]); self.cell.bias_ih.copy_(net.b_ih[k, 0])
            self.cell.weight_hh.copy_(net.w_hh[k]); self.cell.bias_hh.copy_(net.b_hh[k, 0])
            self.decay_h.weight.copy_(net.w_dh[k]); self.decay_h.bias.copy_(net.b_dh[k, 0, 0])
            self.decay_x.weight.copy_(torch.diag(net.w_dx[k])); self.decay_x.bias.copy_(net.b_dx[k, 0, 0])
            self.hist.weight.copy_(net.w_hist[k]); self.hist.bias.copy_(net.b_hist[k, 0])
            self.feat.weight.copy_(net.w_feat[k] * (1 - torch.eye(C))); self.feat.bias.copy_(net.b_feat[k, 0])
            self.combine.weight.copy_(net.w_comb[k]); self.combine.bias.copy_(net.b_comb[k, 0, 0])
        return self

    def forward(self, x, m):
        B, T, C = x.shape
        delta = models.time_gaps(m)
        h = x.new_zeros(B, self.d)
        out = []
        for t in range(T):
            h = h * torch.exp(-torch.relu(self.decay_h(delta[:, t])))
            gx = torch.exp(-torch.relu(self.decay_x(delta[:, t])))
            xh = self.hist(h)
            xc = m[:, t] * x[:, t] + (1 - m[:, t]) * xh
            zh = self.feat(xc)
            a = torch.sigmoid(self.combine(torch.cat([gx, m[:, t]], -1)))
            ch = a * zh + (1 - a) * xh
            out.append(ch)
            cc = m[:, t] * x[:, t] + (1 - m[:, t]) * ch
            h = self.cell(torch.cat([cc, m[:, t]], -1), h)
        return torch.stack(out, 1)


def test_brits_fused_directions_match_two_plain_rits():
    """One loop for both directions is the same maths as two nn.GRUCell RITS (forward on x, backward
    on the time-reversed x), output, auxiliary estimates and gradients alike."""
    torch.manual_seed(0)
    net = models.BRITS(3, d=8)
    x, m = _inputs(T=15, C=3)
    out = net(x * m, m)
    ref_f = _ReferenceRITS(3, 8).load_direction(net, 0)
    ref_b = _ReferenceRITS(3, 8).load_direction(net, 1)
    yf = ref_f(x * m, m)
    yb = ref_b((x * m).flip(1), m.flip(1)).flip(1)
    assert torch.allclose(out["aux"][0], yf, atol=1e-5)
    assert torch.allclose(out["aux"][1], yb, atol=1e-5)
    assert torch.allclose(out["impute"], (yf + yb) / 2, atol=1e-5)
    g = torch.autograd.grad(out["impute"].sum(), net.w_hh)[0]
    gf = torch.autograd.grad(yf.sum() / 2, ref_f.cell.weight_hh)[0]
    assert torch.allclose(g[0], gf, atol=1e-5)


def test_brits_is_time_reversal_symmetric():
    """Swapping the two directions' weights and reversing time reverses the imputation."""
    torch.manual_seed(0)
    net = models.BRITS(2, d=8).eval()
    x, m = _inputs(T=12, C=2)
    swapped = models.BRITS(2, d=8).eval()
    with torch.no_grad():
        for a, b in zip(swapped.parameters(), net.parameters()):
            a.copy_(b.flip(0))
    y = net(x * m, m)["impute"]
    y_rev = swapped((x * m).flip(1), m.flip(1))["impute"].flip(1)
    assert torch.allclose(y, y_rev, atol=1e-6)


def test_objective_ignores_entries_neither_shown_nor_hidden():
    x = torch.randn(1, 10, 2)
    seen = torch.zeros(1, 10, 2)
    seen[:, :4] = 1
    hidden = torch.zeros(1, 10, 2)
    hidden[:, 4:7] = 1  # steps 7..9: truly unknown
    y = torch.zeros(1, 10, 2, requires_grad=True)
    loss = models.loss_fn({"impute": y, "aux": []}, x, seen, hidden)
    (g,) = torch.autograd.grad(loss, y)
    assert g[:, 7:].abs().max() == 0
    assert g[:, :7].abs().min() > 0
    # value: ORT (MAE on seen) + MIT (MAE on hidden) with y = 0
    expect = x[:, :4].abs().mean() + x[:, 4:7].abs().mean()
    assert torch.isclose(loss, expect)


def test_training_holes_are_disjoint_from_the_shown_entries():
    rng = np.random.default_rng(0)
    trains = [np.random.default_rng(1).standard_normal((200, 3))]
    known = [np.ones((200, 3), dtype=bool)]
    known[0][50:60] = False
    x, seen, hidden = train_windows(rng, trains, known, 64, 32, 4)
    assert not (seen & hidden).any()
    frac = hidden.mean()
    assert 0.15 < frac < 0.5  # rate ~ U(0.1, 0.6): mean 0.35 of the known entries


# --- linear time: a property of the construction, so a test rather than a claim ------------------

def _flops(net, T, C=3):
    from torch.utils.flop_counter import FlopCounterMode

    x, m = _inputs(T=T, C=C)
    with FlopCounterMode(display=False) as fc:
        net(x * m, m)
    return fc.get_total_flops()


def test_cbit_cost_is_linear_in_length_and_saits_is_not():
    """CBiT's floating-point work is affine in T (equal increments for equal steps in length: a fixed
    cost per partition), and every encoder call sees the same S + 3 x chunk tokens (memory, left context,
    target, look-ahead) whatever T is.
    Global attention (SAITS) over the same lengths grows faster than linearly."""
    torch.manual_seed(0)
    net = models.CBiT(3, d=16, heads=2, chunk=8, slots=2).eval()
    f = [_flops(net, T) for T in (32, 64, 96, 128)]
    steps = np.diff(f)
    assert steps[0] > 0 and np.all(steps == steps[0])
    seen = []
    hook = net.enc[0].register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    for T in (32, 128):
        with torch.no_grad():
            net(*_inputs(T=T))
    hook.remove()
    assert set(seen) == {(1, 2 + 3 * 8, 16)} and len(seen) == 32 // 8 + 128 // 8
    saits = models.SAITS(3, d=16, heads=2).eval()
    g = np.diff([_flops(saits, T) for T in (32, 64, 96, 128)])
    assert np.all(np.diff(g) > 0)  # increments grow: super-linear


# --- planted signal: the trained model must recover a known function of the observed entries -----

def _planted(T, rng):
    """Channel 0 white noise (no temporal structure: interpolation in time cannot help); channel 1 =
    -0.8 x channel 0 (+ small noise): its hidden values are a known function of channel 0."""
    a = rng.standard_normal(T)
    return np.stack([a, -0.8 * a + 0.05 * rng.standard_normal(T)], 1)


@pytest.mark.parametrize("variant", ["cbit", "brits", "saits"])
def test_trained_model_recovers_planted_cross_channel_signal(variant):
    from reprozoo.blocks.imputation import linear_interpolation
    from reprozoo.methods.cbit.method import fit, impute_learned, windows
    from reprozoo.runtime import RunContext

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the pipeline: small ops, one thread is fastest
    rng = np.random.default_rng(0)
    params = dict(window=32, batch=16, block=4, d_model=16, heads=2, layers=1, chunk=8, slots=2,
                  fit=dict(lr_grid=[1e-2], pilot_steps=20, eval_every=20, min_steps=100, max_steps=200,
                           flat_tol=0.02, warmup=10, clip=1.0, lr_drop=0))
    ctx = RunContext(method="cbit", variant=variant, seed=0, scale="ci", params=params, data={}, outdir=None)
    ds = {"train": [_planted(2000, rng)], "obs_train": [np.ones((2000, 2), bool)],
          "val": _planted(128, rng), "obs_val": np.ones((128, 2), bool)}
    try:
        model, rec = fit(ctx, variant, "planted", ds)
    finally:
        torch.set_num_threads(threads)
    xw = windows(_planted(320, rng), 32)
    seen = np.ones_like(xw, dtype=bool)
    seen[:, :, 1] = rng.random(xw.shape[:2]) >= 0.3  # channel 1 hidden at random, channel 0 all observed
    hid = ~seen
    y = impute_learned(model, xw, seen)
    mae = np.abs(y - xw)[hid].mean()
    lin = np.stack([linear_interpolation(xw[i], seen[i]) for i in range(len(xw))])
    mae_lin = np.abs(lin - xw)[hid].mean()
    assert mae_lin > 0.7  # the planted channel is unpredictable in time
    assert mae < 0.25 * mae_lin, (variant, mae, mae_lin, rec["stop"])
    assert np.array_equal(y[seen], xw[seen])  # observed entries are returned unchanged
    untrained = models.build(variant, 2, params).eval()
    assert np.abs(impute_learned(untrained, xw, seen) - xw)[hid].mean() > 2 * mae  # the training did it


def test_fit_trains_at_the_config_rate_table_and_lr_grid_pilots_the_grid():
    """The smoke config fixes each model's rate per series (``lr:``, chosen once on validation by
    lr_grid.py): ``fit`` then trains at that rate alone; given a grid (lr_grid.py) it pilots the grid."""
    from reprozoo.methods.cbit.method import fit
    from reprozoo.runtime import RunContext

    rng = np.random.default_rng(0)
    params = dict(window=16, batch=4, block=4, d_model=8, heads=2, layers=1, chunk=8, slots=2,
                  fit=dict(lr_grid=[1e-2, 3e-2], pilot_steps=2, eval_every=2, min_steps=4, max_steps=4,
                           flat_tol=0.02, lr_drop=0),
                  lr={"saits": {"planted": 3e-3}})
    ctx = RunContext(method="cbit", variant="saits", seed=0, scale="ci", params=params, data={}, outdir=None)
    ds = {"train": [_planted(200, rng)], "obs_train": [np.ones((200, 2), bool)],
          "val": _planted(32, rng), "obs_val": np.ones((32, 2), bool)}
    _, rec = fit(ctx, "saits", "planted", ds)
    assert rec["lr"] == 3e-3 and list(rec["pilot_best"]) == [3e-3]
    _, rec = fit(ctx, "saits", "planted", ds, lr_grid=params["fit"]["lr_grid"])
    assert sorted(rec["pilot_best"]) == [1e-2, 3e-2]
    with pytest.raises(KeyError):
        fit(ctx, "saits", "other", ds)


def test_fused_attention_paths_are_the_explicit_maths():
    """The cheaper paths (scaled_dot_product_attention without weights; CBiT's memory update written
    out with nn.MultiheadAttention's own weights) compute what the explicit attention computes."""
    torch.manual_seed(0)
    net = models.CBiT(3, d=16, heads=2, chunk=8, slots=2)
    mem, h = torch.randn(4, 2, 16), torch.randn(4, 8, 16)
    ref, _ = net.compress(mem, h, h, need_weights=False)
    assert torch.allclose(net._compress(mem, h), ref, atol=1e-6)
    z = torch.randn(4, 18, 16)
    for diag in (False, True):
        a, w = net.enc[0](z, block_diag=diag, need_weights=True)
        b, _ = net.enc[0](z, block_diag=diag, need_weights=False)
        assert torch.allclose(a, b, atol=1e-5)
        if diag:
            assert torch.all(torch.diagonal(w, dim1=-2, dim2=-1) == 0)


# --- test windows and masks ---------------------------------------------------------------------

def test_window_masks_give_every_window_hidden_entries_and_exact_random_rate():
    from reprozoo.methods.cbit.method import window_errors, window_masks

    rng = np.random.default_rng(0)
    known = np.ones((20, 48, 1), bool)
    known[3, 10:20] = False  # a real gap: never shown, never scored
    for pattern in ("random", "block"):
        for rate in (0.1, 0.3, 0.5):
            seen = window_masks(known.shape, known, pattern, rate, 8, np.random.default_rng(1))
            again = window_masks(known.shape, known, pattern, rate, 8, np.random.default_rng(1))
            assert np.array_equal(seen, again)  # a function of the generator only
            ev = known & ~seen
            assert ev.reshape(20, -1).sum(1).min() >= 1 and not (seen & ~known).any()
            if pattern == "random":
                want = np.round(rate * known.reshape(20, -1).sum(1))
                assert np.array_equal(ev.reshape(20, -1).sum(1), want)
    x = rng.standard_normal((20, 48, 1))
    y = x.copy()
    y[ev] += 1.0
    mae, rmse = window_errors(y, x, ev)
    assert np.allclose(mae, 1.0) and np.allclose(rmse, 1.0) and mae.shape == (20,)


# --- planted temporal inference -----------------------------------------------------------------

def _train_briefly(net, batches, steps, lr=1e-2, drop_at=None):
    """A plain Adam loop on the shared objective (batches: a function step -> (x, seen, hidden)); with
    ``drop_at``, the rate drops to a tenth from that step on (as the shared rule's one drop)."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for s in range(steps):
        if s == drop_at:
            for group in opt.param_groups:
                group["lr"] = lr / 10
        x, seen, hid = batches(s)
        loss = models.loss_fn(net(x * seen, seen), x, seen, hid)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    return net.eval()


def _level_batch(g, n, T=64, shown=32):
    """A level a ~ U(-1.5, 1.5) per window (+ small noise), shown in steps < ``shown`` (partitions 0-1
    at chunk 16) and hidden in all later steps (partitions 2-3)."""
    a = 3 * torch.rand(n, 1, 1, generator=g) - 1.5
    x = a + 0.05 * torch.randn(n, T, 1, generator=g)
    seen = torch.zeros(n, T, 1)
    seen[:, :shown] = 1
    return x, seen, 1 - seen


def test_history_memory_carries_a_level_that_only_the_past_shows():
    """Partitions 2-3 are wholly hidden; their value was shown only in partitions 0-1. Scored on partition
    3, whose raw context (partitions 2 and 4, both hidden or empty) shows nothing: CBiT's memory can carry
    the level forward; without memory partition 3 sees only hidden partitions, so the best it can do is
    the mean level (MAE ~ 0.75). (Partition 2 sees partition 1 raw as its left context, so both models
    may impute it.) Same initial weights, batches and steps for both."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        errs = {}
        for variant in ("cbit", "cbit_nomem"):
            torch.manual_seed(0)
            net = models.build(variant, 1, dict(d_model=16, heads=2, chunk=16, slots=2, layers=1))
            g = torch.Generator().manual_seed(1)
            _train_briefly(net, lambda s: _level_batch(g, 32), 250)
            x, seen, hid = _level_batch(torch.Generator().manual_seed(2), 256)
            with torch.no_grad():
                y = net(x * seen, seen)["impute"]
            errs[variant] = float((y - x).abs()[:, 48:].mean())  # partition 3 (all hidden)
    finally:
        torch.set_num_threads(threads)
    assert errs["cbit_nomem"] > 0.6, errs  # no information about the level: about E|a| = 0.75
    assert errs["cbit"] < 0.4 * errs["cbit_nomem"], errs


def _ar1_batch(g, n, T=32, phi=-0.8):
    """AR(1) windows x_t = phi x_{t-1} + e_t (unit innovations, stationary start); holes only at steps
    t = 2 mod 4 (half of them, at random), so both neighbours of every hole are observed and lie in the
    same partition (chunk 16)."""
    x = torch.empty(n, T)
    x[:, 0] = torch.randn(n, generator=g) / (1 - phi ** 2) ** 0.5
    e = torch.randn(n, T, generator=g)
    for t in range(1, T):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    hid = torch.zeros(n, T)
    cand = torch.arange(T) % 4 == 2
    hid[:, cand] = (torch.rand(n, int(cand.sum()), generator=g) < 0.5).float()
    return x[..., None], (1 - hid)[..., None], hid[..., None]


def test_cbit_approaches_the_known_optimal_imputation_of_an_ar1_series():
    """For an AR(1) process the hidden x_t given everything else depends only on its two neighbours:
    E[x_t | x_t-1, x_t+1] = phi / (1 + phi^2) (x_t-1 + x_t+1), a Gaussian with variance 1 / (1 + phi^2).
    With phi = -0.8 the optimum's MAE is about 0.62, predicting the mean gives about 1.33 and linear
    interpolation (coefficient +1/2 instead of -0.49) about 2.5. A briefly trained CBiT must come within
    10 % of the optimum on the same holes (and cannot beat it beyond sampling noise)."""
    phi = -0.8
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        net = models.build("cbit", 1, dict(d_model=16, heads=2, chunk=16, slots=2, layers=1))
        g = torch.Generator().manual_seed(1)
        _train_briefly(net, lambda s: _ar1_batch(g, 64), 600, drop_at=450)
    finally:
        torch.set_num_threads(threads)
    x, seen, hid = _ar1_batch(torch.Generator().manual_seed(2), 256)
    with torch.no_grad():
        y = net(x * seen, seen)["impute"]
    h = hid[..., 0] > 0
    xs = x[..., 0]
    opt = phi / (1 + phi ** 2) * (torch.roll(xs, 1, 1) + torch.roll(xs, -1, 1))  # holes never at the edges
    lin = 0.5 * (torch.roll(xs, 1, 1) + torch.roll(xs, -1, 1))
    mae_opt = float((opt - xs).abs()[h].mean())
    mae = float((y[..., 0] - xs).abs()[h].mean())
    mae_lin = float((lin - xs).abs()[h].mean())
    assert 0.55 < mae_opt < 0.7 and mae_lin > 3 * mae_opt  # the planted case is what it claims to be
    assert 0.95 * mae_opt < mae < 1.10 * mae_opt, (mae, mae_opt)


def _rows(a, d):
    """The set of raw (un-z-scored) rows of a (T, C) array of dataset d, rounded: segments compared by
    content across seeds (each seed z-scores with its own training statistics)."""
    return {tuple(r) for r in np.round(np.asarray(a) * d["sd"] + d["mu"], 6)}


def test_rate_pilot_reads_no_test_data_of_any_seed(monkeypatch):
    """The rates are chosen once by lr_grid.py's pilots on seed 0 (configs/smoke.yaml ``lr:``). Those
    pilots read seed 0's validation and training data; neither may share a single sample with the test
    segment of any seed of the scale (a review found the Lorenz-96 validation trajectory of seed s was
    the test trajectory of seed s + 1). Each stored sample is made unique (x00 = 10^4 traj + step), so a
    shared row is a shared sample. Also each seed's own training and validation data miss its test data."""
    import pandas as pd
    import yaml
    from pathlib import Path

    from reprozoo.data.timeseries import lorenz96, statsmodels_series
    from reprozoo.methods.cbit.method import load_series
    from reprozoo.runtime import RunContext

    params = yaml.safe_load((Path(models.__file__).parent / "configs" / "smoke.yaml").read_text())
    params["detrend"] = {}  # the trend is an affine map of time; without it each value stays unique
    n_traj, n_steps = 8, 4000  # as the smoke data
    rows = []
    for t in range(n_traj):
        step = np.arange(n_steps)
        rows.append(pd.DataFrame({"traj": t, "step": step, "t": 0.05 * step,
                                  **{f"x{c:02d}": 1e4 * t + step + 0.1 * c for c in range(2)}}))
    clean = pd.concat(rows, ignore_index=True)
    co2 = np.arange(2284, dtype=float)
    co2[::37] = np.nan
    monkeypatch.setattr(lorenz96, "load", lambda path: {"clean": clean})
    monkeypatch.setattr(statsmodels_series, "load", lambda path: {"co2": pd.DataFrame({"co2": co2})})
    data = {"ts_lorenz96": Path("x"), "ts_statsmodels": Path("x")}

    def ds(seed, pilot=None):
        ctx = RunContext(method="cbit", variant="cbit", seed=seed, scale="smoke", params=params, data=data,
                         outdir=None)
        return {n: load_series(ctx, n, pilot_seeds=pilot) for n in ("co2", "lorenz96")}

    pilot = ds(0, pilot=params["seeds"])  # what lr_grid.py reads
    for s in range(7):  # more seeds than the smoke's three: a seed's own fit is clean for up to 7
        own = ds(s)
        for n in ("co2", "lorenz96"):
            o, p = own[n], pilot[n]
            test = _rows(o["test"][o["obs_test"].all(1)], o)
            assert len(test) > 100
            if s in params["seeds"]:
                seen_by_pilot = _rows(p["val"], p) | set().union(*(_rows(a, p) for a in p["train"]))
                assert not test & seen_by_pilot, (n, s)
            seen_by_fit = _rows(o["val"], o) | set().union(*(_rows(a, o) for a in o["train"]))
            assert not test & seen_by_fit, (n, s)
    # the Lorenz-96 test window still moves with the seed (a new trajectory per seed), and the guard is not
    # vacuous: seed 0's pipeline fit (no pilot_seeds) trains on seed 1's test trajectory
    d0, d1 = ds(0)["lorenz96"], ds(1)["lorenz96"]
    t1 = _rows(d1["test"], d1)
    assert not _rows(d0["test"], d0) & t1
    assert t1 & set().union(*(_rows(a, d0) for a in d0["train"]))


# --- the per-series gap length (block holes) ------------------------------------------------------

def test_quarter_cycle_rule_finds_a_planted_cycle_and_declines_without_one():
    """The gap rule reads training data only: a planted 52-step cycle plus noise (split into runs with
    a real gap, as CO2's training runs) gives a 13-step gap; white noise and a fast-decorrelating
    AR(1) series have no clear cycle, so the rule does not apply (None)."""
    from reprozoo.methods.cbit.method import quarter_cycle_gap

    rng = np.random.default_rng(0)
    t = np.arange(1400)
    x = np.sin(2 * np.pi * t / 52 + 0.7) + 0.2 * rng.standard_normal(len(t))
    runs = [x[a:b, None] for a, b in ((0, 96), (144, 288), (336, 480), (528, 1400))]
    obs = [np.ones_like(r, dtype=bool) for r in runs]
    obs[3][50:60] = False  # a real gap inside a run is skipped, not read as zeros
    runs[3][50:60] = 0.0
    gap, period, acf = quarter_cycle_gap(runs, obs)
    assert period in (51, 52, 53) and gap == 13 and acf > 0.8
    y = rng.standard_normal((1400, 1))
    assert quarter_cycle_gap([y], [np.ones_like(y, dtype=bool)])[0] is None
    z = np.zeros((1400, 1))
    for i in range(1, 1400):
        z[i] = 0.6 * z[i - 1] + rng.standard_normal()
    assert quarter_cycle_gap([z], [np.ones_like(z, dtype=bool)])[0] is None


def test_each_series_gets_its_own_gap_length_in_test_validation_and_training_holes():
    """`block: {series: length}`: CO2's block holes are 13 steps, Lorenz-96's 8, in the test masks, the
    validation masks and the training batches alike; a bare number is one length for every series;
    a series missing from the table is an error, not a silent default."""
    from reprozoo.methods.cbit.method import gap_length, test_masks, val_masks
    from reprozoo.runtime import RunContext

    def runs_of_hidden(seen):  # lengths of the maximal runs of hidden steps per window and channel
        out = []
        for w in range(seen.shape[0]):
            for c in range(seen.shape[2]):
                h = np.r_[False, ~seen[w, :, c], False].astype(int)
                d = np.diff(h)
                out += list(np.flatnonzero(d == -1) - np.flatnonzero(d == 1))
        return np.array(out)

    params = dict(block={"co2": 13, "lorenz96": 8}, rates=[0.1, 0.3, 0.5])
    assert gap_length(params, "co2") == 13 and gap_length(params, "lorenz96") == 8
    assert gap_length(dict(block=8), "co2") == 8
    with pytest.raises(KeyError):
        gap_length(params, "sunspots")
    ctx = RunContext(method="cbit", variant="linear", seed=0, scale="ci", params=params, data={}, outdir=None)
    shape = (12, 48, 2)
    known = np.ones(shape, bool)
    for name, g in (("co2", 13), ("lorenz96", 8)):
        masks = test_masks(ctx, name, shape, known)
        lens = runs_of_hidden(masks[("block", 0.1)][0])
        assert lens.min() >= g and (lens == g).mean() > 0.5  # one gap of g steps per window and channel
        assert runs_of_hidden(val_masks(ctx, name, shape, known)[1][0]).min() >= g
    # training batches: `fit` draws its artificial block holes with the series' own length
    import reprozoo.methods.cbit.method as M

    seen_blocks = []
    real = M.train_windows

    def spy(rng, trains, otrains, n, W, block):
        seen_blocks.append(block)
        return real(rng, trains, otrains, n, W, block)

    rng = np.random.default_rng(0)
    fparams = dict(params, window=16, batch=4, d_model=8, heads=2, layers=1, chunk=8, slots=2,
                   block={"planted": 5}, fit=dict(lr_grid=[1e-2], pilot_steps=2, eval_every=2, min_steps=4,
                                                  max_steps=4, flat_tol=0.02, lr_drop=0))
    fctx = RunContext(method="cbit", variant="saits", seed=0, scale="ci", params=fparams, data={}, outdir=None)
    ds = {"train": [_planted(200, rng)], "obs_train": [np.ones((200, 2), bool)],
          "val": _planted(32, rng), "obs_val": np.ones((32, 2), bool)}
    try:
        M.train_windows = spy
        M.fit(fctx, "saits", "planted", ds)
    finally:
        M.train_windows = real
    assert seen_blocks and set(seen_blocks) == {5}


def _pair_batch(g, n, T=48, L=16, p=0.5):
    """i.i.d. N(0, 1) values, each held for two steps (2j + 1, 2j + 2) (+ noise 0.05): the pairs (15, 16)
    and (31, 32) straddle the partition boundaries (chunk 16). The second step of a pair is hidden at
    random (p), and always at a boundary; its only information is its left neighbour."""
    v = torch.randn(n, T // 2 + 1, 1, generator=g)
    x = v[:, (torch.arange(T) + 1) // 2] + 0.05 * torch.randn(n, T, 1, generator=g)
    hid = torch.zeros(n, T, 1)
    second = (torch.arange(T) % 2 == 0) & (torch.arange(T) > 0)
    hid[:, second] = (torch.rand(n, int(second.sum()), 1, generator=g) < p).float()
    hid[:, L::L] = 1
    return x, 1 - hid, hid


def test_boundary_holes_need_the_left_neighbour():
    """Hidden steps on a partition boundary whose value is their left neighbour's (in the previous
    partition). CBiT, with the previous partition's raw observed entries as context, learns to copy it
    (MAE near the noise floor, 0.05 x sqrt(2) x 0.8 ~ 0.06); the earlier rounds' reading, which saw the
    past only through the memory slots, stays near E|x| ~ 0.8 at the boundaries on the same weights'
    seed, batches and steps (probe: 0.063 against 0.80 at 600 steps; at 400 neither has learned)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    errs = {}
    try:
        for lookback in (True, False):
            torch.manual_seed(0)
            net = models.CBiT(1, d=16, heads=2, chunk=16, slots=2, lookback=lookback)
            g = torch.Generator().manual_seed(1)
            _train_briefly(net, lambda s: _pair_batch(g, 32), 600, drop_at=450)
            x, seen, hid = _pair_batch(torch.Generator().manual_seed(2), 256)
            with torch.no_grad():
                y = net(x * seen, seen)["impute"]
            errs[lookback] = float((y - x).abs()[:, 16::16].mean())
    finally:
        torch.set_num_threads(threads)
    assert errs[True] < 0.15, errs
    assert errs[False] > 0.6, errs
