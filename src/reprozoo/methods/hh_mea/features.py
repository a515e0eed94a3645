"""Designed features of an electrical image (EI), and the raw-trace input of the baseline.

The EI of one cell is its spike-averaged extracellular waveform on every electrode, (32, T) µV.
The paper fits HH parameters from designed EI features (amplitude map, spike width, propagation
velocity) rather than from raw traces. Ours, with ψ = (x0, y0, z, φ) the known cell geometry and
s the arc length along the axon:

  log_amp_max      log of the largest peak-to-peak amplitude (µV)        ~ ḡ_Na, distance
  log_amp_soma     log amplitude on the electrode nearest the soma
  log_amp_axon     log amplitude on the electrode nearest the axon at s = 150 µm  (axon/soma currents)
  trough_to_peak   ms from the trough to the following peak on the max electrode  ~ ḡ_K, ḡ_Na
  half_width       ms the max electrode stays below half its trough                 ~ AP duration
  log_peak_trough  log(peak / |trough|) on the max electrode (waveform asymmetry)
  slowness         ms/µm, weighted least-squares slope of the trough time against s over the
                   electrodes along the axon (s > 40 µm, amplitude > 10 % of max): 1/velocity
  axon_delay       ms between the troughs of the axon electrode and the max electrode

plus geometry descriptors (z, x0, y0, φ and the lateral distances from the soma and from the
axon point to their nearest electrodes), since amplitudes fall with distance.
"""
from __future__ import annotations

import numpy as np
import torch

FEATURE_NAMES = ("log_amp_max", "log_amp_soma", "log_amp_axon", "trough_to_peak", "half_width",
                 "log_peak_trough", "slowness", "axon_delay")
AXON_PROBE_UM = 150.0


def _subsample_extremum(ei: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Parabolic interpolation of an extremum's position (in samples) around integer index idx."""
    t = ei.shape[-1]
    i = idx.clamp(1, t - 2)
    y0, y1, y2 = (torch.gather(ei, -1, (i + k)[..., None])[..., 0] for k in (-1, 0, 1))
    den = y0 - 2 * y1 + y2
    off = torch.where(den.abs() > 1e-9, 0.5 * (y0 - y2) / den, torch.zeros_like(den))
    return i.to(ei.dtype) + off.clamp(-1, 1)


def geometry_descriptors(psi: np.ndarray, elec_xy: np.ndarray) -> np.ndarray:
    """(B, 6): x0, y0, z, φ, lateral distance soma -> nearest electrode, axon probe -> nearest."""
    phi = np.deg2rad(psi[:, 3])
    probe = psi[:, :2] + AXON_PROBE_UM * np.stack([np.cos(phi), np.sin(phi)], -1)
    d_soma = np.linalg.norm(psi[:, None, :2] - elec_xy[None], axis=-1).min(-1)
    d_probe = np.linalg.norm(probe[:, None] - elec_xy[None], axis=-1).min(-1)
    return np.concatenate([psi, d_soma[:, None], d_probe[:, None]], -1)


def designed_features(ei: torch.Tensor, psi: np.ndarray, elec_xy: np.ndarray, dt: float) -> np.ndarray:
    """(B, 8 + 6): the designed EI features above, then the geometry descriptors."""
    ei = ei.to(torch.float64)
    b = ei.shape[0]
    ar = torch.arange(b)
    amp = ei.amax(-1) - ei.amin(-1)                                   # (B, E)
    e_max = amp.argmax(-1)
    w = ei[ar, e_max]                                                  # (B, T) max-electrode waveform
    i_tr = w.argmin(-1)
    t_tr = _subsample_extremum(-w, i_tr)
    after = torch.arange(w.shape[-1])[None] > i_tr[:, None]
    i_pk = torch.where(after, w, torch.full_like(w, -1e9)).argmax(-1)
    t_pk = _subsample_extremum(w, i_pk)
    trough = w[ar, i_tr]
    peak = w[ar, i_pk]
    half_width = (w < trough[:, None] / 2).sum(-1).to(torch.float64) * dt

    psi_t = torch.as_tensor(psi, dtype=torch.float64)
    ex = torch.as_tensor(elec_xy, dtype=torch.float64)
    phi = torch.deg2rad(psi_t[:, 3])
    u = torch.stack([torch.cos(phi), torch.sin(phi)], -1)
    rel = ex[None] - psi_t[:, None, :2]                               # (B, E, 2)
    s = (rel * u[:, None]).sum(-1)                                     # arc-length projection, µm
    e_soma = rel.norm(dim=-1).argmin(-1)
    probe = psi_t[:, :2] + AXON_PROBE_UM * u
    e_axon = (ex[None] - probe[:, None]).norm(dim=-1).argmin(-1)

    t_tr_all = _subsample_extremum(-ei, ei.argmin(-1)) * dt           # (B, E) trough times, ms
    use = (s > 40.0) & (amp > 0.1 * amp.amax(-1, keepdim=True))
    wgt = use.to(torch.float64) * amp
    sw = wgt.sum(-1).clamp_min(1e-9)
    s_mean = (wgt * s).sum(-1) / sw
    t_mean = (wgt * t_tr_all).sum(-1) / sw
    cov = (wgt * (s - s_mean[:, None]) * (t_tr_all - t_mean[:, None])).sum(-1)
    var = (wgt * (s - s_mean[:, None]) ** 2).sum(-1).clamp_min(1e-9)
    slowness = torch.where(use.sum(-1) >= 3, cov / var, torch.zeros_like(cov))

    feats = torch.stack([
        torch.log(amp.amax(-1)),
        torch.log(amp[ar, e_soma].clamp_min(1e-3)),
        torch.log(amp[ar, e_axon].clamp_min(1e-3)),
        (t_pk - t_tr) * dt,
        half_width,
        torch.log(peak.clamp_min(1e-3) / (-trough).clamp_min(1e-3)),
        slowness,
        t_tr_all[ar, e_axon] - t_tr * dt,
    ], -1).numpy()
    return np.concatenate([feats, geometry_descriptors(psi, elec_xy)], -1)


def raw_traces(ei: torch.Tensor, psi: np.ndarray, pool: int = 4, scale_uv: float = 10.0) -> np.ndarray:
    """(B, 32 * T/pool + 4): the EI averaged over `pool` samples, in units of scale_uv, then ψ."""
    b, e, t = ei.shape
    x = ei[..., : t - t % pool].reshape(b, e, -1, pool).mean(-1) / scale_uv
    return np.concatenate([x.reshape(b, -1).to(torch.float64).numpy(), psi], -1)
