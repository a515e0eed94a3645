"""Vectorised neighbour lists for many small cells (a few to a few dozen atoms, periodic or not).

``dense_neighbor_list(positions, cutoff, cell, pbc)`` returns the same ``(i, j, S, shifts)`` as
``neighbors.neighbor_list`` / ``brute_force_neighbor_list`` (full list, sorted by (i, j) then image
offset), computed in one numpy broadcast over every atom pair and every periodic image in range:
O(N^2 x images) memory, so only for small cells, where it is several times faster than ASE's
cell-list algorithm (whose per-call overhead dominates for small cells).

``SmallCellData(frames, cutoff)``: an ``AtomsData`` that builds every neighbour list this way,
eagerly, at construction (subsets keep them).
"""
from __future__ import annotations

import itertools

import numpy as np

from .data import AtomsData


def image_range(cell, pbc, cutoff: float) -> list[int]:
    """Images needed per axis: ceil(cutoff / distance between lattice planes) (0 if not periodic)."""
    pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    reps = [0, 0, 0]
    if pbc.any():
        inv = np.linalg.inv(np.asarray(cell, dtype=float))
        for k in range(3):
            if pbc[k]:
                reps[k] = int(np.ceil(cutoff / (1.0 / np.linalg.norm(inv[:, k]))))
    return reps


def dense_neighbor_list(positions, cutoff: float, cell=None, pbc=False):
    positions = np.asarray(positions, dtype=float)
    cell = np.zeros((3, 3)) if cell is None else np.asarray(cell, dtype=float)
    pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    reps = image_range(cell, pbc, cutoff)
    S = np.array(list(itertools.product(*[range(-r, r + 1) for r in reps])), dtype=np.int64)   # lexicographic
    sh = S @ cell if pbc.any() else np.zeros((len(S), 3))
    d = positions[None, :, None, :] - positions[:, None, None, :] + sh[None, None]            # d[i, j, s]
    mask = np.einsum("ijsk,ijsk->ijs", d, d) < cutoff * cutoff
    zero = int(np.flatnonzero((S == 0).all(1))[0])
    idx = np.arange(len(positions))
    mask[idx, idx, zero] = False
    i, j, s = np.nonzero(mask)                       # C order: sorted by i, then j, then image
    S = S[s]
    return i.astype(np.int64), j.astype(np.int64), S, (S @ cell if pbc.any() else np.zeros((len(i), 3)))


class SmallCellData(AtomsData):
    """AtomsData whose neighbour lists come from :func:`dense_neighbor_list`, all built up front."""

    def __init__(self, frames: dict, cutoff: float):
        super().__init__(frames, cutoff)
        for k in range(len(self)):
            self.graph(k)

    def graph(self, k: int):
        if k not in self._graphs:
            i, j, _, shifts = dense_neighbor_list(self.frames["positions"][k], self.cutoff, self.frames["cells"][k],
                                                  self.frames["pbc"][k])
            self._graphs[k] = (i, j, shifts)
        return self._graphs[k]
