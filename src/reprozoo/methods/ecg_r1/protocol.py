"""Protocol-guided reports: measured ECG features, monograph thresholds, diagnostic logic, scoring.

ECG-R1 grounds every interpretation in measurable features and quantitative thresholds. Here the
measurement is neurokit2's (``ecg_peaks`` for R peaks, ``ecg_delineate`` with the discrete
wavelet method for wave boundaries) on the clean record, and the protocol is:

    heart rate   HR = 60 / mean(RR)                  brady < 60 bpm, tachy >= 100 bpm
    regularity   CV = std(RR) / mean(RR)             irregular if CV >= 0.10 (our AF-like cut)
    QRS          median(R offset - R onset)          wide if >= 120 ms
    PR           median(R onset - P onset)           prolonged if >= 200 ms (1st-degree AV block)
    QTc          median(T offset - R onset)/sqrt(RR) prolonged if >= 450 ms (Bazett)

    diagnosis    irregular -> "AF-like irregular rhythm"; else brady -> "sinus bradycardia";
                 else tachy -> "sinus tachycardia"; else "sinus rhythm".

A report is six statements in the protocol's order (evidence first, then the diagnosis it
implies): RATE <bin> RHYTHM <bin> QRS <bin> PR <bin> QTC <bin> DX <class>. Each evidence
value is a bin whose edges include the threshold, so a bin also states the category.

Two scorers, on purpose different instruments:
* the RL reward (``evidence_reward``, the paper's): diagnosis right, and the protocol's evidence
  anchors stated exactly (recall per protocol step), against the neurokit2 measurement;
* the grounded check (``grounded``, what the hallucination rate counts): each statement against the
  simulator's own generating values (``ground_truth``: nominal rate and RR variability, the wave
  intervals ECGSYN was given, the rhythm class), which no delineation touches.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

FEATURES = ("hr", "rr_cv", "qrs_ms", "pr_ms", "qtc_ms")
DX = ("sinus rhythm", "sinus bradycardia", "sinus tachycardia", "AF-like irregular rhythm")


@dataclass(frozen=True)
class Field:
    """One evidence statement: bin edges (first, width, count), its threshold and its words."""

    name: str
    feature: str
    lo: float
    width: float
    n: int
    threshold: float          # protocol cut; a multiple of the bin grid
    unit: str
    words: tuple[str, str]    # (below threshold, at/above threshold)

    def bin(self, value: float) -> int:
        return int(np.clip(np.floor((value - self.lo) / self.width), 0, self.n - 1))

    def threshold_bin(self) -> int:
        return int(round((self.threshold - self.lo) / self.width))

    def category(self, b) -> np.ndarray:
        return np.asarray(b) >= self.threshold_bin()

    def text(self, b: int) -> str:
        a = self.lo + b * self.width
        word = self.words[int(self.category(b))]
        if self.feature == "hr" and a < RATE_LOW:
            word = "bradycardic"
        return f"{self.name} {a:g}-{a + self.width:g} {self.unit} ({word})"


RATE_LOW = 60.0   # bpm, bradycardia below (monograph)
FIELDS = (
    Field("rate", "hr", 40.0, 10.0, 11, 100.0, "bpm", ("normal rate", "tachycardic")),
    Field("RR CV", "rr_cv", 0.0, 0.05, 6, 0.10, "", ("regular", "irregular")),
    Field("QRS", "qrs_ms", 40.0, 20.0, 11, 120.0, "ms", ("normal", "wide")),
    Field("PR", "pr_ms", 40.0, 40.0, 8, 200.0, "ms", ("normal", "prolonged")),
    Field("QTc", "qtc_ms", 300.0, 30.0, 10, 450.0, "ms", ("normal", "prolonged")),
)
N_STATEMENTS = len(FIELDS) + 1
VOCAB_SIZES = tuple(f.n for f in FIELDS) + (len(DX),)
BRADY_BIN = FIELDS[0].bin(RATE_LOW - 1e-9) + 1   # rate bins below this one are < 60 bpm
THRESHOLD_FEATURES = ("qrs_ms", "pr_ms", "qtc_ms")  # statements whose clinical category is read from the value


def measure(clean: np.ndarray, fs: int) -> dict | None:
    """neurokit2 delineation of a clean record -> the five protocol features (None if it fails)."""
    import neurokit2 as nk

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _, info = nk.ecg_peaks(clean, sampling_rate=fs)
            r = np.asarray(info["ECG_R_Peaks"])
            if len(r) < 4:
                return None
            _, w = nk.ecg_delineate(clean, r, sampling_rate=fs, method="dwt")
        except Exception:  # delineation of a degenerate record: resample it
            return None

    def span_ms(a: str, b: str) -> float:
        x, y = np.asarray(w[a], float), np.asarray(w[b], float)
        n = min(len(x), len(y))
        d = (y[:n] - x[:n])[np.isfinite(x[:n]) & np.isfinite(y[:n])]
        d = d[d > 0]
        return float(np.median(d) / fs * 1000) if len(d) >= 2 else float("nan")

    rr = np.diff(r) / fs
    f = {"hr": float(60.0 / rr.mean()), "rr_cv": float(rr.std() / rr.mean()),
         "qrs_ms": span_ms("ECG_R_Onsets", "ECG_R_Offsets"), "pr_ms": span_ms("ECG_P_Onsets", "ECG_R_Onsets")}
    f["qtc_ms"] = span_ms("ECG_R_Onsets", "ECG_T_Offsets") / np.sqrt(rr.mean())
    return f if all(np.isfinite(v) for v in f.values()) else None


def diagnosis_from_bins(rate_bin, cv_bin) -> np.ndarray:
    """The protocol's diagnostic logic on (rate, regularity) bins; vectorised."""
    rate_bin, cv_bin = np.asarray(rate_bin), np.asarray(cv_bin)
    irregular = FIELDS[1].category(cv_bin)
    brady = rate_bin < BRADY_BIN
    tachy = FIELDS[0].category(rate_bin)
    return np.where(irregular, 3, np.where(brady, 1, np.where(tachy, 2, 0)))


