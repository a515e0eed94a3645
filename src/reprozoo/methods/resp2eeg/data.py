"""Simulated nights: a hidden hypnogram drives one central EEG channel and the breathing that goes with it.

Why our own simulator: the paper's data (SHHS, MESA, 28 000 nights) are credentialed; the
miniature needs paired EEG and respiration whose common cause (sleep stage, age, sex) is known,
so that what the synthetic EEG carries can be checked against the truth.

Generative model, per subject s with traits (age_s in years, sex_s = 1 for female):

* hypnogram: :func:`reprozoo.data.eeg.sleep.hypnogram` (cycles W -> N1 -> N2 -> N3 -> N2 -> REM,
  N3 shrinking and REM growing across cycles), 30-s epochs.
* breathing (8 Hz, arbitrary units): for every run of one stage, neurokit2's ``rsp_simulate``
  (breathmetrics model) at rate ``r_s * rate_factor(stage)`` breaths/min, depth
  ``d_s * depth_factor(stage)``, with a slow amplitude wobble whose coefficient of variation is the
  stage's (regular in N3, irregular in REM and W). Subject base rate
  ``r_s = 12 + 0.04 (age - 20) + 1.0 sex + N(0, 0.7)`` and depth ``d_s = 1 - 0.15 sex - 0.004 (age - 20)``
  (older: faster, shallower; female: faster, shallower) -- the paths through which breathing
  carries age and sex.
* EEG (64 Hz, uV), one channel, as the sum of stage-weighted generators, stage weights taken from
  :data:`reprozoo.data.eeg.sleep.PROFILE` and cross-faded over 2 s:
  pink background; alpha (narrowband at ``f_alpha = 10.3 - 0.015 (age - 20)`` Hz, W);
  theta (5-7 Hz, N1/REM); delta (0.5-2 Hz band noise; N3 amplitude
  ``delta_uv = 55 (1 - 0.009 (age - 20)) (1 + 0.1 sex)``: slow-wave activity falls with age);
  spindles (12-14 Hz Hann bursts of 0.5-1.5 s, rate per minute from PROFILE: N2 highest, scaled
  by ``(1 - 0.008 (age - 20)) (1 + 0.35 sex)``); delta amplitude and spindle rate are weakly locked
  to the respiratory phase (as in the project's sleep simulator).

Everything is deterministic in the numpy Generator passed in.
"""
from __future__ import annotations

import numpy as np

from reprozoo.data.eeg.simulate import add_events, bandpass_noise, narrowband, pink, poisson_times, smooth
from reprozoo.data.eeg.sleep import EPOCH_S, KEYS, PROFILE, STAGES, hypnogram

EEG_SFREQ = 64.0
RESP_SFREQ = 8.0
# breathing per stage: rate factor, depth factor, coefficient of variation of the depth (slow wobble)
RESP_PROFILE = {"W": (1.00, 1.00, 0.30), "N1": (0.95, 0.95, 0.15), "N2": (0.90, 1.10, 0.08),
                "N3": (0.85, 1.25, 0.04), "REM": (1.08, 0.85, 0.35)}
COUPLING = {"spindle_rate_by_resp_phase": 0.5, "delta_amp_by_resp_phase": 0.15}


def traits(rng: np.random.Generator) -> dict:
    """Age (years), sex (1 = female) and the physiological parameters they shift."""
    age, sex = float(rng.uniform(20.0, 80.0)), int(rng.integers(0, 2))
    a = age - 20.0
    return {"age": age, "sex": sex,
            "resp_rate_bpm": 12.0 + 0.04 * a + 1.0 * sex + rng.normal(0, 0.7),
            "resp_depth": max(0.3, 1.0 - 0.15 * sex - 0.004 * a + rng.normal(0, 0.05)),
            "f_alpha": 10.3 - 0.015 * a + rng.normal(0, 0.3),
            "alpha_uv": rng.uniform(15.0, 25.0),
            "f_theta": rng.uniform(5.0, 7.0),
            "delta_uv": 55.0 * (1 - 0.009 * a) * (1 + 0.1 * sex) * rng.uniform(0.9, 1.1),
            "f_spindle": rng.uniform(12.0, 14.0),
            "spindle_scale": (1 - 0.008 * a) * (1 + 0.35 * sex),
            "spindle_uv": rng.uniform(18.0, 26.0),
            "background_uv": rng.uniform(4.0, 6.0)}


