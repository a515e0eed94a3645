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


def test_budget_is_equal_per_task_and_pipeline_runs(tmp_path):
    """ci-size cells of both variants: every task scored, same steps x batch per task."""
    from reprozoo import registry
    from reprozoo.runtime import RunContext
    from reprozoo.methods.mind_omni import method as M

    p = registry.get("mind_omni").config("ci")
    p["model"].update(steps=4, eval_every=2)
    out = {}
    for v in ("joint", "single_task"):
        ctx = RunContext(method="mind_omni", variant=v, seed=0, scale="ci", params=p, data={}, outdir=tmp_path,
                         shared_dir=tmp_path)
        if v == "joint":
            M.train_shared(ctx)
        M.train(ctx)
        out[v] = ctx.metrics
    for t in T.TASKS:
        assert np.isfinite(out["joint"].scalars[f"score_{t}"]) and np.isfinite(out["single_task"].scalars[f"score_{t}"])
        assert out["joint"].curves[f"val_loss_{t}"][0] == out["single_task"].curves[f"val_loss_{t}"][0]
    assert out["joint"].scalars["train_examples_per_task"] == out["single_task"].scalars["train_examples_per_task"]
