"""Numerics of GeoPT's miniature: panel method vs closed form, ray casting, lifted targets, network."""
import numpy as np
import pytest

from reprozoo.methods.geopt.geometry import (inside, lifted_targets, nearest_on_boundary, polygon_area,
                                              random_shape, ray_cast, sample_outside, sdf)
from reprozoo.methods.geopt.panel import flow_velocity, solve_source_panels


def _circle(k, r=0.5):
    th = np.linspace(0, 2 * np.pi, k, endpoint=False)
    return r * np.stack([np.cos(th), np.sin(th)], 1)


def _cylinder_flow(x, r):
    r2 = np.sum(x**2, 1)
    c2, s2 = (x[:, 0] ** 2 - x[:, 1] ** 2) / r2, 2 * x[:, 0] * x[:, 1] / r2
    return np.stack([1 - r**2 * c2 / r2, -(r**2) * s2 / r2], 1)


def test_panel_method_matches_cylinder_closed_form_and_converges():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (400, 2))
    x = x[np.linalg.norm(x, axis=1) > 0.65]
    errs = []
    for k in (32, 64, 128):
        poly = _circle(k)
        sig = solve_source_panels(poly, np.array([1.0, 0.0]))
        errs.append(np.abs(flow_velocity(poly, sig, np.array([1.0, 0.0]), x) - _cylinder_flow(x, 0.5)).max())
        assert abs(sig.sum()) < 1e-10          # closed body: no net source
    assert errs[1] < 0.02 and errs[2] < 0.5 * errs[0]


def test_panel_method_no_penetration_and_free_stream_far_away():
    poly = random_shape(np.random.default_rng(3), 32)
    u = np.array([np.cos(0.3), np.sin(0.3)])
    sig = solve_source_panels(poly, u)
    from reprozoo.methods.geopt.geometry import outward_normals
    a, b = poly, np.roll(poly, -1, 0)
    mid = 0.5 * (a + b)
    n = outward_normals(poly)
    v = flow_velocity(poly, sig, u, mid + 1e-7 * n)          # just outside each panel midpoint
    assert np.abs(np.sum(v * n, 1)).max() < 1e-4   # sharp trailing edge: 3e-5
    far = flow_velocity(poly, sig, u, np.array([[50.0, 40.0]]))
    assert np.allclose(far, u, atol=1e-3)


def test_ray_cast_sdf_and_nearest_point_on_a_square():
    sq = np.array([[-0.5, -0.5], [0.5, -0.5], [0.5, 0.5], [-0.5, 0.5]])
    x = np.array([[-1.0, 0.1], [0.8, 0.0], [0.0, 0.0]])
    d = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    t = ray_cast(sq, x, d)
    assert np.allclose(t[[0, 2]], [0.5, 0.5]) and np.isinf(t[1])
    assert np.allclose(sdf(sq, x), [0.5, 0.3, -0.5])
    assert np.allclose(nearest_on_boundary(sq, np.array([[0.9, 0.9]])), [[0.5, 0.5]])
    assert inside(sq, np.array([[0.1, 0.2]]))[0] and not inside(sq, np.array([[0.6, 0.2]]))[0]


def test_lifted_walk_is_stopped_at_the_surface():
    sq = np.array([[-0.5, -0.5], [0.5, -0.5], [0.5, 0.5], [-0.5, 0.5]])
    x, d = np.array([[-1.0, 0.0]]), np.array([[1.0, 0.0]])
    y = lifted_targets(sq, x, d, np.array([0.3]), steps=3).reshape(3, 2)
    # walker at -0.7, then stopped at the wall -0.5 (not -0.4 inside): nearest vectors (0.2,0), (0,0), (0,0)
    assert np.allclose(y, [[0.2, 0.0], [0.0, 0.0], [0.0, 0.0]], atol=1e-9)
    # walking away from the body: the nearest vector grows by the step
    y2 = lifted_targets(sq, x, -d, np.array([0.3]), steps=2).reshape(2, 2)
    assert np.allclose(y2, [[0.8, 0.0], [1.1, 0.0]])


def test_random_shapes_are_ccw_simple_and_inside_the_box():
    rng = np.random.default_rng(1)
    for _ in range(20):
        p = random_shape(rng, 32)
        assert polygon_area(p) > 0.01 and np.abs(p).max() < 0.5
        x = sample_outside(p, rng, 50)
        assert not inside(p, x).any() and (sdf(p, x) > 0).all()


def test_network_is_permutation_invariant_in_boundary_points_and_transfers_backbone():
    torch = pytest.importorskip("torch")
    from reprozoo.methods.geopt.model import GeometrySimulator
    torch.manual_seed(0)
    m = GeometrySimulator(dim=16, layers=1, heads=2, slices=4, n_features=4, out_dim=6)
    b, q, c = torch.randn(2, 12, 4), torch.randn(2, 5, 2), torch.randn(2, 5, 3)
    perm = torch.randperm(12)
    assert torch.allclose(m(b, q, c), m(b[:, perm], q, c), atol=1e-5)
    before = {k: v.clone() for k, v in m.state_dict().items() if not k.startswith("head")}
    m.new_head(2, seed=1)
    assert m(b, q, c).shape == (2, 5, 2)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_fit_reduces_rel_l2_on_a_planted_flow():
    """Fine-tuning on the panel-method flows must learn something: error well below zero-prediction."""
    pytest.importorskip("torch")
    from reprozoo.methods.geopt.method import _tensors, evaluate, fit, make_flow_set
    from reprozoo.methods.geopt.model import GeometrySimulator
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    data = make_flow_set(np.random.default_rng(0), 4, 16, 32, 0.2)
    m = GeometrySimulator(dim=16, layers=1, heads=2, slices=4, n_features=8)
    split = _tensors(data, np.arange(4), "y")
    e0 = evaluate(m, split)
    fit(m, data, np.arange(4), "y", 300, {"lr": 5e-3, "batch": 4}, 0)
    assert evaluate(m, split) < 0.7 * min(e0, 1.0)
