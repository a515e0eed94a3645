"""Masked-token transformer block: bidirectional attention, the forward masking process, greedy
reverse decoding (schedule, visible tokens untouched) and recovery of a planted mapping."""
import torch

from reprozoo.blocks.masked_token_transformer import (MaskedTokenTransformer, decode_greedy, mask_targets,
                                                      masked_token_loss)


def test_every_position_sees_every_other():
    torch.manual_seed(0)
    m = MaskedTokenTransformer(vocab=7, seq_len=5, dim=16, depth=1, heads=2).eval()
    x = torch.randint(0, 7, (1, 5))
    y = x.clone()
    y[0, 4] = (x[0, 4] + 1) % 7           # change the LAST token
    d = (m(x) - m(y)).abs().amax(-1)[0]
    assert (d[:4] > 1e-6).all()            # the first positions' logits change: not causal


def test_masking_rate_follows_t_and_touches_only_targets():
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, 5, (20000, 10), generator=g)
    target = torch.zeros(20000, 10, dtype=torch.bool)
    target[:, 3:] = True
    noised, masked, t = mask_targets(tok, target, 5, g)
    assert not masked[:, :3].any() and (noised[:, :3] == tok[:, :3]).all()
    assert masked.any(1).all()                                    # at least one masked per row
    assert (noised[masked] == 5).all()
    # E[#masked | t] = 7 t (+ the forced one when none drawn): mean rate ~ 1/2 over t ~ U(0, 1)
    rate = masked[:, 3:].float().mean().item()
    assert abs(rate - (0.5 + (1 / 8) / 7)) < 0.01                 # P(none drawn) = E[(1-t)^7] = 1/8


def test_decode_fills_targets_on_cosine_schedule_and_keeps_visible():
    torch.manual_seed(0)
    m = MaskedTokenTransformer(vocab=6, seq_len=8, dim=16, depth=1, heads=2).eval()
    tok = torch.randint(0, 6, (4, 8))
    target = torch.zeros(4, 8, dtype=torch.bool)
    target[:, 2:] = True
    out = decode_greedy(m, tok, target, steps=3)
    assert (out[:, :2] == tok[:, :2]).all()
    assert (out != m.mask_id).all() and (out < 6).all()
    # a one-step decode equals the argmax of one forward pass on the fully masked targets
    x = torch.where(target, torch.full_like(tok, m.mask_id), tok)
    one = decode_greedy(m, tok, target, steps=1)
    assert torch.equal(one[:, 2:], m(x).argmax(-1)[:, 2:])


def test_learns_a_planted_bidirectional_mapping():
    """Second half = (first half + 1) mod V reversed; predicting it from the first half and the first
    half from the second both need attention in both directions. Trained briefly, greedy decoding
    must recover it almost exactly in both directions."""
    torch.manual_seed(0)
    v, h = 5, 4
    m = MaskedTokenTransformer(vocab=v, seq_len=2 * h, dim=32, depth=2, heads=4)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)

    def batch(n):
        a = torch.randint(0, v, (n, h))
        return torch.cat([a, ((a + 1) % v).flip(1)], 1)
    for _ in range(300):
        x = batch(64)
        half = torch.rand(64, 1) < 0.5
        target = torch.cat([half.expand(64, h), ~half.expand(64, h)], 1)
        loss = masked_token_loss(m, x, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    x = batch(200)
    for first in (True, False):
        target = torch.zeros(200, 2 * h, dtype=torch.bool)
        target[:, h:] = first
        target[:, :h] = not first
        out = decode_greedy(m, x, target, steps=2)
        assert (out == x).all(1).float().mean() > 0.95
