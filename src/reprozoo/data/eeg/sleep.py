"""Sleep EEG in 30-s epochs scored W / N1 / N2 / N3 / REM, with a respiration channel.

Sources
* offline: simulated with an mne forward model (see :mod:`.simulate`), per subject a hypnogram of
  sleep cycles (W -> N1 -> N2 -> N3 -> N2 -> REM, N3 shrinking and REM growing across cycles) and
  stage-dependent generators: occipital alpha (~10 Hz) in W, theta (5-7 Hz) in N1/REM, spindles
  (12-14 Hz bursts, central) and K-complexes (frontal, biphasic) in N2, high-amplitude delta
  (0.5-2 Hz, frontal) in N3, sawtooth waves (2-4 Hz, central) and rapid conjugate eye movements
  (frontopolar) in REM, blinks in W, muscle noise (temporal/frontal) falling from W to REM, pink
  background and sensor noise. Respiration (``Resp oro-nasal``): rate and depth depend on the
  stage (slower, deeper and more regular from W to N3; faster and irregular in REM), per-subject
  base rate; spindle timing and delta amplitude are weakly locked to the respiratory phase.
  Subject-specific frequencies, amplitudes and head geometry. Written as Sleep-EDF-format
  EDF+ pairs (``SC4001E0-PSG.edf`` + ``SC4001EC-Hypnogram.edf``).
* remote: PhysioNet Sleep-EDF Expanded (sleep-cassette) through
  ``mne.datasets.sleep_physionet.age.fetch_data`` (pooch, SHA-1 pinned in mne). The base URL comes
  from ``params["base_url"]``, else the environment variable ``REPROZOO_SLEEP_PHYSIONET_URL``, else
  mne's default (files are fetched as ``<base_url>/<file name>``).
* path: a user folder of ``*-PSG.edf`` / ``*-Hypnogram.edf`` pairs (``data.paths.eeg_sleep``),
  paired on the first 7 characters of the name as in Sleep-EDF (SC4001E0 <-> SC4001EC).

Preprocessing (mne): hypnogram as annotations (R&K stages 3+4 -> N3), optional crop to the sleep
period +- ``wake_margin_min``, FIR band-pass, resample, 30-s epochs; respiration band-passed
(0.05-1 Hz) and epoched alongside, with a per-epoch breathing rate estimate.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from ..download import DownloadError
from ..registry import DatasetError
from . import common
from .common import EEGData
from .simulate import (TEN_TWENTY, Planted, add_events, bandpass_noise, head_model, narrowband, poisson_times,
                       sensors, smooth)

NAME = "eeg_sleep"
STAGES = ["W", "N1", "N2", "N3", "REM"]
EPOCH_S = 30.0
SIM_SFREQ = 128.0
HYPNO_TEXT = {"W": "Sleep stage W", "N1": "Sleep stage 1", "N2": "Sleep stage 2", "N3": "Sleep stage 3",
              "REM": "Sleep stage R"}
ANNOT_TO_STAGE = {"Sleep stage W": "W", "Sleep stage 1": "N1", "Sleep stage 2": "N2", "Sleep stage 3": "N3",
                  "Sleep stage 4": "N3", "Sleep stage R": "REM"}
RESP_NAME = "Resp oro-nasal"

PLANTED = [Planted("alpha_left", "O1", depth=0.7), Planted("alpha_right", "O2", depth=0.7),
           Planted("theta", "Cz", depth=0.6), Planted("delta_left", "F3", depth=0.65),
           Planted("delta_right", "F4", depth=0.65), Planted("spindle", "Cz", depth=0.55),
           Planted("kcomplex", "Fz", depth=0.55), Planted("sawtooth", "Cz", depth=0.6),
           Planted("beta", "Fz", depth=0.7), Planted("eye_left", "Fp1", depth=0.8, tilt_deg=10.0),
           Planted("eye_right", "Fp2", depth=0.8, tilt_deg=10.0)]

# Stage profiles. Amplitudes in uV at the source's peak electrode (rhythms: RMS); rates per minute;
# resp_*: factor on the subject's base rate, coefficient of variation, factor on the base depth.
PROFILE = {
    #       alpha  theta delta beta spindle kc  saw  rem  blink emg  resp_rate resp_cv resp_amp
    "W":   (1.00, 3.0, 4.0, 4.0, 0.0, 0.0, 0.0, 0.0, 10.0, 5.0, 1.00, 0.15, 1.00),
    "N1":  (0.30, 9.0, 8.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.5, 0.95, 0.10, 0.95),
    "N2":  (0.10, 7.0, 15.0, 1.5, 5.0, 1.5, 0.0, 0.0, 0.0, 1.5, 0.90, 0.05, 1.10),
    "N3":  (0.05, 5.0, None, 1.0, 1.5, 0.5, 0.0, 0.0, 0.0, 1.2, 0.85, 0.03, 1.25),
    "REM": (0.15, 9.0, 8.0, 3.0, 0.0, 0.0, 3.0, 8.0, 0.0, 0.5, 1.05, 0.20, 0.85),
}
KEYS = ["alpha", "theta", "delta", "beta", "spindle", "kc", "saw", "rem", "blink", "emg", "resp_rate", "resp_cv",
        "resp_amp"]
EMG_WEIGHTS = {"T7": 1.0, "T8": 1.0, "F7": 0.6, "F8": 0.6, "Fp1": 0.4, "Fp2": 0.4}
RESP_COUPLING = {"spindle_rate_by_resp_phase": 0.5, "delta_amp_by_resp_phase": 0.15}


# --- simulation ------------------------------------------------------------------------------

def hypnogram(n_epochs: int, rng: np.random.Generator) -> list[str]:
    """Sleep cycles W -> N1 -> N2 -> N3 -> N2 -> REM (about one per 30 epochs); every stage occurs."""
    if n_epochs < 6:
        raise DatasetError("eeg_sleep needs at least 6 epochs per subject (one per stage of a cycle)")
    cycle = ["W", "N1", "N2", "N3", "N2", "REM"]
    n_cycles = max(1, min(n_epochs // 6, int(round(n_epochs / 30))))
    lengths = np.full(n_cycles, n_epochs // n_cycles)
    lengths[: n_epochs % n_cycles] += 1
    out: list[str] = []
    for c, length in enumerate(lengths):
        w = np.array([0.10, 0.08, 0.27, 0.25, 0.12, 0.18])
        w[3] *= 0.6 ** c  # less N3, more REM later in the night
        w[5] *= 1.3 ** c
        w[0] = w[0] if c == 0 else w[0] * 0.3
        blocks = 1 + rng.multinomial(length - len(cycle), w / w.sum())
        for stage, b in zip(cycle, blocks):
            out += [stage] * int(b)
    return out


def subject_params(rng: np.random.Generator) -> dict:
    return {"f_alpha": rng.uniform(8.5, 11.0), "alpha_uv": rng.uniform(15.0, 30.0), "f_theta": rng.uniform(5.0, 7.0),
            "delta_uv": rng.uniform(30.0, 45.0), "f_spindle": rng.uniform(12.0, 14.0),
            "spindle_uv": rng.uniform(15.0, 30.0), "kc_uv": rng.uniform(60.0, 100.0), "f_saw": rng.uniform(2.5, 4.0),
            "eye_uv": rng.uniform(60.0, 110.0), "amp_scale": rng.uniform(0.8, 1.25),
            "resp_rate_bpm": rng.uniform(12.0, 17.0), "resp_depth": rng.uniform(150.0, 300.0),
            "background_uv": rng.uniform(3.0, 6.0), "white_uv": 1.0}


def _stage_curves(stages: list[str], sp: dict, sfreq: float, fade_s: float = 2.0, resp_fade_s: float = 10.0):
    n_ep = int(EPOCH_S * sfreq)
    curves = {}
    for j, k in enumerate(KEYS):
        vals = []
        for s in stages:
            v = PROFILE[s][j]
            vals.append(sp["delta_uv"] if v is None else v)
        x = np.repeat(np.asarray(vals, float), n_ep)
        curves[k] = smooth(x, sfreq, resp_fade_s if k.startswith("resp") else fade_s)
    return curves


def _respiration(curves: dict, sp: dict, n: int, sfreq: float, rng: np.random.Generator):
    """Breathing: instantaneous rate and depth follow the stage, with slow irregularity."""
    slow = narrowband(n, sfreq, 0.0, 0.02, rng, size=2)
    rate = sp["resp_rate_bpm"] * curves["resp_rate"] * (1 + curves["resp_cv"] * slow[0])
    rate = np.clip(rate, 4.0, 40.0)
    phase = 2 * np.pi * np.cumsum(rate / 60.0) / sfreq + rng.uniform(0, 2 * np.pi)
    depth = sp["resp_depth"] * curves["resp_amp"] * np.clip(1 + curves["resp_cv"] * slow[1], 0.2, None)
    wave = np.sin(phase) + 0.3 * np.sin(2 * phase - np.pi / 2)  # inspiration faster than expiration
    resp = depth * wave + 0.02 * sp["resp_depth"] * rng.standard_normal(n)
    return resp, rate, phase


def _sawtooth(cycles: np.ndarray, width: float) -> np.ndarray:
    """Triangle wave in [-1, 1]: rises for ``width`` of each cycle, falls for the rest."""
    ph = np.mod(cycles, 1.0)
    return np.where(ph < width, -1 + 2 * ph / width, 1 - 2 * (ph - width) / (1 - width))


def _kcomplex(sfreq, amp):
    t = np.arange(int(1.4 * sfreq)) / sfreq
    return amp * (-np.exp(-0.5 * ((t - 0.3) / 0.07) ** 2) + 0.45 * np.exp(-0.5 * ((t - 0.75) / 0.18) ** 2))


def simulate_subject(head, s: int, sp: dict, stages: list[str], sfreq: float, rng: np.random.Generator,
                     ch_names: list[str]):
    n = int(len(stages) * EPOCH_S * sfreq)
    c = _stage_curves(stages, sp, sfreq)
    resp, rate, phase = _respiration(c, sp, n, sfreq, rng)
    a = sp["amp_scale"]
    src = {}
    for hemi in ("left", "right"):
        src[f"alpha_{hemi}"] = a * sp["alpha_uv"] * c["alpha"] * narrowband(n, sfreq, sp["f_alpha"], 0.6, rng)
        delta = bandpass_noise(n, sfreq, 0.5, 2.0, rng)
        src[f"delta_{hemi}"] = a * c["delta"] * (1 + RESP_COUPLING["delta_amp_by_resp_phase"] * np.sin(phase)) * delta
    src["theta"] = a * c["theta"] * narrowband(n, sfreq, sp["f_theta"], 1.0, rng)
    src["beta"] = a * c["beta"] * narrowband(n, sfreq, 20.0, 3.0, rng)
    # spindles: 0.5-1.5 s Hann-tapered bursts, rate per stage, favoured near inspiration onset
    sp_rate = c["spindle"] / 60.0 * (1 + RESP_COUPLING["spindle_rate_by_resp_phase"] * np.cos(phase))
    spindle = np.zeros(n)
    idx = poisson_times(sp_rate, sfreq, rng, refractory_s=2.0)

    def _spindle(r):
        m = int(r.uniform(0.5, 1.5) * sfreq)
        t = np.arange(m) / sfreq
        return a * sp["spindle_uv"] * r.uniform(0.7, 1.3) * np.hanning(m) * np.sin(
            2 * np.pi * (sp["f_spindle"] + r.normal(0, 0.3)) * t + r.uniform(0, 2 * np.pi))

    add_events(spindle, idx, _spindle, rng)
    src["spindle"] = spindle
    kc = np.zeros(n)
    add_events(kc, poisson_times(c["kc"] / 60.0, sfreq, rng, 3.0),
               lambda r: _kcomplex(sfreq, a * sp["kc_uv"] * r.uniform(0.8, 1.2)), rng)
    src["kcomplex"] = kc
    saw = np.zeros(n)

    def _saw(r):
        m = int(r.integers(3, 7) / sp["f_saw"] * sfreq)
        t = np.arange(m) / sfreq
        return 25.0 * a * r.uniform(0.7, 1.3) * np.hanning(m) * _sawtooth(sp["f_saw"] * t, 0.8)

    add_events(saw, poisson_times(c["saw"] / 60.0, sfreq, rng, 2.0), _saw, rng)
    src["sawtooth"] = saw
    # eyes: rapid conjugate movements in REM (opposite polarity left/right), blinks in W (same polarity)
    eye_h, eye_v = np.zeros(n), np.zeros(n)

    def _rem(r):
        hold = int(r.uniform(0.3, 1.0) * sfreq)
        m = hold + int(0.3 * sfreq)
        t = np.arange(m) / sfreq
        step = 0.5 * (np.tanh((t - 0.05) / 0.015) - np.tanh((t - hold / sfreq) / 0.03))
        return sp["eye_uv"] * r.choice([-1, 1]) * r.uniform(0.5, 1.0) * step

    add_events(eye_h, poisson_times(c["rem"] / 60.0, sfreq, rng, 0.8), _rem, rng)

    def _blink(r):
        t = np.arange(int(0.4 * sfreq)) / sfreq
        return 1.2 * sp["eye_uv"] * r.uniform(0.7, 1.3) * np.exp(-0.5 * ((t - 0.15) / 0.05) ** 2)

    add_events(eye_v, poisson_times(c["blink"] / 60.0, sfreq, rng, 1.0), _blink, rng)
    src["eye_left"] = eye_v + eye_h
    src["eye_right"] = eye_v - eye_h
    x = sensors(head, s, src, n, sfreq, rng, sp["background_uv"], sp["white_uv"])
    emg = bandpass_noise(n, sfreq, 25.0, min(60.0, sfreq / 2 - 1), rng, size=len(ch_names))
    for i, ch in enumerate(ch_names):
        if ch in EMG_WEIGHTS:
            x[i] += EMG_WEIGHTS[ch] * c["emg"] * emg[i]
    n_ep = int(EPOCH_S * sfreq)
    rate_true = rate[: len(stages) * n_ep].reshape(len(stages), n_ep).mean(axis=1)
    return x, resp, rate_true


def simulate(raw_dir: Path, params: dict, seed: int) -> dict:
    from .edf import Signal, write_edf

    ch_names = list(params.get("sim_channels", TEN_TWENTY))
    n_subjects = int(params["subjects"])
    n_epochs = int(params["epochs_per_subject"])
    sfreq = float(params.get("sim_sfreq", SIM_SFREQ))
    head = head_model(ch_names, PLANTED, n_subjects, np.random.default_rng([seed, 0]),
                      grid_mm=float(params.get("grid_mm", 25.0)))
    folder = Path("physionet-sleep-data")
    records, truth = [], []
    for s in range(n_subjects):
        sp = subject_params(np.random.default_rng([seed, 1, s]))
        stages = hypnogram(n_epochs, np.random.default_rng([seed, 3, s]))
        x, resp, rate_true = simulate_subject(head, s, sp, stages, sfreq, np.random.default_rng([seed, 2, s]), ch_names)
        stem = f"SC4{s:02d}1"
        psg, hyp = folder / f"{stem}E0-PSG.edf", folder / f"{stem}EC-Hypnogram.edf"
        sigs = [Signal(f"EEG {c}", x[i], sfreq, "uV", -2000.0, 2000.0) for i, c in enumerate(ch_names)]
        sigs.append(Signal(RESP_NAME, resp, sfreq, "uV", -2000.0, 2000.0, transducer="simulated thermistor"))
        write_edf(raw_dir / psg, sigs, [], record_duration=1.0)
        ann, t = [], 0.0
        for stage in stages:  # merge runs of one stage into one annotation, as in Sleep-EDF
            if ann and ann[-1][2] == HYPNO_TEXT[stage]:
                ann[-1] = (ann[-1][0], ann[-1][1] + EPOCH_S, ann[-1][2])
            else:
                ann.append((t, EPOCH_S, HYPNO_TEXT[stage]))
            t += EPOCH_S
        write_edf(raw_dir / hyp, [], ann, record_duration=0, n_records=1)
        subject = f"SC4{s:02d}"
        records.append({"psg": str(psg), "hypnogram": str(hyp), "subject": subject, "night": 1,
                        "resp_rate_true": [round(float(v), 4) for v in rate_true]})
        truth.append({"subject": subject, **{k: float(v) for k, v in sp.items()},
                      **{f"pos_{k}_m": v.tolist() for k, v in head.source_pos[s].items()}})
    common.write_index(raw_dir, records, truth=truth, head=head.sphere)
    return {"version": "simulator-1", "generator": "reprozoo.data.eeg.sleep.simulate",
            "head_model": {"kind": "3-shell sphere fitted to the template montage", **head.sphere,
                           "montage": "colin27_1005", "planted": {p.name: p.anchor for p in PLANTED}},
            "stage_profiles": {s: dict(zip(KEYS, v)) for s, v in PROFILE.items()}, "resp_coupling": RESP_COUPLING}


# --- acquire ---------------------------------------------------------------------------------

def _base_url(params: dict) -> str:
    from mne.datasets.sleep_physionet import age

    url = params.get("base_url") or os.environ.get("REPROZOO_SLEEP_PHYSIONET_URL") or age.BASE_URL
    return url.rstrip("/")  # mne joins base_url + "/" + file name


def fetch_remote(raw_dir: Path, params: dict) -> dict:
    import requests

    common.quiet_mne()
    from mne.datasets.sleep_physionet import age

    url = _base_url(params)
    subjects = [int(s) for s in params["remote_subjects"]]
    nights = [int(r) for r in params.get("remote_recording", [1])]
    pairs = []
    for subject in subjects:  # one subject at a time, so that an error names it
        try:
            pairs += age.fetch_data([subject], recording=nights, path=str(raw_dir), base_url=url, on_missing="warn")
        except (ValueError, OSError, requests.RequestException) as exc:
            raise DownloadError(f"{NAME}: download of Sleep-EDF subject {subject} nights {nights} from {url}/ failed: "
                                f"{exc} (mne.datasets.sleep_physionet.age.fetch_data; a mirror is set with "
                                f"REPROZOO_SLEEP_PHYSIONET_URL)") from exc
    records = []
    for psg, hyp in pairs:
        m = re.match(r"SC4(\d\d)(\d)", Path(psg).name)
        records.append({"psg": str(Path(psg).relative_to(raw_dir)), "hypnogram": str(Path(hyp).relative_to(raw_dir)),
                        "subject": f"SC4{m[1]}", "night": int(m[2])})
    common.write_index(raw_dir, records)
    return {"version": "sleep-edfx-1.0.0 (sleep-cassette)", "url": url,
            "fetcher": "mne.datasets.sleep_physionet.age.fetch_data", "license": "ODC-By 1.0 (PhysioNet)",
            "citation": "Kemp et al. 2000, IEEE TBME 47(9):1185; Goldberger et al. 2000, Circulation 101(23)"}


def scan_folder(folder: Path) -> list[dict]:
    psgs = sorted(p for p in folder.rglob("*") if p.is_file() and re.search(r"-PSG\.edf$", p.name, re.I))
    hyps = {p.name[:7]: p for p in folder.rglob("*") if p.is_file() and re.search(r"-Hypnogram\.edf$", p.name, re.I)}
    records = []
    for p in psgs:
        h = hyps.get(p.name[:7])
        if h is None:
            continue
        m = re.match(r"(S[CT]\d)(\d\d)(\d)", p.name)
        subject, night = (f"{m[1]}{m[2]}", int(m[3])) if m else (p.name[:7], 1)
        records.append({"psg": str(p.resolve()), "hypnogram": str(h.resolve()), "subject": subject, "night": night})
    return records


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    return common.acquire_by_source(
        NAME, source, raw_dir, simulate=lambda d: simulate(d, params, seed),
        fetch_remote=lambda d: fetch_remote(d, params), folder_reader=scan_folder, path=path,
        empty_hint="*-PSG.edf / *-Hypnogram.edf pairs, Sleep-EDF naming, e.g. SC4001E0-PSG.edf + "
                   "SC4001EC-Hypnogram.edf",
        files_of=lambda r: [Path(r["psg"]), Path(r["hypnogram"])])


# --- preprocess ------------------------------------------------------------------------------

def _channel_types(names: list[str]) -> dict[str, str]:
    types = {}
    for c in names:
        low = c.lower()
        types[c] = ("resp" if low.startswith("resp") else "eog" if low.startswith("eog") else
                    "emg" if low.startswith("emg") else "eeg" if low.startswith("eeg") else "misc")
    return types


def read_pair(psg: Path, hyp: Path, params: dict):
    mne = common.quiet_mne()
    raw = mne.io.read_raw_edf(psg, preload=True)
    raw.set_channel_types(_channel_types(raw.ch_names))
    raw.rename_channels({c: re.sub(r"^EEG\s+", "", c) for c in raw.ch_names if c.startswith("EEG ")})
    annot = mne.read_annotations(hyp)
    raw.set_annotations(annot, emit_warning=False)
    margin = params.get("wake_margin_min", 30)
    if margin is not None:
        sleep = [i for i, d in enumerate(raw.annotations.description) if ANNOT_TO_STAGE.get(d) not in (None, "W")]
        if sleep:
            a = raw.annotations
            start = max(0.0, a.onset[sleep[0]] - 60 * margin)
            stop = a.onset[sleep[-1]] + a.duration[sleep[-1]] + 60 * margin
            on = np.maximum(a.onset, start)
            off = np.minimum(a.onset + a.duration, stop)
            keep = off > on  # clip, keeping the 30-s grid (start is on it when the margin is whole 30 s)
            raw.set_annotations(mne.Annotations(on[keep], (off - on)[keep], a.description[keep],
                                                orig_time=a.orig_time), emit_warning=False)
    return raw


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    mne = common.quiet_mne()
    index = common.read_index(raw_dir)
    sfreq = float(params.get("sfreq", 64.0))
    l_freq, h_freq = params.get("l_freq", 0.3), params.get("h_freq", 30.0)
    wanted = params.get("channels", "all")
    Xs, Rs, rows, ch_names, any_resp = [], [], [], None, False
    for rec in index["records"]:
        raw = read_pair(common.resolve(raw_dir, rec["psg"]), common.resolve(raw_dir, rec["hypnogram"]), params)
        eeg = [c for c, t in zip(raw.ch_names, raw.get_channel_types()) if t == "eeg"]
        if wanted != "all":
            missing = [c for c in wanted if c not in eeg]
            if missing:
                raise DatasetError(f"{rec['psg']}: EEG channels {missing} not found (have {eeg})")
            eeg = list(wanted)
        resp_ch = [c for c, t in zip(raw.ch_names, raw.get_channel_types()) if t == "resp"]
        resp_raw = None
        if resp_ch:
            resp_raw = mne.io.RawArray(raw.get_data(picks=resp_ch[:1]),
                                       mne.create_info(["resp"], raw.info["sfreq"], "misc"))
            resp_raw.filter(0.05, 1.0, picks="all", fir_design="firwin", verbose="ERROR")
            if abs(resp_raw.info["sfreq"] - sfreq) > 1e-9:
                resp_raw.resample(sfreq, verbose="ERROR")
        raw.pick(eeg)
        common.set_montage(raw)
        common.filter_resample(raw, l_freq, h_freq, sfreq)
        descs = sorted({d for d in raw.annotations.description if d in ANNOT_TO_STAGE})
        if not descs:
            continue
        event_id = {d: i + 1 for i, d in enumerate(descs)}
        events, _ = mne.events_from_annotations(raw, event_id=event_id, chunk_duration=EPOCH_S)
        kw = dict(event_id=event_id, tmin=0.0, tmax=EPOCH_S - 1.0 / sfreq, baseline=None, preload=True,
                  reject_by_annotation=False, on_missing="ignore")
        ep = mne.Epochs(raw, events, **kw)
        X = ep.get_data(copy=False) * 1e6
        if resp_raw is not None:
            rep = mne.Epochs(resp_raw, events, picks="all", **kw)
            if not np.array_equal(rep.selection, ep.selection):
                raise DatasetError(f"{rec['psg']}: respiration and EEG epochs disagree")
            R = rep.get_data(copy=False)[:, 0] * 1e6
            any_resp = True
        else:
            R = np.full((len(X), X.shape[-1]), np.nan)
        est = common.resp_rate_bpm(R, sfreq)
        truth = rec.get("resp_rate_true")
        inv = {v: k for k, v in event_id.items()}
        for k, ev in enumerate(ep.events):
            onset = (ev[0] - raw.first_samp) / sfreq
            j = int(round(onset / EPOCH_S))
            stage = ANNOT_TO_STAGE[inv[ev[2]]]
            rows.append({"subject": rec["subject"], "recording": Path(rec["psg"]).name.split("-")[0],
                         "night": int(rec.get("night", 1)), "epoch_in_recording": k, "onset_s": onset,
                         "label": stage, "stage": stage, "resp_rate_bpm": float(est[k]),
                         "resp_rate_true": float(truth[j]) if truth and j < len(truth) else np.nan,
                         "resp_std": float(np.std(R[k])) if np.isfinite(R[k]).all() else np.nan})
        if ch_names is None:
            ch_names = ep.ch_names
        elif ep.ch_names != ch_names:
            raise DatasetError(f"{rec['psg']}: EEG channels {ep.ch_names} differ from the first recording's {ch_names}")
        Xs.append(X)
        Rs.append(R)
    X = np.concatenate(Xs) if Xs else np.zeros((0, 0, 0), np.float32)
    info = common.write_outputs(Path(out_dir), X, rows, sfreq, ch_names or [], STAGES,
                                seed=int(params.get("split_seed", 0)), resp=np.concatenate(Rs) if any_resp else None,
                                subjects=index.get("truth"),
                                meta={"dataset": NAME, "epoch_s": EPOCH_S, "band_hz": [l_freq, h_freq],
                                      "resp_band_hz": [0.05, 1.0], "stage_map": ANNOT_TO_STAGE})
    info["sizes"]["preprocessing"] = {"l_freq": l_freq, "h_freq": h_freq, "sfreq": sfreq, "epoch_s": EPOCH_S,
                                      "wake_margin_min": params.get("wake_margin_min", 30),
                                      "filter": "mne FIR firwin, zero-phase", "respiration": any_resp}
    return info


# --- preview and load ------------------------------------------------------------------------

def preview(out_dir: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = load(out_dir)
    ep = d.epochs
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    ax = axes[0, 0]
    first = ep[ep["subject_idx"] == 0]
    ax.step(np.arange(len(first)) * EPOCH_S / 60, first["label_id"], where="post")
    ax.set_yticks(range(len(STAGES)), STAGES)
    ax.invert_yaxis()
    ax.set_xlabel("minutes")
    ax.set_title(f"hypnogram, subject {first['subject'].iloc[0]}")
    ax = axes[0, 1]
    ch = next((c for c in ("O1", "O2", "Pz-Oz") if c in d.ch_names), d.ch_names[0])
    i = d.ch_names.index(ch)
    for sid, stage in enumerate(STAGES):
        sel = (ep["label"] == stage).to_numpy()
        if sel.any():
            f, p = common.psd(d.X[sel, i], d.sfreq, fmax=30)
            ax.semilogy(f, p.mean(axis=0), label=f"{stage} (n={sel.sum()})")
    ax.set_xlabel("Hz")
    ax.set_ylabel("uV^2/Hz")
    ax.set_title(f"{ch}: power by stage")
    ax.legend(fontsize=7)
    ax = axes[1, 0]
    ch2 = next((c for c in ("Cz", "Fpz-Cz") if c in d.ch_names), d.ch_names[0])
    i2 = d.ch_names.index(ch2)
    n10 = int(10 * d.sfreq)
    t = np.arange(n10) / d.sfreq
    for k, stage in enumerate(STAGES):
        sel = np.flatnonzero((ep["label"] == stage).to_numpy())
        if len(sel):
            ax.plot(t, d.X[sel[len(sel) // 2], i2, :n10] - 150 * k, lw=0.6)
            if d.resp is not None:
                r = d.resp[sel[len(sel) // 2], :n10]
                ax.plot(t, 40 * r / (np.abs(r).max() + 1e-9) - 150 * k - 60, lw=0.6, color="0.5")
    ax.set_yticks([-150 * k for k in range(len(STAGES))], STAGES)
    ax.set_xlabel("s")
    ax.set_title(f"10 s of each stage at {ch2} (grey: respiration, rescaled)")
    ax = axes[1, 1]
    if d.resp is not None and ep["resp_rate_bpm"].notna().any():
        for k, stage in enumerate(STAGES):
            v = ep.loc[ep["label"] == stage, "resp_rate_bpm"].dropna()
            ax.scatter(np.full(len(v), k) + np.random.default_rng(k).uniform(-0.2, 0.2, len(v)), v, s=6)
        ax.set_xticks(range(len(STAGES)), STAGES)
        ax.set_ylabel("breaths / min (estimated)")
        ax.set_title("respiration rate by stage")
    else:
        ax.set_visible(False)
    common.save_preview(fig, png, f"{NAME}: {len(d.X)} epochs of 30 s, {ep['subject'].nunique()} subjects, "
                                  f"{len(d.ch_names)} ch, {d.sfreq:g} Hz")


def load(out_dir: Path | str) -> EEGData:
    return common.load(out_dir)
