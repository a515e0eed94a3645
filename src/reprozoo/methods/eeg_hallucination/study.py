"""A simulated 27-participant hallucination-verification ERP study (mne forward model).

Physiology planted (microvolts at the generator's peak electrode, times after the onset of the
description word that is correct or hallucinated):

* shared components, equal in every condition: a visual P1/N1 at occipital dipoles (O1, O2;
  +2 uV at 100 ms, -3 uV at 170 ms) and a parietal P3 (Pz, +3 uV at 300 ms);
* an N400-like negativity from a central dipole under Cz, peaking at ``n400_ms`` (Gaussian
  s.d. 45 ms), and a late positivity from a fronto-central dipole under FCz at ``p600_ms``
  (s.d. 55 ms; the paper's Table 1 reports its 550-750 ms effect in the central ROI, ** there, and
  in pre-frontal / frontal / temporal ROIs, * there, never in the parietal ROI). Their amplitudes depend on the condition:
    - ``correct`` (non-hallucinated content, accepted): baseline N400 -1 uV, P600 +0.5 uV;
    - ``detected`` (hallucination, judged wrong): N400 and P600 larger by ``effect_uv`` (per
      subject N(effect_uv, effect_sd_uv)) - the "verification pathway" of the paper;
    - ``missed`` (hallucination judged correct): exactly like ``correct`` (the paper's finding
      that misjudged hallucinations fail to trigger the verification pathway), or, with
      ``missed_fraction`` > 0 (the ``partial`` study), carrying that fraction of the subject's
      detected effect: the positive control that an equivalence test must reject.
  The ``null`` study plants ``effect_uv = 0``: the three conditions are physiologically identical.
* variability: per subject a latency shift N(0, ``subj_lat_sd_ms``) and jittered source
  position/orientation (:func:`reprozoo.data.eeg.simulate.head_model`); per trial an amplitude
  factor N(1, 0.3) and a latency jitter N(0, ``trial_lat_sd_ms``).
* noise: pink background from a volume grid of dipoles and white sensor noise
  (:func:`reprozoo.data.eeg.simulate.sensors`), slow drift (needs the high-pass), and blinks on a
  fraction of trials (frontal, 80-200 uV: artifact rejection must remove those epochs).

The continuous recording of each subject goes through mne as a real one would: ``RawArray``,
average reference, FIR band-pass, ``Epochs`` with baseline correction and peak-to-peak rejection,
then ``Epochs.average`` per condition.
"""
from __future__ import annotations

import numpy as np

from reprozoo.data.eeg.simulate import TEN_TWENTY, Planted, head_model, head_positions, sensors

CONDITIONS = ("correct", "detected", "missed")
# The late positivity's generator sits under FCz (fronto-central): the paper's Table 1 reports its 550-750 ms
# effect in the central ROI (**) and frontal / pre-frontal / temporal ROIs (*), not in the parietal one (cold
# review 4, D2: under CPz the parietal cell was significant on every seed and larger than the central one).
PLANTED = [Planted("p1n1_left", "O1", depth=0.7), Planted("p1n1_right", "O2", depth=0.7),
           Planted("p3", "Pz", depth=0.6), Planted("n400", "Cz", depth=0.6), Planted("p600", "FCz", depth=0.6)]
EFFECTS = {"n400": {"anchor": "Cz", "sign": -1.0}, "p600": {"anchor": "FCz", "sign": +1.0}}
N400_SD_S, P600_SD_S = 0.045, 0.055


def gauss(t: np.ndarray, mu: float, sd: float) -> np.ndarray:
    return np.exp(-0.5 * ((t - mu) / sd) ** 2)


def trial_sources(cond: str, t: np.ndarray, p: dict, subj: dict, rng: np.random.Generator,
                  effect: bool, missed_fraction: float = 0.0) -> dict[str, np.ndarray]:
    """Source time courses (uV at peak electrode) of one trial, ``t`` in seconds from onset.
    ``missed_fraction``: the share of the subject's detected effect that missed trials carry."""
    amp = max(0.0, 1.0 + 0.3 * rng.standard_normal())
    jit = subj["lat_s"] + p["trial_lat_sd_ms"] * 1e-3 * rng.standard_normal()
    share = {"detected": 1.0, "missed": float(missed_fraction)}.get(cond, 0.0)
    extra = share * subj["effect_uv"] if effect else 0.0
    p1n1 = 2.0 * gauss(t, 0.100 + jit / 4, 0.02) - 3.0 * gauss(t, 0.170 + jit / 4, 0.03)
    return {"p1n1_left": amp * p1n1, "p1n1_right": amp * p1n1,
            "p3": amp * 3.0 * gauss(t, 0.300 + jit, 0.06),
            "n400": -amp * (1.0 + extra) * gauss(t, p["n400_ms"] * 1e-3 + jit, N400_SD_S),
            "p600": amp * (0.5 + extra) * gauss(t, p["p600_ms"] * 1e-3 + jit, P600_SD_S)}


