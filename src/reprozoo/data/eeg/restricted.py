"""Restricted EEG datasets read from a user folder: BIDS, DEAP, SEED.

These datasets cannot be downloaded without an agreement, so the ``path`` source reads them from
``data.paths.eeg_restricted`` (``format`` auto-detected, or set in the dataset parameters):

* ``bids``: an EEG-BIDS folder: ``sub-*/[ses-*/]eeg/*_eeg.{edf,bdf,vhdr,set,fif,gdf}`` with the
  sibling ``*_events.tsv`` (onset, duration, trial_type) and optionally ``*_channels.tsv`` (type
  column picks the EEG channels). Epochs start at each event (``tmin``, ``epoch_s``), labelled by
  ``trial_type``.
* ``deap``: DEAP's ``data_preprocessed_python/sNN.dat`` (pickles: ``data`` 40 trials x 40 channels
  x 8064 samples at 128 Hz, the first 32 EEG; ``labels`` 40 x 4 ratings valence, arousal,
  dominance, liking on 1-9). The 3-s pre-trial baseline is dropped, each trial cut into
  ``epoch_s`` windows; the label is ``label_dim`` (valence) above/below ``label_threshold`` (5).
* ``seed``: SEED's ``Preprocessed_EEG`` folder (``label.mat`` with the 15 film labels -1/0/1, and
  one ``<subject>_<date>.mat`` per session holding ``<initials>_eeg1 .. _eeg15``, 62 channels x
  samples at 200 Hz); each trial is cropped to ``trial_seconds`` and cut into ``epoch_s`` windows,
  labelled negative/neutral/positive.

The ``offline`` source writes a simulated stand-in in BIDS layout (the motor imagery simulator,
one run per subject) and reads it back through the BIDS reader, so the pipeline runs without the
restricted data.
"""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np

from ..registry import DatasetError
from . import common, motor
from .common import EEGData

NAME = "eeg_restricted"
BIDS_EXT = (".edf", ".bdf", ".vhdr", ".set", ".fif", ".gdf")
# DEAP, Geneva order (data_preprocessed_python): channels 1-32 are EEG
DEAP_CHANNELS = ["Fp1", "AF3", "F3", "F7", "FC5", "FC1", "C3", "T7", "CP5", "CP1", "P3", "P7", "PO3", "O1", "Oz",
                 "Pz", "Fp2", "AF4", "Fz", "F4", "F8", "FC6", "FC2", "Cz", "C4", "T8", "CP6", "CP2", "P4", "P8",
                 "PO4", "O2"]
DEAP_SFREQ, DEAP_BASELINE_S = 128.0, 3.0
DEAP_RATINGS = ["valence", "arousal", "dominance", "liking"]
# SEED (ESI NeuroScan 62-channel order, as in SEED's channel-order file)
SEED_CHANNELS = ["FP1", "FPZ", "FP2", "AF3", "AF4", "F7", "F5", "F3", "F1", "FZ", "F2", "F4", "F6", "F8", "FT7", "FC5",
                 "FC3", "FC1", "FCZ", "FC2", "FC4", "FC6", "FT8", "T7", "C5", "C3", "C1", "CZ", "C2", "C4", "C6", "T8",
                 "TP7", "CP5", "CP3", "CP1", "CPZ", "CP2", "CP4", "CP6", "TP8", "P7", "P5", "P3", "P1", "PZ", "P2",
                 "P4", "P6", "P8", "PO7", "PO5", "PO3", "POZ", "PO4", "PO6", "PO8", "CB1", "O1", "OZ", "O2", "CB2"]
SEED_SFREQ = 200.0
SEED_LABELS = {-1: "negative", 0: "neutral", 1: "positive"}


def _error(path, what: str) -> DatasetError:
    return DatasetError(f"dataset '{NAME}': config key 'data.paths.{NAME}' = '{path}': {what}")


# --- formats ---------------------------------------------------------------------------------

