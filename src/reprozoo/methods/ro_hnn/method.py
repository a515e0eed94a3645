"""RO-HNN in miniature: a trapped sine-Gordon kink on a 48-site chain (96-dim phase space).

The kink's states lie on a curved two-dimensional submanifold parametrised by its position and
velocity (``sine_gordon.py``): the setting in which a nonlinear symplectic reduction with one degree
of freedom can follow the dynamics and a linear one cannot. Variants (same data, same optimiser
rule, same learning-rate grid, same step budget for every learned part):
  ro_hnn         symplectic autoencoder, n = 1 (cotangent lift of a nonlinear embedding,
                 reductions.py) + latent HNN integrated by leapfrog                     [the paper]
  sae_ghnn       RO-HNN's symplectic autoencoder (the same fit) + the general latent HNN of ae_hnn,
                 implicit midpoint: against ae_hnn only the reduction differs           [ablation]
  psd_hnn        linear PSD, n = 1 (cotangent lift by SVD) + the same latent HNN, leapfrog [linear MOR]
  ae_node        plain autoencoder, 2n = 2 + latent neural ODE integrated by RK4        [no structure]
  sae_node       RO-HNN's symplectic autoencoder (the same fit) + the latent neural ODE of ae_node, RK4:
                 the reduction without the Hamiltonian latent model (the control of the claims that
                 compare RO-HNN with ae_node: what the Hamiltonian structure adds)       [control]
  ae_hnn         the same plain autoencoder + a general latent HNN (non-separable H_theta(Q, P), an MLP
                 of both halves, as its latent is not canonical), implicit midpoint (symplectic for any H)
  full_hnn       no reduction: the separable HNN H = |p|^2 / 2 + V_theta(q) + (k / 2) sum (q_{i+1} - q_i)^2
                 (k >= 0 learned: the review's confining nearest-neighbour term) on all N site angles,
                 leapfrog with ``full_substeps`` sub-steps per sampling interval; a documented row,
                 no claim reads it (it leaves the data manifold, see the README)           [full HNN]
  psd8_galerkin  intrusive PSD-Galerkin with 8 modes (the reconstruction RO-HNN reaches with one):
                 the true chain Hamiltonian restricted to the PSD subspace, H_r(Q, P) = |P|^2 / 2 +
                 V(q_ref + Phi Q), integrated by leapfrog at the reference step; nothing is trained
                                                                  [classical MOR, matched accuracy]
The controls are evaluations, not fits: RO-HNN's (and sae_ghnn's) trained weights with the latent
integrator swapped to explicit Euler (metrics ``*_euler``); RO-HNN's also by classical RK4 (``*_rk4``).

Stages per cell: (1) fit the reduction on training snapshots (PSD: closed-form SVD);
(the two learned reductions are fitted once per seed in train_shared, each shared by two variants);
(2) encode the training and validation trajectories and fit the dynamics on K-step rollout windows
(PSD-Galerkin: none, the reduced equations come from the known Hamiltonian);
(3) from encoded held-out initial states, roll out 10x the training horizon, decode and compare with
the leapfrog reference. Every fit follows the platform's shared rule (``reprozoo.blocks.fitting``):
Adam at a constant rate from ``fit.lr_grid`` (``pilot_steps`` each, ranked by the mean of the
second half of their validation points), stopped when the validation curve passes the plateau test
at half the gate's tolerance; then the rate drops once to ``lr_drop`` x and training continues to a
second plateau (or ``max_steps``); the best-validation weights are kept.
Errors: state error |x_hat - x| with q and p each scaled by the test trajectory's RMS fluctuation
about its time mean; valid-prediction time (vpt): the first time that error exceeds ``vpt_threshold``
(in training horizons T, capped at the rollout's 10 T); energy drift (``energy_drift``): per window of
one training horizon, |mean of H(x_hat) - <H(x~)>| / (H(x0) - E_rest) under the true chain
Hamiltonian, x~ = D(E(x)) the decoded reference, <.> its mean over the rollout, E_rest the energy of
the kink at rest at the trap centre; the decoder's offset |H(x~(0)) - H(x0)| / (H(x0) - E_rest) is
recorded apart (energy_offset).
"""
from __future__ import annotations

import time

import numpy as np

