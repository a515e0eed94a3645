"""Leave-one-subject-out single-trial decoding of detected hallucinations vs correct content.

xDAWN (Rivet et al. 2009) finds spatial filters ``w`` maximising the signal-to-signal-plus-noise
ratio of each class's evoked response, ``w^T C_evoked w / w^T C_data w``; projecting the epochs on
the first ``n_components`` filters per class keeps the ERP and suppresses the background.
Pipeline (mne + scikit-learn): ``XdawnTransformer`` -> ``Vectorizer`` -> ``StandardScaler`` ->
L2 ``LogisticRegression``. The ``raw`` baseline is the same pipeline without the spatial filter.
Each fold trains on 26 subjects and scores every trial of the held-out subject: AUC of the
decision function and balanced accuracy per subject.
"""
from __future__ import annotations

import numpy as np


def bin_time(X: np.ndarray, times: np.ndarray, tmin: float, tmax: float, bin_s: float):
    """Mean amplitude in consecutive ``bin_s`` windows over [tmin, tmax): the ERP is slow (< 10 Hz),
    so 40 ms bins keep it while making each fold cheap. Returns (X_binned, bin centres in s)."""
    sfreq = 1.0 / (times[1] - times[0])
    k = max(1, int(round(bin_s * sfreq)))
    i0 = int(np.argmin(np.abs(times - tmin)))
    nb = int((tmax - times[i0]) * sfreq + 1e-6) // k
    Xw = X[..., i0:i0 + nb * k]
    return Xw.reshape(*X.shape[:-1], nb, k).mean(-1), times[i0:i0 + nb * k].reshape(nb, k).mean(-1)


def make_pipeline(kind: str, n_components: int, C: float):
    from mne.decoding import Vectorizer, XdawnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline as mk
    from sklearn.preprocessing import StandardScaler

    steps = [XdawnTransformer(n_components=n_components, reg=0.05)] if kind == "xdawn" else []
    return mk(*steps, Vectorizer(), StandardScaler(), LogisticRegression(C=C, max_iter=500))


def loso(X: np.ndarray, y: np.ndarray, groups: np.ndarray, kind: str, n_components: int = 2,
         C: float = 0.01) -> dict:
    """Per held-out subject AUC and balanced accuracy; ``X`` (n_trials, n_ch, n_times), y in {0, 1}."""
    from sklearn.metrics import balanced_accuracy_score, roc_auc_score
    from sklearn.model_selection import LeaveOneGroupOut

    X = X.astype(np.float64) * 1e6  # microvolts: keeps xDAWN's covariances well scaled
    auc, bacc, subj = [], [], []
    for tr, te in LeaveOneGroupOut().split(X, y, groups):
        clf = make_pipeline(kind, n_components, C).fit(X[tr], y[tr])
        s = clf.decision_function(X[te])
        auc.append(roc_auc_score(y[te], s))
        bacc.append(balanced_accuracy_score(y[te], (s > 0).astype(int)))
        subj.append(int(groups[te][0]))
    return {"auc": np.array(auc), "bacc": np.array(bacc), "subject": np.array(subj)}
