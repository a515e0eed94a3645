"""Probe (not part of the pipeline): where do the estimator's two smoke-scale misses come from?

    python -m reprozoo.methods.functional_kl.estimator_probe [nonlinear|linear|odd ...]

``nonlinear`` (the non-Gaussian suite, smoke.yaml's rule: 48 nodes, affine + gate ridge candidates,
analytic affine moments): for each case, the known KL (discrete Girsanov sum over 200 000 chains) and
its standard error, and the KL between the moment-matched Gaussians of P and Q (mean and covariance of
200 000 chains each): the population limit of an affine noise predictor. Then, on ``bif_onset`` (the
worst case at smoke), the cross-fitted and plain estimates at 1000 chains per law (the TI's size) and
4000, two draws each, with the nodes the held-out rule gave to each feature set.

``odd``: the same at 1000 chains with two more nested sets in place of fkl.py's ``cubic`` / ``pairs``:
the odd monomials of the score of a cubic-drift Markov chain, v^3 and v^5 of every path value, and
v_k^2 v_(k+1) of time neighbours (the even ones fkl.py has cannot appear for a symmetric pitchfork),
with ridges up to 1000 (one draw; slow: about 20 CPU-s).

``linear``: the plain estimator's bias at KL = 0 (two samples of bm_drift's P, 17 times) at 3000 paths
per law (smoke) and 6000, two draws each, and at 3000 with the ridge grid widened to 1e4.
Paths are drawn from default_rng(100 + draw), the noise from default_rng(draw) and default_rng(draw + 50).

``fm [seeds]`` (not the estimator: the flow-matching baseline's convergence): trains
trajectory.train_flow_matching with smoke.yaml's ``flow_matching`` settings on the snapshots that the
last smoke run saved (results/smoke/functional_kl/_shared/seed<k>/data.npz) and prints the chosen rate,
the stop, and whether the gate's plateau test (2 %, claims.plateau) holds on the validation curve.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from . import method as M
from .bifurcation import chain_kl, euler_chain, girsanov_terms
from .fkl import FKLConfig, Features, estimate, pair_stats
from .linear_sde import gaussian_kl


class OddFeatures(Features):
    """``cubic`` -> v^3, v^5; ``pairs`` -> v_k^2 v_(k+1): same column counts, odd monomials."""

    def _raw(self, x, v, gates):
        out = Features._raw(self, x, None, gates)
        n, d = x.shape
        k = 1 + d + (2 if self.gated else 0)
        if v is not None:
            out[:, k:k + d] = v**3
            out[:, k + d:k + 2 * d] = v**5
            if "pairs" in self.families:
                V = v.reshape(n, self.M, self.D)
                out[:, k + 2 * d:].reshape(n, self.M - 1, self.D)[:] = V[:, :-1] ** 2 * V[:, 1:]
        return out


def _params() -> dict:
    return yaml.safe_load(open(Path(__file__).parent / "configs" / "smoke.yaml"))


def _run(xp, xq, ts, sigma, p, cfg, draw, features_cls=Features):
    W = M._whitener(ts, sigma, p)
    feats = features_cls(W.L, xp.shape[2], cfg.features)
    t0 = time.process_time()
    st = pair_stats(W(xp), W(xq), cfg, feats, np.random.default_rng(draw), np.random.default_rng(draw + 50))
    cross, plain = estimate(st, cfg, feats.sizes, "crossfit"), estimate(st, cfg, feats.sizes, "plain")
    fams = np.bincount(cross["chosen_family"], minlength=len(feats.sizes)).tolist()
    return cross["forward"], plain["forward"], fams, time.process_time() - t0


def nonlinear(odd: bool = False) -> None:
    p = _params()
    ts, suite = M._grid(p), M.nonlinear_suite(p)
    if not odd:
        for k, (name, (P, Q)) in enumerate(suite.items()):
            kl, se = chain_kl(P, Q, ts, 200000, np.random.default_rng(7919 + k))
            rng = np.random.default_rng(5)
            xp = euler_chain(P, ts, 200000, rng).reshape(200000, -1)
            xq = euler_chain(Q, ts, 200000, rng).reshape(200000, -1)
            kg = gaussian_kl(xp.mean(0), np.cov(xp.T), xq.mean(0), np.cov(xq.T))
            print(f"{name}: known {kl:.4f} (se {se:.4f}); moment-matched Gaussian KL {kg:.4f}", flush=True)
    P, Q = suite["bif_onset"]
    kl, _ = chain_kl(P, Q, ts, 200000, np.random.default_rng(7919 + 1))
    cfg = FKLConfig.from_params(p["fkl"])
    sizes, cls = (1000, 4000), Features
    if odd:
        cfg = FKLConfig.from_params({**p["fkl"], "features": ["affine", "gate", "cubic", "pairs"],
                                     "ridges": [0.1, 1.0, 10.0, 100.0, 1000.0]})
        sizes, cls = (1000,), OddFeatures
    for n in sizes:
        for draw in ((0,) if odd else (0, 1)):
            rng = np.random.default_rng(100 + draw)
            xp, xq = euler_chain(P, ts, n, rng), euler_chain(Q, ts, n, rng)
            c, pl, fams, cpu = _run(xp, xq, ts, P.sigma, p, cfg, draw, cls)
            floor = girsanov_terms(P, Q, ts, xp).mean()
            print(f"bif_onset{' odd sets' if odd else ''}, {n} chains per law, draw {draw}: known {kl:.3f} "
                  f"floor {floor:.3f} crossfit {c:.3f} (rel {c / kl - 1:+.3f}) plain {pl:.3f}; nodes per "
                  f"feature set {fams}; {cpu:.1f} CPU-s", flush=True)


def linear() -> None:
    p = _params()
    ts = np.linspace(0.0, 1.0, int(p["benchmark"]["grid_points"]))
    P = M.benchmark_suite()["bm_drift"][0]
    for n, ridges in ((3000, None), (6000, None), (3000, [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0])):
        cfg = FKLConfig.from_params({**p["fkl"], **({"ridges": ridges} if ridges else {})})
        for draw in (0, 1):
            rng = np.random.default_rng(100 + draw)
            xp, xq = P.sample_paths(ts, n, rng), P.sample_paths(ts, n, rng)
            c, pl, fams, cpu = _run(xp, xq, ts, P.sigma, p, cfg, draw)
            print(f"null (bm_drift's P twice), {n} paths per law, ridges {cfg.ridges}, draw {draw}: plain {pl:.4f} "
                  f"crossfit {c:.4f}; {cpu:.1f} CPU-s", flush=True)


def flow_matching(seeds=(0, 1, 2, 3, 4)) -> None:
    import torch

    from ...claims import plateau
    from .trajectory import ot_pairs, train_flow_matching

    torch.set_num_threads(1)
    p = _params()
    root = Path(__file__).resolve().parents[4] / "results" / "smoke" / "functional_kl" / "_shared"
    for seed in seeds:
        d = np.load(root / f"seed{seed}" / "data.npz")
        snaps = {float(t): d[f"snap_{k}"] for k, t in enumerate(d["times"])}
        t0 = time.process_time()
        _, rec = train_flow_matching(ot_pairs(snaps, sorted(p["ti"]["observed"])), p["flow_matching"], seed,
                                     progress=lambda s: None)
        ok = plateau(np.array(rec["steps"]), np.array(rec["vals"]), 0.02)
        print(f"flow matching seed {seed}: lr {rec['lr']:g} (edge {rec['lr_edge']}), stop {rec['stop']} "
              f"({'plateau' if rec['plateau'] else 'max steps'}), drop gain {rec['drop_gain']}, gate plateau "
              f"test {ok}, best {min(rec['vals']):.4f}; {time.process_time() - t0:.1f} CPU-s", flush=True)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["nonlinear", "linear"]
    if parts[0] == "fm":
        flow_matching(tuple(int(s) for s in parts[1].split(",")) if len(parts) > 1 else (0, 1, 2, 3, 4))
    for part in parts:
        if part == "fm":
            break
        {"nonlinear": nonlinear, "odd": lambda: nonlinear(odd=True), "linear": linear}[part]()
