"""Group statistics of the ERP study: cluster-based permutation tests and what they recover.

A contrast is the paired difference of two conditions' evoked averages per subject,
``D_s(c, t) = E_s^A(c, t) - E_s^B(c, t)``. Under H0 (no condition effect) each ``D_s`` is
symmetric about zero, so flipping the sign of whole subjects is an exact permutation scheme.
mne's ``spatio_temporal_cluster_1samp_test`` forms clusters of (channel, time) samples whose
one-sample t exceeds the two-sided ``alpha`` quantile of t(n_subj - 1), adjacent in time or via
the electrode adjacency of the montage (``find_ch_adjacency``), and compares each cluster's mass
(sum of t) with the distribution of the largest mass under sign flips: the family-wise error
over all channels and times is controlled at ``alpha``.

Each cluster also carries ``mass_ratio``, its |mass| over the 95 % quantile of the permutation
maxima (:func:`null_quantile`): above 1 is significant at 0.05, and unlike the p-value it does not
stop at the permutation floor 1 / n_perm, so a strong effect keeps a seed-to-seed spread.

Recovery of a planted effect: among the clusters of the effect's sign whose peak falls in the
component's a-priori window, the one with the smallest p; inside its mask the extreme of the grand-average difference gives the peak electrode and the peak
sample, refined to sub-sample latency by the vertex of the parabola through the three samples
around it (the sampling step at 100 Hz is 10 ms, the tolerance of the claim). A second latency,
the 50 % fractional-area latency at the peak electrode inside the a-priori window, is the estimator
the ERP literature recommends for broad components (peak picking is noise-sensitive).

Equivalence (is a contrast *absent*, not merely not significant?): the a-priori window-mean
"pathway index" of a contrast per subject, ``-mean_{N400 window} D(Cz) + mean_{P600 window} D(Cz)``
(uV; positive = the verification response of detected hallucinations), and the two one-sided
tests (TOST, Schuirmann 1987; Lakens 2017) of its subject mean against the bounds +-``margin``:
equivalence at ``alpha`` when both one-sided p-values are below ``alpha``, i.e. when the
(1 - 2 alpha) confidence interval lies inside the bounds.

Baseline for the correction (``uncorrected``): a paired t-test at every (channel, time) sample at
``alpha``, no correction for the ~1500 tests.
"""
from __future__ import annotations

import numpy as np


def adjacency(ch_names, sfreq: float = 100.0):
    import mne

    from reprozoo.data.eeg.simulate import _info

    adj, _ = mne.channels.find_ch_adjacency(_info(tuple(ch_names), sfreq), ch_type="eeg")
    return adj


def t_threshold(n_subj: int, alpha: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(1 - alpha / 2, n_subj - 1))


def cluster_test(diff: np.ndarray, adj, n_perm: int, alpha: float, seed: int) -> list[dict]:
    """Clusters of ``diff`` (n_subj, n_ch, n_times): list of {p, sign, mask (n_ch, n_times), mass}."""
    from mne.stats import spatio_temporal_cluster_1samp_test

    X = np.transpose(diff, (0, 2, 1))  # mne wants (observations, times, space)
    t_obs, clusters, p_vals, h0 = spatio_temporal_cluster_1samp_test(
        X, threshold=t_threshold(len(diff), alpha), n_permutations=n_perm, tail=0, adjacency=adj,
        out_type="mask", seed=seed, n_jobs=1, verbose="ERROR")
    q = null_quantile(h0, 1.0 - alpha)
    out = []
    for m, pv in zip(clusters, p_vals):
        mask = m.T  # (n_ch, n_times)
        mass = float(t_obs.T[mask].sum())
        out.append({"p": float(pv), "sign": float(np.sign(mass)), "mask": mask, "mass": mass,
                    "null_q": q, "mass_ratio": abs(mass) / q if q > 0 else float("inf")})
    return out


