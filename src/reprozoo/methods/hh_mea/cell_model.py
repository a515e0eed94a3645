"""The miniature MEA experiment: a soma + axon HH cell above a 32-electrode grid.

Geometry (µm): electrodes on the z = 0 plane (8 x 4, 30 µm pitch, as the paper's array pitch);
the cell lies in a plane at height z above it, soma at (x0, y0, z), a straight axon leaving the
soma at angle φ to the array's long axis (x). ψ = (x0, y0, z, φ) is known to every variant (the
EI localises a cell; see README); θ = log(ḡ_Na, ḡ_K, g_L, R_a) is inferred.

Recording (the "few minutes of recording"): a brief synaptic-like inward current at the soma
evokes one spike; the extracellular potential of all 32 electrodes (point sources, insulating
substrate) is the electrical image EI (B, 32, T) in µV, with white noise of std ``noise_uv``
standing for what remains after spike-triggered averaging.

Stimulation: a current pattern over a few electrodes (µA) times a triphasic 2:-3:1 pulse
(0.05 ms per phase, the amplitude is that of the cathodic phase) sets Φ_e at every compartment;
the response is "spike" when any compartment exceeds 0 mV after the pulse has ended (the
action potential is regenerative and propagates; passive responses decay).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ...blocks.hodgkin_huxley import (HHParams, Stimulus, electrode_grid, point_source_lead_field,
                                      simulate, soma_axon_cable)

PARAM_NAMES = ("gNa", "gK", "gL", "Ra")
PARAM_UNITS = ("mS/cm²", "mS/cm²", "mS/cm²", "Ω·cm")
# textbook HH conductances (Hodgkin & Huxley 1952); Ra = 100 Ω·cm, a usual mammalian value
DEFAULT_PHYS = np.array([120.0, 36.0, 0.3, 100.0])


@dataclass
class Experiment:
    """Everything fixed across simulations: cable, array, time grid, prior box, noise."""

    n_axon: int = 14
    dt: float = 0.025              # ms
    t_record: float = 4.0          # ms
    t_stim: float = 3.0            # ms
    temp: float = 6.3              # °C
    trigger_na: float = 3.0        # nA, soma inward current of the recording trigger
    trigger_ms: float = 0.3
    noise_uv: float = 0.5          # µV, EI noise
    prior_factor: float = 2.0      # θ_phys in [default / f, default * f], log-uniform
    x0: tuple = (-95.0, -65.0)
    y0: tuple = (-25.0, 25.0)
    z: tuple = (10.0, 30.0)
    phi_deg: tuple = (-15.0, 15.0)
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        self.cable = soma_axon_cable(self.n_axon, dtype=self.dtype)
        self.elec = electrode_grid(8, 4, 30.0, dtype=self.dtype)

    # -- prior ----------------------------------------------------------------------------------
    @property
    def prior_low(self) -> np.ndarray:
        return np.log(DEFAULT_PHYS / self.prior_factor)

    @property
    def prior_high(self) -> np.ndarray:
        return np.log(DEFAULT_PHYS * self.prior_factor)

    @property
    def theta_default(self) -> np.ndarray:
        return np.log(DEFAULT_PHYS)

    def sample_theta(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.prior_low, self.prior_high, size=(n, 4))

    def sample_geometry(self, n: int, rng: np.random.Generator) -> np.ndarray:
        lo = np.array([self.x0[0], self.y0[0], self.z[0], self.phi_deg[0]])
        hi = np.array([self.x0[1], self.y0[1], self.z[1], self.phi_deg[1]])
        return rng.uniform(lo, hi, size=(n, 4))

    # -- geometry -------------------------------------------------------------------------------
    def compartment_xyz(self, psi: torch.Tensor) -> torch.Tensor:
        """(B, N, 3) compartment centres for geometries psi (B, 4) = (x0, y0, z, φ°)."""
        s = self.cable.xyz_um[:, 0]                                   # arc length from soma, µm
        phi = torch.deg2rad(psi[:, 3])
        x = psi[:, :1] + s[None] * torch.cos(phi)[:, None]
        y = psi[:, 1:2] + s[None] * torch.sin(phi)[:, None]
        z = psi[:, 2:3].expand_as(x)
        return torch.stack([x, y, z], -1)

    def lead_field(self, psi: torch.Tensor) -> torch.Tensor:
        return point_source_lead_field(self.compartment_xyz(psi), self.elec)   # (B, E, N) mV/nA

    def params(self, theta: torch.Tensor) -> HHParams:
        g = torch.exp(theta)
        return HHParams(gna=g[:, 0], gk=g[:, 1], gl=g[:, 2], ra=g[:, 3], temp=self.temp)

    # -- recording ------------------------------------------------------------------------------
    def record(self, theta, psi, rng: np.random.Generator | None = None, chunk: int = 1024) -> torch.Tensor:
        """EI (B, 32, T) in µV; noise added when rng is given. theta, psi: (B, 4) arrays/tensors."""
        theta, psi = self._t(theta), self._t(psi)
        outs = [self._record(theta[i:i + chunk], psi[i:i + chunk]) for i in range(0, len(theta), chunk)]
        ei = torch.cat(outs)
        if rng is not None:
            ei = ei + self.noise_uv * torch.as_tensor(rng.standard_normal(ei.shape), dtype=ei.dtype)
        return ei

    def _record(self, theta, psi) -> torch.Tensor:
        b, n = len(theta), self.cable.n
        steps = int(round(self.t_record / self.dt))
        wave = torch.zeros(steps, dtype=self.dtype)
        on = int(round(0.2 / self.dt))
        wave[on:on + int(round(self.trigger_ms / self.dt))] = 1.0
        prof = torch.zeros(b, n, dtype=self.dtype)
        prof[:, 0] = self.trigger_na
        r = simulate(self.params(theta), self.cable, self.dt, steps, b, i_inj=Stimulus(prof, wave),
                     record_current=True, dtype=self.dtype)
        lf = self.lead_field(psi)                                          # (B, E, N)
        return 1e3 * torch.einsum("ben,btn->bet", lf, r.i_m)              # mV -> µV

    # -- stimulation ----------------------------------------------------------------------------
    def stim_wave(self) -> torch.Tensor:
        steps = int(round(self.t_stim / self.dt))
        w = torch.zeros(steps, dtype=self.dtype)
        ph = max(1, int(round(0.05 / self.dt)))
        on = int(round(0.1 / self.dt))
        w[on:on + ph], w[on + ph:on + 2 * ph], w[on + 2 * ph:on + 3 * ph] = 2 / 3, -1.0, 1 / 3
        return w

    def respond(self, theta, psi, currents_ua, chunk: int = 2048) -> torch.Tensor:
        """Spike (bool, B) for patterns currents_ua (B, 32) in µA (cathodic-phase amplitudes)."""
        theta, psi, cur = self._t(theta), self._t(psi), self._t(currents_ua)
        return torch.cat([self._respond(theta[i:i + chunk], psi[i:i + chunk], cur[i:i + chunk])
                          for i in range(0, len(theta), chunk)])

    def _respond(self, theta, psi, cur) -> torch.Tensor:
        wave = self.stim_wave()
        b = len(theta)
        phi_prof = 1e3 * torch.einsum("ben,be->bn", self.lead_field(psi), cur)   # mV per unit wave
        with torch.no_grad():
            r = simulate(self.params(theta), self.cable, self.dt, len(wave), b,
                         phi_e=Stimulus(phi_prof, wave), dtype=self.dtype)
        end = int(torch.nonzero(wave).max()) + 1 + int(round(0.4 / self.dt))
        return r.v[:, end:].amax(dim=(1, 2)) > 0.0

    def thresholds(self, theta, psi, patterns, lo: float = 0.05, hi: float = 200.0,
                   iters: int = 12) -> torch.Tensor:
        """Amplitude (µA) at which each unit pattern (B, 32) starts to evoke a spike, bisection in
        log amplitude; inf where even ``hi`` fails."""
        theta, psi, pat = self._t(theta), self._t(psi), self._t(patterns)
        a = torch.full((len(theta),), math.log(lo), dtype=torch.float64)
        b = torch.full((len(theta),), math.log(hi), dtype=torch.float64)
        ok_hi = self.respond(theta, psi, pat * hi)
        for _ in range(iters):
            mid = (a + b) / 2
            s = self.respond(theta, psi, pat * torch.exp(mid)[:, None].to(self.dtype))
            b = torch.where(s, mid, b)
            a = torch.where(s, a, mid)
        thr = torch.exp(b)
        return torch.where(ok_hi, thr, torch.full_like(thr, math.inf))

    def _t(self, x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x, dtype=self.dtype)


def random_patterns(exp: Experiment, psi: np.ndarray, n_patterns: int, rng: np.random.Generator,
                    n_near: int = 6, max_electrodes: int = 3) -> np.ndarray:
    """Unit multi-electrode patterns (n_cells, n_patterns, 32): 1-3 of the 6 electrodes nearest
    the soma; the first carries -1 (cathodic, in units of the pulse amplitude), the others a
    weight uniform in [-1, 1]."""
    elec = exp.elec.numpy().astype(float)
    out = np.zeros((len(psi), n_patterns, len(elec)))
    for c, g in enumerate(psi):
        d = np.hypot(elec[:, 0] - g[0], elec[:, 1] - g[1])
        near = np.argsort(d)[:n_near]
        for k in range(n_patterns):
            m = rng.integers(1, max_electrodes + 1)
            idx = rng.choice(near, size=m, replace=False)
            out[c, k, idx[0]] = 1.0
            out[c, k, idx[1:]] = rng.uniform(-1, 1, size=m - 1)
    return out
