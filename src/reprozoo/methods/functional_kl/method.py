"""Functional KL in miniature: validate the path-space KL estimator, then rank trajectory inference.

Variants and what each cell computes:

* ``fkl_plain`` (method, the paper's estimator) and ``fkl_crossfit`` (method, ours: the same fits
  on two halves, inner product instead of square, see fkl.py) on two benchmark suites, from the
  same paths and the same regressor, chosen per node on held-out paths by one rule (fkl.py):

  - linear SDEs (``benchmark_cases``): ``n_paths`` exact paths of P and of Q on ``grid_points``
    times, against the closed-form Girsanov path KL (linear_sde.py). Metrics ``kl_est_<case>``,
    ``kl_closed_<case>``, ``kl_grid_<case>`` (exact KL of the grid marginals), ``rel_err_<case>`` =
    |est / closed - 1|, ``max_rel_err``, ``mean_rel_err``, ``null_kl`` (two samples of one law);
  - non-Gaussian laws (``nonlinear_cases``): Euler chains of bifurcating drifts (bifurcation.py) on
    the trajectory-inference grid with its path counts (``ti.n_ref`` paths of P, ``ti.n_particles``
    of Q), so this suite validates the estimator at the size at which it scores the TI methods.
    Known KL ``kl_known_<case>``: the discrete Girsanov sum, a Monte-Carlo mean over ``n_mc`` chains
    (standard error ``kl_known_se_<case>``). Metrics ``rel_err_<case>``, ``max_rel_err_nl``,
    ``mean_rel_err_nl``, ``null_kl_nl``, and the sampling floor ``rel_err_oracle_<case>`` /
    ``max_rel_err_nl_oracle``: the exact Girsanov terms averaged over the chains of P the estimator sees;
  - planted two-branch mixtures (``mixture_cases``, ``mixture.n_paths`` paths of each law): the
    adequacy (bias) check of the regressor, ``max_rel_err_gm``, with its sampling floor
    ``max_rel_err_gm_oracle`` (the exact log-density ratio over the same paths of P);
  - the negative control of both: the same estimator on a grid too coarse to carry the path law
    (``coarse_points`` times, the same paths subsampled): ``kl_est_coarse_<case>``,
    ``rel_err_coarse_<case>`` (against the path KL), ``max_rel_err_coarse`` / ``max_rel_err_nl_coarse``.
    By data processing the coarse-grid KL is below the path KL (``kl_grid_coarse_<case>``: its
    exact value for the linear cases).

  The regressor chosen at each node is recorded (``affine_nodes_<case>``: nodes where the affine set
  won; ``mlp_nodes_<case>``: nodes where the MLP candidate of neural.py won, when ``fkl.neural`` is
  set; ``chosen_family_<case>`` per node). The moments of every fit are computed once per seed in
  ``train_shared`` (benchmark.npz); each variant evaluates its own estimator from them.
* ``true_sde``, ``linear_interp``, ``ot_linear``, ``ot_bridge``, ``flow_matching`` (baselines: the
  trajectory-inference methods being evaluated, trajectory.py): from snapshots of the bifurcating
  SDE (bifurcation.py) at the observed times (held-out time removed) infer n paths on the path
  grid; score them by ``w1_heldout`` (exact W1, POT, between the method's particles at the held-out
  time and the held-out snapshot), ``w1_heldout_b`` (the same against a second, independent
  held-out snapshot: the A/A control of the ranking claim) and ``path_kl`` = FKL(true path law ||
  method's path law) (``path_kl_reverse`` the other direction), with the estimator ``ti.estimator``
  validated above. ``true_sde`` also records ``path_kl_null``: the KL to a second, independent
  sample of the true SDE (the A/A control of the separation claim).

Shared per seed (train_shared): the snapshots (independent particles per time), ``n_ref`` fresh
reference paths of the true SDE (data.npz) and the benchmark moments (benchmark.npz).
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...blocks.fitting import log_fit
from ...io import save_npz
from .bifurcation import BifurcatingSDE, chain_kl, euler_chain, girsanov_terms
from .fkl import FKL, NEURAL, FKLConfig, Features, Whitener, estimate, lambda_nodes, pair_stats, stack_stats, unstack_stats
from .linear_sde import LinearSDE, gaussian_kl, girsanov_kl
from .mixture import BranchMixture, mixture_kl
from .neural import neural_pair

NN_KEYS = ("heldout", "forward_plain", "reverse_plain", "forward_crossfit", "reverse_crossfit")

BENCHMARK_VARIANTS = ("fkl_plain", "fkl_crossfit")
TI_VARIANTS = ("true_sde", "linear_interp", "ot_linear", "indep_bridge", "ot_bridge", "flow_matching")


# --- the benchmark suites ----------------------------------------------------------------------

def benchmark_suite() -> dict[str, tuple[LinearSDE, LinearSDE]]:
    """Pairs (P, Q) with equal sigma and initial law: Girsanov gives KL(P || Q) in closed form."""
    rot = np.array([[-1.0, -1.0], [1.0, -1.0]])
    start2 = (np.array([2.0, 0.0]), 0.01 * np.eye(2))
    return {
        # Brownian motion with drift 1.5 vs without: KL = a^2 T / (2 sigma^2) = 1.125
        "bm_drift": (LinearSDE.ou(0.0, drift=1.5), LinearSDE.ou(0.0)),
        # OU (rate 2, mean 0) from x0 = 1 vs Brownian motion from x0 = 1
        "ou_vs_bm": (LinearSDE.ou(2.0, 0.0, m0=1.0), LinearSDE.ou(0.0, 0.0, m0=1.0)),
        # OU rates 1 vs 3 around mean 0.5 from x0 = -0.5 (differs in the fluctuations too)
        "ou_rates": (LinearSDE.ou(1.0, 0.5, m0=-0.5), LinearSDE.ou(3.0, 0.5, m0=-0.5)),
        # OU (rate 2) reverting to +1 vs to -0.5
        "ou_means": (LinearSDE.ou(2.0, 1.0), LinearSDE.ou(2.0, -0.5)),
        # 2-D OU with a rotational drift vs the same decay without rotation, from (2, 0)
        "ou2d_rotation": (LinearSDE(rot, np.zeros(2), 1.0, *start2), LinearSDE(-np.eye(2), np.zeros(2), 1.0, *start2)),
    }


def nonlinear_suite(p: dict) -> dict[str, tuple[BifurcatingSDE, BifurcatingSDE]]:
    """Pairs of bifurcating Euler chains (same sigma, same initial law) whose laws are not Gaussian.

    P: the trajectory-inference SDE's drift with a pitchfork of rate ``a`` (``nonlinear.a``: the chain
    has one Euler step per grid interval h and must stay stable, |1 + h a (t - t_b - 3 x^2)| < 1 on
    the branches, so a is below the TI SDE's 20)."""
    nl = p["benchmark"]["nonlinear"]
    P = BifurcatingSDE(**{**p["sde"], "a": float(nl["a"])})
    return {
        "bif_rate": (P, replace(P, a=P.a / 2)),          # half the pitchfork rate
        "bif_onset": (P, replace(P, t_b=P.t_b + 0.2)),   # the fork opens 0.2 later
        "bif_tilt": (P, replace(P, tilt=float(nl.get("tilt", 0.4)))),  # a constant push to one branch
    }


