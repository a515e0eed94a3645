"""Motor imagery EEG (left hand / right hand / rest).

Sources
* offline: simulated with an mne forward model (see :mod:`.simulate`). Mu (8-13 Hz) and beta
  (18-25 Hz) rhythms at dipoles under C3 and C4 (hand areas), occipital alpha, frontal theta,
  pink background and sensor noise. Imagining one hand desynchronises (ERD) the mu and beta
  rhythms of the contralateral hemisphere (right hand: under C3; left hand: under C4), with a small
  ipsilateral synchronisation; rest changes nothing. Subject-specific frequencies, amplitudes,
  ERD depth and head geometry (jittered source positions/orientations). Written as PhysioNet
  EEGMMIDB-format EDF+ files (``S001/S001R04.edf``, 160 Hz, channel labels like ``C3..``,
  annotations T0 = rest, T1 = left, T2 = right), so all sources share one reader.
* remote: PhysioNet EEG Motor Movement/Imagery (EEGMMIDB) through ``mne.datasets.eegbci.load_data``
  (pooch, mne's pinned SHA-256 registry). The base URL comes from ``params["base_url"]``, else the
  environment variable ``REPROZOO_EEGBCI_URL``, else mne's default; a mirror must keep PhysioNet's
  layout ``.../files/eegmmidb/1.0.0/S001/S001R04.edf`` (mne checks the URL against it).
* path: a user folder of EDF/BDF/GDF files (``data.paths.eeg_motor_imagery``): EEGMMIDB layout, or
  any recordings whose annotations are named in ``event_map``.

Preprocessing (mne): pick channels, template montage, FIR band-pass, resample, epoch each cue
(``tmin``, ``epoch_s``), microvolts.
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
from .simulate import TEN_TWENTY, Planted, head_model, narrowband, sensors, smooth

NAME = "eeg_motor_imagery"
LABEL_ORDER = ["rest", "left", "right", "fists", "feet"]
# EEGMMIDB runs: 3/7/11 executed and 4/8/12 imagined left vs right fist; 5/9/13 and 6/10/14 fists vs feet
LR_RUNS = {3, 4, 7, 8, 11, 12}
FF_RUNS = {5, 6, 9, 10, 13, 14}
SIM_SFREQ = 160.0
TASK_S, REST_S = 4.1, 4.2  # EEGMMIDB cue durations

PLANTED = [Planted("mu_left", "C3"), Planted("mu_right", "C4"),
           Planted("alpha_left", "O1", depth=0.7), Planted("alpha_right", "O2", depth=0.7),
           Planted("theta_frontal", "Fz", depth=0.6)]


def run_labels(run: int | None, event_map: dict | None = None) -> dict[str, str]:
    if event_map:
        return dict(event_map)
    if run in FF_RUNS:
        return {"T0": "rest", "T1": "fists", "T2": "feet"}
    return {"T0": "rest", "T1": "left", "T2": "right"}


def eegmmidb_label(ch: str) -> str:
    """EEGMMIDB spelling: the name padded with dots to 4 characters ("C3.." "Fp1." "Fpz.")."""
    return ch.ljust(4, ".") if len(ch) < 4 else ch


# --- simulation ------------------------------------------------------------------------------

def subject_params(rng: np.random.Generator) -> dict:
    return {"f_mu": rng.uniform(9.0, 12.5), "f_beta": rng.uniform(18.0, 24.0), "mu_uv": rng.uniform(8.0, 14.0),
            "beta_ratio": rng.uniform(0.3, 0.5), "erd": rng.uniform(0.45, 0.75), "ers": rng.uniform(0.0, 0.15),
            "f_alpha": rng.uniform(8.5, 11.5), "alpha_uv": rng.uniform(5.0, 12.0), "theta_uv": rng.uniform(2.0, 4.0),
            "background_uv": rng.uniform(3.0, 6.0), "white_uv": 1.0}


def simulate_run(head, subject: int, sp: dict, n_trials: int, rng: np.random.Generator, sfreq: float = SIM_SFREQ):
    """One EEGMMIDB-like run: T0 (rest) before every cue, cues left/right balanced and shuffled.
    Returns (data uV (n_ch, n), annotations [(onset, duration, code)])."""
    cues = np.array(["T1", "T2"] * (n_trials // 2) + ["T1"] * (n_trials % 2))
    rng.shuffle(cues)
    ann, t = [], 0.0
    for c in cues:
        ann.append((round(t, 4), REST_S, "T0"))
        t += REST_S
        ann.append((round(t, 4), TASK_S, str(c)))
        t += TASK_S
    ann.append((round(t, 4), REST_S, "T0"))
    t += REST_S
    n = int(np.ceil(t) * sfreq)  # whole 1-s EDF records: no zero padding at the end of the file
    # task envelopes: ERD starts ~0.3 s after the cue and ramps over ~0.5 s; depth varies per trial
    env = {"left": np.zeros(n), "right": np.zeros(n)}
    for onset, dur, code in ann:
        if code == "T0":
            continue
        a, b = int((onset + 0.3) * sfreq), int((onset + dur) * sfreq)
        env["left" if code == "T1" else "right"][a:b] = np.clip(rng.uniform(0.7, 1.3), 0, 1.5)
    env = {k: smooth(v, sfreq, 0.5) for k, v in env.items()}
    erd, ers = sp["erd"], sp["ers"]
    # right hand (T2) desynchronises the left hemisphere (C3) and vice versa
    gain_left_hemi = np.clip(1 - erd * env["right"] + ers * env["left"], 0.05, None)
    gain_right_hemi = np.clip(1 - erd * env["left"] + ers * env["right"], 0.05, None)
    src = {}
    for hemi, gain in (("left", gain_left_hemi), ("right", gain_right_hemi)):
        mu = narrowband(n, sfreq, sp["f_mu"], 0.8, rng)
        beta = narrowband(n, sfreq, sp["f_beta"], 2.0, rng)
        src[f"mu_{hemi}"] = gain * (sp["mu_uv"] * mu + sp["beta_ratio"] * sp["mu_uv"] * beta)
        src[f"alpha_{hemi}"] = sp["alpha_uv"] * narrowband(n, sfreq, sp["f_alpha"], 0.7, rng)
    src["theta_frontal"] = sp["theta_uv"] * narrowband(n, sfreq, 6.0, 1.0, rng)
    x = sensors(head, subject, src, n, sfreq, rng, sp["background_uv"], sp["white_uv"])
    return x, ann


def simulate(raw_dir: Path, params: dict, seed: int) -> dict:
    from .edf import Signal, write_edf

    ch = params.get("channels")
    ch_names = list(ch) if isinstance(ch, (list, tuple)) else list(TEN_TWENTY)  # "all": the 19 10-20 sites
    n_subjects = int(params["subjects"])
    runs = list(params.get("runs", [4]))
    rng = np.random.default_rng([seed, 0])
    head = head_model(ch_names, PLANTED, n_subjects, rng, grid_mm=float(params.get("grid_mm", 25.0)))
    base = Path("MNE-eegbci-data/files/eegmmidb/1.0.0")
    records, truth = [], []
    for s in range(n_subjects):
        srng = np.random.default_rng([seed, 1, s])
        sp = subject_params(srng)
        truth.append({"subject": f"S{s + 1:03d}", **{k: float(v) for k, v in sp.items()},
                      **{f"pos_{k}_m": v.tolist() for k, v in head.source_pos[s].items()}})
        for run in runs:
            x, ann = simulate_run(head, s, sp, int(params["trials_per_run"]), np.random.default_rng([seed, 2, s, run]))
            rel = base / f"S{s + 1:03d}" / f"S{s + 1:03d}R{run:02d}.edf"
            sigs = [Signal(eegmmidb_label(c), x[i], SIM_SFREQ, "uV", -1000.0, 1000.0)
                    for i, c in enumerate(ch_names)]
            write_edf(raw_dir / rel, sigs, ann, record_duration=1.0)
            records.append({"file": str(rel), "subject": f"S{s + 1:03d}", "run": run})
    common.write_index(raw_dir, records, truth=truth, head=head.sphere)
    return {"version": "simulator-1", "generator": "reprozoo.data.eeg.motor.simulate",
            "head_model": {"kind": "3-shell sphere fitted to the template montage", **head.sphere,
                           "montage": "colin27_1005", "planted": [p.anchor for p in PLANTED]}}


# --- acquire ---------------------------------------------------------------------------------

def _base_url(params: dict) -> str:
    from mne.datasets import eegbci

    return params.get("base_url") or os.environ.get("REPROZOO_EEGBCI_URL") or eegbci.eegbci.EEGMI_URL


def fetch_remote(raw_dir: Path, params: dict) -> dict:
    """EEGMMIDB through mne's own fetcher (pooch, checksums pinned in mne)."""
    import requests

    common.quiet_mne()
    from mne.datasets import eegbci

    url = _base_url(params)
    subjects = [int(s) for s in params["remote_subjects"]]
    runs = [int(r) for r in params.get("runs", [4, 8, 12])]
    paths = []
    for subject in subjects:  # one file at a time, so that an error names the file's URL
        for run in runs:
            name = f"S{subject:03d}/S{subject:03d}R{run:02d}.edf"
            try:
                paths += eegbci.load_data(subject, run, path=str(raw_dir), update_path=False, base_url=url)
            except (ValueError, OSError, requests.RequestException) as exc:
                raise DownloadError(f"{NAME}: download of {url.rstrip('/')}/{name} failed: {exc} "
                                    "(mne.datasets.eegbci.load_data; a mirror is set with REPROZOO_EEGBCI_URL)"
                                    ) from exc
    records = []
    for p in paths:
        m = re.search(r"S(\d{3})R(\d{2})", Path(p).name)
        records.append({"file": str(Path(p).relative_to(raw_dir)), "subject": f"S{int(m[1]):03d}", "run": int(m[2])})
    common.write_index(raw_dir, records)
    return {"version": "eegmmidb-1.0.0", "url": url, "fetcher": "mne.datasets.eegbci.load_data",
            "license": "ODC-By 1.0 (PhysioNet)",
            "citation": "Schalk et al. 2004, IEEE TBME 51(6):1034; Goldberger et al. 2000, Circulation 101(23)"}


