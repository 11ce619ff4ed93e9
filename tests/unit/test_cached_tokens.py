"""The engine's prefix-cache hits reach the agent in its own dialect's field, streamed and not, and the
operator in the access log and /metrics: with 8 of 11 prompt tokens cached, chat says cached_tokens 8,
Responses input_tokens 11 with cached_tokens 8, Messages input_tokens 3 with cache_read_input_tokens 8
(Anthropic counts a cache read apart; Claude Code's context meter adds the two back)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from tests.unit.http_harness import FRONTED, FakeEngine, make_runtime, sse_events

PROMPT, CACHED = 11, 8  # the fake engine's prompt size, and how much of it it says was cached
NATIVE = frozenset({"include_usage"})  # llama-server: Responses and Messages translated by the gateway
CHAT = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": FRONTED, "input": "hi", "max_output_tokens": 16}
MESSAGES = {"model": FRONTED, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _usage(route: str, answer: Any, stream: bool) -> dict[str, Any]:
    """The usage an agent reads: the answer's, or the last one its stream carried."""
    if not stream:
        return dict(answer.json()["usage"])
    found = [
        data.get("usage") or (data.get("response") or {}).get("usage")
        for _, data in sse_events(answer.text)
        if isinstance(data, dict)
    ]
    usages = [usage for usage in found if usage]
    assert usages, answer.text
    return dict(usages[-1])


def _ask(client: TestClient, route: str, body: dict[str, Any], stream: bool) -> dict[str, Any]:
    payload = {**body, "stream": stream} | ({"stream_options": {"include_usage": True}} if route == "chat" else {})
    path = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}[route]
    answer = client.post(path, json=payload)
    assert answer.status_code == 200, answer.text
    return _usage(route, answer, stream)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_dialect_reports_the_engines_cached_tokens_in_its_own_field(
    engine: FakeEngine, engine_url: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    engine.cached_tokens = CACHED
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE))) as client:
        with caplog.at_level(logging.INFO, "gateway.access"):
            chat = _ask(client, "chat", CHAT, stream)
            responses = _ask(client, "responses", RESPONSES, stream)
            messages = _ask(client, "messages", MESSAGES, stream)
        metrics = client.get("/metrics").text
    assert chat["prompt_tokens"] == PROMPT and chat["prompt_tokens_details"] == {"cached_tokens": CACHED}
    assert responses["input_tokens"] == PROMPT and responses["input_tokens_details"] == {"cached_tokens": CACHED}
    assert responses["total_tokens"] == PROMPT + responses["output_tokens"]
    assert (messages["input_tokens"], messages["cache_read_input_tokens"]) == (PROMPT - CACHED, CACHED)
    assert messages["cache_creation_input_tokens"] == 0
    lines = [record for record in caplog.records if record.name == "gateway.access"]
    assert [(r.access["tokens_in"], r.access["tokens_cached"]) for r in lines] == [(PROMPT, CACHED)] * 3  # type: ignore[attr-defined]
    assert all(f"in={PROMPT} " in r.getMessage() and f"cached={CACHED} " in r.getMessage() for r in lines)
    assert f'gateway_prompt_tokens_total{{kind="reused"}} {3.0 * CACHED}' in metrics
    assert f'gateway_prompt_tokens_total{{kind="evaluated"}} {3.0 * (PROMPT - CACHED)}' in metrics
    assert f'gateway_tokens_total{{direction="in"}} {3.0 * PROMPT}' in metrics  # the whole prompt, every dialect


def test_message_start_counts_the_prompt_and_message_delta_splits_off_the_cache(
    engine: FakeEngine, engine_url: str
) -> None:
    """message_start goes out before the engine has said anything of its cache: the whole prompt as input
    (the gateway's count); message_delta then gives the engine's figures, the cached part apart."""
    engine.cached_tokens = CACHED
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE))) as client:
        answer = client.post("/v1/messages", json={**MESSAGES, "stream": True})
    events = dict((name, data) for name, data in sse_events(answer.text))
    start = events["message_start"]["message"]["usage"]
    assert start["cache_read_input_tokens"] == 0 and start["input_tokens"] > 0
    delta = events["message_delta"]["usage"]
    assert delta["input_tokens"] + delta["cache_read_input_tokens"] == PROMPT
    assert delta["cache_read_input_tokens"] == CACHED


def test_an_engine_that_says_nothing_of_its_cache_reports_none_cached(engine: FakeEngine, engine_url: str) -> None:
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE))) as client:
        messages = _ask(client, "messages", MESSAGES, False)
        responses = _ask(client, "responses", RESPONSES, True)
        metrics = client.get("/metrics").text
    assert (messages["input_tokens"], messages["cache_read_input_tokens"]) == (PROMPT, 0)
    assert responses["input_tokens_details"] == {"cached_tokens": 0}
    assert 'gateway_prompt_tokens_total{kind="reused"} 0.0' in metrics
    assert f'gateway_prompt_tokens_total{{kind="evaluated"}} {2.0 * PROMPT}' in metrics
