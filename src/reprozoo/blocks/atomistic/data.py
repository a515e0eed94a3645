"""Frames of atomistic data, their neighbour lists, and collation into batches.

Common MD frame format (``frames.npz``, written by ``reprozoo.data.md``):
``positions`` (F, N, 3), ``numbers`` (N,) or (F, N), ``cells`` (F, 3, 3), ``pbc`` (3,) or (F, 3),
``energy`` (F,), ``forces`` (F, N, 3); optionally ``n_atoms`` (F,) when structures of different
sizes are padded to N (the first n_atoms[f] rows are real).

:class:`AtomsData` holds frames (any sizes), caches each frame's neighbour list for a cutoff, and
``collate(indices)`` gives a :class:`Batch` (torch tensors, float64 positions by default; call
``.to(dtype=...)``). ``make_emt_frames`` makes small EMT datasets with ASE (tests, fallbacks).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from .neighbors import batch_graphs, neighbor_list


@dataclass
class Batch:
    numbers: "torch.Tensor"      # (N,) int64
    positions: "torch.Tensor"    # (N, 3)
    batch: "torch.Tensor"        # (N,) int64 structure index
    edge_index: "torch.Tensor"   # (2, E) int64 (i centre, j neighbour), sorted by i
    shifts: "torch.Tensor"       # (E, 3)
    n_atoms: "torch.Tensor"      # (B,) int64
    cells: "torch.Tensor"        # (B, 3, 3)
    energy: "torch.Tensor | None" = None   # (B,)
    forces: "torch.Tensor | None" = None   # (N, 3)

    @property
    def n_structures(self) -> int:
        return int(self.n_atoms.shape[0])

    def to(self, device=None, dtype=None) -> "Batch":
        import torch

        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                if dtype is not None and v.is_floating_point():
                    v = v.to(dtype)
                if device is not None:
                    v = v.to(device)
            out[f.name] = v
        return Batch(**out)


def load_frames(path) -> dict:
    """Read a ``frames.npz`` (or a folder holding one) into per-frame lists."""
    path = Path(path)
    if path.is_dir():
        path = path / "frames.npz"
    with np.load(path, allow_pickle=False) as z:
        raw = {k: z[k] for k in z.files}
    return frames_from_arrays(**raw)


def frames_from_arrays(positions, numbers, cells=None, pbc=None, energy=None, forces=None, n_atoms=None, **_):
    positions = np.asarray(positions, dtype=float)
    n_frames = positions.shape[0]
    n_max = positions.shape[1]
    n_atoms = np.full(n_frames, n_max, int) if n_atoms is None else np.asarray(n_atoms, int)
    numbers = np.asarray(numbers)
    numbers = np.broadcast_to(numbers, (n_frames, n_max)) if numbers.ndim == 1 else numbers
    cells = np.zeros((n_frames, 3, 3)) if cells is None else np.asarray(cells, dtype=float)
    cells = np.broadcast_to(cells, (n_frames, 3, 3)) if cells.ndim == 2 else cells
    pbc = np.zeros(3, bool) if pbc is None else np.asarray(pbc, dtype=bool)
    pbc = np.broadcast_to(pbc, (n_frames, 3)) if pbc.ndim == 1 else pbc
    out = {"positions": [], "numbers": [], "cells": [], "pbc": [], "energy": None, "forces": None}
    for f in range(n_frames):
        n = n_atoms[f]
        out["positions"].append(positions[f, :n])
        out["numbers"].append(np.asarray(numbers[f, :n], dtype=np.int64))
        out["cells"].append(cells[f])
        out["pbc"].append(pbc[f])
    if energy is not None:
        out["energy"] = np.asarray(energy, dtype=float)
    if forces is not None:
        forces = np.asarray(forces, dtype=float)
        out["forces"] = [forces[f, :n_atoms[f]] for f in range(n_frames)]
    return out


def frames_from_atoms(atoms_list, energies=None, forces=None) -> dict:
    """Per-frame lists from ASE Atoms (energies/forces from the attached calculator if not given)."""
    pos, num, cel, pb, en, fo = [], [], [], [], [], []
    for k, a in enumerate(atoms_list):
        pos.append(a.get_positions()), num.append(a.get_atomic_numbers().astype(np.int64))
        cel.append(np.asarray(a.cell.array, float)), pb.append(np.asarray(a.pbc, bool))
        en.append(energies[k] if energies is not None else a.get_potential_energy())
        fo.append(forces[k] if forces is not None else a.get_forces())
    return {"positions": pos, "numbers": num, "cells": cel, "pbc": pb, "energy": np.asarray(en, float),
            "forces": fo}


def frames_to_arrays(frames: dict) -> dict:
    """Inverse of :func:`frames_from_arrays` for equal-size frames (the npz format)."""
    return {"positions": np.stack(frames["positions"]), "numbers": np.asarray(frames["numbers"][0]),
            "cells": np.stack(frames["cells"]), "pbc": np.asarray(frames["pbc"][0]),
            "energy": np.asarray(frames["energy"]), "forces": np.stack(frames["forces"])}


class AtomsData:
    """Frames + cached neighbour lists for one cutoff; ``collate(idx)`` -> :class:`Batch`."""

    def __init__(self, frames: dict, cutoff: float):
        self.frames, self.cutoff = frames, float(cutoff)
        self._graphs: dict[int, tuple] = {}

    @classmethod
    def from_npz(cls, path, cutoff: float) -> "AtomsData":
        return cls(load_frames(path), cutoff)

    def __len__(self) -> int:
        return len(self.frames["positions"])

    def subset(self, idx) -> "AtomsData":
        idx = [int(k) for k in idx]
        fr = {k: ([v[i] for i in idx] if isinstance(v, list) else (None if v is None else np.asarray(v)[idx]))
              for k, v in self.frames.items()}
        out = AtomsData(fr, self.cutoff)
        out._graphs = {new: self._graphs[old] for new, old in enumerate(idx) if old in self._graphs}
        return out

    def graph(self, k: int):
        if k not in self._graphs:
            i, j, _, shifts = neighbor_list(self.frames["positions"][k], self.cutoff, self.frames["cells"][k],
                                            self.frames["pbc"][k])
            self._graphs[k] = (i, j, shifts)
        return self._graphs[k]

    def precompute(self) -> "AtomsData":
        """Build every frame's neighbour list now (subsets keep them); returns self."""
        for k in range(len(self)):
            self.graph(k)
        return self

    def n_atoms(self, k: int) -> int:
        return len(self.frames["numbers"][k])

    def collate(self, idx, dtype=None) -> Batch:
        import torch

        idx = [int(k) for k in idx]
        n_atoms = np.array([self.n_atoms(k) for k in idx], dtype=np.int64)
        ei, sh = batch_graphs([self.graph(k) for k in idx], n_atoms)
        fr = self.frames
        dtype = dtype or torch.float64
        b = Batch(
            numbers=torch.from_numpy(np.concatenate([fr["numbers"][k] for k in idx]).astype(np.int64)),
            positions=torch.from_numpy(np.concatenate([fr["positions"][k] for k in idx])).to(dtype),
            batch=torch.from_numpy(np.repeat(np.arange(len(idx)), n_atoms)),
            edge_index=torch.from_numpy(ei), shifts=torch.from_numpy(sh).to(dtype),
            n_atoms=torch.from_numpy(n_atoms), cells=torch.from_numpy(np.stack([fr["cells"][k] for k in idx])).to(dtype),
        )
        if fr.get("energy") is not None:
            b.energy = torch.from_numpy(np.asarray(fr["energy"])[idx]).to(dtype)
        if fr.get("forces") is not None:
            b.forces = torch.from_numpy(np.concatenate([fr["forces"][k] for k in idx])).to(dtype)
        return b

    def batches(self, batch_size: int, rng: np.random.Generator | None = None, dtype=None):
        """Yield batches over all frames (shuffled if ``rng``)."""
        order = np.arange(len(self)) if rng is None else rng.permutation(len(self))
        for s in range(0, len(order), batch_size):
            yield self.collate(order[s:s + batch_size], dtype=dtype)


