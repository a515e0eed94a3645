"""Probe (not part of the pipeline): can a change of the land/sea data in the cap make a trained
encoder beat the proximity reference there? One seed, the land/sea head only, the smoke config's
head and rule (``head.fit_classifier``), the repo's points and k-NN reference
(``data.land_sea_points``, ``data.land_sea_knn``), 10 000 test points in the cap.

Two data changes are probed, alone and together:
  n_local   fewer labelled training points in the cap (10 000 at smoke);
  rho_km    the label is a disc-majority filter of the GLOBE mask (land if more than half of 64
            sunflower-pattern samples within ``rho_km`` are land; 0 = the raw mask), which removes
            coastline detail below about rho, i.e. a noise-free target band-limited nearer to the
            Slepian encoder's resolution (about 2° at L = 91) than the raw 1 km mask.

    OMP_NUM_THREADS=1 python -m reprozoo.methods.slepian.knn_probe RHO_KM N_LOCAL VARIANTS [SEED]
    (VARIANTS: comma-separated, e.g. slepian,sh; 'none' for the k-NN reference alone)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from ...blocks.sphere import lat_lon, unit_vectors
from . import data
from .encoders import make_encoder
from .head import fit_classifier

N_DISC = 64


def disc_land_fraction(lat, lon, rho_km: float) -> np.ndarray:
    """Share of land among N_DISC equal-area (sunflower) samples within rho_km of each point."""
    k = np.arange(N_DISC)
    r, ph = np.sqrt((k + 0.5) / N_DISC), k * np.pi * (3 - np.sqrt(5))
    x = unit_vectors(lat, lon)
    e1 = np.cross(np.array([0.0, 0.0, 1.0]), x)
    n = np.linalg.norm(e1, axis=1, keepdims=True)
    e1 = np.where(n > 1e-9, e1 / np.maximum(n, 1e-12), np.array([1.0, 0.0, 0.0]))
    e2 = np.cross(x, e1)
    a = r * rho_km / data.EARTH_KM
    y = (np.cos(a)[None, :, None] * x[:, None, :] + np.sin(a)[None, :, None]
         * (np.cos(ph)[None, :, None] * e1[:, None, :] + np.sin(ph)[None, :, None] * e2[:, None, :]))
    la, lo = lat_lon(y.reshape(-1, 3))
    return data.is_land(la, lo).reshape(len(x), N_DISC).mean(1)


def main(rho: float, n_local: int, variants: list[str], seed: int = 0) -> None:
    import torch

    torch.set_num_threads(1)
    cfg = yaml.safe_load((Path(__file__).parent / "configs" / "smoke.yaml").read_text())
    p = {**cfg, "land_sea": {**cfg["land_sea"], "n_train_local": n_local, "n_test_local": 10000}}
    t = data.land_sea_points(p, np.random.default_rng(seed))
    if rho > 0:
        for s in ("train", "val", "test_local", "test_global"):
            t[f"{s}_y"] = (disc_land_fraction(t[f"{s}_lat"], t[f"{s}_lon"], rho) > 0.5).astype(np.int64)
    knn = data.land_sea_knn(t, p["region"])
    y = t["test_local_y"]
    print(f"rho {rho} nloc {n_local} seed {seed}: land frac {y.mean():.3f} knn k={int(knn['land_knn_k'])} "
          f"acc {np.mean(knn['test_local_knn_y'] == y):.4f} 1nn {np.mean(knn['test_local_nn_y'] == y):.4f}", flush=True)
    for v in variants:
        c0 = time.process_time()
        enc = make_encoder(v, p)
        clf, rec = fit_classifier(enc(t["train_lat"], t["train_lon"]), t["train_y"], enc(t["val_lat"], t["val_lon"]),
                                  t["val_y"], 2, p["head"], seed, progress=lambda m: None)
        acc = np.mean(clf.proba(enc(t["test_local_lat"], t["test_local_lon"])).argmax(1) == y)
        gacc = np.mean(clf.proba(enc(t["test_global_lat"], t["test_global_lon"])).argmax(1) == t["test_global_y"])
        print(f"  {v}: local {acc:.4f} global {gacc:.4f} lr {rec['lr']} stop {rec['stop']} plateau {rec['plateau']} "
              f"cpu {time.process_time() - c0:.1f}", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]), [v for v in sys.argv[3].split(",") if v != "none"],
         int(sys.argv[4]) if len(sys.argv) > 4 else 0)