from ...blocks.fitting import fit_to_plateau, log_fit
from ...io import save_npz
from .sine_gordon import KinkChain

# per-unit metrics of every variant, and of the integrator-swapped evaluations (suffix _euler, _rk4)
UNIT_METRICS = ("vpt", "state_err_long", "energy_err_first", "energy_err_last", "energy_err_long", "energy_growth")
SWAPPED_METRICS = ("vpt_euler", "energy_err_long_euler", "energy_err_first_euler", "energy_err_last_euler",
                   "state_err_long_euler", "energy_growth_euler", "vpt_rk4", "energy_err_long_rk4",
                   "energy_err_first_rk4", "energy_err_last_rk4", "state_err_long_rk4", "energy_growth_rk4")
# floor of a window's drift in energy_growth's log ratio (a window mean of exactly zero would give -inf);
# far below every measured window (the smallest at smoke, round 6: 2e-4 of the excitation energy)
GROWTH_FLOOR = 1e-12
GENERIC_CURVES = {"val_ae": ("training step", "validation reconstruction loss (scaled MSE)"),
                  "val_dyn": ("training step", "validation rollout loss (scaled MSE)")}


def _chain(p) -> KinkChain:
    return KinkChain.from_config(p["system"])


def train_shared(ctx) -> None:
    """Training, validation and held-out test trajectories of the kink chain (leapfrog), per seed; and
    the two learned reductions (symplectic and plain autoencoder), each shared by two variants."""
    p = ctx.params
    s = p["system"]
    chain = _chain(p)
    rng = ctx.rng(0)
    every = int(round(p["h"] / s["dt"]))
    n_pts = int(round(p["t_train"] / p["h"]))
    k, kv = p["n_train"], p["n_train"] + p["n_val"]
    q0, p0 = chain.initial_states(kv + p["n_test"], s["x0"], tuple(s["speed"]), rng)
    t0 = time.process_time()
    q, pm = chain.simulate(q0, p0, s["dt"], every, n_pts * p["horizon_factor"])
    ctx.metrics.scalar("reference_cpu_s", time.process_time() - t0)
    e = chain.energy(q, pm)
    ctx.metrics.scalar("reference_energy_err", float(np.max(np.abs(e / e[:, :1] - 1))))
    ctx.metrics.scalar("charge_drift", float(np.max(np.abs(chain.charge(q) - 1))))
    r2 = chain.manifold_r2(q[:k, :n_pts + 1], pm[:k, :n_pts + 1])
    ctx.metrics.scalar("slaving_r2", r2)
    e_rest = float(chain.energy(*chain.kink(0.0, 0.0)))
    save_npz(ctx.shared_dir / "chain.npz", q_train=q[:k, :n_pts + 1], p_train=pm[:k, :n_pts + 1],
             q_val=q[k:kv, :n_pts + 1], p_val=pm[k:kv, :n_pts + 1], q_test=q[kv:], p_test=pm[kv:],
             slaving_r2=np.array(r2), e_rest=np.array(e_rest))
    import torch

    torch.set_num_threads(ctx.threads)
    c0 = time.process_time()
    fit_shared_reductions(_load(ctx), p["model"], p["fit"], ctx.seed, ctx.shared_dir, ctx.progress)
    ctx.metrics.scalar("reductions_cpu_s", time.process_time() - c0)


def _load(ctx):
    return dict(np.load(ctx.shared_dir / "chain.npz"))


# --- the reductions -----------------------------------------------------------------------------

def _snapshots(d, split):
    big = d["q_train"].shape[-1]
    return d[f"q_{split}"].reshape(-1, big), d[f"p_{split}"].reshape(-1, big)