def blink_topography(ch_names) -> np.ndarray:
    """Eye-blink field: falls off with distance from the eyes (between Fp1 and Fp2), peak 1."""
    pos = head_positions(ch_names)
    eyes = head_positions(["Fp1", "Fp2"]).mean(0) + np.array([0.0, 0.02, -0.02])
    d = np.linalg.norm(pos - eyes, axis=1)
    w = np.exp(-d / 0.04)
    return w / w.max()


def trial_counts(p: dict, rng: np.random.Generator) -> dict[str, int]:
    """Trials per condition of one subject. ``n_trials = {correct, hallucinated}`` with ``miss_rate =
    [lo, hi]``: the subject misses each hallucinated word with a probability drawn from U(lo, hi)
    (variable missed counts, as in the paper, where they follow each participant's judgements);
    a subject with no missed trial gets one (the authors drop such subjects; ours never has none
    at the rates used). ``n_trials = {correct, detected, missed}``: fixed counts."""
    n = p["n_trials"]
    if "hallucinated" not in n:
        return {c: int(n[c]) for c in CONDITIONS}
    lo, hi = p["miss_rate"]
    n_missed = int(rng.binomial(int(n["hallucinated"]), rng.uniform(lo, hi)))
    n_missed = min(max(n_missed, 1), int(n["hallucinated"]) - 1)
    return {"correct": int(n["correct"]), "detected": int(n["hallucinated"]) - n_missed, "missed": n_missed}


def simulate_subject(head, s: int, p: dict, rng: np.random.Generator, effect: bool, blink_topo: np.ndarray,
                     missed_fraction: float = 0.0):
    """Continuous EEG (V) of subject ``s`` and its events array (sample, 0, condition code 1..3)."""
    sfreq = p["sfreq"]
    counts = trial_counts(p, rng)
    order = np.concatenate([[i + 1] * counts[c] for i, c in enumerate(CONDITIONS)])
    rng.shuffle(order)
    soa = p["soa_s"] + rng.uniform(0, p.get("soa_jitter_s", 0.4), len(order))
    onsets = np.round((1.0 + np.concatenate([[0.0], np.cumsum(soa[:-1])])) * sfreq).astype(int)
    n = int(onsets[-1] + 2.0 * sfreq)
    subj = {"lat_s": p["subj_lat_sd_ms"] * 1e-3 * rng.standard_normal(),
            "effect_uv": p["effect_uv"] + p["effect_sd_uv"] * rng.standard_normal()}
    names = [q.name for q in PLANTED]
    src = {k: np.zeros(n) for k in names}
    tw = np.arange(int(1.0 * sfreq)) / sfreq  # a trial's sources span 1 s after onset
    for code, i0 in zip(order, onsets):
        tr = trial_sources(CONDITIONS[code - 1], tw, p, subj, rng, effect, missed_fraction)
        for k in names:
            src[k][i0:i0 + len(tw)] += tr[k]
    x = sensors(head, s, src, n, sfreq, rng, background_uv=p["background_uv"], white_uv=p["white_uv"])
    x += p["drift_uv"] * np.linspace(-1, 1, n)[None] * rng.standard_normal((len(x), 1))  # electrode drift
    blink = rng.random(len(order)) < p["blink_rate"]
    tb = np.arange(int(0.4 * sfreq)) / sfreq
    for i0 in onsets[blink]:  # a blink somewhere inside the epoch window
        j = i0 + int(rng.uniform(-0.1, 0.6) * sfreq)
        wave = rng.uniform(80, 200) * gauss(tb, 0.2, 0.05)
        x[:, j:j + len(tb)] += blink_topo[:, None] * wave[None, : x.shape[1] - j]
    events = np.stack([onsets, np.zeros_like(onsets), order], axis=1)
    return x * 1e-6, events, int(blink.sum())


def preprocess(x_v: np.ndarray, events: np.ndarray, info, p: dict):
    """The mne ERP pipeline of one simulated subject (see :func:`preprocess_raw`)."""
    import mne

    return preprocess_raw(mne.io.RawArray(x_v, info, verbose="ERROR"), events, p)


def preprocess_raw(raw, events: np.ndarray, p: dict):
    """The mne ERP pipeline of one subject: average reference, FIR band-pass, epochs with
    baseline correction (tmin..0) and peak-to-peak rejection. Codes 1..3 = ``CONDITIONS``."""
    import mne

    raw.set_eeg_reference("average", verbose="ERROR")
    raw.filter(p["l_freq"], p["h_freq"], fir_design="firwin", verbose="ERROR")
    if abs(raw.info["sfreq"] - p["sfreq"]) > 1e-6:  # real recordings: to the analysis rate
        raw, events = raw.resample(p["sfreq"], events=events, verbose="ERROR")
    present = {c: i + 1 for i, c in enumerate(CONDITIONS) if np.any(events[:, 2] == i + 1)}
    if p.get("reject_rule", "p2p") == "p2p":  # ours: peak-to-peak on every channel, every condition
        return mne.Epochs(raw, events, event_id=present, tmin=p["tmin"], tmax=p["tmax"], baseline=(None, 0.0),
                          reject={"eeg": p["reject_uv"] * 1e-6}, preload=True, verbose="ERROR")
    # the authors' rule (src/settings.py, load_evoked_for_condition; src/rm-anova.py): |x| > 50 uV on an
    # occipital channel drops an epoch of correct or detected content; missed epochs are never dropped
    epochs = mne.Epochs(raw, events, event_id=present, tmin=p["tmin"], tmax=p["tmax"], baseline=(None, 0.0),
                        reject=None, preload=True, verbose="ERROR")
    occ = [c for c in ("O1", "O2", "Oz") if c in epochs.ch_names]
    x = epochs.get_data(picks=occ, copy=False)
    bad = np.any(np.abs(x) > p["abs_reject_uv"] * 1e-6, axis=(1, 2)) & np.isin(epochs.events[:, 2], [1, 2])
    return epochs.drop(bad, reason="absolute threshold", verbose="ERROR")


