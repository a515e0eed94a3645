"""ECG-R1 miniature: protocol measurement, scoring, policy-gradient surrogate, modality masking."""
import numpy as np
import pytest

from reprozoo.methods.ecg_r1 import data as D
from reprozoo.methods.ecg_r1 import protocol as P


def _feat(**kw):
    f = {"hr": 75.0, "rr_cv": 0.02, "qrs_ms": 90.0, "pr_ms": 160.0, "qtc_ms": 410.0}
    f.update(kw)
    return f


def test_protocol_recovers_planted_rate_and_irregularity():
    base = {"rhythm": "normal", "qrs_scale": 0.7, "pr_scale": 1.0, "qt_scale": 1.0, "random_state": 3}
    reg = P.measure(D.simulate_clean({**base, "heart_rate": 75.0, "heart_rate_std": 1.0}), D.FS_SIM)
    irr = P.measure(D.simulate_clean({**base, "heart_rate": 90.0, "heart_rate_std": 22.0}), D.FS_SIM)
    assert abs(reg["hr"] - 75.0) < 3.0
    assert reg["rr_cv"] < 0.05 and irr["rr_cv"] > 0.10
    assert P.protocol_report(reg)[-1] == 0 and P.protocol_report(irr)[-1] == 3


def test_wider_qrs_parameter_measures_wider():
    base = {"rhythm": "normal", "heart_rate": 70.0, "heart_rate_std": 1.0, "pr_scale": 1.0,
            "qt_scale": 1.0, "random_state": 1}
    narrow = P.measure(D.simulate_clean({**base, "qrs_scale": 0.5}), D.FS_SIM)
    wide = P.measure(D.simulate_clean({**base, "qrs_scale": 1.3}), D.FS_SIM)
    assert wide["qrs_ms"] > narrow["qrs_ms"] + 40


@pytest.mark.parametrize("kw,dx", [({}, 0), ({"hr": 52.0}, 1), ({"hr": 121.0}, 2), ({"hr": 59.9}, 1),
                                   ({"hr": 100.0}, 2), ({"rr_cv": 0.2, "hr": 130.0}, 3)])
def test_diagnostic_logic(kw, dx):
    assert P.protocol_report(_feat(**kw))[-1] == dx


def test_bins_carry_the_thresholds():
    qrs = P.FIELDS[2]
    assert not qrs.category(qrs.bin(119.0)) and qrs.category(qrs.bin(120.0))
    pr = P.FIELDS[3]
    assert not pr.category(pr.bin(199.0)) and pr.category(pr.bin(200.0))
    assert P.FIELDS[4].threshold_bin() == 5 and P.BRADY_BIN == 2


def test_paper_reward_is_exact_anchor_recall_per_step_plus_diagnosis():
    """The paper's reward (plugin.py: diagnosis Jaccard + key-evidence recall with exact anchors,
    averaged per protocol step): a one-bin slip earns nothing for that anchor, no consistency term."""
    truth = P.protocol_report(_feat(qrs_ms=105.0))
    assert P.evidence_reward(truth, truth)[0] == pytest.approx(1.0)
    near = truth.copy(); near[0] += 1                         # 80-90 bpm instead of 70-80: a miss now
    assert P.exact(near, truth)[0].sum() == 5
    # step 1 (rate, RR CV) recall 1/2, steps 2 and 5 full: recall (0.5 + 1 + 1) / 3, dx right
    assert P.evidence_reward(near, truth)[0] == pytest.approx((1 + 2.5 / 3) / 2)
    wrong_dx = truth.copy(); wrong_dx[-1] = 2                 # evidence exact, dx wrong
    assert P.evidence_reward(wrong_dx, truth)[0] == pytest.approx(0.5)
    qtc = truth.copy(); qtc[4] += 1                           # QTc is step 5 alone: its whole step lost
    assert P.evidence_recall(qtc, truth)[0] == pytest.approx(2 / 3)
    lied = truth.copy(); lied[0] = 0; lied[-1] = 1            # invents bradycardia, dx follows it
    assert P.evidence_reward(lied, truth)[0] == pytest.approx((0 + 2.5 / 3) / 2)   # no credit for coherence
    assert P.consistent(lied)[0] and not P.consistent(wrong_dx)[0]


