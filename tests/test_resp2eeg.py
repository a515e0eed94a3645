"""resp2eeg: the simulator plants the physiology it claims, the spectral pipeline measures it, the
breathing transformer learns a planted mapping under the one training rule (lr grid on validation,
constant rate, plateau stop), and the downstream learners score per night and read only signal."""
from __future__ import annotations

import numpy as np
import pytest

from reprozoo.methods.resp2eeg import data as D
from reprozoo.methods.resp2eeg import features as F

STAGES = ["W", "N1", "N2", "N3", "REM"]


def _night(stage_runs, tr=None, seed=0):
    rng = np.random.default_rng(seed)
    tr = tr or D.traits(rng)
    stages = [s for s, n in stage_runs for _ in range(n)]
    resp = D.breathing(stages, tr, rng)
    x, idx = D.eeg(stages, tr, resp, rng)
    return stages, tr, resp, x, idx


@pytest.fixture(scope="module")
def night():
    return _night([(s, 10) for s in STAGES], seed=3)


def _per_stage(stages, values):
    st = np.asarray(stages)
    return {s: np.mean(values[st == s]) for s in STAGES}


def test_spindle_density_highest_in_n2(night):
    stages, tr, _, x, idx = night
    n_ep = int(D.EPOCH_S * D.EEG_SFREQ)
    counts = np.bincount(idx // n_ep, minlength=len(stages))
    dens = _per_stage(stages, counts * 2.0)  # per minute
    assert dens["N2"] > 2.0 and dens["N2"] > dens["N3"] > dens["W"]
    assert dens["W"] == dens["REM"] == dens["N1"] == 0.0
    # and the measured sigma-band power of the multitaper spectrogram follows the planted density
    lp, freqs = F.multitaper_frames(x[None], D.EEG_SFREQ)
    feat = F.eeg_epoch_features(lp.reshape(1, len(stages), 6, -1), freqs, log_range=1.0)[0]
    sigma_max = _per_stage(stages, feat[:, -2])
    assert sigma_max["N2"] > max(sigma_max[s] for s in ("W", "N1", "REM"))
    # the spindle-frame fraction (sigma peak over its flanks) counts the planted spindles
    frac = _per_stage(stages, feat[:, -1])
    assert frac["N2"] > 0.2 and frac["N2"] > frac["N3"] > max(frac[s] for s in ("W", "N1", "REM"))


def test_spindle_frames_count_planted_density_blind_to_amplitude():
    """Two nights of one subject that differ only in the planted sex factor of the spindle rate
    (x 1.35): the spindle-frame fraction is higher for the female night, and scaling the EEG (any
    subject's overall amplitude) leaves it exactly unchanged (a peak ratio, not a power)."""
    tr = D.traits(np.random.default_rng(5))
    runs = [("N2", 40), ("N3", 10)]
    fr = {}
    for sex in (0, 1):
        t = dict(tr, sex=sex, spindle_scale=(1 - 0.008 * (tr["age"] - 20)) * (1 + 0.35 * sex))
        stages, _, _, x, idx = _night(runs, tr=t, seed=11)
        lp, freqs = F.multitaper_frames(x[None], D.EEG_SFREQ)
        fr[sex] = F.spindle_frames(lp, freqs, 1.0).mean()
        lp3, _ = F.multitaper_frames(3.0 * x[None], D.EEG_SFREQ)
        assert np.array_equal(F.spindle_frames(lp3, freqs, 1.0), F.spindle_frames(lp, freqs, 1.0))
        if sex == 1:
            assert len(idx) > 1.2 * n_spindles  # the planted rate differs as the simulator says
        n_spindles = len(idx)
    assert fr[1] > 1.1 * fr[0]


def test_auroc_placements_mean_is_the_auroc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 57)
    s = np.round(rng.normal(size=57) + 0.8 * y, 1)  # with ties
    v = F.auroc_placements(s, y)
    assert v.shape == (57,) and np.all((v >= 0) & (v <= 1))
    assert v.mean() == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert v[y == 1].mean() == pytest.approx(v[y == 0].mean(), abs=1e-12)
    assert np.isnan(F.auroc_placements(s, np.ones(57, int))).all()


