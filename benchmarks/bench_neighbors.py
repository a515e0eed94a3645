"""Neighbour lists: the kept ``blocks.atomistic.neighbors.neighbor_list`` against the alternatives, same run.

Every contender returns the same contract, (i, j, S, shifts) sorted by (i, j, S), and is checked
against ASE's ``neighbor_list`` (the oracle) as a set of (i, j, S) before it is timed. Contenders:

* ``kept``: ``neighbor_list`` (vesin's cell list with any periodic axis, scipy's k-d tree when open);
* ``ase``: ``ase.neighborlist.neighbor_list`` (the previous periodic path);
* ``vesin``: vesin for every structure, open ones included (is our k-d tree worth keeping?);
* ``kdtree``: the replaced ``fastgraphs.kdtree_neighbor_list`` (wrap, images, scipy k-d tree);
* ``dense``: the replaced ``dense_nl.dense_neighbor_list`` (one numpy broadcast over atom pairs x
  images), with the wrap it lacked; small cells only;
* ``matscipy``: matscipy's ``neighbour_list``, when installed (it is not a dependency).

Workloads are the project's: triforces' small alloy cells (4-8 atoms, cell below the cutoff), the
32- and 108-atom Cu cells of the SchNet family and gffmerge, an 864-atom cell, a slab, Pt clusters
(55 atoms as gffmerge's, and 405). Best of REPEATS interleaved rounds (the machine is shared: the
minimum is the least noisy), each timing a contender for ~TARGET_S; ratios are contender time / kept
time (> 1: the kept one is faster). One thread.

Writes benchmarks/results/neighbors.json. ``python -m benchmarks neighbors``.
"""
from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
from benchmarks import save_report

REPEATS = 5
TARGET_S = 0.1


def _sorted(i, j, S, cell, pbc):
    i, j, S = i.astype(np.int64), j.astype(np.int64), S.astype(np.int64).reshape(-1, 3)
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    i, j, S = i[order], j[order], S[order]
    return i, j, S, (S @ cell if np.any(pbc) else np.zeros((len(i), 3)))


def _atoms(pos, cell, pbc):
    from ase import Atoms

    return Atoms(numbers=np.ones(len(pos), int), positions=pos, cell=cell, pbc=pbc)


def ase_nl(pos, cutoff, cell, pbc):
    from ase.neighborlist import neighbor_list

    return _sorted(*neighbor_list("ijS", _atoms(pos, cell, pbc), cutoff, self_interaction=False), cell, pbc)


def matscipy_nl(pos, cutoff, cell, pbc):
    from matscipy.neighbours import neighbour_list

    return _sorted(*neighbour_list("ijS", _atoms(pos, cell, pbc), cutoff), cell, pbc)


def vesin_nl(pos, cutoff, cell, pbc):
    from vesin import NeighborList

    i, j, S = NeighborList(cutoff=cutoff, full_list=True).compute(points=pos, box=cell, periodic=pbc,
                                                                  quantities="ijS")
    return _sorted(i, j, S, cell, pbc)


def _wrap(pos, cutoff, cell, pbc):
    """Positions wrapped into the cell along periodic axes, the wrap, and the images in range."""
    reps, wrap = [0, 0, 0], np.zeros((len(pos), 3), np.int64)
    if np.any(pbc):
        inv = np.linalg.inv(cell)
        frac = pos @ inv
        for k in range(3):
            if pbc[k]:
                wrap[:, k] = np.floor(frac[:, k]).astype(np.int64)
                reps[k] = int(np.ceil(cutoff * np.linalg.norm(inv[:, k])))
        pos = pos - wrap @ cell
    images = np.array(list(itertools.product(*[range(-r, r + 1) for r in reps])), dtype=np.int64)
    return pos, wrap, images


def kdtree_nl(pos, cutoff, cell, pbc):
    from scipy.spatial import cKDTree

    n = len(pos)
    pos, wrap, images = _wrap(pos, cutoff, cell, pbc)
    img_pos = (pos[None, :, :] + (images @ cell)[:, None, :]).reshape(-1, 3)
    pairs = cKDTree(pos).sparse_distance_matrix(cKDTree(img_pos), cutoff, output_type="ndarray")
    i = pairs["i"].astype(np.int64)
    s_idx, j = np.divmod(pairs["j"].astype(np.int64), n)
    S = images[s_idx] - wrap[j] + wrap[i]
    keep = (pairs["v"] < cutoff) & ~((i == j) & ~S.any(axis=1))
    return _sorted(i[keep], j[keep], S[keep], cell, pbc)


