"""heavytail_rnn numerics: the OT projection is the optimal assignment and keeps the law exactly,
Dale signs and E/I balance, the bulk radius, the metrics on closed-form cases, the task generators'
ground truth, and a Dale RNN that learns a task through the projection."""
import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment
from scipy.stats import gamma as gamma_law
from scipy.stats import halfnorm, lognorm

from reprozoo.methods.heavytail_rnn.analysis import effective_rank, hill_tail_index, participation_ratio
from reprozoo.methods.heavytail_rnn.method import (block_mean, decision_accuracy, final_slope, lr_factor,
                                                   train_task)
from reprozoo.methods.heavytail_rnn.model import (RateRNN, block_slices, block_targets, ei_signs, gamma_shape,
                                                  ot_project_, unit_mean, unit_quantiles)
from reprozoo.methods.heavytail_rnn.tasks import make_batch


def test_unit_quantiles_are_the_laws_quantiles():
    n = 50
    u = (np.arange(n) + 0.5) / n
    for dist, ref in [("lognormal", lognorm.ppf(u, s=1.3)), ("halfnormal", halfnorm.ppf(u)),
                      ("gamma", gamma_law.ppf(u, gamma_shape(1.3)))]:
        q = unit_quantiles(dist, n, sigma_ln=1.3)
        np.testing.assert_allclose(q / q[0], ref / ref[0], rtol=1e-10)
        assert abs(np.mean(unit_quantiles(dist, 200000, sigma_ln=1.3) ** 2) - 1.0) < 0.02
        assert abs(np.mean(unit_quantiles(dist, 200000, sigma_ln=1.3)) - unit_mean(dist, 1.3)) < 1e-3


def test_gamma_law_matches_the_lognormal_in_mean_and_rms_but_not_in_the_tail():
    """The tail-only control: Gamma(k) with k = 1 / (e - 1) at log-std 1 has the log-normal's
    mean / RMS, so every block has the same mean and RMS (and the Dale matrices the same block
    means and bulk radius); its tail is exponential, so its top quantiles and Hill index differ."""
    assert np.isclose(gamma_shape(1.0), 1 / (np.e - 1))
    k = gamma_shape(1.0)
    assert np.isclose(np.sqrt(k / (k + 1)), np.exp(-0.5))  # mean / RMS of Gamma(k) = log-normal's
    n = 64
    tl, tg = block_targets(n, 0.8, "lognormal", 1.0), block_targets(n, 0.8, "gamma", 1.0)
    for a, b in zip(tl, tg):
        # block means agree to 1 %; the RMS to 5 % (169-2601 mid-point quantiles cut the log-normal's
        # tail, so its quantized RMS is 1-4 % below the law's)
        assert np.isclose(a.mean(), b.mean(), rtol=0.01)
        assert np.isclose(np.sqrt(np.mean(a**2)), np.sqrt(np.mean(b**2)), rtol=0.05)
        assert a.max() > 1.15 * b.max()  # the log-normal's largest synapse is stronger
    assert tl[0].max() > 1.6 * tg[0].max()  # E->E block (51 x 51): the tail, not the bulk, differs
    ql, qg = unit_quantiles("lognormal", 100000), unit_quantiles("gamma", 100000)
    assert hill_tail_index(ql, 0.01) < 0.8 * hill_tail_index(qg, 0.01)
    # the same initial ranks give the same block-mean part for both laws
    torch.manual_seed(3)
    ml = RateRNN(2, n, 2, "lognormal")
    torch.manual_seed(3)
    mg = RateRNN(2, n, 2, "gamma")
    Wl, Wg = (m.recurrent_weights().detach().double().numpy() for m in (ml, mg))
    np.testing.assert_allclose(block_mean(Wl, 51), block_mean(Wg, 51), rtol=0.02)
    for rows, cols in block_slices(n, 51):
        np.testing.assert_array_equal(np.argsort(ml.mag.detach()[rows, cols].numpy().ravel()),
                                      np.argsort(mg.mag.detach()[rows, cols].numpy().ravel()))


def test_lr_schedule_keeps_its_floor():
    f = [lr_factor(k, 100, 0.2) for k in range(0, 101)]
    assert np.isclose(f[0], 1.0) and np.isclose(f[-1], 0.2) and np.isclose(f[50], 0.6)
    assert np.all(np.diff(f) <= 1e-12) and min(f) >= 0.2 - 1e-12
    # decay over the first half, then constant: the gate's window (last 30 %) sees one fixed rate
    h = np.array([lr_factor(k, 1000, 0.12, 0.5) for k in range(0, 1001)])
    assert np.isclose(h[250], 0.56) and np.allclose(h[500:], 0.12) and np.all(np.diff(h) <= 1e-12)