def null_quantile(h0: np.ndarray, level: float) -> float:
    """The ``level`` quantile of the permutation distribution of the largest |cluster mass|.

    mne's ``H0`` (two-tailed) holds the observed largest |mass| first and then, per sign-flip
    permutation, the signed mass of the largest |cluster| (0 where a permutation has none); the
    observed entry is left out here, so the quantile is that of the null alone. A cluster whose
    |mass| exceeds the 95 % quantile is significant at 0.05 (up to the Monte Carlo error of the
    permutation count); the ratio |mass| / quantile is a continuous effect size of the test that,
    unlike the p-value, does not saturate at the permutation floor 1 / (n_perm)."""
    null = np.abs(np.asarray(h0, dtype=float)[1:])
    return float(np.quantile(null, level)) if null.size else 0.0


def parabolic_peak(y: np.ndarray, i: int) -> float:
    """Sub-sample position of the extremum of ``y`` at sample ``i`` (vertex of the parabola)."""
    if i <= 0 or i >= len(y) - 1:
        return float(i)
    a, b, c = y[i - 1], y[i], y[i + 1]
    den = a - 2 * b + c
    return float(i) if den == 0 else float(i + 0.5 * (a - c) / den)


def _peak(c: dict, ga_diff: np.ndarray, sign: float):
    val = np.where(c["mask"], sign * ga_diff, -np.inf)
    ci, ti = np.unravel_index(np.argmax(val), val.shape)
    return int(ci), int(ti)


def recover(clusters: list[dict], ga_diff: np.ndarray, times: np.ndarray, ch_names, sign: float,
            alpha: float, window_ms=None) -> dict:
    """Latency (ms), peak electrode and p of the most significant cluster of ``sign`` whose peak
    lies in the a-priori ``window_ms`` (the component's conventional window: with an average
    reference a parietal P600 also shows as a frontal negativity, which is not an N400)."""
    cand = []
    for c in clusters:
        if c["sign"] != sign:
            continue
        ci, ti = _peak(c, ga_diff, sign)
        if window_ms is None or window_ms[0] <= times[ti] * 1e3 <= window_ms[1]:
            cand.append((c, ci, ti))
    if not cand:
        return {"p": 1.0, "latency_ms": float("nan"), "area_latency_ms": float("nan"), "peak_ch": None,
                "mask": None, "significant": False, "mass_ratio": 0.0}
    best, ci, ti = min(cand, key=lambda x: (x[0]["p"], -abs(x[0]["mass"])))
    pos = parabolic_peak(sign * ga_diff[ci], ti)
    lat = float(np.interp(pos, np.arange(len(times)), times)) * 1e3
    area = fractional_area_latency(ga_diff[ci], times, window_ms, sign) if window_ms is not None else lat
    return {"p": best["p"], "latency_ms": lat, "area_latency_ms": area, "peak_ch": ch_names[ci],
            "mask": best["mask"], "significant": best["p"] < alpha, "mass_ratio": best.get("mass_ratio", 0.0)}


def fractional_area_latency(y: np.ndarray, times: np.ndarray, window_ms, sign: float,
                            fraction: float = 0.5) -> float:
    """Time (ms) at which the rectified area of ``sign * y`` inside ``window_ms`` reaches
    ``fraction`` of its total (Luck 2014, ch. 9; Kiesel et al. 2008). For a symmetric component it
    equals the peak latency; unlike the peak it uses the whole waveform, so smooth (pink) noise that
    tilts a broad peak moves it far less."""
    t_ms = times * 1e3
    m = (t_ms >= window_ms[0]) & (t_ms <= window_ms[1])
    tt, yy = t_ms[m], np.clip(sign * y[m], 0.0, None)
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (yy[1:] + yy[:-1]) * np.diff(tt))])
    if cum[-1] <= 0:
        return float("nan")
    return float(np.interp(fraction * cum[-1], cum, tt))


