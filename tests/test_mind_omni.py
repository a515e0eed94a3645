"""Mind-Omni miniature: tokenizers, the synthetic fMRI's planted statistics, captions, the joint
sequence layout of the seven tasks, the metrics' known values, and the equal per-task budget."""
import numpy as np
import pytest

from reprozoo.methods.mind_omni import data as D
from reprozoo.methods.mind_omni import tasks as T


def test_patches_round_trip_and_tokenizer_recovers_a_planted_codebook():
    rng = np.random.default_rng(0)
    maps = rng.normal(size=(5, 8, 8))
    np.testing.assert_array_equal(D.from_patches(D.to_patches(maps, 4), 4, 8), maps)
    # maps built from 6 well-separated patch prototypes: k-means with 6 codes reproduces them exactly
    protos = rng.normal(scale=5.0, size=(6, 16))
    tok = rng.integers(0, 6, size=(300, 4))
    tok[:6, 0] = np.arange(6)
    built = D.from_patches(protos[tok], 4, 8)
    tk = D.PatchTokenizer(4, 6, seed=0).fit(built)
    np.testing.assert_allclose(tk.detokenize(tk.tokenize(built)), built, atol=1e-9)


def test_synthetic_fmri_snr_and_spatial_smoothness():
    images, labels = D.load_digits_images()
    train = np.arange(1200)
    rng = np.random.default_rng(1)
    y, sig = D.synthetic_fmri(images, train, grid=8, smooth=1.5, noise=1.0, rng=rng)
    yt, st = y[train].reshape(1200, -1), sig[train].reshape(1200, -1)
    r = [np.corrcoef(yt[:, v], st[:, v])[0, 1] for v in range(64)]
    # signal and noise have unit variance each: r(y, signal) = 1 / sqrt(1 + noise^2)
    assert abs(np.mean(r) - 1 / np.sqrt(2)) < 0.05
    c = np.corrcoef(st.T)
    near = np.mean([c[i * 8 + j, i * 8 + j + 1] for i in range(8) for j in range(7)])
    far = np.mean([c[i * 8 + j, ((i + 4) % 8) * 8 + (j + 4) % 8] for i in range(8) for j in range(8)])
    assert near > 0.6 and near > far + 0.4          # neighbouring voxels share tuning


def test_slant_sign_and_captions():
    right = np.zeros((1, 8, 8))
    for k in range(8):
        right[0, 7 - k, k] = 1.0                    # a stroke rising to the right: "/"
    assert D.slant(right)[0] > 0 and D.slant(right[:, :, ::-1])[0] < 0
    images, labels = D.load_digits_images()
    cap = D.captions(images, labels, np.arange(len(images)))
    assert (cap[:, 0] == labels).all()
    assert abs((cap[:, 1] == 11).mean() - 0.5) < 0.02            # ink split at the median
    assert all(abs((cap[:, 2] == 12 + k).mean() - 1 / 3) < 0.02 for k in range(3))
    ans = D.bqa_answers(cap)
    assert (ans[:, 0] == labels).all()
    assert ((ans[:, 1] == 10) == (labels % 2 == 0)).all() and ((ans[:, 2] == 10) == (labels > 4)).all()


@pytest.mark.parametrize("task", list(T.TASKS))
def test_every_task_sees_its_conditions_generates_its_targets_and_nothing_else(task):
    lay = T.Layout(n_brain=4, n_image=4, k_brain=7, k_image=5)
    rng = np.random.default_rng(0)
    n = 6
    cap = np.stack([rng.integers(0, 10, n), 10 + rng.integers(0, 2, n), 12 + rng.integers(0, 3, n)], 1)
    clean = lay.clean_tokens(rng.integers(0, 7, (n, 4)), rng.integers(0, 5, (n, 4)), cap,
                             rng.integers(0, 4, n), D.bqa_answers(cap))
    bias = lay.logit_bias()
    assert np.isfinite(bias[np.arange(lay.seq_len)[None], clean]).all()   # each token in its own segment
    assert np.isinf(bias[:, lay.none_id]).all()                             # NONE is never generated
    t0 = lay.span["text"].start
    assert np.isfinite(bias[t0 + 1]).sum() == 2 and np.isfinite(bias[t0 + 2]).sum() == 3   # ink, slant slots
    x, target = lay.for_task(clean, task)
    cond, tgt = T.TASKS[task]
    for s in T.SEGMENTS:
        sl = lay.span[s]
        assert target[:, sl].all() == (s in tgt) and target[:, sl].any() == (s in tgt)
        if s in cond or s in tgt:
            np.testing.assert_array_equal(x[:, sl], clean[:, sl])
        else:
            assert (x[:, sl] == lay.none_id).all()


