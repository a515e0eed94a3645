"""Crystal tensor data for the networks, training loop, metrics, equivariance checks and timing."""
from __future__ import annotations

import copy
import time

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

FIT_KEYS = ("lr_grid", "pilot_steps", "eval_every", "min_steps", "max_steps", "flat_tol")


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


def fit(build, data: AtomsData, train_idx, val_idx, targets: np.ndarray, cfg: dict, seed: int, progress=None,
        device="cpu"):
    """The platform's shared training rule (:func:`reprozoo.blocks.fitting.fit_to_plateau`) on the MSE of
    the Voigt components / out_scale^2: every rate of ``cfg["lr_grid"]`` piloted for ``pilot_steps`` from
    the same initial weights (``build()`` under ``torch.manual_seed(seed)``), the rate with the lowest
    pilot score (by default the mean of the second half of its validation Fnorms) continued at that rate
    until the validation Fnorm passes the gate's plateau test (``flat_tol``; not before ``min_steps``), then
    (by default) the rate dropped once by ``lr_drop`` and trained to a second plateau (at most ``max_steps``
    in all), best-validation weights kept.
    Minibatches of ``batch_size`` cells drawn without replacement. ``cfg``: the keys of
    :mod:`reprozoo.blocks.fitting` plus ``batch_size``. Returns ``(model, hist)``; ``hist``: epoch (step /
    batches per epoch), loss (mean training loss since the previous evaluation), val_fnorm, lr,
    best_epoch, stopped_epoch, train_seconds, lr_chosen, plateau, pilot_best, drop_epoch, drop_gain (None
    without a drop), lr_edge ("top" / "bottom" / None)."""
    from ...blocks.fitting import fit_to_plateau

    missing = [k for k in FIT_KEYS + ("batch_size",) if k not in cfg]
    if missing:
        raise ValueError(f"ceitnet fit: missing key(s) {missing}")
    dev = torch.device(device)
    train_idx = np.asarray(train_idx)
    bs = min(int(cfg["batch_size"]), len(train_idx))
    n_batches = int(np.ceil(len(train_idx) / bs))
    y_all = torch.as_tensor(voigt(targets), dtype=torch.float32, device=dev)
    y_val = voigt(targets[val_idx])

    def make(gen):
        torch.manual_seed(seed)  # the same initial weights for every rate
        return build().to(dev)

    def train_loss(model, gen):
        idx = train_idx[torch.randperm(len(train_idx), generator=gen)[:bs].numpy()]
        b = data.collate(idx, dtype=torch.float32).to(device=dev)
        pred = to_voigt(model(*model_args(b)))
        return ((pred - y_all[idx]) ** 2).mean() / float(model.out_scale) ** 2

    def val_loss(model):
        return fnorm(voigt(predict(model, data, val_idx, device=dev)), y_val)

    fp = {k: v for k, v in cfg.items() if k != "batch_size"}
    t0 = time.perf_counter()
    model, rec = fit_to_plateau(make, train_loss, val_loss, fp, seed, label="fit",
                                progress=progress or (lambda *_: None))
    steps = np.asarray(rec["steps"], float)
    losses = np.asarray(rec["losses"], float)
    # mean training loss over the steps since the previous evaluation (nan at step 0)
    loss = [float(np.mean(losses[int(a):int(b)])) if b > a else float("nan") for a, b in zip([0, *steps[:-1]], steps)]
    vals = np.asarray(rec["vals"], float)
    # the kept weights' evaluation: the best from ``keep_from`` on (the rule keeps none before it)
    kept = steps >= int(cfg.get("keep_from", 0))
    best = int(np.flatnonzero(kept)[np.argmin(vals[kept])]) if kept.any() else int(np.argmin(vals))
    hist = {"epoch": list(steps / n_batches), "loss": loss, "val_fnorm": list(vals), "lr": list(rec["lrs"]),
            "best_epoch": float(steps[best] / n_batches), "stopped_epoch": float(rec["stop"] / n_batches),
            "train_seconds": time.perf_counter() - t0, "lr_chosen": float(rec["lr"]),
            "plateau": bool(rec["plateau"]), "pilot_best": rec["pilot_best"],
            "drop_epoch": None if rec.get("drop_step") is None else float(rec["drop_step"] / n_batches),
            "drop_gain": rec.get("drop_gain"), "lr_edge": rec.get("lr_edge")}
    return model, hist


def isotropic_part(t: np.ndarray, order: int) -> np.ndarray:
    """The rotation-invariant part of Cartesian tensors ``t (B, 3, ..., 3)``: their average over all of O(3)
    (the orthogonal projection onto the isotropic tensors of the order, in the full tensor's Frobenius norm).
    Order 2: tr(t)/3 I; order 3: zero (no isotropic ijk=ikj tensor is invariant under reflections); order 4
    with the minor symmetries ij = ji, kl = lk: lam d_ij d_kl + mu (d_ik d_jl + d_il d_jk). What a predictor
    without any directional (tensor) path can output (``fnorm_iso_o4``: a recorded diagnostic, no claim reads it)."""
    t = np.asarray(t, dtype=float)
    eye = np.eye(3)
    if order == 2:
        return np.trace(t, axis1=1, axis2=2)[:, None, None] / 3.0 * eye
    if order == 3:
        return np.zeros_like(t)
    if order != 4:
        raise ValueError(f"isotropic_part: order {order}")
    e1 = np.einsum("ij,kl->ijkl", eye, eye)
    e2 = np.einsum("ik,jl->ijkl", eye, eye) + np.einsum("il,jk->ijkl", eye, eye)
    basis = np.stack([e1, e2]).reshape(2, -1)
    gram = basis @ basis.T                                         # [[9, 6], [6, 24]]
    coef = np.linalg.solve(gram, basis @ t.reshape(len(t), -1).T)  # (2, B)
    return (coef.T @ basis).reshape(t.shape)


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


def time_forward(models: dict, data: AtomsData, idx, repeats: int = 5, warmup: int = 1, device=None,
                 backward: bool = False) -> dict:
    """Median forward time (ms per structure; float32, no grad) of each model on the same batch,
    the models interleaved in every repeat so that they see the same machine load. ``backward``: the
    time of a forward pass with gradients plus the backward pass of the output's sum (a training step's
    cost without the optimiser)."""
    b = data.collate(idx, dtype=torch.float32).to(device=device)
    cuda = b.positions.is_cuda

    def sync():
        if cuda:
            torch.cuda.synchronize()

    times = {k: [] for k in models}
    for m in models.values():
        m.eval()
    with torch.set_grad_enabled(backward):
        for r in range(warmup + repeats):
            for k, m in models.items():
                m.to(b.positions.device)
                m.zero_grad(set_to_none=True)
                sync()
                t0 = time.perf_counter()
                out = m(*model_args(b))
                if backward:
                    out.sum().backward()
                sync()
                dt = time.perf_counter() - t0
                if r >= warmup:
                    times[k].append(dt)
    return {k: 1e3 * float(np.median(v)) / b.n_structures for k, v in times.items()}
