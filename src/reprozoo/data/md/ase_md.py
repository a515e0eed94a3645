"""Offline molecular dynamics with ASE: EMT metals (bulk, slabs, nanoclusters) and Lennard-Jones.

One module serves several datasets (md_emt_cu_bulk, md_emt_pt_cluster, md_emt_nanoclusters,
md_lj_argon); the dataset's parameters say which systems to build, which calculator to use and
which schedule of thermostat segments to run::

    calculator: {name: emt} | {name: lj, sigma: 3.405, epsilon: 0.0104, rc_sigma: 3.0}
    systems:                     # one or more; each runs the schedule on its own
      - {name: cu_bulk, structure: bulk, element: Cu, crystal: fcc, repeat: [3, 3, 3]}
      - {name: cu_ico309, structure: icosahedron, element: Cu, shells: 5, segments: [...]}  # own schedule
    timestep_fs: 4.0
    friction_per_fs: 0.02        # Langevin friction (1/fs)
    stride: 5                    # record every `stride` MD steps
    segments:                    # run in order, continuing from the previous state
      - {ensemble: langevin, temperature_K: 300, steps: 100, equilibrate: 50}
      - {ensemble: nve, steps: 100}
    split: [0.8, 0.1, 0.1]

Recorded per frame: positions, forces (unconstrained, = -dE/dx), potential energy, velocities,
instantaneous temperature, kinetic energy, time, segment label. Deterministic for a given seed
(velocities and Langevin noise come from one numpy Generator; EMT and LJ are deterministic).
"""
from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from ...io import save_npz, write_json
from . import frames as fmt

VERSION = "ase-md-1"
EMT_ELEMENTS = ("Al", "Cu", "Ag", "Au", "Ni", "Pd", "Pt")


# --- structures ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def emt_lattice_constant(element: str, crystal: str = "fcc") -> float:
    """EMT's own equilibrium lattice constant (energy minimum of the perfect crystal; hcp at
    ideal c/a), so an unstrained EMT crystal has zero forces and ~zero stress."""
    from ase.build import bulk
    from ase.calculators.emt import parameters
    from ase.units import Bohr
    from scipy.optimize import minimize_scalar

    from .potentials import FastEMT

    s0 = parameters[element][1] * Bohr
    vol0 = 4.0 / 3.0 * np.pi * s0 ** 3  # Wigner-Seitz volume: the starting guess
    guess = {"fcc": (4 * vol0) ** (1 / 3), "bcc": (2 * vol0) ** (1 / 3), "hcp": (np.sqrt(2) * vol0) ** (1 / 3),
             "sc": vol0 ** (1 / 3)}[crystal]

    def energy(a):
        kw = {"c": a * np.sqrt(8 / 3)} if crystal == "hcp" else {}
        at = bulk(element, crystal, a=a, **kw)
        at.calc = FastEMT()
        return at.get_potential_energy() / len(at)

    res = minimize_scalar(energy, bounds=(0.9 * guess, 1.1 * guess), method="bounded", options={"xatol": 1e-7})
    return float(res.x)


def default_a(element: str, crystal: str = "fcc") -> float:
    if element in EMT_ELEMENTS:
        return emt_lattice_constant(element, crystal)
    from ase.data import atomic_numbers, reference_states

    ref = reference_states[atomic_numbers[element]]
    if ref is None or "a" not in ref:
        raise ValueError(f"no default lattice constant for {element}; give 'a'")
    return float(ref["a"])