def split_indices(n: int, fractions=(0.8, 0.1, 0.1), seed: int = 0):
    """Random disjoint train/val/test index arrays (fractions of n; the last part gets the rest)."""
    perm = np.random.default_rng(seed).permutation(n)
    cuts = np.cumsum([int(round(f * n)) for f in fractions[:-1]])
    return np.split(perm, cuts)


def make_emt_frames(kind: str = "cu_bulk", n_frames: int = 20, rattle: float = 0.1, seed: int = 0,
                    size: int = 2) -> dict:
    """Small EMT-labelled datasets with ASE, for tests and fallbacks (no MD: rattled copies).

    ``cu_bulk``: periodic fcc Cu (size^3 conventional cells, 4 atoms each), random strain <= 2 %.
    ``pt_cluster``: non-periodic Pt cuboctahedron (13 atoms for size 1, 55 for size 2).
    ``cuau_bulk``: periodic fcc with random Cu/Au occupation.
    """
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.cluster import Octahedron

    rng = np.random.default_rng(seed)
    atoms_list = []
    for _ in range(n_frames):
        if kind in ("cu_bulk", "cuau_bulk"):
            a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((size, size, size))
            if kind == "cuau_bulk":
                a.numbers = np.where(rng.random(len(a)) < 0.5, 29, 79)
            strain = np.eye(3) + rng.uniform(-0.02, 0.02, (3, 3))
            a.set_cell(a.cell.array @ strain, scale_atoms=True)
        elif kind == "pt_cluster":
            a = Octahedron("Pt", length=2 * size + 1, cutoff=size)
            a.center(vacuum=5.0)
            a.pbc = False
        else:
            raise ValueError(f"unknown EMT frame kind '{kind}'")
        a.positions += rng.normal(0, rattle, a.positions.shape)
        a.calc = EMT()
        atoms_list.append(a)
    return frames_from_atoms(atoms_list)
