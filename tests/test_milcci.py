"""MILCCI numerics: each sub-solver's optimality conditions, the generator's label structure,
the scores on known answers, and recovery of planted components that only the labels can split."""
import numpy as np
import pytest

from reprozoo.methods.milcci import milcci as ML
from reprozoo.methods.milcci.baselines import fit_cp, fit_pca
from reprozoo.methods.milcci.data import make_dataset
from reprozoo.methods.milcci.recovery import (abs_corr, heldout_r2, map_corr_per_condition, match,
                                               per_category_structure)


def _trace_objective_grad(A, Y, Phi, lam_s):
    """Gradient of 1/2 ||Y - A Phi^T||^2 + lam_s/2 ||D Phi||^2 with respect to Phi (T, P)."""
    D = np.diff(np.eye(Y.shape[1]), axis=0)
    return -(Y - A @ Phi.T).T @ A + lam_s * D.T @ D @ Phi


def test_smooth_traces_solves_the_sylvester_equation():
    rng = np.random.default_rng(0)
    A, Y = rng.uniform(size=(12, 3)), rng.normal(size=(12, 25))
    Phi = ML.smooth_traces(A, Y, 2.0, ML.difference_eig(25), ridge=0.0)
    assert np.max(np.abs(_trace_objective_grad(A, Y, Phi, 2.0))) < 1e-9
    # the same in the vectorised normal equations: (I kron A^T A + lam D^T D kron I) vec(X) = vec(A^T Y)
    D = np.diff(np.eye(25), axis=0)
    lhs = np.kron(np.eye(25), A.T @ A) + 2.0 * np.kron(D.T @ D, np.eye(3))
    X = np.linalg.solve(lhs, (A.T @ Y).ravel(order="F")).reshape(3, 25, order="F")
    np.testing.assert_allclose(Phi, X.T, atol=1e-9)


def test_nonneg_traces_meet_kkt_conditions():
    rng = np.random.default_rng(1)
    A, Y = rng.uniform(size=(15, 3)), rng.normal(size=(15, 30))
    Phi = ML.nonneg_smooth_traces(A, Y, 0.5, np.zeros((30, 3)), 3000)
    g = _trace_objective_grad(A, Y, Phi, 0.5)
    assert Phi.min() >= 0
    assert np.max(np.abs(g[Phi > 1e-8])) < 1e-5          # stationary where positive
    assert g[Phi <= 1e-8].min() > -1e-5                     # no descent direction into the constraint


def test_nonneg_lasso_meets_kkt_conditions():
    rng = np.random.default_rng(2)
    F = rng.normal(size=(40, 3))
    H, K = F.T @ F + 0.1 * np.eye(3), rng.normal(size=(20, 3)) * 5
    A = ML.nonneg_lasso(H, K, 0.7, np.zeros((20, 3)), 3000)
    g = A @ H - K + 0.7
    assert A.min() >= 0 and (A == 0).any() and (A > 0).any()
    assert np.max(np.abs(g[A > 0])) < 1e-6
    assert g[A == 0].min() > -1e-6


def test_similarity_weights():
    w = ML.similarity_weights(4, ordinal=False)
    np.testing.assert_allclose(w.sum(1), 1.0)
    assert np.all(np.diag(w) == 0) and np.allclose(w[0, 1:], 1 / 3)
    wo = ML.similarity_weights(4, ordinal=True)
    np.testing.assert_allclose(wo.sum(1), 1.0)
    assert wo[0, 1] > wo[0, 2] > wo[0, 3] > 0                # nearer label values pull harder


def test_generator_ties_maps_to_their_own_category():
    d = make_dataset(np.random.default_rng(3), n_channels=20, n_time=30, trials_per_condition=2)
    assert d.Y.shape == (12, 20, 30) and len(d.conditions) == 6
    assert d.A_true.min() >= 0 and d.Phi_true.min() >= 0
    for q, c in enumerate(d.comp_category):
        for k1 in range(6):
            for k2 in range(6):
                same = d.conditions[k1, c] == d.conditions[k2, c]
                equal = np.array_equal(d.A_true[k1, :, q], d.A_true[k2, :, q])
                assert equal == same       # shared exactly within a label value, different across values


