"""ViT block: patch order, locality of the embedding, permutation equivariance, a planted task."""
import torch

from reprozoo.blocks.transformer import VisionTransformer, patchify


def test_patchify_is_row_major_and_pixel_exact():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    p = patchify(x, 4)
    assert p.shape == (2, 4, 48)
    # patch 1 = row 0, column 1: pixels rows 0..3, cols 4..7 of every channel, (c, i, j) order
    torch.testing.assert_close(p[1, 1], x[1, :, 0:4, 4:8].reshape(-1))
    torch.testing.assert_close(p[0, 2], x[0, :, 4:8, 0:4].reshape(-1))


def test_embedding_is_local_to_its_patch():
    torch.manual_seed(0)
    vit = VisionTransformer(8, 4, 16, 1, 2)
    x = torch.rand(1, 3, 8, 8)
    x2 = x.clone()
    x2[0, :, 4:8, 4:8] += 1.0  # the bottom-right patch = token 1 + 3
    diff = (vit.embed_tokens(x2) - vit.embed_tokens(x)).abs().sum(-1)[0]
    assert diff[4] > 0 and torch.all(diff[[0, 1, 2, 3]] == 0)


def test_encoder_without_positions_is_permutation_equivariant():
    """Self-attention treats tokens as a set: permuting patches permutes spatial outputs, [CLS] fixed."""
    torch.manual_seed(1)
    vit = VisionTransformer(8, 2, 16, 2, 4, pos_embedding=False).eval()
    x = torch.rand(3, 3, 8, 8)
    perm = torch.randperm(16)
    t = vit.embed_tokens(x)
    t_perm = torch.cat([t[:, :1], t[:, 1:][:, perm]], dim=1)
    out, out_perm = vit.norm(vit.encoder(t)), vit.norm(vit.encoder(t_perm))
    torch.testing.assert_close(out_perm[:, 1:], out[:, 1:][:, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_perm[:, 0], out[:, 0], atol=1e-5, rtol=1e-5)


def test_learns_a_planted_position_dependent_task():
    """Label = is the bright square in the top half? Needs positions and attention to [CLS]."""
    torch.manual_seed(2)
    n = 256
    x = 0.05 * torch.rand(n, 1, 8, 8)
    y = torch.randint(0, 2, (n,))
    for i in range(n):
        r = int(torch.randint(0, 3, ()).item()) + (0 if y[i] == 1 else 4)
        c = int(torch.randint(0, 7, ()).item())
        x[i, 0, r:r + 2, c:c + 2] = 1.0
    vit = VisionTransformer(8, 2, 16, 1, 2, in_channels=1, n_out=2)
    opt = torch.optim.Adam(vit.parameters(), lr=3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(vit(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    acc = (vit(x).argmax(-1) == y).float().mean().item()
    assert acc > 0.95, acc