def test_metrics_known_values():
    rng = np.random.default_rng(0)
    true = rng.normal(size=(50, 64))
    assert T.identification_accuracy(true, true) == 1.0
    assert abs(T.identification_accuracy(rng.normal(size=(50, 64)), true) - 0.5) < 0.05
    assert T.identification_accuracy(true + 0.5 * rng.normal(size=true.shape), true) > 0.99
    # reconstructions that are a fixed other image: that one wins, the rest is chance -> below 0.5
    assert T.identification_accuracy(np.roll(true, 1, 0), true) < 0.5
    assert T.voxel_correlation(3 * true + 1, true) == pytest.approx(1.0)
    assert T.voxel_correlation(-true, true) == pytest.approx(-1.0)
    assert T.pixel_correlation(2 * true - 5, true) == pytest.approx(1.0)


def test_chance_correction_puts_guessing_at_zero_and_perfect_at_one():
    """Uniform guessing among the tokens each position may emit scores chance_corrected ~ 0 on the
    caption and BQA tasks (the nulls in tasks.CHANCE), a perfect answer 1, on every task."""
    rng = np.random.default_rng(0)
    n = 20000
    # caption: each slot guessed uniformly within its own word list (what the logit bias allows)
    truth = np.stack([rng.integers(lo, hi, n) for lo, hi in D.CAPTION_SLOTS], 1)
    guess = np.stack([rng.integers(lo, hi, n) for lo, hi in D.CAPTION_SLOTS], 1)
    assert abs(T.chance_corrected("brain2txt", float((guess == truth).mean()))) < 0.02
    # BQA: a digit question has 10 options, the three yes / no questions 2
    cap = np.stack([rng.integers(0, 10, n), 10 + rng.integers(0, 2, n), 12 + rng.integers(0, 3, n)], 1)
    ans = D.bqa_answers(cap)
    guess = np.stack([rng.integers(0, 10, n)] + [10 + rng.integers(0, 2, n) for _ in range(3)], 1)
    assert abs(T.chance_corrected("bqa", float((guess == ans).mean()))) < 0.02
    # brain -> image: unrelated reconstructions identify at 0.5 -> 0; encoding: unrelated maps r ~ 0
    true = rng.normal(size=(200, 64))
    assert abs(T.chance_corrected("brain2img", T.identification_accuracy(rng.normal(size=true.shape), true))) < 0.05
    assert abs(T.chance_corrected("img2brain", T.voxel_correlation(rng.normal(size=true.shape), true))) < 0.05
    for task in T.TASKS:
        assert T.chance_corrected(task, 1.0) == pytest.approx(1.0)
        assert T.chance_corrected(task, T.CHANCE[task]) == pytest.approx(0.0)


def test_per_image_metrics_average_to_the_pooled_ones():
    rng = np.random.default_rng(3)
    true = rng.normal(size=(40, 64))
    rec = true + rng.normal(size=true.shape)
    per = T.identification_per_image(rec, true)
    assert per.shape == (40,) and per.mean() == pytest.approx(T.identification_accuracy(rec, true))
    r = T.pattern_correlation(2 * true + 1, true)
    np.testing.assert_allclose(r, 1.0)
    assert abs(T.pattern_correlation(rng.normal(size=true.shape), true).mean()) < 0.05


