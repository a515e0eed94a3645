"""Neighbour lists (radius graphs) with and without periodic boundaries.

Convention used by every atomistic block (same as ASE's ``neighbor_list('ijS')``):

* ``edge_index`` is a (2, E) int64 array/tensor; row 0 is ``i`` (the centre atom, which *receives*
  the message), row 1 is ``j`` (the neighbour, which *sends* it);
* ``shifts`` is (E, 3) in Cartesian units, so that the edge vector is
  ``r_ij = positions[j] - positions[i] + shifts`` (``shifts = S @ cell`` with integer image
  offsets ``S``). Without periodic boundaries the shifts are zero;
* the list is "full" (both i->j and j->i are present) and sorted by ``i`` then ``j``, so it is
  already destination-sorted; :func:`csr_rowptr` turns it into CSR row pointers.

Functions
---------
``neighbor_list(positions, cutoff, cell=None, pbc=False)`` -> (i, j, S, shifts) numpy, any structure
(ASE's O(N) cell-list algorithm with periodic boundaries, scipy's k-d tree without).
``brute_force_neighbor_list(positions, cutoff, cell, pbc)`` -> same, O(N^2 * images); for tests.
``radius_graph(positions, batch, cutoff)`` -> edge_index (torch): non-periodic structures in a batch,
brute force per structure on the positions' device (MD of clusters / CG chains, many replicas).
``batch_graphs(graphs)`` concatenates per-structure (i, j, shifts) with index offsets.
``csr_rowptr(index, n)`` row pointers of a sorted index; ``sort_edges(edge_index, shifts, by=0)``.
"""
from __future__ import annotations

import itertools

import numpy as np


def _atoms(positions, cell, pbc, numbers=None):
    from ase import Atoms

    positions = np.asarray(positions, dtype=float)
    n = len(positions)
    cell = np.zeros((3, 3)) if cell is None else np.asarray(cell, dtype=float)
    pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    return Atoms(numbers=np.ones(n, int) if numbers is None else numbers, positions=positions, cell=cell,
                 pbc=pbc)


def neighbor_list(positions, cutoff: float, cell=None, pbc=False):
    """Full neighbour list within ``cutoff`` (periodic: ASE's O(N) binning; open: scipy k-d tree).

    Returns ``(i, j, S, shifts)``: int64 (E,), int64 (E,), int64 (E, 3) image offsets and float (E, 3)
    Cartesian shifts, sorted by (i, j) (ties in j by image offset). No self pair (i, i, S=0), but
    periodic self images (i, i, S != 0) within the cutoff are included.
    """
    from ase.neighborlist import neighbor_list as ase_nl

    positions = np.asarray(positions, dtype=float)
    pbc_arr = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    if len(positions) == 0:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros((0, 3), np.int64), np.zeros((0, 3))
    if not pbc_arr.any():  # open boundaries: k-d tree (scipy), O(N log N)
        from scipy.spatial import cKDTree

        pairs = cKDTree(positions).query_pairs(float(cutoff), output_type="ndarray").astype(np.int64)
        i = np.concatenate([pairs[:, 0], pairs[:, 1]])
        j = np.concatenate([pairs[:, 1], pairs[:, 0]])
        order = np.lexsort((j, i))
        i, j = i[order], j[order]
        return i, j, np.zeros((len(i), 3), np.int64), np.zeros((len(i), 3))
    atoms = _atoms(positions, cell, pbc)
    i, j, S = ase_nl("ijS", atoms, float(cutoff), self_interaction=False)
    S = S.astype(np.int64)
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    i, j, S = i[order].astype(np.int64), j[order].astype(np.int64), S[order]
    return i, j, S, S @ np.asarray(atoms.cell.array, dtype=float)


