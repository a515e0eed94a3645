"""Differentiable multi-compartment Hodgkin-Huxley cables in torch, batched over simulations.

Why here: an HH neuron is a generic model piece (biophysical inference, stimulation design, SNN
references). The simulator is vectorised over a batch of B simulations, so ~10^3 parameter sets
cost one loop over time, and every step is a torch op, so gradients flow to every parameter.

Physics (units: mV, ms, µA/cm², mS/cm², µF/cm², µm, nA, Ω·cm). An unbranched cable of N
cylindrical compartments k (length L_k, diameter d_k, membrane area A_k = π d_k L_k) with membrane
potential V_k = Φ_in,k - Φ_e,k obeys

    C dV_k/dt = -I_ion,k + (1/A_k) Σ_{j=k±1} g_kj [(V_j - V_k) + (Φ_e,j - Φ_e,k)] + I_inj,k / A_k

    I_ion = ḡ_Na m³h (V - E_Na) + ḡ_K n⁴ (V - E_K) + g_L (V - E_L)
    dx/dt = φ(T) [α_x(V)(1 - x) - β_x(V) x],  x ∈ {m, h, n},  φ(T) = 3^((T - 6.3)/10)

with the rate functions of Hodgkin & Huxley (1952, J Physiol 117:500) written for a resting
potential of -65 mV (Dayan & Abbott, Theoretical Neuroscience, ch. 5). The axial conductance
between neighbours is g_kj = 1/(r_k/2 + r_j/2), r_k = 4 R_a L_k / (π d_k²) (series half-cylinders).
The term g_kj (Φ_e,j - Φ_e,k) is the "activating function" (Rattay 1986) through which an applied
extracellular potential (electrical stimulation) drives the cable; I_inj is a current that crosses
the membrane inwards (synaptic-like input, or an intracellular electrode).

Scheme (as NEURON and Jaxley): gates by exponential Euler (Rush & Larsen 1978), exact for frozen V,
so stable at any dt; then V by backward Euler with the ionic conductances at the new gates, which
makes the step linear in V: a tridiagonal system per simulation, solved by the Thomas (Hines)
algorithm vectorised over the batch. Backward Euler is unconditionally stable for the stiff
cable term (τ_axial = C A / g ≈ 0.1 ms for thin axons), so dt = 0.025 ms is fine.

Extracellular potentials use the point-source approximation in an infinite homogeneous medium of
conductivity σ, Φ(r) = I / (4πσ |r - r_k|), doubled for electrodes on an insulating substrate
(method of images). One lead-field matrix serves recording (Φ_e = L I_m, I_m the transmembrane
currents) and stimulation (Φ at the compartments = Lᵀ I_electrodes) by reciprocity. The
transmembrane current of a compartment equals its net axial inflow, so Σ_k I_m,k = 0 exactly:
the recorded field has no monopole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

Tensor = torch.Tensor

# Hodgkin & Huxley (1952) squid-axon constants, resting potential -65 mV (Dayan & Abbott, ch. 5)
HH_DEFAULTS = {"gna": 120.0, "gk": 36.0, "gl": 0.3, "ena": 50.0, "ek": -77.0, "el": -54.387,
               "cm": 1.0, "ra": 35.4, "temp": 6.3}


@dataclass
class HHParams:
    """Membrane and cable parameters: floats, (B,) tensors (one value per simulation) or (B | 1, N)."""

    gna: float | Tensor = HH_DEFAULTS["gna"]    # mS/cm²
    gk: float | Tensor = HH_DEFAULTS["gk"]      # mS/cm²
    gl: float | Tensor = HH_DEFAULTS["gl"]      # mS/cm²
    ena: float | Tensor = HH_DEFAULTS["ena"]    # mV
    ek: float | Tensor = HH_DEFAULTS["ek"]      # mV
    el: float | Tensor = HH_DEFAULTS["el"]      # mV
    cm: float | Tensor = HH_DEFAULTS["cm"]      # µF/cm²
    ra: float | Tensor = HH_DEFAULTS["ra"]      # Ω·cm, axial resistivity: float or (B,)
    temp: float = HH_DEFAULTS["temp"]           # °C

    def with_(self, **kw) -> "HHParams":
        return replace(self, **kw)


@dataclass
class Cable:
    """Unbranched cable geometry: compartment lengths and diameters (µm), shape (N,)."""

    length_um: Tensor
    diam_um: Tensor
    xyz_um: Tensor | None = None   # (N, 3) or (B, N, 3) compartment centres, for extracellular models

    @property
    def n(self) -> int:
        return int(self.length_um.shape[-1])

    @property
    def area_cm2(self) -> Tensor:
        return math.pi * self.diam_um * self.length_um * 1e-8

    def axial_conductance_ms(self, ra) -> Tensor:
        """g_{k,k+1} (mS), shape (..., N-1), for axial resistivity ra (Ω·cm, float or (B,))."""
        r_half = 4.0 * (self.length_um * 1e-4) / (math.pi * (self.diam_um * 1e-4) ** 2) / 2.0  # /Ra, 1/cm
        r_series = r_half[..., :-1] + r_half[..., 1:]
        ra = torch.as_tensor(ra, dtype=r_series.dtype)
        if ra.ndim == 1:
            ra = ra[:, None]
        return 1e3 / (ra * r_series)  # S -> mS


def soma_axon_cable(n_axon: int, soma_diam_um: float = 20.0, soma_len_um: float = 20.0,
                    axon_diam_um: float = 2.0, axon_seg_um: float = 25.0, dtype=torch.float64) -> Cable:
    """A soma cylinder followed by n_axon axon compartments, laid out along +x from the origin."""
    length = torch.tensor([soma_len_um] + [axon_seg_um] * n_axon, dtype=dtype)
    diam = torch.tensor([soma_diam_um] + [axon_diam_um] * n_axon, dtype=dtype)
    x = torch.cumsum(length, 0) - length / 2 - soma_len_um / 2   # soma centre at x = 0
    xyz = torch.stack([x, torch.zeros_like(x), torch.zeros_like(x)], -1)
    return Cable(length, diam, xyz)


# --- channel kinetics ----------------------------------------------------------------------------

def _vtrap(x: Tensor, y: float) -> Tensor:
    """x / (exp(x/y) - 1), with its limit y at x = 0 (the removable singularity of α_m, α_n)."""
    small = x.abs() < 1e-6
    xs = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, y - x / 2, xs / torch.expm1(xs / y))


def rates(v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(α_m, β_m, α_h, β_h, α_n, β_n) in 1/ms at 6.3 °C, v in mV (rest -65)."""
    am = 0.1 * _vtrap(-(v + 40.0), 10.0)
    bm = 4.0 * torch.exp(-(v + 65.0) / 18.0)
    ah = 0.07 * torch.exp(-(v + 65.0) / 20.0)
    bh = 1.0 / (1.0 + torch.exp(-(v + 35.0) / 10.0))
    an = 0.01 * _vtrap(-(v + 55.0), 10.0)
    bn = 0.125 * torch.exp(-(v + 65.0) / 80.0)
    return am, bm, ah, bh, an, bn