def test_generator_reference_matches_the_delineation_in_median_but_is_its_own():
    """The grounded check's reference comes from the generator's parameters alone (no delineation): it
    follows the planted knobs exactly and agrees with neurokit2's measurement to within a bin in median
    over a few records, without being equal to it."""
    rng = np.random.default_rng(11)
    gen, meas = [], []
    while len(gen) < 8:
        par = D.sample_params(rng)
        f = P.measure(D.simulate_clean(par), D.FS_SIM)
        if f is None:
            continue
        g = D.generator_features(par)
        gen.append([g[k] for k in P.FEATURES]); meas.append([f[k] for k in P.FEATURES])
        ref = P.ground_truth(par)
        assert ref[-1] == P.RHYTHM_DX[par["rhythm"]] and np.allclose(ref[:-1], gen[-1])
    gen, meas = np.array(gen), np.array(meas)
    widths = np.array([f.width for f in P.FIELDS])
    assert (np.abs(np.median(meas - gen, axis=0)) < widths)[[0, 2, 3, 4]].all()
    assert not np.allclose(gen[:, 2:], meas[:, 2:], atol=1.0)
    base = {"rhythm": "normal", "heart_rate": 70.0, "heart_rate_std": 1.0, "qrs_scale": 1.0, "pr_scale": 1.0,
            "qt_scale": 1.0, "random_state": 0}
    g0, gw = D.generator_features(base), D.generator_features({**base, "qrs_scale": 1.3})
    assert gw["qrs_ms"] == pytest.approx(1.3 * g0["qrs_ms"]) and gw["pr_ms"] < g0["pr_ms"]
    # at 60 bpm (RR 1 s, no rate scaling): QT from Q onset (-15 deg - 2.25 x 0.1 rad) to T offset
    # (100 deg + 2.25 x 0.4 rad), one cycle = 2 pi = 1000 ms
    qt = (np.deg2rad(115.0) + D.WAVE_SD * (0.1 + 0.4)) / (2 * np.pi) * 1000.0
    assert D.generator_features({**base, "heart_rate": 60.0})["qtc_ms"] == pytest.approx(qt)


def test_render_keeps_spike_and_draws_one_row_for_flat_trace():
    flat = np.zeros(1000, np.float32)
    img = D.render_image(flat)
    ink = img == 1.0
    assert ink.shape == (40, 200) and (ink.sum(0) == 1).all()
    row0 = np.argmax(ink[:, 0])
    assert row0 == round((1.6 - 0.0) / 2.4 * 39)
    spike = flat.copy(); spike[502] = 1.5                     # one sample inside column 100
    col = (D.render_image(spike) == 1.0)[:, 100]
    assert col.sum() > 20 and col[row0]


torch = pytest.importorskip("torch")


def test_group_policy_surrogate_gradient():
    """d loss / d logp_i = -A_i / N over the informative groups' N samples, A normalised within each
    group (closed form); a group whose samples all score the same is left out (dynamic sampling),
    so it neither gets a gradient nor dilutes the others'."""
    from reprozoo.methods.ecg_r1.model import group_policy_loss

    logp = torch.zeros(4, requires_grad=True)
    reward = torch.tensor([1.0, 0.0, 0.3, 0.3])
    group_policy_loss(logp, reward, group=2).backward()
    a = 0.5 / np.std([1.0, 0.0], ddof=1)
    assert np.allclose(logp.grad.numpy(), [-a / 2, a / 2, 0.0, 0.0], atol=1e-5)
    flat = torch.zeros(4, requires_grad=True)
    loss = group_policy_loss(flat, torch.tensor([0.5, 0.5, 0.2, 0.2]), group=2)
    loss.backward()
    assert float(loss.detach()) == 0.0 and np.allclose(flat.grad.numpy(), 0.0)


