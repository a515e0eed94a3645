"""Dilated star-structured graphs: one sparse star per atom and distance shell, one shell per layer.

Added for DKMP (dilated star-structured message passing); generic: any SchNet-family model can
take per-layer graphs this way.

Definitions
-----------
A *shell* is a distance interval ``[r_in, r_out)`` with a leaf budget ``k`` (``None``: every atom
in the shell). For atom ``i`` and shell ``s``, let ``N_s(i)`` be the atoms ``j`` with
``r_in <= |r_ij| < r_out`` sorted by distance (ties by index), ``n = |N_s(i)|``. The *star*
``S_s(i)`` is the edge set ``{(i, j): j in P_s(i)}`` (``i`` receives) where the picked leaves are

* ``dilated`` (default): ``n <= k``: all of ``N_s(i)``; else the ranks ``floor((m + 1/2) n / k)``,
  ``m = 0..k-1``: k leaves at an even rank dilation ``n / k`` across the whole shell (dilated
  k-NN restricted to a distance shell, so the picks span the shell's radial range);
* ``nearest``: the ``k`` nearest atoms of the shell;
* ``angular``: farthest-point sampling of the unit directions, starting from the nearest atom
  (k leaves spread over the sphere).

A *dilated star graph* over shells ``s_1 .. s_L`` (disjoint, contiguous from 0: ``[0, r_1),
[r_1, r_2), ...``) is the union of the stars; layer ``l`` of :class:`DilatedSchNet` passes messages
only along the edges whose length lies in shell ``l``. The union of the shells is ``[0, r_L)``, the
receptive radius of a dense radius graph with cutoff ``r_L``; a dense model is the special case of
one shell ``[0, r_c)`` with ``k = None`` repeated in every layer (the same radius graph per layer).

Graphs are directed (i's star need not contain j's reverse edge) and sorted by (i, j).
Edge weights: each layer multiplies its filters by a smooth window that is 1 inside its shell and
falls to 0 at both boundaries over ``width`` (cosine ramps), so an atom crossing a shell boundary
enters/leaves with zero weight. Picking leaves by rank is not smooth: when two atoms of a shell
swap rank the picked set changes and the energy jumps (as for any k-NN graph); forces are still
exactly -dE/dx of the model between such events.

API
---
``Shell(r_in, r_out, k=None)``; ``parse_shells(list_of_dicts_or_tuples)``.
``star_graph(positions, shells, cell=None, pbc=False, mode='dilated') -> (i, j, shifts, shell_id)``.
``select_star_edges(i, j, vec, dist, shells, mode) -> keep mask`` (the selection alone).
``edges_per_shell(i, shell_id, n_atoms, n_shells) -> (n_shells,) edges per atom``.
``shell_window(d, r_in, r_out, width)`` (torch).
``StarGraphData(frames, layer_shells, mode, device=None)``: an :class:`AtomsData` whose cached
per-frame graph is the dilated star graph (``collate``/``batches``/``fit``/``evaluate`` work
unchanged; batches are moved to ``device``); ``messages_per_layer(k)``.
``DilatedSchNet(layer_shells, window_width, **schnet_kwargs)``: SchNet whose interaction ``l``
uses the edges of shell ``l`` only (same blocks, basis, head and training as SchNet).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .data import AtomsData
from .neighbors import neighbor_list
from .schnet import SchNet, edge_vectors

MODES = ("dilated", "nearest", "angular")


@dataclass(frozen=True)
class Shell:
    r_in: float
    r_out: float
    k: int | None = None

    def __post_init__(self):
        if not (0.0 <= self.r_in < self.r_out):
            raise ValueError(f"shell needs 0 <= r_in < r_out, got [{self.r_in}, {self.r_out})")
        if self.k is not None and int(self.k) < 1:
            raise ValueError(f"shell leaf budget k must be >= 1 or None, got {self.k}")


def parse_shells(spec) -> list[Shell]:
    """Shells from dicts ``{r_in, r_out, k}`` / tuples ``(r_in, r_out[, k])`` / Shells."""
    out = []
    for s in spec:
        if isinstance(s, Shell):
            out.append(s)
        elif isinstance(s, dict):
            out.append(Shell(float(s["r_in"]), float(s["r_out"]), None if s.get("k") is None else int(s["k"])))
        else:
            s = tuple(s)
            out.append(Shell(float(s[0]), float(s[1]), None if len(s) < 3 or s[2] is None else int(s[2])))
    return out


def distinct_shells(shells: list[Shell]) -> list[Shell]:
    """The distinct shells in order of r_in; they must be identical or disjoint."""
    uniq = sorted(set(shells), key=lambda s: (s.r_in, s.r_out))
    for a, b in zip(uniq, uniq[1:]):
        if b.r_in < a.r_out:
            raise ValueError(f"shells {a} and {b} overlap: layer shells must be identical or disjoint")
    return uniq


# --- selection -----------------------------------------------------------------------------------

def _group_ranks(key: np.ndarray):
    """For edges sorted by ``key`` (non-decreasing): rank within the group, group size, group start."""
    E = len(key)
    if E == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    new = np.ones(E, bool)
    new[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(new)
    sizes = np.diff(np.append(starts, E))
    gid = np.cumsum(new) - 1
    rank = np.arange(E) - starts[gid]
    return rank, sizes[gid], starts[gid]


def _angular_fps(vec: np.ndarray, starts: np.ndarray, sizes: np.ndarray, k: int) -> np.ndarray:
    """Indices (into the sorted edge arrays) of k directions per group by farthest-point sampling
    on the unit sphere, starting from each group's first (nearest) edge (groups with n > k)."""
    picks = []
    big_s, big_n = starts, sizes
    if len(big_s):
        M = int(big_n.max())
        idx = big_s[:, None] + np.arange(M)[None, :]
        valid = np.arange(M)[None, :] < big_n[:, None]
        idx = np.where(valid, idx, big_s[:, None])
        u = vec[idx] / np.linalg.norm(vec[idx], axis=-1, keepdims=True)  # (G, M, 3)
        G = len(big_s)
        chosen = np.zeros((G, k), np.int64)
        mind = np.full((G, M), np.inf)   # angular distance (1 - cos) to the nearest picked direction
        alive = valid.copy()
        cur = np.zeros(G, np.int64)
        rows = np.arange(G)
        for m in range(k):
            chosen[:, m] = cur
            alive[rows, cur] = False
            mind = np.minimum(mind, 1.0 - np.einsum("gmc,gc->gm", u, u[rows, cur]))
            cur = np.argmax(np.where(alive, mind, -np.inf), axis=1)
        picks.append((big_s[:, None] + chosen).ravel())
    return np.concatenate(picks) if picks else np.zeros(0, np.int64)