def test_alpha_peak_in_wake_at_planted_frequency(night):
    stages, tr, _, x, _ = night
    n_ep = int(D.EPOCH_S * D.EEG_SFREQ)
    ep = x.reshape(len(stages), n_ep)
    w = ep[np.asarray(stages) == "W"]
    lp, freqs = F.multitaper_frames(w, D.EEG_SFREQ, frame_s=30.0)
    p = (10 ** lp).mean(axis=(0, 1))
    band = (freqs >= 7) & (freqs <= 13)
    f_peak = freqs[band][np.argmax(p[band])]
    assert abs(f_peak - tr["f_alpha"]) < 0.5
    n3 = ep[np.asarray(stages) == "N3"]
    lp3, _ = F.multitaper_frames(n3, D.EEG_SFREQ, frame_s=30.0)
    assert p[band].max() > 5 * (10 ** lp3).mean(axis=(0, 1))[band].max()  # alpha is a wake rhythm


def test_delta_power_highest_in_n3_and_falls_with_age():
    def delta_power(age, stage):
        rng = np.random.default_rng(11)
        tr = D.traits(rng)
        tr = {**tr, "age": age, "delta_uv": 55.0 * (1 - 0.009 * (age - 20))}
        stages, _, _, x, _ = _night([(stage, 6)], tr=tr, seed=5)
        lp, freqs = F.multitaper_frames(x[None], D.EEG_SFREQ, frame_s=30.0)
        return (10 ** lp[0][:, (freqs >= 0.5) & (freqs < 2)]).mean()

    n3_young = delta_power(25, "N3")
    assert n3_young > 4 * max(delta_power(25, s) for s in ("W", "N2", "REM"))
    assert delta_power(75, "N3") < 0.5 * n3_young  # 1 - 0.009 * 55 = 0.5 in amplitude: 1/4 in power


def test_breathing_slower_in_n3_than_rem_and_deeper():
    stages, tr, resp, _, _ = _night([("N3", 8), ("REM", 8)], seed=2)
    r = resp.reshape(len(stages), -1)[None].astype(float)
    f = F.resp_epoch_features(r, D.RESP_SFREQ)[0]
    st = np.asarray(stages)
    f_dom = f[:, -2]
    assert f_dom[st == "N3"].mean() < f_dom[st == "REM"].mean()
    assert abs(f_dom[st == "N3"].mean() - tr["resp_rate_bpm"] * 0.85 / 60) < 0.04
    assert f[st == "N3", -3].mean() > f[st == "REM", -3].mean()  # log s.d.: deeper in N3
    assert f[st == "N3", -1].mean() < f[st == "REM", -1].mean()  # more regular envelope in N3


def test_multitaper_sinusoid_and_scale():
    sf = 64.0
    t = np.arange(int(20 * sf)) / sf
    lp, freqs = F.multitaper_frames(np.sin(2 * np.pi * 10.0 * t)[None], sf)
    assert lp.shape[:2] == (1, 4)
    assert np.all(np.abs(freqs[lp[0].argmax(-1)] - 10.0) <= 0.2)
    sc = F.Scale(np.linspace(0, 100, 10001))
    assert sc(np.array([1.0, 99.0])) == pytest.approx([0.0, 1.0], abs=1e-9)


def test_context_features_shift():
    f = np.arange(2 * 4 * 1, dtype=float).reshape(2, 4, 1)
    c = F.with_context(f, k=1)
    assert c.shape == (2, 4, 3)
    assert np.array_equal(c[0, :, 1], f[0, :, 0])
    assert np.array_equal(c[0, 1:, 0], f[0, :-1, 0]) and c[0, 0, 0] == f[0, 0, 0]
    assert np.array_equal(c[0, :-1, 2], f[0, 1:, 0]) and c[0, -1, 2] == f[0, -1, 0]


