"""Offline stand-ins for the sGDML molecules: same molecule (atoms, bonds), classical force field.

The real MD17 / rMD17 / MD22 trajectories are DFT (or CCSD(T)) data that cannot be generated
offline. So that every dataset has an offline default, this module builds the molecule from
standard internal coordinates (aspirin C9H8O4, 21 atoms; Ac-Ala3-NHMe C12H22N4O4, 42 atoms) and
runs Langevin MD at the MD17 temperature (500 K) on a simple valence force field whose minimum is
the built geometry:

    E = sum_bonds D (1 - exp(-a (r - r0)))^2                       (Morse, k = 2 D a^2)
      + sum_angles k_theta / 2 (cos theta - cos theta0)^2
      + sum_1-4 pairs k_14 / 2 (r - r0)^2                            (keeps torsions near the start)

Forces are analytic (tests check them against finite differences). The surrogate has the
molecule's composition and topology, not its quantum-chemical energy surface: results on it are
plumbing checks, never numbers to compare with papers (the card says ``surrogate: true``).
"""
from __future__ import annotations

import numpy as np

from ase.calculators.calculator import Calculator, all_changes

# --- geometry --------------------------------------------------------------------------------


def _unit(v):
    return v / np.linalg.norm(v)


def _place(a, b, c, bond: float, angle_deg: float, torsion_deg: float) -> np.ndarray:
    """NeRF: the atom d bonded to c with |cd| = bond, angle bcd, torsion abcd."""
    th, ph = np.radians(angle_deg), np.radians(torsion_deg)
    bc = _unit(c - b)
    n = _unit(np.cross(b - a, bc))
    m = np.cross(n, bc)
    d2 = np.array([-bond * np.cos(th), bond * np.sin(th) * np.cos(ph), bond * np.sin(th) * np.sin(ph)])
    return c + d2[0] * bc + d2[1] * m + d2[2] * n


class _Builder:
    def __init__(self):
        self.sym: list[str] = []
        self.pos: list[np.ndarray] = []
        self.bonds: list[tuple[int, int]] = []

    def add(self, sym: str, xyz, bonded_to: int | None = None) -> int:
        self.sym.append(sym)
        self.pos.append(np.asarray(xyz, float))
        k = len(self.sym) - 1
        if bonded_to is not None:
            self.bonds.append((bonded_to, k))
        return k

    def z(self, sym, a, b, c, bond, angle, torsion) -> int:
        return self.add(sym, _place(self.pos[a], self.pos[b], self.pos[c], bond, angle, torsion), bonded_to=c)

    def trigonal(self, sym, center, n1, n2, bond) -> int:
        """Planar sp2 substituent opposite the bisector of two neighbours."""
        c = self.pos[center]
        d = -(_unit(self.pos[n1] - c) + _unit(self.pos[n2] - c))
        return self.add(sym, c + bond * _unit(d), bonded_to=center)

    def tetrahedral(self, center, n1, n2, bonds_syms, sign=1.0) -> list[int]:
        """The two remaining sp3 substituents of a centre with two known neighbours."""
        c = self.pos[center]
        u, v = _unit(self.pos[n1] - c), _unit(self.pos[n2] - c)
        d = _unit(-(u + v))
        n = _unit(np.cross(u, v))
        half = np.radians(109.47 / 2)
        out = []
        for s, (sym, bond) in zip((sign, -sign), bonds_syms):
            out.append(self.add(sym, c + bond * _unit(np.cos(half) * d + np.sin(half) * s * n), bonded_to=center))
        return out

    def methyl(self, a, b, c, bond=1.09):
        return [self.z("H", a, b, c, bond, 109.47, t) for t in (60.0, 180.0, 300.0)]


