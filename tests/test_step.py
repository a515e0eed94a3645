"""Step numerics: the MoE equations against transformers' forward, exact removal deltas, the
first-order loss change against finite differences, the closed-form re-fit, and planted dead experts."""
import copy

import numpy as np
import pytest
import torch

from reprozoo.methods.step import corpus, moe, pruning

CFG = {"vocab": 32, "hidden": 16, "layers": 2, "heads": 2, "kv_heads": 1, "experts": 6, "top_k": 2,
       "moe_intermediate": 8, "seq_len": 16, "aux_loss": 0.001}


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    m = moe.build_model(CFG, 0).double()
    m.config._experts_implementation = "eager"  # the library's grouped_mm kernel has no float64
    with torch.no_grad():  # a router with spread-out probabilities (zero init would route uniformly)
        for b in moe.moe_blocks(m):
            b.gate.weight.normal_(0, 1.0)
            b.experts.gate_up_proj.normal_(0, 0.3)
            b.experts.down_proj.normal_(0, 0.3)
    return m.eval()


@pytest.fixture(scope="module")
def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, CFG["vocab"], (4, CFG["seq_len"]), generator=g) for _ in range(2)]


def x_tokens(n=40, seed=2):
    return torch.randn(n, CFG["hidden"], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_block_equations_match_library_forward(model):
    b = moe.moe_blocks(model)[0]
    x = x_tokens()
    with torch.no_grad():
        # the library's router softmax runs in float32 even for a float64 model
        np.testing.assert_allclose(moe.block_output(b, x).numpy(), b(x[None]).reshape(-1, CFG["hidden"]).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_block_equations_match_library_grouped_mm_in_float32(model):
    m = copy.deepcopy(model).float()
    m.config._experts_implementation = "grouped_mm"
    b = moe.moe_blocks(m)[1]
    x = x_tokens().float()
    with torch.no_grad():
        np.testing.assert_allclose(moe.block_output(b, x).numpy(), b(x[None]).reshape(-1, CFG["hidden"]).numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_pruned_block_equals_dense_router_with_masked_logits(model):
    b = copy.deepcopy(moe.moe_blocks(model)[0])
    x = x_tokens()
    keep = [0, 2, 3, 5]
    with torch.no_grad():
        logits = torch.nn.functional.linear(x, b.gate.weight)
        logits[:, [1, 4]] = -torch.inf
        p = torch.softmax(logits, -1)
        top, idx = torch.topk(p, 2, -1)
        w = top / top.sum(-1, keepdim=True)
        ref = (w.unsqueeze(-1) * moe.outputs_at(b, x, idx)).sum(1)
        moe.prune_block(b, keep)
        np.testing.assert_allclose(moe.block_output(b, x).numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(b(x[None]).reshape(-1, CFG["hidden"]).numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    assert b.experts.gate_up_proj.shape[0] == b.gate.weight.shape[0] == len(keep)


def test_memory_accounting(model):
    pr = pruning.prune(model, [[0, 1, 2], [3, 4, 5]])
    assert moe.expert_param_count(pr) * 2 == moe.expert_param_count(model)
    saved = moe.param_bytes(model) - moe.param_bytes(pr)
    assert saved == moe.expert_param_count(model) // 2 * 8 + 2 * 3 * CFG["hidden"] * 8  # experts + router rows (float64)


def test_removal_deltas_match_brute_force_removal(model):
    b = moe.moe_blocks(model)[0]
    x = x_tokens()
    with torch.no_grad():
        dy, idx = pruning.removal_deltas(b, x)
        y = moe.block_output(b, x)
        for j in range(CFG["experts"]):
            bj = copy.deepcopy(b)
            moe.prune_block(bj, [e for e in range(CFG["experts"]) if e != j])
            yj = moe.block_output(bj, x)
            t, m = torch.where(idx == j)
            np.testing.assert_allclose(dy[t, m].numpy(), (yj - y)[t].numpy(), rtol=1e-9, atol=1e-12)
            untouched = ~(idx == j).any(1)
            np.testing.assert_allclose(yj[untouched].numpy(), y[untouched].numpy(), atol=1e-12)


def test_captured_gradient_is_dloss_dblock_output(model, batches):
    """<dL/dy, v> from the retained gradient equals a central finite difference of the mean
    next-token loss when v is added to the first MoE block's output."""
    ids = batches[0]
    blocks = moe.moe_blocks(model)
    cap = pruning._Capture(blocks, keep_output=True)
    try:
        model.zero_grad()
        nll = pruning.token_nll(model(input_ids=ids).logits, ids)
        nll[:, :-1].mean().backward()
        g = cap.y[0].grad.clone()
    finally:
        cap.close()
        model.zero_grad(set_to_none=True)
    v = torch.randn(g.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def loss_with(eps):
        h = blocks[0].register_forward_hook(lambda mod, inp, out: out + eps * v)
        try:
            with torch.no_grad():
                return float(pruning.token_nll(model(input_ids=ids).logits, ids)[:, :-1].mean())
        finally:
            h.remove()

    # the library's router softmax is float32, so the step must stay well above its rounding;
    # no top-k flips occur at this size (checked: the error scales as eps^2)
    errs = []
    for eps in (3e-3, 1e-3):
        fd = (loss_with(eps) - loss_with(-eps)) / (2 * eps)
        errs.append(abs(fd - float((g * v).sum())))
    assert errs[1] < 3e-4 * abs(fd)
    assert 5 < errs[0] / errs[1] < 13  # central difference: error ~ eps^2 (ratio 9)


def test_selected_tokens_are_the_highest_loss_positions():
    nll = torch.tensor([0.1, 3.0, -torch.inf, 2.0, 0.5, -torch.inf])
    assert pruning.selected_tokens(nll, 0.5).tolist() == [False, True, False, True, False, False]


def test_keep_sets_remove_lowest_scores_with_index_ties():
    s = [torch.tensor([3.0, 1.0, 1.0, 5.0]), torch.tensor([0.0, 0.0, 0.0, 0.0])]
    assert pruning.keep_sets(s, 0.5) == [[0, 3], [0, 1]]
    assert pruning.keep_sets(s, 0.25) == [[0, 1, 3], [0, 1, 2]]


def test_ridge_refit_recovers_planted_weights_and_shrinks_to_prior():
    rng = np.random.default_rng(0)
    phi = torch.as_tensor(rng.normal(size=(200, 12)))
    W = torch.as_tensor(rng.normal(size=(12, 3)))
    W0 = torch.as_tensor(rng.normal(size=(12, 3)))
    G, B = phi.T @ phi, phi.T @ (phi @ W)
    np.testing.assert_allclose(pruning.ridge_refit(G, B, W0, 1e-12).numpy(), W.numpy(), atol=1e-8)
    np.testing.assert_allclose(pruning.ridge_refit(G, B, W0, 1e8).numpy(), W0.numpy(), atol=1e-5)


@pytest.mark.parametrize("max_joint", [8192, 1])
def test_knowledge_preservation_reduces_layer_error(model, batches, max_joint):
    """Keeping every expert: the re-fit is a no-op (the dense weights already reconstruct the
    target exactly). Pruning half: the re-fitted block reconstructs the dense block on the
    calibration inputs better than the plain pruned one (joint and block-diagonal solves)."""
    same = pruning.prune(model, [list(range(6))] * 2)
    pruning.preserve_knowledge(same, model, batches, 1e-3, max_joint)
    for a, b in zip(moe.moe_blocks(same), moe.moe_blocks(model)):
        np.testing.assert_allclose(a.experts.down_proj.detach().numpy(), b.experts.down_proj.detach().numpy(), atol=1e-8)

    keep = [[0, 1, 2], [1, 3, 5]]
    plain, refit = pruning.prune(model, keep), pruning.prune(model, keep)
    pruning.preserve_knowledge(refit, model, batches, 1e-3, max_joint)
    cap = pruning._Capture(moe.moe_blocks(model)[:1], keep_output=False)
    with torch.no_grad():
        model(input_ids=torch.cat(batches))
    cap.close()
    x = cap.x[0]  # layer 0's input is the same for every model (nothing pruned before it)
    with torch.no_grad():
        target = moe.block_output(moe.moe_blocks(model)[0], x)
        err_refit, err_plain = (float(((moe.block_output(moe.moe_blocks(m)[0], x) - target) ** 2).sum())
                                for m in (refit, plain))
    assert err_refit < 0.8 * err_plain


def test_reap_finds_planted_dead_experts(batches):
    """Experts whose down projection is zero contribute nothing: REAP must remove them first even
    though the router selects them often. (Step's score is NOT zero for them: removing one
    re-routes its tokens to another expert, which changes the output; that is tested exactly in
    test_removal_deltas_match_brute_force_removal.)"""
    m = moe.build_model(CFG, 3).double().eval()
    m.config._experts_implementation = "eager"
    dead = [1, 4]
    with torch.no_grad():
        for b in moe.moe_blocks(m):
            b.gate.weight.normal_(0, 0.5)
            b.gate.weight[dead] += 0.5 * b.gate.weight.mean(0)  # dead experts are also popular
            b.experts.gate_up_proj.normal_(0, 0.3)
            b.experts.down_proj.normal_(0, 0.3)
            b.experts.down_proj[dead] = 0.0
    scores, usage = pruning.expert_scores(m, batches, "reap")
    for s in scores:
        assert set(pruning.keep_sets([s], 2 / 6)[0]).isdisjoint(dead)
        np.testing.assert_allclose(s[dead].numpy(), 0.0)
    assert all(float(u.sum()) == 2 * sum(x.numel() for x in batches) for u in usage)


def test_step_score_is_sum_of_selected_first_order_changes(model, batches):
    """Step's score from expert_scores equals sum_t |<dL_sel/dy_t, y_t(without j) - y_t>| assembled
    by hand for one batch, where L_sel is the mean loss of the selected highest-loss tokens only."""
    ids = batches[:1]
    scores, _ = pruning.expert_scores(model, ids, "step", 0.25)
    blocks = moe.moe_blocks(model)
    cap = pruning._Capture(blocks, keep_output=True)
    try:
        nll = pruning.token_nll(model(input_ids=ids[0]).logits, ids[0])
        sel = pruning.selected_tokens(nll.detach().reshape(-1), 0.25)
        nll.reshape(-1)[sel].mean().backward()
    finally:
        cap.close()
    assert int(sel.sum()) == round(0.25 * ids[0].shape[0] * (ids[0].shape[1] - 1))
    for i, b in enumerate(blocks):
        x, g = cap.x[i], cap.y[i].grad.reshape(-1, CFG["hidden"])
        ref = torch.zeros(CFG["experts"], dtype=torch.float64)
        with torch.no_grad():
            y = moe.block_output(b, x)
            _, idx, _ = moe.route(b, x)
            for j in range(CFG["experts"]):
                bj = copy.deepcopy(b)
                moe.prune_block(bj, [e for e in range(CFG["experts"]) if e != j])
                hit = (idx == j).any(1)
                ref[j] = ((moe.block_output(bj, x) - y) * g).sum(-1)[hit].abs().sum()
        np.testing.assert_allclose(scores[i].numpy(), ref.numpy(), rtol=1e-8, atol=1e-14)
    model.zero_grad(set_to_none=True)


def test_step_gradient_comes_from_the_selected_tokens_only(model, batches):
    """Selective guidance: the last MoE layer's output gradient vanishes at every unselected position
    (its output reaches only its own position's loss), and the scores change when the selection does:
    a token that is not selected contributes nothing to the differentiated objective."""
    ids = batches[0]
    blocks = moe.moe_blocks(model)
    cap = pruning._Capture(blocks, keep_output=True)
    try:
        nll = pruning.token_nll(model(input_ids=ids).logits, ids)
        sel = pruning.selected_tokens(nll.detach().reshape(-1), 0.25)
        nll.reshape(-1)[sel].mean().backward()
        g_last = cap.y[len(blocks) - 1].grad.reshape(-1, CFG["hidden"])
    finally:
        cap.close()
        model.zero_grad(set_to_none=True)
    assert float(g_last[~sel].abs().max()) == 0.0
    assert float(g_last[sel].abs().sum(-1).min()) > 0.0
    quarter, _ = pruning.expert_scores(model, [ids], "step", 0.25)
    every, _ = pruning.expert_scores(model, [ids], "step", 1.0)
    assert not torch.allclose(quarter[-1], every[-1])


def test_random_rule_is_seeded_and_removes_the_same_number():
    """The random control: reproducible per seed, different across seeds, and it removes exactly
    round(s * E) experts of every layer like every other rule."""
    m = moe.build_model(CFG, 0).eval()
    ids = [torch.randint(0, CFG["vocab"], (2, CFG["seq_len"]), generator=torch.Generator().manual_seed(3))]
    a, _ = pruning.expert_scores(m, ids, "random", seed=4)
    b, _ = pruning.expert_scores(m, ids, "random", seed=4)
    c, _ = pruning.expert_scores(m, ids, "random", seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert all(len(k) == CFG["experts"] - 3 for k in pruning.keep_sets(a, 0.5))


def test_corpus_splits_files_disjointly():
    train, held = corpus.byte_split(20, 5, None)
    files = corpus.stdlib_files(20)
    assert len(train) + len(held) == sum(f.stat().st_size + 1 for f in files)
    w = corpus.windows(held, 4, 32, None)
    assert w.shape == (4, 32) and w.max() < 256
    np.testing.assert_array_equal(w, corpus.windows(held, 4, 32, None))


def test_low_usage_share_is_the_least_any_rule_removes():
    """The balance precondition's metric: a uniform router gives frac; a router that never uses half
    its experts gives 0; and for any scores, the slots a rule's removed experts carried are at least
    this share (frequency pruning attains it)."""
    E = 8
    assert pruning.low_usage_share([torch.ones(E), torch.full((E,), 3.0)], 0.5) == pytest.approx(0.5)
    dead = torch.tensor([5.0, 0, 7, 0, 0, 1, 0, 3])
    assert pruning.low_usage_share([dead], 0.5) == pytest.approx(0.0)
    g = torch.Generator().manual_seed(0)
    usage = [torch.rand(E, generator=g) ** 3 * 100 for _ in range(2)]
    low = pruning.low_usage_share(usage, 0.5)

    def removed_share(scores):
        return np.mean([1 - float(u[k].sum() / u.sum()) for u, k in zip(usage, pruning.keep_sets(scores, 0.5))])

    assert removed_share(usage) == pytest.approx(low)  # frequency pruning
    for _ in range(20):
        assert removed_share([torch.rand(E, generator=g) for _ in usage]) >= low - 1e-12


def test_validation_and_test_windows_are_disjoint():
    """Model selection (plateau test, best weights) reads the first half of the held-out bytes, the
    table's perplexities the second half: no window is in both."""
    from reprozoo.methods.step import method

    held = np.arange(10_000) % 251
    p = {"model": {"seq_len": 32}, "fit": {"val_windows": 16}, "eval": {"windows": 16}}
    v, t = method.val_windows(held.astype(np.uint8), p), method.eval_windows(held.astype(np.uint8), p)
    assert v.shape == t.shape == (16, 32)
    vs = np.linspace(0, 5_000 - 32, 16).astype(int)          # validation starts: first half
    ts = 5_000 + np.linspace(0, 5_000 - 32, 16).astype(int)   # test starts: second half
    assert vs.max() + 32 <= 5_000 <= ts.min()
    np.testing.assert_array_equal(v, np.stack([held[s:s + 32] for s in vs]))
    np.testing.assert_array_equal(t, np.stack([held[s:s + 32] for s in ts]))

def test_training_loss_adds_the_per_layer_balance_loss_linearly():
    """The training objective is cross-entropy + aux_loss x the per-layer Switch balance loss (what
    balances each layer's router): affine in the coefficient with slope = the balance loss (>= 1 up
    to the top-k discreteness), and the library's own pooled loss is switched off (plain labels give
    the same cross-entropy)."""
    ids = torch.randint(0, CFG["vocab"], (3, CFG["seq_len"]), generator=torch.Generator().manual_seed(4))
    losses = {}
    for c in (0.0, 0.01, 0.03):
        cfg = {**CFG, "aux_loss": c, "balance": "per_layer"}
        m = moe.build_model(cfg, 0).eval()
        assert m.config.router_aux_loss_coef == 0.0
        with torch.no_grad():
            losses[c] = float(moe.training_loss(m, ids, cfg))
            plain = float(m(input_ids=ids, labels=ids).loss)
            bal = float(moe.switch_balance_loss(m(input_ids=ids, output_router_logits=True).router_logits, CFG["top_k"]))
        assert plain == pytest.approx(losses[0.0], rel=1e-6)
    slope = (losses[0.01] - losses[0.0]) / 0.01
    assert slope == pytest.approx(bal, rel=1e-3) and slope > 0.9
    assert (losses[0.03] - losses[0.0]) / 0.03 == pytest.approx(slope, rel=1e-4)


def test_switch_balance_loss_is_per_layer():
    """1 for a balanced router, about E/k for one that always picks the same k experts; and it sees
    an imbalance that the library's pooled loss misses: layer 0 using only experts {0, 1} and layer 1
    only {2, 3} looks half-balanced to the pooled loss, fully collapsed to the per-layer one."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    E, k, N = 4, 2, 400
    g = torch.Generator().manual_seed(0)
    # balanced: each token's top-2 is a random pair, every pair equally often, probabilities peaked
    pairs = torch.tensor([[0, 1], [2, 3], [0, 2], [1, 3], [0, 3], [1, 2]]).repeat(N // 6 + 1, 1)[:N]
    z = torch.full((N, E), -10.0)
    z.scatter_(1, pairs, 10.0)
    assert float(moe.switch_balance_loss((z, z), k)) == pytest.approx(1.0, abs=0.02)

    def peaked(experts):
        z = torch.full((N, E), -10.0) + 0.01 * torch.randn(N, E, generator=g)
        z[:, experts] = 10.0
        return z

    collapsed = float(moe.switch_balance_loss((peaked([0, 1]), peaked([0, 1])), k))
    swapped = float(moe.switch_balance_loss((peaked([0, 1]), peaked([2, 3])), k))
    assert collapsed == pytest.approx(E / k, rel=0.02) and swapped == pytest.approx(collapsed, rel=1e-3)
    pooled_same = float(load_balancing_loss_func((peaked([0, 1]), peaked([0, 1])), E, k))
    pooled_swapped = float(load_balancing_loss_func((peaked([0, 1]), peaked([2, 3])), E, k))
    assert pooled_swapped < 0.6 * pooled_same  # the pooled loss half-forgives the collapsed layers


def test_window_nll_units_average_to_the_held_out_loss(model, batches):
    """The claims' test units: one mean loss per window, in window order, whose mean is the loss
    over every target (equal-length windows), i.e. the log of the table's perplexity."""
    from reprozoo.methods.step import method

    units = method.window_nll(model, batches)
    assert units.shape == (sum(b.shape[0] for b in batches),)
    with torch.no_grad():
        allnll = torch.cat([pruning.token_nll(model(input_ids=b).logits, b)[:, :-1].reshape(-1) for b in batches])
        first = pruning.token_nll(model(input_ids=batches[0]).logits, batches[0])[0, :-1].mean()
    np.testing.assert_allclose(units.mean(), float(allnll.mean()), rtol=1e-12)
    np.testing.assert_allclose(units[0], float(first), rtol=1e-12)


# --- stop-51 cold review: selection, ranking against brute-force removal, the new controls ---------

PLANT = {"vocab": 8, "hidden": 16, "layers": 1, "heads": 2, "kv_heads": 1, "experts": 4, "top_k": 2,
         "moe_intermediate": 8, "seq_len": 32}


def planted_selection_model():
    """A one-layer Qwen3-MoE built by hand (no attention output, float64). Token 0 is "hard": its
    next byte is uniform over 1..7 (high loss); tokens 1..7 are "easy": their next byte is always 0
    (low loss). The router sends token 0 to expert A = 0 (expert 2 second, with a negligible gate) and
    tokens 1..7 to expert B = 1 (expert 3 second). A writes a direction that lowers the logit of
    token 0 after token 0 (it matters only on the high-loss positions, and a little); B writes one that
    makes the easy prediction more confident (it matters on the low-loss positions, and more in
    total). Experts 2 and 3 output nothing."""
    m = moe.build_model(PLANT, 0).double().eval()
    m.config._experts_implementation = "eager"
    A, B, I = 0, 1, PLANT["moe_intermediate"]
    with torch.no_grad():
        for q in m.parameters():
            q.zero_()
        layer = m.model.layers[0]
        for n in (m.model.norm, layer.input_layernorm, layer.post_attention_layernorm,
                  layer.self_attn.q_norm, layer.self_attn.k_norm):
            n.weight.fill_(1.0)
        for v in range(8):
            m.model.embed_tokens.weight[v, v] = 1.0
            m.model.embed_tokens.weight[v, 15] = 1.0
        b = moe.moe_blocks(m)[0]
        b.gate.weight[A, 0], b.gate.weight[2, 0] = 6.0, 2.0
        b.gate.weight[B, 1:8], b.gate.weight[3, 1:8] = 6.0, 2.0
        for e in (A, B):
            b.experts.gate_up_proj[e, 0, :8] = 1.0
            b.experts.gate_up_proj[e, I, :8] = 1.0
        b.experts.down_proj[A, 8, 0] = 1.0
        b.experts.down_proj[B, 9, 0] = 1.0
        H = m.lm_head.weight
        H[0, 1:8] = 0.3    # after an easy token, predict 0
        H[0, 8] = -0.5     # A: less mass on 0 after the hard token
        H[0, 9] = 0.5      # B: more confidence on 0 after an easy token
    return m


def test_selection_keeps_the_expert_that_matters_on_high_loss_tokens():
    """Planted selective guidance: expert A changes the loss only at the high-loss positions, expert B
    (more, in total) only at the low-loss ones. Scoring from every token's loss keeps B and drops A at
    75 % sparsity (one expert kept); scoring from the selected highest-loss half keeps A. Brute-force
    removal confirms what each choice costs: the selective choice leaves the high-loss tokens' loss
    unchanged, the all-token choice the mean loss over every token. (Top-2 routing keeps at least two
    experts, so the brute-force check removes A or B alone.)"""
    m = planted_selection_model()
    ids = torch.zeros(8, PLANT["seq_len"], dtype=torch.long)
    ids[:, 1::2] = torch.randint(1, 8, (8, PLANT["seq_len"] // 2), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        nll = pruning.token_nll(m(input_ids=ids).logits, ids)
    hard, easy = nll[:, 0:-1:2], nll[:, 1:-1:2]
    assert float(hard.min()) > float(easy.max())  # the selected half is exactly the hard positions
    sel, _ = pruning.expert_scores(m, [ids], "step", 0.5)
    every, _ = pruning.expert_scores(m, [ids], "step", 1.0)
    assert pruning.keep_sets(sel, 0.75) == [[0]]
    assert pruning.keep_sets(every, 0.75) == [[1]]
    assert float(sel[0][1]) == 0.0  # the easy positions carry no gradient when unselected
    with torch.no_grad():
        def loss_without(j):  # (high-loss positions, every position) with expert j alone removed
            out = pruning.token_nll(pruning.prune(m, [[e for e in range(4) if e != j]])(input_ids=ids).logits, ids)
            return float(out[:, 0:-1:2].mean()), float(out[:, :-1].mean())
        hard_no_a, all_no_a = loss_without(0)
        hard_no_b, all_no_b = loss_without(1)
    # removing B (the selective choice) leaves the high-loss tokens' loss as it was; removing A (the
    # all-token choice) raises it, and costs less over every token
    assert hard_no_b == pytest.approx(float(hard.mean()), abs=1e-9) and hard_no_a > hard_no_b + 0.05
    assert all_no_a < all_no_b


def test_step_scores_rank_experts_like_brute_force_removal_on_a_trained_toy():
    """Loss-aware evaluation on a tiny trained MoE (a random bigram language, 2 layers x 8 experts,
    300 Adam steps): Step's scores correlate with the true held-out loss of removing each expert alone
    (``method.single_removal_losses``), far better than random scores."""
    from reprozoo.methods.step import method

    cfg = {"vocab": 32, "hidden": 4, "layers": 2, "heads": 2, "kv_heads": 1, "experts": 8, "top_k": 2,
           "moe_intermediate": 16, "seq_len": 16, "aux_loss": 0.05}
    cum = np.cumsum(np.random.default_rng(0).dirichlet(np.full(32, 0.05), size=32), 1)

    def sample(n, rng):
        x = np.zeros((n, cfg["seq_len"]), np.int64)
        x[:, 0] = rng.integers(0, 32, n)
        for t in range(1, cfg["seq_len"]):
            x[:, t] = np.minimum((rng.random(n)[:, None] > cum[x[:, t - 1]]).sum(1), 31)
        return torch.as_tensor(x)

    m = moe.build_model(cfg, 0)
    with torch.no_grad():  # experts that matter from the start (the library's 0.02 init leaves them idle at this size)
        for b in moe.moe_blocks(m):
            b.experts.gate_up_proj.normal_(0, 0.5)
            b.experts.down_proj.normal_(0, 0.5)
            b.gate.weight.normal_(0, 0.5)
    opt = torch.optim.Adam(m.parameters(), lr=2e-2)
    rng = np.random.default_rng(1)
    for _ in range(300):
        loss = moe.training_loss(m, sample(32, rng), cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    calib = [sample(32, np.random.default_rng(2)) for _ in range(2)]
    truth = method.single_removal_losses(m, [sample(64, np.random.default_rng(3))])
    assert max(max(r) for r in truth) > 0.05  # the experts matter
    rho = {}
    for rule in ("step", "random"):
        s, _ = pruning.expert_scores(m, calib, rule, 0.5)
        rho[rule] = np.mean([pruning.rank_corr(a, torch.tensor(t)) for a, t in zip(s, truth)])
    assert rho["step"] > 0.5 and rho["step"] > rho["random"] + 0.3


def test_single_removal_losses_match_pruning_one_expert(model, batches):
    from reprozoo.methods.step import method

    truth = method.single_removal_losses(model, batches)
    assert [len(r) for r in truth] == [CFG["experts"]] * CFG["layers"]
    keep = [list(range(CFG["experts"])), [0, 1, 2, 4, 5]]
    ref = method.mean_nll(pruning.prune(model, keep), batches) - method.mean_nll(model, batches)
    assert truth[1][3] == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_random_token_selection_control_keeps_the_count_not_the_loss():
    """The step_randtok control: as many positions as the loss selection, drawn at random (seeded),
    never a position without a target."""
    nll = torch.cat([torch.linspace(0, 5, 99), torch.tensor([-torch.inf])])
    by_loss = pruning.selected_tokens(nll, 0.5)
    a = pruning.selected_tokens(nll, 0.5, torch.Generator().manual_seed(0))
    b = pruning.selected_tokens(nll, 0.5, torch.Generator().manual_seed(0))
    assert int(a.sum()) == int(by_loss.sum()) == 50 and not bool(a[-1])
    assert torch.equal(a, b) and not torch.equal(a, by_loss)


def test_rank_corr_and_keep_difference():
    assert pruning.rank_corr(torch.tensor([1.0, 2, 3, 4]), torch.tensor([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert pruning.rank_corr(torch.tensor([1.0, 2, 3, 4]), torch.tensor([4.0, 3, 2, 1])) == pytest.approx(-1.0)
    assert pruning.rank_corr(torch.tensor([1.0, 1, 1]), torch.tensor([1.0, 2, 3])) == 0.0
    assert pruning.keep_difference([[0, 1], [2, 3]], [[0, 1], [2, 3]]) == 0.0
    assert pruning.keep_difference([[0, 1], [2, 3]], [[0, 2], [2, 3]]) == 0.5   # one swap in one of two layers