def test_policy_gradient_points_uphill():
    """Monte Carlo surrogate gradient on a softmax policy aligns with the exact grad of E[r]."""
    from reprozoo.methods.ecg_r1.model import group_policy_loss

    g = torch.Generator().manual_seed(0)
    theta = torch.tensor([0.3, -0.2, 0.1, 0.0], requires_grad=True)
    r = torch.tensor([0.1, 0.9, 0.4, 0.2])
    p = torch.softmax(theta, 0).detach()
    exact = (p * (r - (p * r).sum())).numpy()                  # d E[r] / d theta
    a = torch.multinomial(p.expand(4000, 4), 8, replacement=True, generator=g).reshape(-1)
    logp = torch.log_softmax(theta, 0)[a]
    (-group_policy_loss(logp, r[a], group=8)).backward()
    est = theta.grad.numpy()
    assert est @ exact / (np.linalg.norm(est) * np.linalg.norm(exact)) > 0.95


def test_missing_modality_is_ignored_and_dropout_rates():
    from reprozoo.methods.ecg_r1.model import ReportModel, dropout_masks

    torch.manual_seed(0)
    m = ReportModel(8)
    sig, img = torch.randn(3, 1000), torch.rand(3, 40, 200)
    one, zero = torch.ones(3), torch.zeros(3)
    with torch.no_grad():
        a = m.encode(sig, img, one, zero)
        b = m.encode(sig, torch.rand(3, 40, 200), one, zero)      # image changed but masked
        c = m.encode(torch.randn(3, 1000), img, zero, one)
        d = m.encode(sig, img, zero, one)
        assert torch.allclose(a, b) and torch.allclose(c, d)
        assert not torch.allclose(m.encode(sig, img, one, one), a)
    ms, mi = dropout_masks(20000, 0.25, np.random.default_rng(0))
    assert ((ms + mi) >= 1).all()
    assert abs(ms.mean() - 0.75) < 0.01 and abs(mi.mean() - 0.75) < 0.01 and abs((ms * mi).mean() - 0.5) < 0.01


def _ref(feat, rhythm="normal"):
    return P.reference(feat, rhythm)


def test_grounded_check_is_not_the_reward_scorer():
    """The grounded check (the claimed hallucination rate) and the reward disagree where they must: a
    diagnosis that follows the protocol's measurement but not the record's generating rhythm is a
    hallucination the reward credits; a statement within half a bin of the generator's value is
    grounded though the reward (exact anchors on the measured bin) gives it nothing."""
    feat = _feat(hr=72.0, qrs_ms=105.0)
    truth = P.protocol_report(feat)
    assert P.grounded(truth, _ref(feat))[0].all()             # the protocol's own report is grounded
    edge = truth.copy(); edge[0] = P.FIELDS[0].bin(81.0)        # 80-90 bpm for 78 bpm: inside half a bin
    assert P.grounded(edge, _ref(_feat(hr=78.0)))[0, 0] and not P.exact(edge, truth)[0, 0]
    slip = truth.copy(); slip[0] = P.FIELDS[0].bin(91.0)       # 90-100 bpm for 72 bpm
    assert not P.grounded(slip, _ref(feat))[0, 0]
    # a 'normal' generated record measured at 59 bpm: the protocol says brady, ground truth sinus
    f59 = _feat(hr=59.0)
    rep = P.protocol_report(f59)
    assert rep[-1] == 1 and P.evidence_reward(rep, rep)[0] == pytest.approx(1.0)
    g = P.grounded(rep, _ref(f59, "normal"))[0]
    assert not g[-1] and not g[0]                               # wrong dx, wrong rate category
    assert P.grounded(rep, _ref(f59, "brady"))[0].all()


