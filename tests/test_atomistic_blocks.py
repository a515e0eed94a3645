"""Shared atomistic blocks: neighbour lists, bases, SchNet (forces, symmetries), data, training."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ase")

from reprozoo.blocks.atomistic import (AtomsData, BesselRBF, CosineCutoff, GaussianRBF, SchNet, TrainConfig,  # noqa: E402
                                       csr_rowptr, evaluate, fit, fit_energy_scale, make_emt_frames, neighbor_list,
                                       radius_graph, shifted_softplus, sort_edges)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: OpenMP threads only add barrier waits (badly so on a shared machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _random_rotation(rng):
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] *= -1
    return q


def _model(seed=0, cutoff=4.0, **kw):
    torch.manual_seed(seed)
    m = SchNet(n_features=16, n_interactions=2, n_rbf=12, cutoff=cutoff, **kw).double().eval()
    # non-trivial energy scale and reference so every buffer is exercised
    with torch.no_grad():
        m.atomref[29], m.atomref[79] = -3.5, -4.25
        m.e_std.fill_(0.7), m.e_mean.fill_(-0.1)
    return m


def _energy_forces(model, positions, numbers, cell, pbc, cutoff=4.0):
    data = AtomsData({"positions": [positions], "numbers": [np.asarray(numbers)], "cells": [cell], "pbc": [pbc],
                      "energy": None, "forces": None}, cutoff)
    b = data.collate([0], dtype=torch.float64)
    e, f = model.batch_forward(b)
    return float(e.detach()[0]), f.detach().numpy()


@pytest.fixture(scope="module")
def cu_frames():
    return make_emt_frames("cuau_bulk", n_frames=3, rattle=0.15, seed=1, size=2)


@pytest.fixture(scope="module")
def pt_frames():
    return make_emt_frames("pt_cluster", n_frames=2, rattle=0.1, seed=2, size=1)


# --- neighbour lists ---------------------------------------------------------------------------

def ase_pairs(positions, cutoff, cell, pbc):
    """The oracle: ASE's neighbour list as {(i, j, S): distance}."""
    from ase import Atoms
    from ase.neighborlist import neighbor_list as ase_neighbor_list

    atoms = Atoms(numbers=np.ones(len(positions), int), positions=positions,
                  cell=np.zeros((3, 3)) if cell is None else cell, pbc=pbc)
    i, j, S, d = ase_neighbor_list("ijSd", atoms, cutoff, self_interaction=False)
    return {(a, b, tuple(s)): x for a, b, s, x in zip(i.tolist(), j.tolist(), S.tolist(), d.tolist())}


def assert_matches_ase(positions, cutoff, cell, pbc):
    """neighbor_list equals ASE as a set of (i, j, S) with the same distances, and keeps its contract."""
    positions = np.asarray(positions, float)
    i, j, S, sh = neighbor_list(positions, cutoff, cell, pbc)
    ref = ase_pairs(positions, cutoff, cell, pbc)
    d = np.linalg.norm(positions[j] - positions[i] + sh, axis=1)
    got = {(a, b, tuple(s)): x for a, b, s, x in zip(i.tolist(), j.tolist(), S.tolist(), d.tolist())}
    assert len(got) == len(i), "duplicate (i, j, S)"
    assert got.keys() == ref.keys(), (f"missing {sorted(ref.keys() - got.keys())[:5]}, "
                                      f"extra {sorted(got.keys() - ref.keys())[:5]}")
    np.testing.assert_allclose([got[k] for k in ref], list(ref.values()), rtol=0, atol=1e-9)
    assert i.dtype == j.dtype == S.dtype == np.int64 and S.shape == (len(i), 3) and sh.shape == (len(i), 3)
    np.testing.assert_allclose(sh, S @ cell if np.any(pbc) else np.zeros((len(i), 3)), atol=1e-12)
    assert not np.any(~np.broadcast_to(np.asarray(pbc, bool), (3,)) & (S != 0)), "image along an open axis"
    assert not np.any((i == j) & ~S.any(axis=1)), "self pair"
    key = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    np.testing.assert_array_equal(key, np.arange(len(i)))  # sorted by (i, j, S)
    rowptr = csr_rowptr(i, len(positions))
    assert rowptr[-1] == len(i) and np.all(np.diff(rowptr) == np.bincount(i, minlength=len(positions)))
    return i, j, S, sh