def _sorted_ij(i, j) -> bool:
    if len(i) < 2:
        return True
    di, dj = np.diff(i), np.diff(j)
    return bool(np.all((di > 0) | ((di == 0) & (dj >= 0))))


def select_star_edges(i, j, vec, dist, shells: list[Shell], mode: str = "dilated"):
    """Keep mask over candidate edges (any order) and each edge's shell index (-1: outside all).

    ``i, j`` int arrays, ``vec`` (E, 3) edge vectors, ``dist`` (E,); ``shells`` distinct+disjoint.
    """
    if mode not in MODES:
        raise ValueError(f"unknown star selection '{mode}'; allowed: {MODES}")
    shells = distinct_shells(shells)
    E = len(i)
    shell_id = np.full(E, -1, np.int64)
    for s, sh in enumerate(shells):
        shell_id[(dist >= sh.r_in) & (dist < sh.r_out)] = s
    keep = np.zeros(E, bool)
    for s, sh in enumerate(shells):
        sel = np.flatnonzero(shell_id == s)
        if sh.k is None or len(sel) == 0:
            keep[sel] = True
            continue
        # by centre, then distance, then neighbour index: one stable sort of a composite key
        # (candidates come sorted by (i, j), so equal keys keep the j order)
        span = 2.0 * (float(dist[sel].max()) + 1.0)
        sub = sel[np.lexsort((j[sel], i[sel]))] if not _sorted_ij(i[sel], j[sel]) else sel
        order = sub[np.argsort(i[sub] * span + dist[sub], kind="stable")]
        rank, size, start = _group_ranks(i[order])
        k = int(sh.k)
        if mode == "nearest":
            keep[order[rank < k]] = True
        elif mode == "dilated":
            small = size <= k
            keep[order[small]] = True
            first = (rank == 0) & ~small
            g_start, g_size = start[first], size[first]
            picks = g_start[:, None] + np.floor((np.arange(k)[None, :] + 0.5) * g_size[:, None] / k).astype(np.int64)
            keep[order[picks.ravel()]] = True
        else:  # angular
            keep[order[size <= k]] = True
            first = (rank == 0) & (size > k)
            pos = _angular_fps(vec[order], start[first], size[first], k)
            keep[order[pos]] = True
    return keep, shell_id


def star_graph(positions, shells, cell=None, pbc=False, mode: str = "dilated"):
    """Dilated star graph of one structure: ``(i, j, shifts, shell_id)`` sorted by (i, j).

    Candidates come from a radius search at the outermost shell radius (``neighbors.neighbor_list``),
    then each (atom, shell) keeps its star.
    """
    shells = distinct_shells(parse_shells(shells))
    r_max = max(s.r_out for s in shells)
    positions = np.asarray(positions, float)
    i, j, _, shifts = neighbor_list(positions, r_max, cell, pbc)
    vec = positions[j] - positions[i] + shifts
    dist = np.linalg.norm(vec, axis=1)
    keep, shell_id = select_star_edges(i, j, vec, dist, shells, mode)
    keep &= shell_id >= 0
    return i[keep], j[keep], shifts[keep], shell_id[keep]


def edges_per_shell(i, shell_id, n_atoms: int, n_shells: int) -> np.ndarray:
    """Mean edges per atom in each shell (n_shells,)."""
    return np.bincount(shell_id, minlength=n_shells)[:n_shells] / max(int(n_atoms), 1)


# --- data ---------------------------------------------------------------------------------------