def mixture_suite(p: dict) -> dict[str, tuple[BranchMixture, BranchMixture]]:
    """Planted two-branch Gaussian-mixture path laws (mixture.py) with the TI SDE's sigma, onset and
    drift on Y: the adequacy check of the regressor (its denoiser is a branch gate, exactly)."""
    sde = p["sde"]
    P = BranchMixture(t_b=float(sde["t_b"]), v=float(sde["v"]), sigma=float(sde["sigma"]), s0=float(sde["s0"]))
    return {
        "gm_weights": (P, replace(P, weight=0.9)),  # the branches' weights 0.5/0.5 vs 0.9/0.1 (KL ~ 0.5: above the noise)
        "gm_split": (P, replace(P, amp=0.6, theta=2.0)),     # narrower, stiffer branches
    }


def _whitener(ts: np.ndarray, sigma: float, p: dict) -> Whitener:
    """Matern-1/2 reference covariance whose local increments match the SDE's (2 var h / l = sigma^2 h)."""
    length = float(p.get("kernel_length", 1.0))
    return Whitener.from_grid(ts, length, sigma**2 * length / 2.0)


def _coarse(ts: np.ndarray, points: int) -> np.ndarray:
    """Indices of ``points`` grid times spread evenly over ts (first and last included)."""
    idx = np.unique(np.round(np.linspace(0, len(ts) - 1, int(points))).astype(int))
    return idx