def scan_folder(path: Path) -> list[dict]:
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in {".edf", ".bdf", ".gdf"})
    records = []
    for f in files:
        m = re.search(r"S(\d{3})R(\d{2})", f.name)
        b = re.search(r"sub-([A-Za-z0-9]+)", str(f))
        if m:
            subject, run = f"S{int(m[1]):03d}", int(m[2])
        else:
            subject = f"sub-{b[1]}" if b else (f.parent.name if f.parent != path else f.stem)
            r = re.search(r"run-(\d+)", f.name)
            run = int(r[1]) if r else None
        records.append({"file": str(f.resolve()), "subject": subject, "run": run})
    return records


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    return common.acquire_by_source(
        NAME, source, raw_dir, simulate=lambda d: simulate(d, params, seed),
        fetch_remote=lambda d: fetch_remote(d, params), folder_reader=scan_folder, path=path,
        empty_hint="EDF/BDF/GDF files, e.g. S001/S001R04.edf as in PhysioNet EEGMMIDB")


# --- preprocess ------------------------------------------------------------------------------

def canonical_names(raw) -> None:
    """EEGMMIDB's ``C3..``/``Fc5.``/``EEG C3`` spellings -> template names (``C3``, ``FC5``)."""
    from .simulate import MONTAGE

    mne = common.quiet_mne()
    known = {c.lower(): c for c in mne.channels.make_standard_montage(MONTAGE).ch_names}
    rename = {}
    for ch in raw.ch_names:
        core = re.sub(r"^(EEG|eeg)[\s_-]+", "", ch).strip().strip(".")
        new = known.get(core.lower())
        if new and new != ch and new not in raw.ch_names:
            rename[ch] = new
    raw.rename_channels(rename)


