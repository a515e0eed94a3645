"""Real orthonormal spherical harmonics and sphere geometry (reprozoo.blocks.sphere)."""
import numpy as np
import pytest
from scipy.special import eval_legendre, sph_harm_y

from reprozoo.blocks.sphere import (FOUR_PI, angular_distance_deg, cap_frame, gauss_cap_quadrature, lat_lon,
                                    real_sph_harm, real_sph_harm_xyz, sample_cap, sample_sphere, unit_vectors)


def test_matches_scipy_complex_harmonics():
    """Y_lm (ours, no Condon-Shortley phase) = √2 (-1)^m Re / Im of scipy's complex Y_l^|m|."""
    rng = np.random.default_rng(0)
    theta, phi = rng.uniform(0, np.pi, 50), rng.uniform(0, 2 * np.pi, 50)
    L = 12
    ours = real_sph_harm(L, np.cos(theta), phi)
    for l in range(L + 1):
        for m in range(-l, l + 1):
            c = sph_harm_y(l, abs(m), theta, phi)
            ref = c.real if m == 0 else np.sqrt(2) * (-1) ** m * (c.real if m > 0 else c.imag)
            np.testing.assert_allclose(ours[:, l * l + l + m], ref, atol=1e-12)


def test_orthonormal_under_exact_quadrature():
    """A cap of radius 180° is the sphere: the product rule integrates Y_i Y_j exactly."""
    L = 25
    mu, phi, w = gauss_cap_quadrature(L, 180.0)
    Y = real_sph_harm(L, mu, phi)
    np.testing.assert_allclose(w.sum(), FOUR_PI, rtol=1e-14)
    np.testing.assert_allclose((Y * w[:, None]).T @ Y, np.eye((L + 1) ** 2), atol=1e-11)


def test_addition_theorem_and_rotation_invariance():
    """Σ_m Y_lm(x) Y_lm(y) = (2l+1)/4π P_l(x·y): depends on the angle only (any frame, any l)."""
    L = 40
    rng = np.random.default_rng(1)
    x, y = sample_sphere(30, rng), sample_sphere(30, rng)
    Yx, Yy = real_sph_harm_xyz(L, x), real_sph_harm_xyz(L, y)
    c = np.sum(x * y, axis=1)
    for l in (0, 1, 7, 40):
        sl = slice(l * l, (l + 1) ** 2)
        np.testing.assert_allclose(np.sum(Yx[:, sl] * Yy[:, sl], 1), (2 * l + 1) / FOUR_PI * eval_legendre(l, c),
                                   atol=1e-11)


def test_pole_values_do_not_depend_on_longitude():
    lon = np.linspace(-180, 180, 37)
    for lat in (90.0, -90.0):
        Y = real_sph_harm_xyz(30, unit_vectors(np.full(37, lat), lon))
        assert np.max(np.abs(Y - Y[0])) < 1e-12


def test_cap_frame_and_sampling():
    F = cap_frame(37.0, 138.0)
    np.testing.assert_allclose(F @ F.T, np.eye(3), atol=1e-15)
    np.testing.assert_allclose(lat_lon(F[2]), (37.0, 138.0), atol=1e-12)
    assert F[0, 2] > 0  # e1 points north
    rng = np.random.default_rng(2)
    x = sample_cap(20000, 37.0, 138.0, 15.0, rng)
    d = angular_distance_deg(*lat_lon(x), 37.0, 138.0)
    assert d.max() <= 15.0 + 1e-9
    # uniform in area: the inner cap of radius 7.5° holds (1 - cos 7.5°) / (1 - cos 15°) of the points
    share = (1 - np.cos(np.radians(7.5))) / (1 - np.cos(np.radians(15.0)))
    assert abs(np.mean(d < 7.5) - share) < 4 * np.sqrt(share * (1 - share) / len(d))


@pytest.mark.parametrize("lat,lon", [(0.0, 0.0), (-33.0, 151.0), (89.0, -179.0)])
def test_lat_lon_round_trip(lat, lon):
    np.testing.assert_allclose(lat_lon(unit_vectors(lat, lon)), (lat, lon), atol=1e-10)
    np.testing.assert_allclose(angular_distance_deg(lat, lon, -lat, lon + 180.0), 180.0, atol=1e-9)
