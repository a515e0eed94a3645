"""Dense GCN block: Kipf-Welling normalisation and permutation equivariance."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.blocks.gcn import GCNStack, GraphConv, normalized_adjacency  # noqa: E402


def test_normalized_adjacency_of_a_path():
    a = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], float)
    # degrees with self loops: 2, 3, 2
    expect = np.array([[1 / 2, 1 / np.sqrt(6), 0], [1 / np.sqrt(6), 1 / 3, 1 / np.sqrt(6)], [0, 1 / np.sqrt(6), 1 / 2]])
    np.testing.assert_allclose(normalized_adjacency(a), expect)
    # the spectrum of D^-1/2 (A+I) D^-1/2 lies in (-1, 1] with top eigenvalue 1 (eigenvector sqrt(deg))
    w = np.linalg.eigvalsh(normalized_adjacency(a))
    assert w.max() == pytest.approx(1.0) and w.min() > -1.0
    with pytest.raises(ValueError):
        normalized_adjacency(np.array([[0, 1], [0, 0]]))


def test_graph_conv_is_the_propagation_rule():
    torch.manual_seed(0)
    a = np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]], float)
    conv = GraphConv(normalized_adjacency(a), 4, 5)
    h = torch.randn(2, 3, 4)
    ref = torch.as_tensor(normalized_adjacency(a), dtype=torch.float32) @ (h @ conv.lin.weight.T + conv.lin.bias)
    torch.testing.assert_close(conv(h), ref)


def test_gcn_stack_is_permutation_equivariant():
    torch.manual_seed(1)
    rng = np.random.default_rng(0)
    a = (rng.random((6, 6)) < 0.4).astype(float)
    a = np.triu(a, 1)
    a = a + a.T
    perm = rng.permutation(6)
    net = GCNStack(normalized_adjacency(a), 8, 3)
    net_p = GCNStack(normalized_adjacency(a[np.ix_(perm, perm)]), 8, 3)
    net_p.load_state_dict({k: v for k, v in net.state_dict().items() if not k.endswith("a_hat")}, strict=False)
    h = torch.randn(3, 6, 8)
    torch.testing.assert_close(net_p(h[:, perm]), net(h)[:, perm], rtol=1e-5, atol=1e-5)