def test_match_finds_a_permutation_and_ignores_scale_and_sign():
    d = make_dataset(np.random.default_rng(4), n_channels=20, n_time=30, trials_per_condition=2)
    perm = np.array([2, 0, 3, 1])
    maps_hat = np.empty_like(d.A_true)
    maps_hat[:, :, perm] = d.A_true * np.array([2.0, 0.5, 3.0, 1.0])
    Phi_hat = np.empty_like(d.Phi_true)
    Phi_hat[:, :, perm] = -d.Phi_true
    got, mc, tc = match(maps_hat, d.A_true, Phi_hat, d.Phi_true)
    np.testing.assert_array_equal(got, perm)
    assert mc == pytest.approx(1.0) and tc == pytest.approx(1.0)


def _truth_maps(d):
    maps = []
    for c, V in enumerate(d.n_values):
        sl = np.flatnonzero(d.comp_category == c)
        maps.append(np.stack([d.A_true[np.flatnonzero(d.conditions[:, c] == v)[0]][:, sl] for v in range(V)]))
    return maps


def test_per_category_structure_on_known_answers():
    d = make_dataset(np.random.default_rng(5), n_channels=20, n_time=30, trials_per_condition=2)
    maps = _truth_maps(d)
    acc, eff = per_category_structure(maps, d.comp_category, np.arange(4), d.A_true, d.conditions, d.comp_category)
    assert acc == 1.0 and eff == pytest.approx(1.0)
    # maps that ignore the labels carry no label effect
    flat = [np.repeat(m.mean(0, keepdims=True), len(m), 0) for m in maps]
    assert per_category_structure(flat, d.comp_category, np.arange(4), d.A_true, d.conditions, d.comp_category)[1] == 0.0
    # components placed in the wrong category are counted as such
    swapped = np.array([2, 3, 0, 1])
    assert per_category_structure(maps, d.comp_category, swapped, d.A_true, d.conditions, d.comp_category)[0] == 0.0


def test_label_variance_share_finds_the_driving_category():
    rng = np.random.default_rng(6)
    labels = np.array([(a, b) for a in range(3) for b in range(2) for _ in range(3)])
    base = rng.normal(size=(3, 40))
    Phi = np.stack([base[labels[:, 0]], rng.normal(size=(len(labels), 40))], axis=2)  # comp 0 follows category 0
    eta = ML.label_variance_share(Phi, labels, (3, 2))
    assert eta[0, 0] > 0.99 and eta[0, 1] < 0.05 and eta[1].max() < 0.3


def test_heldout_r2_and_label_blind_baselines_on_exact_models():
    rng = np.random.default_rng(7)
    A, B, C = rng.uniform(size=(15, 3)), rng.normal(size=(25, 3)), rng.uniform(0.5, 2, size=(10, 3))
    Y = np.einsum("np,tp,mp->mnt", A, B, C)                        # an exact rank-3 CP tensor
    hidden, observed = np.arange(0, 15, 2), np.arange(1, 15, 2)
    cp = fit_cp(Y, 3, n_restarts=2, seed=0)
    assert np.diag(abs_corr(cp.maps, A)[:, np.argmax(abs_corr(cp.maps, A), axis=1)]).min() > 0.999
    assert heldout_r2(Y, cp.predict(Y, observed), hidden) > 0.999
    pca = fit_pca(Y, 3)                                           # rank 3 (+ mean) spans the data
    assert heldout_r2(Y, pca.predict(Y, observed), hidden) > 0.99
    assert heldout_r2(Y, np.zeros_like(Y), hidden) < 0.0


def test_planted_solution_is_a_fixed_point_without_noise():
    d = make_dataset(np.random.default_rng(8), n_channels=20, n_time=30, trials_per_condition=2, noise_std=0.0)
    maps = [m / np.linalg.norm(m, axis=1).mean(0) for m in _truth_maps(d)]
    fit = ML._fit_once(d.Y, d.labels, d.n_values, (2, 2), maps, 0.0, 0.0, 0.0, 5, 50, (False, False), 0.0, True)
    _, mc, tc = match(fit.trial_maps(d.conditions), d.A_true, fit.Phi, d.Phi_true)
    assert mc > 0.999 and tc > 0.999


