"""CBiT numerics: what each model may and may not see, and the shared training objective.

Structural facts of the algorithm that a wrong implementation breaks:
* CBiT is conditional temporal inference: the imputation of partition k depends on the past (through
  the compressed memory), on partition k and on the observed look-ahead partition k+1, and on
  nothing later; and the memory really carries information across many partitions.
* SAITS' diagonal masking: no step attends to itself; hidden values never enter.
* BRITS' delta is the closed-form time since the last observation.
* The MIT + ORT objective has zero gradient on entries that are neither shown nor hidden.
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


def test_brits_backward_direction_is_reversed_forward():
    torch.manual_seed(0)
    net = models.BRITS(2, d=8).eval()
    x, m = _inputs(T=12, C=2)
    out = net(x, m)
    yb = net.b(x.flip(1), m.flip(1)).flip(1)
    assert torch.allclose(out["aux"][1], yb)
    assert torch.allclose(out["impute"], (out["aux"][0] + out["aux"][1]) / 2)


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


def test_schedule_warms_up_then_decays_to_zero_and_slope_is_per_100_steps():
    from reprozoo.methods.cbit.method import final_slope, lr_factor

    f = [lr_factor(s, 100, 0.1, "cosine") for s in range(101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warm-up over 10 steps
    assert f[10] == pytest.approx(1.0) and f[100] == pytest.approx(0.0, abs=1e-12)
    assert f[55] == pytest.approx(0.5)  # cosine half-way between step 10 and step 100
    assert all(lr_factor(s, 100, 0.0, "constant") == 1.0 for s in range(100))
    xs = list(range(0, 201, 25))
    assert final_slope(xs, [3.0 - 0.002 * x for x in xs]) == pytest.approx(-0.2)
