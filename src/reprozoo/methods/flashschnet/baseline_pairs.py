"""The baseline SchNet with the pair-symmetry trick (an ablation of ours, not the paper's).

The radius graph is symmetric: edge i<-j has a reverse j<-i at the same distance, hence the same
continuous filter W(d_ij). The baseline evaluates the filter MLP once per *directed* edge; here it
is evaluated once per *unordered* pair {i, j} and the message goes both ways,

    m_i += W_ij * h_j,   m_j += W_ij * h_i,

still with materialised (P, K) / (P, F) tensors (P = E / 2 pairs), ``index_add_`` scatters and
plain autograd, exactly like ``blocks.atomistic.SchNet``. It exists so that the flash kernel's own
pair mode (``flash.py``, ``pairs=True``) is compared with a baseline that gets the same trick: the
results table then separates the paper's gain (flash vs baseline, both per directed edge) from
the gain of the trick (either implementation with vs without pairs).

The shared block is used through its public pieces (``edge_features``, ``Interaction.in2f`` /
``filter`` / ``update``, ``atom_energies``); its default behaviour is not changed.
"""
from __future__ import annotations

import torch
from torch import nn

from ...blocks.atomistic.schnet import SchNet, energy_and_forces, scatter_sum


def unordered_pairs(edge_index: torch.Tensor, shifts: torch.Tensor | None = None):
    """One direction of every pair of a full (symmetric) neighbour list: (pair_index (2, P), shifts).

    Keeps i < j; for periodic self images (i == j) the shift whose first non-zero component is
    positive (its mirror image -shift is the other direction of the same pair).
    """
    from .flash import _canonical

    if shifts is not None and not bool(shifts.any()):
        shifts = None
    keep = _canonical(edge_index[0], edge_index[1], shifts)
    return edge_index[:, keep], (shifts[keep] if shifts is not None else None)


class PairBaselineSchNet(nn.Module):
    """Runs a trained :class:`SchNet` (shared weights, not copied) on a list of unordered pairs.

    ``forward`` / ``energy_and_forces`` take the *pair* list from :func:`unordered_pairs` where the
    SchNet takes the full edge list; everything else has the SchNet's signature.
    """

    def __init__(self, model: SchNet):
        super().__init__()
        self.model = model
        self.cutoff = model.cutoff

    def forward(self, numbers, positions, batch, pair_index, shifts=None, n_structures=None):
        m = self.model
        rbf, fcut, _ = m.edge_features(positions, pair_index, shifts)   # (P, K), (P,): once per pair
        i, j = pair_index[0], pair_index[1]
        n = positions.shape[0]
        x = m.embedding(numbers)
        for blk in m.interactions:
            h = blk.in2f(x)
            w = blk.filter(rbf, fcut)                                    # (P, F), once per pair
            msg = scatter_sum(w * h.index_select(0, j), i, n).index_add_(0, j, w * h.index_select(0, i))
            x = blk.update(x, msg)
        ea = m.atom_energies(numbers, x)
        n_s = int(n_structures) if n_structures is not None else int(batch.max()) + 1
        return scatter_sum(ea, batch, n_s)

    def energy_and_forces(self, numbers, positions, batch, pair_index, shifts=None, n_structures=None,
                          create_graph: bool = False):
        return energy_and_forces(self, numbers, positions, batch, pair_index, shifts, n_structures, create_graph)
