"""CEITNet: Cartesian environment interaction tensor network (this reproduction's implementation).

Environment tensors. Per atom i and channel c, multi-channel Cartesian environment tensors of every
order n = 0..L (L = max(order, 2)):

    T^(n)_{i,c} = 1/<deg> sum_j  R^(n)_c(d_ij) g^(n)_c(h_j) H^(n)(u_ij)

with u_ij = r_ij / |r_ij|, R a radial MLP of a Bessel basis times a cosine cutoff, g a linear map of
the neighbour's invariant features h_j, and H^(n)(u) the traceless part of u (x) ... (x) u (n factors;
``irreducible=True``, the Cartesian harmonic of degree n; the raw power with ``irreducible=False``).
The powers are fully symmetric, so they are kept packed ((n+1)(n+2)/2 components) and summed over
neighbours for all orders and channels with one batched matmul.

Channel-space interactions (each of ``n_interactions`` blocks):

    X^(n)_i = W^(n) [ T^(n)_i + X_prev^(n)_i + sum_j w^(n)(d_ij) X_prev^(n)_j ]     (channel mixing W, C x C)
    q_i = [ <X^(n)_c, (V^(n) X^(n))_c>_n ,  v_c.A_c.v_c ,  tr(A_c A_c A_c) ]          (channel-wise contractions)
    h_i <- h_i + MLP([h_i, asinh(q_i)])

Channel mixing never touches a Cartesian index, so it is equivariant; the contractions are the
many-body invariants (3- and 4-body per block, higher through the graph); the tensor messages pass
the neighbours' Cartesian features weighted channel-wise by radial functions (``tensor_messages``).

Output (order 2, 3 or 4). The head rebuilds the environment tensors with the final h, pools them with
the blocks' last features X, adds the channel products v_c (x) v_c to the order-2 pool and mixes
channels into M output channels V_m (vectors), A_m (symmetric matrices), S_m (fully symmetric, order
3 or 4) with mixing matrices W + dW(h_i) (a per-atom, invariant correction: ``atom_mixing``). The
target is assembled from a Cartesian tensor basis with its index symmetries, with invariant
per-atom coefficients from an MLP of [h_i, asinh(q_i)] (d = Kronecker delta):

  order 2 (ij=ji):   a0 d_ij + sum_m [a1 A_ij + a2 (A A)_ij + a3 V_i V_j]
  order 3 (ijk=ikj): sum_m [b1 V_i d_jk + b2 (d_ij V_k + d_ik V_j) + b3 S_ijk + b4 V_i A_jk
                            + b5 (A_ij V_k + A_ik V_j)]
  order 4 (ijkl=jikl=ijlk=klij): c0 d_ij d_kl + c1 (d_ik d_jl + d_il d_jk)
       + sum_m [c2 (d_ij A_kl + A_ij d_kl) + c3 (d_ik A_jl + d_il A_jk + d_jk A_il + d_jl A_ik)
                + c4 S_ijkl + c5 A_ij A_kl + c6 (A_ik A_jl + A_il A_jk)]

Every term is a polynomial in the u_ij with invariant coefficients: O(3)-equivariant by construction
(no Clebsch-Gordan coefficients anywhere), and every term has the index symmetries exactly. The
structure's tensor is the mean of its atoms' tensors (an intensive property) times a fixed target
scale (the RMS of the training targets' Voigt components).
"""
from __future__ import annotations

import torch
from torch import nn

from ...blocks.atomistic.basis import CosineCutoff, make_rbf
from ...blocks.atomistic.schnet import edge_vectors, scatter_sum
from ...blocks.cartesian import detrace, n_sym, segment_slots, sym_contract, sym_offsets, sym_powers, unpack


def _mlp(n_in: int, n_hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, n_hidden), nn.SiLU(), nn.Linear(n_hidden, n_out))


