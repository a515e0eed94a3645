"""crystals_emt_elastic: EMT metal and alloy cells with elastic tensors computed by finite strains.

Generation (``acquire``, the offline "source"; deterministic for a seed):

1. Build cells from prototypes over EMT's well-fitted metals (Cu, Ni, Pd, Ag, Au, Pt, Al):
   elemental fcc / bcc / hcp, ordered L1_2 (A3B), L1_0 (AB), B2 (AB), random substitutional
   supercells of fcc (2-3 species), and "distorted" variants (a relaxed cell under a small random
   homogeneous strain, ions relaxed at that fixed cell: lower symmetry, pre-stressed).
2. Relax with EMT: positions and cell (UnitCellFilter + BFGS, ase FixSymmetry holding the
   initial space group); distorted variants: positions only. Cells that do not converge are dropped.
3. Elastic tensor by central finite differences over the 6 Voigt Lagrangian strains +-delta: each
   strained cell is F = sqrt(I + 2 eta) applied to the reference; ions are relaxed at every strain
   whenever the strain puts a force > 1e-6 eV/A on them (bases without inversion centres: hcp,
   random and distorted cells); atoms on inversion centres (fcc, bcc, L1_2, L1_0, B2) feel no force
   by symmetry and need none. C = dS/d eta with S the second Piola-Kirchhoff stress, i.e. the
   Hessian of the energy density in the Lagrangian strain: for zero-stress cells it is the usual
   stiffness; for pre-stressed (distorted) cells it is the Lagrangian tangent (Wallace's C, not
   Birch's B). The small finite-difference asymmetry is recorded (``fd_asymmetry``) and C is
   symmetrised. The clamped-ion tensor (no ionic relaxation) is kept as ``C_voigt_clamped``.

Units: GPa; energies eV/atom (EMT's own reference, not cohesive energies).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from . import common

GENERATOR_VERSION = "emt-elastic-1"
ELEMENTS = ("Cu", "Ni", "Pd", "Ag", "Au", "Pt", "Al")
# approximate EMT fcc lattice constants (Angstrom): only starting points, every cell is relaxed
A_FCC = {"Cu": 3.59, "Ni": 3.50, "Pd": 3.94, "Ag": 4.07, "Au": 4.06, "Pt": 3.94, "Al": 4.05}
ORDERED = ("L12", "L10", "B2")
FIXED_FORCE_TOL = 1e-6  # eV/A: a strained cell with larger forces gets its ions relaxed


# --- prototypes ----------------------------------------------------------------------------------

def _a_mix(symbols) -> float:
    return float(np.mean([A_FCC[s] for s in symbols]))  # Vegard's law


def build(prototype: str, elements: tuple[str, ...]):
    """An unrelaxed cell of a prototype; ``elements`` are (A,) or (A, B)."""
    from ase import Atoms
    from ase.build import bulk

    if prototype == "fcc":
        return bulk(elements[0], "fcc", a=A_FCC[elements[0]])
    if prototype == "bcc":
        return bulk(elements[0], "bcc", a=A_FCC[elements[0]] / 2 ** (1 / 3))
    if prototype == "hcp":
        a = A_FCC[elements[0]] / np.sqrt(2)
        return bulk(elements[0], "hcp", a=a, covera=np.sqrt(8 / 3))
    A, B = elements
    if prototype == "L12":  # A3B, Cu3Au type, Pm-3m
        a = _a_mix([A, A, A, B])
        return Atoms([B, A, A, A], scaled_positions=[(0, 0, 0), (0, .5, .5), (.5, 0, .5), (.5, .5, 0)],
                     cell=np.eye(3) * a, pbc=True)
    if prototype == "L10":  # AB, CuAu type, P4/mmm (2-atom tetragonal cell)
        a = _a_mix([A, B])
        return Atoms([A, B], scaled_positions=[(0, 0, 0), (.5, .5, .5)],
                     cell=np.diag([a / np.sqrt(2), a / np.sqrt(2), a]), pbc=True)
    if prototype == "B2":  # AB, CsCl type, Pm-3m
        a = _a_mix([A, B]) / 2 ** (1 / 3)
        return Atoms([A, B], scaled_positions=[(0, 0, 0), (.5, .5, .5)], cell=np.eye(3) * a, pbc=True)
    raise ValueError(f"unknown prototype {prototype}")


SUPERCELLS = {  # fcc primitive-cell supercells for random substitution, by number of atoms; chosen so
    # that about half of the random occupations lack an inversion centre (2x2x2-type cells never do)
    3: [[3, 0, 0], [0, 1, 0], [0, 0, 1]],
    4: [[2, 1, 0], [0, 2, 0], [0, 0, 1]],
    5: [[1, 1, 0], [0, 1, 1], [2, -1, 2]],
    6: [[3, 0, 0], [0, 2, 0], [0, 0, 1]],
    9: [[2, 1, 0], [0, 2, 1], [1, 0, 2]],
}


def build_random(rng: np.random.Generator, elements: tuple[str, ...], sizes: list[int], n_species: list[int]):
    from ase.build import bulk, make_supercell

    n = int(rng.choice(sizes))
    k = int(rng.choice([s for s in n_species if s <= n]))
    species = list(rng.choice(elements, size=k, replace=False))
    while True:  # every chosen species present at least once
        occ = list(species) + list(rng.choice(species, size=n - k))
        rng.shuffle(occ)
        if len(set(occ)) == k:
            break
    prim = bulk("Cu", "fcc", a=_a_mix(occ))
    sc = make_supercell(prim, np.array(SUPERCELLS[n]))
    sc.set_chemical_symbols(occ)
    return sc, "random"


def random_strain(rng: np.random.Generator, magnitude: float) -> np.ndarray:
    e = rng.normal(size=(3, 3))
    e = 0.5 * (e + e.T)
    return magnitude * e / np.abs(e).max()


def deform(atoms, eta: np.ndarray):
    """Apply the Lagrangian strain eta with the symmetric stretch F = sqrt(I + 2 eta); return (atoms, F)."""
    w, v = np.linalg.eigh(np.eye(3) + 2 * eta)
    f = (v * np.sqrt(w)) @ v.T
    a = atoms.copy()
    a.set_cell(atoms.cell.array @ f.T, scale_atoms=True)
    return a, f


# --- EMT -----------------------------------------------------------------------------------------

def _calc(atoms):
    from ase.calculators.emt import EMT

    atoms.calc = EMT()
    return atoms


def relax(atoms, fmax: float, steps: int, cell: bool = True, symmetric: bool = True) -> bool:
    """Relax in place with EMT; True if converged."""
    from ase.constraints import FixSymmetry
    from ase.filters import UnitCellFilter
    from ase.optimize import BFGS

    _calc(atoms)
    if symmetric:
        atoms.set_constraint(FixSymmetry(atoms, symprec=1e-3))
    target = UnitCellFilter(atoms) if cell else atoms
    opt = BFGS(target, logfile=None, maxstep=0.1)
    ok = bool(opt.run(fmax=fmax, steps=steps))
    atoms.set_constraint()
    return ok


def elastic_tensor(atoms, delta: float = 0.001, fmax: float = 2e-5, steps: int = 300) -> dict:
    """Relaxed-ion and clamped-ion stiffness (Voigt, GPa) by central differences of the PK2 stress."""
    from ase.optimize import BFGS

    c = np.zeros((6, 6))
    cc = np.zeros((6, 6))
    relaxed_ions = False
    n_calls = 0
    for m, (i, j) in enumerate(common.VOIGT):
        s_rel, s_cl = [], []
        for sign in (1.0, -1.0):
            eta = np.zeros((3, 3))
            eta[i, j] += sign * delta / (1 if i == j else 2)
            if i != j:
                eta[j, i] = eta[i, j]
            a, f = deform(atoms, eta)
            _calc(a)
            sig_cl = a.get_stress(voigt=False)
            n_calls += 1
            sig = sig_cl
            if np.abs(a.get_forces()).max() > FIXED_FORCE_TOL:
                relaxed_ions = True
                opt = BFGS(a, logfile=None, maxstep=0.05)
                if not opt.run(fmax=fmax, steps=steps):
                    raise RuntimeError("ionic relaxation under strain did not converge")
                n_calls += opt.nsteps
                sig = a.get_stress(voigt=False)
            finv = np.linalg.inv(f)
            jac = np.linalg.det(f)
            for s, out in ((sig, s_rel), (sig_cl, s_cl)):
                pk2 = jac * finv @ s @ finv.T
                out.append(np.array([pk2[p, q] for p, q in common.VOIGT]))
        c[:, m] = (s_rel[0] - s_rel[1]) / (2 * delta)
        cc[:, m] = (s_cl[0] - s_cl[1]) / (2 * delta)
    c *= common.EV_PER_A3_TO_GPA
    cc *= common.EV_PER_A3_TO_GPA
    asym = float(np.linalg.norm(c - c.T) / max(np.linalg.norm(c), 1e-12))
    return {"C": 0.5 * (c + c.T), "C_clamped": 0.5 * (cc + cc.T), "fd_asymmetry": asym,
            "ions_relaxed": relaxed_ions, "n_calls": n_calls}


# --- the candidate list --------------------------------------------------------------------------

def candidates(params: dict, rng: np.random.Generator) -> list[dict]:
    """Deterministic list of cells to compute (before relaxation)."""
    elements = tuple(params.get("elements", ELEMENTS))
    out = []
    for proto in params.get("elemental", ["fcc", "bcc", "hcp"]):
        for el in elements:
            out.append({"prototype": proto, "atoms": build(proto, (el,))})
    combos = []
    for proto in params.get("ordered", list(ORDERED)):
        for a in elements:
            for b in elements:
                if a == b or (proto != "L12" and a > b):
                    continue
                combos.append((proto, (a, b)))
    n_ordered = params.get("n_ordered")
    if n_ordered is not None and n_ordered < len(combos):
        pick = np.sort(rng.choice(len(combos), size=n_ordered, replace=False))
        combos = [combos[k] for k in pick]
    for proto, els in combos:
        out.append({"prototype": proto, "atoms": build(proto, els)})
    for _ in range(int(params.get("n_random", 0))):
        at, proto = build_random(rng, elements, params.get("random_sizes", [3, 4, 5, 6, 9]),
                                 params.get("random_species", [2, 3]))
        out.append({"prototype": proto, "atoms": at})
    return out


def generate(params: dict, seed: int, progress=print) -> tuple[list[dict], dict]:
    """Relax every candidate, add distorted variants, compute elastic tensors. Returns (records, stats)."""
    with common.one_blas_thread():
        return _generate(params, seed, progress)


def _generate(params: dict, seed: int, progress) -> tuple[list[dict], dict]:
    from pymatgen.io.ase import AseAtomsAdaptor

    rng = np.random.default_rng(seed)
    fmax = float(params.get("fmax", 1e-4))
    steps = int(params.get("max_steps", 400))
    delta = float(params.get("delta", 0.001))
    strain_fmax = float(params.get("strain_fmax", 2e-5))
    t0 = time.perf_counter()
    cands = candidates(params, rng)
    relaxed: list[dict] = []
    rejected: dict[str, int] = {}
    for c in cands:
        at = c["atoms"]
        if relax(at, fmax=fmax, steps=steps, cell=True, symmetric=True):
            relaxed.append({"prototype": c["prototype"], "atoms": at, "prestrained": False})
        else:
            rejected[c["prototype"]] = rejected.get(c["prototype"], 0) + 1
    n_dist = int(params.get("n_distorted", 0))
    if n_dist and relaxed:
        base_idx = rng.choice(len(relaxed), size=n_dist, replace=n_dist > len(relaxed))
        for b in base_idx:
            base = relaxed[int(b)]
            eta = random_strain(rng, float(params.get("distortion", 0.02)))
            at, _ = deform(base["atoms"], eta)
            at.rattle(stdev=0.01, seed=int(rng.integers(2**31)))
            if relax(at, fmax=fmax, steps=steps, cell=False, symmetric=False):
                relaxed.append({"prototype": f"{base['prototype']}-distorted", "atoms": at, "prestrained": True})
            else:
                rejected["distorted"] = rejected.get("distorted", 0) + 1
    records = []
    for k, r in enumerate(relaxed):
        at = r["atoms"]
        try:
            el = elastic_tensor(at, delta=delta, fmax=strain_fmax, steps=steps)
        except RuntimeError:
            rejected["elastic"] = rejected.get("elastic", 0) + 1
            continue
        if not np.all(np.isfinite(el["C"])):
            rejected["elastic"] = rejected.get("elastic", 0) + 1
            continue
        _calc(at)
        stress = at.get_stress(voigt=False) * common.EV_PER_A3_TO_GPA
        structure = AseAtomsAdaptor.get_structure(at)
        records.append({
            "id": f"emt-{len(records):05d}", "prototype": r["prototype"], "structure": structure.as_dict(),
            "energy_per_atom": float(at.get_potential_energy() / len(at)),
            "max_abs_stress_GPa": float(np.abs(stress).max()), "prestrained": r["prestrained"],
            "max_force": float(np.abs(at.get_forces()).max()),
            "C_voigt": el["C"].tolist(), "C_voigt_clamped": el["C_clamped"].tolist(),
            "fd_asymmetry": el["fd_asymmetry"], "ions_relaxed": el["ions_relaxed"], "n_emt_calls": el["n_calls"],
        })
        if (k + 1) % 25 == 0:
            progress(f"  elastic tensors: {k + 1}/{len(relaxed)} ({time.perf_counter() - t0:.1f} s)")
    n_main = len(records)
    t_eval = time.perf_counter()
    records += _eval_records(params, seed, [r for r in relaxed if not r["prestrained"]], fmax, steps, rejected)
    stats = {"n_candidates": len(cands) + n_dist, "n_structures": n_main, "n_eval_only": len(records) - n_main,
             "n_eval_elastic": sum(r["C_voigt"] is not None for r in records[n_main:]),
             "rejected": rejected, "eval_seconds": round(time.perf_counter() - t_eval, 2),
             "generate_seconds": round(time.perf_counter() - t0, 2)}
    return records, stats


def _invariant_key(atoms) -> tuple:
    """Rotation-invariant fingerprint of a cell (formula, size, synthetic-target invariants): equal for
    two occupations of a supercell that are the same crystal (related by a lattice translation or a
    symmetry), so that evaluation-only cells never repeat a cell of the main set."""
    eps, p3 = common.synthetic_targets(atoms.cell.array, atoms.get_positions(), atoms.get_chemical_symbols())
    return (atoms.get_chemical_formula(), len(atoms), *np.round(np.linalg.eigvalsh(eps), 8),
            round(float(np.linalg.norm(p3)), 8))


def _eval_records(params: dict, seed: int, bases: list[dict], fmax: float, steps: int, rejected: dict) -> list[dict]:
    """Evaluation-only cells: relaxed like the main cells, with the synthetic order-2/3 targets; an
    elastic tensor (computed exactly like the main cells') for a random subset of ``n_eval_elastic``
    of them, C NaN for the others (split "eval" for all).

    Why: a synthetic target costs one neighbour sum, an EMT elastic tensor 12 strained cells (each with
    an ionic relaxation for cells without inversion centres), so the order-2/3 test set can grow ten
    times for the price of a few relaxations. The elemental and ordered prototypes are all in the main
    set already, so the new cells are random fcc supercells (drawn like the main ones, duplicates of
    any main or earlier cell dropped) and distorted variants of the main relaxed cells. Their own
    random stream leaves the main set bit-identical. An elastic tensor costs about 0.14 CPU-s per
    cell here (3-9 atoms), so the order-4 test set can grow too (``n_eval_elastic``)."""
    from pymatgen.io.ase import AseAtomsAdaptor

    n_rand, n_dist = int(params.get("n_eval_random", 0)), int(params.get("n_eval_distorted", 0))
    if not (n_rand or n_dist):
        return []
    rng = np.random.default_rng([seed, 2])
    # the main set's random cells before relaxation (relax() works in place): rebuilt from the same stream
    seen = {_invariant_key(c["atoms"]) for c in candidates(params, np.random.default_rng(seed))
            if c["prototype"] == "random"}
    cells = []
    tries = 0
    while sum(c[0] == "random" for c in cells) < n_rand and tries < 20 * max(n_rand, 1):
        tries += 1
        at, proto = build_random(rng, tuple(params.get("elements", ELEMENTS)),
                                 params.get("random_sizes", [3, 4, 5, 6, 9]), params.get("random_species", [2, 3]))
        key = _invariant_key(at)
        if key in seen:
            continue
        seen.add(key)
        if relax(at, fmax=fmax, steps=steps, cell=True, symmetric=True):
            cells.append((proto, at))
        else:
            rejected["eval"] = rejected.get("eval", 0) + 1
    for b in rng.choice(len(bases), size=n_dist, replace=n_dist > len(bases)) if (n_dist and bases) else []:
        base = bases[int(b)]
        at, _ = deform(base["atoms"], random_strain(rng, float(params.get("distortion", 0.02))))
        at.rattle(stdev=0.01, seed=int(rng.integers(2**31)))
        if relax(at, fmax=fmax, steps=steps, cell=False, symmetric=False):
            cells.append((f"{base['prototype']}-distorted", at))
        else:
            rejected["eval"] = rejected.get("eval", 0) + 1
    # order-4 evaluation cells: elastic tensors for a random subset of n_eval_elastic of them (own stream, so
    # the cells themselves and their order-2/3 targets do not depend on it); a failed tensor leaves C NaN
    n_el = min(int(params.get("n_eval_elastic", 0)), len(cells))
    with_c = set(np.random.default_rng([seed, 3]).choice(len(cells), size=n_el, replace=False).tolist()) if n_el else set()
    delta, strain_fmax = float(params.get("delta", 0.001)), float(params.get("strain_fmax", 2e-5))
    out = []
    for k, (proto, at) in enumerate(cells):
        el = None
        if k in with_c:
            try:
                el = elastic_tensor(at, delta=delta, fmax=strain_fmax, steps=steps)
            except RuntimeError:
                el = None
            if el is not None and not np.all(np.isfinite(el["C"])):
                el = None
            if el is None:
                rejected["eval_elastic"] = rejected.get("eval_elastic", 0) + 1
        _calc(at)
        stress = at.get_stress(voigt=False) * common.EV_PER_A3_TO_GPA
        out.append({
            "id": f"emt-eval-{k:05d}", "prototype": proto, "structure": AseAtomsAdaptor.get_structure(at).as_dict(),
            "energy_per_atom": float(at.get_potential_energy() / len(at)),
            "max_abs_stress_GPa": float(np.abs(stress).max()), "prestrained": proto.endswith("-distorted"),
            "max_force": float(np.abs(at.get_forces()).max()),
            "C_voigt": None if el is None else el["C"].tolist(),
            "C_voigt_clamped": None if el is None else el["C_clamped"].tolist(),
            "fd_asymmetry": float("nan") if el is None else el["fd_asymmetry"],
            "ions_relaxed": False if el is None else el["ions_relaxed"],
            "n_emt_calls": 0 if el is None else el["n_calls"], "eval_only": True,
        })
    return out



# --- the dataset interface -----------------------------------------------------------------------

def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    import ase

    if source != "offline":
        raise ValueError(f"crystals_emt_elastic is generated offline; source '{source}' is not available")
    raw_dir = Path(raw_dir)
    records, stats = generate(params, seed, progress=lambda m: print(m, flush=True))
    from ...io import atomic_path

    with atomic_path(raw_dir / "emt_records.json") as tmp:
        tmp.write_text(json.dumps({"seed": seed, "params": params, "generator": GENERATOR_VERSION,
                                   "records": records}))
    print(f"generated {stats['n_structures']} structures in {stats['generate_seconds']} s; "
          f"rejected {stats['rejected']}",
          flush=True)
    return {"version": GENERATOR_VERSION, "generator": "reprozoo.data.crystals.emt_elastic.generate",
            "calculator": f"ase {ase.__version__} EMT", "units": {"C": "GPa", "energy": "eV/atom"},
            "elastic_method": "central differences of PK2 stress over 6 Lagrangian strains (+-delta), "
                              "ions relaxed at each strain when forced (relaxed-ion tensor); clamped-ion kept too",
            **stats}


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    from pymatgen.core import Structure

    raw = json.loads((Path(raw_dir) / "emt_records.json").read_text())
    recs = raw["records"]
    structures = [Structure.from_dict(r["structure"]) for r in recs]
    keep = ("prototype", "energy_per_atom", "max_abs_stress_GPa", "prestrained", "max_force", "fd_asymmetry",
            "ions_relaxed", "n_emt_calls")
    has_eval = any(r.get("eval_only", False) for r in recs)
    rows = [{**{k: r[k] for k in keep}, **({"eval_only": bool(r.get("eval_only", False))} if has_eval else {})}
            for r in recs]
    nan66 = np.full((6, 6), np.nan)  # evaluation-only cells have no elastic tensor

    def c6(key):
        return np.array([nan66 if r[key] is None else r[key] for r in recs], dtype=float).reshape(-1, 6, 6)

    info = common.write_processed(
        out_dir, [r["id"] for r in recs], structures, c6("C_voigt"),
        rows, seed=int(raw["seed"]), cutoff=float(params.get("target_cutoff", common.TARGET_CUTOFF)),
        extra_arrays={"C_voigt_clamped": c6("C_voigt_clamped")})
    info["target_cutoff_A"] = float(params.get("target_cutoff", common.TARGET_CUTOFF))
    return info


def preview(out_dir: Path, png: Path) -> None:
    common.preview(out_dir, png, "EMT elastic")


def load(out_dir: Path) -> common.CrystalTensorData:
    return common.load(out_dir)