def _pair(xp, xq, ts, sigma, p, cfg, seed_rng) -> dict[str, np.ndarray]:
    """The node moments of one (P, Q) pair on the grid ts, with the candidate column counts."""
    W = _whitener(ts, sigma, p)
    feats = Features(W.L, xp.shape[2], cfg.features)
    rng_p, rng_q = (np.random.default_rng(s) for s in seed_rng.integers(2**62, size=2))
    zp, zq = W(xp), W(xq)
    stats = pair_stats(zp, zq, cfg, feats, rng_p, rng_q)
    out = {**stack_stats(stats), "sizes": np.array(feats.sizes)}
    if cfg.neural:  # the MLP candidate (neural.py): its per-node held-out loss and integrands
        nn = neural_pair(zp, zq, cfg, cfg.neural, int(seed_rng.integers(2**31)), progress=lambda *_: None)
        out.update({f"nn_{k}": v for k, v in nn.items() if k in NN_KEYS})
        out["nn_steps"] = np.array([r["stop"] for r in nn["records"]])
    return out


def benchmark_moments(ctx) -> dict[str, np.ndarray]:
    """Every (P, Q) pair of both suites, its null pair and its coarse-grid control: the moments of
    the fits, the reference KLs, keyed '<case>/<field>'."""
    p = ctx.params
    b = p["benchmark"]
    cfg = FKLConfig.from_params(p["fkl"])
    out: dict[str, np.ndarray] = {}

    def add(name, xp, xq, ts, sigma, rng, coarse=True):
        for k, v in _pair(xp, xq, ts, sigma, p, cfg, rng).items():
            out[f"{name}/{k}"] = v
        if coarse:
            idx = _coarse(ts, b.get("coarse_points", 3))
            for k, v in _pair(xp[:, idx], xq[:, idx], ts[idx], sigma, p, cfg, rng).items():
                out[f"{name}@coarse/{k}"] = v

    # linear SDEs, exact paths on the benchmark grid
    ts = np.linspace(0.0, 1.0, int(b["grid_points"]))
    suite = benchmark_suite()
    cases = b.get("cases") or list(suite)
    n = int(b["n_paths"])
    for k, name in enumerate(cases):
        P, Q = suite[name]
        rng = ctx.rng(10 + k)  # the same paths for both estimators: a paired comparison
        xp, xq = P.sample_paths(ts, n, rng), Q.sample_paths(ts, n, rng)
        add(name, xp, xq, ts, P.sigma, ctx.rng(1000 + k))
        out[f"{name}/kl_ref"] = np.array(girsanov_kl(P, Q))
        out[f"{name}/kl_grid"] = np.array(gaussian_kl(*P.grid_gaussian(ts), *Q.grid_gaussian(ts)))
        idx = _coarse(ts, b.get("coarse_points", 3))
        out[f"{name}/kl_grid_coarse"] = np.array(gaussian_kl(*P.grid_gaussian(ts[idx]), *Q.grid_gaussian(ts[idx])))
    P = suite[cases[0]][0]
    rng = ctx.rng(99)  # bias at KL = 0: two independent samples of the first case's P
    add("null", P.sample_paths(ts, n, rng), P.sample_paths(ts, n, rng), ts, P.sigma, ctx.rng(98), coarse=False)

    # non-Gaussian chains on the TI grid, at the TI's path counts
    nl = b.get("nonlinear")
    if nl:
        ts = _grid(p)
        n_p, n_q = int(p["ti"]["n_ref"]), int(p["ti"]["n_particles"])
        nsuite = nonlinear_suite(p)
        for k, name in enumerate(nl.get("cases") or list(nsuite)):
            P, Q = nsuite[name]
            rng = ctx.rng(200 + k)
            xp, xq = euler_chain(P, ts, n_p, rng), euler_chain(Q, ts, n_q, rng)
            add(name, xp, xq, ts, P.sigma, ctx.rng(2000 + k))
            # the known KL is a property of the pair, not of the seed: one fixed Monte-Carlo sample
            kl, se = chain_kl(P, Q, ts, int(nl["n_mc"]), np.random.default_rng(7919 + k))
            out[f"{name}/kl_ref"], out[f"{name}/kl_ref_se"] = np.array(kl), np.array(se)
            # the sampling floor: the exact Girsanov terms averaged over the chains of P the estimator sees
            out[f"{name}/kl_oracle"] = np.array(girsanov_terms(P, Q, ts, xp).mean())
        P = next(iter(nsuite.values()))[0]
        rng = ctx.rng(299)
        add("null_nl", euler_chain(P, ts, n_p, rng), euler_chain(P, ts, n_q, rng), ts, P.sigma, ctx.rng(298),
            coarse=False)

    # planted two-branch Gaussian mixtures on the TI grid (adequacy check of the regressor, a bias
    # check): ``mixture.n_paths`` paths of each law (default: the TI's path counts); see README on
    # why the smoke config uses more (the sampling floor of the branch weights at 1000 paths)
    gm = b.get("mixture")
    if gm:
        ts = _grid(p)
        n_p, n_q = int(gm.get("n_paths", p["ti"]["n_ref"])), int(gm.get("n_paths", p["ti"]["n_particles"]))
        msuite = mixture_suite(p)
        for k, name in enumerate(gm.get("cases") or list(msuite)):
            P, Q = msuite[name]
            rng = ctx.rng(300 + k)
            xp = P.sample(ts, n_p, rng)
            add(name, xp, Q.sample(ts, n_q, rng), ts, P.sigma, ctx.rng(3000 + k), coarse=False)
            kl, se = mixture_kl(P, Q, ts, int(gm["n_mc"]), np.random.default_rng(104729 + k))
            out[f"{name}/kl_ref"], out[f"{name}/kl_ref_se"] = np.array(kl), np.array(se)
            # the sampling floor: the exact log-density ratio averaged over the paths of P the estimator sees
            y = xp.reshape(len(xp), -1)
            out[f"{name}/kl_oracle"] = np.array(np.mean(P.log_density(y, ts) - Q.log_density(y, ts)))
    return out


