"""blocks/causal_transformer.py: causality, exact sequence likelihood, ancestral sampling, recovery."""
import torch

from reprozoo.blocks.causal_transformer import CausalTransformer

torch.set_num_threads(1)


def _model(seed=0, vocab=5, seq_len=4):
    torch.manual_seed(seed)
    return CausalTransformer(vocab, seq_len, dim=16, depth=2, heads=2).eval()


def test_logits_at_position_i_ignore_tokens_at_and_after_i():
    m = _model()
    t = torch.randint(0, 5, (8, 4), generator=torch.Generator().manual_seed(1))
    base = m.logits(t)
    for j in range(4):
        t2 = t.clone()
        t2[:, j] = (t2[:, j] + 1) % 5
        diff = (m.logits(t2) - base).abs().amax(dim=(0, 2))
        assert torch.all(diff[: j + 1] < 1e-6), (j, diff)  # rows <= j never see token j
        if j < 3:
            assert diff[j + 1] > 1e-4  # the next row does


def test_log_prob_is_normalised_over_all_sequences():
    m = _model(vocab=3, seq_len=3)
    grid = torch.cartesian_prod(*[torch.arange(3)] * 3)
    with torch.no_grad():
        total = torch.logsumexp(m.log_prob(grid), 0)
    assert abs(float(total)) < 1e-5


def test_sampled_log_prob_matches_teacher_forced_log_prob_and_frequencies():
    m = _model(vocab=3, seq_len=2)
    tok, lp = m.sample(20000, torch.Generator().manual_seed(2))
    torch.testing.assert_close(lp, m.log_prob(tok), atol=1e-5, rtol=0)
    grid = torch.cartesian_prod(torch.arange(3), torch.arange(3))
    p = m.log_prob(grid).exp()
    freq = torch.stack([((tok == g).all(-1)).float().mean() for g in grid])
    assert (freq - p).abs().max() < 0.015


def test_maximum_likelihood_recovers_a_planted_dependent_joint():
    # t2 = t1 with prob 0.8, else uniform over the others: the model must learn the dependency
    g = torch.Generator().manual_seed(3)
    t1 = torch.randint(0, 4, (4096,), generator=g)
    other = (t1 + torch.randint(1, 4, (4096,), generator=g)) % 4
    t2 = torch.where(torch.rand(4096, generator=g) < 0.8, t1, other)
    data = torch.stack([t1, t2], 1)
    torch.manual_seed(0)
    m = CausalTransformer(4, 2, dim=16, depth=1, heads=2)
    opt = torch.optim.Adam(m.parameters(), lr=5e-3)
    for _ in range(200):
        idx = torch.randint(0, 4096, (256,), generator=g)
        loss = -m.log_prob(data[idx]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        pairs = torch.tensor([[k, k] for k in range(4)])
        cond = torch.softmax(m.logits(pairs)[:, 1], -1)  # P(t2 | t1 = k)
    p_same = cond[torch.arange(4), torch.arange(4)]
    assert torch.all((p_same - 0.8).abs() < 0.05), p_same
