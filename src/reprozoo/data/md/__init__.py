"""Molecular-dynamics datasets: offline ASE/EMT/LJ trajectories, an EMT alloy pool, and the sGDML
benchmark molecules (MD17, revised MD17, MD22; remote, user path, or an offline surrogate).

Every dataset is processed into the same layout (see ``frames.py``): ``frames.npz`` (positions,
numbers, cells, pbc, energy, forces, n_atoms, system, system_names, + extras) and
``frames.parquet`` (frame, system, n_atoms, energy, temperature, split, + extras). Units: eV,
Angstrom, eV/Angstrom, fs. Methods read it with ``load(ctx.data[name])``.
"""
from .frames import MDFrames, load

__all__ = ["MDFrames", "load"]