def detect(folder: Path) -> str:
    if (folder / "dataset_description.json").exists() or any(folder.glob("sub-*")):
        return "bids"
    if any(folder.rglob("s[0-9][0-9].dat")):
        return "deap"
    if any(folder.rglob("label.mat")):
        return "seed"
    raise _error(folder, "not a recognised layout (expected a BIDS folder with dataset_description.json and "
                         "sub-*/, DEAP's sNN.dat files, or SEED's Preprocessed_EEG with label.mat); set "
                         "'format' in the dataset parameters if detection fails")


def _bids_entities(name: str) -> dict:
    return dict(re.findall(r"([a-zA-Z]+)-([a-zA-Z0-9]+)", name))


def scan_bids(folder: Path) -> list[dict]:
    records = []
    for f in sorted(folder.rglob("*_eeg.*")):
        if f.suffix.lower() not in BIDS_EXT or f.parent.name != "eeg":
            continue
        stem = f.name[: -len("_eeg" + f.suffix)]
        events = f.with_name(stem + "_events.tsv")
        if not events.exists():
            continue
        ent = _bids_entities(stem)
        channels = f.with_name(stem + "_channels.tsv")
        records.append({"file": str(f.resolve()), "events": str(events.resolve()),
                        "channels": str(channels.resolve()) if channels.exists() else None,
                        "subject": f"sub-{ent.get('sub', '?')}", "session": ent.get("ses"),
                        "task": ent.get("task"), "run": int(ent["run"]) if ent.get("run", "").isdigit() else None})
    return records


def scan(folder: Path, fmt: str) -> list[dict]:
    if fmt == "bids":
        records = scan_bids(folder)
        hint = "no sub-*/eeg/*_eeg.<edf|bdf|vhdr|set|fif|gdf> with a sibling *_events.tsv"
    elif fmt == "deap":
        records = [{"file": str(f.resolve()), "subject": f.stem} for f in sorted(folder.rglob("s[0-9][0-9].dat"))]
        hint = "no DEAP sNN.dat files"
    elif fmt == "seed":
        labels = sorted(folder.rglob("label.mat"))
        mats = sorted(f for f in folder.rglob("*.mat") if re.match(r"\d+_\d+\.mat$", f.name))
        records = [{"file": str(f.resolve()), "labels": str(labels[0].resolve()) if labels else None,
                    "subject": f"seed{int(f.name.split('_')[0]):02d}", "session": f.stem.split("_")[1]} for f in mats]
        if records and not labels:
            raise _error(folder, "SEED session files found but no label.mat")
        hint = "no SEED <subject>_<date>.mat session files"
    else:
        raise DatasetError(f"dataset '{NAME}': unknown format '{fmt}' (bids, deap, seed)")
    if not records:
        raise _error(folder, f"{hint} (format '{fmt}')")
    return records


# --- offline stand-in ------------------------------------------------------------------------

def simulate_bids(raw_dir: Path, params: dict, seed: int) -> dict:
    """The motor imagery simulator, written as an EEG-BIDS dataset."""
    import tempfile

    root = raw_dir / "bids"
    with tempfile.TemporaryDirectory(dir=raw_dir) as tmp:
        info = motor.simulate(Path(tmp), {**params, "runs": [4]}, seed)
        index = common.read_index(Path(tmp))
        mne = common.quiet_mne()
        (root).mkdir(parents=True, exist_ok=True)
        (root / "dataset_description.json").write_text(json.dumps(
            {"Name": "reprozoo simulated motor imagery (stand-in for a restricted dataset)", "BIDSVersion": "1.9.0",
             "DatasetType": "raw", "GeneratedBy": [{"Name": "reprozoo.data.eeg.motor.simulate"}]}, indent=2))
        subjects = []
        for k, rec in enumerate(index["records"]):
            sub = f"{k + 1:02d}"
            subjects.append(sub)
            eeg_dir = root / f"sub-{sub}" / "eeg"
            eeg_dir.mkdir(parents=True, exist_ok=True)
            stem = f"sub-{sub}_task-imagery_run-1"
            src = Path(tmp) / rec["file"]
            raw = mne.io.read_raw_edf(src)
            labels = motor.run_labels(4)
            a = raw.annotations
            rows = ["onset\tduration\ttrial_type\tvalue"]
            for on, du, de in zip(a.onset, a.duration, a.description):
                if de in labels:
                    rows.append(f"{on:.4f}\t{du:.4f}\t{labels[de]}\t{de}")
            (eeg_dir / f"{stem}_events.tsv").write_text("\n".join(rows) + "\n")
            chans = ["name\ttype\tunits"] + [f"{c}\tEEG\tuV" for c in raw.ch_names]
            (eeg_dir / f"{stem}_channels.tsv").write_text("\n".join(chans) + "\n")
            (eeg_dir / f"{stem}_eeg.json").write_text(json.dumps(
                {"TaskName": "imagery", "SamplingFrequency": raw.info["sfreq"], "EEGReference": "infinity (simulated)",
                 "PowerLineFrequency": 50, "SoftwareFilters": "n/a"}, indent=2))
            src.replace(eeg_dir / f"{stem}_eeg.edf")
        (root / "participants.tsv").write_text("participant_id\n" + "".join(f"sub-{s}\n" for s in subjects))
        truth = index.get("truth")
    records = [{**r, "file": str(Path(r["file"]).relative_to(raw_dir.resolve())),
                "events": str(Path(r["events"]).relative_to(raw_dir.resolve())),
                "channels": str(Path(r["channels"]).relative_to(raw_dir.resolve()))} for r in scan_bids(root)]
    common.write_index(raw_dir, records, format="bids", truth=truth)
    return {**info, "generator": "reprozoo.data.eeg.restricted.simulate_bids", "format": "bids"}