def test_labels_split_components_that_a_label_blind_fit_cannot():
    d = make_dataset(np.random.default_rng(9), n_channels=24, n_time=40, trials_per_condition=3, noise_std=0.1)
    kw = dict(n_iter=80, inner_iter=15, n_restarts=4, seed=0)
    fit = ML.fit_milcci(d.Y, d.labels, d.n_values, (2, 2), **kw)
    blind = ML.fit_milcci(d.Y, d.labels, d.n_values, (2, 2), use_labels=False, **kw)
    _, mc, _ = match(fit.trial_maps(d.conditions), d.A_true, fit.Phi, d.Phi_true)
    _, mc_blind, _ = match(np.repeat(blind.maps[0][0][None], 6, 0), d.A_true, blind.Phi, d.Phi_true)
    perm, *_ = match(fit.trial_maps(d.conditions), d.A_true, fit.Phi, d.Phi_true)
    acc, eff = per_category_structure(fit.maps, fit.comp_category, perm, d.A_true, d.conditions, d.comp_category)
    assert mc > 0.9 and mc > mc_blind + 0.15
    assert acc == 1.0 and eff > 0.8
    J = np.asarray(fit.objective)
    assert J[-1] < J[0]
    # trials sharing category 0's value share category 0's maps exactly (the label-sharing check)
    Am = fit.trial_maps(d.labels)
    same0 = np.flatnonzero(d.labels[:, 0] == d.labels[0, 0])
    assert all(np.array_equal(Am[m][:, :2], Am[0][:, :2]) for m in same0)


def test_fit_stops_only_where_the_convergence_gate_sees_a_plateau():
    from reprozoo.claims import plateau

    d = make_dataset(np.random.default_rng(10), n_channels=20, n_time=30, trials_per_condition=2)
    # a loose tolerance that alone would stop after a handful of iterations
    fit = ML.fit_milcci(d.Y, d.labels, d.n_values, (2, 2), n_iter=60, inner_iter=10, n_restarts=1, tol=1e-2,
                        use_labels=False, min_iter=20)
    J = np.asarray(fit.objective)
    assert len(J) >= 20
    assert plateau(np.arange(1, len(J) + 1), J)


def test_similarity_term_pulls_label_variants_together():
    d = make_dataset(np.random.default_rng(11), n_channels=20, n_time=30, trials_per_condition=1, noise_std=0.5)
    start = ML.contrast_init(d.Y, d.labels, d.n_values, (2, 2))
    spread = {}
    for lam in (0.0, 0.05, 1.0):
        fit = ML._fit_once(d.Y, d.labels, d.n_values, (2, 2), start, 0.0, lam, 1.0, 30, 15, (False, False), 0.0,
                           True)
        # distance of each label value's maps from the category's mean map, relative to the maps' size
        spread[lam] = np.mean([np.linalg.norm(A - A.mean(0)) / np.linalg.norm(A) for A in fit.maps])
    assert spread[0.0] > spread[0.05] > spread[1.0]
    assert spread[1.0] < 0.5 * spread[0.0]


def test_per_condition_nmf_recovers_each_conditions_maps_in_one_order():
    from reprozoo.methods.milcci.baselines import fit_nmf_percond

    d = make_dataset(np.random.default_rng(12), n_channels=24, n_time=60, trials_per_condition=3, noise_std=0.0)
    pc = fit_nmf_percond(d.Y, d.cond, len(d.conditions), 4, n_restarts=3, seed=0, max_iter=3000, tol=1e-8)
    assert pc.maps.shape == d.A_true.shape and pc.traces.shape == d.Phi_true.shape
    recon = np.einsum("mnp,mtp->mnt", pc.maps[d.cond], pc.traces)
    assert np.linalg.norm(recon - d.Y) / np.linalg.norm(d.Y) < 0.05
    # each condition's own maps are found (scored with a matching per condition) ...
    assert map_corr_per_condition(pc.maps, d.A_true) > 0.9
    # ... and that score is invariant to a different component order in every condition
    shuffled = np.stack([m[:, np.random.default_rng(k).permutation(4)] for k, m in enumerate(pc.maps)])
    assert map_corr_per_condition(shuffled, d.A_true) == pytest.approx(map_corr_per_condition(pc.maps, d.A_true))
    assert map_corr_per_condition(d.A_true, d.A_true) == pytest.approx(1.0)
    # held-out prediction uses the map set of the trial's own condition
    observed, hidden = np.arange(0, 24, 2), np.arange(1, 24, 2)
    assert heldout_r2(d.Y[:6], pc.predict(d.Y[:6], d.cond[:6], observed), hidden) > 0.8