def test_grounded_regularity_follows_the_generating_class():
    feat = _feat(hr=90.0, rr_cv=0.12)
    rep = P.protocol_report(feat)                               # irregular, dx 3
    assert rep[-1] == 3 and P.grounded(rep, _ref(feat, "irregular"))[0].all()
    g = P.grounded(rep, _ref(feat, "normal"))[0]
    assert not g[1] and not g[-1] and g[0]
    # the irregular class: its 8-s window's variability is not the nominal one, so any irregular bin
    # holds; its rate is checked to within half a bin plus IRREGULAR_RATE_TOL of the nominal rate
    other = rep.copy(); other[1] = P.FIELDS[1].bin(0.27)
    assert P.grounded(other, _ref(feat, "irregular"))[0, 1]
    fast = rep.copy(); fast[0] = P.FIELDS[0].bin(101.0)        # 100-110 bpm for a nominal 90
    assert P.grounded(fast, _ref(feat, "irregular"))[0, 0]
    assert not P.grounded(fast, _ref(_feat(hr=90.0), "normal"))[0, 0]
    # a regular record stated at 0.05-0.10 for a nominal variability of 0.02 is not grounded
    reg = P.protocol_report(_feat()); reg[1] = P.FIELDS[1].bin(0.07)
    assert not P.grounded(reg, _ref(_feat()))[0, 1]


def test_grounded_flags_a_statement_across_the_clinical_threshold():
    """The half-bin tolerance may not carry a QRS / PR / QTc statement across its threshold: a measured
    QRS of 128 ms stated as "100-120 ms (normal)" is a hallucination (the bin's edge is within half a
    bin of the value, the category is not); an in-bin statement, and a neighbouring bin on the same side
    of the threshold within the tolerance, stay grounded."""
    for field, value in (("qrs_ms", 128.0), ("pr_ms", 210.0), ("qtc_ms", 460.0)):
        j = [f.feature for f in P.FIELDS].index(field)
        f = P.FIELDS[j]
        feat = _feat(**{field: value})
        rep = P.protocol_report(feat)
        assert P.grounded(rep, _ref(feat))[0, j]                    # the in-bin statement
        below = rep.copy(); below[j] = f.threshold_bin() - 1         # the bin just under the threshold
        assert value - (f.lo + (below[j] + 1) * f.width) <= f.width / 2  # inside the value tolerance ...
        assert not f.category(below[j]) and value >= f.threshold
        assert not P.grounded(below, _ref(feat))[0, j]              # ... but the wrong category
    # the same field below the threshold: a neighbouring bin on the same side stays within tolerance
    feat = _feat(qrs_ms=105.0)
    j = [f.feature for f in P.FIELDS].index("qrs_ms")
    rep = P.protocol_report(feat); rep[j] = P.FIELDS[j].bin(85.0)   # 80-100 ms for 105 ms: same side
    assert P.grounded(rep, _ref(feat))[0, j]


def test_units_per_record():
    from reprozoo.methods.ecg_r1.method import per_record

    assert np.allclose(per_record([1, 0, 1, 1, 0, 0], 2), [0.5, 1.0, 0.0])


def test_stage1_fit_reads_the_rate_table_and_the_reward():
    """Stage 1 runs the shared rule at the variant's table rate (no pilots), stops on and keeps the
    validation reward as stage 2 does, and records the rate's edge on fit1's grid; without a table
    the grid is piloted; a variant missing from a table is an error, not a silent default."""
    from reprozoo.methods.ecg_r1.method import VARIANTS, stage1_fit

    fit1 = {"lr_grid": [1e-3, 2e-3, 4e-3, 8e-3], "pilot_steps": 60, "eval_every": 10, "min_steps": 150,
            "max_steps": 900, "flat_tol": 0.015}
    table = {v: 2e-3 for v in VARIANTS} | {"ecg_r1": 8e-3}
    fit, src = stage1_fit({"fit1": fit1, "lr": table}, "ecg_r1")
    assert fit["lr_grid"] == [8e-3] and src == {"lr_source": "table", "lr_edge": "top"}
    assert fit["select"] == "neg_reward" and fit["stop_on"] == ["neg_reward"]
    assert {k: fit[k] for k in fit1 if k != "lr_grid"} == {k: v for k, v in fit1.items() if k != "lr_grid"}
    fit, src = stage1_fit({"fit1": fit1, "lr": table}, "image_only")
    assert fit["lr_grid"] == [2e-3] and src["lr_edge"] is None
    fit, src = stage1_fit({"fit1": fit1}, "image_only")
    assert fit["lr_grid"] == fit1["lr_grid"] and src["lr_source"] == "grid"
    with pytest.raises(KeyError):
        stage1_fit({"fit1": fit1, "lr": {"ecg_r1": 4e-3}}, "image_only")


