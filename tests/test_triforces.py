"""TriForces numerics: invariances of the power-spectrum and composition streams, the Legendre
identity of the power spectrum, forces of the fused model, the self-supervised objectives,
retrieval precision, the data split, determinism, and a tiny end-to-end run."""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ase")

from reprozoo.blocks.atomistic import AtomsData, fit, fit_energy_scale, frames_from_atoms, neighbor_list  # noqa: E402
from reprozoo.blocks.atomistic.descriptors import (LEGENDRE, PowerSpectrum, composition_tokens,  # noqa: E402
                                                   legendre, power_spectrum_pairs, precision_at_k,
                                                   sigreg_epps_pulley)
from reprozoo.methods.triforces.model import CompositionStream, TriForces, build  # noqa: E402
from reprozoo.methods.triforces.pretrain import pretrain, pretrain_loss, two_views  # noqa: E402

CUT = 4.0
torch.set_num_threads(1)  # the test machine is shared: no intra-op threads
MODEL = {"backbone": {"n_features": 12, "n_interactions": 1, "n_rbf": 8, "cutoff": CUT},
         "composition": {"dim": 8, "heads": 2, "layers": 1},
         "structural": {"dim": 8, "n_radial": 3, "l_max": 4, "cutoff": CUT, "r_min": 1.5}, "head_hidden": 12}


def _alloys(n=6, seed=0):
    """Small rattled, strained EMT alloy cells of three prototypes (fcc / bcc / hcp), 2 elements each."""
    from ase.build import bulk
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        proto = ["fcc", "bcc", "hcp"][k % 3]
        a = {"fcc": bulk("Cu", "fcc", a=3.7, cubic=True), "bcc": bulk("Cu", "bcc", a=2.95, cubic=True),
             "hcp": bulk("Cu", "hcp", a=2.6, c=4.25, orthorhombic=True)}[proto].repeat((2, 1, 1))
        a.numbers = rng.choice([29, 79, 28], size=len(a))
        eps = rng.normal(0, 0.02, (3, 3))
        a.set_cell(a.cell.array @ (np.eye(3) + 0.5 * (eps + eps.T)), scale_atoms=True)
        a.positions += rng.normal(0, 0.08, a.positions.shape)
        a.calc = EMT()
        out.append(a)
    return out


@pytest.fixture(scope="module")
def atoms():
    return _alloys()


@pytest.fixture(scope="module")
def data(atoms):
    return AtomsData(frames_from_atoms(atoms), CUT).precompute()


def _rotation(seed=1):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    return q * np.sign(np.linalg.det(q))


def _transform(a, rot=None, shift=None, perm=None):
    a = a.copy()
    if rot is not None:
        a.set_cell(a.cell.array @ rot.T, scale_atoms=False)
        a.positions = a.positions @ rot.T
    if shift is not None:
        a.positions = a.positions + shift
    if perm is not None:
        a = a[perm]
    return a


def _ps_of(a, ps):
    i, j, _, sh = neighbor_list(a.positions, CUT, a.cell.array, a.pbc)
    return ps(torch.tensor(a.positions), torch.tensor(np.stack([i, j])), torch.tensor(sh))


# --- structural stream ---------------------------------------------------------------------------------

def test_legendre_coefficients():
    x = torch.linspace(-1, 1, 11, dtype=torch.float64)
    mono = torch.stack([x**k for k in range(7)], -1) @ torch.tensor(LEGENDRE).T
    assert torch.allclose(mono, legendre(x, 6), atol=1e-12)


def test_power_spectrum_equals_pair_sum(atoms):
    """The O(E) moment form equals the literal sum over neighbour pairs of g_n g_n' P_l(cos)."""
    ps = PowerSpectrum(n_radial=3, l_max=4, cutoff=CUT).double()
    for a in atoms[:3]:
        i, j, _, sh = neighbor_list(a.positions, CUT, a.cell.array, a.pbc)
        args = (torch.tensor(a.positions), torch.tensor(np.stack([i, j])), torch.tensor(sh))
        fast, ref = ps(*args), power_spectrum_pairs(ps, *args)
        assert fast.shape == (len(a), 6 * 5)
        assert torch.allclose(fast, ref, rtol=1e-10, atol=1e-10)


def test_power_spectrum_invariances(atoms):
    ps = PowerSpectrum(n_radial=4, l_max=4, cutoff=CUT).double()
    a = atoms[2]
    p0 = _ps_of(a, ps)
    # rotation (cell and positions together), translation: per-atom identical
    assert torch.allclose(_ps_of(_transform(a, rot=_rotation()), ps), p0, atol=1e-9)
    assert torch.allclose(_ps_of(_transform(a, shift=np.array([0.37, -1.2, 2.9])), ps), p0, atol=1e-9)
    # permutation: per-atom rows permute, the per-structure sum is unchanged
    perm = np.random.default_rng(0).permutation(len(a))
    pp = _ps_of(_transform(a, perm=perm), ps)
    assert torch.allclose(pp, p0[perm], atol=1e-9)
    assert torch.allclose(pp.sum(0), p0.sum(0), atol=1e-9)
    # and it is not trivially constant: a different structure differs
    assert not torch.allclose(_ps_of(atoms[0], ps).mean(0), p0.mean(0), atol=1e-3)


