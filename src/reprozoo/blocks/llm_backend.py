"""Pluggable text-generation backends: an offline default and an OpenAI-compatible HTTP client.

Why a block: several language-model methods (proposers in evolutionary search, senders and
receivers in persuasion games, report writers) need "text in, text out" from a model, and none
of our machines can download one. Each method therefore ships an offline implementation of the
``Backend`` protocol (a template, a symbolic mutator, a model we train from scratch) and may be
pointed at a real model through the same interface:

    REPROZOO_LLM_BASE_URL=https://host/v1  REPROZOO_LLM_MODEL=name  REPROZOO_LLM_API_KEY=...

``backend_from_env(offline)`` returns the HTTP client when the base URL is set and ``offline``
otherwise. The API key is read from the environment at call time and never stored on the object,
logged, written to results or put in an error message (``repr`` and errors show the URL only).

The HTTP client speaks the ``/chat/completions`` endpoint (the common subset: model, messages,
temperature, max_tokens, seed) with the standard library only, a timeout and a bounded number of
retries on connection errors and 429/5xx, so a flaky server slows a run down but cannot hang it.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Protocol, Sequence

ENV_URL = "REPROZOO_LLM_BASE_URL"
ENV_MODEL = "REPROZOO_LLM_MODEL"
ENV_KEY = "REPROZOO_LLM_API_KEY"


class Backend(Protocol):
    """Anything that maps chat messages to one completion string."""

    name: str

    def complete(self, messages: Sequence[dict], *, temperature: float = 0.0,
                 max_tokens: int = 256, seed: int | None = None) -> str: ...


class BackendError(RuntimeError):
    """The remote backend failed after its retries; the message never carries the API key."""


@dataclass
class OpenAICompatible:
    """Client for an OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp, OpenAI...)."""

    base_url: str
    model: str
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 0.5
    key_env: str = ENV_KEY

    @property
    def name(self) -> str:
        return f"openai-compatible:{self.model}"

    def __repr__(self) -> str:  # the key is never part of the object; say where it comes from
        return f"OpenAICompatible(base_url={self.base_url!r}, model={self.model!r}, key from ${self.key_env})"

    def complete(self, messages: Sequence[dict], *, temperature: float = 0.0,
                 max_tokens: int = 256, seed: int | None = None) -> str:
        body = {"model": self.model, "messages": list(messages), "temperature": temperature,
                "max_tokens": max_tokens}
        if seed is not None:
            body["seed"] = int(seed)
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        last = ""
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers,
                                             method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    payload = json.loads(response.read().decode())
                return payload["choices"][0]["message"]["content"]
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code} from {url}"
                if err.code != 429 and err.code < 500:
                    break  # a 4xx other than rate limiting will not get better by retrying
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                last = f"cannot reach {url}: {getattr(err, 'reason', err)}"
            except (KeyError, IndexError, ValueError) as err:
                last = f"malformed response from {url}: {type(err).__name__}"
                break
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2 ** attempt)
        raise BackendError(f"{self.name}: {last}")


def backend_from_env(offline: Backend, *, timeout_s: float = 60.0) -> Backend:
    """The HTTP backend if ``$REPROZOO_LLM_BASE_URL`` is set, else the method's offline backend."""
    url = os.environ.get(ENV_URL, "").strip()
    if not url:
        return offline
    model = os.environ.get(ENV_MODEL, "").strip()
    if not model:
        raise BackendError(f"${ENV_URL} is set but ${ENV_MODEL} is not: name the model to call")
    return OpenAICompatible(base_url=url, model=model, timeout_s=timeout_s)