class StarGraphData(AtomsData):
    """:class:`AtomsData` whose per-frame graph is the dilated star graph of ``shells``.

    ``layer_shells`` (one per model layer; identical or disjoint) define the graph; the cached
    graph of a frame is the union over the distinct shells. ``graph_seconds`` accumulates the
    construction time (neighbour search + selection).
    """

    def __init__(self, frames: dict, layer_shells, mode: str = "dilated", device=None):
        if mode not in MODES:
            raise ValueError(f"unknown star selection '{mode}'; allowed: {MODES}")
        self.layer_shells = parse_shells(layer_shells)
        self.shells = distinct_shells(self.layer_shells)
        self.mode = mode
        self.device = device
        self.graph_seconds = 0.0
        self._shell_ids: dict[int, np.ndarray] = {}
        super().__init__(frames, max(s.r_out for s in self.shells))

    def subset(self, idx) -> "StarGraphData":
        idx = [int(k) for k in idx]
        fr = {k: ([v[i] for i in idx] if isinstance(v, list) else (None if v is None else np.asarray(v)[idx]))
              for k, v in self.frames.items()}
        out = StarGraphData(fr, self.layer_shells, self.mode, self.device)
        out._graphs = {new: self._graphs[old] for new, old in enumerate(idx) if old in self._graphs}
        out._shell_ids = {new: self._shell_ids[old] for new, old in enumerate(idx) if old in self._shell_ids}
        return out

    def graph(self, k: int):
        if k not in self._graphs:
            import time

            t0 = time.perf_counter()
            i, j, shifts, sid = star_graph(self.frames["positions"][k], self.shells, self.frames["cells"][k],
                                           self.frames["pbc"][k], self.mode)
            self.graph_seconds += time.perf_counter() - t0
            self._graphs[k] = (i, j, shifts)
            self._shell_ids[k] = sid
        return self._graphs[k]

    def collate(self, idx, dtype=None):
        b = super().collate(idx, dtype)
        return b if self.device in (None, "cpu") else b.to(device=self.device)

    def messages_per_layer(self, k: int) -> np.ndarray:
        """Edges each model layer passes messages over, for frame k (L,)."""
        self.graph(k)
        counts = np.bincount(self._shell_ids[k], minlength=len(self.shells))
        return np.array([counts[self.shells.index(s)] for s in self.layer_shells], dtype=np.int64)


# --- model --------------------------------------------------------------------------------------

def shell_window(d, r_in: float, r_out: float, width: float):
    """1 inside [r_in + w, r_out - w], cosine ramps to 0 at r_in (if r_in > 0) and at r_out; 0 outside."""
    w = max(float(width), 1e-6)
    fall = torch.clamp((r_out - d) / w, 0.0, 1.0)
    out = 0.5 * (1.0 - torch.cos(math.pi * fall))
    if r_in > 0:
        rise = torch.clamp((d - r_in) / w, 0.0, 1.0)
        out = out * 0.5 * (1.0 - torch.cos(math.pi * rise))
    return out * ((d >= r_in) & (d < r_out)).to(d.dtype)


class DilatedSchNet(SchNet):
    """SchNet whose interaction ``l`` passes messages over the edges of ``layer_shells[l]`` only.

    With every layer on the same shell ``[0, r_c)`` this is SchNet on a radius graph (with the
    flat-top window envelope instead of the cosine cutoff); with disjoint shells and a
    :class:`StarGraphData` graph it is the dilated star-structured model (DKMP). The radial basis
    spans ``[0, r_L]`` and is shared by all layers.
    """

    def __init__(self, layer_shells, window_width: float = 0.3, **schnet_kwargs):
        shells = parse_shells(layer_shells)
        distinct_shells(shells)
        schnet_kwargs.pop("n_interactions", None)
        cutoff = max(s.r_out for s in shells)
        schnet_kwargs["cutoff"] = cutoff
        super().__init__(n_interactions=len(shells), **schnet_kwargs)
        self.layer_shells = [(s.r_in, s.r_out) for s in shells]
        self.window_width = float(window_width)
        self.hparams.update(layer_shells=[(s.r_in, s.r_out, s.k) for s in shells], window_width=self.window_width)

    def representation(self, numbers, positions, edge_index, shifts=None):
        _, dist = edge_vectors(positions, edge_index, shifts)
        d0 = dist.detach()
        cache = {}
        x = self.embedding(numbers)
        for (r_in, r_out), block in zip(self.layer_shells, self.interactions):
            if (r_in, r_out) not in cache:
                if r_in <= 0.0 and bool((d0 < r_out).all()):
                    d, ei = dist, edge_index
                else:  # the layer's own edges; basis and window on them only (no (E, K) gather)
                    idx = torch.nonzero((d0 >= r_in) & (d0 < r_out), as_tuple=True)[0]
                    d, ei = dist[idx], edge_index[:, idx]
                cache[(r_in, r_out)] = (self.rbf(d), shell_window(d, r_in, r_out, self.window_width), ei)
            r, env, ei = cache[(r_in, r_out)]
            x = block(x, r, env, ei)
        return x
