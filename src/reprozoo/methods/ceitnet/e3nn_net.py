"""Spherical-tensor baseline: a NequIP-style e3nn network whose output irreps are those of the
target's symmetric-index Cartesian tensor (``e3nn.io.CartesianTensor``), mapped back to Cartesian
form with the change of basis of ``ReducedTensorProducts``.

Layers: atom embedding -> ``n_layers`` x [o3.Linear -> TensorProduct(node irreps x Y^l(u_ij),
'uvu', weights from a radial MLP of the Bessel basis x cosine cutoff) summed over neighbours / <deg>
-> o3.Linear + self-connection -> Gate] -> o3.Linear to the target irreps -> mean over atoms ->
Cartesian tensor (B, 3, ..., 3) times a fixed target scale.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch
from torch import nn

from ...blocks.atomistic.basis import CosineCutoff, make_rbf
from ...blocks.atomistic.schnet import edge_vectors, scatter_sum

FORMULAS = {2: "ij=ji", 3: "ijk=ikj", 4: "ijkl=jikl=klij"}


@contextlib.contextmanager
def default_dtype(dtype):
    """Build e3nn modules under a default dtype: their Clebsch-Gordan / Wigner buffers are computed in
    it (float64 gives float64-exact equivariance after ``.double()``)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@functools.lru_cache(maxsize=None)
def cartesian_basis(formula: str) -> tuple[str, np.ndarray]:
    """(irreps of the symmetric-index Cartesian tensor, change of basis Q (dim, 3, ..., 3)), float64.

    ``CartesianTensor(formula)`` has exactly these irreps and ``CartesianTensor.to_cartesian(x, rtp)``
    is ``x @ Q.reshape(dim, -1)``; this reduces the tensor products once per process (about a
    second for order 4) instead of at every ``to_cartesian`` call.
    """
    from e3nn.o3 import ReducedTensorProducts

    indices = formula.split("=")[0].replace("-", "")
    with default_dtype(torch.float64):
        rtp = ReducedTensorProducts(formula, **{i: "1o" for i in indices})
    return str(rtp.irreps_out), rtp.change_of_basis.detach().double().numpy()


class Convolution(nn.Module):
    def __init__(self, irreps_in, irreps_sh, irreps_hidden, n_rbf: int, radial_hidden: int, first: bool):
        super().__init__()
        from e3nn import o3
        from e3nn.nn import FullyConnectedNet, Gate

        irreps_in, irreps_hidden = o3.Irreps(irreps_in), o3.Irreps(irreps_hidden)
        wanted = {ir for _, ir in irreps_hidden}
        mid, instr = [], []
        for i, (mul, ir_in) in enumerate(irreps_in):
            for j, (_, ir_sh) in enumerate(irreps_sh):
                for ir_out in ir_in * ir_sh:
                    if ir_out in wanted:
                        instr.append((i, j, len(mid), "uvu", True))
                        mid.append((mul, ir_out))
        irreps_mid = o3.Irreps(mid)
        scalars = o3.Irreps([(m, ir) for m, ir in irreps_hidden if ir.l == 0])
        gated = o3.Irreps([(m, ir) for m, ir in irreps_hidden if ir.l > 0])
        gates = o3.Irreps(f"{gated.num_irreps}x0e") if gated.num_irreps else o3.Irreps("")
        self.gate = Gate(scalars, [torch.nn.functional.silu] * len(scalars), gates,
                         [torch.sigmoid] * len(gates), gated)
        self.lin_in = o3.Linear(irreps_in, irreps_in)
        self.tp = o3.TensorProduct(irreps_in, irreps_sh, irreps_mid, instr, shared_weights=False,
                                   internal_weights=False)
        self.radial = FullyConnectedNet([n_rbf, radial_hidden, self.tp.weight_numel], torch.nn.functional.silu)
        self.lin_out = o3.Linear(irreps_mid, self.gate.irreps_in)
        self.self_conn = o3.Linear(irreps_in, self.gate.irreps_in)
        self.irreps_out = self.gate.irreps_out
        self.residual = irreps_in == self.irreps_out and not first

    def forward(self, x, sh, rbf_cut, edge_index, inv_deg: float):
        w = self.radial(rbf_cut[0]) * rbf_cut[1].unsqueeze(-1)
        msg = self.tp(self.lin_in(x)[edge_index[1]], sh, w)
        agg = scatter_sum(msg, edge_index[0], x.shape[0]) * inv_deg
        out = self.gate(self.lin_out(agg) + self.self_conn(x))
        return x + out if self.residual else out


