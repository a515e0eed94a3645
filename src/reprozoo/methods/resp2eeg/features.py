"""Multitaper spectrogram tokens of the EEG, spectral features of EEG and breathing, downstream learners.

Spectrogram (as in the paper's target space): 5-s frames, multitaper power spectral density
(``mne.time_frequency.psd_array_multitaper``, full bandwidth 1 Hz, i.e. NW = 2.5 and 4 DPSS
tapers at 5 s), 0.5-25 Hz, log10 power. For tokens and MAE the log power is scaled to [0, 1]
by the 1st and 99th percentile of the training spectrograms (one range for all frequencies, as one
would scale an image). Tokens are k-means centroids of the scaled frames (sklearn).

Downstream learners are identical for every input source (real EEG, synthetic EEG, breathing),
and so is their tuning: staging is multinomial logistic regression on the epoch's features and
those of its two neighbours on each side; age is ridge regression and sex logistic regression on a
subject's night summary (mean and 90th percentile over epochs of the epoch features, among them
the fraction of 5-s frames that hold a spindle: the sleep microstructure through which the
simulator plants sex and age). Every
regularisation strength is chosen from one grid (:data:`C_GRID`, :data:`ALPHA_GRID`) by
cross-validation over the labelled subjects (folds never split a subject), the same grid for every
source. Scores are returned per test subject (the units of the claims; the sex AUROC as its
placement values).
"""
from __future__ import annotations

import numpy as np

FRAME_S = 5.0
EEG_FMIN, EEG_FMAX, EEG_BW = 0.5, 25.0, 1.0
EEG_BANDS = [(0.5, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12), (12, 14), (14, 16), (16, 20), (20, 25)]
SIGMA = (11.5, 14.5)
FLANK_LO, FLANK_HI = (9.0, 11.0), (16.0, 20.0)  # the bands either side of sigma
SPINDLE_PEAK = 2.0  # a spindle frame: sigma power at least twice its flanks' (3 dB above the background)
RESP_BANDS = [(0.05, 0.15), (0.15, 0.2), (0.2, 0.25), (0.25, 0.3), (0.3, 0.4), (0.4, 0.6), (0.6, 1.0)]


def multitaper_frames(x: np.ndarray, sfreq: float, frame_s: float = FRAME_S, fmin=EEG_FMIN, fmax=EEG_FMAX,
                      bandwidth=EEG_BW) -> tuple[np.ndarray, np.ndarray]:
    """(..., n) signal -> log10 multitaper PSD of consecutive frames (..., n_frames, n_freq) and freqs (Hz)."""
    from mne.time_frequency import psd_array_multitaper

    m = int(round(frame_s * sfreq))
    n_frames = x.shape[-1] // m
    fr = x[..., : n_frames * m].reshape(*x.shape[:-1], n_frames, m)
    psd, freqs = psd_array_multitaper(fr, sfreq, fmin=fmin, fmax=fmax, bandwidth=bandwidth, adaptive=False,
                                      low_bias=True, normalization="full", verbose=False)
    return np.log10(psd + 1e-12), freqs


class Scale:
    """log power -> [0, 1] by the 1st / 99th percentile of the training spectrograms."""

    def __init__(self, logp_train: np.ndarray):
        self.lo, self.hi = np.percentile(logp_train, [1, 99])

    def __call__(self, logp):
        return (logp - self.lo) / (self.hi - self.lo)


def fit_codebook(frames: np.ndarray, k: int, seed: int, max_frames: int = 8000):
    """k-means codebook of scaled spectrogram frames (n, n_freq), fit on at most ``max_frames``
    frames drawn at random (the centroids of 64 clusters are set well by a few thousand frames)."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(seed)
    if len(frames) > max_frames:
        frames = frames[rng.choice(len(frames), max_frames, replace=False)]
    return KMeans(n_clusters=k, n_init=1, random_state=seed, max_iter=100).fit(frames.astype(np.float64))


def band_means(spec: np.ndarray, freqs: np.ndarray, bands) -> np.ndarray:
    """(..., n_freq) -> (..., n_bands): mean over each band's bins."""
    return np.stack([spec[..., (freqs >= lo) & (freqs < hi)].mean(-1) for lo, hi in bands], axis=-1)


