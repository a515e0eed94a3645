"""The released study (paper scale): EEG recordings of the participants from a user folder.

``data_path`` (config) points at a BIDS tree or a folder of recordings; every file mne can read
(``.cdt .edf .bdf .vhdr .set .fif``; ``.cdt`` is the release's Curry format) is one subject's session, grouped by subject via the BIDS
``sub-<label>`` folder or file-name prefix. Trials come from the recording's annotations:
``event_map`` maps annotation descriptions to the three conditions (``correct``, ``detected``,
``missed``) - the released data's codes are not known offline, so the map must be given.
The authors instead relabel the word events from the behavioural records (``load_record``: which
descriptions were judged correctly, which words are hallucinated); that step is not reproduced
here: export the relabelled events as annotations first. ``notch_hz`` (paper config: 50 Hz, as the
authors' ``src/load_raw_data.py``) adds their line-noise notch. Each subject then runs through the
same mne pipeline as the simulation (:func:`.study.preprocess_raw`), on the 10-20 channels it has.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

EXTS = (".cdt", ".edf", ".bdf", ".vhdr", ".set", ".fif")


def _subject(path: Path) -> str:
    m = re.search(r"sub-([A-Za-z0-9]+)", str(path))
    return m.group(1) if m else path.stem.split("_")[0]


def canonical_names(ch_names) -> dict[str, str]:
    """Map the recording's channel names onto the 10-20 spelling, ignoring case ("FP1" -> "Fp1",
    "CZ" -> "Cz": the authors' montage is upper-case); names that are not 10-20 channels stay."""
    from reprozoo.data.eeg.simulate import TEN_TWENTY

    canon = {c.lower(): c for c in TEN_TWENTY}
    return {c: canon[c.lower()] for c in ch_names if c.lower() in canon and c != canon[c.lower()]}


def load_study(data_path: str, p: dict) -> dict:
    import mne

    from reprozoo.data.eeg.simulate import MONTAGE, TEN_TWENTY

    from . import study

    root = Path(data_path).expanduser()
    files = sorted(f for f in root.rglob("*") if f.suffix.lower() in EXTS)
    if not files:
        raise FileNotFoundError(f"no EEG recordings ({', '.join(EXTS)}) under {root}: set data_path to the "
                                "released EEG-Hallucination data (BIDS or a folder of recordings)")
    emap = p.get("event_map") or {}
    if not emap:
        raise ValueError("event_map is empty: map the recordings' annotation descriptions to "
                         f"{study.CONDITIONS} in configs/paper.yaml")
    code = {c: i + 1 for i, c in enumerate(study.CONDITIONS)}
    by_subj: dict[str, list] = {}
    for f in files:
        raw = mne.io.read_raw(f, preload=True, verbose="ERROR")
        raw.rename_channels(canonical_names(raw.ch_names))  # the release spells them FP1, CZ, PZ, ...
        ch = [c for c in TEN_TWENTY if c in raw.ch_names]
        raw.pick(ch).set_montage(mne.channels.make_standard_montage(MONTAGE), on_missing="ignore")
        if p.get("notch_hz"):  # the authors' 50 Hz line-noise notch (linear: commutes with the reference)
            raw.notch_filter(float(p["notch_hz"]), verbose="ERROR")
        ev, ids = mne.events_from_annotations(raw, verbose="ERROR")
        keep = {ids[a]: code[c] for a, c in emap.items() if a in ids}
        ev = ev[np.isin(ev[:, 2], list(keep))]
        ev[:, 2] = [keep[e] for e in ev[:, 2]]
        by_subj.setdefault(_subject(f), []).append(study.preprocess_raw(raw, ev, p))
    ch_names = [c for c in TEN_TWENTY if all(c in e.ch_names for es in by_subj.values() for e in es)]
    ev_out = {c: [] for c in study.CONDITIONS}
    trials, labels, groups = [], [], []
    for s, (name, eps) in enumerate(sorted(by_subj.items())):
        epochs = mne.concatenate_epochs([e.pick(ch_names) for e in eps], verbose="ERROR")
        for c in study.CONDITIONS:
            ev_out[c].append(epochs[c].average().data)
        trials.append(epochs.get_data(copy=False))
        labels.append(epochs.events[:, 2])
        groups.append(np.full(len(epochs), s))
    return {"ch_names": ch_names, "sfreq": float(p["sfreq"]), "times": epochs.times.copy(),
            "evoked": {c: np.stack(v) for c, v in ev_out.items()}, "trials": np.concatenate(trials),
            "labels": np.concatenate(labels), "groups": np.concatenate(groups), "subjects": sorted(by_subj)}