SKEWED = np.array([[4.0, 0, 0], [3.4, 1.1, 0], [0.6, -0.7, 3.2]])
TRICLINIC_SMALL = np.array([[3.0, 0, 0], [1.2, 2.9, 0], [0.7, -0.9, 3.4]])


def _case(case, rng):
    """(positions, cell, pbc, cutoff) of a named structure."""
    cutoff = 3.7
    if case == "cubic":
        cell, pbc, n = np.eye(3) * 7.2, True, 32
    elif case == "triclinic_small":  # cell smaller than the cutoff: several images and self images
        cell, pbc, n = TRICLINIC_SMALL, True, 5
    elif case == "skewed":
        cell, pbc, n = SKEWED, True, 6
    elif case == "left_handed":  # det(cell) < 0
        cell, pbc, n = TRICLINIC_SMALL[[1, 0, 2]], True, 5
    elif case == "tiny_cell":  # one atom, cell a third of the cutoff: only self images
        cell, pbc, n = np.eye(3) * 1.3, True, 1
    elif case == "slab":
        cell, pbc, n = np.array([[5.0, 0, 0], [2.0, 4.5, 0], [0, 0, 12.0]]), [True, True, False], 12
    elif case == "slab_no_c":  # no lattice vector along the open axis
        cell, pbc, n = np.array([[3.1, 0, 0], [1.5, 2.6, 0], [0, 0, 0]]), [True, True, False], 6
    elif case == "wire":
        cell, pbc, n = np.diag([2.9, 8.0, 8.0]), [True, False, False], 6
    elif case == "wire_no_bc":
        cell, pbc, n = np.diag([2.9, 0.0, 0.0]), [True, False, False], 6
    elif case == "cluster":
        cell, pbc, n = None, False, 20
    else:  # cluster_with_cell: a cell that must be ignored
        cell, pbc, n = np.eye(3) * 2.0, False, 20
    box = np.eye(3) * 6.0 if cell is None or np.linalg.det(cell) == 0 or not np.any(pbc) else cell
    return rng.random((n, 3)) @ box, cell, pbc, cutoff


CASES = ["cubic", "triclinic_small", "skewed", "left_handed", "tiny_cell", "slab", "slab_no_c", "wire", "wire_no_bc",
         "cluster", "cluster_with_cell"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("where", ["inside", "outside", "far"])
def test_neighbor_list_matches_ase(case, where):
    """Against ASE: atoms in the cell, atoms moved out by lattice vectors, and moved several cells away."""
    rng = np.random.default_rng([CASES.index(case), ["inside", "outside", "far"].index(where)])
    pos, cell, pbc, cutoff = _case(case, rng)
    if where != "inside":
        lat = np.eye(3) * 6.0 if cell is None or np.linalg.det(cell) == 0 else cell
        reach = 1 if where == "outside" else 3
        pos = pos + rng.integers(-reach, reach + 1, (len(pos), 3)) @ lat + rng.normal(0, 0.3, pos.shape)
    i, j, S, _ = assert_matches_ase(pos, cutoff, cell, pbc)
    assert len(i) > 0 or where != "inside"
    if case in ("triclinic_small", "tiny_cell"):
        assert np.any((i == j) & S.any(axis=1)), "self images expected with a cell smaller than the cutoff"


def test_neighbor_list_atoms_outside_the_cell():
    """The pairs through the S = +-2 images of atoms just outside the cell (dropped by the old lists)."""
    cell = np.eye(3) * 4.0
    pos = np.array([[-0.02, 0, 0], [3.999, 0, 0]])
    i, j, S, _ = assert_matches_ase(pos, 3.99, cell, True)
    assert len(i) == 4 and {tuple(s) for s in S.tolist()} >= {(2, 0, 0), (-2, 0, 0)}
    far = pos + np.array([[8.0, 0, 0], [-8.0, 4.0, 0]])  # two cells away, in opposite directions
    assert len(assert_matches_ase(far, 3.99, cell, True)[0]) == 4
    i, j, S, _ = assert_matches_ase(pos + np.array([[0, 0, 0], [8.0, 0, 0]]), 3.99, cell, [True, False, False])
    assert len(i) == 4
    # a pair exactly at the cutoff is out (as ASE), open and periodic (through both images)
    assert len(assert_matches_ase(np.array([[0.0, 0, 0], [3.0, 0, 0]]), 3.0, None, False)[0]) == 0
    assert len(assert_matches_ase(np.array([[0.0, 0, 0], [1.0, 0, 0]]), 1.0, cell * 0.5, True)[0]) == 0


def test_neighbor_list_edge_cases(cu_frames):
    z = neighbor_list(np.zeros((0, 3)), 3.0, np.eye(3) * 4, True)
    assert [len(x) for x in z] == [0, 0, 0, 0] and z[2].shape == (0, 3) and z[3].shape == (0, 3)
    assert len(neighbor_list(np.zeros((1, 3)), 3.0)[0]) == 0
    # an EMT frame (float32 positions are accepted) and the cached graph of AtomsData
    pos, cell = cu_frames["positions"][0], cu_frames["cells"][0]
    i, j, S, sh = assert_matches_ase(pos, 4.0, cell, True)
    out = neighbor_list(pos.astype(np.float32), 4.0, cell, True)
    assert len(out[0]) == len(i)
    data = AtomsData(cu_frames, 4.0).precompute()
    assert sorted(data._graphs) == [0, 1, 2]
    gi, gj, gsh = data.subset([2, 0])._graphs[1]  # subsets keep the cached graphs
    np.testing.assert_array_equal(gi, i), np.testing.assert_array_equal(gj, j)
    np.testing.assert_allclose(gsh, sh)


def test_radius_graph_torch_matches_ase():
    rng = np.random.default_rng(3)
    sizes = [7, 7, 7, 11, 4]  # replicas of one size grouped, then other sizes
    pos = [rng.random((n, 3)) * 5 for n in sizes]
    batch = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes))
    ei = radius_graph(torch.from_numpy(np.concatenate(pos)), batch, 2.5, max_block=15).numpy()
    off = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ref = sorted((i + o, j + o) for p, o in zip(pos, off) for i, j, _ in ase_pairs(p, 2.5, None, False))
    np.testing.assert_array_equal(sort_edges(ei)[0], np.array(ref).T)