def test_expected_brain_map_of_a_certain_model_is_the_detokenised_map():
    """With all probability on one code per position (a huge logit), the expected map equals the
    tokenizer's detokenised map; with flat code probabilities it is the mean of the centroids."""
    import torch

    from reprozoo.methods.mind_omni import method as M

    rng = np.random.default_rng(0)
    k, patch, side = 6, 2, 8
    cents = rng.normal(size=(k, patch * patch))
    lay = T.Layout(n_brain=16, n_image=4, k_brain=k, k_image=5)
    codes = rng.integers(0, k, size=(3, 16))
    d = {"brain_centroids": cents, "brain_patch": np.array(patch), "fmri": np.zeros((3, side, side))}

    for certain in (True, False):
        class Model(torch.nn.Module):
            mask_id = lay.vocab

            def forward(self, x):
                out = torch.zeros(x.shape[0], x.shape[1], lay.vocab)
                if certain:
                    ids = lay.offset["brain"] + codes
                    for i in range(3):
                        out[i, np.arange(16), ids[i]] = 50.0
                return out

        x = torch.zeros(3, lay.seq_len, dtype=torch.long)
        t = torch.zeros(3, lay.seq_len, dtype=torch.bool)
        t[:, lay.span["brain"]] = True
        got = M.expected_brain_map(Model(), x, t, torch.tensor(lay.logit_bias()), d, lay)
        want = cents[codes] if certain else np.broadcast_to(cents.mean(0), (3, 16, patch * patch))
        np.testing.assert_allclose(got, D.from_patches(want, patch, side), atol=1e-6)


def test_variant_plan_batches():
    """joint and joint_planted: b of each of 7 tasks per step; single_task_joint_batch: 7 b of one task,
    one model per baseline task (the joint model's batch size, the batch-size control)."""
    from reprozoo.methods.mind_omni import method as M

    for v in ("joint", "joint_planted"):
        groups, per = M.variant_plan(v, 8)
        assert groups == [list(T.TASKS)] and per * len(groups[0]) == 56
    groups, per = M.variant_plan("single_task_joint_batch", 8)
    assert len(groups) == 7 and all(len(g) == 1 for g in groups) and per == 56
    groups, per = M.variant_plan("single_task_joint_batch", 8, ["img2brain", "bqa"])
    assert groups == [["img2brain"], ["bqa"]] and per == 56
    with pytest.raises(ValueError):
        M.variant_plan("single_task_joint_batch", 8, ["brain2eeg"])
    for gone in ("single_task", "joint_unrelated", "joint_shuffled"):
        with pytest.raises(ValueError):
            M.variant_plan(gone, 8)


def test_shuffled_pairing_breaks_brain_stimulus_pairs_on_the_named_splits_only():
    """The planted control's broken pairs: every test image gets the brain tokens AND the 'fMRI' of one
    image of ANOTHER digit from the test split; train / val pairs, images, captions and answers are
    untouched; the brain side still comes from real maps of the split (its marginal is kept)."""
    from reprozoo.methods.mind_omni import method as M

    rng = np.random.default_rng(0)
    n = 300
    labels = rng.integers(0, 10, n)
    brain = np.stack([np.arange(n)] * 16, 1)                   # row i's tokens name their own image
    fmri = np.arange(n, dtype=float)[:, None, None] * np.ones((1, 8, 8))
    d = {"labels": labels, "brain_tok": brain, "fmri": fmri, "train": np.arange(0, 200),
         "val": np.arange(200, 250), "test": np.arange(250, 300), "caption": rng.integers(0, 5, (n, 3))}
    out = M.shuffled_pairing(d, 0)
    src = out["brain_tok"][:, 0]
    idx = d["test"]
    assert np.isin(src[idx], idx).all()                          # drawn from its own split
    assert (labels[src[idx]] != labels[idx]).all()              # always another digit
    np.testing.assert_array_equal(out["fmri"][idx, 0, 0], src[idx])   # brain map and tokens move together
    for split in ("train", "val"):
        np.testing.assert_array_equal(out["brain_tok"][d[split]], brain[d[split]])
        np.testing.assert_array_equal(out["fmri"][d[split]], fmri[d[split]])
    np.testing.assert_array_equal(out["caption"], d["caption"])
    np.testing.assert_array_equal(d["brain_tok"], brain)         # the input is not modified
    np.testing.assert_array_equal(M.shuffled_pairing(d, 0)["brain_tok"], out["brain_tok"])   # seeded
    both = M.shuffled_pairing(d, 0, ("train", "test"))
    assert (labels[both["brain_tok"][d["train"], 0]] != labels[d["train"]]).all()