def covers(cluster_mask: np.ndarray, times: np.ndarray, latencies_ms, tol_ms: float) -> bool:
    """Whether a cluster includes any channel within ``tol_ms`` of one of ``latencies_ms``."""
    span = times[cluster_mask.any(axis=0)] * 1e3
    return any(np.any(np.abs(span - l) <= tol_ms) for l in latencies_ms)


def uncorrected_hits(diff: np.ndarray, alpha: float) -> np.ndarray:
    """(n_ch, n_times) mask of samples with paired |t| above the uncorrected threshold."""
    from mne.stats import ttest_1samp_no_p

    t = ttest_1samp_no_p(diff)
    return np.abs(t) > t_threshold(len(diff), alpha)


def pathway_index(diff: np.ndarray, times: np.ndarray, ch_names, roi: dict, windows: dict) -> np.ndarray:
    """Per subject, the a-priori window-mean index of a contrast ``diff`` (n_subj, n_ch, n_times)
    in uV: minus the mean over the N400 window at ``roi["n400"]`` plus the mean over the P600 window
    at ``roi["p600"]`` (``windows[k]`` in ms, inclusive). Positive = a larger N400 and P600."""
    t_ms = np.asarray(times) * 1e3
    out = np.zeros(len(diff))
    for k, sign in (("n400", -1.0), ("p600", 1.0)):
        lo, hi = windows[k]
        m = (t_ms >= lo - 1e-6) & (t_ms <= hi + 1e-6)
        out += sign * diff[:, list(ch_names).index(roi[k])][:, m].mean(-1)
    return out


def tost_p(x: np.ndarray, low: float, high: float) -> float:
    """Two one-sided t-tests of the mean of ``x`` against the equivalence bounds ``low < high``:
    the larger of the two one-sided p-values (equivalent at alpha when it is below alpha)."""
    from scipy import stats

    x = np.asarray(x, dtype=float)
    p_low = stats.ttest_1samp(x, low, alternative="greater").pvalue
    p_high = stats.ttest_1samp(x, high, alternative="less").pvalue
    return float(max(p_low, p_high))


def tost_power(sd: float, n: int, bound: float, alpha: float = 0.05) -> float:
    """Power of the one-sample TOST at bounds +-``bound`` when the true mean is 0, for ``n``
    observations of standard deviation ``sd`` (Chow, Shao & Wang 2008, sec. 3.2: the large-sample
    form with Student-t quantiles): 2 T_{n-1}(bound / SE - t_{1-alpha, n-1}) - 1, floored at 0.
    Computed from the study's own variance, it says whether one study could show equivalence at all."""
    from scipy import stats

    if not (sd > 0 and n > 1):
        return 0.0
    df = n - 1
    se = sd / np.sqrt(n)
    return float(max(0.0, 2.0 * stats.t.cdf(bound / se - stats.t.ppf(1 - alpha, df), df) - 1.0))


# --- the paper's own statistics: repeated-measures ANOVA on ROI x window mean amplitudes ---------
# The authors' analysis as their public script does it (src/rm-anova.py of
# Promise-Z5Q2SQ/Neural-Correlates-of-AI-generated-Multimodal-Hallucinations): per subject and
# condition, the mean amplitude over an ROI's electrodes and a time window (mne crop: both ends
# inclusive); per (ROI, window) cell a one-way repeated-measures ANOVA (pingouin, correction="auto")
# over TWO conditions (the committed script compares no_hallu with hallu_wrong, hallu commented out;
# the README's Table 1 reports Hallu vs NoHallu cells); no post-hoc tests and no multiple-comparison
# correction anywhere in their history: a cell is reported at p < 0.05 (*) or p < 0.001 (**).
# Ours (``fdr="authors"``, the claims' rule): the same two-condition ANOVA per cell and pair, read
# uncorrected. With two conditions it is the paired t-test (F = t^2; sphericity cannot fail).
# Ablations: ``fdr="cell"`` (the previous round's reading: a three-level omnibus per cell,
# Greenhouse-Geisser, BH-FDR over the cell's three follow-ups, gated by the omnibus) and
# ``fdr="pooled"`` (BH-FDR over all 28 omnibus tests and all 84 follow-ups).

