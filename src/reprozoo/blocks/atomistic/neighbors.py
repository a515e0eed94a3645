"""Neighbour lists (radius graphs) with and without periodic boundaries: the ONE neighbour list.

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
``neighbor_list(positions, cutoff, cell=None, pbc=False)`` -> (i, j, S, shifts) numpy, any structure:
positions anywhere (not wrapped into the cell), cells smaller than the cutoff, skewed or left-handed
cells, any mix of periodic axes. Pairs and image offsets are those of ASE's ``neighbor_list`` (the
tests' oracle). Any periodic axis: vesin's cell list (C++); open boundaries: scipy's k-d tree
(faster than vesin there). ``benchmarks/bench_neighbors.py`` measures both against ASE, matscipy and
the k-d tree / dense broadcasts this module replaced.
``radius_graph(positions, batch, cutoff)`` -> edge_index (torch): non-periodic structures in a batch,
brute force per structure on the positions' device (MD of clusters / CG chains, many replicas).
``batch_graphs(graphs)`` concatenates per-structure (i, j, shifts) with index offsets.
``csr_rowptr(index, n)`` row pointers of a sorted index; ``sort_edges(edge_index, shifts, by=0)``.
"""
from __future__ import annotations

import numpy as np


def _sorted(i, j, S, n: int):
    """(i, j, S) as int64, ordered by i, then j, then image offset S (lexicographic)."""
    i, j, S = i.astype(np.int64), j.astype(np.int64), S.astype(np.int64).reshape(-1, 3)
    if len(i) >= 1000:  # one int64 key: about twice as fast as a 5-key lexsort (slower for short lists)
        lo = S.min(axis=0)
        span = S.max(axis=0) - lo + 1
        if float(n) * n * float(np.prod(span)) < 2.0 ** 62:
            s = S - lo
            key = (((i * n + j) * span[0] + s[:, 0]) * span[1] + s[:, 1]) * span[2] + s[:, 2]
            order = np.argsort(key)  # keys are unique: the order is deterministic
            return i[order], j[order], S[order]
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    return i[order], j[order], S[order]


def neighbor_list(positions, cutoff: float, cell=None, pbc=False):
    """Full neighbour list within ``cutoff`` (distance strictly below it, as ASE).

    Returns ``(i, j, S, shifts)``: int64 (E,), int64 (E,), int64 (E, 3) image offsets and float (E, 3)
    Cartesian shifts ``S @ cell``, sorted by (i, j), ties in j by image offset. No self pair
    (i, i, S=0), but periodic self images (i, i, S != 0) within the cutoff are included. ``cell``
    rows are the lattice vectors (zero rows allowed along non-periodic axes); ``pbc`` a bool or 3.
    """
    positions = np.ascontiguousarray(positions, dtype=np.float64).reshape(-1, 3)
    pbc = np.array(np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)))
    cutoff = float(cutoff)
    n = len(positions)
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros((0, 3), np.int64), np.zeros((0, 3))
    if not pbc.any():  # open boundaries: k-d tree (scipy), O(N log N)
        from scipy.spatial import cKDTree

        pairs = cKDTree(positions).query_pairs(cutoff, output_type="ndarray").astype(np.int64)
        d = np.linalg.norm(positions[pairs[:, 1]] - positions[pairs[:, 0]], axis=1)
        pairs = pairs[d < cutoff]  # query_pairs keeps d == cutoff
        i = np.concatenate([pairs[:, 0], pairs[:, 1]])
        j = np.concatenate([pairs[:, 1], pairs[:, 0]])
        order = np.argsort(i * n + j)
        return i[order], j[order], np.zeros((len(i), 3), np.int64), np.zeros((len(i), 3))
    from vesin import NeighborList

    cell = np.ascontiguousarray(cell, dtype=np.float64).reshape(3, 3)
    i, j, S = NeighborList(cutoff=cutoff, full_list=True).compute(points=positions, box=cell, periodic=pbc,
                                                                  quantities="ijS", copy=True)
    i, j, S = _sorted(i, j, S, n)
    return i, j, S, S @ cell


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
