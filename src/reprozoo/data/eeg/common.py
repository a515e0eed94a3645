"""What every EEG dataset shares: channel regions, mne preprocessing, the stored layout, ``load``.

Processed layout (``results/data/<dataset>/<scale>/``):

* ``X.npz``: ``X`` float32 (epochs x channels x times) in microvolts, ``sfreq``, ``ch_names``,
  ``times`` (s, from epoch onset), and ``resp`` (epochs x times) where a respiration channel exists;
* ``epochs.parquet``: one row per epoch: subject, subject_idx, recording, epoch_in_recording,
  onset_s, label, label_id, split (subject-wise train/val/test hint), fold (subject-wise k-fold),
  plus dataset-specific columns;
* ``channels.parquet``: name, region (frontal/central/parietal/occipital/temporal), type, x, y, z
  (template 10-05 positions in mne's head frame, metres; NaN where the name is not a 10-05 site);
* ``subjects.parquet`` (simulations only): the planted per-subject parameters (ground truth).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...io import atomic_path, write_json
from ..registry import DatasetError
from reprozoo.figures import save_figure

REGIONS = ("frontal", "central", "parietal", "occipital", "temporal")


def region_of(name: str) -> str:
    """10-20/10-10 region from an electrode name; a bipolar derivation ("Fpz-Cz") takes its first
    electrode's region."""
    ch = re.sub(r"^(EEG|eeg)\s+", "", name).split("-")[0].strip().upper()
    if ch.startswith(("FT", "TP", "T")) or ch in {"A1", "A2", "M1", "M2"}:
        return "temporal"
    if ch.startswith(("FP", "AF", "F")) and not ch.startswith("FC"):
        return "frontal"
    if ch.startswith(("FC", "C")) and not ch.startswith("CP") and not ch.startswith("CB"):
        return "central"
    if ch.startswith(("CP", "P")) and not ch.startswith("PO"):
        return "parietal"
    if ch.startswith(("PO", "O", "I", "CB")):
        return "occipital"
    return "other"