def aspirin():
    """Acetylsalicylic acid C9H8O4 (21 atoms): symbols, positions (A), bonds."""
    m = _Builder()
    ring = [m.add("C", 1.39 * np.array([np.cos(t), np.sin(t), 0.0])) for t in np.radians(np.arange(0, 360, 60))]
    m.bonds += [(ring[k], ring[(k + 1) % 6]) for k in range(6)]
    rad = lambda k, bond: m.pos[ring[k]] * (1 + bond / 1.39)  # noqa: E731
    c7 = m.add("C", rad(0, 1.49), bonded_to=ring[0])            # carboxyl carbon
    o9 = m.add("O", rad(1, 1.40), bonded_to=ring[1])            # ester oxygen
    m.z("O", ring[1], ring[0], c7, 1.21, 123.0, 180.0)          # C=O, away from the ester
    o8 = m.z("O", ring[1], ring[0], c7, 1.33, 113.0, 0.0)       # O-H
    m.z("H", ring[0], c7, o8, 0.97, 107.0, 180.0)
    c10 = m.z("C", ring[0], ring[1], o9, 1.36, 118.0, 90.0)     # acetyl carbonyl, out of the ring plane
    m.z("O", ring[1], o9, c10, 1.20, 123.0, 0.0)
    c12 = m.z("C", ring[1], o9, c10, 1.50, 110.0, 180.0)
    m.methyl(o9, c10, c12)
    for k in (2, 3, 4, 5):
        m.add("H", rad(k, 1.08), bonded_to=ring[k])
    return m.sym, np.array(m.pos), m.bonds


def ac_ala3_nhme(phi: float = -75.0, psi: float = 145.0):
    """Ac-Ala3-NHMe C12H22N4O4 (42 atoms), built as a polyproline-II-like chain."""
    m = _Builder()
    cm0 = m.add("C", [0.0, 0.0, 0.0])
    c0 = m.add("C", [1.52, 0.0, 0.0], bonded_to=cm0)
    n = m.add("N", _place(np.array([0.0, 1.0, 0.0]), m.pos[cm0], m.pos[c0], 1.33, 116.0, 180.0), bonded_to=c0)
    prev_c, prev_prev = c0, cm0
    cas, cs = [], []
    for k in range(3):
        ca = m.z("C", prev_prev, prev_c, n, 1.46, 122.0, 180.0)                  # omega
        c = m.z("C", prev_c, n, ca, 1.52, 111.0, phi)                            # phi
        nxt = m.z("N", n, ca, c, 1.33, 116.0, psi)                               # psi
        cas.append((n, ca, c))
        cs.append(c)
        prev_prev, prev_c, n = ca, c, nxt
    cm4 = m.z("C", prev_prev, prev_c, n, 1.46, 122.0, 180.0)
    # carbonyl oxygens and amide hydrogens (planar), C-alpha substituents, methyls
    m.trigonal("O", c0, cm0, cas[0][0], 1.23)
    for k, (nk, ca, c) in enumerate(cas):
        nn = cas[k + 1][0] if k + 1 < 3 else n
        m.trigonal("O", c, ca, nn, 1.23)
        prevc = c0 if k == 0 else cas[k - 1][2]
        m.trigonal("H", nk, prevc, ca, 1.01)
        ha, cb = m.tetrahedral(ca, nk, c, [("H", 1.09), ("C", 1.53)], sign=-1.0)
        m.methyl(nk, ca, cb)
    m.trigonal("H", n, cs[-1], cm4, 1.01)
    m.methyl(cs[-1], n, cm4)
    m.methyl(cas[0][0], c0, cm0)
    return m.sym, np.array(m.pos), m.bonds


MOLECULES = {"aspirin": aspirin, "ac_ala3_nhme": ac_ala3_nhme}


# --- topology and force field ----------------------------------------------------------------

def topology(n: int, bonds):
    """Angles (i, j, k; j central) and 1-4 pairs from a bond list."""
    nb = [set() for _ in range(n)]
    for i, j in bonds:
        nb[i].add(j)
        nb[j].add(i)
    angles = [(i, j, k) for j in range(n) for i in nb[j] for k in nb[j] if i < k]
    excl = {tuple(sorted(b)) for b in bonds} | {tuple(sorted((i, k))) for i, _, k in angles}
    pairs14 = set()
    for i, j in bonds:
        for a in nb[i] - {j}:
            for b in nb[j] - {i}:
                p = tuple(sorted((a, b)))
                if a != b and p not in excl:
                    pairs14.add(p)
    return np.array(angles, int).reshape(-1, 3), np.array(sorted(pairs14), int).reshape(-1, 2)