def test_rank_matching_is_the_optimal_transport_plan():
    """1-D OT with squared cost: the monotone map has the cost of the optimal assignment
    (Hungarian algorithm on the full cost matrix) and keeps the entries' order."""
    rng = np.random.default_rng(0)
    vals = rng.normal(size=(6, 7))
    tgt = np.sort(rng.lognormal(size=42))
    mag = torch.tensor(vals)
    ot_project_(mag, [(slice(0, 6), slice(0, 7))], [torch.tensor(tgt)])
    out = mag.numpy().ravel()
    cost_rank = np.sum((vals.ravel() - out) ** 2)
    C = (vals.ravel()[:, None] - tgt[None, :]) ** 2
    r, c = linear_sum_assignment(C)
    assert np.isclose(cost_rank, C[r, c].sum(), rtol=1e-12)
    np.testing.assert_array_equal(np.argsort(out), np.argsort(vals.ravel()))
    np.testing.assert_allclose(np.sort(out), tgt)
    # a projection: applying it again changes nothing
    again = mag.clone()
    ot_project_(again, [(slice(0, 6), slice(0, 7))], [torch.tensor(tgt)])
    np.testing.assert_array_equal(again.numpy(), mag.numpy())


def test_targets_balance_ei_and_set_the_bulk_radius():
    n, g = 400, 1.0
    n_exc = int((ei_signs(n, 0.8) > 0).sum())
    for dist in ("lognormal", "gamma", "halfnormal"):
        tg = block_targets(n, 0.8, dist, g, sigma_ln=1.0)
        # expected input to a row: n_E mean(E block) - n_I mean(I block) = 0 (E/I balance)
        assert np.isclose(n_exc * tg[0].mean(), (n - n_exc) * tg[1].mean(), rtol=1e-3)
        model = RateRNN(2, n, 2, dist, g=g, frac_exc=0.8, sigma_ln=1.0)
        W = model.recurrent_weights().detach().double().numpy()
        fluct = W - block_mean(W, n_exc)
        # sum of the columns' variances = g^2 (Rajan & Abbott's radius), fixed by the targets alone
        assert abs(np.sum(fluct**2) / n - g**2) < 0.02, dist
        # eigenvalues fill the disc of radius g up to its edge (Rajan & Abbott: with unequal E/I
        # column variances the density is not uniform, the radius is still g); a few heavy-tail
        # outliers allowed at finite n
        lam = np.abs(np.linalg.eigvals(fluct))
        assert np.mean(lam < 1.15 * g) > 0.97 and 0.85 * g < np.quantile(lam, 0.98), dist


def test_dale_signs_and_law_survive_training_steps():
    torch.manual_seed(0)
    model = RateRNN(3, 20, 3, "lognormal", g=1.0, frac_exc=0.8)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    before = model.mag.detach().clone()
    x = torch.randn(6, 8, 3)
    for _ in range(5):
        logits, _ = model(x)
        loss = logits.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.project()
    W = model.recurrent_weights().detach().numpy()
    assert (W[:, :16] >= 0).all() and (W[:, 16:] <= 0).all()
    for k, (rows, cols) in enumerate(block_slices(20, 16)):
        np.testing.assert_allclose(np.sort(model.mag.detach()[rows, cols].numpy().ravel()),
                                   getattr(model, f"target{k}").numpy(), rtol=1e-6)
    assert not torch.equal(before, model.mag.detach())  # the ranks did move


def test_effective_rank_closed_forms():
    assert np.isclose(effective_rank(np.eye(7)), 7.0)
    u = np.arange(1.0, 6.0)
    assert np.isclose(effective_rank(np.outer(u, u[::-1])), 1.0)
    assert np.isclose(effective_rank(np.diag([3.0, 3.0, 0, 0])), 2.0)
    # p = (1/2, 1/4, 1/4): exp(H) = 2^(3/2)
    assert np.isclose(effective_rank(np.diag([2.0, 1.0, 1.0])), 2 ** 1.5)


def test_participation_ratio_closed_forms():
    rng = np.random.default_rng(1)
    iso = rng.normal(size=(20000, 5))
    assert abs(participation_ratio(iso) - 5.0) < 0.1
    line = rng.normal(size=(1000, 1)) * np.array([[1.0, -2.0, 0.5]])
    assert np.isclose(participation_ratio(line), 1.0)
    # variances (4, 1): (5)^2 / (16 + 1)
    two = rng.normal(size=(200000, 2)) * np.array([2.0, 1.0])
    assert abs(participation_ratio(two) - 25 / 17) < 0.02


def test_hill_recovers_a_planted_pareto_tail():
    rng = np.random.default_rng(2)
    for alpha in (1.0, 2.5):
        x = rng.pareto(alpha, size=50000) + 1.0  # P(X > x) = x^-alpha, x >= 1
        assert abs(hill_tail_index(x, 0.1) - alpha) < 0.08 * alpha
    # the lognormal law has a heavier tail than the half-normal at the same scale
    assert hill_tail_index(unit_quantiles("lognormal", 5000)) < hill_tail_index(unit_quantiles("halfnormal", 5000))