def _case_stats(arrays, name: str):
    """The node moments, the candidate column counts and (if it was fitted) the MLP candidate's arrays."""
    pre = f"{name}/"
    sub = {k[len(pre):]: arrays[k] for k in arrays.files if k.startswith(pre)}
    nn = {k: sub[f"nn_{k}"] for k in NN_KEYS} if "nn_heldout" in sub else None
    return unstack_stats(sub), [int(q) for q in sub["sizes"]], nn


def run_benchmark(ctx, estimator: str) -> None:
    p = ctx.params
    b = p["benchmark"]
    cfg = FKLConfig.from_params({**p["fkl"], "estimator": estimator})
    arrays = np.load(Path(ctx.shared_dir) / "benchmark.npz")
    lams, _ = lambda_nodes(cfg)

    def est(name):
        stats, sizes, nn = _case_stats(arrays, name)
        return estimate(stats, cfg, sizes, estimator, neural=nn)

    def suite(cases, suffix, ref_name, ref_metric):
        rels, rels_c, ests, refs, rels_o = [], [], [], [], []
        for name in cases:
            t0 = time.perf_counter()
            o, oc = est(name), est(f"{name}@coarse")
            ref = float(arrays[f"{name}/kl_ref"])
            rel, rel_c = abs(o["forward"] / ref - 1.0), abs(oc["forward"] / ref - 1.0)
            ctx.metrics.scalar(f"kl_est_{name}", o["forward"])
            ctx.metrics.scalar(f"kl_est_reverse_{name}", o["reverse"])
            ctx.metrics.scalar(f"{ref_metric}_{name}", ref)
            ctx.metrics.scalar(f"rel_err_{name}", rel)
            ctx.metrics.scalar(f"kl_est_coarse_{name}", oc["forward"])
            ctx.metrics.scalar(f"rel_err_coarse_{name}", rel_c)
            ctx.metrics.scalar(f"affine_nodes_{name}", int(np.sum(o["chosen_family"] == 0)))
            ctx.metrics.scalar(f"mlp_nodes_{name}", int(np.sum(o["chosen_family"] == NEURAL)))
            ctx.metrics.curve(f"chosen_family_{name}", lams, o["chosen_family"])
            ctx.metrics.curve(f"integrand_{name}", lams, o["integrand_forward"])
            if f"{name}/kl_oracle" in arrays.files:  # the sampling floor (exact terms on P's paths)
                rels_o.append(abs(float(arrays[f"{name}/kl_oracle"]) / ref - 1.0))
                ctx.metrics.scalar(f"rel_err_oracle_{name}", rels_o[-1])
            rels.append(rel)
            rels_c.append(rel_c)
            ests.append(o["forward"])
            refs.append(ref)
            ctx.progress(f"{name}: {ref_name} {ref:.3f} est {o['forward']:.3f} coarse {oc['forward']:.3f} "
                         f"affine at {int(np.sum(o['chosen_family'] == 0))}/{len(lams)} nodes "
                         f"({time.perf_counter() - t0:.2f}s)")
        ctx.metrics.scalar(f"max_rel_err{suffix}", max(rels))
        ctx.metrics.scalar(f"mean_rel_err{suffix}", float(np.mean(rels)))
        ctx.metrics.scalar(f"max_rel_err{suffix}_coarse", max(rels_c))
        if rels_o:
            ctx.metrics.scalar(f"max_rel_err{suffix}_oracle", max(rels_o))
        ctx.metrics.curve(f"kl_est{suffix}", range(len(cases)), ests)
        ctx.metrics.curve(f"kl_ref{suffix}", range(len(cases)), refs)

    cases = b.get("cases") or list(benchmark_suite())
    for name in cases:
        ctx.metrics.scalar(f"kl_grid_{name}", float(arrays[f"{name}/kl_grid"]))
        ctx.metrics.scalar(f"kl_grid_coarse_{name}", float(arrays[f"{name}/kl_grid_coarse"]))
    suite(cases, "", "closed", "kl_closed")
    # the error against the KL of the grid the estimator sees (discretisation removed): a diagnostic
    rel_grid = [abs(float(ctx.metrics.scalars[f"kl_est_{n}"]) / float(arrays[f"{n}/kl_grid"]) - 1.0) for n in cases]
    for name, r in zip(cases, rel_grid):
        ctx.metrics.scalar(f"rel_err_grid_{name}", r)
    ctx.metrics.scalar("max_rel_err_grid", max(rel_grid))
    ctx.metrics.scalar("null_kl", est("null")["forward"])
    nl = b.get("nonlinear")
    if nl:
        ncases = nl.get("cases") or list(nonlinear_suite(p))
        for name in ncases:
            ctx.metrics.scalar(f"kl_known_se_{name}", float(arrays[f"{name}/kl_ref_se"]))
        suite(ncases, "_nl", "known", "kl_known")
        ctx.metrics.scalar("null_kl_nl", est("null_nl")["forward"])
    gm = b.get("mixture")
    if gm:
        rels, rels_o = [], []
        for name in gm.get("cases") or list(mixture_suite(p)):
            o = est(name)
            ref = float(arrays[f"{name}/kl_ref"])
            rels.append(abs(o["forward"] / ref - 1.0))
            rels_o.append(abs(float(arrays[f"{name}/kl_oracle"]) / ref - 1.0))
            ctx.metrics.scalar(f"rel_err_oracle_{name}", rels_o[-1])
            ctx.metrics.scalar(f"kl_est_{name}", o["forward"])
            ctx.metrics.scalar(f"kl_known_{name}", ref)
            ctx.metrics.scalar(f"kl_known_se_{name}", float(arrays[f"{name}/kl_ref_se"]))
            ctx.metrics.scalar(f"rel_err_{name}", rels[-1])
            ctx.metrics.scalar(f"gate_nodes_{name}", int(np.sum(o["chosen_family"] == 1)))
            ctx.metrics.curve(f"chosen_family_{name}", lams, o["chosen_family"])
            ctx.progress(f"{name}: known {ref:.3f} est {o['forward']:.3f} "
                         f"gate chosen at {int(np.sum(o['chosen_family'] == 1))}/{len(lams)} nodes")
        ctx.metrics.scalar("max_rel_err_gm", max(rels))
        ctx.metrics.scalar("max_rel_err_gm_oracle", max(rels_o))


