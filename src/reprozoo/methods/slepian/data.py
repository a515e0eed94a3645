"""The three tasks: two from real data shipped inside pip wheels (read offline), one planted.

Land/sea (global-land-mask 1.0.0: the GLOBE 1 km land mask, 21600 x 43200 cells; lakes count as
land). Points are drawn uniformly in area, never on a grid, so no encoder is favoured by grid
alignment:
  train: ``n_train_global`` on the whole sphere + ``n_train_local`` in the region's cap
  val:   the same mix, smaller (validation loss curve only)
  test_local:  uniform in the cap                   -> ``local_acc``
  test_global: uniform on the sphere outside the cap -> ``global_acc``

Coastal index, a regional regression (from the same mask): points uniform in the cap, target
tanh(d / scale_km) with d the signed great-circle distance to the nearest coast (> 0 on land, < 0
at sea), the coastline traced on a ``grid_deg`` grid around the cap -> ``coast_mse`` (per test
point). The target is continuous and 1-Lipschitz in d, so nearest-neighbour lookup pays about half
the point spacing times the gradient everywhere, while a smooth encoder can interpolate between
training points. (It replaces a prefecture-of-city task on which 1-NN already matched every encoder.)

The proximity-only reference of both tasks (:func:`knn_reference`): k-nearest-neighbour prediction
from the same training points, inverse-great-circle-distance weighted, with k chosen from
``KNN_GRID`` on the validation points (land/sea: the validation points in the cap, since it is
compared with the encoders in the cap) -> ``local_knn_acc``, ``coast_knn_mse``; plain 1-NN is kept
for reference (``local_nn_acc``, ``coast_nn_mse``).

Regional field (issue 29; the regional classification the three local claims read, in place of
land/sea in the cap, which a nearest-neighbour lookup answers as well as any encoder): a smooth
random field in the cap, f(x) = sum_j a_j exp(-theta_j(x)^2 / (2 sigma^2)), a_j ~ N(0, 1), with
``n_bumps`` = ceil(((R + 3 sigma) / sigma)^2) centres uniform in the cap widened by 3 sigma (about
one bump per pi sigma^2, so the field is statistically the same everywhere in the cap); the label is
f(x) > 0. The boundaries are the zero-level set of a smooth field: smooth at the scale sigma and
non-local (the label of a point is set by the bumps around it, not by its nearest training point).
Points uniform in the cap, train / val / test -> ``local_acc``; the same k-NN reference (k chosen on
the validation points) -> ``local_knn_acc`` and 1-NN -> ``local_nn_acc``. Every seed draws its own
field.

All are drawn from the seed in ``train_shared`` and saved as ``tasks.npz``; every variant of the
seed reads the same points.
"""
from __future__ import annotations

import numpy as np

from ...blocks.sphere import angular_distance_deg, lat_lon, sample_cap, sample_sphere, unit_vectors

EARTH_KM = 6371.0
KNN_GRID = (1, 2, 4, 8, 16, 32)  # k of the inverse-distance-weighted k-NN reference, chosen on validation


def is_land(lat, lon) -> np.ndarray:
    """Land (True) or sea from the GLOBE mask in global-land-mask (importing it loads ~1 GB)."""
    from global_land_mask import globe

    return np.asarray(globe.is_land(np.asarray(lat, float), np.asarray(lon, float)), bool)


def sample_outside_cap(n: int, r: dict, rng: np.random.Generator) -> np.ndarray:
    out = np.empty((0, 3))
    while len(out) < n:
        x = sample_sphere(2 * n, rng)
        lat, lon = lat_lon(x)
        out = np.concatenate([out, x[angular_distance_deg(lat, lon, r["lat"], r["lon"]) > r["radius_deg"]]])
    return out[:n]


