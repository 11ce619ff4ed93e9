"""A backend that goes silent or answers too much: the gateway gives up on the right clock and says so
in the route's dialect (a 504/502 before the headers, an error event in the middle of a stream), and
frees the request's slot.

The engine here is scripted by cue (the last user text): "HEADLESS" never sends headers; "MUTE"
sends a stream's headers and then nothing; "STALL" sends one chunk and then nothing; "HUGE" answers a
non-streamed request with 2 MiB; "EXACT" with the body of ``EXACT_ANSWER`` (to hold exactly at the
limit). Clocks are short (0.3 s) so each case takes well under a second; where the test is which clock
is read, the other clocks are long (``LONG_S``), so reading the wrong one shows as a stream that
does not end in time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.runtime import Runtime
from gateway.serving.transport.proxy import EngineClient, Timeouts
from tests.unit.http_harness import FRONTED, Served, make_runtime, sse_events

CLOCK_S = 0.3
LONG_S = 8.0
HUGE = 2 * 1024 * 1024
EXACT_ANSWER = json.dumps(
    {"id": "c", "object": "chat.completion", "created": 1, "model": FRONTED,
     "choices": [{"index": 0, "message": {"role": "assistant", "content": "y" * 1000}, "finish_reason": "stop"}]}
).encode()  # fmt: skip


def _chunk(content: str) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _scripted(request: Request) -> Response:
    payload = await request.json()
    cue = json.dumps(payload.get("messages") or payload.get("input"))
    while "HEADLESS" in cue and not await request.is_disconnected():  # until the gateway gives up
        await asyncio.sleep(0.05)
    if "HUGE" in cue:
        return JSONResponse({"choices": [{"message": {"content": "x" * HUGE}}]})
    if "EXACT" in cue:
        return Response(EXACT_ANSWER, media_type="application/json")

    async def stream() -> AsyncIterator[bytes]:
        if "MUTE" in cue:
            await asyncio.sleep(30)  # mute: the gateway's clock ends it
        yield _chunk("Hello")
        if "STALL" in cue:
            await asyncio.sleep(30)  # stalled: the gateway's clock ends it
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    routes = [Route(path, _scripted, methods=["POST"]) for path in ("/v1/chat/completions", "/v1/messages")]
    server = Served(Starlette(routes=routes), lifespan="off")
    yield server.url
    server.stop()


def _runtime(
    engine_url: str, timeouts: Timeouts | None = None, max_answer_bytes: int = HUGE // 2, **kwargs: Any
) -> Runtime:
    runtime = make_runtime(engine_url, **kwargs)
    runtime.engine_client = EngineClient(
        timeouts or Timeouts(connect_s=CLOCK_S, first_byte_s=CLOCK_S, stream_idle_s=CLOCK_S, answer_s=CLOCK_S),
        max_answer_bytes=max_answer_bytes,
    )
    return runtime


def _ask(runtime: Runtime, path: str, cue: str, *, stream: bool) -> tuple[Any, float]:
    if path == "/v1/messages":
        body: dict[str, Any] = {"model": FRONTED, "max_tokens": 10, "messages": [{"role": "user", "content": cue}]}
    else:
        body = {"model": FRONTED, "messages": [{"role": "user", "content": cue}]}
    started = time.monotonic()
    with TestClient(create_app(runtime), raise_server_exceptions=False) as client:
        answer = client.post(path, json={**body, "stream": stream})
    assert (runtime.admission.active, runtime.admission.queued) == (0, 0), "the slot was not freed"
    return answer, time.monotonic() - started


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_no_answer_at_all_is_a_504_naming_the_limit(engine_url: str, path: str) -> None:
    answer, took = _ask(_runtime(engine_url), path, "HEADLESS", stream=False)
    assert answer.status_code == 504 and took < 5, answer.text
    if path == "/v1/messages":
        assert answer.json()["error"]["type"] == "timeout_error"
        assert "request_timeout_s" in answer.json()["error"]["message"]
    else:
        assert "request_timeout_s" in answer.json()["error"]["message"]


def test_a_stream_whose_first_byte_never_comes_ends_with_an_error_event(engine_url: str) -> None:
    answer, took = _ask(_runtime(engine_url), "/v1/chat/completions", "MUTE", stream=True)
    assert answer.status_code == 200 and took < 5
    [(name, data)] = sse_events(answer.text)
    assert name is None and "first_byte_timeout_s" in data["error"]["message"]


@pytest.mark.parametrize(
    ("path", "native"),
    [("/v1/chat/completions", frozenset()), ("/v1/messages", frozenset()), ("/v1/messages", frozenset({"messages"}))],
    ids=["chat-passthrough", "messages-translated", "messages-passthrough"],
)
def test_a_stream_that_goes_silent_ends_with_an_error_event_in_the_dialect(
    engine_url: str, path: str, native: frozenset[str]
) -> None:
    answer, took = _ask(_runtime(engine_url, native=native), path, "STALL", stream=True)
    assert answer.status_code == 200 and took < 5
    events = sse_events(answer.text)
    name, last = events[-1]
    if path == "/v1/messages":
        assert name == "error" and last["type"] == "error", events
        assert "stream_idle_timeout_s" in last["error"]["message"]
    else:
        assert "Hello" in answer.text and "stream_idle_timeout_s" in last["error"]["message"], events


@pytest.mark.parametrize(
    ("path", "native"),
    [("/v1/chat/completions", frozenset()), ("/v1/messages", frozenset()), ("/v1/messages", frozenset({"messages"}))],
    ids=["chat-passthrough", "messages-translated", "messages-passthrough"],
)
def test_an_answer_too_big_to_hold_is_a_502_in_the_dialect(engine_url: str, path: str, native: frozenset[str]) -> None:
    answer, _ = _ask(_runtime(engine_url, native=native), path, "HUGE", stream=False)
    assert answer.status_code == 502, answer.text[:200]
    body = answer.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and "max_answer_bytes" in body["error"]["message"]
    else:
        assert "max_answer_bytes" in body["error"]["message"]


def test_the_silence_between_chunks_is_timed_by_the_idle_clock_not_the_first_byte_clock(engine_url: str) -> None:
    timeouts = Timeouts(connect_s=CLOCK_S, first_byte_s=LONG_S, stream_idle_s=CLOCK_S, answer_s=LONG_S)
    answer, took = _ask(_runtime(engine_url, timeouts), "/v1/chat/completions", "STALL", stream=True)
    _, last = sse_events(answer.text)[-1]
    assert "Hello" in answer.text and "stream_idle_timeout_s" in last["error"]["message"]
    assert took < LONG_S / 2, f"the idle clock ({CLOCK_S} s) was not the one read: {took:.1f} s"


def test_the_first_byte_is_timed_by_the_first_byte_clock_not_the_idle_clock(engine_url: str) -> None:
    timeouts = Timeouts(connect_s=CLOCK_S, first_byte_s=CLOCK_S, stream_idle_s=LONG_S, answer_s=LONG_S)
    answer, took = _ask(_runtime(engine_url, timeouts), "/v1/chat/completions", "MUTE", stream=True)
    [(_, data)] = sse_events(answer.text)
    assert "first_byte_timeout_s" in data["error"]["message"] and took < LONG_S / 2, took


def test_an_answer_exactly_at_the_size_limit_is_passed_whole(engine_url: str) -> None:
    runtime = _runtime(engine_url, max_answer_bytes=len(EXACT_ANSWER))
    answer, _ = _ask(runtime, "/v1/chat/completions", "EXACT", stream=False)
    assert answer.status_code == 200, answer.text[:200]
    assert answer.json()["choices"][0]["message"]["content"] == "y" * 1000
    one_short, _ = _ask(_runtime(engine_url, max_answer_bytes=len(EXACT_ANSWER) - 1), "/v1/chat/completions",
                        "EXACT", stream=False)  # fmt: skip
    assert one_short.status_code == 502 and "max_answer_bytes" in one_short.json()["error"]["message"]
