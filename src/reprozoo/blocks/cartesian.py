"""Cartesian tensor utilities (torch): symmetric tensor powers, environment tensors, rotations,
Voigt forms and the error metrics of tensor-property prediction.

Generic building blocks for Cartesian equivariant networks (used by ceitnet); importing this module
imports torch (method code only).

Packed symmetric storage
------------------------
A fully symmetric order-n tensor in 3-D has ``(n+1)(n+2)/2`` independent components, one per sorted
multi-index ``i1 <= ... <= in`` (:func:`sym_indices`). ``sym_power(u, n)`` gives the packed
components of ``u (x) u (x) ... (x) u`` (monomials), ``unpack(packed, n)`` the full ``(..., 3, ..., 3)``
tensor, and ``sym_weights(n)`` the multiplicities ``n! / (a! b! c!)`` such that the full contraction
``<A, B> = sum_p w_p A_p B_p`` for packed A, B. ``sym_powers(u, lmax)`` concatenates orders 0..lmax
(blocks at ``sym_offsets(lmax)``); ``detrace(packed, n)`` is the traceless (irreducible) part, the
Cartesian counterpart of the degree-n spherical harmonics.

Environment tensors
-------------------
``segment_outer_sum(w, f, index, n)``: ``out[i] = sum_{e: index[e] = i} w_e (outer) f_e`` for edge
weights ``w (E, C)`` and edge features ``f (E, D)`` -> ``(n, C, D)``; the edges are padded per
destination and reduced with one batched matmul (no (E, C, D) intermediate).

Rotations, index symmetries, Voigt forms
----------------------------------------
``rotate(t, R)`` (any order, batched R), ``random_rotations(n, reflections=False)`` (Haar),
``VOIGT``, ``to_voigt(t)`` for orders 2 (3x3), 3 ((3, 6), symmetric last pair) and 4 ((6, 6)),
``index_symmetry_residual(t, perms)``.

Metrics
-------
``frobenius_errors(pred, true)`` -> (absolute, relative) per sample; ``fnorm`` (mean absolute
Frobenius error) and ``ewt(pred, true, thr)`` (share of samples with relative Frobenius error
below ``thr``), as used for crystal tensor benchmarks (GMTNet, CEITNet).
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import torch

VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))


# --- packed symmetric tensors ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def sym_indices(n: int) -> tuple[tuple[int, ...], ...]:
    """Sorted multi-indices (i1 <= ... <= in) of a fully symmetric order-n tensor in 3-D."""
    return tuple(itertools.combinations_with_replacement(range(3), n))


def n_sym(n: int) -> int:
    return (n + 1) * (n + 2) // 2


@functools.lru_cache(maxsize=None)
def _unpack_np(n: int) -> np.ndarray:
    pos = {idx: p for p, idx in enumerate(sym_indices(n))}
    return np.array([pos[tuple(sorted(full))] for full in itertools.product(range(3), repeat=n)], dtype=np.int64)


@functools.lru_cache(maxsize=None)
def _cached_tensor(kind: str, n: int, device) -> torch.Tensor:
    arrays = {"unpack": _unpack_np, "powers": _powers_np, "detrace": _detrace_np}
    return torch.as_tensor(arrays[kind](n), device=device)


def unpack_index(n: int, device=None) -> torch.Tensor:
    """(3**n,) positions in the packed vector of every full multi-index (row-major)."""
    return _cached_tensor("unpack", n, torch.device(device) if device is not None else torch.device("cpu"))


def sym_offsets(lmax: int) -> list[int]:
    """Start of order n's block in the concatenated packed vector of orders 0..lmax (+ total)."""
    return [sum(n_sym(k) for k in range(n)) for n in range(lmax + 2)]


@functools.lru_cache(maxsize=None)
def _powers_np(lmax: int) -> np.ndarray:
    """(P, lmax) positions in [1, x, y, z] whose product is each packed monomial of orders 0..lmax."""
    rows = []
    for n in range(lmax + 1):
        for idx in sym_indices(n):
            rows.append([a + 1 for a in idx] + [0] * (lmax - n))
    return np.array(rows, dtype=np.int64).reshape(-1, max(lmax, 1))