def test_later_stages_read_their_own_rate_tables_and_keep_from_eval_every():
    """Stage 2 (SFT on the pool) reads ``lr2`` and ``fit2``, stage 3 (RL) ``lr3`` and ``fit3``; both stop on
    and keep set B's reward and never keep the unchanged start (keep_from = eval_every); without a
    table the stage's grid is piloted."""
    from reprozoo.methods.ecg_r1.method import later_fit

    fit2 = {"lr_grid": [3e-4, 1e-3, 3e-3], "pilot_steps": 40, "eval_every": 10, "min_steps": 100,
            "max_steps": 800, "flat_tol": 0.015}
    fit3 = {**fit2, "min_steps": 300}
    p = {"fit2": fit2, "fit3": fit3, "lr2": {"ecg_r1": 1e-3}, "lr3": {"ecg_r1": 3e-3}}
    f2, s2 = later_fit(p, "ecg_r1", 2)
    f3, s3 = later_fit(p, "ecg_r1", 3)
    assert f2["lr_grid"] == [1e-3] and s2 == {"lr_source": "table", "lr_edge": None}
    assert f3["lr_grid"] == [3e-3] and f3["min_steps"] == 300 and s3["lr_edge"] == "top"
    for f in (f2, f3):
        assert f["select"] == "neg_reward" and f["stop_on"] == ["neg_reward"] and f["keep_from"] == 10
    f, s = later_fit({"fit2": fit2, "fit3": fit3}, "ecg_r1", 3)
    assert f["lr_grid"] == fit3["lr_grid"] and s["lr_source"] == "grid"
    with pytest.raises(KeyError):
        later_fit(p, "image_only", 2)


def test_sft_only_is_a_prefix_of_ecg_r1():
    """The RL claim's arms share stages 1 and 2 (the same setup, dropout and rates, so the same
    shared_stage keys); ecg_r1 adds stage 3 (RL), sft_only stops after stage 2; every RL variant
    has the three stages."""
    import yaml
    from pathlib import Path

    from reprozoo.methods.ecg_r1 import method as M

    assert M.SETUP["ecg_r1"][:2] == M.SETUP["sft_only"][:2]
    assert M.SETUP["sft_only"][2] == "sft" and all(M.SETUP[v][2] == "rl" for v in M.VARIANTS if v != "sft_only")
    for scale in ("ci", "smoke"):
        p = yaml.safe_load((Path(M.__file__).parent / "configs" / f"{scale}.yaml").read_text())
        for t in ("lr", "lr2"):
            assert p[t]["ecg_r1"] == p[t]["sft_only"], (scale, t)
        assert "sft_only" not in p["lr3"] and set(p["lr3"]) == set(M.VARIANTS) - {"sft_only"}


def test_eval_records_are_simulated_once_and_keyed_by_their_config(tmp_path, monkeypatch):
    from reprozoo.methods.ecg_r1 import method as M

    p = {"n_val": 2, "n_test": 2, "views_test": 1, "noise_mv": [0.02, 0.08]}
    fresh = M.eval_arrays(p, progress=lambda *_: None)
    first = M.cached_eval_arrays(p, tmp_path, progress=lambda *_: None)
    assert sorted(first) == sorted(fresh) and all(np.array_equal(first[k], fresh[k]) for k in fresh)

    def no_simulation(*a, **k):
        raise AssertionError("simulated again although cached")

    monkeypatch.setattr(M, "eval_arrays", no_simulation)
    again = M.cached_eval_arrays(p, tmp_path, progress=lambda *_: None)   # read back, not simulated
    assert all(np.array_equal(again[k], fresh[k]) for k in fresh)
    assert M._eval_cache_key({**p, "n_test": 3}) != M._eval_cache_key(p)  # another size: not reused
    with pytest.raises(AssertionError):
        M.cached_eval_arrays({**p, "n_test": 3}, tmp_path, progress=lambda *_: None)