def test_plant_deficit_removes_the_planted_amount():
    """plant_deficit swaps images for their broken-pair scores in a random order until the mean has
    fallen by the deficit: exact to one image's share; the fraction swapped is about deficit / gap; the
    units are either the true or the swapped ones; where the gap is smaller, all swap (the whole gap)."""
    from reprozoo.methods.mind_omni import method as M

    rng = np.random.default_rng(1)
    n = 4000
    true = np.clip(rng.normal(0.5, 0.3, n), -1, 1)
    swapped = np.clip(rng.normal(0.0, 0.3, n), -1, 1)
    gap = true.mean() - swapped.mean()
    out, f = M.plant_deficit(true, swapped, 0.1, np.random.default_rng(0))
    assert 0.1 <= true.mean() - out.mean() <= 0.1 + np.abs(true - swapped).max() / n
    assert f == pytest.approx(0.1 / gap, abs=0.02)
    assert np.all((out == true) | (out == swapped))
    assert np.sum(out != true) == round(f * n)
    out, f = M.plant_deficit(true, true - 0.05, 0.1, np.random.default_rng(0))
    assert f == 1.0 and true.mean() - out.mean() == pytest.approx(0.05)


def test_planted_control_fails_the_tie_passing_claims_that_a_tie_passes():
    """The control's purpose (cold review, issue 27): a joint model that TIES the single-task models on
    every task passes both non-inferiority claims; the same model with the planted deficit (0.1, config)
    fails both, and fails the synergy claim. So the control sits near the margins, not at chance."""
    import pandas as pd

    from reprozoo.claims import evaluate_expr
    from reprozoo.registry import get

    spec = get("mind_omni")
    p = spec.config("smoke")
    deficit = float(p["planted_deficit"])
    assert deficit == pytest.approx(2 * max(c.margin or 0 for c in spec.claims))   # twice the larger margin
    claims = {c.id: c for c in spec.claims}

    def value(cid, diff):
        rows = []
        for t in p["baseline_tasks"]:
            rows += [dict(metric=f"cc_{t}", variant="single_task_joint_batch", seed=0, x=np.nan, value=0.4),
                     dict(metric=f"cc_{t}", variant="joint", seed=0, x=np.nan, value=0.4 + diff)]
        return evaluate_expr(claims[cid].expr, pd.DataFrame(rows), 0)

    def holds(cid, diff):
        c = claims[cid]
        v, thr = value(cid, diff), c.threshold - (c.margin or 0)
        return v > thr if c.op == ">" else v >= thr

    assert holds("matches_or_beats_most_tasks", 0.0) and holds("competitive_on_every_task", 0.0)
    for cid in claims:
        assert not holds(cid, -deficit), cid


def test_pipeline_runs_with_the_same_init_constant_rates_and_the_planted_control(tmp_path):
    """ci-size cells of every variant: every task scored per test image and chance-corrected; each
    model's gate curves and constant learning rate recorded; every model starts from the same weights
    (the first per-task validation loss is identical between joint and the single-task models); the
    planted control trains the joint model itself (the same validation curves) and records a planted
    fraction in [0, 1] and its units for every task."""
    from reprozoo import registry
    from reprozoo.runtime import RunContext
    from reprozoo.methods.mind_omni import method as M

    p = registry.get("mind_omni").config("ci")
    p["fit"].update(pilot_steps=2, eval_every=2, min_steps=4, max_steps=6)
    base = list(p["baseline_tasks"])
    out = {}
    for v in M.VARIANTS:
        ctx = RunContext(method="mind_omni", variant=v, seed=0, scale="ci", params=p, data={}, outdir=tmp_path,
                         shared_dir=tmp_path)
        if v == "joint":
            M.train_shared(ctx)
        M.train(ctx)
        out[v] = ctx.metrics
    n_test = p["split"]["test"]
    for v, m in out.items():
        labels = base if v == "single_task_joint_batch" else ["joint"]
        tasks = base if v == "single_task_joint_batch" else list(T.TASKS)
        for lab in labels:
            xs, lrs = m.curves[f"lr_{lab}"]
            assert len(set(lrs)) == 1 and lrs[0] > 0                  # a constant rate: the gate's floor holds
            assert m.curves[f"val_{lab}"][0] == xs
        for t in tasks:
            assert len(m.unit_values[f"cc_{t}"]) == n_test
            assert np.isfinite(m.scalars[f"cc_{t}"])
            if v != "joint_planted":
                assert m.scalars[f"cc_{t}"] == pytest.approx(T.chance_corrected(t, m.scalars[f"score_{t}"]))
            else:
                assert 0 <= m.scalars[f"planted_fraction_cc_{t}"] <= 1
            if v != "single_task_joint_batch":
                assert m.curves[f"val_joint_{t}"][1] == m.curves[f"val_loss_{t}"][1]
            if v == "single_task_joint_batch":
                assert m.curves[f"val_loss_{t}"][1][0] == pytest.approx(out["joint"].curves[f"val_loss_{t}"][1][0])
        if v == "single_task_joint_batch":
            assert not any(f"cc_{t}" in m.scalars for t in T.TASKS if t not in base)
    assert (out["joint"].scalars["batch_size"] == out["joint_planted"].scalars["batch_size"]
            == out["single_task_joint_batch"].scalars["batch_size"] == 28)
    # the control is the joint model itself: the same validation curve
    np.testing.assert_allclose(out["joint_planted"].curves["val_joint"][1], out["joint"].curves["val_joint"][1])