def test_structural_stream_invariant_in_model(atoms):
    torch.manual_seed(0)
    model = build(MODEL, streams=True).double().eval()
    rot, perm = _rotation(3), np.random.default_rng(2).permutation(len(atoms[1]))
    variants = [atoms[1], _transform(atoms[1], rot=rot, shift=np.array([1.0, 2.0, -0.5]), perm=perm)]
    zeros = [np.zeros((len(a), 3)) for a in variants]
    d = AtomsData(frames_from_atoms(variants, energies=[0.0, 0.0], forces=zeros), CUT).precompute()
    b = d.collate([0, 1], dtype=torch.float64)
    x = model.streams(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, 2)
    n = len(atoms[1])
    for k in ("structural", "backbone", "composition"):
        assert torch.allclose(x[k][n:], x[k][:n][perm], atol=1e-9), k
    e, _ = model.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, 2)
    assert torch.allclose(e[0], e[1], atol=1e-9)


# --- composition stream --------------------------------------------------------------------------------

def test_composition_tokens():
    numbers = torch.tensor([79, 29, 29, 28, 28, 28, 29])
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    z, counts, valid, tok = composition_tokens(numbers, batch, 2)
    assert z.tolist() == [[29, 79], [28, 29]]
    assert counts.tolist() == [[2.0, 1.0], [3.0, 1.0]]
    assert valid.all()
    assert z[batch, tok].tolist() == numbers.tolist()


def test_composition_stream_permutation_and_supercell_invariance():
    torch.manual_seed(0)
    cs = CompositionStream(dim=8, heads=2, layers=2).double().eval()
    numbers = torch.tensor([29, 79, 79, 29, 29, 28])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    batch = torch.zeros(6, dtype=torch.long)
    node, graph = cs(numbers, batch, 1)
    node_p, graph_p = cs(numbers[perm], batch, 1)
    assert torch.allclose(graph_p, graph, atol=1e-12)
    assert torch.allclose(node_p, node[perm], atol=1e-12)
    # a 2x supercell has the same composition (fractions): same features
    node2, graph2 = cs(numbers.repeat(2), torch.zeros(12, dtype=torch.long), 1)
    assert torch.allclose(graph2, graph, atol=1e-12)
    # batched with another structure: unchanged (no leakage across structures)
    nb = torch.cat([numbers, torch.tensor([47, 47, 13])])
    bb = torch.cat([batch, torch.ones(3, dtype=torch.long)])
    node3, graph3 = cs(nb, bb, 2)
    assert torch.allclose(graph3[0], graph[0], atol=1e-12) and torch.allclose(node3[:6], node, atol=1e-12)
    # and it depends on the composition
    _, g4 = cs(torch.tensor([29, 29, 29, 29, 29, 28]), batch, 1)
    assert not torch.allclose(g4, graph, atol=1e-4)


# --- forces, training, pre-training ---------------------------------------------------------------------

def test_forces_are_minus_grad_energy_of_finetuned_model(data):
    torch.manual_seed(0)
    model = build(MODEL, streams=True)
    fit_energy_scale(model, data)
    fit(model, data, None, {"epochs": 2, "batch_size": 3, "lr": 3e-3, "seed": 0, "energy_weight": 50.0})
    model = model.double().eval()
    b = data.collate([0, 1], dtype=torch.float64)
    e, f = model.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, 2)
    h = 1e-5
    rng = np.random.default_rng(0)
    for atom in rng.choice(len(b.numbers), 4, replace=False):
        for ax in range(3):
            pos = b.positions.clone()
            pos[atom, ax] += h
            ep = model(b.numbers, pos, b.batch, b.edge_index, b.shifts, 2).sum()
            pos[atom, ax] -= 2 * h
            em = model(b.numbers, pos, b.batch, b.edge_index, b.shifts, 2).sum()
            fd = -(ep - em).item() / (2 * h)
            assert abs(fd - f[atom, ax].item()) < 1e-6 * max(1.0, abs(fd))
    # forces sum to zero per structure (translation invariance of the energy)
    assert torch.allclose(torch.zeros(3, dtype=torch.float64), f[b.batch == 0].sum(0), atol=1e-9)


