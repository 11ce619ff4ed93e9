"""Wrong engine output gets a 502 in the dialect's shape, never a 500 or a cut stream (issue 41, item 5;
issue 47, item 6: an engine's non-JSON 500 in every dialect, a stream ended without ``[DONE]``), and a
client's lone surrogate is its own 400 rather than the gateway's 500 when it is echoed back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.dialects.chat_fixups import ChatStreamFixer
from gateway.serving.wire.error_shapes import ApiError
from tests.unit.http_harness import FRONTED, FakeEngine, Served, make_runtime, sse_events

NATIVE = frozenset({"include_usage"})  # Responses and Messages translated by the gateway
DEEP = "[" * 1100 + "]" * 1100


class Answers:
    """An engine that answers every chat request with ``body`` (raw JSON text, so it can be anything)."""

    def __init__(self) -> None:
        self.body = "{}"
        self.stream: list[bytes] = []

    async def chat(self, request: Request) -> Response:
        if (await request.json()).get("stream"):
            return StreamingResponse(iter(self.stream), media_type="text/event-stream")
        return Response(self.body, media_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[Answers, str]]:
    answers = Answers()
    served = Served(Starlette(routes=[Route("/v1/chat/completions", answers.chat, methods=["POST"])]))
    yield answers, served.url
    served.stop()


def _completion(message: Any) -> str:
    return json.dumps(
        {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    )


WRONG = {
    "message-a-string": _completion("abc"),
    "tool-calls-not-objects": _completion({"role": "assistant", "tool_calls": [1, 2]}),
    "arguments-an-object-of-lists": _completion(
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": [[1]]}}]}
    ),
    "name-a-number": _completion({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 7}}]}),
    "content-an-object": _completion({"role": "assistant", "content": {"text": "hi"}}),
    "a-lone-surrogate": _completion({"role": "assistant", "content": "ok \ud800"}),
}


@pytest.mark.parametrize("body", WRONG.values(), ids=WRONG.keys())
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_a_wrongly_typed_answer_is_a_502_in_the_dialect(upstream: tuple[Answers, str], body: str, path: str) -> None:
    answers, url = upstream
    answers.body = body
    request = {"model": FRONTED, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/responses":
        request = {"model": FRONTED, "input": "hi"}
    with TestClient(create_app(make_runtime(url, native=NATIVE)), raise_server_exceptions=False) as client:
        answer = client.post(path, json=request)
    assert answer.status_code == 502, answer.text[:300]
    shape = answer.json()
    assert shape["type"] == "error" if path == "/v1/messages" else "message" in shape["error"]


@pytest.mark.parametrize("chunk", [b'data: {"choices": {"0": 1}}\n\n', b'data: {"choices": [{"delta": "abc"}]}\n\n'])
def test_a_passed_through_stream_whose_chunk_has_the_wrong_types_ends_with_an_error(chunk: bytes) -> None:
    fixer = ChatStreamFixer(mirror=None, usage_prompt_tokens=5)  # include_usage synthesized by the gateway
    assert fixer.feed(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n')
    with pytest.raises(ApiError) as refused:  # the proxy writes it as the stream's error event
        fixer.feed(chunk)
    assert refused.value.status == 502


def test_a_translated_stream_with_a_string_delta_ends_with_its_dialects_error_event(
    upstream: tuple[Answers, str],
) -> None:
    answers, url = upstream
    answers.stream = [b'data: {"choices": [{"index": 0, "delta": "abc"}]}\n\n', b"data: [DONE]\n\n"]
    request = {"model": FRONTED, "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(make_runtime(url, native=NATIVE))) as client:
        answer = client.post("/v1/messages", json=request)
    events = sse_events(answer.text)
    assert events[-1][0] == "error" and "malformed" in events[-1][1]["error"]["message"]


def test_arguments_nested_1100_deep_are_a_502_in_messages(upstream: tuple[Answers, str]) -> None:
    """Messages parses the arguments into ``input``: past the recursion limit that was a 500."""
    answers, url = upstream
    answers.body = _completion(
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": DEEP}}]}
    )
    request = {"model": FRONTED, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(make_runtime(url, native=NATIVE)), raise_server_exceptions=False) as client:
        answer = client.post("/v1/messages", json=request)
    assert answer.status_code == 502 and answer.json()["type"] == "error", answer.text[:300]


@pytest.mark.parametrize("field", ["instructions", "metadata"])
def test_a_lone_surrogate_from_the_client_is_its_400(upstream: tuple[Answers, str], field: str) -> None:
    _, url = upstream
    value = '"a \\udc80 b"' if field == "instructions" else '{"k": "\\ud83d"}'
    body = f'{{"model": "{FRONTED}", "input": "hi", "{field}": {value}}}'
    paired = f'{{"model": "{FRONTED}", "input": "\\ud83d\\ude00", "instructions": "x"}}'  # an emoji, escaped
    with TestClient(create_app(make_runtime(url, native=NATIVE))) as client:
        refused = client.post("/v1/responses", content=body, headers={"content-type": "application/json"})
        fine = client.post("/v1/responses", content=paired, headers={"content-type": "application/json"})
    assert refused.status_code == 400 and "surrogate" in refused.json()["error"]["message"]
    assert fine.status_code != 400, fine.text[:200]


def test_a_number_json_cannot_write_back_passes_as_the_engine_wrote_it(upstream: tuple[Answers, str]) -> None:
    """1e400 parses to infinity; re-encoded (naming the fronted model, completing the shape) it went out as
    ``Infinity``, which is not JSON."""
    answers, url = upstream
    message = {"role": "assistant", "content": "ok"}
    answers.body = _completion(message).replace('"index": 0', '"index": 0, "x": 1e400')
    with TestClient(create_app(make_runtime(url, native=NATIVE))) as client:
        answer = client.post(
            "/v1/chat/completions", json={"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
        )
    assert answer.status_code == 200 and "Infinity" not in answer.text and "1e400" in answer.text
    fixer = ChatStreamFixer(mirror="reasoning", usage_prompt_tokens=None)
    out = fixer.feed(b'data: {"choices": [{"delta": {"reasoning": "r"}}], "x": 1e400}\n\n')
    assert b"Infinity" not in out and b"1e400" in out


# -- issue 47, item 6: every dialect answers wrong engine output the same way ----------------------------
DIALECTS = {
    "/v1/chat/completions": {"model": FRONTED, "max_tokens": 8, "messages": [{"role": "user", "content": "CUE"}]},
    "/v1/messages": {"model": FRONTED, "max_tokens": 8, "messages": [{"role": "user", "content": "CUE"}]},
    "/v1/responses": {"model": FRONTED, "input": "CUE"},
}


def _cued(path: str, cue: str, **extra: Any) -> dict[str, Any]:
    return json.loads(json.dumps(DIALECTS[path]).replace("CUE", cue)) | extra


def _full_shape(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The error object, once its dialect's every field is checked."""
    if path == "/v1/messages":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["error"]["type"] == "api_error"
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["type"] == "server_error" and body["error"]["code"] == "backend_malformed_answer"
    return dict(body["error"])


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
@pytest.mark.parametrize("path", list(DIALECTS))
def test_an_engine_500_that_is_not_json_is_a_502_in_each_dialects_full_shape(
    engine: FakeEngine, engine_url: str, path: str, stream: bool
) -> None:
    """A crashed server's HTML page with status 500 was a 500 on Messages and Responses (502 on chat),
    and Responses' body had neither ``type`` nor ``code``."""
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE)), raise_server_exceptions=False) as client:
        answer = client.post(path, json=_cued(path, "HTML500", stream=stream))
    assert answer.status_code == 502, answer.text[:300]
    assert "not JSON" in _full_shape(path, answer.json())["message"] and "/srv/engine" not in answer.text


