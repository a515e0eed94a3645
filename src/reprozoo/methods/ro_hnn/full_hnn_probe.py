"""Probe (not a variant): the full-dimensional HNN of the brief, measured against the smoke budget.

H = |p|^2 / 2 + V_theta(q) on all N site angles (the same separable latent HNN class, leapfrog with
4 sub-steps per sampling interval), trained on the same K-step rollout windows by the same shared
rule (``configs/smoke.yaml`` ``fit``) as every variant; reports its training CPU-s, whether it
reached the plateau, and its 10 T valid-prediction time. Run after a smoke run has written the
shared data of seed 0::

    python -m reprozoo.methods.ro_hnn.full_hnn_probe results/smoke/ro_hnn/_shared/seed0/chain.npz
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from ...blocks.fitting import fit_to_plateau
from .latent_dynamics import LatentHNN, rollout
from .method import KinkChain, long_horizon_metrics


def main(chain_npz: str, seed: int = 0) -> dict:
    torch.set_num_threads(1)
    cfg = yaml.safe_load((Path(__file__).parent / "configs/smoke.yaml").read_text())
    d = dict(np.load(chain_npz))
    big = d["q_train"].shape[-1]
    q_ref = d["q_train"].reshape(-1, big).mean(0)
    qz, pz, qv, pv = d["q_train"] - q_ref, d["p_train"], d["q_val"] - q_ref, d["p_val"]
    h, mc, k = cfg["h"], cfg["model"], cfg["model"]["window"]
    s_z = np.concatenate([np.full(big, qz.std()), np.full(big, pz.std())])  # one spread per half
    q_mean = qz.reshape(-1, big).mean(0)

    def build(gen):
        return LatentHNN(big, mc["dyn_width"], s_z[:big], gen, q_mean, substeps=4)

    qt, pt, w = torch.as_tensor(qz), torch.as_tensor(pz), torch.as_tensor(1 / s_z**2)
    starts = np.arange(0, qv.shape[1] - k, max(1, k // 2))
    vts = torch.as_tensor(starts[:, None] + np.arange(k + 1))
    vq = torch.as_tensor(qv)[:, vts].reshape(-1, k + 1, big)
    vp = torch.as_tensor(pv)[:, vts].reshape(-1, k + 1, big)

    def window_loss(m, tq, tp):
        rq, rp = rollout(m, tq[:, 0], tp[:, 0], h, k)
        return (((torch.cat([rq, rp], -1) - torch.cat([tq, tp], -1)) ** 2) * w).mean()

    def train_loss(m, gen):
        tr = torch.randint(qt.shape[0], (mc["batch"],), generator=gen)
        ts = torch.randint(qt.shape[1] - k, (mc["batch"],), generator=gen)[:, None] + torch.arange(k + 1)
        return window_loss(m, qt[tr[:, None], ts], pt[tr[:, None], ts])

    def val_loss(m):
        with torch.no_grad():
            return float(window_loss(m, vq, vp))

    c0 = time.process_time()
    model, rec = fit_to_plateau(build, train_loss, val_loss, cfg["fit"], seed + 1, "full_hnn", lambda *a: None)
    cpu = time.process_time() - c0
    vals = np.asarray(rec["vals"])
    tail = vals[int(0.7 * len(vals)):]
    with torch.no_grad():
        rq, rp = rollout(model, torch.as_tensor(d["q_test"][:, 0] - q_ref), torch.as_tensor(d["p_test"][:, 0]), h,
                         d["q_test"].shape[1] - 1)
    m = long_horizon_metrics(KinkChain.from_config(cfg["system"]), d["q_test"], d["p_test"], rq.numpy() + q_ref,
                             rp.numpy(), float(d["e_rest"]), d["q_train"].shape[1] - 1, cfg["vpt_threshold"], h)
    out = {"train_cpu_s": cpu, "steps": rec["stop"], "plateau": bool(rec["plateau"]), "lr": rec["lr"],
           "tail_improvement": float((tail[0] - tail.min()) / abs(tail[0])), "vpt": float(m["vpt"].mean()),
           "state_err_long": float(m["state_err_long"].mean())}
    print(out)
    return out


if __name__ == "__main__":
    main(sys.argv[1])