def protocol_report(feat: dict) -> np.ndarray:
    """Feature dict -> the protocol's six statement indices (the SFT target)."""
    bins = [f.bin(feat[f.feature]) for f in FIELDS]
    return np.array(bins + [int(diagnosis_from_bins(bins[0], bins[1]))], dtype=np.int64)


def exact(reports: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Boolean (n, 6): does each statement state exactly the protocol's bin (diagnosis: class)?"""
    return np.atleast_2d(reports) == np.atleast_2d(truth)


def consistent(reports: np.ndarray) -> np.ndarray:
    """Does the report's diagnosis follow from its own cited rate and regularity (protocol logic)?"""
    reports = np.atleast_2d(reports)
    return diagnosis_from_bins(reports[:, 0], reports[:, 1]) == reports[:, -1]


# The paper's protocol steps that our evidence statements belong to (its reward averages the anchor
# recall per step over the steps that have anchors): step 1 technical / rate / rhythm (rate, RR CV),
# step 2 conduction / intervals (QRS, PR), step 5 electrolytes / QT (QTc).
REWARD_STEPS = ((0, 1), (2, 3), (4,))


def evidence_recall(reports: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """The paper's key-diagnostic-evidence reward (``KeyDiagnosticEvidenceORM``, evidence_weight 1):
    per protocol step, the fraction of the reference's evidence anchors the report states exactly (an
    exact anchor match, no tolerance), averaged over the steps. Here an anchor is the protocol's bin."""
    ok = exact(reports, truth)
    return np.mean([ok[:, list(js)].mean(axis=1) for js in REWARD_STEPS], axis=0)


def evidence_reward(reports: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """The paper's RL reward (``rl_train_dapo.sh``: diagnosis_accuracy_reward + key_diagnostic_evidence_reward
    + format_reward, equal weights), in [0, 1]: r = (Jaccard(dx) + evidence recall) / 2. Our diagnosis
    is one label, so its Jaccard is 1[dx correct]; the format reward is 1 for every report of our
    fixed-format decoder, a constant that GRPO's group normalisation cancels, so it is left out; the
    division by 2 is a scale (also cancelled by the normalisation) that keeps the validation curve in
    [0, 1]. No consistency term and no one-bin tolerance (ours until this round)."""
    return (exact(reports, truth)[:, -1].astype(float) + evidence_recall(reports, truth)) / 2.0


# --- the grounded check: an instrument independent of the reward -------------------------------

RHYTHM_DX = {"normal": 0, "brady": 1, "tachy": 2, "irregular": 3}   # generating class -> DX index
GROUND_TOL = tuple(0.5 * f.width for f in FIELDS)                  # half a bin, in the field's unit
REF_COLUMNS = ("hr", "rr_cv", "qrs_ms", "pr_ms", "qtc_ms", "dx")   # ground_truth()'s order
# The irregular class's 8-s window: its mean rate departs from the tachogram's nominal mean by up to
# 9 bpm (calibration records, README), so its rate statement is checked to within half a bin plus this.
IRREGULAR_RATE_TOL = 10.0


def reference(values: dict, rhythm: str) -> np.ndarray:
    """A reference row in REF_COLUMNS order: the five values and the generating class's diagnosis."""
    return np.array([values[k] for k in FEATURES] + [RHYTHM_DX[rhythm]], dtype=np.float64)


def ground_truth(params: dict) -> np.ndarray:
    """The grounded check's reference for one record, from the simulator alone (no delineation):
    the generator's nominal rate and RR variability and its wave intervals (data.generator_features),
    and the rhythm class it was asked for as the diagnosis. Independent of neurokit2's measurement,
    which the protocol report, and so the reward, read."""
    from .data import generator_features

    return reference(generator_features(params), params["rhythm"])


def grounded(reports: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Boolean (n, 6): does each statement agree with the generator's reference (``ground_truth``)?

    Value statements: reference inside [lo - tol, hi + tol] of the stated bin (tol = half a bin; the
    irregular class's rate IRREGULAR_RATE_TOL more), and for QRS, PR, QTc the stated clinical category
    (normal / wide / prolonged) must be the reference value's. Rate: also the stated category
    (bradycardic / normal / tachycardic) must be the generating class's for the three regular classes.
    Regularity: the stated category must be "irregular" exactly when the class is; its value is
    checked against the nominal RR variability for the regular classes only (the irregular class's
    8-s window departs from its nominal variability by up to 0.1). Diagnosis: the generating class."""
    reports, ref = np.atleast_2d(reports), np.atleast_2d(ref)
    ok = np.zeros(reports.shape, dtype=bool)
    dx = ref[:, -1].astype(int)
    irregular = dx == 3
    for j, (f, tol) in enumerate(zip(FIELDS, GROUND_TOL)):
        lo = f.lo + reports[:, j] * f.width
        t = tol + (IRREGULAR_RATE_TOL * irregular if f.feature == "hr" else 0.0)
        ok[:, j] = (ref[:, j] >= lo - t) & (ref[:, j] <= lo + f.width + t)
        if f.feature in THRESHOLD_FEATURES:
            ok[:, j] &= f.category(reports[:, j]) == (ref[:, j] >= f.threshold)
    stated_rate = np.where(reports[:, 0] < BRADY_BIN, 1, np.where(FIELDS[0].category(reports[:, 0]), 2, 0))
    ok[:, 0] &= irregular | (stated_rate == dx)
    stated_irregular = FIELDS[1].category(reports[:, 1])
    ok[:, 1] = np.where(irregular, stated_irregular, ok[:, 1] & ~stated_irregular)
    ok[:, -1] = reports[:, -1] == dx
    return ok


def report_text(report) -> list[str]:
    """Human-readable statements of one report (for the example figure)."""
    return [f.text(int(b)) for f, b in zip(FIELDS, report[:-1])] + [f"Dx: {DX[int(report[-1])]}"]