def eeg_epoch_features(spec: np.ndarray, freqs: np.ndarray, log_range: float) -> np.ndarray:
    """Scaled spectrogram (S, E, frames_per_epoch, n_freq) -> (S, E, 12): per-band mean over the
    epoch, the largest frame's sigma power (spindles are transient: 0.5-1.5 s in a 30-s epoch), and
    the epoch's spindle-frame fraction (:func:`spindle_frames`). ``log_range``: the scaling's
    ``hi - lo`` (log10 units per scaled unit), so that the spindle criterion is a power ratio."""
    b = band_means(spec, freqs, EEG_BANDS).mean(axis=2)
    sigma = band_means(spec, freqs, [SIGMA])[..., 0].max(axis=2)
    dens = spindle_frames(spec, freqs, log_range).mean(axis=2)
    return np.concatenate([b, sigma[..., None], dens[..., None]], axis=-1)


def spindle_frames(spec: np.ndarray, freqs: np.ndarray, log_range: float) -> np.ndarray:
    """(..., n_freq) scaled frames -> bool (...): the frame holds a spindle-like sigma peak, i.e. its
    11.5-14.5 Hz power is at least :data:`SPINDLE_PEAK` times the mean (in log) of the flanking
    9-11 and 16-20 Hz bands. A spectral peak criterion counts spindles (their density is what
    age and sex shift) and is blind to the subject's overall EEG amplitude and spindle amplitude,
    which a band power mixes in (the per-night mean sigma power separates the sexes at AUROC 0.61
    against 0.77 for this count: probe on 300 simulated nights, see the README)."""
    peak = band_means(spec, freqs, [SIGMA])[..., 0] - 0.5 * (band_means(spec, freqs, [FLANK_LO])[..., 0]
                                                              + band_means(spec, freqs, [FLANK_HI])[..., 0])
    return peak * float(log_range) > np.log10(SPINDLE_PEAK)


def resp_epoch_features(resp: np.ndarray, sfreq: float) -> np.ndarray:
    """Breathing epochs (S, E, n) -> (S, E, 10): log multitaper power in 7 bands of 0.05-1 Hz, log
    standard deviation, the dominant frequency (Hz) and the variability of the breath envelope."""
    from mne.time_frequency import psd_array_multitaper
    from scipy.signal import hilbert

    psd, freqs = psd_array_multitaper(resp, sfreq, fmin=0.05, fmax=1.0, bandwidth=0.2, adaptive=False,
                                      low_bias=True, normalization="full", verbose=False)
    b = np.log10(band_means(psd, freqs, RESP_BANDS) + 1e-12)
    env = np.abs(hilbert(resp - resp.mean(-1, keepdims=True), axis=-1))
    cv = env.std(-1) / (env.mean(-1) + 1e-9)
    return np.concatenate([b, np.log10(resp.std(-1) + 1e-9)[..., None], freqs[psd.argmax(-1)][..., None],
                           cv[..., None]], axis=-1)


def with_context(f: np.ndarray, k: int = 2) -> np.ndarray:
    """(S, E, d) -> (S, E, (2k + 1) d): each epoch with its k neighbours on each side (edges repeated)."""
    pad = np.concatenate([np.repeat(f[:, :1], k, 1), f, np.repeat(f[:, -1:], k, 1)], axis=1)
    e = f.shape[1]
    return np.concatenate([pad[:, i: i + e] for i in range(2 * k + 1)], axis=-1)


def night_summary(f: np.ndarray) -> np.ndarray:
    """(S, E, d) -> (S, 2 d): mean and 90th percentile over the night."""
    return np.concatenate([f.mean(1), np.percentile(f, 90, axis=1)], axis=-1)


C_GRID = np.logspace(-3, 2, 6)      # inverse L2 strength of both logistic regressions
ALPHA_GRID = np.logspace(-2, 3, 12)  # ridge penalty of the age regression (leave-one-out)
N_FOLDS = 4