def acquire(source: str, params: dict, raw_dir: Path, seed: int, path: str | None = None) -> dict:
    raw_dir = Path(raw_dir)
    if source == "offline":
        return simulate_bids(raw_dir, params, seed)
    if source == "path":
        folder = common.user_folder(NAME, path)
        fmt = params.get("format", "auto")
        fmt = detect(folder) if fmt == "auto" else fmt
        records = scan(folder, fmt)
        common.write_index(raw_dir, records, format=fmt, folder=str(folder))
        files = sorted({Path(r[k]) for r in records for k in ("file", "events", "channels", "labels") if r.get(k)})
        return {"version": "user", "path": str(folder), "format": fmt, "user_files": common.hash_user_files(files)}
    raise DatasetError(f"dataset '{NAME}': source '{source}' not available (restricted data: 'path', or the "
                       f"simulated stand-in 'offline')")


# --- preprocess ------------------------------------------------------------------------------

def _read_tsv(path: Path):
    import pandas as pd

    return pd.read_csv(path, sep="\t", na_values=["n/a"])


def _bids_epochs(rec: dict, raw_dir: Path, params: dict):
    mne = common.quiet_mne()
    f = common.resolve(raw_dir, rec["file"])
    raw = mne.io.read_raw(f, preload=True)
    if rec.get("channels"):
        ch = _read_tsv(common.resolve(raw_dir, rec["channels"]))
        eeg = [n for n, t in zip(ch["name"], ch["type"].astype(str).str.upper()) if t == "EEG" and n in raw.ch_names]
    else:
        eeg = [c for c, t in zip(raw.ch_names, raw.get_channel_types()) if t == "eeg"]
    if not eeg:
        raise DatasetError(f"{f}: no EEG channels")
    raw.pick(eeg)
    raw.set_channel_types({c: "eeg" for c in eeg})
    motor.canonical_names(raw)
    wanted = params.get("channels", "all")
    if wanted != "all":
        missing = [c for c in wanted if c not in raw.ch_names]
        if missing:
            raise DatasetError(f"{f}: channels {missing} not found")
        raw.pick(list(wanted))
    common.set_montage(raw)
    ev = _read_tsv(common.resolve(raw_dir, rec["events"]))
    col = params.get("label_column", "trial_type")
    if col not in ev.columns:
        raise DatasetError(f"{rec['events']}: no '{col}' column (set 'label_column')")
    ev = ev.dropna(subset=["onset", col])
    raw.set_annotations(mne.Annotations(ev["onset"].to_numpy(float), ev["duration"].fillna(0).to_numpy(float),
                                        ev[col].astype(str).to_numpy(), orig_time=raw.annotations.orig_time))
    sfreq = float(params.get("sfreq", 128.0))
    common.filter_resample(raw, params.get("l_freq", 1.0), params.get("h_freq", 40.0), sfreq)
    descs = sorted(set(raw.annotations.description))
    event_id = {d: i + 1 for i, d in enumerate(descs)}
    events, _ = mne.events_from_annotations(raw, event_id=event_id)
    tmin, epoch_s = float(params.get("tmin", 0.0)), float(params.get("epoch_s", 4.0))
    ep = mne.Epochs(raw, events, event_id=event_id, tmin=tmin, tmax=tmin + epoch_s - 1.0 / sfreq, baseline=None,
                    preload=True, reject_by_annotation=False, on_missing="ignore")
    inv = {v: k for k, v in event_id.items()}
    rows = [{"subject": rec["subject"], "recording": Path(rec["file"]).name.split("_eeg")[0],
             "epoch_in_recording": k, "onset_s": (e[0] - raw.first_samp) / sfreq, "label": inv[e[2]]}
            for k, e in enumerate(ep.events)]
    return ep.get_data(copy=False) * 1e6, rows, ep.ch_names