# --- trajectory inference on the bifurcating SDE -------------------------------------------------

def _sde(p: dict) -> BifurcatingSDE:
    return BifurcatingSDE(**p["sde"])


def _grid(p: dict) -> np.ndarray:
    return np.linspace(0.0, 1.0, int(p["ti"]["grid_points"]))


def train_shared(ctx) -> None:
    p = ctx.params
    ti = p["ti"]
    sde, rng = _sde(p), ctx.rng(0)
    times = sorted(set(ti["observed"]) | {ti["heldout"]})
    snaps = sde.snapshots(times, int(ti["n_particles"]), rng)
    ref = sde.simulate(sde.initial(int(ti["n_ref"]), rng), _grid(p), rng)
    # a second, independent held-out snapshot: W1 against it is the A/A control of the ranking claim
    held_b = sde.snapshots([float(ti["heldout"])], int(ti["n_particles"]), ctx.rng(1))[float(ti["heldout"])]
    save_npz(Path(ctx.shared_dir) / "data.npz", ref=ref, times=np.array(times), heldout_b=held_b,
             **{f"snap_{k}": snaps[t] for k, t in enumerate(times)})
    t0 = time.perf_counter()
    save_npz(Path(ctx.shared_dir) / "benchmark.npz", **benchmark_moments(ctx))
    ctx.metrics.scalar("benchmark_moments_seconds", time.perf_counter() - t0)