def test_cached_power_spectrum_gives_the_live_energies_forces_and_gradients(data):
    """Round 6: the fixed cells' power spectra and Jacobians (model.cache_power_spectrum) give the
    live descriptor's energies, forces and force-loss parameter gradients; a moved cell is not
    served from the cache."""
    from reprozoo.blocks.atomistic import loss_terms
    from reprozoo.methods.triforces import model as tm

    torch.manual_seed(0)
    model = build(MODEL, streams=True).float()
    fit_energy_scale(model, data)
    with torch.no_grad():  # non-trivial weights everywhere
        for q in model.parameters():
            q.add_(0.1 * torch.randn_like(q))
    saved = dict(tm._PS_CACHE)
    tm._PS_CACHE.clear()
    try:
        assert tm.cache_power_spectrum(model.structural.ps, data) == len(data)
        assert tm.cache_power_spectrum(model.structural.ps, data) == 0  # keyed by content: no recompute
        b = data.collate([0, 2, 4], dtype=torch.float32)
        out = {}
        for use in (False, True):
            model.structural.use_cache = use
            model.zero_grad()
            loss = loss_terms(model, b, 50.0, 1.0)[0]
            e, f = model.energy_and_forces(b.numbers, b.positions, b.batch, b.edge_index, b.shifts, 3,
                                           create_graph=False)
            loss.backward()
            grads = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])
            out[use] = (e.detach(), f.detach(), grads, loss.item())
        (e0, f0, g0, l0), (e1, f1, g1, l1) = out[False], out[True]
        assert torch.allclose(e0, e1, rtol=1e-6, atol=1e-5)
        assert torch.allclose(f0, f1, rtol=1e-4, atol=1e-6 * float(f0.abs().max()))
        assert g0.shape == g1.shape and torch.allclose(g0, g1, rtol=1e-3, atol=1e-5 * float(g0.abs().max()))
        assert abs(l0 - l1) <= 1e-5 * abs(l0)
        # the cached path is really taken: the cached descriptor's Jacobian is the live one's
        x = b.positions.clone().requires_grad_(True)
        s = model.structural
        p_live = s.ps(x, b.edge_index, b.shifts, x.shape[0])
        p_hit = s.descriptors(b.numbers, x, b.batch, b.edge_index, b.shifts)
        w = torch.randn_like(p_live)
        g_live, = torch.autograd.grad((p_live * w).sum(), x)
        g_hit, = torch.autograd.grad((p_hit * w).sum(), x)
        assert torch.allclose(g_live, g_hit, rtol=1e-4, atol=1e-5 * float(g_live.abs().max()))
        # a moved cell misses the cache (live path): its descriptor changes with the positions
        moved = b.positions + 0.05
        keys = tm._cell_keys(s.ps, b.numbers, moved, b.batch, b.edge_index, b.shifts)
        assert all(k not in tm._PS_CACHE for k in keys)
        moved2 = b.positions.clone()
        moved2[0, 0] += 0.1
        assert not torch.allclose(s.descriptors(b.numbers, moved2, b.batch, b.edge_index, b.shifts),
                                  s.descriptors(b.numbers, b.positions, b.batch, b.edge_index, b.shifts))
    finally:
        model.structural.use_cache = True
        tm._PS_CACHE.clear()
        tm._PS_CACHE.update(saved)


def test_small_cell_graphs_match_ase(atoms):
    """The alloy cells (smaller than the cutoff), also with atoms moved out of the cell: ASE's pairs."""
    from ase.neighborlist import neighbor_list as ase_neighbor_list

    rng = np.random.default_rng(0)
    moved = [a.copy() for a in atoms]
    for a in moved:
        a.positions += rng.integers(-2, 3, (len(a), 3)) @ a.cell.array
    both = atoms + moved
    data = AtomsData(frames_from_atoms(both, energies=[0.0] * len(both), forces=[np.zeros((len(a), 3)) for a in both]),
                     CUT).precompute()
    assert sorted(data._graphs) == list(range(2 * len(atoms)))   # built up front, as triforces' atoms_data
    for k, a in enumerate(both):
        i, j, S, sh = neighbor_list(a.positions, CUT, a.cell.array, a.pbc)
        ri, rj, rS, rd = ase_neighbor_list("ijSd", a, CUT)
        ref = dict(zip(zip(ri.tolist(), rj.tolist(), map(tuple, rS.tolist())), rd.tolist()))
        got = dict(zip(zip(i.tolist(), j.tolist(), map(tuple, S.tolist())),
                       np.linalg.norm(a.positions[j] - a.positions[i] + sh, axis=1).tolist()))
        assert got.keys() == ref.keys()
        np.testing.assert_allclose([got[key] for key in ref], list(ref.values()), atol=1e-9)
        gi, gj, gsh = data._graphs[k]
        np.testing.assert_array_equal(gi, i), np.testing.assert_array_equal(gj, j), np.testing.assert_allclose(gsh, sh)


PRE = {"batch_size": 6, "lr_grid": [3e-3], "pilot_steps": 4, "eval_every": 4, "min_steps": 40, "max_steps": 60,
       "flat_tol": 0.01, "lr_drop": 0, "sigreg_slices": 16, "proj_dim": 8, "head_hidden": 16}


def test_pretrain_objectives_and_loss_decreases(atoms):
    pool = AtomsData(frames_from_atoms(_alloys(12, seed=5)), CUT).precompute()
    pool.frames["energy"], pool.frames["forces"] = None, None      # unlabelled
    cfg = dict(PRE)
    model, heads, hist = pretrain(lambda: build(MODEL, streams=True), pool, pool, cfg, seed=0)
    assert np.mean(hist["loss"][-10:]) < 0.8 * np.mean(hist["loss"][:3])
    assert min(hist["val_loss"]) < 0.8 * hist["val_loss"][0]
    assert min(hist["val_denoise"]) < hist["val_denoise"][0] and min(hist["val_mask"]) < hist["val_mask"][0]
    # the reference of the masking task is fixed (same masks at every validation)
    assert len(set(hist["val_mask_visible_majority"])) == 1
    # two views: the second half of the batch is the first, shifted in indices
    b = pool.collate([0, 1], dtype=torch.float32)
    b2 = two_views(b)
    assert b2.n_structures == 4 and torch.equal(b2.edge_index[:, b.edge_index.shape[1]:], b.edge_index + len(b.numbers))
    terms = pretrain_loss(model, heads, b2, {**cfg, "noise": [0.05, 0.1], "noise_unit": 0.1, "mask_prob": 0.3,
                                             "weights": {"denoise": 1, "mask": 1, "jepa": 1}},
                          torch.Generator().manual_seed(0))
    assert all(torch.isfinite(torch.as_tensor(v)) for v in terms.values())


