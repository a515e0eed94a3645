"""Probe (not part of the pipeline): does the MLP candidate (neural.py) bring the cross-fitted FKL
within 10 % of the known KL on the non-Gaussian suite at the smoke TI sizes?

    python -m reprozoo.methods.functional_kl.neural_probe [case,case,...]

For each case of the non-Gaussian suite (smoke.yaml: 1000 Euler chains of P and of Q on the 9-time TI
grid, 48 nodes, affine + gate ridge candidates), it prints the known KL (discrete Girsanov, 50 000
chains), the sampling floor (exact Girsanov terms on the chains of P used), the ridge-only
cross-fitted estimate, the MLP-only estimates (crossfit and plain), the estimate with the MLP in the
per-node held-out choice (the pipeline's rule, fkl.estimate), the nodes it won, and the CPU seconds."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from . import method as M
from .bifurcation import chain_kl, euler_chain, girsanov_terms
from .fkl import NEURAL, FKLConfig, Features, estimate, lambda_nodes, pair_stats
from .neural import DEFAULT_FIT, neural_pair


def main(cases=("bif_rate", "bif_onset", "bif_tilt")) -> None:
    import torch

    torch.set_num_threads(1)
    p = yaml.safe_load(open(Path(__file__).parent / "configs" / "smoke.yaml"))
    cfg = FKLConfig.from_params(p["fkl"])
    ts, suite = M._grid(p), M.nonlinear_suite(p)
    _, wts = lambda_nodes(cfg)
    n = int(p["ti"]["n_ref"])
    for k, name in enumerate(suite):
        if name not in cases:
            continue
        P, Q = suite[name]
        rng = np.random.default_rng(200 + k)
        xp, xq = euler_chain(P, ts, n, rng), euler_chain(Q, ts, n, rng)
        kl, _ = chain_kl(P, Q, ts, 50000, np.random.default_rng(7919 + k))
        W = M._whitener(ts, P.sigma, p)
        feats = Features(W.L, 2, cfg.features)
        t0 = time.process_time()
        st = pair_stats(W(xp), W(xq), cfg, feats, np.random.default_rng(1), np.random.default_rng(2))
        ridge = estimate(st, cfg, feats.sizes, "crossfit")
        t1 = time.process_time()
        nn = neural_pair(W(xp), W(xq), cfg, DEFAULT_FIT, 5, progress=lambda s: print("  ", s))
        t2 = time.process_time()
        both = {e: estimate(st, cfg, feats.sizes, e, neural=nn) for e in ("crossfit", "plain")}
        won = int(np.sum(both["crossfit"]["chosen_family"] == NEURAL))
        print(f"{name}: known {kl:.3f} floor {girsanov_terms(P, Q, ts, xp).mean():.3f} | ridge crossfit "
              f"{ridge['forward']:.3f} | MLP only crossfit {np.sum(wts * nn['forward_crossfit']):.3f} plain "
              f"{np.sum(wts * nn['forward_plain']):.3f} | held-out choice crossfit {both['crossfit']['forward']:.3f} "
              f"(rel err {abs(both['crossfit']['forward'] / kl - 1):.2f}) plain {both['plain']['forward']:.3f}, "
              f"MLP at {won}/{len(wts)} nodes | CPU-s ridge {t1 - t0:.1f} MLP {t2 - t1:.1f}", flush=True)


if __name__ == "__main__":
    main(tuple(sys.argv[1].split(",")) if len(sys.argv) > 1 else ("bif_rate", "bif_onset", "bif_tilt"))