def test_bqa_evaluation_sets_ask_every_question_of_every_image():
    """Validation and test BQA rows: each image once per question, image-major, with that question's answer
    as the one target (one question per validation image was a stopping curve too noisy to tell the answer
    prior from a model that reads the brain)."""
    from reprozoo.methods.mind_omni import method as M

    rng = np.random.default_rng(0)
    n, nq = 12, len(D.QUESTIONS)
    caption = np.stack([np.arange(n) % 10, 10 + np.arange(n) % 2, 12 + np.arange(n) % 3], 1)
    d = {"brain_tok": rng.integers(0, 8, (n, 16)), "image_tok": rng.integers(0, 8, (n, 4)),
         "caption": caption, "answers": D.bqa_answers(caption), "val": np.arange(6), "test": np.arange(6, 12),
         "brain_centroids": np.zeros((8, 4)), "image_centroids": np.zeros((8, 16))}
    lay = M._layout(d)
    for split in ("val", "test"):
        x, t = M._eval_sets(d, lay, split, ["bqa"])["bqa"]
        idx = d[split]
        assert len(x) == nq * len(idx)
        assert t.sum(1).tolist() == [1] * len(x) and t[:, lay.span["answer"]].all()
        q = x[:, lay.span["question"]][:, 0] - lay.offset["question"]
        np.testing.assert_array_equal(q, np.tile(np.arange(nq), len(idx)))
        a = x[:, lay.span["answer"]][:, 0] - lay.offset["answer"]
        np.testing.assert_array_equal(a, d["answers"][np.repeat(idx, nq), q])


def test_paper_loss_is_the_weighted_sum_of_per_task_means_of_per_example_masked_ce():
    """The authors' loss: per example, the mean CE over its masked targets; per task, the mean over its
    examples; in total, the weighted sum over tasks (encoding 0.5, the rest 1). One task with weight 1 is the
    mean over examples (not the shared token mean, which weights examples by their masked count)."""
    import torch

    from reprozoo.blocks.masked_token_transformer import MaskedTokenTransformer, mask_targets, masked_token_loss
    from reprozoo.methods.mind_omni import method as M

    assert [M.task_weight(t) for t in T.TASKS] == [0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    torch.manual_seed(0)
    model = MaskedTokenTransformer(20, 6, 16, 1, 2, 2.0)
    x = torch.randint(0, 20, (8, 6))
    t = torch.zeros(8, 6, dtype=torch.bool)
    t[:4, :5] = True                     # task 0: five targets per row
    t[4:, 5] = True                      # task 1: one target per row
    noised, masked, _ = mask_targets(x, t, model.mask_id, torch.Generator().manual_seed(3))
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model(noised).transpose(1, 2), x, reduction="none")
    per_ex = torch.stack([ce[i][masked[i]].mean() for i in range(8)])
    torch.set_grad_enabled(False)
    two = M.paper_loss(model, x, t, [0.5, 1.0], None, torch.Generator().manual_seed(3))
    assert float(two) == pytest.approx(float(0.5 * per_ex[:4].mean() + per_ex[4:].mean()), rel=1e-5)
    one = M.paper_loss(model, x, t, [1.0], None, torch.Generator().manual_seed(3))
    assert float(one) == pytest.approx(float(per_ex.mean()), rel=1e-5)
    ref = masked_token_loss(model, x, t, None, torch.Generator().manual_seed(3))
    assert float(one) != pytest.approx(float(ref), rel=1e-3)     # not the pooled token mean
    # finite under the logit bias that forbids every non-target token (-inf off the masked positions)
    bias = torch.zeros(6, 20)
    bias[:, 10:] = -float("inf")
    xb = x % 10
    assert torch.isfinite(M.paper_loss(model, xb, t, [0.5, 1.0], bias, torch.Generator().manual_seed(3)))
    torch.set_grad_enabled(True)


