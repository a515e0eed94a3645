"""The processed layout every crystal-tensor dataset shares, and the tensor helpers behind it.

Processed folder (``results/data/<dataset>/<scale>/``)::

    structures.json      JSON list of pymatgen ``Structure.as_dict()``, row i <-> tensors[i] <-> table row i
    tensors.npz          ids (M,) str
                         C_voigt (M,6,6) GPa, C_full (M,3,3,3,3) GPa   order-4 elastic stiffness
                         eps_like (M,3,3)        order-2 synthetic "dielectric-like" target (dimensionless)
                         piezo_like (M,3,3,3)    order-3 synthetic "piezo-like" target (arbitrary units)
                         (+ source-specific arrays, e.g. C_voigt_clamped for EMT)
    structures.parquet   one row per structure: id, formula, prototype, symmetry, moduli, split, ...

Conventions: Voigt order xx, yy, zz, yz, xz, xy; no factors in the stiffness (C_full[i,j,k,l] =
C_voigt[v(ij), v(kl)]); all tensors are expressed in the Cartesian frame of the stored structure, so
rotating the structure by R turns T into R.T (``rotate``) for every target.

The synthetic order-2/3 targets are functions of the structure only (element properties from
pymatgen and the neighbour vectors within ``cutoff``), equivariant by construction:

    M        = 1/N sum_i sum_j  a_i a_j w(r_ij) u_ij (x) u_ij                     (u = r/|r|)
    eps_like = I + m (M/m)^4,  m = tr(M)/3          (symmetric, positive definite; the power
                                                      amplifies the anisotropy of M fourfold)
    piezo_like_abc = 10/N sum_i sum_j (x_i - x_j) w(r_ij) [u_a u_b u_c + 1/2 u_a delta_bc]

with a = atomic radius (Angstrom), x = Pauling electronegativity, w(r) = exp(-r/1.5) fcut(r),
fcut(r) = (1 + cos(pi r/cutoff))/2. eps_like is isotropic for cubic crystals. piezo_like is
symmetric in its last two indices (like a piezoelectric e_ijk) and vanishes exactly for
centrosymmetric structures (a pair and its inversion image cancel), as a piezo tensor does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from reprozoo.figures import save_figure

VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))
# VASP writes elastic moduli in the order xx, yy, zz, xy, yz, zx; standard Voigt is xx, yy, zz, yz, xz, xy
VASP_TO_VOIGT = (0, 1, 2, 4, 5, 3)
TARGET_CUTOFF = 4.5  # Angstrom
EPS_POWER = 4
PIEZO_SCALE = 10.0
FILES = ["structures.json", "tensors.npz", "structures.parquet"]
EV_PER_A3_TO_GPA = 160.21766208


# --- tensor algebra ------------------------------------------------------------------------------

def _vidx() -> np.ndarray:
    idx = np.empty((3, 3), dtype=int)
    for m, (i, j) in enumerate(VOIGT):
        idx[i, j] = idx[j, i] = m
    return idx


def voigt_to_full(cv: np.ndarray) -> np.ndarray:
    """(..., 6, 6) stiffness in Voigt form -> (..., 3, 3, 3, 3) with all index symmetries."""
    cv = np.asarray(cv, dtype=float)
    idx = _vidx()
    return cv[..., idx[:, :, None, None], idx[None, None, :, :]]


def full_to_voigt(c: np.ndarray) -> np.ndarray:
    c = np.asarray(c, dtype=float)
    out = np.empty(c.shape[:-4] + (6, 6))
    for m, (i, j) in enumerate(VOIGT):
        for n, (k, l) in enumerate(VOIGT):
            out[..., m, n] = c[..., i, j, k, l]
    return out


def vasp_to_voigt(cv_vasp: np.ndarray) -> np.ndarray:
    """Reorder a 6x6 matrix from VASP's (xx,yy,zz,xy,yz,zx) to standard Voigt (xx,yy,zz,yz,xz,xy)."""
    p = list(VASP_TO_VOIGT)
    return np.asarray(cv_vasp, dtype=float)[np.ix_(p, p)]


