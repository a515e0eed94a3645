"""Simulated ECG records (neurokit2's ECGSYN) and their two views: the signal and a printed image.

Why simulation: PTB-XL / MIMIC-IV-ECG cannot be downloaded here. ECGSYN (McSharry et al. 2003,
via ``neurokit2.ecg_simulate``) is a dynamical model whose beat is a sum of five Gaussian
waves (P, Q, R, S, T) placed at angles ``ti`` (degrees of the cardiac phase) with widths ``bi``
(radians) on a limit cycle whose period follows the RR tachogram (mean ``heart_rate``,
standard deviation ``heart_rate_std``). We control the rhythm through those knobs:

* rhythm class -> mean heart rate (brady < 60 bpm, normal, tachy > 100 bpm) and RR variability
  (``heart_rate_std`` of 1 bpm for sinus rhythms, 14-24 bpm for the irregular, AF-like class);
* QRS width   -> Q and S angles and the Q/R/S widths scaled by ``qrs_scale``;
* PR interval -> P angle scaled by ``pr_scale``;
* QT interval -> T angle scaled by ``qt_scale``.

The *clean* 250 Hz record is what the protocol measures (protocol.py). The model sees a noisy
observation of it (amplitude gain, baseline wander, white noise), resampled to 125 Hz, as a
signal (1000 samples, 8 s) and as an image drawn on ECG paper (``render_image``: 25 px/s, a
grid every 0.2 s like the large squares of standard paper).
"""
from __future__ import annotations

import warnings

import numpy as np

FS_SIM = 250        # Hz, simulation and delineation rate
FS_MODEL = 125      # Hz, what the model sees
DURATION_S = 8.0
RHYTHMS = ("normal", "brady", "tachy", "irregular")


def sample_params(rng: np.random.Generator) -> dict:
    """Draw one record's ECGSYN parameters: a rhythm class and independent conduction knobs."""
    rhythm = RHYTHMS[rng.integers(len(RHYTHMS))]
    hr, hr_std = {"normal": (rng.uniform(62, 96), 1.0),
                  "brady": (rng.uniform(44, 57), 1.0),
                  "tachy": (rng.uniform(105, 140), 1.0),
                  "irregular": (rng.uniform(70, 115), rng.uniform(14, 24))}[rhythm]
    return {"rhythm": rhythm, "heart_rate": float(hr), "heart_rate_std": float(hr_std),
            "qrs_scale": float(rng.uniform(0.5, 1.3)), "pr_scale": float(rng.uniform(0.8, 1.5)),
            "qt_scale": float(rng.uniform(0.85, 1.3)), "random_state": int(rng.integers(2**31 - 1))}


def simulate_clean(params: dict) -> np.ndarray:
    """Noise-free single-lead ECG (mV) at FS_SIM from ECGSYN with the record's wave geometry."""
    import neurokit2 as nk

    ti = tuple(a * k for a, k in zip(TI_DEG, (params["pr_scale"], params["qrs_scale"], 1.0, params["qrs_scale"],
                                                 params["qt_scale"])))          # ECGSYN default angles x knobs
    bi = tuple(b * k for b, k in zip(BI_RAD, (1.0, params["qrs_scale"], params["qrs_scale"], params["qrs_scale"],
                                              1.0)))                             # ECGSYN default widths x knobs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = nk.ecg_simulate(duration=DURATION_S, sampling_rate=FS_SIM, heart_rate=params["heart_rate"],
                            heart_rate_std=params["heart_rate_std"], noise=0.0,
                            random_state=params["random_state"], ti=ti, bi=bi)
    return np.asarray(x, dtype=np.float64)


# ECGSYN's default wave angles (degrees of the cardiac phase) and widths (radians), P Q R S T
TI_DEG = (-70.0, -15.0, 0.0, 15.0, 100.0)
BI_RAD = (0.25, 0.1, 0.1, 0.1, 0.4)
# A Gaussian wave's extent: its centre +- WAVE_SD widths (+- 2 SD, where the wave has fallen to 14 % of
# its peak). Checked on 45 calibration records (rng seed 5, none of them a training, validation or test
# record; a throwaway check): the generator's QRS, PR and QTc then agree with neurokit2's delineation in
# median to +7 / -2 / +8 ms, against bins of 20 / 40 / 30 ms (at 2.25: +1 / -8 / -12; at 2.5: -5 / -14
# / -31). One convention for all records; no per-record information from the delineator.
WAVE_SD = 2.0