def sym_powers(u: torch.Tensor, lmax: int) -> torch.Tensor:
    """Packed n-fold outer powers of ``u (E, 3)`` for every n = 0..lmax, concatenated:
    (E, sum_n n_sym(n)); order n occupies ``sym_offsets(lmax)[n]:sym_offsets(lmax)[n + 1]``."""
    ext = torch.cat([u.new_ones(u.shape[:-1] + (1,)), u], dim=-1)
    idx = _cached_tensor("powers", lmax, u.device)
    return ext[..., idx].prod(-1) if lmax > 0 else ext[..., :1]


@functools.lru_cache(maxsize=None)
def _weights_np(n: int) -> np.ndarray:
    out = []
    for idx in sym_indices(n):
        counts = [idx.count(a) for a in range(3)]
        out.append(math.factorial(n) / np.prod([math.factorial(c) for c in counts]))
    return np.array(out, dtype=np.float64)


def sym_weights(n: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """Multiplicity of each packed component in the full tensor (full contraction weights)."""
    return torch.as_tensor(_weights_np(n), dtype=dtype, device=device)


def sym_power(u: torch.Tensor, n: int) -> torch.Tensor:
    """Packed components of the n-fold outer power of vectors ``u (..., 3)`` -> ``(..., n_sym(n))``."""
    if n == 0:
        return u.new_ones(u.shape[:-1] + (1,))
    idx = torch.as_tensor(np.array(sym_indices(n), dtype=np.int64), device=u.device)  # (P, n)
    out = u[..., idx[:, 0]]
    for k in range(1, n):
        out = out * u[..., idx[:, k]]
    return out


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """(..., n_sym(n)) packed symmetric tensor -> (..., 3, ..., 3) full tensor."""
    if n == 0:
        return packed[..., 0]
    full = packed[..., unpack_index(n, packed.device)]
    return full.reshape(packed.shape[:-1] + (3,) * n)


def sym_contract(a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """Full contraction <A, B> of packed symmetric order-n tensors over the last axis."""
    return (a * b * sym_weights(n, a.dtype, a.device)).sum(-1)


@functools.lru_cache(maxsize=None)
def _detrace_np(n: int) -> np.ndarray:
    """Packed-coordinate matrix of the orthogonal (Frobenius) projection of symmetric order-n tensors
    onto their traceless part (the irreducible, weight-n part; the Cartesian form of Y^n)."""
    p = n_sym(n)
    if n < 2:
        return np.eye(p)
    w = _weights_np(n)
    unp = _unpack_np(n)
    # trace map packed(n) -> full(n - 2): contract the first two indices
    tr = np.zeros((3 ** (n - 2), p))
    for col in range(p):
        full = np.zeros(3**n)
        full[unp == col] = 1.0
        full = full.reshape((3, 3, 3 ** (n - 2)))
        tr[:, col] = np.einsum("iik->k", full)
    # kernel of the trace map, projector orthogonal in the metric G = diag(multiplicities)
    _, sv, vt = np.linalg.svd(tr)
    rank = int((sv > 1e-10).sum())
    k = vt[rank:].T                                                     # (p, d)
    g = np.diag(w)
    return k @ np.linalg.solve(k.T @ g @ k, k.T @ g)


def detrace(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Traceless (irreducible) part of packed symmetric order-n tensors (..., n_sym(n))."""
    if n < 2:
        return packed
    m = _cached_tensor("detrace", n, packed.device).to(packed.dtype)
    return packed @ m.T


# --- environment tensors ---------------------------------------------------------------------------

def segment_slots(index: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """Position of every edge within its destination's segment (``index`` sorted) and the max degree."""
    if index.numel() == 0:
        return index.new_zeros(0), 1
    counts = torch.bincount(index, minlength=n)
    start = torch.cumsum(counts, 0) - counts
    slot = torch.arange(index.numel(), device=index.device) - start[index]
    return slot, int(counts.max().item()) if n else 1


def segment_outer_sum(w: torch.Tensor, f: torch.Tensor, index: torch.Tensor, n: int,
                      slots: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """``out[i, c, d] = sum_{e: index[e] = i} w[e, c] f[e, d]`` with ``index`` sorted (destination order).

    Edges are scattered into zero-padded (n, K, .) blocks (K = max degree) and reduced with one
    ``bmm``; ``slots`` (from :func:`segment_slots`) can be passed to reuse them across calls.
    """
    slot, k = slots if slots is not None else segment_slots(index, n)
    wp = w.new_zeros((n, k, w.shape[-1])).index_put((index, slot), w)
    fp = f.new_zeros((n, k, f.shape[-1])).index_put((index, slot), f)
    return torch.bmm(wp.transpose(1, 2), fp)


# --- rotations, Voigt forms, index symmetries ------------------------------------------------------

def random_rotations(n: int, reflections: bool = False, generator: torch.Generator | None = None,
                     dtype=torch.float64) -> torch.Tensor:
    """Haar-random rotations (n, 3, 3) (QR of Gaussian matrices with sign fix); with ``reflections``
    every other matrix is an improper rotation (det -1)."""
    a = torch.randn(n, 3, 3, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    det = torch.linalg.det(q)
    q = q * det.sign().reshape(-1, 1, 1)  # proper rotations
    if reflections:
        flip = torch.ones(n, dtype=torch.float64)
        flip[1::2] = -1.0
        q = q * flip.reshape(-1, 1, 1)
    return q.to(dtype)


def rotate(t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """T'_{ab...} = R_{ai} R_{bj} ... T_{ij...} for tensors ``(B, 3, ..., 3)`` and R ``(3, 3)`` or ``(B, 3, 3)``."""
    order = t.dim() - 1
    r = r.to(t.dtype)
    if r.dim() == 2:
        r = r.expand(t.shape[0], 3, 3)
    for axis in range(1, order + 1):
        t = torch.movedim(torch.einsum("bai,bi...->ba...", r, torch.movedim(t, axis, 1)), 1, axis)
    return t


def to_voigt(t: torch.Tensor) -> torch.Tensor:
    """Voigt form without factors: order 2 -> (B, 3, 3) unchanged; order 3 (B,3,3,3) -> (B, 3, 6)
    (last pair); order 4 (B,3,3,3,3) -> (B, 6, 6)."""
    order = t.dim() - 1
    if order == 2:
        return t
    a = torch.tensor([p[0] for p in VOIGT], device=t.device)
    b = torch.tensor([p[1] for p in VOIGT], device=t.device)
    if order == 3:
        return t[:, :, a, b]
    if order == 4:
        return t[:, a, b][:, :, a, b]
    raise ValueError(f"no Voigt form for order {order}")


def index_symmetry_residual(t: torch.Tensor, perms) -> float:
    """max over index permutations p (of the tensor axes after the batch axis) of |T - T^p| / |T|."""
    norm = float(t.abs().max()) or 1.0
    res = 0.0
    for p in perms:
        res = max(res, float((t - t.permute(0, *[q + 1 for q in p])).abs().max()) / norm)
    return res


# --- metrics ---------------------------------------------------------------------------------------

def frobenius_errors(pred, true) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample Frobenius error |pred - true|_F and relative error |pred - true|_F / |true|_F."""
    pred = np.asarray(pred, dtype=float)
    true = np.asarray(true, dtype=float)
    m = pred.shape[0]
    err = np.linalg.norm((pred - true).reshape(m, -1), axis=1)
    ref = np.linalg.norm(true.reshape(m, -1), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(ref > 0, err / np.where(ref > 0, ref, 1.0), np.where(err > 0, np.inf, 0.0))
    return err, rel


def fnorm(pred, true) -> float:
    """Mean Frobenius error over samples."""
    return float(np.mean(frobenius_errors(pred, true)[0]))


def ewt(pred, true, threshold: float) -> float:
    """Energy-within-threshold analogue: share of samples with relative Frobenius error < threshold."""
    return float(np.mean(frobenius_errors(pred, true)[1] < threshold))
