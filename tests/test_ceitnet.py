"""CEITNet: Cartesian tensor blocks, equivariance (rotations and reflections, float64), index
symmetries, e3nn baseline, permutation invariance, crystal point-group symmetry, metrics."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprozoo.blocks.atomistic import AtomsData  # noqa: E402
from reprozoo.blocks.cartesian import (ewt, fnorm, frobenius_errors, index_symmetry_residual, n_sym,  # noqa: E402
                                       random_rotations, rotate, segment_slots, sym_contract, sym_offsets, sym_power,
                                       sym_powers, sym_weights, to_voigt, unpack)
from reprozoo.methods.ceitnet.model import CEITNet  # noqa: E402
from reprozoo.methods.ceitnet.training import (atoms_frames, equivariance_error, model_args, rotate_batch,  # noqa: E402
                                               tensor_metrics)

CUTOFF = 4.0


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: threads only contend on a shared machine (6x slower with 2 threads here)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
PERMS = {2: [(1, 0)], 3: [(0, 2, 1)], 4: [(1, 0, 2, 3), (0, 1, 3, 2), (2, 3, 0, 1)]}


def _structures(n=4, seed=0):
    """Small periodic alloy cells with rattled atoms (no symmetry left)."""
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a = bulk("Cu", "fcc", a=3.6, cubic=True) if k % 2 == 0 else bulk("Ni", "hcp", a=2.5, c=4.1)
        a.numbers = rng.choice([13, 28, 29, 79], size=len(a))
        a.set_cell(a.cell.array @ (np.eye(3) + 0.03 * rng.normal(size=(3, 3))), scale_atoms=True)
        a.rattle(0.08, seed=k + 10 * seed)
        out.append(a)
    return out


@pytest.fixture(scope="module")
def data():
    return AtomsData(atoms_frames(_structures()), CUTOFF)


def _ceitnet(order, **kw):
    torch.manual_seed(order)
    cfg = dict(n_features=16, n_channels=6, n_out=3, n_interactions=2, n_rbf=6, cutoff=CUTOFF, avg_neighbors=10.0)
    cfg.update(kw)
    m = CEITNet(order, **cfg).double()
    with torch.no_grad():  # non-trivial outputs in every basis term
        m.head.coef.weight.normal_(0, 0.5)
        m.head.coef.bias.normal_(0, 0.5)
    return m.eval()


# --- blocks ------------------------------------------------------------------------------------------

def test_packed_symmetric_powers():
    u = torch.randn(7, 3, dtype=torch.float64)
    all_p = sym_powers(u, 4)
    off = sym_offsets(4)
    for n in range(5):
        packed = sym_power(u, n)
        assert packed.shape == (7, n_sym(n))
        assert torch.equal(all_p[:, off[n]:off[n + 1]], packed)
        full = unpack(packed, n)
        ref = torch.ones(7, dtype=torch.float64)
        for _ in range(n):  # explicit outer powers
            ref = ref.unsqueeze(-1) * u.view((7,) + (1,) * (ref.dim() - 1) + (3,))
        assert torch.allclose(full, ref, atol=1e-14)
        # weighted packed contraction = full contraction
        v = torch.randn(7, 3, dtype=torch.float64)
        a, b = sym_power(u, n), sym_power(v, n)
        assert torch.allclose(sym_contract(a, b, n), (u * v).sum(-1) ** n, atol=1e-12)
        assert float(sym_weights(n).sum()) == 3**n


def test_segment_slots_and_outer_sum():
    from reprozoo.blocks.cartesian import segment_outer_sum

    idx = torch.tensor([0, 0, 0, 2, 2, 3])
    slot, k = segment_slots(idx, 5)
    assert k == 3 and slot.tolist() == [0, 1, 2, 0, 1, 0]
    w, f = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    ref = torch.zeros(5, 4, 5, dtype=torch.float64).index_add_(0, idx, w[:, :, None] * f[:, None, :])
    assert torch.allclose(segment_outer_sum(w, f, idx, 5), ref, atol=1e-13)


def test_rotate_matches_pymatgen_and_numpy():
    from pymatgen.core.tensors import Tensor

    from reprozoo.data.crystals.common import rotate as np_rotate

    r = random_rotations(1, generator=torch.Generator().manual_seed(0))[0]
    assert abs(float(torch.linalg.det(r)) - 1) < 1e-12
    for order in (2, 3, 4):
        t = torch.randn((1,) + (3,) * order, dtype=torch.float64)
        ours = rotate(t, r)[0].numpy()
        assert np.allclose(ours, np.asarray(Tensor(t[0].numpy()).rotate(r.numpy())), atol=1e-12)
        assert np.allclose(ours, np_rotate(t[0].numpy(), r.numpy()), atol=1e-12)
    refl = random_rotations(4, reflections=True, generator=torch.Generator().manual_seed(1))
    dets = torch.linalg.det(refl)
    assert torch.allclose(dets, torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64))
    assert torch.allclose(refl @ refl.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(4, 3, 3), atol=1e-12)


def test_voigt_matches_dataset_convention():
    from reprozoo.data.crystals.common import full_to_voigt, voigt_to_full

    cv = np.random.default_rng(0).normal(size=(2, 6, 6))
    cv = cv + cv.transpose(0, 2, 1)
    full = voigt_to_full(cv)
    assert np.allclose(to_voigt(torch.as_tensor(full)).numpy(), cv)
    assert np.allclose(full_to_voigt(full), cv)
    p = torch.randn(2, 3, 3, 3, dtype=torch.float64)
    p = p + p.transpose(2, 3)
    assert to_voigt(p).shape == (2, 3, 6)
    assert torch.equal(to_voigt(p)[:, :, 3], p[:, :, 1, 2])


def test_fnorm_and_ewt_hand_made():
    true = np.stack([np.eye(3) * 10.0, np.eye(3), np.diag([3.0, 4.0, 0.0])])
    pred = true.copy()
    pred[0, 0, 0] += 1.0                     # |err| = 1, |true| = sqrt(300): rel 0.0577
    pred[1] = 0.0                            # |err| = sqrt(3), rel 1
    pred[2, 2, 2] = 0.5                      # |err| = 0.5, |true| = 5: rel 0.1
    err, rel = frobenius_errors(pred, true)
    assert np.allclose(err, [1.0, np.sqrt(3.0), 0.5])
    assert np.allclose(rel, [1 / np.sqrt(300.0), 1.0, 0.1])
    assert fnorm(pred, true) == pytest.approx((1.0 + np.sqrt(3.0) + 0.5) / 3)
    assert ewt(pred, true, 0.25) == pytest.approx(2 / 3)
    assert ewt(pred, true, 0.10) == pytest.approx(1 / 3)   # 0.1 is not below 0.1
    assert ewt(pred, true, 0.05) == 0.0
    # zero targets (centrosymmetric piezo): Fnorm counts them, EwT skips them
    t3 = np.zeros((2, 3, 3, 3))
    t3[0, 0, 1, 1] = t3[0, 0, 0, 0] = 1.0
    p3 = t3 * 1.05
    m = tensor_metrics(p3, t3)
    assert m["n_nonzero"] == 1 and m["ewt10"] == 1.0 and m["ewt5"] == 0.0
    assert m["fnorm"] == pytest.approx(0.05 * np.sqrt(2) / 2)


# --- CEITNet ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [2, 3, 4])
def test_ceitnet_equivariant_rotations_and_reflections(data, order):
    model = _ceitnet(order)
    b = data.collate(range(len(data)), dtype=torch.float64)
    with torch.no_grad():
        y = model(*model_args(b))
    assert y.shape == (len(data),) + (3,) * order
    assert float(y.abs().max()) > 1e-3
    for seed in range(2):
        rot = random_rotations(len(data), reflections=True, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            y_rot = model(*model_args(rotate_batch(b, rot)))
        err = float((y_rot - rotate(y, rot)).abs().max() / y.abs().max())
        assert err < 1e-10, err
    assert equivariance_error(model, data, n_rotations=2) < 1e-10


@pytest.mark.parametrize("order", [2, 3, 4])
def test_ceitnet_index_symmetries_exact(data, order):
    y = _ceitnet(order)(*model_args(data.collate(range(len(data)), dtype=torch.float64)))
    # exact (not approximate): every basis term carries the symmetry
    assert index_symmetry_residual(y, PERMS[order]) < 1e-15
    if order == 4:
        for p in [(1, 0, 3, 2), (3, 2, 1, 0), (2, 3, 1, 0)]:   # compositions: Cjilk, Clkji, Cklji
            assert index_symmetry_residual(y, [p]) < 1e-15
        assert index_symmetry_residual(y, [(0, 2, 1, 3)]) > 1e-3   # not fully symmetric (no Cauchy relations)


def test_ceitnet_permutation_and_translation_invariant():
    structs = _structures(2, seed=3)
    model = _ceitnet(4)
    base = AtomsData(atoms_frames(structs), CUTOFF)
    y = model(*model_args(base.collate([0, 1], dtype=torch.float64)))
    rng = np.random.default_rng(0)
    moved = []
    for a in structs:
        a2 = a[rng.permutation(len(a))]
        a2.positions += np.array([0.3, -1.1, 2.0])
        a2.wrap()
        moved.append(a2)
    y2 = model(*model_args(AtomsData(atoms_frames(moved), CUTOFF).collate([0, 1], dtype=torch.float64)))
    assert torch.allclose(y, y2, atol=1e-10 * float(y.abs().max()))
    # structures in a batch do not interact
    y_single = model(*model_args(base.collate([1], dtype=torch.float64)))
    assert torch.allclose(y[1:], y_single, atol=1e-12)


def test_crystal_symmetry_of_predictions():
    """Equivariance + crystal symmetry: a cubic cell gets a cubic elastic tensor (C11 = C22 = C33,
    C12 = C13 = C23, C44 = C55 = C66, zeros elsewhere) and a centrosymmetric one a zero order-3 tensor."""
    from ase.build import bulk

    a = bulk("Cu", "fcc", a=3.6, cubic=True)
    a.numbers = [79, 29, 29, 29]  # L1_2 Cu3Au: Pm-3m, centrosymmetric
    d = AtomsData(atoms_frames([a]), CUTOFF)
    b = d.collate([0], dtype=torch.float64)
    c = to_voigt(_ceitnet(4)(*model_args(b)))[0].detach().numpy()
    s = np.abs(c).max()
    assert np.allclose(np.diag(c)[:3], c[0, 0], atol=1e-12 * s) and np.allclose(np.diag(c)[3:], c[3, 3], atol=1e-12 * s)
    assert np.allclose([c[0, 1], c[0, 2], c[1, 2]], c[0, 1], atol=1e-12 * s)
    mask = np.ones((6, 6), bool)
    mask[:3, :3] = False
    mask[[3, 4, 5], [3, 4, 5]] = False
    assert np.abs(c[mask]).max() < 1e-12 * s and abs(c[3, 3]) > 1e-6 * s
    p3 = _ceitnet(3)(*model_args(b))
    assert float(p3.abs().max()) < 1e-14


def test_ceitnet_fits_an_environment_target():
    """A few optimisation steps reduce the loss on an exactly representable order-2 target."""
    from reprozoo.data.crystals.common import synthetic_targets

    structs = _structures(6, seed=5)
    d = AtomsData(atoms_frames(structs), 4.5)
    y = torch.as_tensor(np.stack([synthetic_targets(a.cell.array, a.positions, a.get_chemical_symbols())[0]
                                  for a in structs]))
    torch.manual_seed(0)
    model = CEITNet(2, n_features=16, n_channels=8, n_out=4, n_interactions=1, n_rbf=6, cutoff=4.5,
                    avg_neighbors=20.0).double()
    b = d.collate(range(6), dtype=torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = ((model(*model_args(b)) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]


# --- e3nn baseline ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def e3nn_models():
    pytest.importorskip("e3nn")
    from reprozoo.methods.ceitnet.e3nn_net import E3nnTensorNet, default_dtype

    out = {}
    for order in (2, 3, 4):
        torch.manual_seed(order)
        with default_dtype(torch.float64):
            out[order] = E3nnTensorNet(order, n_scalars=8, mul=2, n_layers=2, n_rbf=6, cutoff=CUTOFF,
                                       radial_hidden=8, avg_neighbors=10.0).double().eval()
    return out


def test_e3nn_cartesian_basis_matches_cartesian_tensor():
    from e3nn.io import CartesianTensor

    from reprozoo.methods.ceitnet.e3nn_net import FORMULAS, cartesian_basis, default_dtype

    with default_dtype(torch.float64):
        for order in (2, 3):  # order 4 takes seconds; the same code path
            ct = CartesianTensor(FORMULAS[order])
            irreps, q = cartesian_basis(FORMULAS[order])
            assert irreps == str(ct)
            x = torch.randn(3, ct.dim, dtype=torch.float64)
            ours = (x @ torch.as_tensor(q).flatten(1)).view((3,) + (3,) * order)
            assert torch.allclose(ours, ct.to_cartesian(x, ct.reduced_tensor_products(x)), atol=1e-12)
            assert torch.allclose(ct.from_cartesian(ours), x, atol=1e-10)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_e3nn_baseline_equivariant_and_symmetric(data, e3nn_models, order):
    model = e3nn_models[order]
    b = data.collate(range(len(data)), dtype=torch.float64)
    y = model(*model_args(b))
    assert float(y.abs().max()) > 1e-6
    assert index_symmetry_residual(y, PERMS[order]) < 1e-10
    assert equivariance_error(model, data, n_rotations=2) < 1e-10


def test_float64_copy_of_trained_e3nn_model(data):
    """The method's float64 check rebuilds e3nn constants in float64 (a float32-built model is only
    float32-equivariant even after .double())."""
    from reprozoo.methods.ceitnet.method import float64_copy

    p = {"cutoff": CUTOFF, "models": {"e3nn_baseline": dict(n_scalars=8, mul=2, n_layers=1, n_rbf=6, radial_hidden=8,
                                                             lmax=2)}}
    from reprozoo.methods.ceitnet.method import build

    torch.manual_seed(0)
    m32 = build("e3nn_baseline", 2, p, avg_neighbors=10.0)
    m64 = float64_copy("e3nn_baseline", 2, p, m32)
    b = data.collate(range(len(data)), dtype=torch.float64)
    with torch.no_grad():
        y32 = m32(*model_args(b.to(dtype=torch.float32))).double()
        y64 = m64(*model_args(b))
    assert torch.allclose(y32, y64, rtol=1e-4, atol=1e-5 * float(y64.abs().max()))
    assert equivariance_error(m64, data, n_rotations=1) < 1e-10


def test_variants_build(data):
    from reprozoo.methods.ceitnet.method import build

    p = {"cutoff": CUTOFF, "models": {"ceitnet": dict(n_features=8, n_channels=4, n_out=2, n_interactions=2, n_rbf=4),
                                      "ceitnet_no_interaction": {}}}
    full = build("ceitnet", 4, p)
    abl = build("ceitnet_no_interaction", 4, p)
    assert len(full.interactions) == 2 and len(abl.interactions) == 0
    with pytest.raises(ValueError):
        build("nope", 4, p)


def test_control_e3nn_is_the_baseline_trained_apart():
    """The accuracy claim's control variant is the e3nn baseline's network (same configuration and size), fitted
    under another seed (other initial weights and minibatch order), with the same grid and rule."""
    pytest.importorskip("e3nn")
    import torch

    from reprozoo.methods.ceitnet.method import SEED_OFFSET, build, fit_config

    p = {"cutoff": CUTOFF, "models": {"e3nn_baseline": dict(n_scalars=8, mul=2, n_layers=1, n_rbf=4, radial_hidden=8)},
         "fit": {"lr_grid": [1e-2, 3e-2, 1e-1], "max_steps": {"o4": 10}}}
    torch.manual_seed(0)
    a = build("e3nn_baseline", 4, p)
    torch.manual_seed(0 + SEED_OFFSET["e3nn_baseline_b"])
    b = build("e3nn_baseline_b", 4, p)
    assert type(a) is type(b) and a.param_count() == b.param_count()
    assert SEED_OFFSET.get("e3nn_baseline", 0) == 0 and SEED_OFFSET["e3nn_baseline_b"] != 0
    wa = torch.cat([t.flatten() for t in a.parameters()])
    wb = torch.cat([t.flatten() for t in b.parameters()])
    assert not torch.allclose(wa, wb)  # trained apart: other initial weights
    assert fit_config(p["fit"], 4, "e3nn_baseline") == fit_config(p["fit"], 4, "e3nn_baseline_b")


def test_validation_cells_fixed_disjoint_and_sized():
    """The validation set: the val split plus evaluation-only cells up to n_val, the same cells for every call
    (variant, seed), none of them left in the test cells; n_val at or below the val split adds none."""
    from reprozoo.methods.ceitnet.method import validation_cells

    va, ev4 = np.arange(100, 120), np.arange(200, 285)
    v1, t1 = validation_cells(None, va, ev4, 60)
    v2, t2 = validation_cells(None, va, ev4, 60)
    assert np.array_equal(v1, v2) and np.array_equal(t1, t2)
    assert len(v1) == 60 and len(t1) == 45 and np.array_equal(v1[:20], va)
    assert not set(v1) & set(t1) and set(v1[20:]) | set(t1) == set(ev4)
    assert len(set(v1[20:]) & set(range(200, 243))) < 40  # a permutation, not the first 40
    v0, t0 = validation_cells(None, va, ev4, 0)
    assert np.array_equal(v0, va) and np.array_equal(t0, ev4)


def test_smoke_rates_come_from_one_grid_and_rule():
    """Every network's smoke rate comes from the config's ``lr`` table, chosen once by the same full-fit rule on
    one grid (pilot_rates.py, the cold review's M2): one fit block for every variant (no per-variant values), the
    grid holds 1e-2 again (dropped in round 3 on 40-step pilots) and spans two decades, each trained variant has a
    table rate on that grid, and ``method.train``'s reading of the table gives the rule a one-rate grid; a validation
    set of at least 60 cells, and the best-validation weights kept over the whole run (no keep_from)."""
    from pathlib import Path

    import yaml

    from reprozoo.blocks.rate_table import fit_with_table_rate
    from reprozoo.methods.ceitnet.method import fit_config

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/ceitnet/configs/smoke.yaml").read_text())
    grid = sorted(float(r) for r in p["fit"]["lr_grid"])
    assert 1e-2 in grid and grid[-1] / grid[0] >= 30
    assert not any(isinstance(v, dict) and ("default" in v or "e3nn_baseline_b" in v) for v in p["fit"].values())
    for v in ("ceitnet", "e3nn_baseline", "e3nn_baseline_b"):
        f, src = fit_with_table_rate(fit_config(p["fit"], 4, v), p["lr"], v, "o4")
        assert src["lr_source"] == "table" and len(f["lr_grid"]) == 1 and float(f["lr_grid"][0]) in grid
        assert {k: x for k, x in f.items() if k != "lr_grid"} == \
            {k: x for k, x in fit_config(p["fit"], 4, "ceitnet").items() if k != "lr_grid"}  # one rule
    assert p["n_val"] >= 60
    assert int(p["fit"].get("keep_from", 0)) == 0


def test_pilot_rates_choose_the_lowest_and_mark_edges():
    """The rate table's rule: the lowest best validation Fnorm per variant (a failed fit scores inf), the edge on the
    grid named, a fit whose tail the gate would reject marked, not excluded."""
    from reprozoo.methods.ceitnet.pilot_rates import choose

    rows = [{"variant": "ceitnet", "lr": 0.01, "best_val": 25.0, "tail": 0.06},
            {"variant": "ceitnet", "lr": 0.03, "best_val": 24.0, "tail": 0.0},
            {"variant": "ceitnet", "lr": 0.1, "best_val": None, "tail": None},
            {"variant": "e3nn_baseline", "lr": 0.01, "best_val": 30.0, "tail": 0.0},
            {"variant": "e3nn_baseline", "lr": 0.1, "best_val": 28.0, "tail": 0.0}]
    table, lines = choose(rows, [0.01, 0.03, 0.1])
    assert table == {"ceitnet": {"o4": 0.03}, "e3nn_baseline": {"o4": 0.1}}
    assert "25.00*" in lines[2] and lines[2].endswith("| - |") and lines[3].endswith("| top |")


def test_smoke_pilot_tail_starts_after_two_ema_horizons():
    """The rate pilots are ranked on the second half of their validation points (the shared rule's ``tail``), which
    read an EMA of the weights; the tail must start after two EMA horizons (2 / (1 - decay) steps: under 14 % of
    the shared initial weights left in the average), or it ranks the speed of the first descent, which a rate at
    its stability edge wins (the seed-2 failure of the 3-seed run at 7bdfb51: 40-step pilots chose CEITNet's 1e-1,
    which went unstable later). The first tail point of the shared rule: index len(vals) // 2."""
    from pathlib import Path

    import yaml

    f = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/ceitnet/configs/smoke.yaml").read_text())["fit"]
    assert f.get("pilot_score", "tail") == "tail"
    n_vals = int(f["pilot_steps"]) // int(f["eval_every"]) + 1          # step 0 and every eval_every steps
    tail_start = (n_vals // 2) * int(f["eval_every"])
    assert tail_start >= 2 / (1 - float(f["ema_decay"]))
    assert int(f["pilot_steps"]) < int(f["min_steps"])


def test_index_symmetry_residual_detects_violations():
    t = torch.randn(2, 3, 3, dtype=torch.float64)
    assert index_symmetry_residual(t, [(1, 0)]) > 1e-3
    assert index_symmetry_residual(t + t.transpose(1, 2), [(1, 0)]) == 0.0
    assert list(itertools.permutations(range(2))) == [(0, 1), (1, 0)]



def test_inversion_zero_mask():
    """Centrosymmetric cells with a zero odd-order target are skipped for odd orders only."""
    from ase.build import bulk
    from pymatgen.io.ase import AseAtomsAdaptor

    from reprozoo.data.crystals.common import structure_targets
    from reprozoo.methods.ceitnet.training import inversion_zero

    l12 = bulk("Cu", "fcc", a=3.6, cubic=True)
    l12.numbers = [79, 29, 29, 29]
    rattled = l12.copy()
    rattled.rattle(0.05, seed=1)
    structs = [AseAtomsAdaptor.get_structure(a) for a in (l12, rattled)]
    t3 = np.stack([structure_targets(s)[1] for s in structs])
    assert np.abs(t3[0]).max() < 1e-12 < np.abs(t3[1]).max()
    assert inversion_zero(structs, t3, 3).tolist() == [True, False]
    assert inversion_zero(structs, t3, 4).tolist() == [False, False]


def test_eval_only_cells_leave_the_main_set_alone(tmp_path):
    """Evaluation-only cells (synthetic targets, no elastic tensor) are new cells from their own stream:
    the main records and their splits are unchanged, no eval cell repeats a main random cell, C is NaN
    there and the synthetic targets are finite."""
    import json

    from reprozoo.data.crystals import common, emt_elastic

    tiny = {"elements": ["Cu", "Al", "Ni"], "elemental": ["fcc"], "ordered": ["B2"], "n_ordered": 1,
            "n_random": 2, "n_distorted": 1, "random_sizes": [3], "random_species": [2]}
    main, _ = emt_elastic.generate(tiny, 5, progress=lambda m: None)
    both, stats = emt_elastic.generate({**tiny, "n_eval_random": 3, "n_eval_distorted": 1}, 5, progress=lambda m: None)
    assert stats["n_eval_only"] == 4 and stats["n_structures"] == len(main)
    assert [json.dumps(r, sort_keys=True) for r in both[: len(main)]] == [json.dumps(r, sort_keys=True) for r in main]
    ev = both[len(main):]
    assert all(r["eval_only"] and r["C_voigt"] is None for r in ev)
    from pymatgen.core import Structure
    from pymatgen.io.ase import AseAtomsAdaptor

    def key(r):  # after relaxation: formula and target invariants, coarse enough for BFGS noise
        at = AseAtomsAdaptor.get_atoms(Structure.from_dict(r["structure"]))
        return emt_elastic._invariant_key(at)[:2] + tuple(np.round(emt_elastic._invariant_key(at)[2:], 3))
    assert not {key(r) for r in ev if r["prototype"] == "random"} & {key(r) for r in main if r["prototype"] == "random"}
    ds = _preprocessed(tmp_path, both)
    e = ds.split_index("eval")
    assert len(e) == 4 and np.isnan(ds.C_full[e]).all() and np.isfinite(ds.eps_like[e]).all()
    assert np.isfinite(ds.piezo_like[e]).all() and np.isfinite(ds.C_full[np.setdiff1d(np.arange(len(ds)), e)]).all()
    assert (ds.table.split.to_numpy()[: len(main)] == common.splits(len(main), 5)).all()


def test_eval_cells_with_elastic_tensors(tmp_path):
    """n_eval_elastic: the same evaluation-only cells (bit-identical structures and order-2/3 targets), a
    random subset of them with an elastic tensor computed exactly like a main cell's (symmetric, positive
    definite, equal to a direct recomputation)."""
    from pymatgen.core import Structure
    from pymatgen.io.ase import AseAtomsAdaptor

    from reprozoo.data.crystals import emt_elastic

    tiny = {"elements": ["Cu", "Al", "Ni"], "elemental": ["fcc"], "ordered": ["B2"], "n_ordered": 1,
            "n_random": 1, "n_distorted": 1, "random_sizes": [3], "random_species": [2],
            "n_eval_random": 3, "n_eval_distorted": 1}
    plain, _ = emt_elastic.generate(tiny, 5, progress=lambda m: None)
    withc, stats = emt_elastic.generate({**tiny, "n_eval_elastic": 2}, 5, progress=lambda m: None)
    assert stats["n_eval_elastic"] == 2
    assert [r["structure"] for r in plain] == [r["structure"] for r in withc]
    ev = [r for r in withc if r.get("eval_only")]
    has = [r for r in ev if r["C_voigt"] is not None]
    assert len(has) == 2 and len(ev) == 4
    for r in has:
        c = np.array(r["C_voigt"])
        assert np.allclose(c, c.T) and np.linalg.eigvalsh(c)[0] > 0
        direct = emt_elastic.elastic_tensor(AseAtomsAdaptor.get_atoms(Structure.from_dict(r["structure"])))["C"]
        assert np.allclose(direct, c, rtol=1e-3, atol=0.5)
    ds = _preprocessed(tmp_path, withc)
    e = ds.split_index("eval")
    assert len(e) == 4 and np.isfinite(ds.C_voigt[e]).reshape(4, -1).all(axis=1).sum() == 2


def test_shared_fit_rule():
    """The fit is the shared rule (blocks.fitting.fit_to_plateau): every grid rate piloted, validation every
    eval_every steps (x axis: epochs = steps / batches per epoch), the chosen rate held constant (never below
    the gate's floor), the returned model is the best-validation state, and every rate starts from the same
    initial weights."""
    from reprozoo.data.crystals.common import synthetic_targets
    from reprozoo.methods.ceitnet.training import fit, predict, voigt

    structs = _structures(6, seed=3)
    d = AtomsData(atoms_frames(structs), 4.5)
    y = np.stack([synthetic_targets(a.cell.array, a.positions, a.get_chemical_symbols())[0] for a in structs])
    built = []

    def make():
        m = CEITNet(2, n_features=8, n_channels=4, n_out=2, n_interactions=1, n_rbf=4, cutoff=4.5, avg_neighbors=20.0)
        built.append([q.detach().clone() for q in m.parameters()])
        return m

    cfg = {"lr_grid": [3e-3, 1e-2], "pilot_steps": 2, "eval_every": 1, "min_steps": 4, "max_steps": 6,
           "flat_tol": 0.01, "clip": 10.0, "batch_size": 2, "lr_drop": 0}
    model, hist = fit(make, d, np.arange(4), np.arange(4, 6), y, cfg, seed=0)
    assert len(built) == 2 and all(torch.equal(a, b) for a, b in zip(*built))  # same initial weights per rate
    assert set(hist["pilot_best"]) == {3e-3, 1e-2} and hist["lr_chosen"] in (3e-3, 1e-2)
    n = len(hist["epoch"])
    assert hist["epoch"] == pytest.approx([k / 2 for k in range(n)])  # 4 cells, batches of 2: 2 steps an epoch
    assert 4 <= 2 * hist["epoch"][-1] <= 6
    assert hist["lr"] == pytest.approx([hist["lr_chosen"]] * n)  # constant: the gate's floor holds
    best = fnorm(voigt(predict(model, d, np.arange(4, 6))), voigt(y[4:6]))
    assert best == pytest.approx(min(hist["val_fnorm"]), rel=1e-5)
    assert hist["best_epoch"] == pytest.approx(hist["epoch"][int(np.argmin(hist["val_fnorm"]))])
    assert hist["drop_gain"] is None and hist["lr_edge"] in ("top", "bottom")
    with pytest.raises(ValueError, match="missing"):
        fit(make, d, np.arange(4), np.arange(4, 6), y, {"lr_grid": [1e-2]}, seed=0)
    # the rule's default: one 10x drop after the first plateau (flat_tol 1: the first plateau test that has enough
    # points passes), and
    # a second plateau whose window lies after the drop; the record says where and how much it gained
    cfg = {**cfg, "flat_tol": 1.0, "max_steps": 40}
    cfg.pop("lr_drop")
    model, hist = fit(make, d, np.arange(4), np.arange(4, 6), y, cfg, seed=0)
    lrs = np.asarray(hist["lr"])
    assert hist["drop_epoch"] >= 2.0 and hist["drop_gain"] is not None and hist["drop_gain"] >= 0  # >= min_steps
    assert set(np.round(lrs / hist["lr_chosen"], 12)) == {1.0, 0.1}
    after = np.asarray(hist["epoch"]) > hist["drop_epoch"]
    assert np.allclose(lrs[after], 0.1 * hist["lr_chosen"]) and np.allclose(lrs[~after], hist["lr_chosen"])
    assert hist["epoch"][-1] >= hist["drop_epoch"] / 0.7 - 1e-9  # the gate's window (last 30 %) after the drop
    # without keep_from the kept weights are the best over the whole run, before or after the drop
    assert hist["best_epoch"] == pytest.approx(hist["epoch"][int(np.argmin(hist["val_fnorm"]))])
    best = fnorm(voigt(predict(model, d, np.arange(4, 6))), voigt(y[4:6]))
    assert best == pytest.approx(min(hist["val_fnorm"]), rel=1e-5)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_isotropic_part_is_the_rotation_average(order):
    """The isotropic part (a recorded diagnostic, ``fnorm_iso_o4``) of a tensor is its average over O(3) (checked
    against a Monte-Carlo average over random rotations and reflections), is rotation invariant and idempotent, and
    removes every anisotropic component (zero for odd order)."""
    from reprozoo.methods.ceitnet.training import isotropic_part

    g = torch.Generator().manual_seed(order)
    t = torch.randn((2,) + (3,) * order, generator=g, dtype=torch.float64)
    for perm in PERMS[order]:  # the target's index symmetries
        t = 0.5 * (t + t.permute(0, *[1 + q for q in perm]))
    iso = isotropic_part(t.numpy(), order)
    rot = random_rotations(20000, reflections=True, generator=g)
    avg = rotate(t.repeat_interleave(10000, 0), rot).view((2, 10000) + (3,) * order).mean(1).numpy()
    assert np.abs(avg - iso).max() < 0.05 * np.abs(t.numpy()).max()
    assert np.allclose(isotropic_part(iso, order), iso, atol=1e-12)
    r = random_rotations(2, reflections=True, generator=g)
    assert np.allclose(rotate(torch.as_tensor(iso), r).numpy(), iso, atol=1e-12)
    if order == 3:
        assert np.abs(iso).max() == 0.0
    if order == 4:  # an isotropic elastic tensor is its own part; a cubic one is not
        lam, mu = 50.0, 30.0
        e = np.eye(3)
        c_iso = lam * np.einsum("ij,kl->ijkl", e, e) + mu * (np.einsum("ik,jl->ijkl", e, e)
                                                             + np.einsum("il,jk->ijkl", e, e))
        assert np.allclose(isotropic_part(c_iso[None], 4)[0], c_iso, atol=1e-12)
        cubic = c_iso.copy()
        for i in range(3):
            cubic[i, i, i, i] += 40.0
        assert np.abs(isotropic_part(cubic[None], 4)[0] - cubic).max() > 10.0


@pytest.mark.parametrize("order", [2, 3, 4])
def test_output_bases_span_the_symmetric_tensors(order):
    """The Cartesian output basis of the head spans the whole space of tensors with the target's index
    symmetries (6 / 18 / 21 dimensions for ij=ji / ijk=ikj / the elastic symmetries): over random generic
    structures and random head coefficients, the Voigt outputs have full rank, so no component of the target
    is out of the network's reach. The e3nn baseline's irreps cover the same dimension."""
    from reprozoo.methods.ceitnet.e3nn_net import FORMULAS, cartesian_basis

    dim = {2: 6, 3: 18, 4: 21}[order]
    d = AtomsData(atoms_frames(_structures(12, seed=7)), CUTOFF)
    b = d.collate(range(len(d)), dtype=torch.float64)
    rows = []
    for k in range(4):
        m = _ceitnet(order)
        with torch.no_grad():
            m.head.coef.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(k))
            y = m(*model_args(b))
        rows.append(to_voigt(y).reshape(len(d), -1).numpy())
    a = np.concatenate(rows)                      # Voigt forms: 3x3 / 3x6 / 6x6 (symmetric)
    sv = np.linalg.svd(a / np.abs(a).max(), compute_uv=False)
    assert sv[dim - 1] > 1e-6 * sv[0], sv             # rank dim: the whole symmetric space
    assert len(sv) == dim or sv[dim] < 1e-12 * sv[0]   # and no more (the index symmetries are exact)
    irreps, q = cartesian_basis(FORMULAS[order])
    assert q.shape[0] == dim


@pytest.mark.parametrize("order", [2, 3, 4])
def test_e3nn_outputs_span_the_symmetric_tensors(order):
    """The baseline reaches the same space as CEITNet: over random generic structures and random initial weights,
    the e3nn network's Voigt outputs have rank 6 / 18 / 21 (its output irreps, mapped back by the change of basis,
    cover every component with the target's index symmetries) and no more."""
    pytest.importorskip("e3nn")
    from reprozoo.methods.ceitnet.e3nn_net import E3nnTensorNet, default_dtype

    dim = {2: 6, 3: 18, 4: 21}[order]
    d = AtomsData(atoms_frames(_structures(12, seed=7)), CUTOFF)
    b = d.collate(range(len(d)), dtype=torch.float64)
    rows = []
    for k in range(4):
        torch.manual_seed(100 + k)
        with default_dtype(torch.float64):
            m = E3nnTensorNet(order, n_scalars=8, mul=2, n_layers=2, n_rbf=4, radial_hidden=8, cutoff=CUTOFF,
                              avg_neighbors=10.0).double().eval()
        with torch.no_grad():
            y = m(*model_args(b))
        rows.append(to_voigt(y).reshape(len(d), -1).numpy())
    a = np.concatenate(rows)
    sv = np.linalg.svd(a / np.abs(a).max(), compute_uv=False)
    assert sv[dim - 1] > 1e-6 * sv[0], sv
    assert len(sv) == dim or sv[dim] < 1e-12 * sv[0]


def _emt_cells():
    """Six small relaxed EMT cells (pure fcc, an L12, a B2, an L10, a random 3-atom supercell) with their
    relaxed-ion elastic tensors (GPa), as the dataset generator computes them."""
    from reprozoo.data.crystals.common import voigt_to_full
    from reprozoo.data.crystals.emt_elastic import build, build_random, elastic_tensor, relax

    cells = [build("fcc", ("Cu",)), build("fcc", ("Ni",)), build("L12", ("Cu", "Au")), build("B2", ("Cu", "Pd")),
             build("L10", ("Ni", "Pt")), build_random(np.random.default_rng(3), ("Cu", "Ag", "Al"), [3], [2])[0]]
    out, cs = [], []
    for a in cells:
        relax(a, fmax=1e-3, steps=200)
        out.append(a)
        cs.append(voigt_to_full(elastic_tensor(a, fmax=1e-3, steps=100)["C"]))
    return out, np.stack(cs)


def test_both_networks_fit_emt_elastic_tensors():
    """Neither network is crippled: on six real order-4 EMT cells, each fitted by the method's own ``training.fit``
    (80 steps at one rate, full batches) ends with a training Fnorm below a fifth of the trivial predictor's (the
    mean training tensor), and its training loss falls below a fifth of the first evaluations'."""
    pytest.importorskip("e3nn")
    from reprozoo.methods.ceitnet.method import build
    from reprozoo.methods.ceitnet.training import fit, predict, target_scale, voigt

    atoms, y = _emt_cells()
    d = AtomsData(atoms_frames(atoms), CUTOFF)
    idx = np.arange(len(atoms))
    p = {"cutoff": CUTOFF, "models": {
        "ceitnet": dict(n_features=16, n_channels=4, n_out=4, n_interactions=2, n_rbf=8, radial_hidden=16),
        "e3nn_baseline": dict(n_scalars=16, mul=4, n_layers=2, n_rbf=8, radial_hidden=16)}}
    mean_err = fnorm(voigt(np.repeat(y.mean(axis=0)[None], len(y), axis=0)), voigt(y))
    for variant in ("ceitnet", "e3nn_baseline"):
        cfg = {"lr_grid": [3e-2], "pilot_steps": 2, "eval_every": 10, "min_steps": 80, "max_steps": 80,
               "flat_tol": 0.0, "batch_size": len(idx), "lr_drop": 0}
        m, hist = fit(lambda: build(variant, 4, p, avg_neighbors=10.0, out_scale=target_scale(y)), d, idx, idx, y,
                      cfg, seed=0)
        err = fnorm(voigt(predict(m, d, idx)), voigt(y))
        assert err < 0.2 * mean_err, (variant, err, mean_err)
        loss = np.asarray(hist["loss"][1:], float)
        assert loss[-1] < 0.2 * loss[0], (variant, loss)


def test_eval_cells_leave_out_the_distorted_pool():
    """The test sets' evaluation-only cells: the random supercells, without the distorted variants of main cells
    (near-duplicates of training cells); order 4: those with an elastic tensor."""
    import pandas as pd

    from reprozoo.methods.ceitnet.method import eval_cells

    class DS:
        table = pd.DataFrame({"split": ["train", "eval", "eval", "eval", "eval", "test"],
                              "prototype": ["fcc", "random", "L12-distorted", "random", "random-distorted", "B2"]})
        C_voigt = np.stack([np.eye(6), np.eye(6), np.eye(6), np.full((6, 6), np.nan), np.eye(6), np.eye(6)])

        def split_index(self, s):
            return np.flatnonzero(self.table["split"].to_numpy() == s)

    ev, ev4, n_dist = eval_cells(DS())
    assert ev.tolist() == [1, 3] and ev4.tolist() == [1] and n_dist == 2


def test_smoke_models_are_parameter_matched():
    """The smoke config's networks have parameter counts within 10 % of each other at every order they train."""
    pytest.importorskip("e3nn")
    from pathlib import Path

    import yaml

    from reprozoo.methods.ceitnet.method import build

    p = yaml.safe_load((Path(__file__).parents[1] / "src/reprozoo/methods/ceitnet/configs/smoke.yaml").read_text())
    for order in p["orders"]:
        n = {v: build(v, order, p).param_count() for v in ("ceitnet", "e3nn_baseline")}
        assert 0.9 <= n["ceitnet"] / n["e3nn_baseline"] <= 1.1, (order, n)


def test_unrotated_control_is_flagged(data):
    """The equivariance test's negative control: leaving the output unrotated gives an error far above the
    float32 bound (1e-5), even for order 2 where the isotropic part (unchanged by rotations) dominates."""
    for order in (2, 3, 4):
        m = _ceitnet(order)
        assert equivariance_error(m, data, n_rotations=2, seed=1) < 1e-10
        assert equivariance_error(m, data, n_rotations=2, seed=1, rotate_output=False) > 1e-4


@pytest.mark.parametrize("variant", ["ceitnet", "e3nn_baseline"])
def test_trained_float32_models_equivariant(variant):
    """Formerly the spec's claims `equivariance_f64` / `equivariance_f32` (true by construction, so a test):
    after training in float32 with the method's own fit, each network is equivariant to float32 precision
    (relative error <= 1e-5) under rotations and reflections, its float64 copy to <= 1e-10, and the same
    check with the output left unrotated is flagged; orders 2, 3, 4."""
    if variant == "e3nn_baseline":
        pytest.importorskip("e3nn")
    from reprozoo.data.crystals.common import synthetic_targets
    from reprozoo.methods.ceitnet.method import build, float64_copy
    from reprozoo.methods.ceitnet.training import fit, target_scale

    structs = _structures(6, seed=5)
    d = AtomsData(atoms_frames(structs), CUTOFF)
    p = {"cutoff": CUTOFF, "models": {
        "ceitnet": dict(n_features=8, n_channels=4, n_out=2, n_interactions=1, n_rbf=4),
        "e3nn_baseline": dict(n_scalars=8, mul=2, n_layers=1, n_rbf=4, radial_hidden=8)}}
    ys = [synthetic_targets(a.cell.array, a.positions, a.get_chemical_symbols()) for a in structs]
    for order in (2, 3, 4):
        # orders 2/3: the synthetic targets; order 4: their outer product (any order-4 tensor trains the weights)
        y = np.stack([t[0] if order == 2 else t[1] if order == 3 else np.einsum("ij,kl->ijkl", t[0], t[0])
                      for t in ys])
        torch.manual_seed(order)
        w0 = [q.detach().clone() for q in build(variant, order, p, 10.0, target_scale(y[:4])).parameters()]
        cfg = {"lr_grid": [1e-2], "pilot_steps": 2, "eval_every": 1, "min_steps": 4, "max_steps": 4,
               "flat_tol": 0.0, "batch_size": 2, "keep_from": 1}
        m, _ = fit(lambda: build(variant, order, p, avg_neighbors=10.0, out_scale=target_scale(y[:4])), d,
                   np.arange(4), np.arange(4, 6), y, cfg, seed=order)
        assert any(not torch.equal(a, q) for a, q in zip(w0, m.parameters()))  # it did train
        e32 = equivariance_error(m, d, n_rotations=2, seed=1, dtype=torch.float32)
        e64 = equivariance_error(float64_copy(variant, order, p, m), d, n_rotations=2, seed=1)
        off = equivariance_error(m, d, n_rotations=2, seed=1, dtype=torch.float32, rotate_output=False)
        assert e32 <= 1e-5, (order, e32)
        assert e64 <= 1e-10, (order, e64)
        assert off > 1e-4, (order, off)


def _preprocessed(tmp_path, records):
    """The crystals dataset preprocessed from raw EMT records (seed 5), as the pipeline would."""
    import json

    from reprozoo.data.crystals import common, emt_elastic

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "emt_records.json").write_text(json.dumps({"seed": 5, "records": records}))
    emt_elastic.preprocess(raw, tmp_path, {})
    return common.load(tmp_path)


def test_time_forward_with_backward_fills_gradients(data):
    """The training-cost timing runs a backward pass (gradients appear); the forward timing leaves none."""
    from reprozoo.methods.ceitnet.model import CEITNet
    from reprozoo.methods.ceitnet.training import time_forward

    m = CEITNet(4, n_features=8, n_channels=2, n_out=2, n_interactions=1, n_rbf=4, radial_hidden=8, cutoff=CUTOFF,
                avg_neighbors=10.0)
    idx = np.arange(2)
    ms = time_forward({"a": m}, data, idx, repeats=1)
    assert ms["a"] > 0 and all(q.grad is None for q in m.parameters())
    mb = time_forward({"a": m}, data, idx, repeats=1, backward=True)
    assert mb["a"] > 0 and any(q.grad is not None and q.grad.abs().sum() > 0 for q in m.parameters())