def test_math_attention_kernel_is_the_default_attention():
    """train() runs on torch's math attention kernel (cheaper on CPU at this size): the same loss and
    gradients as the default kernel, up to float rounding."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from reprozoo.blocks.masked_token_transformer import MaskedTokenTransformer, masked_token_loss

    torch.manual_seed(0)
    model = MaskedTokenTransformer(30, 25, 32, 1, 4, 2.0)
    x = torch.randint(0, 30, (56, 25))
    t = torch.rand(56, 25) < 0.5
    out = []
    for backend in (None, SDPBackend.MATH):
        model.zero_grad()
        if backend is None:
            loss = masked_token_loss(model, x, t, None, torch.Generator().manual_seed(1))
        else:
            with sdpa_kernel(backend):
                loss = masked_token_loss(model, x, t, None, torch.Generator().manual_seed(1))
        loss.backward()
        out.append((float(loss), [p.grad.clone() for p in model.parameters()]))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-5)
    for a, b in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_matches_count_is_finite_on_the_margin_and_counts_each_task_once():
    """matches_or_beats_most_tasks counts tasks within 0.02 (ours) of the single-task model: a difference
    exactly on the margin counts one half (the old x/|x| form divided by zero there; within 1e-9 of it the count
    is a linear ramp); above it 1, below 0."""
    import pandas as pd

    from reprozoo.claims import evaluate_expr
    from reprozoo.registry import get

    spec = get("mind_omni")
    claim = next(c for c in spec.claims if c.id == "matches_or_beats_most_tasks")
    tasks = list(spec.config("smoke")["baseline_tasks"])
    assert len(tasks) == 5

    def value(diffs):
        rows = []
        for t, dlt in zip(tasks, diffs):
            rows += [dict(metric=f"cc_{t}", variant="single_task_joint_batch", seed=0, x=np.nan, value=0.3),
                     dict(metric=f"cc_{t}", variant="joint", seed=0, x=np.nan, value=0.3 + dlt)]
        return evaluate_expr(claim.expr, pd.DataFrame(rows), 0)

    assert value([0.1] * 5) == 5.0
    assert value([-0.1] * 5) == 0.0
    assert value([-0.02] * 5) == pytest.approx(2.5, abs=1e-6)  # on the margin (to rounding): one half each, finite
    assert value([0.0, 0.0, -0.05, -0.05, -0.019]) == 3.0


def test_claims_read_only_tasks_with_a_baseline_and_the_planted_control():
    """Every claim reads cc of the smoke config's baseline tasks only (the composite tasks have no
    single-task model), and its control replaces joint by the planted-deficit joint model."""
    from reprozoo.claims import tokens
    from reprozoo.registry import get

    spec = get("mind_omni")
    base = set(spec.config("smoke")["baseline_tasks"])
    for c in spec.claims:
        read = {m for m, _ in tokens(c.expr)}
        assert read == {f"cc_{t}" for t in base}, c.id
        assert c.control == {"joint": "joint_planted"}


def test_one_stopping_rule_for_every_model_at_smoke():
    """The joint models and the single-task models share one fit block (grid, pilot, min_steps,
    flat_tol, lr_drop): min_steps is at least the 1000 steps at which the cold review's probe found the
    single-task QA model still improving (the old 300 stopped the single-task models on a noise floor)."""
    from pathlib import Path

    import yaml

    from reprozoo.methods.mind_omni import method as M

    cfg = yaml.safe_load((Path(M.__file__).parent / "configs" / "smoke.yaml").read_text())
    assert cfg["fit"]["min_steps"] >= 1000
    assert "stop_on" not in cfg["fit"]                    # the joint model's stop_on: all is the default