def breathing(stages: list[str], tr: dict, rng: np.random.Generator) -> np.ndarray:
    """neurokit2 breathmetrics waveform, one call per run of a stage, with stage-wise rate and depth."""
    import neurokit2 as nk

    n_ep = int(EPOCH_S * RESP_SFREQ)
    out = []
    i = 0
    while i < len(stages):
        j = i
        while j < len(stages) and stages[j] == stages[i]:
            j += 1
        rate_f, depth_f, cv = RESP_PROFILE[stages[i]]
        n = (j - i) * n_ep
        seed = int(rng.integers(2**31))
        # the distortion noise gets its own Generator: neurokit's default spawns it from the legacy
        # RandomState by an MT19937 jump, which was half of the call's CPU time
        w = nk.rsp_simulate(duration=int((j - i) * EPOCH_S), sampling_rate=int(RESP_SFREQ),
                            respiratory_rate=tr["resp_rate_bpm"] * rate_f, method="breathmetrics",
                            random_state=seed, random_state_distort=np.random.default_rng([seed, 1]))[:n]
        w = (w - w.mean()) / (w.std() + 1e-9)
        wobble = 1 + cv * narrowband(n, RESP_SFREQ, 0.0, 0.03, rng)
        out.append(tr["resp_depth"] * depth_f * np.clip(wobble, 0.2, None) * w)
        i = j
    x = np.concatenate(out)
    return x + 0.03 * rng.standard_normal(len(x))


def resp_phase(resp: np.ndarray) -> np.ndarray:
    """Instantaneous respiratory phase (rad) from the analytic signal of the 0.1-0.6 Hz band."""
    from scipy.signal import butter, hilbert, sosfiltfilt

    sos = butter(2, [0.1, 0.6], btype="band", fs=RESP_SFREQ, output="sos")
    return np.angle(hilbert(sosfiltfilt(sos, resp)))


def eeg(stages: list[str], tr: dict, resp: np.ndarray, rng: np.random.Generator,
        sfreq: float = EEG_SFREQ) -> tuple[np.ndarray, np.ndarray]:
    """Single-channel EEG (uV) and the sample indices of the planted spindles."""
    n = int(len(stages) * EPOCH_S * sfreq)
    n_ep = int(EPOCH_S * sfreq)
    prof = {k: np.repeat([PROFILE[s][KEYS.index(k)] if PROFILE[s][KEYS.index(k)] is not None else -1.0
                          for s in stages], n_ep) for k in ("alpha", "theta", "delta", "spindle")}
    prof["delta"] = np.where(prof["delta"] < 0, tr["delta_uv"], prof["delta"])
    c = {k: smooth(v, sfreq, 2.0) for k, v in prof.items()}
    t_resp = np.arange(len(resp)) / RESP_SFREQ
    phase = np.interp(np.arange(n) / sfreq, t_resp, np.unwrap(resp_phase(resp)))
    x = tr["background_uv"] * pink(n, sfreq, rng)
    x += tr["alpha_uv"] * c["alpha"] * narrowband(n, sfreq, tr["f_alpha"], 0.4, rng)
    x += c["theta"] * narrowband(n, sfreq, tr["f_theta"], 1.0, rng)
    x += c["delta"] * (1 + COUPLING["delta_amp_by_resp_phase"] * np.sin(phase)) * bandpass_noise(n, sfreq, 0.5, 2.0, rng)
    rate = tr["spindle_scale"] * c["spindle"] / 60.0 * (1 + COUPLING["spindle_rate_by_resp_phase"] * np.cos(phase))
    idx = poisson_times(rate, sfreq, rng, refractory_s=2.0)

    def _spindle(r):
        m = int(r.uniform(0.5, 1.5) * sfreq)
        t = np.arange(m) / sfreq
        return tr["spindle_uv"] * r.uniform(0.8, 1.2) * np.hanning(m) * np.sin(
            2 * np.pi * (tr["f_spindle"] + r.normal(0, 0.3)) * t + r.uniform(0, 2 * np.pi))

    add_events(x, idx, _spindle, rng)
    x += 0.5 * rng.standard_normal(n)
    return x, idx


def simulate(n_subjects: int, n_epochs: int, rng: np.random.Generator) -> dict:
    """Nights of ``n_subjects``: EEG (S, E, 30 s x 64 Hz), breathing (S, E, 30 s x 8 Hz), stages (S, E),
    age (S,), sex (S,), spindle counts per epoch (S, E)."""
    X, R, Y, ages, sexes, spc = [], [], [], [], [], []
    n_eeg = int(EPOCH_S * EEG_SFREQ)
    for _ in range(n_subjects):
        tr = traits(rng)
        stages = hypnogram(n_epochs, rng)
        resp = breathing(stages, tr, rng)
        x, idx = eeg(stages, tr, resp, rng)
        X.append(x.reshape(n_epochs, n_eeg))
        R.append(resp.reshape(n_epochs, -1))
        Y.append([STAGES.index(s) for s in stages])
        spc.append(np.bincount(idx // n_eeg, minlength=n_epochs))
        ages.append(tr["age"])
        sexes.append(tr["sex"])
    return {"eeg": np.asarray(X, np.float32), "resp": np.asarray(R, np.float32), "stage": np.asarray(Y, np.int64),
            "age": np.asarray(ages), "sex": np.asarray(sexes, np.int64), "spindles": np.asarray(spc, np.int64)}