def build(spec: dict, rng: np.random.Generator):
    """Build an ase.Atoms from a system spec (see the module docstring)."""
    from ase.build import bulk, fcc100, fcc111

    kind = spec.get("structure", "bulk")
    el = spec["element"]
    crystal = spec.get("crystal", "fcc")
    a = float(spec.get("a") or default_a(el, crystal if kind == "bulk" else "fcc"))
    if kind == "bulk":
        kw = {"c": a * np.sqrt(8 / 3)} if crystal == "hcp" else {}
        atoms = bulk(el, crystal, a=a, cubic=crystal != "hcp", orthorhombic=crystal == "hcp", **kw)
        atoms = atoms * tuple(spec.get("repeat", (1, 1, 1)))
    elif kind == "icosahedron":
        from ase.cluster import Icosahedron

        atoms = Icosahedron(el, int(spec["shells"]), latticeconstant=a)
    elif kind == "cuboctahedron":
        from ase.cluster import Octahedron

        # Octahedron(length, cutoff) with length = 2 * cutoff + 1 is a cuboctahedron
        c = int(spec["shells"]) - 1
        atoms = Octahedron(el, 2 * c + 1, cutoff=c, latticeconstant=a)
    elif kind == "decahedron":
        from ase.cluster import Decahedron

        atoms = Decahedron(el, int(spec.get("p", 3)), int(spec.get("q", 2)), int(spec.get("r", 0)), latticeconstant=a)
    elif kind == "slab":
        maker = {"111": fcc111, "100": fcc100}[str(spec.get("facet", "111"))]
        atoms = maker(el, size=tuple(spec.get("size", (4, 4, 4))), a=a, vacuum=float(spec.get("vacuum", 8.0)),
                      orthogonal=True)
    else:
        raise ValueError(f"unknown structure {kind!r}")
    if kind not in ("bulk", "slab"):
        atoms.cell[:] = 0.0
        atoms.pbc = False
        atoms.positions -= atoms.positions.mean(axis=0)
    sub = spec.get("substitute")
    if sub:
        n = len(atoms)
        k = int(round(float(sub["fraction"]) * n))
        idx = rng.choice(n, size=k, replace=False)
        numbers = atoms.numbers.copy()
        from ase.data import atomic_numbers

        numbers[idx] = atomic_numbers[sub["element"]]
        atoms.numbers = numbers
    if spec.get("rattle"):
        atoms.positions += rng.normal(0.0, float(spec["rattle"]), atoms.positions.shape)
    return atoms


def make_calculator(cfg: dict | None):
    cfg = dict(cfg or {"name": "emt"})
    name = cfg.pop("name", "emt")
    if name == "emt":  # ASE's EMT, vectorised (identical results, see potentials.py)
        from .potentials import FastEMT

        return FastEMT()
    if name == "emt_ase":  # ase.calculators.emt.EMT itself (slow: a Python loop over atoms)
        from ase.calculators.emt import EMT

        return EMT()
    if name in ("lj", "lj_ase"):  # "lj": vectorised ase LennardJones (identical results)
        sigma = float(cfg.get("sigma", 3.405))
        kw = dict(sigma=sigma, epsilon=float(cfg.get("epsilon", 0.0104)), rc=float(cfg.get("rc_sigma", 3.0)) * sigma,
                  smooth=bool(cfg.get("smooth", True)))
        if cfg.get("ro_sigma") is not None:
            kw["ro"] = float(cfg["ro_sigma"]) * sigma
        if name == "lj_ase":
            from ase.calculators.lj import LennardJones

            return LennardJones(**kw)
        from .potentials import FastLJ

        return FastLJ(**kw)
    raise ValueError(f"unknown calculator {name!r}")


# --- dynamics --------------------------------------------------------------------------------

