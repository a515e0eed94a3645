"""Crystal tensor datasets: EMT elastic tensors generated offline, JARVIS-DFT and Materials Project remote.

All three share one processed layout and one loader (:mod:`.common`): structures.json (pymatgen),
tensors.npz (C_voigt, C_full, eps_like, piezo_like) and structures.parquet.
"""
