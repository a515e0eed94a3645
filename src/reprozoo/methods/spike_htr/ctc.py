"""CTC decoding and the character error rate, kept apart from the networks so that tests can
check them on known strings.

Greedy (best-path) decoding, no language model, no lexicon (as in the paper): take the argmax
class per width position, merge consecutive repeats, drop the blank (class 0). A blank between
two equal characters is what lets CTC emit a doubled character ("1 _ 1" -> "11", "1 1" -> "1").

CER = Σ_lines Levenshtein(pred, ref) / Σ_lines |ref|  (insertions, deletions and substitutions
cost 1; corpus-level, as IAM/READ results are reported).
"""
from __future__ import annotations

from typing import Sequence


def greedy_collapse(best_path: Sequence[int], blank: int = 0) -> list[int]:
    """Merge repeats, then remove blanks."""
    out, prev = [], None
    for c in best_path:
        c = int(c)
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return out


def greedy_decode(log_probs, lengths, blank: int = 0) -> list[list[int]]:
    """``log_probs`` (B, L, K+1) torch tensor, ``lengths`` (B,): label sequences (classes 1..K)."""
    best = log_probs.argmax(-1).cpu().numpy()
    return [greedy_collapse(best[i, :int(n)], blank) for i, n in enumerate(lengths)]


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance by the two-row dynamic programme."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def cer(preds: Sequence[Sequence], refs: Sequence[Sequence]) -> float:
    """Corpus character error rate (total edits over total reference characters)."""
    edits = sum(edit_distance(p, r) for p, r in zip(preds, refs))
    return edits / max(1, sum(len(r) for r in refs))
