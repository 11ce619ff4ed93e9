"""The gateway in front of the real llama-cpp-python server and Gemma 270M, through the openai SDK.

The model is a tiny base model: its words are noise, so the tests assert structure (names, chunks,
finish reasons, usage, headers), never text.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.conftest import SERVED_CONTEXT
from tests.integration.gatewayproc import GatewayProcess

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_readiness_went_from_503_to_200(gateway: GatewayProcess) -> None:
    assert gateway.ready_statuses[0] == 503, gateway.ready_statuses
    assert gateway.ready_statuses[-1] == 200
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}


def test_models_lists_fronted_name_aliases_and_the_context_in_effect(gateway: GatewayProcess) -> None:
    body = httpx.get(gateway.url + "/v1/models").json()
    ids = [card["id"] for card in body["data"]]
    assert ids[0] == "gemma-3-270m" and "gemma3-270m" in ids
    assert {card["context_length"] for card in body["data"]} == {SERVED_CONTEXT}
    # ...and it is the context the engine was really started with
    argv = gateway.status()["backend"]["argv"]
    assert argv[argv.index("--n_ctx") + 1] == str(SERVED_CONTEXT)


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gemma-3-270m", messages=MESSAGES, max_tokens=12)  # type: ignore[arg-type]
    assert reply.model == "gemma-3-270m"
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert 0 < reply.usage.completion_tokens <= 12


def test_an_alias_is_served_and_answered_under_the_fronted_name(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="GEMMA3-270M", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert reply.model == "gemma-3-270m"


def test_streaming_chat_arrives_in_several_chunks_and_ends_properly(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gemma-3-270m",
        messages=MESSAGES,
        max_tokens=16,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 3, f"expected a token-by-token stream, got {len(content_chunks)} content chunks"
    assert all(chunk.model == "gemma-3-270m" for chunk in chunks)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals and finals[-1] in ("stop", "length")


def test_raw_stream_is_sse_uncompressed_and_ends_with_done(gateway: GatewayProcess) -> None:
    request = {"model": "gemma-3-270m", "messages": MESSAGES, "max_tokens": 8, "stream": True}
    headers = {"Accept-Encoding": "gzip, br"}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=request, headers=headers, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in r.headers
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["cache-control"] == "no-cache"
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 3


def test_completions_non_streaming_and_streaming(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="gemma-3-270m", prompt="The sea is", max_tokens=6)
    assert reply.model == "gemma-3-270m" and isinstance(reply.choices[0].text, str)
    chunks = list(client.completions.create(model="gemma-3-270m", prompt="The sea is", max_tokens=6, stream=True))
    assert len(chunks) >= 3


def test_status_names_the_backend_and_hides_its_key(gateway: GatewayProcess) -> None:
    backend = gateway.status()["backend"]
    assert backend["engine"] == "llamacpp" and backend["state"] == "ready"
    argv = backend["argv"]
    assert argv[argv.index("--api_key") + 1] == "***"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_the_backend_refuses_requests_that_skip_the_gateway(gateway: GatewayProcess) -> None:
    backend_url = gateway.status()["backend"]["url"]
    answer = httpx.post(backend_url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})
    assert answer.status_code == 401