def regions_map(ch_names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in ch_names:
        out.setdefault(region_of(c), []).append(c)
    return out


@dataclass
class EEGData:
    """What methods consume: ``X`` (epochs x channels x times, uV), the epochs table, and channels."""
    X: np.ndarray
    epochs: "object"  # pandas.DataFrame
    sfreq: float
    ch_names: list[str]
    regions: dict[str, list[str]]
    times: np.ndarray
    channels: "object" = None  # pandas.DataFrame
    resp: np.ndarray | None = None  # epochs x times (respiration, arbitrary units) where recorded
    subjects: "object" = None  # pandas.DataFrame of planted parameters (simulations only)
    meta: dict = field(default_factory=dict)

    @property
    def labels(self) -> np.ndarray:
        return self.epochs["label_id"].to_numpy()


def load(out_dir: Path | str) -> EEGData:
    import pandas as pd

    out_dir = Path(out_dir)
    z = np.load(out_dir / "X.npz", allow_pickle=False)
    ch_names = [str(c) for c in z["ch_names"]]
    channels = pd.read_parquet(out_dir / "channels.parquet")
    subjects = pd.read_parquet(out_dir / "subjects.parquet") if (out_dir / "subjects.parquet").exists() else None
    meta = json.loads((out_dir / "meta.json").read_text()) if (out_dir / "meta.json").exists() else {}
    return EEGData(X=z["X"], epochs=pd.read_parquet(out_dir / "epochs.parquet"), sfreq=float(z["sfreq"]),
                   ch_names=ch_names, regions=regions_map(ch_names), times=z["times"], channels=channels,
                   resp=z["resp"] if "resp" in z.files else None, subjects=subjects, meta=meta)


# --- mne helpers -----------------------------------------------------------------------------

def quiet_mne():
    import mne

    mne.set_log_level("ERROR")
    return mne


def montage_positions(ch_names: list[str]) -> np.ndarray:
    """Template positions in mne's head frame (metres); a bipolar "A-B" takes A's; NaN if unknown."""
    from .simulate import MONTAGE, head_positions

    mne = quiet_mne()
    known = {c.lower(): c for c in mne.channels.make_standard_montage(MONTAGE).ch_names}
    names = [known.get(c.split("-")[0].strip().lower()) for c in ch_names]
    found = sorted({n for n in names if n})
    pos = dict(zip(found, head_positions(found))) if found else {}
    return np.array([pos[n] if n else np.full(3, np.nan) for n in names], dtype=float).reshape(len(ch_names), 3)


def set_montage(raw) -> None:
    from .simulate import MONTAGE

    mne = quiet_mne()
    raw.set_montage(mne.channels.make_standard_montage(MONTAGE), on_missing="ignore", match_case=False)


def filter_resample(raw, l_freq: float | None, h_freq: float | None, sfreq: float | None, picks="eeg"):
    """Zero-phase FIR band-pass (mne defaults), then polyphase-free FFT resampling (mne)."""
    if l_freq is not None or h_freq is not None:
        raw.filter(l_freq, h_freq, picks=picks, fir_design="firwin", verbose="ERROR")
    if sfreq and abs(raw.info["sfreq"] - sfreq) > 1e-9:
        raw.resample(sfreq, verbose="ERROR")
    return raw


def resp_rate_bpm(x: np.ndarray, sfreq: float, lo_hz: float = 0.08, hi_hz: float = 0.8) -> np.ndarray:
    """Breathing rate per row (breaths/min): the peak of a Hann-windowed, zero-padded periodogram."""
    x = np.atleast_2d(x)
    x = x - x.mean(axis=1, keepdims=True)
    n = x.shape[1]
    nfft = 1 << int(np.ceil(np.log2(n * 16)))
    spec = np.abs(np.fft.rfft(x * np.hanning(n)[None], n=nfft, axis=1)) ** 2
    freqs = np.fft.rfftfreq(nfft, 1.0 / sfreq)
    band = (freqs >= lo_hz) & (freqs <= hi_hz)
    out = freqs[band][np.argmax(spec[:, band], axis=1)] * 60.0
    out[~np.isfinite(x).all(axis=1) | (x.std(axis=1) == 0)] = np.nan
    return out


# --- tables ----------------------------------------------------------------------------------

def subject_splits(subjects: list[str], seed: int) -> tuple[dict[str, str], dict[str, int]]:
    """Subject-wise hints: a seeded permutation, ~20% test, ~20% val (train/test only below 3)."""
    uniq = sorted(set(subjects))
    order = np.random.default_rng(seed).permutation(len(uniq))
    n = len(uniq)
    n_test = max(1, round(0.2 * n)) if n >= 2 else 0
    n_val = max(1, round(0.2 * n)) if n >= 3 else 0
    split, fold = {}, {}
    k = min(5, n)
    for rank, i in enumerate(order):
        s = uniq[i]
        split[s] = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
        fold[s] = rank % k if k else 0
    return split, fold


def write_outputs(out_dir: Path, X: np.ndarray, rows: list[dict], sfreq: float, ch_names: list[str],
                  labels: list[str], seed: int, resp: np.ndarray | None = None, subjects=None,
                  ch_types: list[str] | None = None, meta: dict | None = None) -> dict:
    """Write X.npz, epochs.parquet, channels.parquet (+ subjects.parquet, meta.json); return the
    preprocess stage's {"files", "sizes"}."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not rows:
        raise DatasetError("preprocessing produced no epochs (no labelled events in the recordings)")
    table = pd.DataFrame(rows)
    ids = sorted(table["subject"].unique())
    table["subject_idx"] = table["subject"].map({s: i for i, s in enumerate(ids)}).astype("int64")
    split, fold = subject_splits(list(ids), seed)
    table["split"] = table["subject"].map(split)
    table["fold"] = table["subject"].map(fold).astype("int64")
    table["label_id"] = table["label"].map({l: i for i, l in enumerate(labels)}).astype("int64")
    table.insert(0, "epoch", np.arange(len(table), dtype=np.int64))
    n_times = X.shape[-1]
    times = np.arange(n_times) / sfreq
    arrays = {"X": X.astype(np.float32), "sfreq": np.float64(sfreq), "ch_names": np.array(ch_names),
              "times": times, "labels": np.array(labels)}
    if resp is not None:
        arrays["resp"] = resp.astype(np.float32)
    with atomic_path(out_dir / "X.npz") as tmp:  # uncompressed: EEG noise does not compress, zlib costs seconds
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    with atomic_path(out_dir / "epochs.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    pos = montage_positions(ch_names)
    chan = pd.DataFrame({"name": ch_names, "region": [region_of(c) for c in ch_names],
                         "type": ch_types or ["eeg"] * len(ch_names),
                         "x": pos[:, 0], "y": pos[:, 1], "z": pos[:, 2]})
    with atomic_path(out_dir / "channels.parquet") as tmp:
        chan.to_parquet(tmp, index=False)
    files = ["X.npz", "epochs.parquet", "channels.parquet"]
    if subjects is not None:
        with atomic_path(out_dir / "subjects.parquet") as tmp:
            pd.DataFrame(subjects).to_parquet(tmp, index=False)
        files.append("subjects.parquet")
    meta = {**(meta or {}), "units": "uV", "labels": labels, "sfreq": sfreq, "ch_names": ch_names,
            "regions": regions_map(ch_names)}
    write_json(out_dir / "meta.json", meta)
    files.append("meta.json")
    sizes = {"n_epochs": int(X.shape[0]), "n_channels": int(X.shape[1]), "n_times": int(n_times),
             "sfreq": float(sfreq), "epoch_seconds": round(n_times / sfreq, 4),
             "n_subjects": len(ids), "label_counts": {l: int((table["label"] == l).sum()) for l in labels},
             "split_counts": {s: int((table["split"] == s).sum()) for s in ("train", "val", "test")},
             "regions": regions_map(ch_names), "units": "uV", "X_bytes": int(X.astype(np.float32).nbytes)}
    return {"files": files, "sizes": sizes, "channels": ch_names}


def write_index(raw_dir: Path, records: list[dict], **extra) -> None:
    write_json(Path(raw_dir) / "recordings.json", {"records": records, **extra})


def read_index(raw_dir: Path) -> dict:
    return json.loads((Path(raw_dir) / "recordings.json").read_text())


def resolve(raw_dir: Path, p: str) -> Path:
    p = Path(p)
    return p if p.is_absolute() else Path(raw_dir) / p


def user_folder(name: str, path: str | None) -> Path:
    """The user folder of a 'path' source, or an error naming the config key to set."""
    if not path:
        raise DatasetError(f"dataset '{name}': config key 'data.paths.{name}' is required when its source "
                           f"is 'path' (a folder of the dataset's files)")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DatasetError(f"dataset '{name}': config key 'data.paths.{name}' = '{path}' is not a folder")
    return p


def acquire_by_source(name: str, source: str, raw_dir: Path, *, simulate=None, fetch_remote=None,
                      folder_reader=None, path: str | None = None, empty_hint: str = "",
                      files_of=lambda r: [Path(r["file"])]) -> dict:
    """The one ``acquire`` of every EEG reader: offline simulator, remote fetcher or a user folder.

    ``simulate(raw_dir)`` / ``fetch_remote(raw_dir)`` are called as given; ``folder_reader(folder)``
    returns the index records of a user folder (``files_of(record)`` are the files hashed for
    provenance). A source the reader lacks, or a folder with nothing readable, is a DatasetError
    that names the config key and what was expected."""
    raw_dir = Path(raw_dir)
    available = {"offline": simulate, "remote": fetch_remote, "path": folder_reader}
    if available.get(source) is None:
        have = [k for k, v in available.items() if v is not None]
        raise DatasetError(f"dataset '{name}': source '{source}' not available; allowed: {have}")
    if source != "path":
        return available[source](raw_dir)
    folder = user_folder(name, path)
    records = folder_reader(folder)
    if not records:
        raise DatasetError(f"dataset '{name}': config key 'data.paths.{name}' = '{path}' holds no readable "
                           f"recordings ({empty_hint})")
    write_index(raw_dir, records, folder=str(folder))
    files = sorted({f for r in records for f in files_of(r)})
    return {"version": "user", "path": str(folder), "user_files": hash_user_files(files)}


def save_preview(fig, png: Path, title: str) -> None:
    """Title, tight layout, 90 dpi PNG, figure closed: how every dataset preview ends."""
    fig.suptitle(title)
    save_figure(fig, png, dpi=90)


def hash_user_files(files: list[Path]) -> dict:
    from ..download import sha256_file

    return {str(f): {"sha256": sha256_file(f), "bytes": f.stat().st_size} for f in files}


# --- preview helpers -------------------------------------------------------------------------

def psd(x: np.ndarray, sfreq: float, fmax: float | None = None):
    """Welch PSD along the last axis (2 s Hann windows, 50% overlap): (freqs, power uV^2/Hz)."""
    from scipy.signal import welch

    nper = min(x.shape[-1], int(2 * sfreq))
    f, p = welch(x, fs=sfreq, nperseg=nper, axis=-1)
    if fmax:
        keep = f <= fmax
        f, p = f[keep], p[..., keep]
    return f, p


def band_power(x: np.ndarray, sfreq: float, lo: float, hi: float) -> np.ndarray:
    f, p = psd(x, sfreq)
    band = (f >= lo) & (f <= hi)
    return p[..., band].mean(axis=-1)