def dense_nl(pos, cutoff, cell, pbc):
    n = len(pos)
    pos, wrap, images = _wrap(pos, cutoff, cell, pbc)
    d = pos[None, :, None, :] - pos[:, None, None, :] + (images @ cell)[None, None]  # d[i, j, s]
    mask = np.einsum("ijsk,ijsk->ijs", d, d) < cutoff * cutoff
    zero = int(np.flatnonzero((images == 0).all(1))[0])
    mask[np.arange(n), np.arange(n), zero] = False
    i, j, s = np.nonzero(mask)
    return _sorted(i, j, images[s] - wrap[j] + wrap[i], cell, pbc)


def workloads():
    from ase.build import bulk, fcc111
    from ase.cluster import Octahedron

    def rattled(a, seed=1):
        a.rattle(0.05, seed=seed)
        return a

    yield "bcc Cu 4 atoms, cutoff 4 (triforces)", rattled(bulk("Cu", "bcc", a=2.95, cubic=True).repeat((2, 1, 1))), 4.0
    yield "hcp Cu 8 atoms, cutoff 4 (triforces)", rattled(bulk("Cu", "hcp", a=2.6, c=4.25,
                                                               orthorhombic=True).repeat((2, 1, 1))), 4.0
    yield "fcc Cu 32 atoms, cutoff 5", rattled(bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))), 5.0
    yield "fcc Cu 108 atoms, cutoff 4 (gffmerge)", rattled(bulk("Cu", "fcc", a=3.61, cubic=True).repeat((3, 3, 3))), 4.0
    yield "fcc Cu 864 atoms, cutoff 5", rattled(bulk("Cu", "fcc", a=3.61, cubic=True).repeat((6, 6, 6))), 5.0
    slab = fcc111("Cu", size=(4, 4, 4), vacuum=6.0)
    yield "Cu(111) slab 64 atoms (pbc T,T,F), cutoff 5", rattled(slab), 5.0
    for length, cut in ((5, 2), (9, 3)):
        a = Octahedron("Pt", length=length, cutoff=cut)
        a.center(vacuum=5.0)
        a.pbc = False
        yield f"Pt{len(a)} cluster (open), cutoff 4", rattled(a), 4.0


def _time(fn):
    fn()  # warm-up
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= TARGET_S:
            return dt / n


def main() -> dict:
    from reprozoo.blocks.atomistic.neighbors import neighbor_list

    contenders = {"kept": neighbor_list, "ase": ase_nl, "vesin": vesin_nl, "kdtree": kdtree_nl, "dense": dense_nl}
    try:
        import matscipy.neighbours  # noqa: F401

        contenders["matscipy"] = matscipy_nl
    except ImportError:
        print("matscipy not installed: left out", flush=True)
    report = {"repeats": REPEATS, "target_s": TARGET_S, "threads": 1, "results": {}}
    for name, atoms, cutoff in workloads():
        pos, cell, pbc = atoms.positions, np.asarray(atoms.cell.array), np.asarray(atoms.pbc)
        ref = ase_nl(pos, cutoff, cell, pbc)
        ref_set = set(zip(ref[0].tolist(), ref[1].tolist(), map(tuple, ref[2].tolist())))
        row = {"n_atoms": len(pos), "pbc": pbc.tolist(), "cutoff": cutoff, "n_pairs": len(ref[0]), "ms": {},
               "agrees_with_ase": {}}
        use = {k: f for k, f in contenders.items() if not (k == "dense" and len(pos) > 128)}
        for k, f in use.items():
            out = f(pos, cutoff, cell, pbc)
            row["agrees_with_ase"][k] = (len(out[0]) == len(ref[0]) and ref_set == set(
                zip(out[0].tolist(), out[1].tolist(), map(tuple, out[2].tolist()))))
        runs = {k: [] for k in use}
        for _ in range(REPEATS):  # interleaved rounds
            for k, f in use.items():
                runs[k].append(_time(lambda: f(pos, cutoff, cell, pbc)))
        row["ms"] = {k: 1e3 * float(np.min(v)) for k, v in runs.items()}
        row["ratio_to_kept"] = {k: round(v / row["ms"]["kept"], 2) for k, v in row["ms"].items()}
        report["results"][name] = row
        print(f"{name}: {len(pos)} atoms, {len(ref[0])} pairs, kept {row['ms']['kept']:.3f} ms; "
              + ", ".join(f"{k} x{r}" + ("" if row["agrees_with_ase"][k] else " (WRONG)")
                          for k, r in row["ratio_to_kept"].items() if k != "kept"), flush=True)
    return save_report("neighbors", report)


if __name__ == "__main__":
    main()