# --- bases -------------------------------------------------------------------------------------

def test_basis_derivatives_and_cutoff():
    d = torch.linspace(0.0, 5.5, 301, dtype=torch.float64, requires_grad=True)
    for mod in (GaussianRBF(10, 5.0), BesselRBF(6, 5.0)):
        mod = mod.double()
        y = mod(d)
        auto = torch.stack([torch.autograd.grad(y[:, k].sum(), d, retain_graph=True)[0] for k in range(y.shape[1])], 1)
        np.testing.assert_allclose(mod.derivative(d.detach()).numpy()[1:], auto.numpy()[1:], atol=1e-10)
    env = CosineCutoff(5.0)
    f = env(d)
    assert f[0].item() == 1.0 and torch.all(f[d >= 5.0] == 0)
    g = torch.autograd.grad(f.sum(), d)[0]
    np.testing.assert_allclose(env.derivative(d.detach()).numpy(), g.numpy(), atol=1e-12)
    assert abs(env.derivative(torch.tensor(5.0 - 1e-9, dtype=torch.float64)).item()) < 1e-8  # smooth at the cutoff
    assert shifted_softplus(torch.zeros(1)).abs().item() < 1e-7


# --- SchNet: forces and symmetries ---------------------------------------------------------------

def test_forces_equal_minus_finite_difference_gradient(cu_frames, pt_frames):
    model = _model()
    for fr in (cu_frames, pt_frames):
        pos, num, cell, pbc = fr["positions"][0].copy(), fr["numbers"][0], fr["cells"][0], fr["pbc"][0]
        _, f = _energy_forces(model, pos, num, cell, pbc)
        rng = np.random.default_rng(0)
        h = 1e-5
        for a in rng.choice(len(pos), 3, replace=False):
            for k in range(3):
                p1, p2 = pos.copy(), pos.copy()
                p1[a, k] += h
                p2[a, k] -= h
                fd = -(_energy_forces(model, p1, num, cell, pbc)[0] - _energy_forces(model, p2, num, cell, pbc)[0]) / (2 * h)
                assert abs(fd - f[a, k]) < 1e-7 * max(1.0, abs(f[a, k])), (a, k, fd, f[a, k])