class Geometry:
    """Per-forward edge quantities shared by every block: packed powers of the unit vectors (all orders,
    padded per centre atom), radial basis and cutoff."""

    def __init__(self, positions, edge_index, shifts, rbf, envelope, lmax: int, n_atoms: int,
                 irreducible: bool = True):
        vec, dist = edge_vectors(positions, edge_index, shifts)
        u = vec / dist.clamp_min(1e-9).unsqueeze(-1)
        self.rbf = rbf(dist)
        self.fcut = envelope(dist)
        self.i, self.j = edge_index[0], edge_index[1]
        self.n_atoms, self.lmax = n_atoms, lmax
        self.offsets = sym_offsets(lmax)
        self.slot, self.max_deg = segment_slots(self.i, n_atoms)
        powers = sym_powers(u, lmax)
        if irreducible:  # traceless parts: u (x) u -> u u - I/3, ... (Cartesian harmonics)
            off = self.offsets
            powers = torch.cat([detrace(powers[:, off[n]:off[n + 1]], n) for n in range(lmax + 1)], dim=-1)
        self.powers_padded = self.pad(powers)                       # (N, K, P_total)
        self.component_order = torch.repeat_interleave(torch.arange(lmax + 1, device=positions.device),
                                                       torch.tensor([n_sym(n) for n in range(lmax + 1)],
                                                                    device=positions.device))

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(E, D) edge values -> (N, K, D) zero-padded per centre atom (K = max degree)."""
        return x.new_zeros((self.n_atoms, self.max_deg, x.shape[-1])).index_put((self.i, self.slot), x)


class EnvironmentTensors(nn.Module):
    """Multi-channel Cartesian environment tensors T^(n) (N, C, n_sym(n)), n = 0..lmax (packed)."""

    def __init__(self, n_features: int, n_channels: int, n_rbf: int, lmax: int, radial_hidden: int = 32):
        super().__init__()
        self.lmax, self.c = lmax, n_channels
        self.radial = _mlp(n_rbf, radial_hidden, (lmax + 1) * n_channels)
        self.neighbour = nn.Linear(n_features, (lmax + 1) * n_channels)

    def forward(self, h, geo: Geometry, inv_deg: float):
        w = self.radial(geo.rbf) * geo.fcut.unsqueeze(-1) * self.neighbour(h)[geo.j] * inv_deg
        # one batched matmul for every order: (N, (L+1)C, K) x (N, K, P_total), keep the diagonal blocks
        full = torch.bmm(geo.pad(w).transpose(1, 2), geo.powers_padded)
        c, off = self.c, geo.offsets
        return [full[:, n * c:(n + 1) * c, off[n]:off[n + 1]] for n in range(self.lmax + 1)]


def _mix(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Channel mixing (N, C, P) x (K, C) -> (N, K, P); equivariant (acts on channels only)."""
    return torch.einsum("ncp,kc->nkp", t, w)


