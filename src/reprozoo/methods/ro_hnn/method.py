"""RO-HNN in miniature: FPU-beta chain (N = 50, 100-dim phase space), three reduced-order models.

Variants (all latent dimension 2n, same data, same optimiser, same step budgets):
  ro_hnn    symplectic autoencoder (cotangent lift of a nonlinear embedding, reductions.py)
            + latent HNN integrated by leapfrog                                   [the paper]
  psd_hnn   linear PSD (cotangent lift by SVD) + the same latent HNN and leapfrog   [linear MOR]
  ae_node   plain autoencoder + latent neural ODE integrated by RK4                 [no structure]

Stages per cell: (1) fit the reduction on training snapshots (the autoencoders for ae_steps Adam
steps; PSD is a closed-form SVD); (2) encode the training trajectories and fit the latent model
on K-step rollout windows for dyn_steps Adam steps; (3) from encoded held-out initial states,
roll out 10x the training horizon, decode and compare with the leapfrog reference.
Units: dimensionless chain (m = k = a = 1), time in sqrt(m/k). Errors are relative:
state error |x_hat - x| / |x| with x = (q, p), energy error |H(x_hat) - H(x_0)| / H(x_0) under the
true FPU Hamiltonian.
"""
from __future__ import annotations

import time

import numpy as np

from ...io import save_npz
from . import fpu

GENERIC_CURVES = {"ae_loss": ("training step", "autoencoder reconstruction loss (scaled MSE)"),
                  "dyn_loss": ("training step", "latent rollout loss (scaled MSE)")}


def train_shared(ctx) -> None:
    """Training and held-out test trajectories of the FPU chain (leapfrog reference), per seed."""
    p = ctx.params
    s = p["system"]
    rng = ctx.rng(0)
    every = int(round(p["h"] / s["dt"]))
    n_train_pts = int(round(p["t_train"] / p["h"]))
    q0, p0 = fpu.initial_states(p["n_train"] + p["n_test"], s["n"], s["modes"], tuple(s["amp"]), rng)
    t0 = time.perf_counter()
    q, pm = fpu.simulate(q0, p0, s["beta"], s["dt"], every, n_train_pts * p["horizon_factor"])
    ctx.metrics.scalar("reference_seconds", time.perf_counter() - t0)
    e = fpu.energy(q, pm, s["beta"])
    ctx.metrics.scalar("reference_energy_err", float(np.max(np.abs(e / e[:, :1] - 1))))
    k = p["n_train"]
    ctx.metrics.scalar("slaving_r2", slaving_r2(q[:k, :n_train_pts + 1].reshape(-1, s["n"]), s["modes"]))
    save_npz(ctx.shared_dir / "fpu.npz", q_train=q[:k, :n_train_pts + 1], p_train=pm[:k, :n_train_pts + 1],
             q_test=q[k:], p_test=pm[k:])


def slaving_r2(q: np.ndarray, modes) -> float:
    """Share of the unexcited modes' variance that a cubic polynomial of the excited modal
    amplitudes explains: 1 if the higher modes are slaved to the excited ones (a curved
    submanifold a nonlinear reduction can capture and a linear one cannot), 0 if they move freely."""
    s, _ = fpu.normal_modes(q.shape[-1])
    a = q @ s
    x = a[:, [k - 1 for k in modes]]
    feats = [np.ones(len(x))]
    for deg in (1, 2, 3):
        for idx in np.ndindex(*(len(modes),) * deg):
            if list(idx) == sorted(idx):
                feats.append(np.prod(x[:, list(idx)], axis=1))
    f = np.stack(feats, 1)
    rest = np.delete(a, [k - 1 for k in modes], axis=1)
    resid = rest - f @ np.linalg.lstsq(f, rest, rcond=None)[0]
    return float(1 - (resid**2).sum() / ((rest - rest.mean(0)) ** 2).sum())


def _load(ctx):
    return dict(np.load(ctx.shared_dir / "fpu.npz"))