def _load(shared_dir: Path) -> tuple[dict[float, np.ndarray], np.ndarray, np.ndarray]:
    d = np.load(Path(shared_dir) / "data.npz")
    snaps = {float(t): d[f"snap_{k}"] for k, t in enumerate(d["times"])}
    return snaps, d["ref"], d["heldout_b"]


def w1(x: np.ndarray, y: np.ndarray) -> float:
    """Exact 1-Wasserstein distance between two point clouds (POT network simplex, Euclidean cost)."""
    import ot

    a, b = np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y))
    return float(ot.emd2(a, b, ot.dist(x, y, metric="euclidean"), numItermax=10_000_000))


def infer_paths(ctx, variant: str, snaps: dict[float, np.ndarray], grid: np.ndarray) -> np.ndarray:
    from .trajectory import coupled_paths, flow_matching_paths, ot_pairs, train_flow_matching

    p = ctx.params
    observed = sorted(float(t) for t in p["ti"]["observed"])
    sde, rng = _sde(p), ctx.rng(1 + TI_VARIANTS.index(variant))
    x0 = snaps[observed[0]]
    if variant == "true_sde":
        return sde.simulate(x0, grid, rng)
    if variant in ("linear_interp", "ot_linear", "indep_bridge", "ot_bridge"):
        return coupled_paths(snaps, grid, observed, variant, sde.sigma, rng)
    if variant == "flow_matching":
        import torch

        torch.set_num_threads(max(1, ctx.threads))
        fm = p["flow_matching"]
        t0 = time.perf_counter()
        pairs = ot_pairs(snaps, observed)
        # the shared rule (blocks/fitting.fit_to_plateau): one rate grid piloted on validation, the
        # best rate continued at a constant rate to the gate's plateau test, best weights kept
        net, rec = train_flow_matching(pairs, fm, ctx.seed, ctx.progress)
        log_fit(ctx.metrics, "fm", rec)  # val_fm, lr_fm: the curves the convergence gate reads
        for k, (lr, best) in enumerate(sorted(rec["pilot_best"].items())):
            ctx.metrics.scalar(f"fm_best_val_loss_lr{k}", best)  # the chosen rate's includes its continuation
        ctx.metrics.scalar("fm_train_seconds", time.perf_counter() - t0)
        ctx.metrics.scalar("fm_stop_step", rec["stop"])
        ctx.metrics.scalar("fm_plateau", float(rec["plateau"]))
        ctx.metrics.scalar("fm_final_val_loss", min(rec["vals"]))
        with torch.no_grad():
            return flow_matching_paths(net, x0, grid, int(fm["ode_steps_per_interval"]))
    raise ValueError(f"unknown variant '{variant}'")