ANOVA_PAIRS = (("detected", "correct"), ("missed", "correct"), ("detected", "missed"))


def window_means(evoked: dict, times: np.ndarray, ch_names, rois: dict, windows_ms,
                 conds=("correct", "detected", "missed")):
    """Mean amplitude (uV) per cell, subject and condition: (n_cells, n_subj, n_cond), with the cells
    as (roi, (lo, hi)) in ROI-major order. ``evoked[c]``: (n_subj, n_ch, n_times) in volts; the
    window is inclusive at both ends (as ``mne.Evoked.crop``); ROI electrodes missing from
    ``ch_names`` are skipped, an ROI with none is left out."""
    t_ms = np.asarray(times) * 1e3
    names = list(ch_names)
    cells, out = [], []
    for roi, chans in rois.items():
        idx = [names.index(c) for c in chans if c in names]
        if not idx:
            continue
        for lo, hi in windows_ms:
            m = (t_ms >= lo - 1e-6) & (t_ms <= hi + 1e-6)
            cells.append((roi, (float(lo), float(hi))))
            out.append(np.stack([evoked[c][:, idx][:, :, m].mean((1, 2)) * 1e6 for c in conds], axis=1))
    return np.stack(out), cells


def rm_anova(y: np.ndarray) -> dict:
    """One-way repeated-measures ANOVA of ``y`` (n_subj, k conditions): F, its uncorrected p and
    the Greenhouse-Geisser epsilon and corrected p (Greenhouse & Geisser 1959). For k = 2 it is the
    paired t-test (F = t^2, epsilon = 1)."""
    from scipy import stats

    y = np.asarray(y, dtype=float)
    n, k = y.shape
    grand = y.mean()
    ss_cond = n * ((y.mean(0) - grand) ** 2).sum()
    ss_subj = k * ((y.mean(1) - grand) ** 2).sum()
    ss_err = ((y - grand) ** 2).sum() - ss_cond - ss_subj
    df1, df2 = k - 1, (k - 1) * (n - 1)
    f = (ss_cond / df1) / (ss_err / df2) if ss_err > 0 else np.inf
    s = np.cov(y, rowvar=False)
    c = np.eye(k) - 1.0 / k  # double-centred covariance
    sc = c @ s @ c
    eps = float(np.trace(sc) ** 2 / (df1 * np.trace(sc @ sc))) if k > 2 else 1.0
    eps = min(1.0, max(eps, 1.0 / df1))
    return {"F": float(f), "p": float(stats.f.sf(f, df1, df2)), "eps": eps,
            "p_gg": float(stats.f.sf(f, eps * df1, eps * df2))}