class E3nnTensorNet(nn.Module):
    """e3nn spherical-tensor predictor of an order-2/3/4 Cartesian tensor (same call as CEITNet)."""

    def __init__(self, order: int, n_scalars: int = 32, mul: int = 8, n_layers: int = 2, n_rbf: int = 8,
                 cutoff: float = 4.5, max_z: int = 100, lmax: int | None = None, radial_hidden: int = 32,
                 avg_neighbors: float = 1.0, out_scale: float = 1.0, rbf: str = "bessel",
                 optimize_einsums: bool = False):
        super().__init__()
        import e3nn
        from e3nn import o3

        # opt_einsum path search at construction: about 3x slower to build, same forward time on CPU
        # (measured); restored after construction
        old_opt = e3nn.get_optimization_defaults()["optimize_einsums"]
        e3nn.set_optimization_defaults(optimize_einsums=bool(optimize_einsums))
        try:
            self._build(order, n_scalars, mul, n_layers, n_rbf, cutoff, max_z, lmax, radial_hidden, avg_neighbors,
                        out_scale, rbf)
        finally:
            e3nn.set_optimization_defaults(optimize_einsums=old_opt)

    def _build(self, order, n_scalars, mul, n_layers, n_rbf, cutoff, max_z, lmax, radial_hidden, avg_neighbors,
               out_scale, rbf):
        from e3nn import o3

        self.order = int(order)
        self.hparams = dict(order=order, n_scalars=n_scalars, mul=mul, n_layers=n_layers, n_rbf=n_rbf,
                            cutoff=cutoff, max_z=max_z, lmax=lmax, radial_hidden=radial_hidden, rbf=rbf)
        irreps_out, q = cartesian_basis(FORMULAS[self.order])
        self.irreps_out = o3.Irreps(irreps_out)
        lmax = int(lmax or self.order)
        self.irreps_sh = o3.Irreps.spherical_harmonics(lmax)
        hidden = [(n_scalars, (0, 1))] + [(mul, (l, (-1) ** l)) for l in range(1, lmax + 1)]
        for _, ir in self.irreps_out:  # irreps of the target outside the natural-parity set (e.g. 2o)
            if ir.l > 0 and ir.p != (-1) ** ir.l and (mul, (ir.l, ir.p)) not in hidden:
                hidden.append((mul, (ir.l, ir.p)))
        irreps_hidden = o3.Irreps(hidden).sort().irreps.simplify()
        self.embedding = nn.Embedding(max_z + 1, n_scalars)
        self.rbf = make_rbf(rbf, n_rbf, cutoff)
        self.envelope = CosineCutoff(cutoff)
        layers, irreps = [], o3.Irreps(f"{n_scalars}x0e")
        for k in range(n_layers):
            conv = Convolution(irreps, self.irreps_sh, irreps_hidden, n_rbf, radial_hidden, first=k == 0)
            layers.append(conv)
            irreps = conv.irreps_out
        self.layers = nn.ModuleList(layers)
        self.out = o3.Linear(irreps, self.irreps_out)
        self.register_buffer("change_of_basis", torch.as_tensor(q, dtype=torch.get_default_dtype()))
        self.register_buffer("avg_neighbors", torch.tensor(float(avg_neighbors)))
        self.register_buffer("out_scale", torch.tensor(float(out_scale)))

    def irreps_features(self, numbers, positions, batch, edge_index, shifts=None, n_structures=None):
        """Structure-level target irreps (B, dim) (before the change of basis and the scale)."""
        from e3nn import o3

        vec, dist = edge_vectors(positions, edge_index, shifts)
        sh = o3.spherical_harmonics(self.irreps_sh, vec, normalize=True, normalization="component")
        rbf_cut = (self.rbf(dist), self.envelope(dist))
        inv_deg = 1.0 / float(self.avg_neighbors)
        x = self.embedding(numbers).to(positions.dtype)
        for layer in self.layers:
            x = layer(x, sh, rbf_cut, edge_index, inv_deg)
        y = self.out(x)
        n = int(n_structures) if n_structures is not None else int(batch.max()) + 1
        counts = torch.bincount(batch, minlength=n).to(y.dtype)
        return scatter_sum(y, batch, n) / counts.unsqueeze(-1)

    def forward(self, numbers, positions, batch, edge_index, shifts=None, n_structures: int | None = None):
        y = self.irreps_features(numbers, positions, batch, edge_index, shifts, n_structures) * self.out_scale
        q = self.change_of_basis.to(y.dtype)
        return (y @ q.flatten(1)).view((y.shape[0],) + (3,) * self.order)

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())