def test_visible_majority_is_the_composition_guess():
    """The masking task's reference: for each masked atom, the most common element among the visible
    atoms of its own structure (ties: smaller Z), never the masked atoms' own labels."""
    from reprozoo.methods.triforces.pretrain import visible_majority

    numbers = torch.tensor([29, 29, 79, 79, 79, 28, 28, 46])
    batch = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    masked = torch.tensor([False, False, True, True, False, True, False, False])
    # structure 0: visible 29, 29, 79 -> 29; structure 1: visible 28, 46 (tie) -> 28
    assert visible_majority(numbers, masked, batch, 2).tolist() == [29, 29, 28]
    # an all-masked structure guesses the mask token (never right)
    assert visible_majority(numbers, torch.ones(8, dtype=torch.bool), batch, 2).tolist() == [0] * 8


def test_relaxed_pretraining_cells_are_emt_minima_and_carry_atom_size(tiny_pool):
    """The pre-training cells are EMT-relaxed at fixed cell: lower energy, small residual forces, cached
    (the same positions on a second call), and in relaxed Cu-Au cells an atom's mean nearest-neighbour
    distance tells its element (Au, the larger atom, sits farther from its neighbours), which the
    rattled cells do not show as clearly: geometry carries information about a masked element."""
    from ase import Atoms

    from reprozoo.data.md import load
    from reprozoo.data.md.potentials import FastEMT
    from reprozoo.methods.triforces.method import relaxed

    d = load(tiny_pool)
    idx = [i for i in range(len(d)) if len(set(d.frame(i)["numbers"].tolist())) == 2][:6]
    assert idx
    rx = relaxed(d, idx, 0.05, 200)
    assert all(np.array_equal(rx[i], relaxed(d, [i], 0.05, 200)[i]) for i in idx)
    for i in idx:
        f = d.frame(i)
        at = Atoms(numbers=f["numbers"], positions=f["positions"], cell=f["cell"], pbc=f["pbc"])
        at.calc = FastEMT()
        e0 = at.get_potential_energy()
        at.positions = rx[i]
        assert at.get_potential_energy() < e0
        assert np.abs(at.get_forces()).max() < 0.05 + 1e-9
    # atom size in relaxed positions: a Cu-Au solid solution on fcc, relaxed vs as built
    from ase.build import bulk
    from ase.neighborlist import neighbor_list as ase_nl

    at = bulk("Cu", "fcc", a=3.85, cubic=True).repeat((2, 2, 2))
    at.numbers = np.random.default_rng(0).permutation([29] * 16 + [79] * 16)
    at.calc = FastEMT()
    from ase.optimize import FIRE
    FIRE(at, logfile=None).run(fmax=0.05, steps=300)
    i, dist = ase_nl("id", at, 3.2)
    nn = np.array([dist[i == k].mean() for k in range(len(at))])
    assert nn[at.numbers == 79].mean() > nn[at.numbers == 29].mean() + 0.02


def test_projection_latent_is_the_pretraining_projection(tmp_path):
    """The retrieval latent of the untrained model is the projection head the pre-training starts from
    (same seed, drawn right after the model): pre-training is the only difference between the two."""
    from reprozoo.methods.triforces.method import latents, projection
    from reprozoo.methods.triforces.model import PretrainHeads

    p = {"model": MODEL, "pretrain": {"proj_dim": 8, "head_hidden": 16}}
    proj = projection(p, "triforces_scratch", tmp_path, seed=3)
    torch.manual_seed(3)
    m = build(MODEL, streams=True)
    ref = PretrainHeads(m.fused_dim, 16, 8).proj
    assert all(torch.equal(a, b) for a, b in zip(proj.state_dict().values(), ref.state_dict().values()))
    data = AtomsData(frames_from_atoms(_alloys(4, seed=2)), CUT).precompute()
    z = latents(m, data, proj)
    assert z.shape == (4, 8) and np.isfinite(z).all()


def test_sigreg_prefers_gaussian_embeddings():
    g = torch.Generator().manual_seed(0)
    gauss = torch.randn(256, 8, generator=g, dtype=torch.float64)
    collapsed = torch.zeros(256, 8, dtype=torch.float64) + 0.01 * torch.randn(256, 8, generator=g, dtype=torch.float64)
    s_gauss = sigreg_epps_pulley(gauss, 32, generator=torch.Generator().manual_seed(1))
    s_coll = sigreg_epps_pulley(collapsed, 32, generator=torch.Generator().manual_seed(1))
    assert s_gauss < 0.1 * s_coll


def test_pretraining_and_finetuning_are_deterministic(data):
    pool = AtomsData(frames_from_atoms(_alloys(6, seed=9)), CUT).precompute()
    pool.frames["energy"], pool.frames["forces"] = None, None
    outs = []
    for _ in range(2):
        model, _, hist = pretrain(lambda: build(MODEL, streams=True), pool, pool,
                                  {**PRE, "batch_size": 3, "sigreg_slices": 8, "min_steps": 8, "max_steps": 12}, seed=3)
        m2 = copy.deepcopy(model)
        fit_energy_scale(m2, data)
        fit(m2, data, None, {"epochs": 1, "batch_size": 3, "seed": 4})
        outs.append((hist["loss"], hist["val_loss"], [p.detach().clone() for p in m2.parameters()]))
    assert outs[0][0] == outs[1][0] and outs[0][1] == outs[1][1]
    assert all(torch.equal(p, q) for p, q in zip(outs[0][2], outs[1][2]))


def test_precision_at_k():
    x = np.array([[0, 1.0], [0, 1.1], [0, 0.9], [1.0, 0], [1.1, 0], [0.9, 0]])
    assert precision_at_k(x, [0, 0, 0, 1, 1, 1], k=2) == 1.0
    assert precision_at_k(x, [0, 1, 0, 1, 0, 1], k=2) < 0.5