def read_recording(file: Path, params: dict):
    mne = common.quiet_mne()
    raw = mne.io.read_raw(file, preload=True)
    canonical_names(raw)
    wanted = params.get("channels", TEN_TWENTY)
    if wanted == "all":
        picks = [c for c, t in zip(raw.ch_names, raw.get_channel_types()) if t == "eeg"]
    else:
        missing = [c for c in wanted if c not in raw.ch_names]
        if missing:
            raise DatasetError(f"{file}: channels {missing} not found (have {raw.ch_names[:8]}...); "
                               f"set 'channels' in the dataset parameters")
        picks = list(wanted)
    raw.pick(picks)
    raw.set_channel_types({c: "eeg" for c in picks})
    common.set_montage(raw)
    return raw


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    mne = common.quiet_mne()
    index = common.read_index(raw_dir)
    sfreq = float(params.get("sfreq", 128.0))
    tmin, epoch_s = float(params.get("tmin", 0.0)), float(params.get("epoch_s", 4.0))
    event_map = params.get("event_map")
    Xs, rows, ch_names, present = [], [], None, set()
    for rec in index["records"]:
        raw = read_recording(common.resolve(raw_dir, rec["file"]), params)
        common.filter_resample(raw, params.get("l_freq", 1.0), params.get("h_freq", 40.0), sfreq)
        mapping = run_labels(rec.get("run"), event_map)
        descs = sorted({d for d in raw.annotations.description if d in mapping})
        if not descs:
            continue
        event_id = {d: i + 1 for i, d in enumerate(descs)}
        events, _ = mne.events_from_annotations(raw, event_id=event_id)
        ep = mne.Epochs(raw, events, event_id=event_id, tmin=tmin, tmax=tmin + epoch_s - 1.0 / sfreq,
                        baseline=None, preload=True, reject_by_annotation=False, on_missing="ignore")
        inv = {v: k for k, v in event_id.items()}
        for k, ev in enumerate(ep.events):
            label = mapping[inv[ev[2]]]
            present.add(label)
            rows.append({"subject": rec["subject"], "recording": Path(rec["file"]).stem,
                         "run": rec.get("run") if rec.get("run") is not None else -1,
                         "epoch_in_recording": k, "onset_s": (ev[0] - raw.first_samp) / sfreq, "label": label,
                         "cue": inv[ev[2]]})
        Xs.append(ep.get_data(copy=False) * 1e6)
        ch_names = ch_names or ep.ch_names
        if ep.ch_names != ch_names:
            raise DatasetError(f"{rec['file']}: channel order differs from the first recording")
    labels = [l for l in LABEL_ORDER if l in present] + sorted(present - set(LABEL_ORDER))
    X = np.concatenate(Xs) if Xs else np.zeros((0, 0, 0), np.float32)
    truth = index.get("truth")
    info = common.write_outputs(Path(out_dir), X, rows, sfreq, ch_names or [], labels,
                                seed=int(params.get("split_seed", 0)), subjects=truth,
                                meta={"dataset": NAME, "tmin": tmin, "band_hz": [params.get("l_freq", 1.0),
                                                                                 params.get("h_freq", 40.0)]})
    info["sizes"]["preprocessing"] = {"l_freq": params.get("l_freq", 1.0), "h_freq": params.get("h_freq", 40.0),
                                      "sfreq": sfreq, "tmin": tmin, "epoch_s": epoch_s,
                                      "filter": "mne FIR firwin, zero-phase"}
    return info