def _subject_folds(n_subjects: int, epochs: int, n_folds: int = N_FOLDS):
    """Grouped folds over epochs: every subject's epochs fall in one fold."""
    groups = np.repeat(np.arange(n_subjects) % n_folds, epochs)
    return [(np.flatnonzero(groups != f), np.flatnonzero(groups == f)) for f in range(n_folds)]


def fit_subject_models(xn: np.ndarray, age: np.ndarray, sex: np.ndarray) -> dict:
    """Age (ridge) and sex (logistic) learners on per-subject features (S, d), tuned on the grids."""
    from sklearn.linear_model import LogisticRegressionCV, RidgeCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    ager = make_pipeline(StandardScaler(), RidgeCV(alphas=ALPHA_GRID)).fit(xn, age)
    folds = min(N_FOLDS, int(np.bincount(sex, minlength=2).min()))
    if folds < 2:  # a toy labelled set with one night of a sex: nothing to cross-validate
        raise ValueError(f"sex model: {np.bincount(sex, minlength=2).tolist()} labelled nights per sex; "
                         "need at least 2 of each (raise n_labelled)")
    sexer = make_pipeline(StandardScaler(), LogisticRegressionCV(
        Cs=C_GRID, cv=StratifiedKFold(folds, shuffle=True, random_state=0), scoring="roc_auc",
        max_iter=2000)).fit(xn, sex)
    return {"age": ager, "sex": sexer, "age_mean": float(np.mean(age))}


def fit_downstream(f_train: np.ndarray, stage: np.ndarray, age: np.ndarray, sex: np.ndarray) -> dict:
    """Fit the three downstream learners on the labelled subjects' features (S, E, d)."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    s, e, d = f_train.shape
    xs = with_context(f_train).reshape(-1, 5 * d)
    stager = make_pipeline(StandardScaler(), LogisticRegressionCV(
        Cs=C_GRID, cv=_subject_folds(s, e, min(N_FOLDS, s)), scoring="accuracy",
        max_iter=2000)).fit(xs, stage.reshape(-1))
    models = fit_subject_models(night_summary(f_train), age, sex)
    models["stage"] = stager
    models["stage_majority"] = int(np.bincount(stage.ravel()).argmax())
    return models


def auroc_placements(score: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Per-unit AUROC (DeLong's placement values): for a positive unit, the fraction of negatives it
    out-scores (ties count a half); for a negative, the fraction of positives that out-score it.
    Their mean over all units is the AUROC exactly (each class's mean is), so a claim on the AUROC can
    take a unit-level interval. NaN for every unit when the units hold one class only."""
    score, label = np.asarray(score, float), np.asarray(label)
    pos, neg = label == 1, label == 0
    if not pos.any() or not neg.any():
        return np.full(len(score), np.nan)
    gt = (score[:, None] > score[None, :]) + 0.5 * (score[:, None] == score[None, :])  # gt[i, j]: i beats j
    return np.where(pos, gt[:, neg].mean(1), gt[pos, :].mean(0))


def score_subjects(models: dict, stage_pred: np.ndarray, stage: np.ndarray, age_hat: np.ndarray,
                   age: np.ndarray, p_sex: np.ndarray, sex: np.ndarray) -> dict:
    """Per test subject: staging accuracy, |age error| (``age_mae``: their mean is the MAE) and the
    sex AUROC's placement value (:func:`auroc_placements`: their mean is the AUROC); and the same for
    the constant predictors (the labelled set's commonest stage and mean age)."""
    return {"stage_acc": (stage_pred == stage).mean(1), "age_mae": np.abs(age_hat - age),
            "stage_acc_const": (stage == models["stage_majority"]).mean(1),
            "age_mae_const": np.abs(models["age_mean"] - age),
            "sex_auroc": auroc_placements(p_sex, sex),
            "stage_pred": stage_pred}


def evaluate_downstream(models: dict, f_test: np.ndarray, stage: np.ndarray, age: np.ndarray,
                        sex: np.ndarray) -> dict:
    s, e, d = f_test.shape
    pred = models["stage"].predict(with_context(f_test).reshape(-1, 5 * d)).reshape(s, e)
    xn = night_summary(f_test)
    return score_subjects(models, pred, stage, models["age"].predict(xn), age,
                          models["sex"].predict_proba(xn)[:, 1], sex)