def test_encoder_state_transfers_everything_but_the_energy_head():
    torch.manual_seed(0)
    a = build(MODEL, streams=True)
    torch.manual_seed(1)
    b = build(MODEL, streams=True)
    missing, unexpected = b.load_state_dict(a.encoder_state(), strict=False)
    assert not unexpected and all(k.startswith("head.") or k in ("atomref", "e_mean", "e_std") for k in missing)
    assert torch.equal(a.structural.mlp[0].weight, b.structural.mlp[0].weight)
    assert not torch.equal(a.head[0].weight, b.head[0].weight)
    plain = build(MODEL, streams=False)
    assert plain.composition is None and plain.structural is None and plain.fused_dim == 12
    assert isinstance(plain, TriForces)


# --- data split and a tiny end-to-end run ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pool(tmp_path_factory):
    from reprozoo.data.md import alloy_pool

    raw = tmp_path_factory.mktemp("raw")
    out = tmp_path_factory.mktemp("pool")
    params = {"n_structures": 40, "prototypes": ["fcc", "bcc", "hcp", "sc", "fct", "hcp_flat"], "elements": ["Cu", "Au", "Ni"],
              "min_atoms": 4, "max_atoms": 8, "strain_std": 0.03, "rattle": [0.01, 0.1], "solid_solution_prob": 0.5,
              "split": [0.6, 0.1, 0.3]}
    alloy_pool.acquire("offline", params, raw, 7)
    alloy_pool.preprocess(raw, out, params)
    return out


def _shells(at, rmax=1.75, ndigits=2):
    """Coordination shells (distance in units of the nearest-neighbour distance, atoms per shell)."""
    from ase.neighborlist import neighbor_list as ase_nl

    d = ase_nl("d", at * (3, 3, 3), rmax * 4.0)
    d = np.round(d / d.min(), ndigits)
    u, c = np.unique(d[d <= rmax], return_counts=True)
    return tuple(zip(u.tolist(), (c / (27 * len(at))).round(3).tolist()))


def test_pool_prototypes_differ_in_geometry():
    """Retrieval by prototype must be answerable from positions: the perfect lattices of the pool's
    prototypes have pairwise different coordination shells (the old fcc / L1_2 / L1_0 did not), the
    distorted ones keep their parent's atomic volume, and the nearest-neighbour distance the
    generator uses for its minimum-distance check is the lattice's."""
    from ase.neighborlist import neighbor_list as ase_nl

    from reprozoo.data.md import alloy_pool as ap

    shells = {}
    for proto in ap.PROTOTYPES:
        at, nn = ap._base_cell(proto, 3.6)
        assert abs(ase_nl("d", at * (3, 3, 3), 6.0).min() - nn) < 1e-9, proto
        per = ap.ATOMS_PER_A3[ap.CRYSTAL[proto]]
        assert abs(at.get_volume() / len(at) - 3.6 ** 3 / per) < 1e-9, proto
        shells[proto] = _shells(at)
    assert shells["fcc"][0] == (1.0, 12.0) and shells["bcc"][:2] == ((1.0, 8.0), (1.15, 6.0))
    assert shells["sc"][0] == (1.0, 6.0) and shells["hcp"][0] == (1.0, 12.0)
    assert shells["fct"][0] == (1.0, 4.0) and shells["hcp_flat"][0] == (1.0, 6.0)
    assert len(set(shells.values())) == len(ap.PROTOTYPES), shells


def test_pool_prototypes_retrievable_from_geometry(tiny_pool):
    """The dataset can answer the retrieval claim: the element-blind mean power spectrum of the
    rattled, strained cells retrieves the prototype well above chance (no learning involved)."""
    from reprozoo.data.md import load
    from reprozoo.methods.triforces.method import _chance

    d = load(tiny_pool)
    ps = PowerSpectrum(n_radial=4, l_max=4, cutoff=CUT, r_min=1.5).double()
    feats = []
    for i in range(len(d)):
        f = d.frame(i)
        ii, jj, _, sh = neighbor_list(f["positions"], CUT, f["cell"], np.asarray(f["pbc"], bool))
        x = ps(torch.tensor(f["positions"]), torch.tensor(np.stack([ii, jj])), torch.tensor(sh)).mean(0)
        feats.append(x / x.norm())
    proto = d.extras["prototype"]
    p5 = precision_at_k(torch.stack(feats).double().numpy(), proto, 5)
    assert p5 > _chance(proto) + 0.25, (p5, _chance(proto))


def test_split_is_disjoint_and_deterministic(tiny_pool):
    from reprozoo.data.md import load
    from reprozoo.methods.triforces.method import split_pool

    d = load(tiny_pool)
    p = {"n_label_pool": 10, "n_val": 3, "n_train": [5, 10], "split_seed": 0}
    s1, s2 = split_pool(d, p), split_pool(d, p)
    assert all(np.array_equal(s1[k], s2[k]) for k in s1)
    sets = [set(s1[k].tolist()) for k in ("test", "labelled", "val", "unlabelled")]
    assert all(not (a & b) for n, a in enumerate(sets) for b in sets[n + 1:])
    assert sum(map(len, sets)) == len(d) and len(sets[2]) == 3
    assert (d.table["split"].to_numpy()[s1["test"]] == "test").all()


