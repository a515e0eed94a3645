"""SchNet (Schuett et al. 2017/2018), schnetpack layout, on a batch of structures.

Inputs (all torch): ``numbers`` (N,) int64 atomic numbers (or bead types), ``positions`` (N, 3),
``batch`` (N,) structure index, ``edge_index`` (2, E) rows (i = centre/receiver, j = neighbour),
``shifts`` (E, 3) Cartesian periodic shifts (r_ij = pos[j] - pos[i] + shift; zeros if not periodic).

Energy per structure = sum over its atoms of  head(x_i) * std + mean + atomref[Z_i].
Forces = -dE/dpositions by autograd (:meth:`SchNet.energy_and_forces`).

Layers are plain ``nn.Linear`` so that other methods can hook, merge or replace them:
``embedding`` -> ``interactions[t]`` (``in2f``, ``filter1``, ``filter2``, ``f2out``, ``dense``) ->
``head`` (``head[0]``, ssp, ``head[2]``). ``Interaction.conv`` is the continuous-filter convolution
(baseline: materialised (E, F) edge tensors + ``index_add_``); the FlashSchNet method substitutes a
chunked CSR kernel using the same weights.
"""
from __future__ import annotations

import torch
from torch import nn

from .basis import CosineCutoff, ShiftedSoftplus, make_rbf, shifted_softplus


def edge_vectors(positions, edge_index, shifts=None):
    """r_ij = pos[j] - pos[i] + shift (E, 3) and |r_ij| (E,)."""
    vec = positions.index_select(0, edge_index[1]) - positions.index_select(0, edge_index[0])
    if shifts is not None:
        vec = vec + shifts.to(vec.dtype)
    return vec, torch.linalg.vector_norm(vec, dim=-1)


def scatter_sum(src: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """out[index[e]] += src[e] (index_add_; deterministic on CPU)."""
    out = src.new_zeros((n,) + tuple(src.shape[1:]))
    return out.index_add_(0, index, src)


class Interaction(nn.Module):
    """x <- x + dense(ssp(f2out(cfconv(in2f(x)))));  W_ij = filter2(ssp(filter1(rbf_ij))) * fcut_ij."""

    def __init__(self, n_features: int, n_filters: int, n_rbf: int):
        super().__init__()
        self.in2f = nn.Linear(n_features, n_filters, bias=False)
        self.filter1 = nn.Linear(n_rbf, n_filters)
        self.filter2 = nn.Linear(n_filters, n_filters)
        self.f2out = nn.Linear(n_filters, n_features)
        self.dense = nn.Linear(n_features, n_features)

    def filter(self, rbf: torch.Tensor, fcut: torch.Tensor) -> torch.Tensor:
        return self.filter2(shifted_softplus(self.filter1(rbf))) * fcut.unsqueeze(-1)

    def conv(self, h: torch.Tensor, rbf: torch.Tensor, fcut: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Baseline cfconv: m_i = sum_j W_ij * h_j with (E, F) tensors and a scatter-add."""
        w = self.filter(rbf, fcut)
        return scatter_sum(w * h.index_select(0, edge_index[1]), edge_index[0], h.shape[0])

    def update(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return x + self.dense(shifted_softplus(self.f2out(m)))

    def forward(self, x, rbf, fcut, edge_index):
        return self.update(x, self.conv(self.in2f(x), rbf, fcut, edge_index))


class SchNet(nn.Module):
    def __init__(self, n_features: int = 64, n_interactions: int = 3, n_rbf: int = 20, cutoff: float = 5.0,
                 n_filters: int | None = None, max_z: int = 100, rbf: str = "gaussian", head_hidden: int | None = None):
        super().__init__()
        n_filters = n_filters or n_features
        head_hidden = head_hidden or max(1, n_features // 2)
        self.hparams = dict(n_features=n_features, n_interactions=n_interactions, n_rbf=n_rbf, cutoff=cutoff,
                            n_filters=n_filters, max_z=max_z, rbf=rbf, head_hidden=head_hidden)
        self.cutoff = float(cutoff)
        self.embedding = nn.Embedding(max_z + 1, n_features)
        self.rbf = make_rbf(rbf, n_rbf, cutoff)
        self.envelope = CosineCutoff(cutoff)
        self.interactions = nn.ModuleList(Interaction(n_features, n_filters, n_rbf) for _ in range(n_interactions))
        self.head = nn.Sequential(nn.Linear(n_features, head_hidden), ShiftedSoftplus(), nn.Linear(head_hidden, 1))
        # energy scaling: E_atom = head * std + mean + atomref[Z]  (set by fit_energy_scale)
        self.register_buffer("atomref", torch.zeros(max_z + 1))
        self.register_buffer("e_mean", torch.zeros(()))
        self.register_buffer("e_std", torch.ones(()))

    # --- pieces (public: other methods reuse or override them) ---------------------------------
    def edge_features(self, positions, edge_index, shifts=None):
        """(rbf (E, K), fcut (E,), dist (E,)) computed once and shared by every interaction."""
        _, dist = edge_vectors(positions, edge_index, shifts)
        return self.rbf(dist), self.envelope(dist), dist

    def representation(self, numbers, positions, edge_index, shifts=None):
        """Per-atom features x (N, F) after all interactions."""
        rbf, fcut, _ = self.edge_features(positions, edge_index, shifts)
        x = self.embedding(numbers)
        for block in self.interactions:
            x = block(x, rbf, fcut, edge_index)
        return x

    def atom_energies(self, numbers, x):
        return self.head(x).squeeze(-1) * self.e_std + self.e_mean + self.atomref[numbers]

    def forward(self, numbers, positions, batch, edge_index, shifts=None, n_structures: int | None = None):
        """Energy per structure (B,)."""
        x = self.representation(numbers, positions, edge_index, shifts)
        ea = self.atom_energies(numbers, x)
        n = int(n_structures) if n_structures is not None else (int(batch.max()) + 1 if len(batch) else 0)
        return scatter_sum(ea, batch, n)

    def energy_and_forces(self, numbers, positions, batch, edge_index, shifts=None, n_structures=None,
                          create_graph: bool | None = None):
        """(energy (B,), forces (N, 3)); ``create_graph`` defaults to ``self.training`` (force loss)."""
        return energy_and_forces(self, numbers, positions, batch, edge_index, shifts, n_structures, create_graph)

    def batch_forward(self, b, forces: bool = True):
        """Convenience: run on a :class:`~reprozoo.blocks.atomistic.data.Batch`."""
        args = (b.numbers, b.positions, b.batch, b.edge_index, b.shifts, b.n_structures)
        if forces:
            return self.energy_and_forces(*args)
        return self(*args), None

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_schnet(cfg: dict) -> SchNet:
    """SchNet from a config dict (keys of SchNet.__init__; unknown keys rejected)."""
    return SchNet(**cfg)


def energy_and_forces(model, numbers, positions, batch, edge_index, shifts=None, n_structures=None,
                      create_graph: bool | None = None):
    """Energy of any model with SchNet's forward signature, and forces = -dE/dpositions by autograd."""
    create_graph = model.training if create_graph is None else create_graph
    with torch.enable_grad():
        pos = positions if positions.requires_grad else positions.detach().requires_grad_(True)
        energy = model(numbers, pos, batch, edge_index, shifts, n_structures)
        (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=create_graph)
    return energy, -grad
