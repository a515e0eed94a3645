"""Joint token sequences, the seven Mind-Omni tasks, and their metrics.

One sequence layout for every task (positions, left to right):

    [ brain: T_b tokens | image: T_i tokens | caption: 3 words | question: 1 | answer: 1 ]

Every position has its own sub-vocabulary (brain codes, image codes, words, questions, answers)
and may also hold NONE (modality absent from this task). A task names the segments it conditions
on (visible) and the segments it generates (targets, masked by the diffusion process); all other
segments are NONE, so the model reads the task from which segments are present, masked or absent.

Metrics (all higher is better; ``score_<task>``, chance-corrected by ``chance_corrected`` below into
``cc_<task>``, is what the claims compare):
  encoding (image / caption / both -> brain): per test image, the Pearson r across voxels between
      the EXPECTED brain map (each brain position's predicted code distribution, all brain tokens
      masked, times the code centroids) and the measured continuous map (``pattern_correlation``);
      the voxel-wise r across images is recorded too;
  brain -> image: pairwise identification accuracy, the fraction of (i, j != i) for which the
      reconstruction of i correlates better with image i than with image j (chance 0.5);
  brain -> caption: word accuracy over the three caption words (digit chance 0.1);
  brain -> image + caption (generated jointly): mean of the two above;
  brain question answering: answer accuracy over all four questions per test image.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import data as D

SEGMENTS = ("brain", "image", "text", "question", "answer")
TASKS = {  # name -> (conditions, targets); order as in the paper's list
    "img2brain": (("image",), ("brain",)),
    "txt2brain": (("text",), ("brain",)),
    "imgtxt2brain": (("image", "text"), ("brain",)),
    "brain2img": (("brain",), ("image",)),
    "brain2txt": (("brain",), ("text",)),
    "brain2imgtxt": (("brain",), ("image", "text")),
    "bqa": (("brain", "question"), ("answer",)),
}


@dataclass
class Layout:
    n_brain: int        # brain tokens per map
    n_image: int        # image tokens per digit
    k_brain: int        # brain codebook size
    k_image: int        # image codebook size

    def __post_init__(self):
        sizes = {"brain": self.k_brain, "image": self.k_image, "text": len(D.CAPTION_WORDS),
                 "question": len(D.QUESTIONS), "answer": len(D.ANSWERS)}
        lengths = {"brain": self.n_brain, "image": self.n_image, "text": 3, "question": 1, "answer": 1}
        self.offset, self.span, start, pos = {}, {}, 0, 0
        for s in SEGMENTS:
            self.offset[s] = start
            start += sizes[s]
            self.span[s] = slice(pos, pos + lengths[s])
            pos += lengths[s]
        self.none_id, self.vocab, self.seq_len, self.sizes = start, start + 1, pos, sizes

    def logit_bias(self) -> np.ndarray:
        """(L, vocab): 0 where a position may emit a token of its own segment (caption slot), -inf
        elsewhere (NONE is never a target, so never emitted)."""
        b = np.full((self.seq_len, self.vocab), -np.inf, dtype=np.float32)
        for s in SEGMENTS:
            o = self.offset[s]
            b[self.span[s], o:o + self.sizes[s]] = 0.0
        # the caption's three slots have their own word lists: digit name, ink, slant
        t0, o = self.span["text"].start, self.offset["text"]
        b[t0:t0 + 3, o:o + self.sizes["text"]] = -np.inf
        for k, (lo, hi) in enumerate(D.CAPTION_SLOTS):
            b[t0 + k, o + lo:o + hi] = 0.0
        return b

    def clean_tokens(self, brain_tok, image_tok, caption, question, answers) -> np.ndarray:
        """(N, L) full sequences; ``question`` (N,) picks one question per row, its answer follows."""
        ans = answers[np.arange(len(question)), question]
        return np.concatenate([brain_tok + self.offset["brain"], image_tok + self.offset["image"],
                               caption + self.offset["text"], question[:, None] + self.offset["question"],
                               ans[:, None] + self.offset["answer"]], 1).astype(np.int64)

    def for_task(self, clean: np.ndarray, task: str) -> tuple[np.ndarray, np.ndarray]:
        """Sequences of one task: absent segments -> NONE; returns tokens and the target mask."""
        cond, tgt = TASKS[task]
        x = clean.copy()
        target = np.zeros(x.shape, dtype=bool)
        for s in SEGMENTS:
            if s in tgt:
                target[:, self.span[s]] = True
            elif s not in cond:
                x[:, self.span[s]] = self.none_id
        return x, target


def voxel_correlation(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean over voxels of the Pearson r across samples; (N, V) each. A constant voxel counts as r = 0."""
    p, t = pred - pred.mean(0), true - true.mean(0)
    den = np.sqrt((p ** 2).sum(0) * (t ** 2).sum(0))
    r = np.where(den > 0, (p * t).sum(0) / np.where(den > 0, den, 1.0), 0.0)
    return float(r.mean())