def test_rotation_translation_invariance_and_force_equivariance(cu_frames, pt_frames):
    model = _model()
    rng = np.random.default_rng(5)
    for fr in (cu_frames, pt_frames):
        pos, num, cell, pbc = fr["positions"][1], fr["numbers"][1], fr["cells"][1], fr["pbc"][1]
        e0, f0 = _energy_forces(model, pos, num, cell, pbc)
        R, t = _random_rotation(rng), rng.normal(size=3) * 3.0
        pos_r = pos @ R.T + t
        cell_r = cell @ R.T  # lattice vectors are rows
        e1, f1 = _energy_forces(model, pos_r, num, cell_r, pbc)
        assert abs(e1 - e0) < 1e-10 * max(1, abs(e0))
        np.testing.assert_allclose(f1, f0 @ R.T, atol=1e-10)
    # periodic: wrapping an atom into a neighbouring cell changes nothing
    pos, num, cell, pbc = cu_frames["positions"][2], cu_frames["numbers"][2], cu_frames["cells"][2], cu_frames["pbc"][2]
    e0, f0 = _energy_forces(model, pos, num, cell, pbc)
    pos2 = pos.copy()
    pos2[3] += cell[0] - 2 * cell[2]
    e1, f1 = _energy_forces(model, pos2, num, cell, pbc)
    assert abs(e1 - e0) < 1e-10 * max(1, abs(e0))
    np.testing.assert_allclose(f1, f0, atol=1e-10)


def test_permutation_invariance(cu_frames):
    model = _model()
    pos, num, cell, pbc = cu_frames["positions"][0], cu_frames["numbers"][0], cu_frames["cells"][0], True
    assert len(set(num.tolist())) == 2
    e0, f0 = _energy_forces(model, pos, num, cell, pbc)
    perm = np.random.default_rng(1).permutation(len(pos))
    e1, f1 = _energy_forces(model, pos[perm], num[perm], cell, pbc)
    assert abs(e1 - e0) < 1e-10 * max(1, abs(e0))
    np.testing.assert_allclose(f1, f0[perm], atol=1e-10)


def test_batch_equals_separate_structures(cu_frames, pt_frames):
    """A batch of different structures (periodic + cluster) gives each structure's own result."""
    model = _model()
    frames = {k: cu_frames[k][:2] + pt_frames[k][:1] for k in ("positions", "numbers", "cells", "pbc")}
    frames.update(energy=None, forces=None)
    b = AtomsData(frames, 4.0).collate([0, 1, 2], dtype=torch.float64)
    e, f = model.batch_forward(b)
    off = 0
    for k in range(3):
        ek, fk = _energy_forces(model, frames["positions"][k], frames["numbers"][k], frames["cells"][k], frames["pbc"][k])
        n = len(frames["positions"][k])
        assert abs(e[k].item() - ek) < 1e-10 * max(1, abs(ek))
        np.testing.assert_allclose(f[off:off + n].detach().numpy(), fk, atol=1e-10)
        off += n


def test_energy_is_smooth_at_the_cutoff():
    """Two atoms crossing the cutoff: energy and force continuous (cosine envelope)."""
    model = _model(cutoff=3.0)
    cell = np.zeros((3, 3))
    es = []
    for r in (3.0 - 1e-6, 3.0 + 1e-6):
        es.append(_energy_forces(model, np.array([[0, 0, 0], [r, 0, 0.0]]), np.array([29, 29]), cell, False, cutoff=3.0))
    assert abs(es[0][0] - es[1][0]) < 1e-9
    assert np.abs(es[0][1] - es[1][1]).max() < 1e-5


# --- training -------------------------------------------------------------------------------------

def test_tiny_training_run_decreases_loss_and_is_deterministic():
    frames = make_emt_frames("cu_bulk", n_frames=12, rattle=0.12, seed=0, size=1)
    data = AtomsData(frames, 4.0)
    tr, va = data.subset(range(9)), data.subset(range(9, 12))

    def run():
        torch.manual_seed(0)
        m = SchNet(n_features=16, n_interactions=2, n_rbf=12, cutoff=4.0)
        fit_energy_scale(m, tr)
        before = evaluate(m, va)
        hist = fit(m, tr, va, TrainConfig(epochs=12, batch_size=3, lr=5e-3, seed=0, patience=20))
        return before, evaluate(m, va), hist

    before, after, hist = run()
    assert hist["train_loss"][-1] < 0.5 * hist["train_loss"][0]
    assert after["force_mae"] < before["force_mae"]
    assert after["loss"] < before["loss"]
    _, after2, hist2 = run()
    assert hist2["train_loss"] == hist["train_loss"]
    assert after2["force_mae"] == after["force_mae"]