# --- preview and load ------------------------------------------------------------------------

def preview(out_dir: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = load(out_dir)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, ch in zip(axes[:2], ("C3", "C4")):
        if ch not in d.ch_names:
            ax.set_visible(False)
            continue
        i = d.ch_names.index(ch)
        for label in d.epochs["label"].unique():
            sel = (d.epochs["label"] == label).to_numpy()
            f, p = common.psd(d.X[sel, i], d.sfreq, fmax=40)
            ax.semilogy(f, p.mean(axis=0), label=f"{label} (n={sel.sum()})")
        ax.axvspan(8, 13, color="0.9", zorder=0)
        ax.set_xlabel("Hz")
        ax.set_ylabel("uV^2/Hz")
        ax.set_title(f"{ch}: power by class (grey: mu band)")
        ax.legend(fontsize=7)
    ax = axes[2]
    labels = d.epochs["label"].to_numpy()
    if {"rest", "right"} <= set(labels) and d.channels is not None and d.channels["x"].notna().any():
        mu = np.log10(common.band_power(d.X, d.sfreq, 8, 13))
        change = 10 * (mu[labels == "right"].mean(0) - mu[labels == "rest"].mean(0))
        lim = max(1e-3, np.abs(change).max())
        sc = ax.scatter(d.channels["x"], d.channels["y"], c=change, cmap="RdBu_r", vmin=-lim, vmax=lim, s=250)
        for _, r in d.channels.iterrows():
            ax.annotate(r["name"], (r["x"], r["y"]), ha="center", va="center", fontsize=6)
        fig.colorbar(sc, ax=ax, label="dB")
        ax.set_title("mu power, right hand vs rest (ERD < 0)")
        ax.set_aspect("equal")
        ax.axis("off")
    else:
        ax.set_visible(False)
    common.save_preview(fig, png, f"{NAME}: {len(d.X)} epochs, {d.epochs['subject'].nunique()} subjects, "
                                  f"{len(d.ch_names)} ch, {d.sfreq:g} Hz")


def load(out_dir: Path | str) -> EEGData:
    return common.load(out_dir)