def _windows(x: np.ndarray, sfreq_in: float, params: dict, start_s: float = 0.0, max_s: float | None = None):
    """Filter and resample one trial (channels x samples, uV) with mne, cut into epoch_s windows."""
    mne = common.quiet_mne()
    x = x[:, int(start_s * sfreq_in):]
    if max_s:
        x = x[:, : int(max_s * sfreq_in)]
    sfreq = float(params.get("sfreq", 128.0))
    x = mne.filter.filter_data(x.astype(np.float64), sfreq_in, params.get("l_freq", 1.0), params.get("h_freq", 40.0),
                               fir_design="firwin", verbose="ERROR")
    if abs(sfreq - sfreq_in) > 1e-9:
        x = mne.filter.resample(x, up=sfreq, down=sfreq_in, verbose="ERROR")
    n = int(round(float(params.get("epoch_s", 4.0)) * sfreq))
    k = x.shape[1] // n
    return x[:, : k * n].reshape(x.shape[0], k, n).transpose(1, 0, 2), sfreq


def _deap_epochs(rec: dict, raw_dir: Path, params: dict):
    f = common.resolve(raw_dir, rec["file"])
    try:
        with open(f, "rb") as fh:
            d = pickle.load(fh, encoding="latin1")
        data, ratings = np.asarray(d["data"]), np.asarray(d["labels"])
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a malformed user folder
        raise DatasetError(f"{f}: not a DEAP preprocessed-python file ({exc})") from exc
    if data.ndim != 3 or data.shape[1] < 32 or ratings.shape[0] != data.shape[0]:
        raise DatasetError(f"{f}: expected data (trials, >=32 channels, samples) and labels (trials, 4); "
                           f"got {data.shape} and {ratings.shape}")
    dim = params.get("label_dim", "valence")
    thr = float(params.get("label_threshold", 5.0))
    Xs, rows = [], []
    for t in range(data.shape[0]):
        w, sfreq = _windows(data[t, :32], DEAP_SFREQ, params, DEAP_BASELINE_S, params.get("trial_seconds"))
        Xs.append(w)
        r = dict(zip(DEAP_RATINGS, map(float, ratings[t, :4])))
        for k in range(len(w)):
            rows.append({"subject": rec["subject"], "recording": f"{rec['subject']}_trial{t + 1:02d}", "trial": t + 1,
                         "epoch_in_recording": k, "onset_s": k * params.get("epoch_s", 4.0),
                         "label": "high" if r[dim] > thr else "low", **r})
    return np.concatenate(Xs), rows, list(DEAP_CHANNELS)