def test_stage_rule_is_the_same_for_every_variant_and_reads_the_reward():
    """Both stages stop on the validation evidence reward, for RL and SFT alike; the val_loss the
    stop reads is minus the greedy reports' mean reward (a perfect model scores -1)."""
    import torch

    from reprozoo.methods.ecg_r1 import method as M
    from reprozoo.methods.ecg_r1.model import ReportModel

    rng = np.random.default_rng(0)
    rep = np.stack([P.protocol_report(_feat(hr=h)) for h in (50.0, 75.0, 120.0, 80.0)])
    arr = {"sig": rng.standard_normal((4, 1000)).astype(np.float32),
           "img": rng.random((4, 40, 200)).astype(np.float32), "report": rep}
    p = {"group": 4, "rl_batch": 2, "batch": 3, "p_drop": 0.25}
    torch.manual_seed(0)
    model = ReportModel(8)
    for variant in M.VARIANTS:
        setup, drop, stage2 = M.SETUP[variant]
        for objective, batch in (("sft", p["batch"]), (stage2, p["rl_batch"])):   # stage 1, stage 2
            train_loss, val_loss = M.stage_losses(arr, arr, setup, drop, objective, p, batch)
            out = val_loss(model)
            assert set(out) == {"neg_reward", "ce"} and -1.0 <= out["neg_reward"] <= 0.0
            loss = train_loss(model, torch.Generator().manual_seed(1))
            assert loss.ndim == 0 and torch.isfinite(loss)
            again = train_loss(model, torch.Generator().manual_seed(1))     # draws come from gen alone
            assert torch.allclose(loss, again)

    class Perfect(torch.nn.Module):
        def encode(self, sig, img, ms, mi):
            return torch.zeros(len(sig), 1)

        def sft_loss(self, z, target):
            return torch.tensor(0.0)

        def generate(self, z, greedy=True):
            return torch.from_numpy(rep), None

    assert M.stage_losses(arr, arr, "both", True, "rl", p, 2)[1](Perfect())["neg_reward"] == pytest.approx(-1.0)


def test_shared_stage_runs_once_per_key(tmp_path):
    """ecg_r1 and sft_only share stage 1: the second cell loads what the first trained; another
    key (rate, setup, ...) trains afresh."""
    import torch

    from reprozoo.methods.ecg_r1.method import shared_stage

    np.savez(tmp_path / "data.npz", x=np.zeros(3))
    calls = []

    def run():
        calls.append(1)
        return {"state": {"w": torch.arange(3.0)}, "curves": {"c": ([0, 1], [2.0, 1.0])}}

    a = shared_stage(tmp_path, {"lr": 4e-3, "setup": "both"}, run)
    b = shared_stage(tmp_path, {"lr": 4e-3, "setup": "both"}, run)
    assert len(calls) == 1 and torch.equal(a["state"]["w"], b["state"]["w"]) and b["curves"] == a["curves"]
    shared_stage(tmp_path, {"lr": 2e-3, "setup": "both"}, run)
    assert len(calls) == 2


def test_eval_cache_key_follows_the_simulation_code_only(monkeypatch):
    """The evaluation-record cache is keyed by the code that simulates, measures and renders the
    records (data.py, protocol.py and three functions of method.py), not by the training code."""
    from reprozoo.methods.ecg_r1 import method as M

    assert M._eval_source() == M._EVAL_SRC
    p = {"n_val": 2, "n_test": 2, "views_test": 1, "noise_mv": [0.02, 0.08]}
    key = M._eval_cache_key(p)
    monkeypatch.setattr(M, "_STAGE_SRC", "changed training code")
    assert M._eval_cache_key(p) == key
    monkeypatch.setattr(M, "_EVAL_SRC", "changed simulation code")
    assert M._eval_cache_key(p) != key