def test_end_to_end_tiny(tiny_pool, tmp_path):
    from reprozoo.methods.triforces import method
    from reprozoo.runtime import RunContext

    p = {"n_train": [5, 10], "n_label_pool": 10, "n_val": 3, "split_seed": 0, "retrieval_k": 3, "model": MODEL,
         "pretrain_relax": {"fmax": 0.2, "steps": 5},
         "pretrain": {"lr_grid": [2e-3], "pilot_steps": 2, "eval_every": 1, "min_steps": 3, "max_steps": 6,
                      "batch_size": 8, "sigreg_slices": 8, "proj_dim": 8, "head_hidden": 8},
         "finetune": {"lr_grid": [1e-3, 3e-3], "pilot_steps": 2, "eval_every": 1, "min_steps": 3, "max_steps": 5,
                      "flat_tol": 0.01, "clip": 10.0, "batch_size": 4, "energy_weight": 50.0, "force_weight": 1.0}}
    data = {method.DATASET: tiny_pool}
    shared = tmp_path / "shared"
    shared.mkdir()
    ctx = RunContext("triforces", "shared", 0, "ci", p, data, shared, shared)
    method.train_shared(ctx)
    assert (shared / "three_stream.pt").exists() and (shared / "backbone_only.pt").exists()
    results = {}
    for v in ("triforces", "triforces_scratch", "backbone_only_pretrained"):
        out = tmp_path / v
        out.mkdir()
        c = RunContext("triforces", v, 0, "ci", p, data, out, shared)
        method.train(c)
        results[v] = c.metrics
        xs, ys = c.metrics.curves["energy_mae"]
        assert xs == [5.0, 10.0] and all(np.isfinite(ys)) and all(y > 0 for y in ys)
        assert 0.0 <= c.metrics.scalars["retrieval_p5"] <= 1.0
    assert results["triforces"].scalars["n_parameters"] > results["backbone_only_pretrained"].scalars["n_parameters"]
    # the pre-training ablation is the same architecture: same size, different (untrained) latent
    assert results["triforces_scratch"].scalars["n_parameters"] == results["triforces"].scalars["n_parameters"]
    assert results["triforces_scratch"].curves["energy_mae"][1] != results["triforces"].curves["energy_mae"][1]
    # every variant records its fine-tuning validation curves with the lr; the pre-trained one also
    # the pre-training's held-out curve (what the convergence gate reads), per-cell energy units
    for v, m in results.items():
        for n in (5, 10):
            assert len(m.curves[f"val_loss_n{n}"][0]) == len(m.curves[f"lr_n{n}"][0]) >= 2
            # the learning rate was chosen from the grid by the pilots' validation losses (shared rule)
            grid, pilot = m.curves[f"lr_pilot_val_n{n}"]
            assert grid == [1e-3, 3e-3] and m.scalars[f"lr_chosen_n{n}"] == grid[int(np.argmin(pilot))]
            assert max(m.curves[f"lr_n{n}"][1]) == pytest.approx(m.scalars[f"lr_chosen_n{n}"])
            assert 3 <= m.scalars[f"steps_n{n}"] <= 5
        assert len(m.unit_values["energy_mae_nmin"]) == len(m.unit_values["retrieval_p5"]) > 1
        assert ("pretrain_val_loss" in m.curves) == (v != "triforces_scratch")
    assert results["triforces"].curves["pretrain_val_loss"][0][0] == 0.0
    assert 0.0 <= results["triforces"].scalars["pretrain_mask_majority"] <= 1.0
    with pytest.raises(ValueError, match="min_pretrain_ratio"):
        method.check_pretrain_ratio(99, {"n_train": [5, 10], "min_pretrain_ratio": 10})
    assert method.check_pretrain_ratio(100, {"n_train": [5, 10], "min_pretrain_ratio": 10}) == 10


# --- convergence plumbing and per-unit metrics ------------------------------------------------------------

def test_per_query_precision_and_per_cell_errors_match_the_pooled_metrics(data):
    from reprozoo.blocks.atomistic import evaluate
    from reprozoo.methods.triforces.method import atomref_errors, per_cell_errors

    rng = np.random.default_rng(0)
    x, lab = rng.normal(size=(30, 4)), rng.integers(0, 3, 30)
    x[:, 0] += 2 * lab
    per = precision_at_k(x, lab, 5, per_query=True)
    assert per.shape == (30,) and abs(per.mean() - precision_at_k(x, lab, 5)) < 1e-12
    torch.manual_seed(0)
    model = build(MODEL, streams=True)
    scale = fit_energy_scale(model, data)
    e, f = per_cell_errors(model, data, batch_size=4)
    ref = evaluate(model, data, batch_size=3)
    assert e.shape == (len(data),)
    assert abs(e.mean() - ref["energy_mae_per_atom"]) < 1e-5 and abs(f - ref["force_mae"]) < 1e-5
    # the composition-only model: exact on energies that are a sum of per-element references
    lin = copy.deepcopy(data)
    eps = {28: -0.5, 29: -1.0, 79: -2.0}
    lin.frames["energy"] = np.array([sum(eps[int(z)] for z in n) for n in lin.frames["numbers"]])
    assert np.abs(atomref_errors(fit_energy_scale(model, lin), lin)).max() < 1e-9
    assert atomref_errors(scale, data).mean() > 0