def run_md(atoms, calc, segments: list[dict], timestep_fs: float, friction_per_fs: float, stride: int,
           rng: np.random.Generator, system: int = 0, equilibrate: int = 0,
           init_temperature_K: float | None = None, progress=None) -> tuple[list[dict], list[dict]]:
    """Run the thermostat schedule; return (frames, table rows)."""
    from ase import units
    from ase.constraints import FixCom
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, ZeroRotation, thermalize_momenta
    from ase.md.verlet import VelocityVerlet

    atoms = atoms.copy()
    atoms.calc = calc
    atoms.set_constraint(FixCom())
    t0 = init_temperature_K if init_temperature_K is not None else float(
        next((s["temperature_K"] for s in segments if "temperature_K" in s), 300.0))
    thermalize_momenta(atoms, temperature_K=t0, rng=rng)
    Stationary(atoms)
    if not atoms.pbc.any():
        ZeroRotation(atoms)
    dt = float(timestep_fs) * units.fs
    frames, rows = [], []
    step = 0

    def record(label: str, ensemble: str, target: float):
        e = atoms.get_potential_energy()
        f = atoms.get_forces(apply_constraint=False)
        frames.append({"positions": atoms.positions.copy(), "numbers": atoms.numbers.copy(),
                       "cell": atoms.cell.array.copy(), "energy": float(e), "forces": f.copy(),
                       "velocities": atoms.get_velocities() * units.fs, "system": system})
        rows.append({"segment": label, "ensemble": ensemble, "temperature": float(atoms.get_temperature()),
                     "temperature_target": target, "kinetic_energy": float(atoms.get_kinetic_energy()),
                     "time_fs": step * float(timestep_fs)})

    for k, seg in enumerate(segments):
        ens = seg.get("ensemble", "langevin")
        nsteps = int(seg["steps"])
        if ens == "langevin":
            temp = float(seg["temperature_K"])
            dyn = Langevin(atoms, dt, temperature_K=temp, friction=float(seg.get("friction_per_fs", friction_per_fs)) / units.fs,
                           fixcm=False, rng=rng)
            label = seg.get("label", f"langevin_{temp:g}K")
            neq = int(seg.get("equilibrate", equilibrate))
            if neq:
                dyn.run(neq)
                step += neq
        elif ens == "nve":
            temp = float("nan")
            dyn = VelocityVerlet(atoms, dt)
            label = seg.get("label", "nve")
        else:
            raise ValueError(f"unknown ensemble {ens!r}")
        tic = time.perf_counter()
        for _ in range(nsteps // int(stride)):
            dyn.run(int(stride))
            step += int(stride)
            record(label, ens, temp)
        if progress:
            progress(f"system {system} segment {k} ({label}): {nsteps} steps, {len(atoms)} atoms, "
                     f"{time.perf_counter() - tic:.1f} s")
    return frames, rows


def generate(params: dict, seed: int, progress=print) -> tuple[dict, dict, dict]:
    """Run every system of the dataset; return (arrays in the common layout, table columns, info)."""
    rng = np.random.default_rng(seed)
    systems = params["systems"]
    all_frames, all_rows, names, info = [], [], [], {"systems": []}
    pbc = None
    for s, spec in enumerate(systems):
        atoms = build(spec, rng)
        if pbc is None:
            pbc = atoms.pbc.copy()
        elif (pbc != atoms.pbc).any():
            raise ValueError("all systems of one dataset must share their periodicity")
        name = spec.get("name", f"{spec['element']}{len(atoms)}_{spec.get('structure', 'bulk')}")
        names.append(name)
        tic = time.perf_counter()
        fr, rows = run_md(atoms, make_calculator(params.get("calculator")), spec.get("segments", params["segments"]),
                          params.get("timestep_fs", 4.0), params.get("friction_per_fs", 0.02),
                          int(spec.get("stride", params.get("stride", 5))), rng, system=s,
                          equilibrate=int(spec.get("equilibrate", params.get("equilibrate", 0))),
                          init_temperature_K=params.get("init_temperature_K"), progress=progress)
        all_frames += fr
        all_rows += rows
        info["systems"].append({"name": name, "n_atoms": len(atoms), "formula": atoms.get_chemical_formula(),
                                "structure": spec.get("structure", "bulk"), "frames": len(fr),
                                "seconds": round(time.perf_counter() - tic, 2)})
    arrays = fmt.pack(all_frames, names, pbc)
    table = {k: np.array([r[k] for r in all_rows]) for k in all_rows[0]} if all_rows else {}
    return arrays, table, info


# --- dataset interface -----------------------------------------------------------------------

def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    if source != "offline":
        raise ValueError(f"source {source!r}: this dataset is generated offline only")
    raw_dir = Path(raw_dir)
    tic = time.perf_counter()
    arrays, table, info = generate(params, seed)
    save_npz(raw_dir / "trajectory.npz", **arrays, **{f"table_{k}": v for k, v in table.items()})
    write_json(raw_dir / "raw_meta.json", {"seed": seed, **info})
    calc = (params.get("calculator") or {"name": "emt"})
    return {"version": VERSION, "generator": "reprozoo.data.md.ase_md.generate",
            "calculator": calc, "ase_version": _ase_version(), "systems": info["systems"],
            "generation_seconds": round(time.perf_counter() - tic, 2),
            "units": {"energy": "eV", "length": "Angstrom", "forces": "eV/Angstrom", "time": "fs"}}


def _ase_version() -> str:
    import ase

    return ase.__version__


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    raw_dir = Path(raw_dir)
    meta = fmt.read_raw_meta(raw_dir)
    with np.load(raw_dir / "trajectory.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("table_")}
        table = {k[len("table_"):]: z[k] for k in z.files if k.startswith("table_")}
    table["split"] = fmt.assign_splits(arrays["system"], params.get("split", (0.8, 0.1, 0.1)),
                                       int(meta.get("seed", 0)) + 1)
    arrays["nve"] = table["ensemble"] == "nve"
    return fmt.write(out_dir, arrays, table, meta={"systems": meta.get("systems", [])})


def preview(out_dir: Path, png: Path) -> None:
    fmt.preview(out_dir, png)


def load(out_dir: Path) -> fmt.MDFrames:
    return fmt.load(out_dir)