def fit_reduction(variant: str, q: np.ndarray, pm: np.ndarray, cfg: dict, seed: int, progress=print):
    """Reduction fitted on snapshots q, pm [M, N]; returns (model, loss curve)."""
    import torch

    from .reductions import LinearPSD, PlainAE, SymplecticAE, psd_cotangent_lift

    n = cfg["latent_dof"]
    phi = psd_cotangent_lift(q, pm, n)
    if variant == "psd_hnn":
        return LinearPSD(phi), []
    gen = torch.Generator().manual_seed(seed)
    s_q, s_p = float(q.std()), float(pm.std())
    qt, pt = torch.as_tensor(q), torch.as_tensor(pm)
    if variant == "ro_hnn":
        s_lat = (q @ phi).std(0)
        model = SymplecticAE(phi, cfg["ae_width"], s_q, s_lat, gen)
    else:
        x = np.concatenate([q / s_q, pm / s_p], 1)
        u, _, _ = np.linalg.svd(x.T, full_matrices=False)
        model = PlainAE(u[:, :2 * n], cfg["ae_width"], s_q, s_p, gen)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg["ae_steps"])
    losses = []
    for step in range(cfg["ae_steps"]):
        idx = torch.randint(len(qt), (cfg["batch"],), generator=gen)
        qz, pz = model.encode(qt[idx], pt[idx])
        qh, ph = model.decode(qz, pz)
        loss = ((qh - qt[idx]) ** 2).mean() / s_q**2 + ((ph - pt[idx]) ** 2).mean() / s_p**2
        if variant == "ro_hnn":
            loss = loss + cfg["isometry_weight"] * model.isometry_penalty(qz)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    progress(f"{variant}: reduction loss {np.mean(losses[-20:]):.3e}")
    return model, losses


def fit_latent(variant: str, qz: np.ndarray, pz: np.ndarray, cfg: dict, h: float, seed: int, progress=print):
    """Latent model trained on K-step rollouts of encoded trajectories qz, pz [traj, T, n]."""
    import torch

    from .latent_dynamics import LatentHNN, LatentNODE, rollout

    gen = torch.Generator().manual_seed(seed + 1)
    n = qz.shape[-1]
    s_z = np.concatenate([qz.reshape(-1, n).std(0), pz.reshape(-1, n).std(0)])
    if variant == "ae_node":
        model = LatentNODE(n, cfg["dyn_width"], s_z, gen)
    else:
        model = LatentHNN(n, cfg["dyn_width"], s_z[:n], gen)
    qt, pt = torch.as_tensor(qz), torch.as_tensor(pz)
    w = torch.as_tensor(1.0 / s_z**2)
    k = cfg["window"]
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg["dyn_steps"])
    losses = []
    model.train()
    for step in range(cfg["dyn_steps"]):
        tr = torch.randint(qt.shape[0], (cfg["batch"],), generator=gen)
        t0 = torch.randint(qt.shape[1] - k, (cfg["batch"],), generator=gen)
        ts = t0[:, None] + torch.arange(k + 1)
        tq, tp = qt[tr[:, None], ts], pt[tr[:, None], ts]
        rq, rp = rollout(model, tq[:, 0], tp[:, 0], h, k)
        loss = (((torch.cat([rq, rp], -1) - torch.cat([tq, tp], -1)) ** 2) * w).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    progress(f"{variant}: latent loss {np.mean(losses[-20:]):.3e}")
    return model, losses


def predict(reduction, latent, q0: np.ndarray, p0: np.ndarray, h: float, steps: int):
    """Encode, roll out, decode: q, p [batch, steps + 1, N]."""
    import torch

    from .latent_dynamics import rollout

    with torch.no_grad():
        qz, pz = reduction.encode(torch.as_tensor(q0), torch.as_tensor(p0))
    rq, rp = rollout(latent, qz.detach(), pz.detach(), h, steps)
    with torch.no_grad():
        qh, ph = reduction.decode(rq.detach(), rp.detach())
    return qh.numpy(), ph.numpy()


def relative_state_error(q, pm, qh, ph):
    """|x_hat - x| per time with q and p each scaled by their RMS over the trajectory, / sqrt(2).

    The instantaneous |x(t)| is a bad denominator here: |p| ~ omega |q| with omega ~ 0.1, so |x|
    nearly vanishes at every zero crossing of q. Scaling each half by its trajectory RMS weighs
    positions and momenta alike; a zero prediction scores 1 in the time-RMS, an uncorrelated one about sqrt(2).
    """
    rq = np.sqrt((q**2).sum(-1).mean(-1, keepdims=True))
    rp = np.sqrt((pm**2).sum(-1).mean(-1, keepdims=True))
    return np.sqrt((((qh - q) ** 2).sum(-1) / rq**2 + ((ph - pm) ** 2).sum(-1) / rp**2) / 2)


