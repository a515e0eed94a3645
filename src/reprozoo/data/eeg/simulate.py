"""EEG simulated with an mne forward model: planted rhythms at planted sources, projected to sensors.

Head model: a three-shell sphere fitted to the template 10-20 electrode positions
(``mne.make_sphere_model("auto", "auto", info)``), sources in it, and the EEG gain matrix from
``mne.make_forward_solution(info, trans=None, src, bem=sphere)``: about a second, no download.

* Planted sources: one dipole per named generator (e.g. left motor cortex under C3), placed at
  ``depth`` of the head radius along the line from the sphere centre to an anchor electrode,
  jittered per subject (position and orientation), pointing outward. Each source's topography is
  scaled so that its largest sensor value is 1: source time courses are given in microvolts at
  their peak electrode, which keeps amplitudes readable while the spatial spread is the forward
  model's.
* Background brain activity: independent pink (1/f) noise in every dipole of a volume grid
  (``setup_volume_source_space(sphere=..., pos=grid_mm)``) with random orientation. Because all
  grid dipoles share one spectrum, their sum at the sensors equals ``L @ pink`` with
  ``L L^T = G_grid G_grid^T`` (normalised), which is how it is drawn (same distribution, far less memory).
* Sensor noise: white noise per electrode (amplifier), plus artefacts that are not brain sources
  (muscle, eyes) where a simulator asks for them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

MONTAGE = "colin27_1005"  # mne 1.13's name for the template formerly called standard_1005/standard_1020
MAX_DEPTH = 0.85  # planted dipoles stay within 0.85 x scalp radius (the brain shell ends at 0.90)
TEN_TWENTY = ["Fp1", "Fp2", "F7", "F3", "Fz", "F4", "F8", "T7", "C3", "Cz", "C4", "T8",
              "P7", "P3", "Pz", "P4", "P8", "O1", "O2"]


# --- signals ---------------------------------------------------------------------------------

def _shaped_noise(n: int, sfreq: float, gain_fn, rng: np.random.Generator, size: int = 1) -> np.ndarray:
    """Gaussian noise with amplitude spectrum ``gain_fn(freqs)``, scaled to unit RMS per row."""
    spec = rng.standard_normal((size, n // 2 + 1)) + 1j * rng.standard_normal((size, n // 2 + 1))
    freqs = np.fft.rfftfreq(n, 1.0 / sfreq)
    spec *= gain_fn(freqs)[None]
    x = np.fft.irfft(spec, n=n, axis=-1)
    x /= x.std(axis=-1, keepdims=True) + 1e-30
    return x if size > 1 else x[0]


def narrowband(n: int, sfreq: float, f0: float, bw: float, rng: np.random.Generator, size: int = 1) -> np.ndarray:
    """Band-limited noise around ``f0`` (Gaussian spectral line of s.d. ``bw`` Hz): a rhythm with
    natural waxing and waning. Unit RMS."""
    return _shaped_noise(n, sfreq, lambda f: np.exp(-0.5 * ((f - f0) / bw) ** 2), rng, size)


def pink(n: int, sfreq: float, rng: np.random.Generator, size: int = 1, exponent: float = 1.0,
         fmin: float = 0.5) -> np.ndarray:
    """1/f**exponent power spectrum (flattened below ``fmin``). Unit RMS."""
    return _shaped_noise(n, sfreq, lambda f: 1.0 / np.maximum(f, fmin) ** (exponent / 2), rng, size)


def bandpass_noise(n: int, sfreq: float, lo: float, hi: float, rng: np.random.Generator, size: int = 1) -> np.ndarray:
    return _shaped_noise(n, sfreq, lambda f: ((f >= lo) & (f <= hi)).astype(float), rng, size)


def smooth(x: np.ndarray, sfreq: float, seconds: float) -> np.ndarray:
    """Triangular moving average of total width ``seconds`` (two box passes, edges held): for
    cross-fades between states. O(n)."""
    k = max(1, int(round(seconds * sfreq / 2)))
    y = np.asarray(x, float)
    for _ in range(2):
        pad = np.concatenate([np.full(k, y[0]), y, np.full(k, y[-1])])
        c = np.cumsum(np.concatenate([[0.0], pad]))
        y = ((c[k:] - c[:-k]) / k)[k // 2: k // 2 + len(y)]
    return y


# --- head model ------------------------------------------------------------------------------

@dataclass
class Planted:
    """A generator anchored under an electrode (``anchor``), at ``depth`` x head radius."""
    name: str
    anchor: str
    depth: float = 0.75
    tilt_deg: float = 15.0  # s.d. of the per-subject orientation jitter
    jitter_mm: float = 4.0  # s.d. of the per-subject position jitter


@dataclass
class Head:
    ch_names: list[str]
    positions: np.ndarray  # (n_ch, 3) electrode positions, head coordinates (m)
    topographies: list[dict[str, np.ndarray]]  # per subject: planted name -> (n_ch,) peak-normalised
    source_pos: list[dict[str, np.ndarray]]  # per subject: planted name -> (3,)
    background: np.ndarray  # (n_ch, n_ch) L with L L^T = normalised grid covariance
    sphere: dict = field(default_factory=dict)

    def info(self, sfreq: float):
        return _info(tuple(self.ch_names), sfreq)


def _info(ch_names: tuple[str, ...], sfreq: float):
    import mne

    mne.set_log_level("ERROR")

    info = mne.create_info(list(ch_names), sfreq, "eeg")
    info.set_montage(mne.channels.make_standard_montage(MONTAGE))
    return info


def head_positions(ch_names) -> np.ndarray:
    """Electrode positions in mne's head frame (after the montage's fiducial transform), metres."""
    info = _info(tuple(ch_names), 100.0)
    return np.array([ch["loc"][:3] for ch in info["chs"]])


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


@functools.lru_cache(maxsize=8)
def _grid_background(ch_names: tuple[str, ...], grid_mm: float):
    """Sphere model, and the normalised sensor covariance of iid random-orientation grid dipoles."""
    import mne

    info = _info(ch_names, 100.0)
    sphere = mne.make_sphere_model("auto", "auto", info)
    src = mne.setup_volume_source_space(sphere=sphere, pos=grid_mm, exclude=20.0)
    fwd = mne.make_forward_solution(info, trans=None, src=src, bem=sphere)
    g = fwd["sol"]["data"]  # (n_ch, 3 * n_grid): free orientation = isotropic random orientation
    cov = g @ g.T
    cov /= np.mean(np.diag(cov))
    chol = np.linalg.cholesky(cov + 1e-6 * np.eye(len(cov)))
    return sphere, chol, int(src[0]["nuse"])


def head_model(ch_names: list[str], planted: list[Planted], n_subjects: int, rng: np.random.Generator,
               grid_mm: float = 25.0) -> Head:
    """Forward model for ``ch_names`` with ``planted`` generators, jittered per subject (one
    ``make_forward_solution`` call for all subjects)."""
    import mne

    sphere, chol, _ = _grid_background(tuple(ch_names), grid_mm)
    info = _info(tuple(ch_names), 100.0)
    positions = head_positions(ch_names)
    r0 = np.asarray(sphere["r0"])
    radius = float(sphere.radius)
    anchors = head_positions(sorted({p.anchor for p in planted}))
    anchors = dict(zip(sorted({p.anchor for p in planted}), anchors))
    rr, nn = [], []
    for _ in range(n_subjects):
        for p in planted:
            u = _unit(anchors[p.anchor] - r0)
            loc = u * p.depth * radius + rng.normal(0, p.jitter_mm * 1e-3, 3)
            loc = r0 + loc * min(1.0, MAX_DEPTH * radius / np.linalg.norm(loc))  # stay inside the brain shell
            ori = _unit(u + rng.normal(0, np.deg2rad(p.tilt_deg), 3))
            rr.append(loc)
            nn.append(ori)
    rr, nn = np.array(rr), np.array(nn)
    src = mne.setup_volume_source_space(pos=dict(rr=rr, nn=nn), sphere=sphere, mindist=0.0)
    if int(src[0]["nuse"]) != len(rr):
        raise RuntimeError("a planted source fell outside the head model; reduce its depth")
    fwd = mne.make_forward_solution(info, trans=None, src=src, bem=sphere)
    if fwd["nsource"] != len(rr):
        raise RuntimeError("the forward model dropped planted sources; reduce their depth")
    g = fwd["sol"]["data"].reshape(len(ch_names), len(rr), 3)
    topo = np.einsum("cki,ki->ck", g, nn)  # fixed orientation gain (n_ch, n_src)
    topographies, source_pos = [], []
    k = 0
    for _ in range(n_subjects):
        t, s = {}, {}
        for p in planted:
            col = topo[:, k]
            t[p.name] = col / np.abs(col).max()
            s[p.name] = rr[k]
            k += 1
        topographies.append(t)
        source_pos.append(s)
    return Head(list(ch_names), positions, topographies, source_pos, chol,
                {"r0_m": r0.tolist(), "head_radius_m": radius})


def sensors(head: Head, subject: int, sources: dict[str, np.ndarray], n: int, sfreq: float,
            rng: np.random.Generator, background_uv: float, white_uv: float) -> np.ndarray:
    """Project source time courses (uV at peak electrode) and add background + sensor noise."""
    names = list(sources)
    topo = np.stack([head.topographies[subject][k] for k in names], axis=1)  # (n_ch, n_src)
    x = topo @ np.stack([sources[k] for k in names])
    x += background_uv * (head.background @ pink(n, sfreq, rng, size=len(head.ch_names)))
    x += white_uv * rng.standard_normal(x.shape)
    return x


# --- events ----------------------------------------------------------------------------------

def poisson_times(rate_per_s: np.ndarray, sfreq: float, rng: np.random.Generator, refractory_s: float = 1.0):
    """Event times of an inhomogeneous Poisson process with per-sample rate, with a dead time."""
    p = np.clip(rate_per_s / sfreq, 0, 1)
    idx = np.flatnonzero(rng.random(len(p)) < p)
    out, last = [], -np.inf
    for i in idx:
        if (i - last) / sfreq >= refractory_s:
            out.append(i)
            last = i
    return np.array(out, dtype=int)


def add_events(x: np.ndarray, idx: np.ndarray, waveform_fn, rng: np.random.Generator) -> None:
    """Add ``waveform_fn(rng)`` (a 1-D array) at every sample index in ``idx`` (in place)."""
    for i in idx:
        w = waveform_fn(rng)
        j = min(len(x), i + len(w))
        x[i:j] += w[: j - i]