def run_trajectory_inference(ctx) -> None:
    p = ctx.params
    ti = p["ti"]
    snaps, ref, held_b = _load(ctx.shared_dir)
    grid, held = _grid(p), float(ti["heldout"])
    h = int(np.argmin(np.abs(grid - held)))
    t0 = time.perf_counter()
    paths = infer_paths(ctx, ctx.variant, snaps, grid)
    ctx.metrics.scalar("infer_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("w1_heldout", w1(paths[:, h], snaps[held]))
    ctx.metrics.scalar("w1_heldout_b", w1(paths[:, h], held_b))
    last = max(float(t) for t in ti["observed"])
    ctx.metrics.scalar("w1_last_observed", w1(paths[:, -1], snaps[last]))
    # path KL with the estimator validated on the benchmark (the nonlinear suite is at this grid and
    # these path counts); the reference's noise draws are the same for every method of a seed
    cfg = FKLConfig.from_params({**p["fkl"], "estimator": ti.get("estimator", "crossfit")})
    t0 = time.perf_counter()
    fkl = FKL(ref, _whitener(grid, _sde(p).sigma, p), cfg, ctx.rng(500))
    out = fkl.kl(paths)
    ctx.metrics.scalar("fkl_seconds", time.perf_counter() - t0)
    # per reference path (paired across methods: P's paths and noise draws are fixed): the units
    ctx.metrics.units("path_kl", out["units_forward"])
    ctx.metrics.scalar("path_kl_reverse", out["reverse"])
    ctx.metrics.scalar("path_kl_affine_nodes", int(np.sum(out["chosen_family"] == 0)))
    ctx.metrics.scalar("path_kl_mlp_nodes", int(np.sum(out["chosen_family"] == NEURAL)))
    lams, _ = lambda_nodes(cfg)
    ctx.metrics.curve("path_kl_integrand", lams, out["integrand_forward"])
    ctx.metrics.curve("path_kl_chosen_family", lams, out["chosen_family"])
    if ctx.variant == "true_sde":
        # A/A: a second sample of the true law, simulated from a fresh draw of the initial law
        sde, rng = _sde(p), ctx.rng(600)
        null = fkl.kl(sde.simulate(sde.initial(len(paths), rng), grid, rng))
        ctx.metrics.units("path_kl_null", null["units_forward"])
    ctx.progress(f"W1(held-out) {ctx.metrics.scalars['w1_heldout']:.4f}  path KL {out['forward']:.3f} "
                 f"reverse {out['reverse']:.3f}")
    # a few trajectories for the figure: x = 2 i + t (path i, time t), and the held-out snapshot
    n_show = min(int(p.get("plot_paths", 40)), len(paths))
    xs = (2 * np.arange(n_show)[:, None] + grid[None, :]).ravel()
    ctx.metrics.curve("traj_x", xs, paths[:n_show, :, 0].ravel())
    ctx.metrics.curve("traj_y", xs, paths[:n_show, :, 1].ravel())
    n_pts = min(300, len(paths))
    ctx.metrics.curve("heldout_pred_x", range(n_pts), paths[:n_pts, h, 0])
    ctx.metrics.curve("heldout_pred_y", range(n_pts), paths[:n_pts, h, 1])
    if ctx.variant == "true_sde":
        ctx.metrics.curve("heldout_snap_x", range(n_pts), snaps[held][:n_pts, 0])
        ctx.metrics.curve("heldout_snap_y", range(n_pts), snaps[held][:n_pts, 1])


def train(ctx) -> None:
    if ctx.variant in BENCHMARK_VARIANTS:
        return run_benchmark(ctx, ctx.variant.removeprefix("fkl_"))
    if ctx.variant in TI_VARIANTS:
        return run_trajectory_inference(ctx)
    raise ValueError(f"unknown variant '{ctx.variant}': expected one of {BENCHMARK_VARIANTS + TI_VARIANTS}")


def plot(table, plots_dir, params) -> None:
    from .plots import make_plots

    make_plots(table, Path(plots_dir), params)