def fit_reduction(variant: str, d: dict, cfg: dict, f: dict | None, seed: int, progress=print):
    """Reduction fitted on the training snapshots; returns (model, fit record or None). ``f=None``:
    the learned reduction's initial model, untrained (its weights are loaded from train_shared)."""
    import torch

    from .reductions import FullState, LinearPSD, PlainAE, SymplecticAE, psd_cotangent_lift

    q, pm = _snapshots(d, "train")
    qv, pv = (torch.as_tensor(a) for a in _snapshots(d, "val"))
    n = cfg["psd_matched_dof"] if variant == "psd8_galerkin" else cfg["latent_dof"]
    q_ref = q.mean(0)
    phi = psd_cotangent_lift(q - q_ref, pm, n)
    if variant in ("psd_hnn", "psd8_galerkin"):
        return LinearPSD(phi, q_ref), None
    if variant == "full_hnn":  # no reduction: the site angles about q_ref and their momenta
        return FullState(q_ref), None
    if variant in ("sae_ghnn", "sae_node"):  # RO-HNN's own reduction (same seed, same data, same fit: the same weights)
        variant = "ro_hnn"
    s_q, s_p = float((q - q_ref).std()), float(pm.std())
    qt, pt = torch.as_tensor(q), torch.as_tensor(pm)
    iso = cfg["isometry_weight"] if variant == "ro_hnn" else 0.0

    if variant == "ro_hnn":
        s_lat = ((q - q_ref) @ phi).std(0)

        def build(gen):
            return SymplecticAE(phi, q_ref, cfg["ae_width"], s_q, s_lat, gen)
    else:
        x = np.concatenate([(q - q_ref) / s_q, pm / s_p], 1)
        u, _, _ = np.linalg.svd(x.T, full_matrices=False)

        def build(gen):
            return PlainAE(u[:, :2 * n], q_ref, cfg["ae_width"], s_q, s_p, gen)

    def objective(model, qb, pb):
        qz, pz = model.encode(qb, pb)
        qh, ph = model.decode(qz, pz)
        loss = ((qh - qb) ** 2).mean() / s_q**2 + ((ph - pb) ** 2).mean() / s_p**2
        return loss + iso * model.isometry_penalty(qz) if iso else loss

    def train_loss(model, gen):
        idx = torch.randint(len(qt), (cfg["batch"],), generator=gen)
        return objective(model, qt[idx], pt[idx])

    def val_loss(model):
        with torch.no_grad():
            return float(objective(model, qv, pv))

    if f is None:  # the untrained skeleton, for weights fitted in train_shared
        return build(torch.Generator().manual_seed(seed)), None
    return fit_to_plateau(build, train_loss, val_loss, f, seed, f"{variant} reduction", progress)


# the learned reductions, each fitted once per seed in train_shared and loaded by every variant that
# uses it (the same data, the same seed, the same rule: fitting it again per variant gave the same weights)
SHARED_REDUCTIONS = {"ro_hnn": "sae", "sae_ghnn": "sae", "sae_node": "sae", "ae_node": "ae", "ae_hnn": "ae"}


def fit_shared_reductions(d: dict, cfg: dict, f: dict, seed: int, shared_dir, progress=print) -> None:
    """Fit the symplectic and the plain autoencoder; save their weights and fit records."""
    import json

    import torch

    for variant, kind in (("ro_hnn", "sae"), ("ae_node", "ae")):
        model, rec = fit_reduction(variant, d, cfg, f, seed, progress)
        torch.save(model.state_dict(), shared_dir / f"reduction_{kind}.pt")
        rec = {k: v for k, v in rec.items() if k != "pilot_best"} | {
            "pilot_best": {str(k): float(v) for k, v in rec["pilot_best"].items()}}
        (shared_dir / f"reduction_{kind}.json").write_text(json.dumps(rec, default=float))


def load_reduction(variant: str, d: dict, cfg: dict, seed: int, shared_dir):
    """The variant's reduction: fitted in train_shared (learned ones) or closed-form (PSD, identity)."""
    import json

    import torch

    kind = SHARED_REDUCTIONS.get(variant)
    if kind is None:
        return fit_reduction(variant, d, cfg, None, seed)
    model, _ = fit_reduction(variant, d, cfg, None, seed)
    model.load_state_dict(torch.load(shared_dir / f"reduction_{kind}.pt"))
    return model, json.loads((shared_dir / f"reduction_{kind}.json").read_text())


# --- the dynamics -------------------------------------------------------------------------------