def _seed_epochs(rec: dict, raw_dir: Path, params: dict):
    from scipy.io import loadmat

    f = common.resolve(raw_dir, rec["file"])
    try:
        labels = np.asarray(loadmat(common.resolve(raw_dir, rec["labels"]))["label"]).ravel().astype(int)
        mat = loadmat(f)
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(f"{f}: not a readable SEED .mat file ({exc})") from exc
    keys = sorted((k for k in mat if re.search(r"_eeg(\d+)$", k)), key=lambda k: int(re.search(r"(\d+)$", k)[1]))
    if not keys:
        raise DatasetError(f"{f}: no '<name>_eeg<k>' trial arrays (SEED Preprocessed_EEG layout)")
    Xs, rows = [], []
    for key in keys:
        t = int(re.search(r"(\d+)$", key)[1])
        x = np.asarray(mat[key], dtype=float)
        if x.shape[0] != len(SEED_CHANNELS):
            raise DatasetError(f"{f}: {key} has {x.shape[0]} channels, expected {len(SEED_CHANNELS)}")
        w, sfreq = _windows(x, SEED_SFREQ, params, 0.0, params.get("trial_seconds", 60.0))
        Xs.append(w)
        for k in range(len(w)):
            rows.append({"subject": rec["subject"], "recording": f"{Path(rec['file']).stem}_trial{t:02d}",
                         "session": rec.get("session"), "trial": t, "epoch_in_recording": k,
                         "onset_s": k * params.get("epoch_s", 4.0), "label": SEED_LABELS[int(labels[t - 1])]})
    names = [_canonical(c) for c in SEED_CHANNELS]
    return np.concatenate(Xs), rows, names


def _canonical(ch: str) -> str:
    from .simulate import MONTAGE

    mne = common.quiet_mne()
    known = {c.lower(): c for c in mne.channels.make_standard_montage(MONTAGE).ch_names}
    return known.get(ch.lower(), ch)


def preprocess(raw_dir: Path, out_dir: Path, params: dict) -> dict:
    index = common.read_index(raw_dir)
    fmt = index["format"]
    reader = {"bids": _bids_epochs, "deap": _deap_epochs, "seed": _seed_epochs}[fmt]
    Xs, rows, ch_names = [], [], None
    for rec in index["records"]:
        X, r, names = reader(rec, raw_dir, params)
        if ch_names is None:
            ch_names = names
        elif names != ch_names:
            raise DatasetError(f"{rec['file']}: channels differ from the first recording's")
        Xs.append(X)
        rows += r
    sfreq = float(params.get("sfreq", 128.0))
    present = sorted({r["label"] for r in rows})
    order = {"seed": ["negative", "neutral", "positive"], "deap": ["low", "high"]}.get(fmt, motor.LABEL_ORDER)
    labels = [l for l in order if l in present] + [l for l in present if l not in order]
    X = np.concatenate(Xs) if Xs else np.zeros((0, 0, 0), np.float32)
    info = common.write_outputs(Path(out_dir), X, rows, sfreq, ch_names or [], labels,
                                seed=int(params.get("split_seed", 0)), subjects=index.get("truth"),
                                meta={"dataset": NAME, "format": fmt})
    info["sizes"]["format"] = fmt
    info["sizes"]["preprocessing"] = {"l_freq": params.get("l_freq", 1.0), "h_freq": params.get("h_freq", 40.0),
                                      "sfreq": sfreq, "epoch_s": params.get("epoch_s", 4.0)}
    return info


def preview(out_dir: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = load(out_dir)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axes[0]
    n = min(len(d.ch_names), 8)
    t = d.times
    for i in range(n):
        ax.plot(t, d.X[0, i] - 60 * i, lw=0.6)
    ax.set_yticks([-60 * i for i in range(n)], d.ch_names[:n])
    ax.set_xlabel("s")
    ax.set_title(f"epoch 0 ({d.epochs['label'].iloc[0]}), first {n} channels")
    ax = axes[1]
    for label in d.epochs["label"].unique():
        sel = (d.epochs["label"] == label).to_numpy()
        f, p = common.psd(d.X[sel], d.sfreq, fmax=45)
        ax.semilogy(f, p.mean(axis=(0, 1)), label=f"{label} (n={sel.sum()})")
    ax.set_xlabel("Hz")
    ax.set_ylabel("uV^2/Hz")
    ax.set_title("power by label (mean over channels)")
    ax.legend(fontsize=7)
    common.save_preview(fig, png, f"{NAME} ({d.meta.get('format', '?')}): {len(d.X)} epochs, {d.epochs['subject'].nunique()} "
                 f"subjects, {len(d.ch_names)} ch, {d.sfreq:g} Hz")


def load(out_dir: Path | str) -> EEGData:
    return common.load(out_dir)
