"""The pluggable LLM backend against a fake OpenAI-compatible server on 127.0.0.1."""
import pytest

from loopback import chat_server
from reprozoo.blocks import llm_backend as lb


class Echo:
    name = "offline-echo"

    def complete(self, messages, **kw):
        return messages[-1]["content"].upper()


def test_offline_is_the_default(monkeypatch):
    monkeypatch.delenv(lb.ENV_URL, raising=False)
    backend = lb.backend_from_env(Echo())
    assert backend.complete([{"role": "user", "content": "hi"}]) == "HI"


def test_round_trip_sends_model_messages_and_key(monkeypatch):
    monkeypatch.setenv(lb.ENV_KEY, "sk-secret-123")
    with chat_server(reply=lambda body: "answer to " + body["messages"][-1]["content"]) as (url, reqs):
        monkeypatch.setenv(lb.ENV_URL, url)
        monkeypatch.setenv(lb.ENV_MODEL, "tiny")
        backend = lb.backend_from_env(Echo(), timeout_s=5)
        out = backend.complete([{"role": "user", "content": "x"}], temperature=0.7, seed=3)
    assert out == "answer to x"
    assert reqs[0]["body"]["model"] == "tiny" and reqs[0]["body"]["seed"] == 3
    assert reqs[0]["headers"]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in repr(backend) and "sk-secret" not in str(vars(backend))


def test_retries_server_errors_then_succeeds():
    with chat_server(reply=lambda b: "fine", fail_first=2) as (url, reqs):
        client = lb.OpenAICompatible(url, "m", timeout_s=5, retries=2, backoff_s=0.01)
        assert client.complete([{"role": "user", "content": "q"}]) == "fine"
    assert len(reqs) == 3


def test_gives_up_with_a_clear_error_that_hides_the_key(monkeypatch):
    monkeypatch.setenv(lb.ENV_KEY, "sk-secret-123")
    with chat_server(fail_first=99) as (url, reqs):
        client = lb.OpenAICompatible(url, "m", timeout_s=5, retries=1, backoff_s=0.01)
        with pytest.raises(lb.BackendError) as err:
            client.complete([{"role": "user", "content": "q"}])
    assert "HTTP 503" in str(err.value) and "sk-secret" not in str(err.value)
    assert len(reqs) == 2


def test_client_error_is_not_retried():
    with chat_server() as (url, reqs):
        client = lb.OpenAICompatible(url.replace("/v1", "/nope"), "m", timeout_s=5, retries=3, backoff_s=0.01)
        with pytest.raises(lb.BackendError, match="HTTP 404"):
            client.complete([{"role": "user", "content": "q"}])
    assert len(reqs) == 1


def test_url_without_model_is_a_config_error(monkeypatch):
    monkeypatch.setenv(lb.ENV_URL, "http://127.0.0.1:9/v1")
    monkeypatch.delenv(lb.ENV_MODEL, raising=False)
    with pytest.raises(lb.BackendError, match=lb.ENV_MODEL):
        lb.backend_from_env(Echo())