def fit_dynamics(variant: str, z_train, z_val, cfg: dict, f: dict, h: float, seed: int, progress=print):
    """Dynamics trained on K-step rollouts of (encoded) trajectories z = (Q, P) [traj, T, n] each."""
    import torch

    from .latent_dynamics import ChainHNN, GeneralHNN, LatentHNN, LatentNODE, rollout

    (qz, pz), (qv, pv) = z_train, z_val
    n = qz.shape[-1]
    s_z = np.concatenate([qz.reshape(-1, n).std(0), pz.reshape(-1, n).std(0)])
    z_mean = np.concatenate([qz.reshape(-1, n).mean(0), pz.reshape(-1, n).mean(0)])

    if variant == "full_hnn":  # one spread per half: sites far from the kink barely move
        s_z = np.concatenate([np.full(n, qz.std()), np.full(n, pz.std())])

    def build(gen):
        if variant in ("ae_node", "sae_node"):
            return LatentNODE(n, cfg["dyn_width"], s_z, gen)
        if variant in ("ae_hnn", "sae_ghnn"):
            return GeneralHNN(n, cfg["dyn_width"], s_z, gen, z_mean, cfg["midpoint_iters"])
        if variant == "full_hnn":
            return ChainHNN(n, cfg["dyn_width"], s_z[:n], gen, z_mean[:n], substeps=cfg["full_substeps"])
        return LatentHNN(n, cfg["dyn_width"], s_z[:n], gen, z_mean[:n])

    qt, pt = torch.as_tensor(qz), torch.as_tensor(pz)
    w = torch.as_tensor(1.0 / s_z**2)
    k = cfg["window"]
    # validation windows: every trajectory, starts every k // 2 steps
    starts = np.arange(0, qv.shape[1] - k, max(1, k // 2))
    vts = torch.as_tensor(starts[:, None] + np.arange(k + 1))
    vq = torch.as_tensor(qv)[:, vts].reshape(-1, k + 1, n)
    vp = torch.as_tensor(pv)[:, vts].reshape(-1, k + 1, n)

    def window_loss(model, tq, tp):
        rq, rp = rollout(model, tq[:, 0], tp[:, 0], h, k)
        return (((torch.cat([rq, rp], -1) - torch.cat([tq, tp], -1)) ** 2) * w).mean()

    def train_loss(model, gen):
        model.train()
        tr = torch.randint(qt.shape[0], (cfg["batch"],), generator=gen)
        t0 = torch.randint(qt.shape[1] - k, (cfg["batch"],), generator=gen)
        ts = t0[:, None] + torch.arange(k + 1)
        return window_loss(model, qt[tr[:, None], ts], pt[tr[:, None], ts])

    def val_loss(model):
        model.eval()
        with torch.no_grad():
            return float(window_loss(model, vq.clone(), vp.clone()))

    model, rec = fit_to_plateau(build, train_loss, val_loss, f, seed + 1, f"{variant} dynamics", progress)
    model.eval()
    return model, rec


class PSDGalerkin:
    """Intrusive PSD-Galerkin: Hamilton's equations of H_r(Q, P) = H(q_ref + Phi Q, Phi P) =
    |P|^2 / 2 + V(q_ref + Phi Q) (Phi orthonormal), i.e. dQ/dt = P, dP/dt = -Phi^T grad V(q_ref + Phi Q),
    integrated by leapfrog with ``substeps`` steps per sampling interval (the reference's step)."""

    def __init__(self, chain: KinkChain, phi: np.ndarray, q_ref: np.ndarray, substeps: int):
        self.chain, self.phi, self.q_ref, self.substeps = chain, np.asarray(phi), np.asarray(q_ref), int(substeps)

    def force(self, qz):
        return -self.chain.grad_potential(self.q_ref + qz @ self.phi.T) @ self.phi

    def hamiltonian(self, qz, pz):
        return 0.5 * (pz**2).sum(-1) + self.chain.potential(self.q_ref + qz @ self.phi.T)

    def integrate(self, qz, pz, h: float, steps: int):
        from ...blocks.symplectic import leapfrog
        qs, ps = leapfrog(np.asarray(qz), np.asarray(pz), lambda x: -self.force(x), h / self.substeps,
                          steps * self.substeps, every=self.substeps)
        return np.moveaxis(qs, 0, 1), np.moveaxis(ps, 0, 1)


def predict(reduction, dynamics, q0: np.ndarray, p0: np.ndarray, h: float, steps: int):
    """Encode, roll out, decode: q, p [batch, steps + 1, N]."""
    import torch

    from .latent_dynamics import rollout

    with torch.no_grad():
        qz, pz = reduction.encode(torch.as_tensor(q0), torch.as_tensor(p0))
    if isinstance(dynamics, PSDGalerkin):
        rq, rp = (torch.as_tensor(a) for a in dynamics.integrate(qz.numpy(), pz.numpy(), h, steps))
    else:
        with torch.no_grad():  # every latent model's field is closed-form: no autograd needed
            rq, rp = rollout(dynamics, qz.detach().clone(), pz.detach().clone(), h, steps)
    with torch.no_grad():
        qh, ph = reduction.decode(rq.detach(), rp.detach())
    return qh.numpy(), ph.numpy()


# --- metrics ------------------------------------------------------------------------------------

def relative_state_error(q, pm, qh, ph):
    """|x_hat - x| per time, q and p each scaled by the trajectory's RMS fluctuation about its time
    mean, / sqrt(2): predicting the trajectory's time mean scores 1 in the time-RMS. [..., T]"""
    rq = np.sqrt(((q - q.mean(-2, keepdims=True)) ** 2).sum(-1).mean(-1, keepdims=True))
    rp = np.sqrt(((pm - pm.mean(-2, keepdims=True)) ** 2).sum(-1).mean(-1, keepdims=True))
    return np.sqrt((((qh - q) ** 2).sum(-1) / rq**2 + ((ph - pm) ** 2).sum(-1) / rp**2) / 2)


def valid_prediction_time(err, threshold: float, h: float, t_train: float):
    """Per trajectory: the first time the state error exceeds ``threshold``, in training horizons
    (0 if it does at t = 0; the rollout's length if it never does). err [..., T]."""
    bad = err > threshold
    first = np.where(bad.any(-1), bad.argmax(-1), err.shape[-1] - 1)
    return first * h / t_train


def energy_drift(chain: KinkChain, e0, e_rest: float, qh, ph, q_dec, p_dec, n_train_pts: int) -> dict:
    """Energy drift against the decoded reference, per test trajectory, relative to the kink's
    excitation energy H(x0) - E_rest. The decoded reference x~ = D(E(x)) carries the same decoder
    distortion as the prediction, so dE(t) = H(x_hat(t)) - <H(x~)> (<.>: its mean over the whole
    rollout) is free of the constant offset; the mean of dE over a window of one training horizon
    (about one bounce period) averages out the distortion's oscillation along the orbit, so a
    prediction that stays on the right energy level but has dephased scores as well as one in phase.
    Returns the per-window |mean dE| (``windows`` [traj, W]) and the per-time |dE| (``per_time``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        exc = (e0 - e_rest)[:, None]
        level = chain.energy(q_dec, p_dec).mean(1, keepdims=True)
        de = (chain.energy(qh, ph) - level) / exc
        k = n_train_pts
        w = (de.shape[1] - 1) // k
        win = np.abs(np.stack([de[:, i * k:(i + 1) * k + 1].mean(1) for i in range(w)], 1))
    return {"windows": np.where(np.isfinite(win), win, 1e3),
            "per_time": np.where(np.isfinite(de), np.abs(de), 1e3)}


def long_horizon_metrics(chain: KinkChain, q, pm, qh, ph, e_rest: float, n_train_pts: int,
                         vpt_threshold: float = 0.5, h: float = 1.0, q_dec=None, p_dec=None) -> dict:
    """State and energy errors against the reference: per time (mean over trajectories, ``*_t``)
    and per test trajectory (arrays over the first axis). ``q_dec, p_dec``: the decoded reference
    D(E(x)) (default: the reference itself, a model without reduction)."""
    q_dec, p_dec = (q, pm) if q_dec is None else (q_dec, p_dec)
    with np.errstate(over="ignore", invalid="ignore"):
        err = relative_state_error(q, pm, qh, ph)
        e0 = chain.energy(q[:, 0], pm[:, 0])
        e_hat = chain.energy(qh, ph)
        offset = np.abs(chain.energy(q_dec[:, 0], p_dec[:, 0]) - e0) / (e0 - e_rest)  # the decoder's offset at t = 0
    err = np.where(np.isfinite(err), err, 1e3)  # a blow-up counts as a large finite error
    drift = energy_drift(chain, e0, e_rest, qh, ph, q_dec, p_dec, n_train_pts)
    win = drift["windows"]
    k = n_train_pts
    vpt = valid_prediction_time(err, vpt_threshold, h, k * h)
    return {"vpt": vpt, "state_err_t": err.mean(0), "energy_err_t": drift["per_time"].mean(0),
            "excitation_ratio_t": ((e_hat - e_rest) / (e0[:, None] - e_rest))[0],
            "state_err_long": err.mean(1), "state_err_train": err[:, :k + 1].mean(1), "state_err_max": err.max(1),
            "energy_err_first": win[:, 0], "energy_err_last": win[:, -1],
            "energy_err_long": win.mean(1), "energy_growth": energy_growth(win), "energy_offset": offset}


def energy_growth(windows: np.ndarray) -> np.ndarray:
    """Per test trajectory: log10 of its energy drift over the last window over that over the first
    (``windows`` [traj, W]); 0 for a drift that does not grow, log10(2) for one that doubles. Its mean
    over trajectories is the log of the geometric-mean growth: one trajectory's blow-up (a drift
    clipped at 1e3) moves it by a bounded amount, unlike a ratio of the windows' means."""
    w = np.maximum(windows, GROWTH_FLOOR)
    return np.log10(w[:, -1] / w[:, 0])


def _record_fit(ctx, name: str, rec: dict | None) -> None:
    if rec is None:
        return
    log_fit(ctx.metrics, name, rec)  # val_/lr_ curves, lr_chosen_, steps_ (the shared record)
    ls = rec["losses"]
    every = max(1, len(ls) // 100)
    ctx.metrics.curve(f"{name}_loss", range(0, len(ls), every), ls[::every])
    ctx.metrics.scalar(f"lr_drop_step_{name}", -1 if rec["drop_step"] is None else rec["drop_step"])
    ctx.metrics.scalar(f"plateau_{name}", float(rec["plateau"]))
    ctx.metrics.scalar(f"val_best_{name}", min(rec["vals"]))


def train(ctx) -> None:
    import torch

    torch.set_num_threads(ctx.threads)
    torch.manual_seed(ctx.seed)
    p = ctx.params
    chain = _chain(p)
    d = _load(ctx)
    n_train_pts = d["q_train"].shape[1] - 1
    big = d["q_train"].shape[-1]
    ctx.metrics.scalar("slaving_r2", float(d["slaving_r2"]))
    t0, c0 = time.perf_counter(), time.process_time()
    red, ae_rec = load_reduction(ctx.variant, d, p["model"], ctx.seed, ctx.shared_dir)
    if ctx.variant == "psd8_galerkin":  # intrusive: the reduced equations of the known Hamiltonian
        dyn, dyn_rec = PSDGalerkin(chain, red.phi.numpy(), red.q_ref.numpy(),
                                   int(round(p["h"] / p["system"]["dt"]))), None
    else:
        with torch.no_grad():
            z_train = [a.detach().numpy() for a in red.encode(torch.as_tensor(d["q_train"]), torch.as_tensor(d["p_train"]))]
            z_val = [a.detach().numpy() for a in red.encode(torch.as_tensor(d["q_val"]), torch.as_tensor(d["p_val"]))]
        dyn, dyn_rec = fit_dynamics(ctx.variant, z_train, z_val, p["model"], p["fit"], p["h"], ctx.seed, ctx.progress)
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t0)
    ctx.metrics.scalar("train_cpu_s", time.process_time() - c0)
    _record_fit(ctx, "ae", ae_rec)
    _record_fit(ctx, "dyn", dyn_rec)

    steps = d["q_test"].shape[1] - 1
    with torch.no_grad():  # the decoded reference D(E(x)): what the energy drift is measured against
        rq, rp = red.decode(*red.encode(torch.as_tensor(d["q_test"]), torch.as_tensor(d["p_test"])))
        q_dec, p_dec = rq.numpy(), rp.numpy()
    # the trained model; for RO-HNN and its general-HNN ablation also the same weights with the latent
    # integrator swapped (evaluation only): explicit Euler (the vpt and energy claims' control) and, for
    # RO-HNN, classical RK4 (accurate but not symplectic)
    from .latent_dynamics import ExplicitEuler, RK4Stepper
    runs = {"": dyn}
    if ctx.variant in ("ro_hnn", "sae_ghnn"):
        runs["_euler"] = ExplicitEuler(dyn)
    if ctx.variant == "ro_hnn":
        runs["_rk4"] = RK4Stepper(dyn)
    for suffix, model in runs.items():
        qh, ph = predict(red, model, d["q_test"][:, 0], d["p_test"][:, 0], p["h"], steps)
        m = long_horizon_metrics(chain, d["q_test"], d["p_test"], qh, ph, float(d["e_rest"]), n_train_pts,
                                 p["vpt_threshold"], p["h"], q_dec, p_dec)
        for key in UNIT_METRICS:
            name = key + suffix
            assert suffix == "" or name in SWAPPED_METRICS
            ctx.metrics.units(name, m[key])  # one unit per held-out trajectory
        # vpt is heavy-tailed (capped at 10 T): its median is reported beside the mean
        ctx.metrics.scalar("vpt_median" + suffix, float(np.median(m["vpt"])))
        ctx.metrics.scalar("energy_err_long_median" + suffix, float(np.median(m["energy_err_long"])))
        if suffix == "":
            main, qh0, ph0 = m, qh, ph
    m, qh, ph = main, qh0, ph0
    ctx.metrics.scalar("state_err_train", float(m["state_err_train"].mean()))
    ctx.metrics.scalar("state_err_max", float(m["state_err_max"].max()))
    ctx.metrics.scalar("energy_offset", float(np.mean(np.minimum(m["energy_offset"], 1e3))))
    with torch.no_grad():  # reconstruction alone (no dynamics) on the test trajectories, and on the training ones
        ctx.metrics.units("recon_err", relative_state_error(d["q_test"], d["p_test"], q_dec, p_dec).mean(1))
        rq, rp = red.decode(*red.encode(torch.as_tensor(d["q_train"]), torch.as_tensor(d["p_train"])))
        ctx.metrics.units("recon_err_train", relative_state_error(d["q_train"], d["p_train"], rq.numpy(), rp.numpy()).mean(1))
    if ctx.variant in ("ro_hnn", "sae_ghnn", "sae_node"):
        with torch.no_grad():
            qz, _ = red.encode(torch.as_tensor(d["q_test"]), torch.as_tensor(d["p_test"]))
            ctx.metrics.scalar("isometry_defect", float(red.isometry_penalty(qz.reshape(-1, qz.shape[-1]))))
    if ctx.variant == "psd_hnn":  # how many PSD modes the test reconstruction needs
        q, pm = _snapshots(d, "train")
        q_ref = q.mean(0)
        from .reductions import LinearPSD, psd_cotangent_lift
        modes = [m_ for m_ in p["psd_modes"] if m_ <= big]
        errs = []
        for n_modes in modes:
            lin = LinearPSD(psd_cotangent_lift(q - q_ref, pm, n_modes), q_ref)
            rq, rp = lin.decode(*lin.encode(torch.as_tensor(d["q_test"]), torch.as_tensor(d["p_test"])))
            errs.append(float(relative_state_error(d["q_test"], d["p_test"], rq.numpy(), rp.numpy()).mean()))
        ctx.metrics.curve("psd_recon_vs_modes", modes, errs)

    times = np.arange(steps + 1) * p["h"]
    sel = np.unique(np.linspace(0, steps, p["curve_points"]).round().astype(int))
    ctx.metrics.curve("state_err", times[sel], m["state_err_t"][sel])
    ctx.metrics.curve("energy_err", times[sel], m["energy_err_t"][sel])
    ctx.metrics.curve("excitation_ratio", times[sel], m["excitation_ratio_t"][sel])
    ctx.metrics.curve("kink_x", times[sel], chain.position(qh[0])[sel])
    ctx.metrics.curve("kink_x_true", times[sel], chain.position(d["q_test"][0])[sel])
    ctx.metrics.curve("snapshot_q", np.arange(1, big + 1), qh[0, -1])
    ctx.metrics.curve("snapshot_q_true", np.arange(1, big + 1), d["q_test"][0, -1])


from .plots import plot  # noqa: E402,F401
