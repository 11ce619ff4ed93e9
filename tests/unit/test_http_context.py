"""What agents read when a prompt does not fit, and how the gateway counts one (issue: real agents).

Every engine's own "too long" wording reaches agents in their dialect's canonical form (Claude Code
compacts on "prompt is too long: M tokens > N maximum", OpenAI clients on ``context_length_exceeded``);
the gateway refuses by itself only on the engine's exact count, and the usage a stream ends with is
the engine's own."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from tests.unit.http_harness import (
    ENGINE_CONTEXT,
    ENGINE_OVERFLOWS,
    FRONTED,
    FakeEngine,
    make_runtime,
    sse_events,
)

ROUTES = {
    "/v1/chat/completions": lambda text: {"model": FRONTED, "messages": [{"role": "user", "content": text}]},
    "/v1/responses": lambda text: {"model": FRONTED, "input": text},
    "/v1/messages": lambda text: {
        "model": FRONTED, "max_tokens": 100, "messages": [{"role": "user", "content": text}],
    },
}  # fmt: skip
ENGINE_WORDS = re.compile(r"available context size|exceed_context_size_error|decoder prompt|your prompt contains")


def _client(engine_url: str, **options: Any) -> TestClient:
    return TestClient(create_app(make_runtime(engine_url, **options)), raise_server_exceptions=False)


def _expected(name: str) -> tuple[int, str]:
    _answer, context, prompt = ENGINE_OVERFLOWS[name]
    return context, f"{prompt} tokens" if prompt else "more tokens than that"


@pytest.mark.parametrize("native", [False, True], ids=["translated", "engine-native"])
@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
@pytest.mark.parametrize("name", list(ENGINE_OVERFLOWS))
def test_every_engines_overflow_reaches_each_dialect_in_its_canonical_words(
    engine: FakeEngine, served_engine: tuple[FakeEngine, str], name: str, stream: bool, native: bool
) -> None:
    apis = frozenset({"include_usage", "responses", "messages"} if native else {"include_usage"})
    context, resulted = _expected(name)
    with _client(served_engine[1], native=apis) as client:
        answers = {
            path: client.post(path, json={**body(f"OVERFLOW-{name}"), "stream": stream})
            for path, body in ROUTES.items()
        }
    for path, answer in answers.items():
        assert answer.status_code == 400, (path, answer.text)
        assert not ENGINE_WORDS.search(answer.text), (path, answer.text)
    for path in ("/v1/chat/completions", "/v1/responses"):
        error = answers[path].json()["error"]
        assert error["code"] == "context_length_exceeded", path
        assert error["message"].startswith(
            f"This model's maximum context length is {context} tokens. However, your messages resulted in {resulted}."
        ), path
    anthropic = answers["/v1/messages"].json()
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "invalid_request_error"
    tokens = resulted if resulted[0].isdigit() else f"more than {context} tokens"
    assert anthropic["error"]["message"] == f"prompt is too long: {tokens} > {context} maximum"


def test_an_estimated_count_never_refuses_or_shortens_a_request(engine: FakeEngine, served_engine: tuple) -> None:
    """Without a chat-template endpoint the gateway only estimates: the engine decides."""
    long = " ".join(["word"] * ENGINE_CONTEXT)
    with _client(served_engine[1]) as client:
        chat = client.post("/v1/chat/completions", json={**ROUTES["/v1/chat/completions"](long), "max_tokens": 3000})
    assert chat.status_code == 200
    forwarded = engine.requests_to("/v1/chat/completions")[-1]["body"]
    assert forwarded["max_tokens"] == 3000


def test_tool_schemas_the_template_does_not_render_do_not_count(engine: FakeEngine, served_engine: tuple) -> None:
    """Claude Code's "Reply OK" with its tool schemas: 21,006 tokens as JSON, 3,055 as the engine renders it."""
    tools = [{"name": f"tool{i}", "description": "word " * 200, "input_schema": {"type": "object"}} for i in range(40)]
    body = {**ROUTES["/v1/messages"]("Reply OK"), "max_tokens": 32000, "tools": tools}
    with _client(served_engine[1], template_path="/apply-template") as client:
        answer = client.post("/v1/messages", json=body)
        counted = client.post("/v1/messages/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"})
    assert answer.status_code == 200, answer.text
    forwarded = engine.requests_to("/v1/chat/completions")[-1]["body"]
    assert forwarded["max_tokens"] == ENGINE_CONTEXT - 3  # clamped beside the exact prompt: "user Reply OK"
    assert counted.json() == {"input_tokens": 3}
    engine.template_renders_tools = True
    with _client(served_engine[1], template_path="/apply-template") as client:
        counted_with_tools = client.post(
            "/v1/messages/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"}
        )
    assert counted_with_tools.json()["input_tokens"] > 40 * 200


def test_a_streamed_message_ends_with_the_engines_own_prompt_count(engine: FakeEngine, served_engine: tuple) -> None:
    """message_start carries the prompt's size as the engine's template makes it ("user hello": 2), even
    for a short max_tokens; message_delta carries the engine's own final figure (11)."""
    with _client(served_engine[1], template_path="/apply-template") as client:
        answer = client.post("/v1/messages", json={**ROUTES["/v1/messages"]("hello"), "stream": True})
    events = sse_events(answer.text)
    start = next(data for name, data in events if name == "message_start")
    delta = next(data for name, data in events if name == "message_delta")
    assert start["message"]["usage"]["input_tokens"] == 2
    assert delta["usage"]["input_tokens"] == 11 and delta["usage"]["output_tokens"] == 2


def test_a_system_message_inside_the_conversation_joins_the_next_user_turn(
    engine: FakeEngine, served_engine: tuple
) -> None:
    """Claude Code (beta mid-conversation-system-2026-04-07) sends role "system" among the messages: it is
    accepted, passed as it came to an engine that speaks Messages (vLLM places it itself), and on the
    translation (templates refuse a later system turn) one after the model's answer joins the next user
    turn: folded into the leading system message it would change the prompt's first tokens, and the
    engine would prefill the whole conversation again (the opening one joins it: test_translation)."""
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": [{"type": "text", "text": "Agent types: general-purpose"}]},
        {"role": "user", "content": "second"},
    ]
    body = {"model": FRONTED, "max_tokens": 100, "system": "You are Claude Code", "messages": messages}
    with _client(served_engine[1]) as client:
        translated = client.post("/v1/messages", json=body)
        counted = client.post("/v1/messages/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"})
    with _client(served_engine[1], native=frozenset({"messages"})) as client:
        passed = client.post("/v1/messages", json=body)
    assert translated.status_code == 200 and counted.status_code == 200 and passed.status_code == 200
    chat = engine.requests_to("/v1/chat/completions")[-1]["body"]["messages"]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[0]["content"] == "You are Claude Code"
    assert chat[3]["content"] == "Agent types: general-purpose\n\nsecond"
    assert json.loads(engine.requests_to("/v1/messages")[-1]["raw"])["messages"][2]["role"] == "system"
