"""The one processed format shared by every molecular-dynamics dataset, its loader and its preview.

``frames.npz`` (units: eV, Angstrom, eV/Angstrom, fs)

=================  ==============  ======================================================================
key                shape           meaning
=================  ==============  ======================================================================
positions          (F, N, 3) f8    Cartesian positions. Frames with fewer than N atoms are zero-padded.
numbers            (N,) or (F, N)  atomic numbers; (N,) when every frame has the same atoms in the same
                                   order, else (F, N) with 0 marking padding slots.
cells              (F, 3, 3) f8    lattice vectors as rows; all zeros for non-periodic systems.
pbc                (3,) bool       periodicity (the same for every frame of a dataset).
energy             (F,) f8         total potential energy (eV; the calculator's or the source's zero).
forces             (F, N, 3) f8    forces = -dE/dpositions (eV/A); zero in padding slots.
n_atoms            (F,) i8         real atoms of each frame (the first n_atoms[f] slots).
system             (F,) i8         index into ``system_names``: frames of one system share their atoms.
system_names       (S,) str        one name per system.
velocities         (F, N, 3) f8    optional (MD datasets): velocities in Angstrom/fs.
=================  ==============  ======================================================================

Other arrays are dataset-specific extras: per frame (first axis F) unless named in
``STATIC_EXTRAS`` (e.g. ``prototype_names``, ``elements``, ``bonds``).

Datasets may add extra arrays (e.g. ``prototype``); ``frames.parquet`` holds one row per frame
with at least ``frame, system, n_atoms, energy, temperature, split`` (temperature in K, NaN where
unknown; split in train/val/test) plus dataset-specific columns (``segment``, ``time_fs``,
``kinetic_energy``, ``prototype``, ``formula``, ...).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ...io import atomic_path, save_npz, write_json
from reprozoo.figures import save_figure

FRAMES_NPZ = "frames.npz"
FRAMES_PARQUET = "frames.parquet"
CORE_KEYS = ("positions", "numbers", "cells", "pbc", "energy", "forces", "n_atoms", "system", "system_names")
TABLE_COLUMNS = ("frame", "system", "n_atoms", "energy", "temperature", "split")
SPLITS = ("train", "val", "test")
# extras: per-frame unless listed as static; per-atom (F, N, ...) ones are trimmed with the padding
STATIC_EXTRAS = {"prototype_names", "elements", "bonds"}
PER_ATOM_EXTRAS = {"velocities"}
FS = "fs"


@dataclass
class MDFrames:
    """Frames of one MD dataset (see the module docstring for the layout)."""

    positions: np.ndarray
    numbers: np.ndarray
    cells: np.ndarray
    pbc: np.ndarray
    energy: np.ndarray
    forces: np.ndarray
    n_atoms: np.ndarray
    system: np.ndarray
    system_names: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    table: Any = None  # pandas.DataFrame of frames.parquet (rows aligned with frames), or None

    # --- basic views -------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.energy.shape[0])

    @property
    def n_frames(self) -> int:
        return len(self)

    @property
    def padded(self) -> bool:
        """True when frames have different numbers of atoms (look at ``n_atoms`` / ``mask``)."""
        return bool(self.n_atoms.size) and bool((self.n_atoms != self.positions.shape[1]).any())

    @property
    def numbers_per_frame(self) -> np.ndarray:
        """(F, N) atomic numbers whatever the stored layout."""
        if self.numbers.ndim == 1:
            return np.broadcast_to(self.numbers, (len(self), self.numbers.shape[0]))
        return self.numbers

    @property
    def mask(self) -> np.ndarray:
        """(F, N) bool: real atoms (False in padding slots)."""
        return np.arange(self.positions.shape[1])[None, :] < self.n_atoms[:, None]

    @property
    def velocities(self) -> np.ndarray | None:
        return self.extras.get("velocities")

    def numbers_of(self, i: int) -> np.ndarray:
        n = int(self.n_atoms[i])
        return (self.numbers if self.numbers.ndim == 1 else self.numbers[i])[:n]

    def frame(self, i: int) -> dict[str, np.ndarray]:
        """Frame ``i`` without padding: positions, numbers, cell, pbc, energy, forces."""
        n = int(self.n_atoms[i])
        out = {"positions": self.positions[i, :n], "numbers": self.numbers_of(i), "cell": self.cells[i],
               "pbc": self.pbc, "energy": float(self.energy[i]), "forces": self.forces[i, :n]}
        if self.velocities is not None:
            out["velocities"] = self.velocities[i, :n]
        return out

    def to_atoms(self, i: int):
        """Frame ``i`` as an ase.Atoms with a SinglePointCalculator holding energy and forces."""
        from ase import Atoms
        from ase.calculators.singlepoint import SinglePointCalculator

        f = self.frame(i)
        atoms = Atoms(numbers=f["numbers"], positions=f["positions"], cell=f["cell"], pbc=f["pbc"])
        atoms.calc = SinglePointCalculator(atoms, energy=f["energy"], forces=f["forces"].copy())
        return atoms

    # --- subsets -----------------------------------------------------------------------------
    def select(self, idx) -> "MDFrames":
        """A subset of frames (index array or boolean mask); padding is trimmed to the subset."""
        idx = np.arange(len(self))[np.asarray(idx)] if np.asarray(idx).dtype == bool else np.asarray(idx, int)
        nmax = int(self.n_atoms[idx].max()) if idx.size else 0
        numbers = self.numbers[:nmax] if self.numbers.ndim == 1 else self.numbers[idx, :nmax]
        if numbers.ndim == 2 and idx.size and (numbers == numbers[:1]).all():
            numbers = numbers[0].copy()  # one system (or identical ones): back to the (N,) layout
        extras = {}
        for k, v in self.extras.items():
            if k not in STATIC_EXTRAS and v.ndim >= 1 and v.shape[0] == len(self):
                v = v[idx]
                if k in PER_ATOM_EXTRAS:
                    v = v[:, :nmax]
            extras[k] = v
        table = None
        if self.table is not None:
            table = self.table.iloc[idx].reset_index(drop=True)
        return MDFrames(positions=self.positions[idx, :nmax], numbers=numbers, cells=self.cells[idx],
                        pbc=self.pbc, energy=self.energy[idx], forces=self.forces[idx, :nmax],
                        n_atoms=self.n_atoms[idx], system=self.system[idx], system_names=self.system_names,
                        extras=extras, table=table)

    def split(self, name: str) -> "MDFrames":
        """Frames of one split (``train``, ``val`` or ``test``) as recorded in frames.parquet."""
        if self.table is None or "split" not in self.table:
            raise ValueError("no split column: load the dataset folder with frames.parquet")
        return self.select(np.flatnonzero(self.table["split"].to_numpy() == name))

    def systems(self) -> Iterator[tuple[int, str, "MDFrames"]]:
        """Yield ``(system_id, name, frames)`` for each system present, frames without padding."""
        for s in np.unique(self.system):
            yield int(s), str(self.system_names[s]), self.select(np.flatnonzero(self.system == s))

    def summary(self) -> dict[str, Any]:
        z = np.unique(self.numbers_per_frame[self.mask]) if len(self) else np.array([], int)
        return {"n_frames": len(self), "n_systems": int(np.unique(self.system).size),
                "n_atoms_min": int(self.n_atoms.min()) if len(self) else 0,
                "n_atoms_max": int(self.n_atoms.max()) if len(self) else 0,
                "atoms_total": int(self.n_atoms.sum()), "elements": _symbols(z),
                "periodic": [bool(p) for p in self.pbc]}


def _symbols(z) -> list[str]:
    from ase.data import chemical_symbols

    return [chemical_symbols[int(i)] for i in z if int(i) > 0]


def load(out_dir: Path | str, table: bool = True) -> MDFrames:
    """Read ``frames.npz`` (and ``frames.parquet`` when present) from a processed dataset folder."""
    out_dir = Path(out_dir)
    with np.load(out_dir / FRAMES_NPZ, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    missing = [k for k in CORE_KEYS if k not in arrays]
    if missing:
        raise ValueError(f"{out_dir / FRAMES_NPZ} lacks {missing}")
    core = {k: arrays.pop(k) for k in CORE_KEYS}
    df = None
    if table and (out_dir / FRAMES_PARQUET).exists():
        import pandas as pd

        df = pd.read_parquet(out_dir / FRAMES_PARQUET)
    return MDFrames(**core, extras=arrays, table=df)


# --- writing ---------------------------------------------------------------------------------

def pack(frames: list[dict], system_names: list[str], pbc) -> dict[str, np.ndarray]:
    """Stack per-frame dicts (positions, numbers, cell, energy, forces, system[, velocities]) into
    the common layout, zero-padding when frames differ in size."""
    F = len(frames)
    n = np.array([len(f["numbers"]) for f in frames], dtype=np.int64)
    N = int(n.max()) if F else 0
    pos = np.zeros((F, N, 3))
    frc = np.zeros((F, N, 3))
    num = np.zeros((F, N), dtype=np.int64)
    vel = np.zeros((F, N, 3)) if F and all("velocities" in f for f in frames) else None
    for i, f in enumerate(frames):
        k = n[i]
        pos[i, :k] = f["positions"]
        frc[i, :k] = f["forces"]
        num[i, :k] = f["numbers"]
        if vel is not None:
            vel[i, :k] = f["velocities"]
    numbers: np.ndarray = num
    if F and (n == N).all() and (num == num[:1]).all():
        numbers = num[0].copy()
    out = {"positions": pos, "numbers": numbers,
           "cells": np.array([np.asarray(f["cell"], float).reshape(3, 3) for f in frames]).reshape(F, 3, 3),
           "pbc": np.asarray(pbc, bool).reshape(3), "energy": np.array([float(f["energy"]) for f in frames]),
           "forces": frc, "n_atoms": n, "system": np.array([int(f["system"]) for f in frames], dtype=np.int64),
           "system_names": np.array(list(system_names), dtype=str)}
    if vel is not None:
        out["velocities"] = vel
    return out


def assign_splits(groups: np.ndarray, fractions, seed: int) -> np.ndarray:
    """Random train/val/test labels, stratified by ``groups`` (e.g. system), reproducible for a seed."""
    fr = np.asarray(fractions, float)
    fr = fr / fr.sum()
    rng = np.random.default_rng(seed)
    labels = np.empty(len(groups), dtype=object)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        idx = idx[rng.permutation(idx.size)]
        cuts = np.round(np.cumsum(fr)[:-1] * idx.size).astype(int)
        for name, part in zip(SPLITS, np.split(idx, cuts)):
            labels[part] = name
    return labels.astype(str)


def write(out_dir: Path | str, arrays: dict[str, np.ndarray], table: dict[str, Any],
          meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write frames.npz, frames.parquet (and md_meta.json); return the preprocess summary dict."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    F = arrays["energy"].shape[0]
    _check(arrays)
    cols = {"frame": np.arange(F), "system": arrays["system"], "n_atoms": arrays["n_atoms"],
            "energy": arrays["energy"]}
    cols.update(table)
    for c in TABLE_COLUMNS:
        if c not in cols:
            raise ValueError(f"frames table lacks column {c!r}")
    df = pd.DataFrame({c: cols[c] for c in [*TABLE_COLUMNS, *[k for k in cols if k not in TABLE_COLUMNS]]})
    if len(df) != F:
        raise ValueError(f"frames table has {len(df)} rows for {F} frames")
    save_npz(out_dir / FRAMES_NPZ, **arrays)
    with atomic_path(out_dir / FRAMES_PARQUET) as tmp:
        df.to_parquet(tmp, index=False)
    files = [FRAMES_NPZ, FRAMES_PARQUET]
    if meta is not None:
        write_json(out_dir / "md_meta.json", meta)
        files.append("md_meta.json")
    data = MDFrames(**{k: arrays[k] for k in CORE_KEYS})
    sizes = data.summary()
    sizes["split_counts"] = {s: int((df["split"] == s).sum()) for s in SPLITS}
    if len(arrays["system_names"]) <= 50:
        sizes["frames_per_system"] = {str(arrays["system_names"][s]): int(c)
                                      for s, c in zip(*np.unique(arrays["system"], return_counts=True))}
    return {"files": files, "sizes": sizes,
            "format": {"layout": "md-frames-1", "units": {"energy": "eV", "length": "Angstrom",
                                                           "forces": "eV/Angstrom", "time": FS,
                                                           "velocities": "Angstrom/fs"},
                       "numbers": "per-frame (F,N), 0 = padding" if arrays["numbers"].ndim == 2 else "shared (N,)",
                       "keys": sorted(arrays), "columns": list(df.columns)}}


def _check(a: dict[str, np.ndarray]) -> None:
    F, N = a["positions"].shape[:2]
    assert a["positions"].shape == (F, N, 3) and a["forces"].shape == (F, N, 3), "positions/forces shape"
    assert a["cells"].shape == (F, 3, 3) and a["energy"].shape == (F,), "cells/energy shape"
    assert a["numbers"].shape in ((N,), (F, N)), "numbers shape"
    assert a["n_atoms"].shape == (F,) and a["system"].shape == (F,), "n_atoms/system shape"
    assert np.isfinite(a["positions"]).all() and np.isfinite(a["forces"]).all() and np.isfinite(a["energy"]).all()


def read_raw_meta(raw_dir: Path) -> dict[str, Any]:
    p = Path(raw_dir) / "raw_meta.json"
    return json.loads(p.read_text()) if p.exists() else {}


# --- preview ---------------------------------------------------------------------------------

def preview(out_dir: Path | str, png: Path | str, title: str | None = None) -> None:
    """Energy per atom (trace, or by system), force-component histogram and a snapshot projection."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ase.data import chemical_symbols
    from ase.data.colors import jmol_colors

    d = load(out_dir)
    df = d.table
    name = title or Path(out_dir).parent.name
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    epa = d.energy / d.n_atoms
    x = df["time_fs"].to_numpy() / 1000.0 if df is not None and "time_fs" in df and len(np.unique(d.system)) == 1 \
        else None
    if "prototype" in d.extras and "prototype_names" in d.extras:
        names = d.extras["prototype_names"]
        for k, nm in enumerate(names):
            sel = d.extras["prototype"] == k
            ax[0].hist(epa[sel], bins=30, alpha=0.5, label=f"{nm} ({sel.sum()})")
        ax[0].set_xlabel("energy per atom (eV)")
        ax[0].set_ylabel("structures")
        ax[0].legend(fontsize=7)
    else:
        seg = df["segment"].to_numpy() if df is not None and "segment" in df else None
        for s in np.unique(d.system):
            sel = d.system == s
            xs = x[sel] if x is not None else np.flatnonzero(sel)
            if seg is not None and len(np.unique(d.system)) == 1:
                for sg in dict.fromkeys(seg[sel]):
                    m = sel & (seg == sg)
                    ax[0].plot(x[m] if x is not None else np.flatnonzero(m), epa[m], ".-", ms=2, lw=0.6, label=sg)
            else:
                ax[0].plot(xs, epa[sel], ".", ms=3, label=f"{d.system_names[s]} (N={d.n_atoms[sel][0]})")
        ax[0].set_xlabel("time (ps)" if x is not None else "frame")
        ax[0].set_ylabel("potential energy per atom (eV)")
        if len(np.unique(d.system)) <= 8:
            ax[0].legend(fontsize=7)
    f = d.forces[d.mask].ravel()
    ax[1].hist(f, bins=80, log=True, color="tab:gray")
    ax[1].set_xlabel("force component (eV/A)")
    ax[1].set_ylabel("count")
    ax[1].set_title(f"|F| rms {np.sqrt((f ** 2).mean()):.3f} eV/A", fontsize=9)
    i = int(np.argmax(d.n_atoms))
    fr = d.frame(i)
    p = fr["positions"]
    order = np.argsort(p[:, 2])
    cols = jmol_colors[fr["numbers"][order]]
    ax[2].scatter(p[order, 0], p[order, 1], c=cols, s=max(4.0, 3000.0 / max(len(p), 1)), edgecolors="k",
                  linewidths=0.2)
    ax[2].set_aspect("equal")
    ax[2].set_xlabel("x (A)")
    ax[2].set_ylabel("y (A)")
    syms = ", ".join(chemical_symbols[z] for z in np.unique(fr["numbers"]))
    ax[2].set_title(f"frame {i}: {len(p)} atoms ({syms})", fontsize=9)
    s = d.summary()
    natoms = (f"{s['n_atoms_min']}" if s["n_atoms_min"] == s["n_atoms_max"]
              else f"{s['n_atoms_min']}-{s['n_atoms_max']}")
    meta_path = Path(out_dir) / "md_meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    tag = "  [OFFLINE SURROGATE: classical force field, not the published data]" if meta.get("surrogate") else ""
    fig.suptitle(f"{name}: {s['n_frames']} frames, {s['n_systems']} system(s), {natoms} atoms{tag}", fontsize=10)
    save_figure(fig, png, dpi=90)
