"""Our own generators of four neurogym tasks (neurogym itself would downgrade numpy).

Each task is a sequence of periods on a 100 ms grid (neurogym's default dt), the last of
which is the decision period. Every trial of a batch has the same length T; trials with
shorter periods start with a longer fixation period (left padding), so the decision
always sits at the end. Conventions follow neurogym:

- input 0 is the fixation cue: 1 until the decision period, 0 during it;
- output class 0 is "fixate"; classes 1.. are the choices; the target is 0 outside the
  decision period and the correct choice inside it;
- stimulus channels carry neurogym's mean activity plus white Gaussian noise of std
  ``sigma`` per 100 ms step (neurogym: sigma / sqrt(dt) with dt in ms is the same thing).

Tasks (neurogym names):

- ``pdm``  PerceptualDecisionMaking: two channels 0.5 (1 +- c d), d = +-1 the evidence
  direction, c the coherence; optional delay before the decision; choose d.
- ``ctxdm`` ContextDecisionMaking (Mante et al. 2013): two modalities, each with two
  channels as in pdm and its own direction, plus a two-channel context cue; choose the
  direction of the cued modality.
- ``dms`` DelayMatchSample: a sample on a 2-channel ring (angle 0 or pi, channels
  0.5 + 0.5 cos(theta - pref)), a delay, a test; choose "match" (1) or "non-match" (2).
- ``gonogo`` GoNogo: a go or a no-go cue on two channels, a delay, then respond (1) to go
  and keep fixating (0) to no-go.

A *condition* fixes what is sampled: coherences and period lengths (in steps). The in-
distribution (ID) condition is what the network is trained on; out-of-distribution (OOD)
conditions are unseen coherences and longer delays, as the paper's generalisation test.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_CLASSES = {"pdm": 3, "ctxdm": 3, "dms": 3, "gonogo": 2}
N_INPUTS = {"pdm": 3, "ctxdm": 7, "dms": 3, "gonogo": 3}


@dataclass
class Batch:
    """One batch of trials, time-major.

    x: (T, B, n_in) inputs; y: (T, B) target class per step; w: (T, B) loss weight per step;
    decision: (T, B) bool, the decision period; choice: (B,) the correct decision class.
    """

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    decision: np.ndarray
    choice: np.ndarray


def _durations(rng, spec, n: int) -> np.ndarray:
    """Period length in steps: an int, or [lo, hi] sampled uniformly (inclusive)."""
    if isinstance(spec, (int, np.integer)):
        return np.full(n, int(spec))
    lo, hi = spec
    return rng.integers(int(lo), int(hi) + 1, size=n)


def _period_masks(T: int, *lengths: np.ndarray) -> list[np.ndarray]:
    """Boolean (T, B) masks: fixation, then the periods of ``lengths`` in order, the last
    ending at T; the fixation period takes whatever the others leave (left padding)."""
    t = np.arange(T)[:, None]
    end = np.full(lengths[0].shape, T)
    masks = []
    for d in reversed(lengths):
        start = end - d
        masks.append((t >= start) & (t < end))
        end = start
    if (end < 1).any():
        raise ValueError(f"trial length {T} leaves no fixation step")
    masks.append(t < end)  # fixation
    return masks[::-1]


def _finish(x, masks_dec, choice, n_dec_cls_weight, sigma_channels, sigma, rng) -> Batch:
    T, B, _ = x.shape
    x[:, :, 0] = (~masks_dec).astype(np.float32)  # fixation cue off at the decision
    noise = sigma * rng.standard_normal((T, B, len(sigma_channels))).astype(np.float32)
    x[:, :, sigma_channels] += noise
    y = np.where(masks_dec, choice[None, :], 0).astype(np.int64)
    w = np.where(masks_dec, n_dec_cls_weight, 1.0).astype(np.float32)
    return Batch(x=x, y=y, w=w, decision=masks_dec, choice=choice.astype(np.int64))


def trial_length(task: str, cond: dict) -> int:
    """Steps of the longest trial the condition can draw, with at least ``fixation``
    (default 1) fixation steps before it."""
    def hi(v):
        return int(v) if isinstance(v, (int, np.integer)) else int(v[1])

    keys = {"pdm": ["stimulus", "delay", "decision"], "ctxdm": ["stimulus", "delay", "decision"],
            "dms": ["sample", "delay", "test", "decision"], "gonogo": ["stimulus", "delay", "decision"]}[task]
    return int(cond.get("fixation", 1)) + sum(hi(cond[k]) for k in keys)


def make_batch(task: str, cond: dict, n: int, rng: np.random.Generator, decision_weight: float = 5.0) -> Batch:
    """Draw ``n`` trials of ``task`` under ``cond`` (periods in 100 ms steps)."""
    T = trial_length(task, cond)
    sigma = float(cond.get("sigma", 1.0))
    if task in ("pdm", "ctxdm"):
        n_mod = 1 if task == "pdm" else 2
        stim, delay, dec = (_durations(rng, cond[k], n) for k in ("stimulus", "delay", "decision"))
        _, m_stim, _, m_dec = _period_masks(T, stim, delay, dec)
        x = np.zeros((T, n, N_INPUTS[task]), np.float32)
        cohs = np.asarray(cond["coherences"], float)
        dirs = rng.choice([-1.0, 1.0], size=(n_mod, n))
        coh = rng.choice(cohs, size=(n_mod, n))
        for m in range(n_mod):
            left, right = 0.5 * (1 + coh[m] * dirs[m]), 0.5 * (1 - coh[m] * dirs[m])
            x[:, :, 1 + 2 * m] = m_stim * left[None, :]
            x[:, :, 2 + 2 * m] = m_stim * right[None, :]
        if task == "pdm":
            relevant = dirs[0]
            noisy = [1, 2]
        else:
            ctx = rng.integers(0, 2, size=n)  # which modality is relevant
            x[:, :, 5] = (~m_dec) * (ctx == 0)[None, :]
            x[:, :, 6] = (~m_dec) * (ctx == 1)[None, :]
            relevant = np.where(ctx == 0, dirs[0], dirs[1])
            noisy = [1, 2, 3, 4]
        choice = np.where(relevant > 0, 1, 2)
        return _finish(x, m_dec, choice, decision_weight, noisy, sigma, rng)
    if task == "dms":
        sample, delay, test, dec = (_durations(rng, cond[k], n) for k in ("sample", "delay", "test", "decision"))
        _, m_sample, _, m_test, m_dec = _period_masks(T, sample, delay, test, dec)
        x = np.zeros((T, n, 3), np.float32)
        prefs = np.array([0.0, np.pi])
        th_s = rng.choice(prefs, size=n)
        match = rng.integers(0, 2, size=n).astype(bool)
        th_t = np.where(match, th_s, th_s + np.pi)
        for k, pref in enumerate(prefs):
            x[:, :, 1 + k] = (m_sample * (0.5 + 0.5 * np.cos(th_s - pref))[None, :]
                              + m_test * (0.5 + 0.5 * np.cos(th_t - pref))[None, :])
        choice = np.where(match, 1, 2)
        return _finish(x, m_dec, choice, decision_weight, [1, 2], sigma, rng)
    if task == "gonogo":
        stim, delay, dec = (_durations(rng, cond[k], n) for k in ("stimulus", "delay", "decision"))
        _, m_stim, _, m_dec = _period_masks(T, stim, delay, dec)
        x = np.zeros((T, n, 3), np.float32)
        go = rng.integers(0, 2, size=n).astype(bool)
        x[:, :, 1] = m_stim * go[None, :]
        x[:, :, 2] = m_stim * (~go)[None, :]
        choice = np.where(go, 1, 0)
        return _finish(x, m_dec, choice, decision_weight, [1, 2], sigma, rng)
    raise ValueError(f"unknown task '{task}'; known: {sorted(N_CLASSES)}")