def rotate(t: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Rotate a Cartesian tensor of any order: T'_{a b ...} = R_{a i} R_{b j} ... T_{i j ...}."""
    t = np.asarray(t, dtype=float)
    for axis in range(t.ndim):
        t = np.moveaxis(np.tensordot(r, t, axes=([1], [axis])), 0, axis)
    return t


def vrh_moduli(cv: np.ndarray) -> tuple[float, float]:
    """Voigt-Reuss-Hill bulk and shear moduli (same units as cv); NaN where C is singular."""
    c = np.asarray(cv, dtype=float)
    kv = (c[0, 0] + c[1, 1] + c[2, 2] + 2 * (c[0, 1] + c[1, 2] + c[0, 2])) / 9.0
    gv = (c[0, 0] + c[1, 1] + c[2, 2] - (c[0, 1] + c[1, 2] + c[0, 2]) + 3 * (c[3, 3] + c[4, 4] + c[5, 5])) / 15.0
    try:
        s = np.linalg.inv(c)
    except np.linalg.LinAlgError:
        return float("nan"), float("nan")
    kr = 1.0 / (s[0, 0] + s[1, 1] + s[2, 2] + 2 * (s[0, 1] + s[1, 2] + s[0, 2]))
    gr = 15.0 / (4 * (s[0, 0] + s[1, 1] + s[2, 2]) - 4 * (s[0, 1] + s[1, 2] + s[0, 2])
                 + 3 * (s[3, 3] + s[4, 4] + s[5, 5]))
    return float(0.5 * (kv + kr)), float(0.5 * (gv + gr))


def point_group_residual(c_full: np.ndarray, rotations) -> float:
    """max over point-group rotations R of |R.C - C| / |C|: 0 when C has the lattice's symmetry."""
    norm = np.linalg.norm(c_full)
    if not len(rotations) or norm == 0:
        return 0.0
    return float(max(np.linalg.norm(rotate(c_full, r) - c_full) for r in rotations) / norm)


# --- structures ----------------------------------------------------------------------------------

def _element_props(symbols) -> tuple[np.ndarray, np.ndarray]:
    from pymatgen.core import Element

    cache: dict[str, tuple[float, float]] = {}
    radius, chi = [], []
    for s in symbols:
        if s not in cache:
            el = Element(s)
            r = el.atomic_radius
            x = el.X
            r = float(r) if r is not None and np.isfinite(float(r)) else 1.5
            x = float(x) if x is not None and np.isfinite(float(x)) else 2.0
            cache[s] = (r, x)
        radius.append(cache[s][0])
        chi.append(cache[s][1])
    return np.array(radius), np.array(chi)


def synthetic_targets(lattice: np.ndarray, cart_coords: np.ndarray, symbols, cutoff: float = TARGET_CUTOFF):
    """The order-2 (eps_like) and order-3 (piezo_like) targets of one structure (see module doc)."""
    from ase import Atoms
    from ase.neighborlist import neighbor_list

    atoms = Atoms(symbols=list(symbols), positions=np.asarray(cart_coords, float), cell=np.asarray(lattice, float),
                  pbc=True)
    i, j, d = neighbor_list("ijD", atoms, cutoff)
    n = len(atoms)
    a, x = _element_props(atoms.get_chemical_symbols())
    r = np.linalg.norm(d, axis=1)
    u = d / r[:, None]
    w = np.exp(-r / 1.5) * 0.5 * (np.cos(np.pi * r / cutoff) + 1.0)
    m = np.einsum("p,pa,pb->ab", a[i] * a[j] * w, u, u) / n
    m = 0.5 * (m + m.T)
    mbar = np.trace(m) / 3
    if mbar > 0:
        lam, vec = np.linalg.eigh(m / mbar)
        eps = np.eye(3) + mbar * (vec * np.clip(lam, 0, None) ** EPS_POWER) @ vec.T
    else:  # no neighbour within the cutoff
        eps = np.eye(3)
    eps = 0.5 * (eps + eps.T)
    q = (x[i] - x[j]) * w * PIEZO_SCALE
    p3 = np.einsum("p,pa,pb,pc->abc", q, u, u, u) / n
    dip = np.einsum("p,pa->a", q, u) / n
    p3 = p3 + 0.5 * dip[:, None, None] * np.eye(3)[None]
    return eps, p3


def structure_targets(structure, cutoff: float = TARGET_CUTOFF):
    return synthetic_targets(structure.lattice.matrix, structure.cart_coords,
                             [site.specie.symbol for site in structure], cutoff)


def symmetry_info(structure, symprec: float = 1e-3) -> dict[str, Any]:
    """Space group, crystal system, point group, centrosymmetry and the Cartesian point-group rotations."""
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    try:
        sga = SpacegroupAnalyzer(structure, symprec=symprec, angle_tolerance=-1)
        ops = sga.get_symmetry_operations(cartesian=True)
        rots = []
        for op in ops:
            rm = np.round(op.rotation_matrix, 10)
            if not any(np.allclose(rm, q, atol=1e-6) for q in rots):
                rots.append(rm)
        return {"spacegroup_symbol": sga.get_space_group_symbol(),
                "spacegroup_number": int(sga.get_space_group_number()),
                "crystal_system": sga.get_crystal_system(), "point_group": sga.get_point_group_symbol(),
                "centrosymmetric": bool(sga.is_laue()), "rotations": rots}
    except Exception:  # noqa: BLE001 - spglib can fail on odd cells; P1 is the safe answer
        return {"spacegroup_symbol": "P1", "spacegroup_number": 1, "crystal_system": "triclinic",
                "point_group": "1", "centrosymmetric": False, "rotations": [np.eye(3)]}


def splits(n: int, seed: int, fractions=(0.8, 0.1, 0.1)) -> np.ndarray:
    rng = np.random.default_rng(seed + 911)
    order = rng.permutation(n)
    n_val = int(round(fractions[1] * n))
    n_test = int(round(fractions[2] * n))
    if n >= 3:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
    labels = np.array(["train"] * n, dtype=object)
    labels[order[:n_val]] = "val"
    labels[order[n_val:n_val + n_test]] = "test"
    return labels


# --- writing and reading -------------------------------------------------------------------------

def one_blas_thread():
    """Tiny 3x3 LAPACK calls crawl when OpenBLAS spins threads on a busy machine: use one."""
    try:
        import scipy.linalg  # noqa: F401 - load scipy's own OpenBLAS first, so that the limit reaches it
        from threadpoolctl import threadpool_limits

        return threadpool_limits(1)
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn here
        import contextlib

        return contextlib.nullcontext()


def manifest_seed(raw_dir: Path, default: int = 0) -> int:
    """The dataset seed recorded by the acquire stage (preprocess gets no seed argument)."""
    p = Path(raw_dir) / "manifest.json"
    if p.exists():
        try:
            return int(json.loads(p.read_text()).get("seed", default))
        except (ValueError, TypeError):
            return default
    return default


def write_processed(out_dir: Path, ids: list[str], structures: list, c_voigt: np.ndarray, rows: list[dict],
                    seed: int, symprec: float = 1e-3, cutoff: float = TARGET_CUTOFF,
                    extra_arrays: dict | None = None) -> dict:
    """Compute symmetry, moduli, synthetic targets and splits; write the three files.

    ``rows`` hold the source-specific columns (prototype, energy, ...), one dict per structure.
    """
    with one_blas_thread():
        return _write_processed(out_dir, ids, structures, c_voigt, rows, seed, symprec, cutoff, extra_arrays)


def _write_processed(out_dir, ids, structures, c_voigt, rows, seed, symprec, cutoff, extra_arrays) -> dict:
    import pandas as pd

    from ...io import atomic_path, save_npz

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    m = len(ids)
    c_voigt = np.asarray(c_voigt, dtype=float).reshape(m, 6, 6)
    c_full = voigt_to_full(c_voigt)
    eps = np.zeros((m, 3, 3))
    p3 = np.zeros((m, 3, 3, 3))
    table = []
    # evaluation-only rows (no elastic tensor, C = NaN) form their own split "eval"; the other rows keep
    # the splits they would have without them
    eval_only = np.array([bool(r.get("eval_only", False)) for r in rows], dtype=bool)
    lab = np.array(["eval"] * m, dtype=object)
    lab[~eval_only] = splits(int((~eval_only).sum()), seed)
    for k, (sid, s, row) in enumerate(zip(ids, structures, rows)):
        sym = symmetry_info(s, symprec)
        rots = sym.pop("rotations")
        eps[k], p3[k] = structure_targets(s, cutoff)
        has_c = bool(np.all(np.isfinite(c_voigt[k])))
        kvrh, gvrh = vrh_moduli(c_voigt[k]) if has_c else (float("nan"), float("nan"))
        eig = np.linalg.eigvalsh(0.5 * (c_voigt[k] + c_voigt[k].T)) if has_c else np.full(6, np.nan)
        comp = s.composition
        table.append({
            "id": sid, "formula": comp.formula.replace(" ", ""), "reduced_formula": comp.reduced_formula,
            "elements": "-".join(sorted(el.symbol for el in comp.elements)),
            **{kk: v for kk, v in row.items() if kk not in ("id",)},
            **sym,
            "n_atoms": len(s), "volume_per_atom": float(s.volume / len(s)),
            "k_vrh": kvrh, "g_vrh": gvrh, "min_eig_C": float(eig[0]), "born_stable": bool(eig[0] > 0),
            "symmetry_residual": point_group_residual(c_full[k], rots) if has_c else float("nan"),
            "split": lab[k],
        })
    with atomic_path(out_dir / "structures.json") as tmp:
        tmp.write_text(json.dumps([s.as_dict() for s in structures]))
    save_npz(out_dir / "tensors.npz", ids=np.array(ids, dtype=str), C_voigt=c_voigt, C_full=c_full,
             eps_like=eps, piezo_like=p3, **(extra_arrays or {}))
    df = pd.DataFrame(table)
    with atomic_path(out_dir / "structures.parquet") as tmp:
        df.to_parquet(tmp, index=False)
    sizes = {"n_structures": m, "n_train": int((lab == "train").sum()), "n_val": int((lab == "val").sum()),
             "n_test": int((lab == "test").sum()), **({"n_eval": int(eval_only.sum())} if eval_only.any() else {}),
             "crystal_systems": {k: int(v) for k, v in df.crystal_system.value_counts().items()}}
    if "prototype" in df:
        sizes["prototypes"] = {k: int(v) for k, v in df.prototype.value_counts().items()}
    return {"files": list(FILES), "sizes": sizes}


@dataclass
class CrystalTensorData:
    """What methods consume: structures, tensors and the table, aligned row by row."""

    structures: list  # pymatgen Structure
    ids: np.ndarray
    C_voigt: np.ndarray  # (M, 6, 6) GPa
    C_full: np.ndarray  # (M, 3, 3, 3, 3) GPa
    eps_like: np.ndarray  # (M, 3, 3)
    piezo_like: np.ndarray  # (M, 3, 3, 3)
    table: Any  # pandas.DataFrame
    extra: dict = field(default_factory=dict)  # any other arrays of tensors.npz

    def __len__(self) -> int:
        return len(self.structures)

    def split_index(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.table["split"].to_numpy() == split)

    def targets(self, order: int) -> np.ndarray:
        return {2: self.eps_like, 3: self.piezo_like, 4: self.C_full}[order]

    def atoms(self, index=None) -> list:
        """The structures as ase.Atoms (all, or those at ``index``)."""
        from pymatgen.io.ase import AseAtomsAdaptor

        idx = range(len(self)) if index is None else index
        return [AseAtomsAdaptor.get_atoms(self.structures[i]) for i in idx]


def load(out_dir: Path | str) -> CrystalTensorData:
    import pandas as pd
    from pymatgen.core import Structure

    out_dir = Path(out_dir)
    structures = [Structure.from_dict(d) for d in json.loads((out_dir / "structures.json").read_text())]
    z = np.load(out_dir / "tensors.npz")
    main = ("ids", "C_voigt", "C_full", "eps_like", "piezo_like")
    return CrystalTensorData(structures=structures, ids=z["ids"], C_voigt=z["C_voigt"], C_full=z["C_full"],
                             eps_like=z["eps_like"], piezo_like=z["piezo_like"],
                             table=pd.read_parquet(out_dir / "structures.parquet"),
                             extra={k: z[k] for k in z.files if k not in main})


def preview(out_dir: Path, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    out_dir = Path(out_dir)
    df = pd.read_parquet(out_dir / "structures.parquet")
    z = np.load(out_dir / "tensors.npz")
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    ax = axes[0]
    groups = (df.prototype if "prototype" in df else df.crystal_system).astype(str)
    base = groups.str.replace("-distorted", "", regex=False)
    colors = plt.get_cmap("tab10")
    for n, g in enumerate(sorted(base.unique())[:20]):
        for distorted, marker in ((False, "o"), (True, "x")):
            sel = (base == g) & (groups.str.endswith("-distorted") == distorted)
            if sel.any():
                ax.scatter(df.k_vrh[sel], df.g_vrh[sel], s=12, marker=marker, color=colors(n % 10),
                           label=f"{g}{' distorted' if distorted else ''} ({int(sel.sum())})")
    ax.set_xlabel("bulk modulus K_VRH (GPa)")
    ax.set_ylabel("shear modulus G_VRH (GPa)")
    ax.set_title(f"{title}: {len(df)} structures ({int(df.born_stable.sum())} Born-stable)", fontsize=9)
    ax.legend(fontsize=6, ncol=2, loc="upper left", framealpha=0.6)
    ax.grid(alpha=0.3)

    ax = axes[1]
    counts = df.crystal_system.value_counts()
    ax.bar(counts.index, counts.values)
    ax.set_title("crystal systems")
    ax.tick_params(axis="x", rotation=45)

    ax = axes[2]
    k = 0
    if "reduced_formula" in df and (df.reduced_formula == "Cu").any():
        cand = df.index[(df.reduced_formula == "Cu") & (df.crystal_system == "cubic")]
        k = int(cand[0]) if len(cand) else int(np.flatnonzero(df.reduced_formula == "Cu")[0])
    cv = z["C_voigt"][k]
    vmax = float(np.abs(cv).max()) or 1.0
    im = ax.imshow(cv, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    for (a, b), v in np.ndenumerate(cv):
        ax.text(b, a, f"{v:.0f}", ha="center", va="center", fontsize=6,
                color="white" if abs(v) > 0.6 * vmax else "black")
    ax.set_xticks(range(6), ["xx", "yy", "zz", "yz", "xz", "xy"], fontsize=7)
    ax.set_yticks(range(6), ["xx", "yy", "zz", "yz", "xz", "xy"], fontsize=7)
    ax.set_title(f"C_voigt (GPa) of {df.id[k]} {df.formula[k]} {df.spacegroup_symbol[k]}", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046)

    ax = axes[3]
    n2 = np.linalg.norm((z["eps_like"] - np.trace(z["eps_like"], axis1=1, axis2=2)[:, None, None] / 3
                         * np.eye(3)).reshape(len(df), -1), axis=1)
    n3 = np.linalg.norm(z["piezo_like"].reshape(len(df), -1), axis=1)
    cs = df.centrosymmetric.to_numpy(bool)
    ax.scatter(n2[cs], n3[cs], s=8, label="centrosymmetric")
    ax.scatter(n2[~cs], n3[~cs], s=8, label="non-centrosymmetric")
    ax.set_xlabel("|eps_like deviatoric|")
    ax.set_ylabel("|piezo_like|")
    ax.set_title("synthetic order-2 / order-3 targets")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, png, dpi=90)
