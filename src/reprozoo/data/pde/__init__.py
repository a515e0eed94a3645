"""PDE datasets: our own spectral solvers (offline) and PDEBench HDF5 files (remote).

Every processed file follows the layout in :mod:`reprozoo.data.pde.common` (fields stored float32
with their dimension names, float64 coordinates and diagnostics, grid/time metadata as attributes).
"""