def wave_geometry(params: dict) -> tuple[np.ndarray, np.ndarray]:
    """The angles (rad) and widths (rad) ECGSYN integrates for this record: our knobs on its defaults,
    then its own heart-rate scaling (neurokit2 ``_ecg_simulate_ecgsyn``: widths x sqrt(hr / 60), the
    Q and S angles x sqrt(hr / 60), the P and T angles x (hr / 60) ** 0.25)."""
    w, p, q = params["qrs_scale"], params["pr_scale"], params["qt_scale"]
    ti = np.deg2rad([TI_DEG[0] * p, TI_DEG[1] * w, 0.0, TI_DEG[3] * w, TI_DEG[4] * q])
    bi = np.array([BI_RAD[0], BI_RAD[1] * w, BI_RAD[2] * w, BI_RAD[3] * w, BI_RAD[4]])
    hrfact = np.sqrt(params["heart_rate"] / 60.0)
    return ti * np.array([np.sqrt(hrfact), hrfact, 1.0, hrfact, np.sqrt(hrfact)]), bi * hrfact


def generator_features(params: dict) -> dict:
    """The record's true values as the generator defines them, with no delineation: the nominal heart
    rate, the nominal RR variability (heart_rate_std / heart_rate), and the QRS, PR and QTc (Bazett) of
    the wave geometry at the mean RR (one cardiac cycle = 2 pi of phase): QRS from Q onset to S offset,
    PR from P onset to Q onset, QT from Q onset to T offset, each onset / offset at the wave's centre
    -+ WAVE_SD widths."""
    ti, bi = wave_geometry(params)
    rr = 60.0 / params["heart_rate"]
    ms = lambda a, b: (b - a) / (2 * np.pi) * rr * 1000.0  # noqa: E731
    on = ti - WAVE_SD * bi
    off = ti + WAVE_SD * bi
    return {"hr": float(params["heart_rate"]), "rr_cv": float(params["heart_rate_std"] / params["heart_rate"]),
            "qrs_ms": float(ms(on[1], off[3])), "pr_ms": float(ms(on[0], on[1])),
            "qtc_ms": float(ms(on[1], off[4]) / np.sqrt(rr))}


def observe(clean: np.ndarray, rng: np.random.Generator, noise_mv: tuple[float, float]) -> np.ndarray:
    """One noisy acquisition at FS_MODEL: gain, baseline wander (0.1-0.5 Hz) and white noise.

    Returns the signal normalised by the clean record's R amplitude scale (robust: 99th
    percentile of |x|), so the model reads shapes and timing, not absolute gain.
    """
    n = len(clean)
    t = np.arange(n) / FS_SIM
    gain = rng.uniform(0.8, 1.2)
    wander = rng.uniform(0.05, 0.25) * np.sin(2 * np.pi * rng.uniform(0.1, 0.5) * t + rng.uniform(0, 2 * np.pi))
    x = gain * clean + wander + rng.uniform(*noise_mv) * rng.standard_normal(n)
    x = x.reshape(-1, FS_SIM // FS_MODEL).mean(axis=1)              # 250 -> 125 Hz, box filter
    return (x / (np.percentile(np.abs(clean), 99) + 1e-9)).astype(np.float32)


def render_image(sig: np.ndarray, height: int = 40, px_per_s: int = 25, lo: float = -0.8,
                 hi: float = 1.6) -> np.ndarray:
    """Rasterise a trace onto ECG paper: ink 1.0 between each column's min and max, grid 0.3.

    Each column covers FS_MODEL / px_per_s samples; drawing the vertical span from the column's
    minimum to its maximum keeps the QRS spike that a point sample would miss (what a pen on paper
    does). Amplitude maps linearly from [lo, hi] (normalised units) to rows height-1 .. 0.
    """
    per = FS_MODEL // px_per_s
    cols = sig[: len(sig) // per * per].reshape(-1, per)
    width = cols.shape[0]
    to_row = lambda v: np.clip(np.round((hi - v) / (hi - lo) * (height - 1)), 0, height - 1)
    r_top, r_bot = to_row(cols.max(axis=1)), to_row(cols.min(axis=1))
    rows = np.arange(height)[:, None]
    img = np.zeros((height, width), dtype=np.float32)
    img[:, ::5] = 0.3                                                # 0.2 s grid (5 px at 25 px/s)
    img[::8, :] = 0.3
    ink = (rows >= r_top[None, :]) & (rows <= r_bot[None, :])
    img[ink] = 1.0
    return img
