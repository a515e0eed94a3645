"""Crystal tensor data for the networks, training loop, metrics, equivariance checks and timing."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from ...blocks.atomistic import AtomsData
from ...blocks.cartesian import ewt, fnorm, random_rotations, rotate, to_voigt

EWT_THRESHOLDS = (0.25, 0.10, 0.05)


# --- data ----------------------------------------------------------------------------------------

def crystal_frames(structures) -> dict:
    """Frames (AtomsData format) of pymatgen structures: periodic cells, no energies."""
    return {"positions": [np.asarray(s.cart_coords, dtype=float) for s in structures],
            "numbers": [np.array([site.specie.Z for site in s], dtype=np.int64) for s in structures],
            "cells": [np.asarray(s.lattice.matrix, dtype=float) for s in structures],
            "pbc": [np.ones(3, bool) for _ in structures], "energy": None, "forces": None}


def atoms_frames(atoms_list) -> dict:
    """Frames of ase.Atoms (periodic), for tests."""
    return {"positions": [a.get_positions() for a in atoms_list],
            "numbers": [a.get_atomic_numbers().astype(np.int64) for a in atoms_list],
            "cells": [np.asarray(a.cell.array, float) for a in atoms_list],
            "pbc": [np.asarray(a.pbc, bool) for a in atoms_list], "energy": None, "forces": None}


def model_args(b):
    return b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures


def mean_degree(data: AtomsData, idx) -> float:
    edges = sum(len(data.graph(k)[0]) for k in idx)
    atoms = sum(data.n_atoms(k) for k in idx)
    return max(edges / max(atoms, 1), 1.0)


def target_scale(targets: np.ndarray) -> float:
    """RMS of the Voigt components of the training targets (one scalar: keeps equivariance)."""
    v = to_voigt(torch.as_tensor(targets, dtype=torch.float64)).numpy()
    return float(np.sqrt(np.mean(v**2))) or 1.0


def inversion_zero(structures, targets: np.ndarray, order: int, symprec: float = 1e-5) -> np.ndarray:
    """Mask of structures whose odd-order target vanishes because the crystal is centrosymmetric.

    For any O(3)-equivariant model f and an inversion-symmetric crystal x, f(x) = f(-x) = -f(x) = 0:
    such samples add a constant to the loss and no gradient, so training can skip them. Even
    orders: no structure is skipped.
    """
    if order % 2 == 0:
        return np.zeros(len(structures), bool)
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    norms = np.linalg.norm(np.asarray(targets).reshape(len(targets), -1), axis=1)
    zero = norms <= 1e-12 * max(float(norms.max(initial=0.0)), 1e-300)
    out = np.zeros(len(structures), bool)
    for k in np.flatnonzero(zero):
        try:
            out[k] = bool(SpacegroupAnalyzer(structures[k], symprec=symprec).is_laue())
        except Exception:  # noqa: BLE001 - spglib failure: keep the sample
            out[k] = False
    return out


# --- training ------------------------------------------------------------------------------------

@dataclass
class FitConfig:
    epochs: int = 100
    batch_size: int = 32
    lr: float = 3e-3
    evals_per_epoch: int = 1      # validation points per epoch (the gate needs >= 5 in the last 30 %)
    lr_floor: float = 0.3         # cosine decay from lr to lr_floor * lr at the last step (never below 0.1 x peak)
    stop_tol: float | None = 0.02  # early stop once the validation curve passes the convergence gate's own test
    stop_min_points: int = 6      # ... with at least this many points in its last 30 %
    min_epochs_frac: float = 0.4  # ... and not before this share of ``epochs``
    grad_clip: float = 10.0
    seed: int = 0
    device: str = "cpu"


def lr_factor(step: int, total: int, floor: float) -> float:
    """Cosine decay from 1 at step 0 to ``floor`` at step ``total`` (flat at ``floor`` after it)."""
    t = min(max(step / max(total, 1), 0.0), 1.0)
    return floor + (1.0 - floor) * 0.5 * (1.0 + np.cos(np.pi * t))


def predict(model, data: AtomsData, idx, dtype=torch.float32, batch_size: int = 256, device=None) -> np.ndarray:
    model.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(idx), batch_size):
            b = data.collate(idx[s:s + batch_size], dtype=dtype).to(device=device)
            out.append(model(*model_args(b)).double().cpu().numpy())
    return np.concatenate(out)


def voigt(t: np.ndarray) -> np.ndarray:
    return to_voigt(torch.as_tensor(t, dtype=torch.float64)).numpy()


def fit(model, data: AtomsData, train_idx, val_idx, targets: np.ndarray, cfg: FitConfig, progress=None):
    """Adam on the MSE of the Voigt components / out_scale^2, with a cosine decay of the learning rate from
    ``lr`` to ``lr_floor * lr`` over ``epochs`` (the rate stays up through the convergence gate's window: a
    plateau there is the model's, not the schedule's). Validation Fnorm ``evals_per_epoch`` times per epoch
    (x axis: epochs, fractional); keeps the state with the lowest validation Fnorm. Stops early once the
    validation curve is flat by :func:`reprozoo.claims.plateau` (the gate's test, tolerance ``stop_tol``, at
    least ``stop_min_points`` points in the last 30 %), but not before ``min_epochs_frac * epochs``.
    ``hist``: epoch, loss (mean training loss since the previous evaluation), val_fnorm, lr (at the
    evaluation), best_epoch, stopped_epoch, train_seconds."""
    from ...claims import plateau

    gen = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    dev = torch.device(cfg.device)
    model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    train_idx = np.asarray(train_idx)
    n_batches = int(np.ceil(len(train_idx) / cfg.batch_size))
    total = max(1, cfg.epochs * n_batches)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, total, cfg.lr_floor))
    # evaluation steps: evals_per_epoch per epoch, spread evenly over its batches, and the last step
    per = max(1, min(int(cfg.evals_per_epoch), n_batches))
    eval_at = {int(round(e * n_batches + (j + 1) * n_batches / per)) for e in range(cfg.epochs) for j in range(per)}
    eval_at = {k for k in eval_at if 1 <= k <= total} | {total}
    scale = float(model.out_scale)
    y_all = torch.as_tensor(voigt(targets), dtype=torch.float32, device=dev)
    y_val = voigt(targets[val_idx]) if len(val_idx) else None
    hist = {"epoch": [], "loss": [], "val_fnorm": [], "lr": []}
    best = (np.inf, copy.deepcopy(model.state_dict()), 0.0)
    t0 = time.perf_counter()
    step, losses = 0, []
    for ep in range(1, cfg.epochs + 1):
        order = gen.permutation(train_idx)
        for s in range(0, len(order), cfg.batch_size):
            model.train()
            idx = order[s:s + cfg.batch_size]
            b = data.collate(idx, dtype=torch.float32).to(device=dev)
            pred = to_voigt(model(*model_args(b)))
            loss = ((pred - y_all[idx]) ** 2).mean() / scale**2
            opt.zero_grad()
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            lr_now = opt.param_groups[0]["lr"]
            sched.step()
            step += 1
            losses.append(loss.item())
            if step not in eval_at:
                continue
            val = fnorm(voigt(predict(model, data, val_idx, device=dev)), y_val) if len(val_idx) else np.nan
            x = step / n_batches
            hist["epoch"].append(x)
            hist["loss"].append(float(np.mean(losses)))
            hist["val_fnorm"].append(float(val))
            hist["lr"].append(float(lr_now))
            if not np.isfinite(best[0]) or (np.isfinite(val) and val < best[0]):
                best = (val, copy.deepcopy(model.state_dict()), x)
            if progress and (step % n_batches == 0 or step == total):
                progress(f"epoch {x:.2f}/{cfg.epochs} loss {np.mean(losses):.4f} val Fnorm {val:.4g} lr {lr_now:.2e} "
                         f"({time.perf_counter() - t0:.1f} s)")
            losses = []
            if (cfg.stop_tol is not None and x >= cfg.min_epochs_frac * cfg.epochs and step < total
                    and plateau(hist["epoch"], hist["val_fnorm"], tol=cfg.stop_tol, min_points=cfg.stop_min_points)):
                if progress:
                    progress(f"validation Fnorm flat at epoch {x:.2f} (gate's test, tolerance {cfg.stop_tol:g}): stop")
                break
        else:
            continue
        break
    if np.isfinite(best[0]):
        model.load_state_dict(best[1])
    hist["best_epoch"] = best[2]
    hist["stopped_epoch"] = hist["epoch"][-1] if hist["epoch"] else 0.0
    hist["train_seconds"] = time.perf_counter() - t0
    return hist


def tensor_metrics(pred: np.ndarray, true: np.ndarray, zero_tol: float = 1e-8) -> dict:
    """Fnorm over all structures and EwT 25/10/5 % over those with a non-zero target, on the Voigt
    forms (3x3, 3x6, 6x6). A zero target (e.g. an odd-order tensor of a centrosymmetric crystal) has
    no relative error; equivariant models predict exactly zero there anyway."""
    pv, tv = voigt(pred), voigt(true)
    norms = np.linalg.norm(tv.reshape(len(tv), -1), axis=1)
    nz = norms > zero_tol * max(float(norms.max(initial=0.0)), 1e-300)
    out = {"fnorm": fnorm(pv, tv), "n_nonzero": int(nz.sum())}
    for thr in EWT_THRESHOLDS:
        out[f"ewt{int(round(thr * 100))}"] = ewt(pv[nz], tv[nz], thr) if nz.any() else float("nan")
    return out


# --- equivariance and timing ---------------------------------------------------------------------

def rotate_batch(b, rot: torch.Tensor):
    """Rotate every structure of a batch by its own matrix ``rot (B, 3, 3)`` (positions and periodic
    shifts, i.e. the whole crystal); the neighbour list is unchanged."""
    out = copy.copy(b)
    r_atom = rot.to(b.positions.dtype)[b.batch]
    out.positions = torch.einsum("nab,nb->na", r_atom, b.positions)
    r_edge = r_atom[b.edge_index[0]]
    out.shifts = torch.einsum("eab,eb->ea", r_edge, b.shifts)
    out.cells = torch.einsum("nab,ncb->nca", rot.to(b.cells.dtype), b.cells)
    return out


def rattled(data: AtomsData, idx, stdev: float, seed: int) -> AtomsData:
    """Copies of structures ``idx`` with Gaussian-displaced atoms (new neighbour lists): generic inputs
    for the equivariance check (a centrosymmetric crystal has an exactly zero odd-order tensor)."""
    rng = np.random.default_rng(seed)
    fr = data.frames
    frames = {"positions": [fr["positions"][k] + rng.normal(0.0, stdev, fr["positions"][k].shape) for k in idx],
              "numbers": [fr["numbers"][k] for k in idx], "cells": [fr["cells"][k] for k in idx],
              "pbc": [fr["pbc"][k] for k in idx], "energy": None, "forces": None}
    return AtomsData(frames, data.cutoff)


def equivariance_error(model, data: AtomsData, idx=None, dtype=torch.float64, n_rotations: int = 2,
                       seed: int = 0, device=None, rotate_output: bool = True) -> float:
    """max |f(R x) - R.f(x)| / max |f(x)| over the structures ``idx`` (default all) and random
    rotations, every other one improper (a reflection). ``rotate_output=False`` compares f(R x) with
    f(x) instead: the error of a model whose tensor does not turn with the crystal (a negative control
    that the same bound must flag)."""
    model.eval()
    idx = np.arange(len(data)) if idx is None else idx
    b = data.collate(idx, dtype=dtype).to(device=device)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        y = model(*model_args(b))
        scale = float(y.abs().max()) or 1.0
        err = 0.0
        for _ in range(n_rotations):
            rot = random_rotations(b.n_structures, reflections=True, generator=gen, dtype=dtype).to(b.positions.device)
            y_rot = model(*model_args(rotate_batch(b, rot)))
            ref = rotate(y, rot) if rotate_output else y
            err = max(err, float((y_rot - ref).abs().max()) / scale)
    return err


def time_forward(models: dict, data: AtomsData, idx, repeats: int = 5, warmup: int = 1, device=None) -> dict:
    """Median forward time (ms per structure; float32, no grad) of each model on the same batch,
    the models interleaved in every repeat so that they see the same machine load."""
    b = data.collate(idx, dtype=torch.float32).to(device=device)
    cuda = b.positions.is_cuda

    def sync():
        if cuda:
            torch.cuda.synchronize()

    times = {k: [] for k in models}
    for m in models.values():
        m.eval()
    with torch.no_grad():
        for r in range(warmup + repeats):
            for k, m in models.items():
                m.to(b.positions.device)
                sync()
                t0 = time.perf_counter()
                m(*model_args(b))
                sync()
                dt = time.perf_counter() - t0
                if r >= warmup:
                    times[k].append(dt)
    return {k: 1e3 * float(np.median(v)) / b.n_structures for k, v in times.items()}
