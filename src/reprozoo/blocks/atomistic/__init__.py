"""Shared atomistic neural-network blocks (SchNet family), used by flashschnet, dkmp, gffmerge,
triforces and ceitnet. Importing this package imports torch (methods only, never registry code).

Conventions
-----------
* A batch of B structures is flat: ``numbers`` (N,) int64, ``positions`` (N, 3), ``batch`` (N,)
  structure index (atoms of a structure contiguous), ``edge_index`` (2, E) int64 with row 0 = i
  (centre, receives the message) and row 1 = j (neighbour, sends it), ``shifts`` (E, 3) Cartesian
  periodic shifts: ``r_ij = positions[j] - positions[i] + shifts`` (zeros when not periodic).
  Lists are full (i->j and j->i) and sorted by (i, j), i.e. destination-sorted.
* Units are those of the data (EMT/ASE: eV, Angstrom). Forces = -dE/dpositions by autograd.
* No torch-scatter/torch-cluster: reductions use ``index_add_`` (``schnet.scatter_sum``).

Neighbour lists (``neighbors``)
-------------------------------
``neighbor_list(positions, cutoff, cell=None, pbc=False) -> (i, j, S, shifts)`` numpy, the one neighbour
list (periodic: vesin cell lists; open: scipy k-d tree); pairs as ASE's ``neighbor_list``, positions
need not lie in the cell.
``radius_graph(positions, batch, cutoff) -> edge_index`` torch, non-periodic, many replicas (MD).
``batch_graphs``, ``sort_edges(edge_index, shifts, by=0|1)``, ``csr_rowptr(sorted_index, n)``.

Bases (``basis``)
-----------------
``GaussianRBF(n_rbf, cutoff)``, ``BesselRBF(n_rbf, cutoff)`` (both with ``.derivative(d)``),
``CosineCutoff(cutoff)`` (with ``.derivative``), ``PolynomialCutoff``, ``shifted_softplus`` /
``ShiftedSoftplus``, ``make_rbf(kind, n_rbf, cutoff)``.

Model (``schnet``)
------------------
``SchNet(n_features=64, n_interactions=3, n_rbf=20, cutoff=5.0, n_filters=None, max_z=100,
rbf='gaussian', head_hidden=None)``:
  ``model(numbers, positions, batch, edge_index, shifts, n_structures) -> energy (B,)``
  ``model.energy_and_forces(..., create_graph=None) -> (energy (B,), forces (N, 3))``
  ``model.representation(numbers, positions, edge_index, shifts) -> x (N, F)`` (features per atom)
  ``model.atom_energies(numbers, x) -> (N,)``;  ``model.batch_forward(batch)``.
  Layers: ``embedding``, ``interactions[t].{in2f, filter1, filter2, f2out, dense}`` (nn.Linear),
  ``head`` = Linear, ssp, Linear; buffers ``atomref`` (per Z), ``e_mean``, ``e_std``.
  ``Interaction.conv(h, rbf, fcut, edge_index)`` is the replaceable continuous-filter convolution.
  ``edge_vectors(positions, edge_index, shifts)``, ``scatter_sum(src, index, n)``.

Data (``data``)
---------------
``AtomsData.from_npz(path_or_folder, cutoff)`` / ``AtomsData(frames_dict, cutoff)``: frames of the MD
format (frames.npz: positions (F,N,3), numbers, cells (F,3,3), pbc, energy (F,), forces (F,N,3)),
neighbour lists cached per frame (``.precompute()`` builds them all, returns self);
``.collate(indices, dtype) -> Batch``; ``.batches(bs, rng, dtype)``; ``.subset(idx)``. ``Batch``
fields: numbers, positions, batch, edge_index, shifts, n_atoms, cells, energy, forces;
``.n_structures``; ``.to(device, dtype)``. ``split_indices(n, fractions, seed)``.
``make_emt_frames(kind='cu_bulk'|'pt_cluster'|'cuau_bulk', n_frames, rattle, seed, size)`` (ASE EMT).
``frames_from_atoms(list_of_atoms)``, ``frames_to_arrays(frames)`` (-> npz arrays).

Training (``train``)
--------------------
``fit_energy_scale(model, data)`` (atomref by least squares, scale = force RMS; call before fit),
``fit(model, train, val=None, cfg=TrainConfig|dict, progress=None) -> history`` (Adam, cosine decay,
energy/force loss weights, optional early stopping with ``patience``, ``max_steps``,
``time_budget_s``, deterministic per ``seed``), ``evaluate(model, data) -> {energy_mae_per_atom,
energy_rmse_per_atom, force_mae, force_rmse, loss}``.

Example::

    from reprozoo.blocks.atomistic import AtomsData, SchNet, TrainConfig, fit, fit_energy_scale, evaluate
    data = AtomsData.from_npz(ctx.data["md_emt_cu_bulk"], cutoff=5.0)
    tr, va = data.subset(range(0, 80)), data.subset(range(80, 100))
    model = SchNet(n_features=32, n_interactions=2, cutoff=5.0)
    fit_energy_scale(model, tr)
    hist = fit(model, tr, va, TrainConfig(epochs=20, lr=2e-3, seed=ctx.seed))
    print(evaluate(model, va))
"""
from .basis import (BesselRBF, CosineCutoff, GaussianRBF, PolynomialCutoff, ShiftedSoftplus, make_rbf,
                    shifted_softplus)
from .data import (AtomsData, Batch, frames_from_arrays, frames_from_atoms, frames_to_arrays, load_frames,
                   make_emt_frames, split_indices)
from .neighbors import batch_graphs, csr_rowptr, neighbor_list, radius_graph, sort_edges
from .schnet import Interaction, SchNet, build_schnet, edge_vectors, scatter_sum
from .train import TrainConfig, evaluate, fit, fit_energy_scale, loss_terms

__all__ = [
    "BesselRBF", "CosineCutoff", "GaussianRBF", "PolynomialCutoff", "ShiftedSoftplus", "make_rbf", "shifted_softplus",
    "AtomsData", "Batch", "frames_from_arrays", "frames_from_atoms", "frames_to_arrays", "load_frames",
    "make_emt_frames", "split_indices", "batch_graphs", "csr_rowptr", "neighbor_list",
    "radius_graph", "sort_edges", "Interaction", "SchNet", "build_schnet", "edge_vectors", "scatter_sum",
    "TrainConfig", "evaluate", "fit", "fit_energy_scale", "loss_terms",
]