def gates_inf(v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    am, bm, ah, bh, an, bn = rates(v)
    return am / (am + bm), ah / (ah + bh), an / (an + bn)


def q10_factor(temp: float) -> float:
    return 3.0 ** ((temp - 6.3) / 10.0)


def steady_current(v: Tensor, p: HHParams) -> Tensor:
    """Ionic current (µA/cm²) with every gate at its steady state for voltage v."""
    m, h, n = gates_inf(v)
    return p.gna * m**3 * h * (v - p.ena) + p.gk * n**4 * (v - p.ek) + p.gl * (v - p.el)


def resting_potential(p: HHParams, shape: tuple[int, ...], dtype=torch.float64,
                      lo: float = -90.0, hi: float = -45.0, iters: int = 45) -> Tensor:
    """Per-compartment resting potential (mV) of an isolated patch, differentiable in p.

    Bisection on the steady-state current (no gradient), then one Newton step taken with the
    gradient switched on: V* = V_b - I(V_b; p)/I'(V_b) has the exact first derivative dV*/dp =
    -(∂I/∂p)/I' of the implicit-function theorem, so gradient fits see how rest moves with p.
    """
    with torch.no_grad():
        pd = _detach(p)
        a = torch.full(shape, lo, dtype=dtype)
        b = torch.full(shape, hi, dtype=dtype)
        for _ in range(iters):
            mid = (a + b) / 2
            pos = steady_current(mid, pd) > 0
            b = torch.where(pos, mid, b)
            a = torch.where(pos, a, mid)
        vb = (a + b) / 2
        eps = 1e-4
        slope = (steady_current(vb + eps, pd) - steady_current(vb - eps, pd)) / (2 * eps)
    return vb - steady_current(vb, p) / slope


def _detach(p: HHParams) -> HHParams:
    return HHParams(**{k: (v.detach() if torch.is_tensor(v) else v) for k, v in p.__dict__.items()})


# --- the simulator -------------------------------------------------------------------------------

@dataclass
class Stimulus:
    """A separable input: profile (B, N) times waveform (T,), value at step t = profile * wave[t]."""

    profile: Tensor
    wave: Tensor

    def at(self, t: int) -> Tensor:
        return self.profile * self.wave[t]


@dataclass
class SimResult:
    v: Tensor            # (B, T, N) membrane potential, mV, after each step
    i_m: Tensor | None   # (B, T, N) outward transmembrane current, nA (None unless requested)
    t_ms: Tensor         # (T,)
    extras: dict = field(default_factory=dict)


def _thomas(lower: Tensor, diag: Tensor, upper: Tensor, rhs: Tensor) -> Tensor:
    """Solve tridiagonal systems batched over the leading dims; lower/upper (..., N-1)."""
    n = diag.shape[-1]
    cp, dp = [None] * n, [None] * n
    cp[0] = upper[..., 0] / diag[..., 0] if n > 1 else None
    dp[0] = rhs[..., 0] / diag[..., 0]
    for k in range(1, n):
        denom = diag[..., k] - lower[..., k - 1] * cp[k - 1]
        if k < n - 1:
            cp[k] = upper[..., k] / denom
        dp[k] = (rhs[..., k] - lower[..., k - 1] * dp[k - 1]) / denom
    x = [None] * n
    x[-1] = dp[-1]
    for k in range(n - 2, -1, -1):
        x[k] = dp[k] - cp[k] * x[k + 1]
    return torch.stack(x, -1)


def simulate(p: HHParams, cable: Cable, dt: float, n_steps: int, batch: int,
             i_inj: Stimulus | None = None, phi_e: Stimulus | None = None,
             v0: Tensor | None = None, record_current: bool = False,
             dtype=torch.float64) -> SimResult:
    """Integrate B cables for n_steps of dt (ms).

    i_inj: inward membrane current (nA) per compartment; phi_e: applied extracellular potential
    (mV) at the compartment centres. v0: initial membrane potential (B, N); default the resting
    potential, with all gates at their steady state for v0.
    """
    n = cable.n
    area = cable.area_cm2.to(dtype)                                    # (N,)
    g_ax = cable.axial_conductance_ms(p.ra).to(dtype)                  # (B or 1, N-1) mS
    g_ax = g_ax.expand(batch, n - 1)
    g_left = torch.cat([torch.zeros(batch, 1, dtype=dtype), g_ax], -1)   # coupling to k-1
    g_right = torch.cat([g_ax, torch.zeros(batch, 1, dtype=dtype)], -1)  # coupling to k+1
    gna, gk, gl = (torch.as_tensor(x, dtype=dtype) for x in (p.gna, p.gk, p.gl))
    ena, ek, el, cm = (torch.as_tensor(x, dtype=dtype) for x in (p.ena, p.ek, p.el, p.cm))
    gna, gk, gl, ena, ek, el, cm = (_bn(x, batch, n) for x in (gna, gk, gl, ena, ek, el, cm))
    phi = q10_factor(p.temp)

    if v0 is None:
        v = resting_potential(HHParams(gna, gk, gl, ena, ek, el, cm, p.ra, p.temp), (batch, n), dtype)
    else:
        v = v0.to(dtype).expand(batch, n)
    m, h, nn_ = gates_inf(v)
    c_dt = cm / dt
    lower = -g_ax / area[1:]                       # coefficient of V_{k-1} in row k
    upper = -g_ax / area[:-1]                      # coefficient of V_{k+1} in row k
    diag_ax = (g_left + g_right) / area
    vs, ims = [], []
    for t in range(n_steps):
        am, bm, ah, bh, an, bn = rates(v)
        m = _rush_larsen(m, am, bm, phi, dt)
        h = _rush_larsen(h, ah, bh, phi, dt)
        nn_ = _rush_larsen(nn_, an, bn, phi, dt)
        g_na, g_k = gna * m**3 * h, gk * nn_**4
        g_tot = g_na + g_k + gl
        rhs = c_dt * v + g_na * ena + g_k * ek + gl * el
        if i_inj is not None:
            rhs = rhs + 1e-3 * i_inj.at(t) / area       # nA -> µA, per cm²
        pe = phi_e.at(t) if phi_e is not None else None
        if pe is not None:
            rhs = rhs + _axial_drive(pe, g_left, g_right) / area
        v_new = _thomas(lower, c_dt + g_tot + diag_ax, upper, rhs)
        if record_current:
            vi = v_new if pe is None else v_new + pe
            ims.append(1e3 * _axial_drive(vi, g_left, g_right))   # µA -> nA, net axial inflow
        v = v_new
        vs.append(v)
    t_ms = dt * torch.arange(1, n_steps + 1, dtype=dtype)
    return SimResult(torch.stack(vs, 1), torch.stack(ims, 1) if record_current else None, t_ms)


def _bn(x: Tensor, batch: int, n: int) -> Tensor:
    """Scalars, (B,) per simulation, or (B | 1, N) per compartment -> (B, N)."""
    if x.ndim == 1:
        x = x[:, None]
    return x.expand(batch, n)


def _rush_larsen(x: Tensor, a: Tensor, b: Tensor, phi: float, dt: float) -> Tensor:
    s = phi * (a + b)
    x_inf = a / (a + b)
    return x_inf + (x - x_inf) * torch.exp(-s * dt)


def _axial_drive(u: Tensor, g_left: Tensor, g_right: Tensor) -> Tensor:
    """Σ_j g_kj (u_j - u_k) for a potential u (B, N) along the cable (sealed ends), in µA."""
    flow = g_right[:, :-1] * (u[:, 1:] - u[:, :-1])       # current from k+1 into k, (B, N-1)
    zero = torch.zeros_like(u[:, :1])
    return torch.cat([flow, zero], -1) - torch.cat([zero, flow], -1)


# --- extracellular fields -------------------------------------------------------------------------

def point_source_lead_field(comp_xyz_um: Tensor, elec_xyz_um: Tensor, sigma_s_per_m: float = 0.3,
                            insulating_plane: bool = True, r_min_um: float = 5.0) -> Tensor:
    """L (..., E, N) in mV per nA: Φ_e = L @ I_m; Φ at compartments = Lᵀ @ I_electrodes.

    Φ = I / (4πσ r) with I in nA, r in µm, σ in S/m gives mV directly (1e-9 A / 1e-6 m = 1e-3 V).
    r is softened to sqrt(r² + r_min²) (finite electrode and compartment size); an insulating
    substrate (electrodes on the z = 0 plane, tissue at z > 0) doubles the potential.
    """
    d = comp_xyz_um[..., None, :, :] - elec_xyz_um[:, None, :]          # (..., E, N, 3)
    r = torch.sqrt((d**2).sum(-1) + r_min_um**2)
    return (2.0 if insulating_plane else 1.0) / (4 * math.pi * sigma_s_per_m * r)


def electrode_grid(nx: int = 8, ny: int = 4, pitch_um: float = 30.0, dtype=torch.float64) -> Tensor:
    """(nx*ny, 3) electrode positions on the z = 0 plane, centred on the origin."""
    xs = (torch.arange(nx, dtype=dtype) - (nx - 1) / 2) * pitch_um
    ys = (torch.arange(ny, dtype=dtype) - (ny - 1) / 2) * pitch_um
    gx, gy = torch.meshgrid(xs, ys, indexing="ij")
    return torch.stack([gx.ravel(), gy.ravel(), torch.zeros(nx * ny, dtype=dtype)], -1)


def spike_times(v: Tensor, t_ms: Tensor, threshold_mv: float = 0.0) -> Tensor:
    """Upward threshold crossings of a single trace v (T,), linearly interpolated, ms."""
    above = v >= threshold_mv
    idx = torch.nonzero(~above[:-1] & above[1:]).ravel()
    frac = (threshold_mv - v[idx]) / (v[idx + 1] - v[idx])
    return t_ms[idx] + frac * (t_ms[idx + 1] - t_ms[idx])
