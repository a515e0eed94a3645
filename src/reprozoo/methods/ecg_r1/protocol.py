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
value is a bin whose edges include the threshold, so a bin also states the category. A statement
is *supported* by the measured features when its bin is within ``TOL_BINS`` of the measured bin
AND on the same side of the threshold (a one-bin reading error is tolerated; a wrong category is
not); the diagnosis is supported when it equals the protocol's. The hallucination rate is the
fraction of unsupported statements.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

FEATURES = ("hr", "rr_cv", "qrs_ms", "pr_ms", "qtc_ms")
DX = ("sinus rhythm", "sinus bradycardia", "sinus tachycardia", "AF-like irregular rhythm")
TOL_BINS = 1


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


def supported(reports: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Boolean (n, 6): is each statement of each report supported by the measured features?"""
    reports, truth = np.atleast_2d(reports), np.atleast_2d(truth)
    ok = np.zeros(reports.shape, dtype=bool)
    for j, f in enumerate(FIELDS):
        ok[:, j] = (np.abs(reports[:, j] - truth[:, j]) <= TOL_BINS) & (f.category(reports[:, j]) == f.category(truth[:, j]))
        if j == 0:  # the rate statement also states brady / not brady
            ok[:, j] &= (reports[:, 0] < BRADY_BIN) == (truth[:, 0] < BRADY_BIN)
    ok[:, -1] = reports[:, -1] == truth[:, -1]
    return ok


def consistent(reports: np.ndarray) -> np.ndarray:
    """Does the report's diagnosis follow from its own cited rate and regularity (protocol logic)?"""
    reports = np.atleast_2d(reports)
    return diagnosis_from_bins(reports[:, 0], reports[:, 1]) == reports[:, -1]


def evidence_reward(reports: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """ECG diagnostic evidence reward in [0, 1]: correct diagnosis, supported evidence, coherence.

    r = (1[dx correct] + fraction of supported evidence statements + 1[dx follows from the cited
    evidence]) / 3. Rewarding the evidence, not only the answer, is the paper's point: a right
    diagnosis reached with invented intervals scores at most 2/3.
    """
    ok = supported(reports, truth)
    return (ok[:, -1].astype(float) + ok[:, :-1].mean(axis=1) + consistent(reports).astype(float)) / 3.0


# --- the grounded check (independent of the reward) ----------------------------------------------

RHYTHM_DX = {"normal": 0, "brady": 1, "tachy": 2, "irregular": 3}   # generating class -> DX index
GROUND_TOL = tuple(0.5 * f.width for f in FIELDS)                  # half a bin, in the field's unit
REF_COLUMNS = ("hr", "rr_cv", "qrs_ms", "pr_ms", "qtc_ms", "dx")   # ground_truth()'s order


def ground_truth(params: dict, feat: dict) -> np.ndarray:
    """The grounded check's reference for one record, in REF_COLUMNS order: the measured values
    (neurokit2 on the noise-free trace; the miniature has no second instrument) and, as the
    diagnosis, the rhythm class the simulator was asked for (the record's ground truth)."""
    return np.array([feat[k] for k in FEATURES] + [RHYTHM_DX[params["rhythm"]]], dtype=np.float64)


def grounded(reports: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Boolean (n, 6): does each statement agree with the ground-truth reference (``ground_truth``)?

    Value statements: reference inside [lo - tol, hi + tol] of the stated bin (tol = half a bin).
    QRS, PR, QTc: also the stated clinical category (normal / wide / prolonged, the field's threshold)
    must be the reference value's: the half-bin tolerance must not let a statement cross the threshold
    ("QRS 100-120 ms (normal)" for a measured 128 ms is a hallucination; cold review of stop 50).
    Rate: also the stated category (bradycardic / normal / tachycardic) must be the generating
    class's for the three regular classes. Regularity: the stated category must be "irregular"
    exactly when the class is. Diagnosis: equal to the generating class."""
    reports, ref = np.atleast_2d(reports), np.atleast_2d(ref)
    ok = np.zeros(reports.shape, dtype=bool)
    for j, (f, tol) in enumerate(zip(FIELDS, GROUND_TOL)):
        lo = f.lo + reports[:, j] * f.width
        ok[:, j] = (ref[:, j] >= lo - tol) & (ref[:, j] <= lo + f.width + tol)
        if f.feature in THRESHOLD_FEATURES:
            ok[:, j] &= f.category(reports[:, j]) == (ref[:, j] >= f.threshold)
    dx = ref[:, -1].astype(int)
    stated_rate = np.where(reports[:, 0] < BRADY_BIN, 1, np.where(FIELDS[0].category(reports[:, 0]), 2, 0))
    ok[:, 0] &= (dx == 3) | (stated_rate == dx)
    ok[:, 1] &= FIELDS[1].category(reports[:, 1]) == (dx == 3)
    ok[:, -1] = reports[:, -1] == dx
    return ok


def report_text(report) -> list[str]:
    """Human-readable statements of one report (for the example figure)."""
    return [f.text(int(b)) for f, b in zip(FIELDS, report[:-1])] + [f"Dx: {DX[int(report[-1])]}"]