def land_sea_points(p: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """lat/lon/label arrays per split (keys ``<split>_lat``, ``<split>_lon``, ``<split>_y``)."""
    r, t = p["region"], p["land_sea"]

    def cap(n):
        return sample_cap(n, r["lat"], r["lon"], r["radius_deg"], rng)

    splits = {
        "train": np.concatenate([sample_sphere(t["n_train_global"], rng), cap(t["n_train_local"])]),
        "val": np.concatenate([sample_sphere(t["n_val_global"], rng), cap(t["n_val_local"])]),
        "test_local": cap(t["n_test_local"]),
        "test_global": sample_outside_cap(t["n_test_global"], r, rng),
    }
    out = {}
    for name, x in splits.items():
        lat, lon = lat_lon(x)
        out[f"{name}_lat"], out[f"{name}_lon"], out[f"{name}_y"] = lat, lon, is_land(lat, lon).astype(np.int64)
    return out


def coast_points_xyz(r: dict, c: dict) -> np.ndarray:
    """Unit vectors of the coastline around the cap: the midpoints of neighbouring cells of a
    ``grid_deg`` lat/lon grid (over the cap's box widened by ``pad_deg``) where the GLOBE mask changes
    between land and sea. Positions are good to about half a cell (0.025° = 3 km at 0.05°)."""
    res, pad = float(c["grid_deg"]), float(c["pad_deg"])
    lat0, lat1 = max(r["lat"] - r["radius_deg"] - pad, -89.9), min(r["lat"] + r["radius_deg"] + pad, 89.9)
    half_lon = (r["radius_deg"] + pad) / np.cos(np.radians(max(abs(lat0), abs(lat1))))
    la = np.arange(lat0, lat1 + res / 2, res)
    lo = np.arange(r["lon"] - half_lon, r["lon"] + half_lon + res / 2, res)
    LA, LO = np.meshgrid(la, lo, indexing="ij")
    M = is_land(LA.ravel(), LO.ravel()).reshape(LA.shape)
    mids = []
    for axis in (0, 1):
        a, b = [slice(None)] * 2, [slice(None)] * 2
        a[axis], b[axis] = slice(None, -1), slice(1, None)
        a, b = tuple(a), tuple(b)
        edge = M[a] != M[b]
        mids.append(unit_vectors(LA[a][edge], LO[a][edge]) + unit_vectors(LA[b][edge], LO[b][edge]))
    x = np.concatenate(mids)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class CoastDistance:
    """Signed great-circle distance to the nearest coast (km; > 0 on land, < 0 at sea) and its
    bounded form, the coastal index tanh(d / scale_km)."""

    def __init__(self, r: dict, c: dict):
        from scipy.spatial import cKDTree

        self.tree = cKDTree(coast_points_xyz(r, c))
        self.scale_km = float(c["scale_km"])

    def km(self, lat, lon) -> np.ndarray:
        chord, _ = self.tree.query(unit_vectors(lat, lon))
        return np.where(is_land(lat, lon), 1.0, -1.0) * 2 * np.arcsin(np.minimum(chord / 2, 1.0)) * EARTH_KM

    def index(self, lat, lon) -> np.ndarray:
        return np.tanh(self.km(lat, lon) / self.scale_km)


def idw_knn(train_xyz: np.ndarray, train_y: np.ndarray, query_xyz: np.ndarray, ks=KNN_GRID) -> dict[int, np.ndarray]:
    """For every k in ``ks``: the inverse-distance-weighted mean of the k nearest training targets
    (great-circle distance; a query on a training point takes that point's target). For 0/1 labels
    the mean is P(label 1), to be thresholded at 0.5."""
    from scipy.spatial import cKDTree

    kmax = min(max(ks), len(train_y))
    chord, idx = cKDTree(train_xyz).query(query_xyz, k=kmax)
    chord, idx = chord.reshape(len(query_xyz), kmax), idx.reshape(len(query_xyz), kmax)
    ang = 2 * np.arcsin(np.minimum(chord / 2, 1.0))
    w = 1.0 / np.maximum(ang, 1e-12)
    y = np.asarray(train_y, float)[idx]
    out = {}
    for k in ks:
        kk = min(k, kmax)
        out[k] = np.sum(w[:, :kk] * y[:, :kk], 1) / np.sum(w[:, :kk], 1)
    return out


def knn_reference(tr_lat, tr_lon, tr_y, va_lat, va_lon, va_y, te_lat, te_lon, classify: bool, ks=KNN_GRID):
    """The k-NN (inverse-distance weighted) prediction of the test points, k chosen on the validation
    points (accuracy for 0/1 labels, MSE otherwise); returns (test prediction, k, 1-NN test
    prediction)."""
    tr = unit_vectors(tr_lat, tr_lon)
    val = idw_knn(tr, tr_y, unit_vectors(va_lat, va_lon), ks)
    if classify:
        score = {k: np.mean((v > 0.5) == np.asarray(va_y, bool)) for k, v in val.items()}
        k = max(ks, key=lambda kk: (score[kk], -kk))  # ties: the smaller k
    else:
        score = {k: np.mean((v - va_y) ** 2) for k, v in val.items()}
        k = min(ks, key=lambda kk: (score[kk], kk))
    test = idw_knn(tr, tr_y, unit_vectors(te_lat, te_lon), sorted({1, k}))
    pred, nn = test[k], test[1]
    if classify:
        pred, nn = (pred > 0.5).astype(np.int64), (nn > 0.5).astype(np.int64)
    return pred, k, nn


def land_sea_knn(t: dict, r: dict) -> dict[str, np.ndarray]:
    """k-NN and 1-NN references of the land/sea test points in the cap, from all training points;
    k chosen on the validation points in the cap."""
    inside = angular_distance_deg(t["val_lat"], t["val_lon"], r["lat"], r["lon"]) <= r["radius_deg"]
    pred, k, nn = knn_reference(t["train_lat"], t["train_lon"], t["train_y"], t["val_lat"][inside],
                                t["val_lon"][inside], t["val_y"][inside], t["test_local_lat"],
                                t["test_local_lon"], classify=True)
    return {"test_local_knn_y": pred, "test_local_nn_y": nn, "land_knn_k": np.array(k)}


def coast_task(p: dict, rng: np.random.Generator, field: CoastDistance | None = None) -> dict[str, np.ndarray]:
    """The regional regression: points uniform in the cap, target the coastal index; keys
    ``coast_<split>_lat``/``_lon``/``_y`` for train, val, test, and the proximity-only references:
    ``coast_test_knn_y`` (inverse-distance-weighted k-NN, k = ``coast_knn_k`` chosen on the validation
    MSE) and ``coast_test_nn_y`` (1-NN: the great-circle nearest training point's target)."""
    r, c = p["region"], p["coast"]
    field = field or CoastDistance(r, c)
    return cap_task("coast", r, c, rng, field.index, classify=False)


def cap_task(prefix: str, r: dict, sizes: dict, rng: np.random.Generator, target, classify: bool) -> dict[str, np.ndarray]:
    """A task in the cap: ``sizes["n_<split>"]`` points uniform in the cap for train, val, test (keys
    ``<prefix>_<split>_lat``/``_lon``/``_y``, ``y = target(lat, lon)``) and the proximity references of the
    test points from the training points (:func:`knn_reference`, k chosen on validation):
    ``<prefix>_test_knn_y``, ``<prefix>_knn_k``, ``<prefix>_test_nn_y``."""
    out = {}
    for split in ("train", "val", "test"):
        lat, lon = lat_lon(sample_cap(int(sizes[f"n_{split}"]), r["lat"], r["lon"], r["radius_deg"], rng))
        out[f"{prefix}_{split}_lat"], out[f"{prefix}_{split}_lon"], out[f"{prefix}_{split}_y"] = lat, lon, target(lat, lon)
    pred, k, nn = knn_reference(*(out[f"{prefix}_{sp}_{a}"] for sp in ("train", "val") for a in ("lat", "lon", "y")),
                                out[f"{prefix}_test_lat"], out[f"{prefix}_test_lon"], classify=classify)
    out[f"{prefix}_test_knn_y"], out[f"{prefix}_knn_k"], out[f"{prefix}_test_nn_y"] = pred, np.array(k), nn
    return out


class BumpField:
    """The planted regional field: a sum of Gaussian bumps of width ``sigma_deg`` (great-circle), random
    N(0, 1) amplitudes, centres uniform in the cap of radius R + 3 sigma around the region's centre."""

    def __init__(self, r: dict, f: dict, rng: np.random.Generator):
        self.sigma = float(f["sigma_deg"])
        reach = float(r["radius_deg"]) + 3 * self.sigma
        n = int(np.ceil((reach / self.sigma) ** 2))
        self.centres = sample_cap(n, r["lat"], r["lon"], reach, rng)
        self.amp = rng.standard_normal(n)

    def value(self, lat, lon) -> np.ndarray:
        x = unit_vectors(lat, lon)
        ang = np.degrees(np.arccos(np.clip(x @ self.centres.T, -1.0, 1.0)))
        return np.exp(-0.5 * (ang / self.sigma) ** 2) @ self.amp

    def label(self, lat, lon) -> np.ndarray:
        return (self.value(lat, lon) > 0).astype(np.int64)


def near_zero_set(field: BumpField, lat, lon, within_deg: float, n_dir: int = 12, n_rad: int = 3) -> np.ndarray:
    """True where the field changes sign within ``within_deg`` of the point (great-circle): the label
    is probed at ``n_rad`` radii up to ``within_deg`` along ``n_dir`` directions, so a point is in the
    boundary band if the zero level set passes within ``within_deg`` (to the probe's resolution)."""
    x = unit_vectors(lat, lon)
    e1 = np.cross(np.array([0.0, 0.0, 1.0]), x)
    n = np.linalg.norm(e1, axis=1, keepdims=True)
    e1 = np.where(n > 1e-9, e1 / np.maximum(n, 1e-12), np.array([1.0, 0.0, 0.0]))
    e2 = np.cross(x, e1)
    s0 = field.value(lat, lon) > 0
    near = np.zeros(len(x), bool)
    for a in np.radians(within_deg) * np.arange(1, n_rad + 1) / n_rad:
        for ph in 2 * np.pi * np.arange(n_dir) / n_dir:
            y = np.cos(a) * x + np.sin(a) * (np.cos(ph) * e1 + np.sin(ph) * e2)
            near |= (field.value(*lat_lon(y)) > 0) != s0
    return near


def field_task(p: dict, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], BumpField]:
    """The regional field classification: keys ``field_<split>_lat``/``_lon``/``_y`` for train, val,
    test, the k-NN reference ``field_test_knn_y`` (k = ``field_knn_k``, chosen on the validation
    accuracy) and 1-NN ``field_test_nn_y``; returns the field too (for the truth map).
    Also (cold review): ``field_test_v``, the field's value at the test points, and ``field_span_lat``/
    ``_lon``/``_v``, ``n_span`` further points in the cap with the field's value (the least-squares span
    check of each encoder, ``field_span_r2``); ``field_test_boundary``, the test points within
    ``boundary_deg`` of the field's zero level set (the boundary-band accuracy)."""
    r, f = p["region"], p["field"]
    field = BumpField(r, f, rng)
    out = cap_task("field", r, f, rng, field.label, classify=True)
    out["field_test_v"] = field.value(out["field_test_lat"], out["field_test_lon"])
    lat, lon = lat_lon(sample_cap(int(f.get("n_span", 5000)), r["lat"], r["lon"], r["radius_deg"], rng))
    out["field_span_lat"], out["field_span_lon"], out["field_span_v"] = lat, lon, field.value(lat, lon)
    out["field_test_boundary"] = near_zero_set(field, out["field_test_lat"], out["field_test_lon"],
                                               float(f.get("boundary_deg", 1.0)))
    return out, field


