"""Paper scale: real polysomnography (Sleep-EDF via the project's ``eeg_sleep`` reader, or SHHS/MESA
exported to the same EDF layout) in the dict layout of :func:`.data.simulate`.

Sleep-EDF's oro-nasal respiration is band-passed (0.05-1 Hz) and epoched by the reader at the EEG
rate; it is resampled to the translator's 8 Hz here. Age and sex are not in the EDF files: they come
from a CSV (``subjects_csv``: columns subject, age, sex with sex 1 = female), e.g. Sleep-EDF's
SC-subjects.xls exported, or NSRR's harmonised tables. Nights are cut to a common length
(``epochs_per_subject``, first epochs of the sleep period) so that the transformer's windows tile them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .data import RESP_SFREQ


def load_nights(folder: Path, params: dict) -> dict:
    import pandas as pd
    from scipy.signal import resample_poly

    from reprozoo.data.eeg.sleep import STAGES, load

    d = load(folder)
    if d.resp is None:
        raise ValueError(f"{folder}: no respiration channel; resp2eeg needs paired breathing")
    ch = params.get("channel", "Fpz-Cz")
    ci = next(i for i, c in enumerate(d.ch_names) if ch in c)
    e = int(params["epochs_per_subject"])
    traits = pd.read_csv(params["subjects_csv"]).set_index("subject")
    X, R, Y, ages, sexes = [], [], [], [], []
    ep = d.epochs
    for (subject, night), g in ep.groupby(["subject", "night"], sort=True):
        if len(g) < e or subject not in traits.index:
            continue
        rows = g.index.to_numpy()[:e]
        X.append(d.X[rows, ci])
        R.append(resample_poly(d.resp[rows], int(RESP_SFREQ), int(d.sfreq), axis=-1))
        Y.append([STAGES.index(s) for s in g["label"].iloc[:e]])
        ages.append(float(traits.loc[subject, "age"]))
        sexes.append(int(traits.loc[subject, "sex"]))
    return {"eeg": np.asarray(X, np.float32), "resp": np.asarray(R, np.float32), "stage": np.asarray(Y, np.int64),
            "age": np.asarray(ages), "sex": np.asarray(sexes, np.int64), "eeg_sfreq": float(d.sfreq)}