def _amix(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-atom channel mixing (N, C, P) x (N, K, C) -> (N, K, P)."""
    return torch.bmm(w, t)


def channel_invariants(ts, mixes) -> torch.Tensor:
    """Channel-wise many-body invariants of environment tensors (N, C * (lmax + 1 + 2))."""
    mixed = [_mix(t, w) for t, w in zip(ts, mixes)]
    q = [sym_contract(t, m, n) for n, (t, m) in enumerate(zip(ts, mixed))]
    v = mixed[1]                      # (N, C, 3)
    a = unpack(mixed[2], 2)           # (N, C, 3, 3)
    q.append(torch.einsum("nci,ncij,ncj->nc", v, a, v))
    q.append(torch.einsum("ncij,ncjk,ncki->nc", a, a, a))
    return torch.cat(q, dim=-1)


def _init_mix(c_out: int, c_in: int) -> nn.Parameter:
    w = torch.randn(c_out, c_in) / c_in**0.5
    if c_out == c_in:
        w = w + torch.eye(c_in)
    return nn.Parameter(w)


def tensor_messages(xs, w, geo: Geometry):
    """Cartesian tensor messages M^(n)_{i,c} = sum_j w^(n)_c(ij) X^(n)_{j,c}: the neighbours' tensor
    features, weighted channel-wise by radial functions (equivariant: no index is touched)."""
    x = torch.cat(xs, dim=-1)                                           # (N, C, P_total)
    c = x.shape[1]
    wn = w.view(-1, geo.lmax + 1, c).transpose(1, 2)[:, :, geo.component_order]  # (E, C, P_total)
    m = scatter_sum(x[geo.j] * wn, geo.i, geo.n_atoms)
    off = geo.offsets
    return [m[:, :, off[n]:off[n + 1]] for n in range(geo.lmax + 1)]


class ChannelInteraction(nn.Module):
    """One interaction block.

    Tensor features X^(n) (orders 0..L, C channels) <- W^(n) [T^(n)(h) + M^(n)(X_prev) + X_prev^(n)]:
    the atom's environment tensors built from the current invariant features, the tensor messages of
    the neighbours' previous features and a residual, mixed in channel space; channel-wise
    contractions of X (many-body invariants) then update h <- h + MLP([h, asinh(q)]).
    """

    def __init__(self, n_features: int, n_channels: int, n_rbf: int, lmax: int, messages: bool = True,
                 radial_hidden: int = 32):
        super().__init__()
        self.env = EnvironmentTensors(n_features, n_channels, n_rbf, lmax, radial_hidden)
        self.msg_radial = _mlp(n_rbf, radial_hidden, (lmax + 1) * n_channels) if messages else None
        self.mixes = nn.ParameterList(_init_mix(n_channels, n_channels) for _ in range(lmax + 1))
        self.inv_mixes = nn.ParameterList(_init_mix(n_channels, n_channels) for _ in range(lmax + 1))
        n_q = n_channels * (lmax + 3)
        self.update = _mlp(n_features + n_q, n_features, n_features)

    def forward(self, h, xs, geo: Geometry, inv_deg: float):
        ts = self.env(h, geo, inv_deg)
        if xs is not None:
            ts = [t + x for t, x in zip(ts, xs)]
            if self.msg_radial is not None:
                w = self.msg_radial(geo.rbf) * geo.fcut.unsqueeze(-1) * inv_deg
                ts = [t + m for t, m in zip(ts, tensor_messages(xs, w, geo))]
        xs = [_mix(t, w) for t, w in zip(ts, self.mixes)]
        q = channel_invariants(xs, self.inv_mixes)
        return h + self.update(torch.cat([h, torch.asinh(q)], dim=-1)), xs


class CartesianHead(nn.Module):
    """Environment tensors -> equivariant channel products -> order-k tensor from a Cartesian basis."""

    N_TERMS = {2: lambda m: 1 + 3 * m, 3: lambda m: 5 * m, 4: lambda m: 2 + 5 * m}

    def __init__(self, order: int, n_features: int, n_channels: int, n_out: int, n_rbf: int, lmax: int,
                 atom_mixing: bool = True, with_features: bool = True, radial_hidden: int = 32):
        super().__init__()
        if order not in self.N_TERMS:
            raise ValueError(f"CEITNet outputs orders 2, 3, 4; got {order}")
        self.order, self.m = order, n_out
        self.c = c = n_channels * (2 if with_features else 1)  # pool: head environment (+ block features)
        self.env = EnvironmentTensors(n_features, n_channels, n_rbf, lmax, radial_hidden)
        self.inv_mixes = nn.ParameterList(_init_mix(n_channels, n_channels) for _ in range(lmax + 1))
        self.mix_v = _init_mix(n_out, c)
        self.mix_a = _init_mix(n_out, 2 * c)   # pool: order-2 tensors and v_c (x) v_c
        if order >= 3:
            self.mix_s = _init_mix(n_out, c)    # order-k fully symmetric tensors (k = 3 or 4)
        n_q = n_channels * (lmax + 3)
        self.hidden = nn.Sequential(nn.Linear(n_features + n_q, n_features), nn.SiLU())
        self.coef = nn.Linear(n_features, self.N_TERMS[order](n_out))
        # per-atom (invariant) corrections of the channel-mixing matrices: channel-space interactions
        # whose weights depend on the atom's many-body environment
        self.n_mix = c * (3 + (order >= 3))
        self.atom_mix = nn.Linear(n_features, n_out * self.n_mix) if atom_mixing else None
        with torch.no_grad():  # start near zero output, global mixing
            self.coef.weight.mul_(0.1)
            self.coef.bias.zero_()
            if self.atom_mix is not None:
                self.atom_mix.weight.mul_(0.1)
                self.atom_mix.bias.zero_()

    def _mixers(self, g):
        """Mixing matrices (N, M, C') per pool: global + per-atom correction."""
        m, c = self.m, self.c
        glob = [self.mix_v, self.mix_a] + ([self.mix_s] if self.order >= 3 else [])
        if self.atom_mix is None:
            return [w.expand(g.shape[0], -1, -1) for w in glob]
        d = self.atom_mix(g).view(-1, m, self.n_mix)
        sizes = [c, 2 * c] + ([c] if self.order >= 3 else [])
        return [w + dw for w, dw in zip(glob, torch.split(d, sizes, dim=-1))]

    def forward(self, h, xs, geo: Geometry, inv_deg: float):
        ts = self.env(h, geo, inv_deg)
        q = channel_invariants(ts, self.inv_mixes)
        if xs is not None:  # pool the head's environment tensors with the interaction blocks' features
            ts = [torch.cat([t, x], dim=1) for t, x in zip(ts, xs)]
        g = self.hidden(torch.cat([h, torch.asinh(q)], dim=-1))
        coef = self.coef(g)
        mixers = self._mixers(g)
        m = self.m
        eye = torch.eye(3, dtype=h.dtype, device=h.device)
        v_c = ts[1]                                                   # (N, C, 3)
        vv = (v_c.unsqueeze(-1) * v_c.unsqueeze(-2)).flatten(-2)      # (N, C, 9)
        pool = torch.cat([unpack(ts[2], 2).flatten(-2), vv], dim=1)   # (N, 2C, 9)
        a = _amix(pool, mixers[1]).view(-1, m, 3, 3)                  # (N, M, 3, 3), symmetric
        v = _amix(v_c, mixers[0])                                     # (N, M, 3)
        if self.order == 2:
            a0, a1, a2, a3 = coef[:, :1], coef[:, 1:1 + m], coef[:, 1 + m:1 + 2 * m], coef[:, 1 + 2 * m:]
            out = a0[:, :, None] * eye
            out = out + torch.einsum("nm,nmij->nij", a1, a)
            out = out + torch.einsum("nm,nmij,nmjk->nik", a2, a, a)
            out = out + torch.einsum("nm,nmi,nmj->nij", a3, v, v)
            return out
        if self.order == 3:
            b1, b2, b3, b4, b5 = coef.view(-1, 5, m).unbind(1)
            s3 = unpack(_amix(ts[3], mixers[2]), 3)                   # (N, M, 3, 3, 3)
            x1 = torch.einsum("nm,nmi->ni", b1, v)
            x2 = torch.einsum("nm,nmi->ni", b2, v)
            out = torch.einsum("ni,jk->nijk", x1, eye)
            t2 = torch.einsum("ij,nk->nijk", eye, x2)
            out = out + t2 + t2.transpose(2, 3)
            out = out + torch.einsum("nm,nmijk->nijk", b3, s3)
            out = out + torch.einsum("nm,nmi,nmjk->nijk", b4, v, a)
            t5 = torch.einsum("nm,nmij,nmk->nijk", b5, a, v)
            return out + t5 + t5.transpose(2, 3)
        c0, c1 = coef[:, 0], coef[:, 1]
        c2, c3, c4, c5, c6 = coef[:, 2:].view(-1, 5, m).unbind(1)
        dd = torch.einsum("ij,kl->ijkl", eye, eye)
        dx = torch.einsum("ik,jl->ijkl", eye, eye) + torch.einsum("il,jk->ijkl", eye, eye)
        out = c0[:, None, None, None, None] * dd + c1[:, None, None, None, None] * dx
        a2 = torch.einsum("nm,nmij->nij", c2, a)
        t = torch.einsum("ij,nkl->nijkl", eye, a2)
        out = out + t + t.permute(0, 3, 4, 1, 2)
        a3 = torch.einsum("nm,nmij->nij", c3, a)
        t = torch.einsum("ik,njl->nijkl", eye, a3)                   # d_ik A_jl
        out = out + t + t.transpose(1, 2) + t.transpose(3, 4) + t.transpose(1, 2).transpose(3, 4)
        s4 = torch.einsum("nm,nmp->np", c4, _amix(ts[4], mixers[2]))
        out = out + unpack(s4, 4)
        out = out + torch.einsum("nm,nmij,nmkl->nijkl", c5, a, a)
        t = torch.einsum("nm,nmik,nmjl->nijkl", c6, a, a)
        return out + t + t.transpose(3, 4)


class CEITNet(nn.Module):
    """Cartesian environment interaction tensor network for one target order (2, 3 or 4).

    ``model(numbers, positions, batch, edge_index, shifts, n_structures) -> (B, 3, ..., 3)``.
    """

    def __init__(self, order: int, n_features: int = 64, n_channels: int = 16, n_out: int = 8,
                 n_interactions: int = 2, n_rbf: int = 8, cutoff: float = 4.5, max_z: int = 100,
                 rbf: str = "bessel", avg_neighbors: float = 1.0, out_scale: float = 1.0, atom_mixing: bool = True,
                 tensor_messages: bool = True, irreducible: bool = True, radial_hidden: int = 32):
        super().__init__()
        self.order = int(order)
        self.lmax = max(self.order, 2)
        self.irreducible = bool(irreducible)
        self.hparams = dict(order=order, n_features=n_features, n_channels=n_channels, n_out=n_out,
                            n_interactions=n_interactions, n_rbf=n_rbf, cutoff=cutoff, max_z=max_z, rbf=rbf,
                            atom_mixing=atom_mixing, tensor_messages=tensor_messages,
                            irreducible=irreducible, radial_hidden=radial_hidden)
        self.embedding = nn.Embedding(max_z + 1, n_features)
        self.rbf = make_rbf(rbf, n_rbf, cutoff)
        self.envelope = CosineCutoff(cutoff)
        self.interactions = nn.ModuleList(ChannelInteraction(n_features, n_channels, n_rbf, self.lmax, tensor_messages,
                                                             radial_hidden) for _ in range(n_interactions))
        self.head = CartesianHead(self.order, n_features, n_channels, n_out, n_rbf, self.lmax, atom_mixing,
                                  with_features=n_interactions > 0, radial_hidden=radial_hidden)
        self.register_buffer("avg_neighbors", torch.tensor(float(avg_neighbors)))
        self.register_buffer("out_scale", torch.tensor(float(out_scale)))

    def atom_tensors(self, numbers, positions, edge_index, shifts=None):
        geo = Geometry(positions, edge_index, shifts, self.rbf, self.envelope, self.lmax, len(numbers),
                       self.irreducible)
        inv_deg = 1.0 / float(self.avg_neighbors)
        h = self.embedding(numbers).to(positions.dtype)
        xs = None
        for block in self.interactions:
            h, xs = block(h, xs, geo, inv_deg)
        return self.head(h, xs, geo, inv_deg)

    def forward(self, numbers, positions, batch, edge_index, shifts=None, n_structures: int | None = None):
        t = self.atom_tensors(numbers, positions, edge_index, shifts)
        n = int(n_structures) if n_structures is not None else int(batch.max()) + 1
        counts = torch.bincount(batch, minlength=n).to(t.dtype)
        mean = scatter_sum(t.flatten(1), batch, n) / counts.unsqueeze(-1)
        return (mean * self.out_scale).view((n,) + (3,) * self.order)

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["CEITNet", "CartesianHead", "ChannelInteraction", "EnvironmentTensors", "Geometry", "channel_invariants",
           "n_sym"]
