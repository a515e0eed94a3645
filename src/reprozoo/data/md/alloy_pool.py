"""A pool of small rattled and strained EMT alloy cells from several prototypes (for pre-training,
fine-tuning on labelled subsets, and retrieval by prototype).

Each structure: a prototype lattice, as a pure metal or a random binary solid solution (elements
drawn from ``elements``), a lattice constant from EMT's own equilibrium atomic volumes (per
element, in that crystal structure) mixed by Vegard's law, a supercell of ``min_atoms`` to
``max_atoms`` atoms, a random symmetric strain (``strain_std``) and a Gaussian rattle whose width
is drawn from ``rattle`` (redrawn while two atoms come closer than ``min_distance_frac`` times the
ideal nearest-neighbour distance). Energy, forces and stress are EMT (vectorised, identical to ASE's).

The prototypes differ in GEOMETRY, so that a retrieval "same prototype" can be answered from
positions: fcc (A1, 12 nearest neighbours), bcc (A2, 8 + 6), hcp (A3, ideal c/a, 12 in a
different second shell from fcc), sc (simple cubic, 6; an unstable high-energy lattice for EMT),
fct (fcc stretched along z to c/a = ``tetragonal_ca`` times the cubic value at the fcc atomic
volume: 4 + 8 neighbours at two distances) and hcp_flat (hcp squashed to c/a = ``hcp_flat_ca``
at the hcp atomic volume: 6 in-plane + 6 out-of-plane neighbours at two distances). Chemical
order is not a prototype: ordered L1_2 / L1_0 cells share the fcc geometry, so an earlier version
of this pool (emt-alloy-pool-1, with them as prototypes) made same-prototype retrieval a test of
chemistry, not of structure.

Extra arrays in frames.npz: prototype (F,) int + prototype_names, elements (E,) + composition
(F, E) atom fractions, strain (F, 3, 3), rattle (F,), stress (F, 6) in eV/A^3 (Voigt, ASE sign).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...io import save_npz, write_json
from . import frames as fmt
from .ase_md import emt_lattice_constant

VERSION = "emt-alloy-pool-2"
PROTOTYPES = ("fcc", "bcc", "hcp", "sc", "fct", "hcp_flat")
# the ideal lattice each prototype takes its EMT atomic volume from (Vegard's law)
CRYSTAL = {"fcc": "fcc", "bcc": "bcc", "hcp": "hcp", "sc": "sc", "fct": "fcc", "hcp_flat": "hcp"}
ATOMS_PER_A3 = {"fcc": 4.0, "bcc": 2.0, "hcp": np.sqrt(2.0), "sc": 1.0}  # atomic volume = a^3 / this
TETRAGONAL_CA = 1.25  # fct: c/a relative to cubic fcc (1 = fcc; 1/sqrt(2) would be bcc)
HCP_FLAT_CA = 1.35    # hcp_flat: c/a (ideal hcp: sqrt(8/3) = 1.633)


def _base_cell(proto: str, a: float, params: dict | None = None):
    """Cell of the prototype at atomic volume a^3 / ATOMS_PER_A3[crystal], i.e. lattice constant a
    for the cubic lattices; the distorted ones keep the atomic volume of their parent.
    Returns (atoms, nearest-neighbour distance of the perfect lattice)."""
    from ase.build import bulk

    params = params or {}
    if proto == "fcc":
        return bulk("Cu", "fcc", a=a, cubic=True), a / np.sqrt(2)
    if proto == "bcc":
        return bulk("Cu", "bcc", a=a, cubic=True), a * np.sqrt(3) / 2
    if proto == "sc":
        return bulk("Cu", "sc", a=a), a
    if proto == "hcp":
        return bulk("Cu", "hcp", a=a, c=a * np.sqrt(8 / 3), orthorhombic=True), a
    if proto == "fct":  # cubic fcc cell stretched along z at constant volume
        t = float(params.get("tetragonal_ca", TETRAGONAL_CA))
        at = bulk("Cu", "fcc", a=a, cubic=True)
        at.set_cell(at.cell.array @ np.diag([t ** (-1 / 3), t ** (-1 / 3), t ** (2 / 3)]), scale_atoms=True)
        ax = a * t ** (-1 / 3)
        return at, min(ax / np.sqrt(2), np.sqrt(ax ** 2 / 4 + (t * ax) ** 2 / 4))
    if proto == "hcp_flat":  # hcp with a smaller c/a at the ideal-hcp atomic volume
        q = float(params.get("hcp_flat_ca", HCP_FLAT_CA))
        ah = a * (np.sqrt(8 / 3) / q) ** (1 / 3)
        return bulk("Cu", "hcp", a=ah, c=q * ah, orthorhombic=True), min(ah, np.sqrt(ah ** 2 / 3 + (q * ah) ** 2 / 4))
    raise ValueError(f"unknown prototype {proto!r}")


def _repeats(n_base: int, min_atoms: int, max_atoms: int) -> list[tuple[int, int, int]]:
    out = []
    for nx in range(1, 5):
        for ny in range(1, nx + 1):
            for nz in range(1, ny + 1):
                if min_atoms <= n_base * nx * ny * nz <= max_atoms:
                    out.append((nx, ny, nz))
    return out or [(1, 1, 1)]


def make_structure(rng: np.random.Generator, params: dict):
    """One random structure and its labels (deterministic given the generator state)."""
    from ase.data import atomic_numbers

    protos = list(params.get("prototypes", PROTOTYPES))
    elements = list(params.get("elements", ["Cu", "Ni", "Pd", "Ag", "Au", "Pt", "Al"]))
    proto = protos[rng.integers(len(protos))]
    if rng.random() < float(params.get("solid_solution_prob", 0.5)):
        A, B = rng.choice(elements, size=2, replace=False)
    else:
        A = B = elements[rng.integers(len(elements))]
    crystal = CRYSTAL[proto]
    at, _ = _base_cell(proto, 1.0, params)
    reps = _repeats(len(at), int(params.get("min_atoms", 4)), int(params.get("max_atoms", 32)))
    rep = reps[rng.integers(len(reps))]
    at = at * rep
    n = len(at)
    symbols = np.array([A] * n, dtype=object)
    if A != B:
        x = rng.uniform(0.1, 0.9)
        k = int(np.clip(round(x * n), 1, n - 1))
        symbols[rng.choice(n, size=k, replace=False)] = B
    numbers = np.array([atomic_numbers[s] for s in symbols])
    # Vegard's law on EMT atomic volumes, then the prototype's cell at that atomic volume
    per = ATOMS_PER_A3[crystal]
    vols = np.array([emt_lattice_constant(s, crystal) ** 3 / per for s in symbols])
    a = (per * vols.mean()) ** (1 / 3)
    _, nn = _base_cell(proto, a, params)
    at.set_cell(at.cell.array * a, scale_atoms=True)
    at.numbers = numbers
    eps = rng.normal(0.0, float(params.get("strain_std", 0.03)), (3, 3))
    eps = 0.5 * (eps + eps.T)
    at.set_cell(at.cell.array @ (np.eye(3) + eps), scale_atoms=True)
    lo, hi = params.get("rattle", [0.01, 0.15])
    sigma = float(rng.uniform(lo, hi))
    base = at.positions.copy()
    dmin = float(params.get("min_distance_frac", 0.8)) * nn
    from .potentials import neighbor_pairs

    for _ in range(50):  # redraw the rattle while two atoms come closer than dmin
        at.positions = base + rng.normal(0.0, sigma, base.shape)
        i, j, s = neighbor_pairs(at.positions, at.cell.array, at.pbc, dmin)
        if len(i) == 0:
            break
    else:
        at.positions = base
    return at, {"prototype": proto, "strain": eps, "rattle": sigma, "repeat": rep}


def generate(params: dict, seed: int, progress=print):
    from .potentials import FastEMT

    rng = np.random.default_rng(seed)
    n = int(params["n_structures"])
    protos = list(params.get("prototypes", PROTOTYPES))
    elements = list(params.get("elements", ["Cu", "Ni", "Pd", "Ag", "Au", "Pt", "Al"]))
    from ase.data import atomic_numbers

    zlist = np.array([atomic_numbers[e] for e in elements])
    frames, proto_idx, comp, strain, rattle, stress, formula = [], [], [], [], [], [], []
    tic = time.perf_counter()
    for k in range(n):
        at, lab = make_structure(rng, params)
        at.calc = FastEMT()
        e = at.get_potential_energy()
        f = at.get_forces()
        stress.append(at.get_stress())
        frames.append({"positions": at.positions.copy(), "numbers": at.numbers.copy(), "cell": at.cell.array.copy(),
                       "energy": e, "forces": f, "system": k})
        proto_idx.append(protos.index(lab["prototype"]))
        comp.append([(at.numbers == z).mean() for z in zlist])
        strain.append(lab["strain"])
        rattle.append(lab["rattle"])
        formula.append(at.get_chemical_formula())
        if progress and (k + 1) % max(1, n // 5) == 0:
            progress(f"{k + 1}/{n} structures, {time.perf_counter() - tic:.1f} s")
    arrays = fmt.pack(frames, [f"s{k:05d}" for k in range(n)], (True, True, True))
    arrays.update({"prototype": np.array(proto_idx), "prototype_names": np.array(protos, dtype=str),
                   "elements": np.array(elements, dtype=str), "composition": np.array(comp),
                   "strain": np.array(strain).reshape(n, 3, 3), "rattle": np.array(rattle),
                   "stress": np.array(stress).reshape(n, 6)})
    table = {"prototype": np.array(protos, dtype=object)[proto_idx].astype(str), "formula": np.array(formula),
             "energy_per_atom": arrays["energy"] / arrays["n_atoms"], "rattle": np.array(rattle),
             "strain_norm": np.linalg.norm(np.array(strain).reshape(n, 9), axis=1),
             "temperature": np.full(n, np.nan)}
    return arrays, table


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    if source != "offline":
        raise ValueError(f"source {source!r}: this dataset is generated offline only")
    raw_dir = Path(raw_dir)
    tic = time.perf_counter()
    arrays, table = generate(params, seed)
    save_npz(raw_dir / "pool.npz", **arrays, **{f"table_{k}": v for k, v in table.items()})
    write_json(raw_dir / "raw_meta.json", {"seed": seed})
    import ase

    return {"version": VERSION, "generator": "reprozoo.data.md.alloy_pool.generate", "calculator": {"name": "emt"},
            "ase_version": ase.__version__, "generation_seconds": round(time.perf_counter() - tic, 2),
            "units": {"energy": "eV", "length": "Angstrom", "forces": "eV/Angstrom", "stress": "eV/Angstrom^3"}}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    raw_dir = Path(raw_dir)
    meta = fmt.read_raw_meta(raw_dir)
    with np.load(raw_dir / "pool.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("table_")}
        table = {k[len("table_"):]: z[k] for k in z.files if k.startswith("table_")}
    # stratified by prototype so every split sees every prototype
    table["split"] = fmt.assign_splits(arrays["prototype"], params.get("split", (0.8, 0.1, 0.1)),
                                       int(meta.get("seed", 0)) + 1)
    out = fmt.write(out_dir, arrays, table)
    names = arrays["prototype_names"]
    out["sizes"]["prototype_counts"] = {str(names[k]): int((arrays["prototype"] == k).sum()) for k in range(len(names))}
    return out


def preview(out_dir: Path, png: Path) -> None:
    fmt.preview(out_dir, png)


def load(out_dir: Path) -> fmt.MDFrames:
    return fmt.load(out_dir)