def long_horizon_metrics(q, pm, qh, ph, beta: float, n_train_pts: int) -> dict:
    """Relative state and energy errors against the reference, per time (mean over trajectories)."""
    with np.errstate(over="ignore", invalid="ignore"):
        err = relative_state_error(q, pm, qh, ph)
        e_true = fpu.energy(q[:, 0], pm[:, 0], beta)[:, None]
        e_hat = fpu.energy(qh, ph, beta)
        e_err = np.abs(e_hat / e_true - 1)
    err = np.where(np.isfinite(err), err, 1e3)  # a blow-up counts as a large finite error
    e_err = np.where(np.isfinite(e_err), e_err, 1e3)
    k = n_train_pts
    return {"state_err_t": err.mean(0), "energy_err_t": e_err.mean(0), "energy_ratio_t": e_hat[0] / e_true[0, 0],
            "state_err_train": float(err[:, :k + 1].mean()), "state_err_long": float(err.mean()),
            "state_err_max": float(err.max()),
            "energy_err_first": float(e_err[:, :k + 1].mean()), "energy_err_last": float(e_err[:, -k:].mean()),
            "energy_err_long": float(e_err.mean())}


def train(ctx) -> None:
    import torch

    torch.set_num_threads(ctx.threads)
    torch.manual_seed(ctx.seed)
    p = ctx.params
    d = _load(ctx)
    n_train_pts = d["q_train"].shape[1] - 1
    big = d["q_train"].shape[-1]
    t0 = time.perf_counter()
    red, ae_losses = fit_reduction(ctx.variant, d["q_train"].reshape(-1, big), d["p_train"].reshape(-1, big),
                                   p["model"], ctx.seed, ctx.progress)
    with torch.no_grad():
        qz, pz = red.encode(torch.as_tensor(d["q_train"]), torch.as_tensor(d["p_train"]))
    lat, dyn_losses = fit_latent(ctx.variant, qz.detach().numpy(), pz.detach().numpy(), p["model"], p["h"],
                                 ctx.seed, ctx.progress)
    ctx.metrics.scalar("train_seconds", time.perf_counter() - t0)
    steps = d["q_test"].shape[1] - 1
    qh, ph = predict(red, lat, d["q_test"][:, 0], d["p_test"][:, 0], p["h"], steps)
    m = long_horizon_metrics(d["q_test"], d["p_test"], qh, ph, p["system"]["beta"], n_train_pts)
    with torch.no_grad():  # reconstruction alone (no dynamics) on the test states
        rq, rp = red.decode(*red.encode(torch.as_tensor(d["q_test"]), torch.as_tensor(d["p_test"])))
    ctx.metrics.scalar("recon_err", float(relative_state_error(d["q_test"], d["p_test"], rq.numpy(), rp.numpy()).mean()))
    with torch.no_grad():
        rq, rp = red.decode(*red.encode(torch.as_tensor(d["q_train"]), torch.as_tensor(d["p_train"])))
    ctx.metrics.scalar("recon_err_train",
                       float(relative_state_error(d["q_train"], d["p_train"], rq.numpy(), rp.numpy()).mean()))
    for key, val in m.items():
        if not key.endswith("_t"):
            ctx.metrics.scalar(key, val)
    times = np.arange(steps + 1) * p["h"]
    sel = np.unique(np.linspace(0, steps, p["curve_points"]).round().astype(int))
    ctx.metrics.curve("state_err", times[sel], m["state_err_t"][sel])
    ctx.metrics.curve("energy_err", times[sel], m["energy_err_t"][sel])
    ctx.metrics.curve("energy_ratio", times[sel], m["energy_ratio_t"][sel])
    e_ref = fpu.energy(d["q_test"][0], d["p_test"][0], p["system"]["beta"])
    ctx.metrics.curve("energy_ratio_true", times[sel], (e_ref / e_ref[0])[sel])
    ctx.metrics.curve("snapshot_q", np.arange(1, big + 1), qh[0, -1])
    ctx.metrics.curve("snapshot_q_true", np.arange(1, big + 1), d["q_test"][0, -1])
    for name, ls in (("ae_loss", ae_losses), ("dyn_loss", dyn_losses)):
        if ls:
            every = max(1, len(ls) // 50)
            ctx.metrics.curve(name, range(0, len(ls), every), ls[::every])
            tail = np.asarray(ls[-max(len(ls) // 5, 2):])
            ctx.metrics.scalar(f"{name}_final", float(tail.mean()))
            # fractional change per 1000 steps over the last fifth: how flat the curve ended
            slope = np.polyfit(np.arange(len(tail)), np.log(tail), 1)[0]
            ctx.metrics.scalar(f"{name}_final_slope_per_1k", float(slope * 1000))


from .plots import plot  # noqa: E402,F401