def test_validation_within_a_pass_leaves_the_training_unchanged():
    """val_per_epoch adds validation points inside each pass (the gate needs them in the tail), at
    the steps it reports, without changing a single training step: the losses are those of the
    once-per-pass run, and the end-of-pass values equal its validation values."""
    frames = make_emt_frames("cu_bulk", n_frames=12, rattle=0.12, seed=0, size=1)
    data = AtomsData(frames, 4.0)
    tr, va = data.subset(range(9)), data.subset(range(9, 12))

    def run(k):
        torch.manual_seed(0)
        m = SchNet(n_features=16, n_interactions=2, n_rbf=12, cutoff=4.0)
        fit_energy_scale(m, tr)
        return fit(m, tr, va, TrainConfig(epochs=3, batch_size=1, lr=5e-3, seed=0, val_per_epoch=k,
                                          max_steps=25))

    once, thrice = run(1), run(3)
    assert once["val_steps"] == [9, 18, 25]
    # the learning rate in force at each validation is recorded beside it (the gate checks it is
    # still above a tenth of its peak in the tail): the cosine schedule, falling
    assert len(once["lr"]) == 3 and once["lr"][0] > once["lr"][1] > once["lr"][2] >= 5e-3 * 0.1 - 1e-12
    every7 = fit(*(lambda m: (m, tr, va))(SchNet(n_features=16, n_interactions=2, n_rbf=12, cutoff=4.0)),
                 TrainConfig(epochs=3, batch_size=1, lr=5e-3, seed=0, val_every_steps=7, max_steps=25))
    assert every7["val_steps"] == [7, 14, 21, 25]  # every 7 steps across passes, and the last
    assert thrice["val_steps"] == [3, 6, 9, 12, 15, 18, 21, 24, 25]
    assert thrice["step_loss"] == once["step_loss"]
    at_ends = [thrice["val_force_mae"][thrice["val_steps"].index(s)] for s in once["val_steps"]]
    assert np.allclose(at_ends, once["val_force_mae"], rtol=1e-6)
    with pytest.raises(ValueError, match="val_per_epochs"):
        TrainConfig.from_dict({"val_per_epochs": 2})
    with pytest.raises(ValueError, match=r"val_every_steps = 0: allowed values are null or integers >= 1"):
        TrainConfig.from_dict({"val_every_steps": 0})
    for bad in (0, -1, 1.5):  # once quietly read as 1; now refused with the allowed values
        with pytest.raises(ValueError, match=r"val_per_epoch = .*integers >= 1"):
            TrainConfig.from_dict({"val_per_epoch": bad})

def test_frames_npz_roundtrip(tmp_path):
    from reprozoo.blocks.atomistic import frames_to_arrays

    frames = make_emt_frames("pt_cluster", n_frames=3, seed=4, size=1)
    np.savez(tmp_path / "frames.npz", **frames_to_arrays(frames))
    data = AtomsData.from_npz(tmp_path, cutoff=3.5)
    b = data.collate([0, 2])
    assert b.n_structures == 2 and b.positions.shape == (26, 3) and b.forces.shape == (26, 3)
    np.testing.assert_allclose(b.energy.numpy(), frames["energy"][[0, 2]])
    np.testing.assert_array_equal(b.batch.numpy(), np.repeat([0, 1], 13))
    assert b.edge_index.max() < 26 and torch.all(b.edge_index[:, b.batch[b.edge_index[0]] == 1] >= 13)


def test_precision_at_k_per_query_units_average_to_the_pooled_value():
    """The per-query fractions (a retrieval claim's test units) average to the pooled precision, and
    two well-separated labelled clusters retrieve their own label."""
    from reprozoo.blocks.atomistic.descriptors import precision_at_k

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.1, (10, 4)) + 3, rng.normal(0, 0.1, (10, 4)) - 3])
    y = np.array([0] * 10 + [1] * 10)
    per = precision_at_k(x, y, k=3, per_query=True)
    assert per.shape == (20,) and np.allclose(per, 1.0)
    noisy = rng.normal(size=(30, 4))
    labels = rng.integers(0, 3, 30)
    assert np.isclose(precision_at_k(noisy, labels, k=4, per_query=True).mean(), precision_at_k(noisy, labels, k=4))