FIT = {"dropout": 0.0, "batch": 16, "lrs": [3e-3], "eval_every": 10, "pilot_steps": 20, "min_steps": 150,
       "max_steps": 400, "flat_tol": 0.01}


def _planted_depth_task(s=24, t=36, m=40, seed=0):
    """Target of a patch = its breathing depth tercile (phase random: the amplitude must be read
    from the waveform whatever the breath's timing in the patch)."""
    rng = np.random.default_rng(seed)
    depth = rng.uniform(0.3, 2.0, (s, t))
    phase = rng.uniform(0, 2 * np.pi, (s, t, 1))
    patches = (depth[..., None] * np.sin(2 * np.pi * np.arange(m) / 20 + phase)).astype(np.float32)
    return patches, np.digitize(depth, [0.87, 1.43])


def test_transformer_learns_planted_patch_mapping():
    torch = pytest.importorskip("torch")
    from reprozoo.methods.resp2eeg.model import predict, train_encoder

    patches, target = _planted_depth_task()
    t = patches.shape[1]
    p = {"seq_len": t, "dim": 32, "depth": 2, "heads": 4, **FIT}
    model, hist = train_encoder(patches, target, 3, p, seed=0, val_frac=0.2)
    logits, h = predict(model, patches[-5:], t)
    acc = (logits.argmax(-1) == target[-5:]).mean()
    assert acc > 0.85  # chance about 1/3
    steps, val = hist["curves"]["val_loss"]
    assert min(val) < 0.6 * val[0]
    assert h.shape == (5, t, 32)
    torch.set_num_threads(1)


def test_lr_grid_chosen_on_validation_constant_rate_best_weights_kept():
    """Of a useless rate (1e-6) and a working one, the pilot keeps the working one; the rate is constant
    but for the shared rule's one drop to the convergence gate's floor; the returned weights score the
    curve's best value."""
    pytest.importorskip("torch")
    import torch

    from reprozoo.methods.resp2eeg.model import patch_inputs, train_encoder, windows

    patches, target = _planted_depth_task(s=16)
    p = {"seq_len": 36, "dim": 16, "depth": 1, "heads": 2, **FIT, "lrs": [1e-6, 3e-3], "max_steps": 200}
    model, hist = train_encoder(patches, target, 3, p, seed=1, val_frac=0.25)
    assert hist["lr_chosen"] == 3e-3
    assert hist["lr_pilot_val"]["1e-06"] > hist["lr_pilot_val"]["0.003"]
    steps, lr = hist["curves"]["lr"]
    assert set(lr) <= {3e-3, 3e-3 * 0.1} and steps == hist["curves"]["val_loss"][0]  # one drop, to the floor
    x = torch.tensor(windows(patch_inputs(patches[-4:]), 36))
    y = torch.tensor(windows(target[-4:], 36))
    with torch.no_grad():
        ce = float(torch.nn.functional.cross_entropy(model(x).reshape(-1, 3), y.reshape(-1)))
    assert ce == pytest.approx(min(hist["curves"]["val_loss"][1]), rel=1e-5)