def test_smoke_fine_tuning_rule_can_pass_the_gate():
    """The smoke config's training rules (shared fit_to_plateau) for the fine-tunes AND the
    pre-training: the same grid for every variant (one ``finetune`` block, one ``pretrain`` block for
    both pre-trained models), >= 3 rates bracketing the published fine-tuning rate 1e-3; the plateau
    stop is the gate's own test at half the gate's tolerance; the earliest stop leaves >= 6
    validations in the gate's window; the rule's one rate drop (default 0.1, the gate's floor) is on,
    or off with a weight average (ema_decay) in its place; pilots are short (<= 10 % of the step cap); the smallest N gives the
    from-scratch reference >= 20 cells, and the gated fine-tuning curves are exactly the sizes the config
    trains (round 7: N = 20 alone at smoke); the pre-training sees >= 2 passes over its pool before it may
    stop, and the pool is relaxed."""
    import pathlib

    import yaml

    from reprozoo import registry
    from reprozoo.blocks.fitting import DEFAULT_LR_DROP
    from reprozoo.claims import TAIL

    root = pathlib.Path(__file__).parents[1] / "src/reprozoo/methods/triforces"
    cfg = yaml.safe_load((root / "configs/smoke.yaml").read_text())
    tol = min(c.tol for c in registry.get("triforces").convergence)
    for rule in (cfg["finetune"], cfg["pretrain"]):
        assert len(rule["lr_grid"]) >= 3 and rule["flat_tol"] <= 0.5 * tol
        assert TAIL * rule["min_steps"] / rule["eval_every"] >= 6
        # a constant rate's noise floor is left behind by the rule's one drop (default 0.1 x), or the
        # drop is off and the rule validates an exponential moving average of the weights instead
        drop = rule.get("lr_drop", DEFAULT_LR_DROP)
        assert drop == pytest.approx(0.1) or (not drop and 0.9 <= rule["ema_decay"] < 1)
        assert rule["pilot_steps"] <= 0.1 * rule["max_steps"]
        assert "epochs" not in rule and "lr_final_factor" not in rule  # no cosine, no fixed pass count
    assert min(cfg["finetune"]["lr_grid"]) < 1e-3 < max(cfg["finetune"]["lr_grid"])
    ns = [int(n) for n in cfg["n_train"]]
    assert min(ns) >= 20 and cfg["min_pretrain_ratio"] >= 10
    gated = {c.curve for c in registry.get("triforces").convergence if c.curve.startswith("val_loss_n")}
    assert gated == {f"val_loss_n{n}" for n in ns}
    n_pool = 1500 - 150 - cfg["n_label_pool"] - cfg["n_val"]   # smoke pool size minus test, reserve, dev
    assert cfg["pretrain"]["min_steps"] * cfg["pretrain"]["batch_size"] >= 2 * n_pool * 0.99
    assert cfg["pretrain_relax"]["fmax"] <= 0.1


def _fine_tune_params(grid, **kw):
    return {"model": MODEL, "finetune": {"lr_grid": grid, "pilot_steps": 4, "eval_every": 2, "min_steps": 10,
                                         "max_steps": 30, "flat_tol": 0.01, "clip": 10.0, "batch_size": 3,
                                         "energy_weight": 50.0, "force_weight": 1.0, **kw}}


def test_finetune_picks_the_rate_that_learns_from_the_same_start(data, tmp_path):
    """finetune (shared rule): every rate's pilot starts from the same weights on the same batches (a
    repeated call gives the same pilot scores); a rate too small to move the weights loses to one that
    learns; the chosen run keeps a constant rate (no schedule to zero) and ends with a lower
    validation loss than it started with; the atomref scale is the composition-only fit."""
    from reprozoo.blocks.atomistic import evaluate
    from reprozoo.methods.triforces.method import finetune

    p = _fine_tune_params([1e-9, 3e-3])
    model, rec, scale = finetune(p, "triforces_scratch", tmp_path, data, data, seed=0, progress=lambda *_: None)
    assert rec["lr"] == 3e-3 and rec["pilot_best"][3e-3] < rec["pilot_best"][1e-9]
    assert finetune(p, "triforces_scratch", tmp_path, data, data, seed=0, progress=lambda *_: None)[1]["pilot_best"] \
        == rec["pilot_best"]
    # a constant rate, then (after the first plateau) the rule's one drop: never a schedule to zero
    assert max(rec["lrs"]) == 3e-3 and set(rec["lrs"]) <= {3e-3, 3e-4} and rec["stop"] >= 10
    assert min(rec["vals"]) < rec["vals"][0]
    # the returned model carries the best-validation weights
    assert evaluate(model, data, 32, 50.0, 1.0, dtype=torch.float32)["loss"] == pytest.approx(min(rec["vals"]), rel=1e-4)
    assert set(scale["atomref"]) == {28, 29, 79}


def test_finetune_stop_is_a_plateau_the_gate_accepts(data, tmp_path):
    """A fine-tune that stops on the plateau passes the gate's own test at the gate's tolerance on the
    recorded curve, with the rate in the window >= 0.1 x its peak."""
    from reprozoo.claims import plateau, tail_fit
    from reprozoo.methods.triforces.method import finetune

    p = _fine_tune_params([3e-3, 1e-2], min_steps=20, max_steps=120, lr_drop=0.3)
    _, rec, _ = finetune(p, "triforces_scratch", tmp_path, data, data, seed=1, progress=lambda *_: None)
    if rec["plateau"]:
        assert plateau(rec["steps"], rec["vals"], tol=0.02)
    start = tail_fit(rec["steps"], rec["vals"])["tail_start"]
    lrs = np.asarray(rec["lrs"])
    assert lrs[np.asarray(rec["steps"]) >= start].min() >= 0.1 * lrs.max()