def test_an_engine_error_without_type_gets_every_openai_field_on_responses(engine: FakeEngine, engine_url: str) -> None:
    with TestClient(create_app(make_runtime(engine_url, native=NATIVE))) as client:
        busy = client.post("/v1/responses", json=_cued("/v1/responses", "BUSY"))  # {"error": {"message": "busy"}}
    assert busy.status_code == 429
    assert busy.json() == {"error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": None}}


@pytest.mark.parametrize("path", list(DIALECTS))
def test_a_stream_the_engine_ends_without_done_ends_with_the_dialects_error_event(
    engine: FakeEngine, engine_url: str, path: str
) -> None:
    """Content and a finish reason, then the end of the stream without ``[DONE]`` (nor the usage chunk
    before it): it was cut short, and the client read it as complete."""
    runtime = make_runtime(engine_url, native=NATIVE)
    with TestClient(create_app(runtime)) as client:
        cut = client.post(path, json=_cued(path, "NODONE", stream=True, stream_options={"include_usage": True}))
        whole = client.post(path, json=_cued(path, "hi", stream=True, stream_options={"include_usage": True}))
    name, last = sse_events(cut.text)[-1]
    assert cut.text.endswith("\n\n"), cut.text[-200:]
    if path == "/v1/chat/completions":
        assert name is None and last["error"]["code"] == "backend_stream_incomplete", cut.text[-300:]
    elif path == "/v1/messages":
        assert name == "error" and "[DONE]" in last["error"]["message"], cut.text[-300:]
    else:
        assert name == "response.failed" and "[DONE]" in last["response"]["error"]["message"], cut.text[-300:]
    ends = {"/v1/chat/completions": None, "/v1/messages": "message_stop", "/v1/responses": "response.completed"}
    assert sse_events(whole.text)[-1][0] == ends[path] and "Hello" in cut.text  # a whole stream ends as it did
    assert (runtime.admission.active, runtime.admission.queued) == (0, 0)