def test_stop_at_plateau_passes_the_convergence_gate():
    """The shared rule stops the encoder where the gate's own plateau test holds: a fit that reports
    ``plateau`` passes ``reprozoo.claims.plateau`` at the gate's 2 % on its recorded curve, at a
    learning rate that dropped at most once, to the gate's floor."""
    pytest.importorskip("torch")
    from reprozoo.claims import plateau
    from reprozoo.methods.resp2eeg.model import train_encoder

    patches, target = _planted_depth_task(s=16)
    p = {"seq_len": 36, "dim": 16, "depth": 1, "heads": 2, **FIT, "max_steps": 1500}
    _, hist = train_encoder(patches, target, 3, p, seed=2, val_frac=0.25)
    steps, val = hist["curves"]["val_loss"]
    assert hist["plateau"] and hist["stop_step"] < 1500
    assert plateau(steps, val, 0.02) and plateau(steps, val, p["flat_tol"])
    assert not plateau(steps[: len(steps) // 3], val[: len(val) // 3], 0.02)  # early on it was still falling
    assert set(hist["curves"]["lr"][1]) <= {3e-3, 3e-3 * 0.1}


def test_subject_folds_never_split_a_subject():
    folds = F._subject_folds(10, 7, 4)
    assert len(folds) == 4
    test_sets = [set(te // 7) for _, te in folds]  # subjects of each held-out fold
    assert set().union(*test_sets) == set(range(10))
    for (tr, te), subj in zip(folds, test_sets):
        assert not (set(tr // 7) & subj)
        assert len(te) == 7 * len(subj)


def test_downstream_scores_per_night():
    models = {"stage_majority": 2, "age_mean": 50.0}
    stage = np.array([[2, 2, 3, 0], [1, 1, 1, 1]])
    pred = np.array([[2, 2, 2, 0], [1, 0, 1, 1]])
    r = F.score_subjects(models, pred, stage, np.array([40.0, 70.0]), np.array([45.0, 60.0]),
                         np.array([0.2, 0.9]), np.array([0, 1]))
    assert r["stage_acc"] == pytest.approx([0.75, 0.75])
    assert r["stage_acc_const"] == pytest.approx([0.5, 0.0])
    assert r["age_mae"] == pytest.approx([5.0, 10.0]) and r["age_mae_const"] == pytest.approx([5.0, 10.0])
    assert r["sex_auroc"] == pytest.approx([1.0, 1.0])


def test_downstream_learners_recover_planted_signal_and_ignore_noise():
    """Same learners and tuning for every source: features that carry stage, age and sex score
    high; pure-noise features score at chance (no leak of labels through the tuning)."""
    rng = np.random.default_rng(0)
    s, e = 40, 30
    stage = rng.integers(0, 5, (s, e))
    age = rng.uniform(20, 80, s)
    sex = rng.integers(0, 2, s)
    sig = np.concatenate([np.eye(5)[stage] + 0.3 * rng.standard_normal((s, e, 5)),
                          np.repeat(((age - 50) / 17)[:, None, None], e, 1) + 0.3 * rng.standard_normal((s, e, 1)),
                          np.repeat((2.0 * sex - 1)[:, None, None], e, 1) + 0.5 * rng.standard_normal((s, e, 1))], -1)
    noise = rng.standard_normal(sig.shape)
    tr, te = slice(0, 24), slice(24, 40)
    good = F.evaluate_downstream(F.fit_downstream(sig[tr], stage[tr], age[tr], sex[tr]), sig[te], stage[te], age[te], sex[te])
    bad = F.evaluate_downstream(F.fit_downstream(noise[tr], stage[tr], age[tr], sex[tr]), noise[te], stage[te], age[te], sex[te])
    assert good["stage_acc"].mean() > 0.9 and bad["stage_acc"].mean() < 0.35
    assert good["age_mae"].mean() < 0.5 * good["age_mae_const"].mean()
    assert bad["age_mae"].mean() > 0.8 * bad["age_mae_const"].mean()
    assert good["sex_auroc"].mean() > 0.9


def test_codebook_floor_below_marginal():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 10))
    x = centers[rng.integers(0, 4, 800)] + 0.05 * rng.normal(size=(800, 10))
    km = F.fit_codebook(x, 4, seed=0)
    floor = np.abs(km.cluster_centers_[km.predict(x)] - x).mean()
    assert floor < 0.1 * np.abs(x.mean(0) - x).mean()