def test_pdm_ground_truth_is_the_evidence_sign():
    """Without noise the integrated evidence (left - right over the stimulus) gives the label
    exactly; with noise its accuracy rises with coherence (a psychometric curve)."""
    cond = {"stimulus": [3, 6], "delay": [0, 2], "decision": 2, "coherences": [0.1], "sigma": 0.0}
    b = make_batch("pdm", cond, 200, np.random.default_rng(3))
    evidence = (b.x[:, :, 1] - b.x[:, :, 2]).sum(0)
    np.testing.assert_array_equal(np.where(evidence > 0, 1, 2), b.choice)
    assert (b.x[:, :, 0] == ~b.decision).all() and b.decision[-2:].all() and not b.decision[:-2].any()
    assert (b.y[~b.decision] == 0).all() and (b.y[-1] == b.choice).all()
    accs = []
    for c in (0.05, 0.2, 0.8):
        nb = make_batch("pdm", {**cond, "coherences": [c], "sigma": 0.3}, 4000, np.random.default_rng(4))
        ev = (nb.x[:, :, 1] - nb.x[:, :, 2]).sum(0)  # noise outside the stimulus only adds variance
        accs.append(np.mean(np.where(ev > 0, 1, 2) == nb.choice))
    assert accs[0] < accs[1] < accs[2] and accs[0] > 0.5


def test_dms_and_gonogo_labels():
    b = make_batch("dms", {"sample": 2, "delay": [1, 4], "test": 2, "decision": 1, "sigma": 0.0}, 300,
                   np.random.default_rng(5))
    T = b.x.shape[0]
    # test period = the 2 steps before the decision; sample = the 2 steps before the delay
    test_in = b.x[T - 3, :, 1:]
    sample_in = np.array([b.x[:, i, 1:][(b.x[:, i, 1:].sum(1) > 0)][0] for i in range(300)])
    match = np.all(np.isclose(test_in, sample_in), axis=1)
    np.testing.assert_array_equal(np.where(match, 1, 2), b.choice)
    g = make_batch("gonogo", {"stimulus": 2, "delay": [1, 3], "decision": 2, "sigma": 0.0}, 100,
                   np.random.default_rng(6))
    go = g.x[:, :, 1].sum(0) > 0
    np.testing.assert_array_equal(g.choice, go.astype(int))
    c = make_batch("ctxdm", {"stimulus": 3, "delay": 0, "decision": 1, "coherences": [0.5], "sigma": 0.0}, 200,
                   np.random.default_rng(7))
    ctx = c.x[0, :, 6] > 0.5  # modality 2 relevant
    ev = np.where(ctx, (c.x[:, :, 3] - c.x[:, :, 4]).sum(0), (c.x[:, :, 1] - c.x[:, :, 2]).sum(0))
    np.testing.assert_array_equal(np.where(ev > 0, 1, 2), c.choice)


def test_decision_accuracy_and_slope():
    b = make_batch("gonogo", {"stimulus": 1, "delay": 1, "decision": 2, "sigma": 0.0}, 10, np.random.default_rng(8))
    logits = np.zeros(b.x.shape[:2] + (2,), np.float32)
    logits[:, np.arange(10), b.choice] = 1.0
    assert decision_accuracy(torch.tensor(logits), b) == 1.0
    assert decision_accuracy(torch.tensor(logits[:, :, ::-1].copy()), b) == 0.0
    assert np.isclose(final_slope(np.arange(0, 100, 10), 2.0 - 0.01 * np.arange(0, 100, 10)), -1.0)


def test_dale_heavy_rnn_learns_through_the_projection():
    """A planted, learnable signal: an easy noiseless go/no-go. The OT-projected Dale RNN must
    get from chance to nearly perfect within a short budget."""
    cond = {"stimulus": 2, "delay": [1, 2], "decision": 2, "sigma": 0.05}
    p = {"conditions": {"gonogo": {"train": cond, "ood": {"delay": {**cond, "delay": [4, 6]}}}},
         "n_val": 64, "n_test": 128, "decision_weight": 5.0, "n_hidden": 24, "g": 1.0, "frac_exc": 0.8,
         "sigma_ln": 1.0, "alpha": 0.5, "sigma_rec": 0.0, "lr": 1e-2, "steps": 60, "batch": 32,
         "grad_clip": 1.0, "eval_every": 10, "hill_k_frac": 0.1}
    res = train_task("gonogo", "dale_heavy", p, seed=0, progress=lambda s: None)
    assert res["scalars"]["acc_id"] > 0.95, res["scalars"]
    assert res["curves"]["val_loss"][1][-1] < 0.5 * res["curves"]["val_loss"][1][0]
    W = res["W"]
    assert (W[:, :19] >= 0).all() and (W[:, 19:] <= 0).all()
