"""Multitaper spectrogram tokens of the EEG, spectral features of EEG and breathing, downstream learners.

Spectrogram (as in the paper's target space): 5-s frames, multitaper power spectral density
(``mne.time_frequency.psd_array_multitaper``, full bandwidth 1 Hz, i.e. NW = 2.5 and 4 DPSS
tapers at 5 s), 0.5-25 Hz, log10 power. For tokens and MAE the log power is scaled to [0, 1]
by the 1st and 99th percentile of the training spectrograms (one range for all frequencies, as one
would scale an image). Tokens are k-means centroids of the scaled frames (sklearn).

Downstream learners are identical for every input source (real EEG, synthetic EEG, breathing):
staging is multinomial logistic regression on the epoch's features and those of its two
neighbours on each side; age is ridge regression and sex logistic regression on a subject's
night summary (mean and 90th percentile over epochs of the epoch features).
"""
from __future__ import annotations

import numpy as np

FRAME_S = 5.0
EEG_FMIN, EEG_FMAX, EEG_BW = 0.5, 25.0, 1.0
EEG_BANDS = [(0.5, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12), (12, 14), (14, 16), (16, 20), (20, 25)]
SIGMA = (11.5, 14.5)
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


def eeg_epoch_features(spec: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """Scaled spectrogram (S, E, frames_per_epoch, n_freq) -> (S, E, 11): per-band mean over the
    epoch, and the largest frame's sigma power (spindles are transient: 0.5-1.5 s in a 30-s epoch)."""
    b = band_means(spec, freqs, EEG_BANDS).mean(axis=2)
    sigma = band_means(spec, freqs, [SIGMA])[..., 0].max(axis=2)
    return np.concatenate([b, sigma[..., None]], axis=-1)


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


def fit_downstream(f_train: np.ndarray, stage: np.ndarray, age: np.ndarray, sex: np.ndarray,
                   subject_train: np.ndarray | None = None) -> dict:
    """Fit the three downstream learners on training subjects' features (S, E, d)."""
    from sklearn.linear_model import LogisticRegression, RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    xs = with_context(f_train).reshape(-1, 5 * f_train.shape[-1])
    stager = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000)).fit(xs, stage.reshape(-1))
    xn = night_summary(f_train) if subject_train is None else subject_train
    ager = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-2, 3, 12))).fit(xn, age)
    sexer = make_pipeline(StandardScaler(), LogisticRegression(C=0.3, max_iter=1000)).fit(xn, sex)
    return {"stage": stager, "age": ager, "sex": sexer}


def evaluate_downstream(models: dict, f_test: np.ndarray, stage: np.ndarray, age: np.ndarray, sex: np.ndarray,
                        subject_test: np.ndarray | None = None) -> dict:
    from sklearn.metrics import roc_auc_score

    s, e, d = f_test.shape
    pred = models["stage"].predict(with_context(f_test).reshape(-1, 5 * d)).reshape(s, e)
    xn = night_summary(f_test) if subject_test is None else subject_test
    age_hat = models["age"].predict(xn)
    p_sex = models["sex"].predict_proba(xn)[:, 1]
    return {"stage_acc": float((pred == stage).mean()), "age_mae": float(np.abs(age_hat - age).mean()),
            "sex_auroc": float(roc_auc_score(sex, p_sex)) if len(set(sex.tolist())) == 2 else float("nan"),
            "stage_pred": pred}