def test_stage2_records_are_apart_from_stage1_and_cached(tmp_path, monkeypatch):
    """Stage 2 trains and validates on records stage 1 never sees: its own seed stream (validation
    set B and the pool), simulated once per run and keyed by their sizes."""
    from reprozoo.methods.ecg_r1 import method as M

    p = {"n_val": 2, "n_test": 2, "n_val_b": 2, "n_rl": 3, "views_test": 1, "views_rl": 2,
         "noise_mv": [0.02, 0.08]}
    ev = M.eval_arrays(p, progress=lambda *_: None)
    s2 = M.cached_stage2_arrays(p, tmp_path, progress=lambda *_: None)
    assert s2["valb_sig"].shape[0] == 2 and s2["pool_sig"].shape[0] == 6 and s2["pool_report"].shape == (6, 6)
    for a in ("val_ref", "test_ref"):                        # no stage-2 record is a validation-A / test record
        assert not any(np.array_equal(x, y) for x in s2["pool_ref"] for y in ev[a])
    monkeypatch.setattr(M, "stage2_arrays", lambda *a, **k: (_ for _ in ()).throw(AssertionError("again")))
    again = M.cached_stage2_arrays(p, tmp_path, progress=lambda *_: None)
    assert all(np.array_equal(again[k], s2[k]) for k in s2)
    assert M._stage2_cache_key({**p, "n_rl": 4}) != M._stage2_cache_key(p)


def test_rl_log_records_reward_and_zero_spread_and_picks_the_chosen_run():
    import torch

    from reprozoo.methods.ecg_r1 import method as M
    from reprozoo.methods.ecg_r1.model import ReportModel

    rng = np.random.default_rng(0)
    rep = np.stack([P.protocol_report(_feat(hr=h)) for h in (50.0, 75.0, 120.0, 80.0)])
    arr = {"sig": rng.standard_normal((4, 1000)).astype(np.float32),
           "img": rng.random((4, 40, 200)).astype(np.float32), "report": rep}
    p = {"group": 4, "rl_batch": 2, "batch": 3, "p_drop": 0.25}
    train_loss, _ = M.stage_losses(arr, arr, "both", True, "rl", p, 2)
    torch.manual_seed(0)
    train_loss(ReportModel(8), torch.Generator().manual_seed(1))
    (r, z), = train_loss.log
    assert 0.0 <= r <= 1.0 and z in (0.0, 0.5, 1.0)
    fit2 = {"lr_grid": [1e-4, 1e-3, 1e-2], "pilot_steps": 2}
    log = [(k, 0.0) for k in range(10)]                     # pilots 0-1, 2-3, 4-5; then the chosen run
    assert [x for x, _ in M.rl_run_log(log, {"lr": 1e-3, "stop": 6}, fit2)] == [2, 3, 6, 7, 8, 9]


def test_stage2_tables_rank_by_the_shared_rules_pilot_score():
    """pilot_stage2 ranks a rate by the shared rule's score (fit.pilot_score, default the mean of the
    second half of the validation curve), not by its single best point: a noisy rate's lucky maximum
    does not win."""
    from reprozoo.methods.ecg_r1.pilot_stage2 import rule_score

    steady = [-0.85, -0.88, -0.89, -0.89, -0.89, -0.89]       # neg rewards: best 0.89, tail 0.89
    lucky = [-0.85, -0.80, -0.82, -0.93, -0.81, -0.80]        # best 0.93, tail 0.847
    assert rule_score(steady, {}) > rule_score(lucky, {})
    assert rule_score(lucky, {"pilot_score": "best"}) == pytest.approx(0.93)
