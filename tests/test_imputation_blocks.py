import numpy as np
import pytest

from reprozoo.blocks import imputation as im


def test_random_mask_rate_and_determinism():
    m1 = im.random_mask((2000, 5), 0.3, np.random.default_rng(0))
    m2 = im.random_mask((2000, 5), 0.3, np.random.default_rng(0))
    assert (m1 == m2).all() and abs((~m1).mean() - 0.3) < 0.02


def test_block_mask_makes_contiguous_gaps_at_the_rate():
    m = im.block_mask((500, 4), 0.3, 25, np.random.default_rng(1))
    assert abs((~m).mean() - 0.3) < 0.06
    # gaps are runs of at least the block length (overlaps can only lengthen them)
    for c in range(4):
        col = np.r_[True, m[:, c], True].astype(int)
        starts, ends = np.where(np.diff(col) == -1)[0], np.where(np.diff(col) == 1)[0]
        assert (ends - starts >= 25).all()


def test_bad_rate_is_a_clear_error():
    with pytest.raises(ValueError, match="missing rate"):
        im.random_mask((3, 3), 1.2, np.random.default_rng(0))


def test_linear_interpolation_is_exact_on_a_line_and_carry_forward_on_steps():
    t = np.arange(20, dtype=float)[:, None]
    x = np.hstack([2 * t + 1, np.repeat([1.0, 5.0], 10)[:, None]])
    obs = np.ones_like(x, dtype=bool)
    obs[3:9, 0] = False
    obs[[2, 3, 12, 13], 1] = False
    lin = im.linear_interpolation(np.where(obs, x, np.nan), obs)
    np.testing.assert_allclose(lin[:, 0], x[:, 0])
    cf = im.carry_forward(np.where(obs, x, np.nan), obs)
    np.testing.assert_allclose(cf[:, 1], x[:, 1])


def test_metrics_score_only_the_hidden_entries():
    truth = np.zeros((4, 2))
    pred = np.array([[1.0, 0], [0, 0], [100, 0], [0, 3.0]])
    hidden = np.zeros_like(truth, dtype=bool)
    hidden[0, 0] = hidden[3, 1] = True
    assert im.masked_mae(pred, truth, hidden) == 2.0
    assert im.masked_rmse(pred, truth, hidden) == pytest.approx(np.sqrt(5))