def test_pretraining_validation_is_a_fixed_corruption(data):
    """The held-out pre-training loss changes only with the weights (same noise and masks each call),
    is recorded before the first step and at the last, with the learning rate at those steps (constant,
    then one drop: the shared rule)."""
    from reprozoo.methods.triforces.pretrain import DEFAULTS, validate

    pool = AtomsData(frames_from_atoms(_alloys(6, seed=9)), CUT).precompute()
    pool.frames["energy"], pool.frames["forces"] = None, None
    cfg = {**PRE, "batch_size": 3, "sigreg_slices": 8, "eval_every": 2, "min_steps": 6, "max_steps": 30, "lr_drop": 0.1}
    model, heads, hist = pretrain(lambda: build(MODEL, streams=True), pool, data, cfg, seed=1)
    assert hist["val_step"][0] == 0 and hist["val_step"][-1] == hist["steps"]
    assert len(hist["lr"]) == len(hist["val_loss"]) == len(hist["val_step"])
    assert max(hist["lr"]) == 3e-3 and min(hist["lr"]) >= 0.1 * 3e-3 - 1e-12
    full = {**DEFAULTS, **cfg, "weights": DEFAULTS["weights"]}
    a, b = validate(model, heads, data, full), validate(model, heads, data, full)
    assert a == b and a["loss"] == pytest.approx(min(hist["val_loss"]), rel=1e-5)


def test_encoder_rate_scale_is_adam_with_a_per_group_rate(data, tmp_path):
    """finetune's ``encoder_lr_scale`` s (round 10: discriminative rates inside the shared rule, whose
    optimiser has one parameter group): every parameter outside the energy head is reparametrised
    w = s u, so Adam at rate lr on u moves w exactly as Adam at rate s lr (eps / s) would, and the head
    at lr; the averaged copy (deepcopy) carries it; after the fit the model is plain again (same
    state-dict keys), and s = 1 leaves finetune unchanged."""
    from reprozoo.methods.triforces.method import finetune, scale_rates, unscale_rates

    s, lr = 0.1, 1e-2
    torch.manual_seed(0)
    a = build(MODEL, streams=True).double()   # float64: Adam divides by sqrt(v), which amplifies rounding
    b = copy.deepcopy(a)
    scaled = scale_rates(b, encoder=s)
    assert scaled and not any(n.startswith("head.") for n in scaled)
    assert len(list(copy.deepcopy(b).parameters())) == len(list(a.parameters()))
    enc = [q for n, q in a.named_parameters() if not n.startswith("head.")]
    head = [q for n, q in a.named_parameters() if n.startswith("head.")]
    opt_a = torch.optim.Adam([{"params": enc, "lr": s * lr, "eps": 1e-8 / s}, {"params": head, "lr": lr}])
    opt_b = torch.optim.Adam(b.parameters(), lr=lr)
    batch = data.collate(list(range(len(data))), dtype=torch.float64)
    from reprozoo.blocks.atomistic import loss_terms
    for _ in range(5):
        for m, o in ((a, opt_a), (b, opt_b)):
            loss = loss_terms(m, batch, 50.0, 1.0)[0]
            o.zero_grad()
            loss.backward()
            o.step()
    unscale_rates(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    assert max(float((sa[k] - sb[k]).abs().max()) for k in sa) < 1e-9
    p = _fine_tune_params([3e-3], max_steps=12)
    m1, r1, _ = finetune(p, "triforces_scratch", tmp_path, data, data, seed=0, progress=lambda *_: None)
    p["finetune"]["encoder_lr_scale"] = 1.0
    assert finetune(p, "triforces_scratch", tmp_path, data, data, seed=0, progress=lambda *_: None)[1]["vals"] == r1["vals"]
    p["finetune"]["encoder_lr_scale"] = s
    m2, r2, _ = finetune(p, "triforces_scratch", tmp_path, data, data, seed=0, progress=lambda *_: None)
    assert set(m2.state_dict()) == set(m1.state_dict()) and r2["vals"] != r1["vals"]


def test_head_warmup_trains_the_head_alone_once_per_fine_tune(data, tmp_path):
    """finetune's ``head_warmup`` (round 10, a linear probe before fine-tuning, off at smoke): it moves
    the energy head only, leaves every parameter trainable again, and is computed once, so every rate's
    pilot starts from the same weights (a repeated call gives the same pilot scores)."""
    from reprozoo.blocks.atomistic import fit_energy_scale, loss_terms
    from reprozoo.methods.triforces.method import finetune, head_warmup

    torch.manual_seed(0)
    m = build(MODEL, streams=True).float()
    fit_energy_scale(m, data)
    before = copy.deepcopy(m.state_dict())

    def loss(model, gen):
        idx = torch.randint(len(data), (3,), generator=gen).tolist()
        return loss_terms(model, data.collate(idx, dtype=torch.float32), 50.0, 1.0)[0]

    head_warmup(m, loss, 5, 1e-2, seed=0)
    after = m.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith("head.") for k in moved)
    assert all(q.requires_grad for q in m.parameters())
    p = _fine_tune_params([1e-3, 3e-3], max_steps=12, head_warmup={"steps": 4, "lr": 1e-2})
    r1 = finetune(p, "triforces_scratch", tmp_path, data, data, seed=0, progress=lambda *_: None)[1]
    r2 = finetune(p, "triforces_scratch", tmp_path, data, data, seed=0, progress=lambda *_: None)[1]
    assert r1["pilot_best"] == r2["pilot_best"] and r1["vals"][0] == r2["vals"][0]