def brute_force_neighbor_list(positions, cutoff: float, cell=None, pbc=False):
    """Reference O(N^2 x images) neighbour list, same output and ordering as :func:`neighbor_list`.

    Image range per periodic axis: enough repeats that any image within ``cutoff`` is found
    (``ceil(cutoff / d_k)`` where d_k is the distance between lattice planes of axis k).
    """
    positions = np.asarray(positions, dtype=float)
    pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    cell = np.zeros((3, 3)) if cell is None else np.asarray(cell, dtype=float)
    reps = [0, 0, 0]
    if pbc.any():
        inv = np.linalg.inv(cell)
        for k in range(3):
            if pbc[k]:
                plane_dist = 1.0 / np.linalg.norm(inv[:, k])
                reps[k] = int(np.ceil(cutoff / plane_dist))
    images = np.array(list(itertools.product(*[range(-r, r + 1) for r in reps])), dtype=np.int64)
    out_i, out_j, out_S = [], [], []
    for S in images:
        shift = S @ cell
        d = positions[None, :, :] - positions[:, None, :] + shift  # d[i, j] = r_j - r_i + shift
        dist = np.linalg.norm(d, axis=-1)
        mask = dist < cutoff
        if not S.any():
            np.fill_diagonal(mask, False)
        ii, jj = np.nonzero(mask)
        out_i.append(ii), out_j.append(jj), out_S.append(np.repeat(S[None], len(ii), axis=0))
    i, j, S = np.concatenate(out_i), np.concatenate(out_j), np.concatenate(out_S).reshape(-1, 3)
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    i, j, S = i[order].astype(np.int64), j[order].astype(np.int64), S[order]
    return i, j, S, (S @ cell if pbc.any() else np.zeros((len(i), 3)))


def batch_graphs(graphs, n_atoms):
    """Concatenate per-structure graphs [(i, j, shifts), ...] into one batch graph.

    ``n_atoms`` is the atom count of every structure (for the index offsets). Returns numpy
    ``edge_index`` (2, E) int64 and ``shifts`` (E, 3).
    """
    offsets = np.concatenate([[0], np.cumsum(n_atoms)[:-1]]).astype(np.int64)
    ei = [np.stack([g[0] + o, g[1] + o]) for g, o in zip(graphs, offsets)]
    sh = [np.asarray(g[2], dtype=float).reshape(-1, 3) for g in graphs]
    if not ei:
        return np.zeros((2, 0), np.int64), np.zeros((0, 3))
    return np.concatenate(ei, axis=1), np.concatenate(sh, axis=0)


def radius_graph(positions, batch, cutoff: float, max_block: int = 4096):
    """Full radius graph of non-periodic structures (torch, brute force per structure, no grad).

    ``positions`` (N, 3), ``batch`` (N,) structure index (atoms of a structure contiguous and
    structures in increasing order). Returns ``edge_index`` (2, E) on the positions' device,
    sorted by (i, j). Structures of the same size are processed together (replicas of one
    molecule: one batched cdist); ``max_block`` bounds rows per cdist call.
    """
    import torch

    with torch.no_grad():
        counts = torch.bincount(batch).tolist() if len(batch) else []
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int) if counts else []
        edges = []
        # group consecutive structures of equal size
        k = 0
        while k < len(counts):
            n = counts[k]
            m = k
            while m < len(counts) and counts[m] == n:
                m += 1
            per_block = max(1, max_block // max(n, 1))
            for b0 in range(k, m, per_block):
                b1 = min(m, b0 + per_block)
                s0 = int(starts[b0])
                pos = positions[s0:s0 + (b1 - b0) * n].detach().reshape(b1 - b0, n, 3)
                d = torch.cdist(pos, pos)
                mask = d < cutoff
                mask &= ~torch.eye(n, dtype=torch.bool, device=positions.device)
                bb, ii, jj = torch.nonzero(mask, as_tuple=True)
                off = s0 + bb * n
                edges.append(torch.stack([ii + off, jj + off]))
            k = m
        if not edges:
            return torch.zeros(2, 0, dtype=torch.long, device=positions.device)
        return torch.cat(edges, dim=1)


def sort_edges(edge_index, shifts=None, by: int = 0):
    """Sort edges by row ``by`` (0: centre i = destination, 1: neighbour j = source), stable in the other.

    Returns ``(edge_index, shifts, perm)``. Works on numpy arrays and torch tensors.
    """
    if isinstance(edge_index, np.ndarray):
        perm = np.lexsort((edge_index[1 - by], edge_index[by]))
        return edge_index[:, perm], (None if shifts is None else shifts[perm]), perm
    import torch

    n = int(edge_index.max()) + 1 if edge_index.numel() else 1
    key = edge_index[by] * n + edge_index[1 - by]
    perm = torch.argsort(key, stable=True)
    return edge_index[:, perm], (None if shifts is None else shifts[perm]), perm


def csr_rowptr(index, n: int):
    """Row pointers (n + 1,) of a sorted index vector: rows r's entries are ``rowptr[r]:rowptr[r+1]``."""
    if isinstance(index, np.ndarray):
        counts = np.bincount(index, minlength=n)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    import torch

    counts = torch.bincount(index, minlength=n)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