def _row_corr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, D), (M, D) -> (N, M) Pearson correlations between rows (constant rows -> 0)."""
    a = a - a.mean(1, keepdims=True)
    b = b - b.mean(1, keepdims=True)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    return (a @ b.T) / np.maximum(np.outer(na, nb), 1e-12)


def identification_accuracy(recon: np.ndarray, true: np.ndarray) -> float:
    """Pairwise identification: fraction of j != i with corr(recon_i, true_i) > corr(recon_i, true_j)."""
    c = _row_corr(recon.reshape(len(recon), -1), true.reshape(len(true), -1))
    n = len(c)
    wins = (np.diag(c)[:, None] > c).sum(1)            # the diagonal never beats itself
    return float(wins.sum() / (n * (n - 1)))


def pattern_correlation(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """(N,) per test image: the Pearson r across voxels between predicted and measured map (voxels
    z-scored over the training images; a constant prediction counts as r = 0): the encoding score
    per test image (its mean is the per-image unit the claims resample)."""
    return np.diag(_row_corr(pred.reshape(len(pred), -1), true.reshape(len(true), -1))).copy()


def identification_per_image(recon: np.ndarray, true: np.ndarray) -> np.ndarray:
    """(N,) per test image i: the fraction of j != i with corr(recon_i, true_i) > corr(recon_i, true_j);
    its mean is ``identification_accuracy``."""
    c = _row_corr(recon.reshape(len(recon), -1), true.reshape(len(true), -1))
    return (np.diag(c)[:, None] > c).sum(1) / (len(c) - 1)


def pixel_correlation(recon: np.ndarray, true: np.ndarray) -> float:
    """Mean over images of the Pearson r between reconstruction and image."""
    c = _row_corr(recon.reshape(len(recon), -1), true.reshape(len(true), -1))
    return float(np.diag(c).mean())


# --- chance levels and chance-corrected scores ---------------------------------------------------------
# Uniform guessing among the tokens a position may emit (the logit bias restricts each caption slot to
# its own word list; a question's answer is among its own options). Encoding: voxel r of an unrelated
# prediction is 0 (voxel-wise or per image across voxels). brain -> image: pairwise identification 0.5. brain -> caption: the mean over the three
# slots of 1 / (slot size): (1/10 + 1/2 + 1/3) / 3. BQA: the mean over the four questions of
# 1 / (options): which digit (1/10), even / greater than four / thick ink (1/2 each).
WORD_CHANCE = float(np.mean([1.0 / (hi - lo) for lo, hi in D.CAPTION_SLOTS]))
BQA_CHANCE = float(np.mean([1.0 / 10, 0.5, 0.5, 0.5]))
CHANCE = {"img2brain": 0.0, "txt2brain": 0.0, "imgtxt2brain": 0.0, "brain2img": 0.5,
          "brain2txt": WORD_CHANCE, "brain2imgtxt": 0.5 * (0.5 + WORD_CHANCE), "bqa": BQA_CHANCE}


def chance_corrected(task: str, score: float) -> float:
    """(score - chance) / (1 - chance): 0 at chance, 1 when perfect, on every task. The claims compare
    these as differences (joint minus single-task), never as ratios: a ratio of two scores near chance
    (a caption -> brain voxel r of 0.06) is dominated by its denominator."""
    c = CHANCE[task]
    return float((score - c) / (1.0 - c))