class ValenceFF(Calculator):
    """Morse bonds + cosine-harmonic angles + harmonic 1-4 distances, minimum at ``ref``."""

    implemented_properties = ["energy", "free_energy", "forces"]
    nolabel = True
    default_parameters = {"D": 4.0, "k_bond": 30.0, "k_angle": 8.0, "k_14": 1.0}

    def __init__(self, ref_positions, bonds, **kwargs):
        Calculator.__init__(self, **kwargs)
        ref = np.asarray(ref_positions, float)
        self.bonds = np.asarray(bonds, int).reshape(-1, 2)
        self.angles, self.pairs14 = topology(len(ref), self.bonds)
        self.r0 = self._dist(ref, self.bonds)
        self.c0 = self._cos(ref, self.angles)[0]
        self.r14 = self._dist(ref, self.pairs14)

    @staticmethod
    def _dist(x, pairs):
        return np.linalg.norm(x[pairs[:, 1]] - x[pairs[:, 0]], axis=1)

    @staticmethod
    def _cos(x, ang):
        a = x[ang[:, 0]] - x[ang[:, 1]]
        b = x[ang[:, 2]] - x[ang[:, 1]]
        la, lb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
        c = np.einsum("ij,ij->i", a, b) / (la * lb)
        return c, a, b, la, lb

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        Calculator.calculate(self, atoms, properties, system_changes)
        x = self.atoms.positions
        p = self.parameters
        F = np.zeros_like(x)
        # Morse bonds
        i, j = self.bonds[:, 0], self.bonds[:, 1]
        d = x[j] - x[i]
        r = np.linalg.norm(d, axis=1)
        alpha = np.sqrt(p.k_bond / (2 * p.D))
        ex = np.exp(-alpha * (r - self.r0))
        e = np.sum(p.D * (1 - ex) ** 2)
        dEdr = 2 * p.D * alpha * ex * (1 - ex)
        g = (dEdr / r)[:, None] * d  # dE/dx_j
        np.add.at(F, j, -g)
        np.add.at(F, i, g)
        # angles
        if len(self.angles):
            c, a, b, la, lb = self._cos(x, self.angles)
            e += np.sum(0.5 * p.k_angle * (c - self.c0) ** 2)
            dEdc = p.k_angle * (c - self.c0)
            dca = b / (la * lb)[:, None] - (c / la ** 2)[:, None] * a
            dcb = a / (la * lb)[:, None] - (c / lb ** 2)[:, None] * b
            fi = -dEdc[:, None] * dca
            fk = -dEdc[:, None] * dcb
            np.add.at(F, self.angles[:, 0], fi)
            np.add.at(F, self.angles[:, 2], fk)
            np.add.at(F, self.angles[:, 1], -(fi + fk))
        # 1-4 distances
        if len(self.pairs14):
            i, j = self.pairs14[:, 0], self.pairs14[:, 1]
            d = x[j] - x[i]
            r = np.linalg.norm(d, axis=1)
            e += np.sum(0.5 * p.k_14 * (r - self.r14) ** 2)
            g = (p.k_14 * (r - self.r14) / r)[:, None] * d
            np.add.at(F, j, -g)
            np.add.at(F, i, g)
        self.results["energy"] = self.results["free_energy"] = float(e)
        self.results["forces"] = F


def molecule(name: str):
    """(ase.Atoms, bonds) of a surrogate molecule, centred at the origin."""
    from ase import Atoms

    sym, pos, bonds = MOLECULES[name]()
    atoms = Atoms(symbols=sym, positions=pos - pos.mean(axis=0))
    return atoms, bonds


def simulate(name: str, n_frames: int, stride: int, temperature_K: float, timestep_fs: float,
             friction_per_fs: float, equilibrate: int, rng: np.random.Generator):
    """Langevin MD of the surrogate; returns the frames as an sGDML-style dict in eV / Angstrom."""
    from ase import units
    from ase.constraints import FixCom
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, ZeroRotation, thermalize_momenta

    atoms, bonds = molecule(name)
    atoms.calc = ValenceFF(atoms.positions, bonds)
    atoms.set_constraint(FixCom())
    thermalize_momenta(atoms, temperature_K=temperature_K, rng=rng)
    Stationary(atoms)
    ZeroRotation(atoms)
    dyn = Langevin(atoms, timestep_fs * units.fs, temperature_K=temperature_K,
                   friction=friction_per_fs / units.fs, fixcm=False, rng=rng)
    dyn.run(equilibrate)
    R, E, Fs, T = [], [], [], []
    for _ in range(n_frames):
        dyn.run(stride)
        R.append(atoms.positions.copy())
        E.append(atoms.get_potential_energy())
        Fs.append(atoms.get_forces(apply_constraint=False).copy())
        T.append(atoms.get_temperature())
    return {"R": np.array(R), "z": atoms.numbers.copy(), "E": np.array(E), "F": np.array(Fs),
            "T": np.array(T), "bonds": np.asarray(bonds, int)}