def _shuffle_splits(pool: np.ndarray, n_first: int, out: list, rng: np.random.Generator) -> None:
    """For each shuffle slot of ``out``, a within-subject label shuffle of the epochs ``pool``
    (n_epochs, n_ch, n_times): the averages of a random ``n_first`` epochs and of the rest (numpy
    means, the same numbers as ``Epochs.average`` of those epochs, at a fraction of its cost)."""
    for first, rest in out:
        perm = rng.permutation(len(pool))
        first.append(pool[perm[:n_first]].mean(0))
        rest.append(pool[perm[n_first:]].mean(0))


def simulate_study(p: dict, rng: np.random.Generator, head=None, effect: bool = True, n_shuffles: int = 0,
                   missed_fraction: float = 0.0, n_dvm_shuffles: int = 0) -> dict:
    """All subjects of one study: per-condition evoked averages, single trials, ground truth.

    Returns arrays in volts: ``evoked[cond]`` (n_subj, n_ch, n_times); ``trials`` (n_trials,
    n_ch, n_times) with ``labels`` (condition codes) and ``groups`` (subject index); the truth of
    each planted effect (``true_latency_ms``, ``true_peak_ch``: largest |value| of the noise-free
    grand-average topography after average reference; the dipoles point outward, so it is positive); the rejected-epoch count.
    ``shuffled``: ``n_shuffles`` within-subject splits of the correct + detected trials into groups of the
    detected and correct sizes; ``dvm_shuffled``: ``n_dvm_shuffles`` such splits of detected + missed (the
    null of the detected-vs-missed test, with its unequal trial counts).
    """
    ch_names = list(p.get("ch_names", TEN_TWENTY))
    n_subj = p["n_subjects"]
    if head is None:
        head = head_model(ch_names, PLANTED, n_subj, rng)
    info = head.info(p["sfreq"])
    topo = blink_topography(ch_names)
    ev = {c: [] for c in CONDITIONS}
    shuffled = [[[], []] for _ in range(n_shuffles)]
    dvm_shuffled = [[[], []] for _ in range(n_dvm_shuffles)]
    trials, labels, groups, n_rej, n_blink = [], [], [], 0, 0
    for s in range(n_subj):
        x, events, nb = simulate_subject(head, s, p, rng, effect, topo, missed_fraction)
        epochs = preprocess(x, events, info, p)
        n_rej += len(events) - len(epochs)
        n_blink += nb
        for c in CONDITIONS:
            ev[c].append(epochs[c].average().data)
        n_det = len(epochs["detected"])
        x_ep, lab = epochs.get_data(copy=False), epochs.events[:, 2]
        if shuffled:  # the pools in the order epochs[["correct", "detected"]] gives them (by time)
            _shuffle_splits(x_ep[np.isin(lab, [1, 2])], n_det, shuffled, rng)
        if dvm_shuffled:
            _shuffle_splits(x_ep[np.isin(lab, [2, 3])], n_det, dvm_shuffled, rng)
        trials.append(x_ep)
        labels.append(lab)
        groups.append(np.full(len(epochs), s))
    truth = {}
    for k, e in EFFECTS.items():
        t = np.mean([tp[k] for tp in head.topographies], axis=0)
        t = t - t.mean()  # average reference
        truth[k] = {"true_latency_ms": float(p[f"{k}_ms"]), "true_peak_ch": ch_names[int(np.argmax(t))],
                    "anchor": e["anchor"]}
    return {"ch_names": ch_names, "sfreq": float(p["sfreq"]), "times": epochs.times.copy(),
            "evoked": {c: np.stack(v) for c, v in ev.items()},
            "shuffled": np.array(shuffled).reshape(n_shuffles, 2, n_subj, len(ch_names), len(epochs.times)),
            "dvm_shuffled": np.array(dvm_shuffled).reshape(n_dvm_shuffles, 2, n_subj, len(ch_names), len(epochs.times)),
            "trials": np.concatenate(trials).astype(np.float32),
            "labels": np.concatenate(labels), "groups": np.concatenate(groups), "truth": truth,
            "n_rejected": n_rej, "n_blinks": n_blink, "n_epochs": int(sum(len(g) for g in groups))}