def paper_anova(evoked: dict, times, ch_names, rois: dict, windows_ms, alpha: float = 0.05,
                fdr: str = "authors") -> dict:
    """The paper's analysis over every (ROI, window) cell and condition pair, with the multiplicity
    handling ``fdr``:

    * ``"authors"`` (their src/rm-anova.py): per cell and pair a one-way RM-ANOVA over the two
      conditions, its p read as it is (no omnibus, no post-hoc, no correction);
    * ``"cell"`` (ablation): the omnibus RM-ANOVA over correct / detected / missed (Greenhouse-Geisser
      p) gates paired-t follow-ups BH-FDR-corrected over the cell's three pairs;
    * ``"pooled"`` (ablation): the omnibus and the follow-ups BH-FDR-corrected over all cells.

    ``q[pair]``: per cell the p (authors) or the gated q (the larger of its own q and its cell's omnibus
    q); ``diff[pair]``: the mean difference (uV); ``q_omni``: the omnibus p / q (authors: the
    detected - correct two-condition p, the comparison of the paper's Table 1)."""
    from mne.stats import fdr_correction
    from scipy import stats

    conds = ("correct", "detected", "missed")
    y, cells = window_means(evoked, times, ch_names, rois, windows_ms, conds)
    if fdr == "authors":
        p_pair = np.array([[rm_anova(c[:, [conds.index(a), conds.index(b)]])["p"] for c in y]
                           for a, b in ANOVA_PAIRS])  # (3 pairs, n_cells): two-condition ANOVAs
        out = {"cells": cells, "p_omni": p_pair[0], "q_omni": p_pair[0], "q": {}, "diff": {}}
        for i, (a, b) in enumerate(ANOVA_PAIRS):
            out["q"][(a, b)] = p_pair[i]
            out["diff"][(a, b)] = (y[:, :, conds.index(a)] - y[:, :, conds.index(b)]).mean(1)
        return out
    p_omni = np.array([rm_anova(c)["p_gg"] for c in y])
    p_pair = np.array([[stats.ttest_rel(c[:, conds.index(a)], c[:, conds.index(b)]).pvalue for c in y]
                       for a, b in ANOVA_PAIRS])  # (3 pairs, n_cells)
    if fdr == "cell":
        q_omni = p_omni
        q_pair = np.stack([fdr_correction(p_pair[:, j], alpha)[1] for j in range(len(cells))], axis=1)
    elif fdr == "pooled":
        q_omni = fdr_correction(p_omni, alpha)[1]
        q_pair = fdr_correction(p_pair.ravel(), alpha)[1].reshape(p_pair.shape)
    else:
        raise ValueError(f"fdr must be 'authors', 'cell' or 'pooled', not {fdr!r}")
    out = {"cells": cells, "p_omni": p_omni, "q_omni": q_omni, "q": {}, "diff": {}}
    for i, (a, b) in enumerate(ANOVA_PAIRS):
        out["q"][(a, b)] = np.maximum(q_pair[i], q_omni)
        out["diff"][(a, b)] = (y[:, :, conds.index(a)] - y[:, :, conds.index(b)]).mean(1)
    return out


def anova_cell_q(res: dict, pair, roi: str, window_ms, sign: float) -> float:
    """The p (authors' rule) or gated follow-up q (ablations) of ``pair`` in the cell (roi, window), or 1 when the difference has the
    opposite sign to ``sign`` (the paper's stated direction) or the cell is absent."""
    key = (roi, (float(window_ms[0]), float(window_ms[1])))
    if key not in res["cells"]:
        return 1.0
    i = res["cells"].index(key)
    return float(res["q"][pair][i]) if sign * res["diff"][pair][i] > 0 else 1.0


def anova_signature_q(res: dict, pair, signature_cells) -> float:
    """The smallest p / gated q of ``pair`` over the paper's signature cells, each read with its own
    sign: ``signature_cells`` is a list of (roi, window_ms, sign) (the N400-like central 280-550 ms
    cell, negative; the P600-like central 550-750 ms cell, positive). A difference of the other sign
    reads 1: only a response like the verification pathway counts."""
    return min(anova_cell_q(res, pair, roi, win, sign) for roi, win, sign in signature_cells)


def detection_hits_uncorrected(diff: np.ndarray, times: np.ndarray, alpha: float, windows: dict) -> bool:
    """The uncorrected analogue of the pipeline's detection family: any sample with paired t below
    -threshold in the N400 window or above +threshold in the P600 window (any channel)."""
    from mne.stats import ttest_1samp_no_p

    t = ttest_1samp_no_p(diff)
    thr = t_threshold(len(diff), alpha)
    t_ms = np.asarray(times) * 1e3
    hit = False
    for k, sign in (("n400", -1.0), ("p600", 1.0)):
        lo, hi = windows[k]
        m = (t_ms >= lo) & (t_ms <= hi)
        hit |= bool((sign * t[:, m] > thr).any())
    return hit
