"""Vectorised re-implementations of ASE's EMT and Lennard-Jones calculators (same formulas).

``ase.calculators.emt.EMT`` and ``ase.calculators.lj.LennardJones`` loop over atoms in Python and
rebuild neighbour lists with ``ase.neighborlist`` (slow on this machine: ~0.3 s for 100 atoms);
these versions evaluate all pairs at once on a Verlet list (cutoff + skin, built with a k-d tree,
rebuilt only when an atom has moved more than skin/2 or the cell changed) and are 10-20x faster
on hundreds to thousands of atoms. Energies, forces and stress agree with ASE's calculators to
round-off (tests/test_md_data.py checks it). EMT uses ASE's default cutoff (``asap_cutoff=False``).
"""
from __future__ import annotations

from math import log, sqrt

import numpy as np

from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes


def neighbor_pairs(positions, cell, pbc, cutoff: float):
    """All ordered pairs (i, j, shift) with |x_j + shift - x_i| < cutoff, i != j or shift != 0.

    ``shift`` is a Cartesian lattice translation. Periodic directions are handled by wrapping the
    atoms into the cell and searching the needed periodic images with a k-d tree.
    """
    from scipy.spatial import cKDTree

    pos = np.asarray(positions, float)
    n = len(pos)
    pbc = np.asarray(pbc, bool)
    cell = np.asarray(cell, float)
    if n == 0:
        return np.zeros(0, int), np.zeros(0, int), np.zeros((0, 3))
    if not pbc.any():
        p = cKDTree(pos).query_pairs(cutoff, output_type="ndarray")
        i = np.concatenate([p[:, 0], p[:, 1]])
        j = np.concatenate([p[:, 1], p[:, 0]])
        return i, j, np.zeros((len(i), 3))
    frac = np.linalg.solve(cell.T, pos.T).T
    fl = np.where(pbc, np.floor(frac), 0.0)
    wrapped = pos - fl @ cell
    vol = abs(np.linalg.det(cell))
    heights = np.array([vol / np.linalg.norm(np.cross(cell[(k + 1) % 3], cell[(k + 2) % 3])) for k in range(3)])
    nrep = np.where(pbc, np.ceil(cutoff / heights).astype(int) + 1, 0)
    grids = np.meshgrid(*[np.arange(-m, m + 1) for m in nrep], indexing="ij")
    shifts = np.stack([g.ravel() for g in grids], axis=1).astype(float)  # (M, 3) integer triplets
    images = (wrapped[None, :, :] + (shifts @ cell)[:, None, :]).reshape(-1, 3)
    sdm = cKDTree(wrapped).sparse_distance_matrix(cKDTree(images), cutoff, output_type="ndarray")
    i = sdm["i"].astype(int)
    jj = sdm["j"].astype(int)
    j = jj % n
    s = shifts[jj // n]
    keep = ~((i == j) & (np.abs(s).sum(axis=1) == 0))
    i, j, s = i[keep], j[keep], s[keep]
    s = s - fl[j] + fl[i]  # back from wrapped to the given positions
    return i, j, s @ cell


class VerletList:
    """Pairs within ``cutoff``, from a list built at ``cutoff + skin`` and reused while no atom has
    moved more than skin/2 (and cell, pbc, atom count are unchanged)."""

    def __init__(self, cutoff: float, skin: float = 0.5):
        self.cutoff, self.skin = float(cutoff), float(skin)
        self._s = None
        self.builds = 0

    def pairs(self, atoms):
        pos = atoms.positions
        s = self._s
        if (s is None or s["n"] != len(atoms) or not np.array_equal(s["cell"], atoms.cell.array)
                or not np.array_equal(s["pbc"], atoms.pbc)
                or np.max(np.sum((pos - s["pos"]) ** 2, axis=1), initial=0.0) > (0.5 * self.skin) ** 2):
            i, j, shift = neighbor_pairs(pos, atoms.cell.array, atoms.pbc, self.cutoff + self.skin)
            s = self._s = {"i": i, "j": j, "shift": shift, "pos": pos.copy(), "cell": atoms.cell.array.copy(),
                           "pbc": atoms.pbc.copy(), "n": len(atoms)}
            self.builds += 1
        d = pos[s["j"]] + s["shift"] - pos[s["i"]]
        r = np.sqrt(np.einsum("ij,ij->i", d, d))
        m = r < self.cutoff
        return s["i"][m], s["j"][m], d[m], r[m]


class FastEMT(Calculator):
    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress"]
    nolabel = True
    default_parameters = {"skin": 0.5}

    def __init__(self, **kwargs):
        Calculator.__init__(self, **kwargs)
        self._nl = None

    # parameters exactly as ase.calculators.emt.EMT.initialize / _calc_cutoff / _calc_gammas
    def _setup(self, numbers):
        from ase.calculators.emt import beta, parameters
        from ase.data import chemical_symbols
        from ase.units import Bohr

        maxseq = max(p[1] for p in parameters.values()) * Bohr
        r1nn = beta * maxseq
        self.rc = r1nn * 0.5 * (sqrt(3.0) + 2.0)
        r4nn = r1nn * 2.0
        self.acut = log(1.0 / 1e-4 - 1.0) / (r4nn - self.rc)
        self.rc_list = self.rc + 0.5
        uniq, self.iz = np.unique(numbers, return_inverse=True)
        keys = ("E0", "s0", "V0", "eta2", "kappa", "lambda", "n0", "inv12gamma1", "neghalfv0overgamma2")
        par = {k: np.empty(len(uniq)) for k in keys}
        for i, z in enumerate(uniq):
            sym = chemical_symbols[z]
            if sym not in parameters:
                raise NotImplementedError(f"No EMT-potential for {sym}")
            p = parameters[sym]
            s0, eta2, kappa = p[1] * Bohr, p[3] / Bohr, p[4] / Bohr
            n = np.array([12, 6, 24])
            r = beta * s0 * np.sqrt([1.0, 2.0, 3.0])
            w = 1.0 / (1.0 + np.exp(self.acut * (r - self.rc)))
            x = n * w / 12.0
            g1 = x @ np.exp(-eta2 * (r - beta * s0))
            g2 = x @ np.exp(-kappa / beta * (r - beta * s0))
            par["E0"][i], par["s0"][i], par["V0"][i] = p[0], s0, p[2]
            par["eta2"][i], par["kappa"][i], par["lambda"][i] = eta2, kappa, p[5] / Bohr
            par["n0"][i] = p[6] / Bohr ** 3
            par["inv12gamma1"][i] = 1.0 / (12.0 * g1)
            par["neghalfv0overgamma2"][i] = -0.5 * p[2] / g2
        self.par = par
        self.chi = par["n0"][None, :] / par["n0"][:, None]
        self.beta = beta
        self._nl = None

    def _neighbors(self, atoms):
        if self._nl is None:
            self._nl = VerletList(self.rc_list, float(self.parameters["skin"]))
        return self._nl.pairs(atoms)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        Calculator.calculate(self, atoms, properties, system_changes)
        atoms = self.atoms
        if "numbers" in system_changes or not hasattr(self, "par"):
            self._setup(atoms.numbers)
        n = len(atoms)
        P, iz, beta = self.par, self.iz, self.beta
        a, b, d, r = self._neighbors(atoms)
        za, zb = iz[a], iz[b]
        w = 1.0 / (1.0 + np.exp(self.acut * (r - self.rc)))
        dwdroverw = self.acut * (w - 1.0)
        chi = self.chi[za, zb]
        s0a, s0b = P["s0"][za], P["s0"][zb]
        eta2a, eta2b = P["eta2"][za], P["eta2"][zb]
        kapa, kapb = P["kappa"][za], P["kappa"][zb]
        ds1s = np.exp(-eta2b * (r - beta * s0b)) * chi * w
        ds1o = np.exp(-eta2a * (r - beta * s0a)) / chi * w
        ds2s = np.exp(-kapb * (r / beta - s0b)) * chi * w
        ds2o = np.exp(-kapa * (r / beta - s0a)) / chi * w

        has = np.bincount(a, minlength=n) > 0
        sigma1 = np.bincount(a, weights=ds1s, minlength=n)
        energies = np.zeros(n)
        deds = np.zeros(n)
        h = has
        e0, v0, eta2, lmd, kap = (P[k][iz[h]] for k in ("E0", "V0", "eta2", "lambda", "kappa"))
        s = -np.log(sigma1[h] * P["inv12gamma1"][iz[h]]) / (beta * eta2)
        ls = lmd * s
        ex = np.exp(-ls)
        six = 6.0 * v0 * np.exp(-kap * s)
        energies[h] = e0 * (1.0 + ls) * ex + six
        deds[h] = (-e0 * lmd * ls * ex - kap * six) / (-beta * eta2 * sigma1[h])

        # E_c and second term of E_AS: forces
        g = (deds[a] * ds1s * (dwdroverw - eta2b) + deds[b] * ds1o * (dwdroverw - eta2a)) / r
        # first term of E_AS
        es = P["neghalfv0overgamma2"][za] * ds2s
        eo = P["neghalfv0overgamma2"][zb] * ds2o
        energies += 0.5 * np.bincount(a, weights=es + eo, minlength=n)
        g = g + (es * (dwdroverw - kapb / beta) + eo * (dwdroverw - kapa / beta)) / r
        f = g[:, None] * d
        forces = np.zeros((n, 3))
        for k in range(3):
            forces[:, k] = np.bincount(a, weights=f[:, k], minlength=n)
        energies -= P["E0"][iz]
        energy = float(np.add.reduce(energies))
        self.results["energy"] = self.results["free_energy"] = energy
        self.results["energies"] = energies
        self.results["forces"] = forces
        if atoms.cell.rank == 3:
            stress = 0.5 * d.T @ f
            stress = 0.5 * (stress + stress.T) / atoms.get_volume()
            self.results["stress"] = stress.flat[[0, 4, 8, 5, 2, 1]]
        elif "stress" in properties:
            raise PropertyNotImplementedError


class FastLJ(Calculator):
    """ase.calculators.lj.LennardJones (pairwise 4 eps [(s/r)^12 - (s/r)^6]), vectorised.

    ``smooth=True`` multiplies the pair energy by ASE's (JAX-MD) cutoff function between ro and rc
    (energy and forces continuous); ``smooth=False`` shifts it to zero at rc.
    """

    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress"]
    nolabel = True
    default_parameters = {"epsilon": 1.0, "sigma": 1.0, "rc": None, "ro": None, "smooth": False, "skin": 0.5}

    def __init__(self, **kwargs):
        Calculator.__init__(self, **kwargs)
        p = self.parameters
        if p.rc is None:
            p.rc = 3 * p.sigma
        if p.ro is None:
            p.ro = 0.66 * p.rc
        self._nl = VerletList(p.rc, p.skin)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        Calculator.calculate(self, atoms, properties, system_changes)
        atoms = self.atoms
        p = self.parameters
        sigma, eps, rc, ro = p.sigma, p.epsilon, p.rc, p.ro
        n = len(atoms)
        a, b, d, r = self._nl.pairs(atoms)
        r2 = r * r
        c6 = (sigma ** 2 / r2) ** 3
        c12 = c6 * c6
        e = 4 * eps * (c12 - c6)
        fpair = -24 * eps * (2 * c12 - c6) / r2
        if p.smooth:
            rc2, ro2 = rc * rc, ro * ro
            fc = np.where(r2 < ro2, 1.0, (rc2 - r2) ** 2 * (rc2 + 2 * r2 - 3 * ro2) / (rc2 - ro2) ** 3)
            dfc = np.where(r2 < ro2, 0.0, 6 * (rc2 - r2) * (ro2 - r2) / (rc2 - ro2) ** 3)
            fpair = fc * fpair + 2 * dfc * e
            e = e * fc
        else:
            e = e - 4 * eps * ((sigma / rc) ** 12 - (sigma / rc) ** 6)
        f = fpair[:, None] * d
        energies = 0.5 * np.bincount(a, weights=e, minlength=n)
        forces = np.zeros((n, 3))
        for k in range(3):
            forces[:, k] = np.bincount(a, weights=f[:, k], minlength=n)
        self.results["energy"] = self.results["free_energy"] = float(energies.sum())
        self.results["energies"] = energies
        self.results["forces"] = forces
        if atoms.cell.rank == 3:
            st = 0.5 * f.T @ d / atoms.get_volume()
            self.results["stress"] = st.flat[[0, 4, 8, 5, 2, 1]]
        elif "stress" in properties:
            raise PropertyNotImplementedError
