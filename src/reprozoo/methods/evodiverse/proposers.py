"""Proposers: where a new hypothesis comes from, given parents from one population.

EvoDiverse asks an LLM to mutate or recombine parent hypotheses. No model can be downloaded
here, so the default proposer is offline and symbolic (expression-tree edits for formulas,
parameter perturbations for packings; ``SymbolicProposer``), and ``LLMProposer`` speaks to any
OpenAI-compatible server through the shared block ``blocks/llm_backend.py`` (set
``REPROZOO_LLM_BASE_URL`` and ``REPROZOO_LLM_MODEL``). Both take the same parents and return
a genome or None (an unusable reply costs no oracle call), so every search variant sees the
same interface and only the selection / tempering differs between variants.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ...blocks import llm_backend as lb
from .expressions import ParseError


class Proposer(Protocol):
    name: str

    def propose(self, parents: Sequence[tuple], rng: np.random.Generator):
        """parents: (genome, quality) pairs, best first; returns a new genome or None."""


class SymbolicProposer:
    """Offline default: crossover of the two parents with probability ``p_crossover``, else one
    mutation of the first; repeated until the task's size limits hold (at most ``tries``)."""

    name = "symbolic"

    def __init__(self, task, p_crossover: float = 0.3, tries: int = 8):
        self.task, self.p_crossover, self.tries = task, p_crossover, tries

    def propose(self, parents, rng):
        for _ in range(self.tries):
            if len(parents) > 1 and rng.random() < self.p_crossover:
                g = self.task.crossover(parents[0][0], parents[1][0], rng)
            else:
                g = self.task.mutate(parents[0][0], rng)
            if self.task.valid(g):
                return g
        return None


class LLMProposer:
    """A language model writes the child from a prompt listing the parents and their scores."""

    def __init__(self, task, backend: lb.Backend, temperature: float = 0.8, max_tokens: int = 400):
        self.task, self.backend = task, backend
        self.temperature, self.max_tokens = temperature, max_tokens
        self.calls = self.failures = 0
        self.name = f"llm:{backend.name}"

    def messages(self, parents) -> list[dict]:
        listing = "\n".join(f"{i + 1}. score {q:.3f}: {self.task.to_text(g)}" for i, (g, q) in enumerate(parents))
        return [
            {"role": "system", "content": "You are a scientist proposing hypotheses for an evolutionary search."},
            {"role": "user", "content": f"{self.task.describe()}\n\nParent hypotheses:\n{listing}\n\n"
                                        "Propose ONE new hypothesis that mutates or combines the parents. "
                                        "Reply with the hypothesis only, on the last line."},
        ]

    def propose(self, parents, rng):
        self.calls += 1
        reply = self.backend.complete(self.messages(parents), temperature=self.temperature,
                                      max_tokens=self.max_tokens, seed=int(rng.integers(2**31)))
        try:
            g = self.task.parse(reply)
        except ParseError:
            self.failures += 1
            return None
        return g if self.task.valid(g) else None


class _Offline:
    """Marker passed to ``backend_from_env``: comes back unchanged when no server is configured."""

    name = "offline"

    def complete(self, messages, **kw):  # pragma: no cover - never called
        raise RuntimeError("the offline marker is not a model")


def make_proposer(task, mode: str = "auto", p_crossover: float = 0.3, temperature: float = 0.8) -> Proposer:
    """``auto``: the LLM if $REPROZOO_LLM_BASE_URL is set, else symbolic; ``offline``; ``llm``."""
    if mode == "offline":
        return SymbolicProposer(task, p_crossover)
    marker = _Offline()
    backend = lb.backend_from_env(marker)
    if backend is marker:
        if mode == "llm":
            raise lb.BackendError(f"proposer 'llm' needs ${lb.ENV_URL} and ${lb.ENV_MODEL}")
        return SymbolicProposer(task, p_crossover)
    return LLMProposer(task, backend, temperature=temperature)