def span_r2(E_fit: np.ndarray, v_fit: np.ndarray, E_eval: np.ndarray, v_eval: np.ndarray) -> float:
    """R² on (E_eval, v_eval) of the least-squares linear readout (with intercept) fitted on
    (E_fit, v_fit): how much of the field the encoder's features span in the cap."""
    A = np.concatenate([E_fit, np.ones((len(E_fit), 1))], 1)
    coef, *_ = np.linalg.lstsq(A, v_fit, rcond=None)
    pred = np.concatenate([E_eval, np.ones((len(E_eval), 1))], 1) @ coef
    return float(1.0 - np.mean((pred - v_eval) ** 2) / np.var(v_eval))


def box_grid(lat_range, lon_range, n: int) -> tuple[np.ndarray, np.ndarray]:
    """An n x n lat/lon grid (degrees) over a box, flattened row-major from the south-west corner."""
    LA, LO = np.meshgrid(np.linspace(*lat_range, n), np.linspace(*lon_range, n), indexing="ij")
    return LA.ravel(), LO.ravel()


def region_grid(r: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The grid of the land/sea maps: the box around the cap, longitudes Θ / cos(lat_centre) either
    side of the centre."""
    half_lon = r["radius_deg"] / np.cos(np.radians(r["lat"]))
    return box_grid((r["lat"] - r["radius_deg"], r["lat"] + r["radius_deg"]),
                    (r["lon"] - half_lon, r["lon"] + half_lon), n)
