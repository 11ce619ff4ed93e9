"""The second hardening round, on the request path: bodies whose cost is bounded before parsing, JSON
that must stay JSON, browsers kept out, and upstream faults that must never read as a success."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.dialects import request_shapes as shapes
from gateway.serving.edge import request_body
from gateway.serving.runtime import Runtime
from tests.unit.http_harness import FRONTED, FakeEngine, make_runtime, sse_events

JSON = {"content-type": "application/json"}
CHAT = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": FRONTED, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": FRONTED, "input": "hi"}


@contextmanager
def _gateway(runtime: Runtime, **kwargs: Any) -> Iterator[TestClient]:
    with TestClient(create_app(runtime), raise_server_exceptions=False, **kwargs) as client:
        yield client
    assert (runtime.admission.active, runtime.admission.queued) == (0, 0), "an admission slot leaked"


def _cued(path: str, cue: str, **extra: Any) -> dict[str, Any]:
    if path == "/v1/responses":
        return {**RESPONSES, "input": cue, **extra}
    base = MESSAGES if path == "/v1/messages" else CHAT
    return {**base, "messages": [{"role": "user", "content": cue}], **extra}


# -- 1: a body's cost is bounded before it is parsed ------------------------------------------------------------
def test_a_flood_of_tiny_messages_is_refused_before_parsing(
    served_engine: tuple[FakeEngine, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    real_loads = request_body.exact_json.loads

    def counting_loads(text: str, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return real_loads(text, **kwargs)

    monkeypatch.setattr(request_body.exact_json, "loads", counting_loads)
    flood = json.dumps({"model": FRONTED, "messages": [{"role": "user", "content": "a"}] * 300_000}).encode()
    fits = {"model": FRONTED, "messages": [{"role": "user", "content": "a"}] * 500}
    with _gateway(make_runtime(served_engine[1], max_body_bytes=32 << 20)) as client:
        answer = client.post("/v1/chat/completions", content=flood, headers=JSON)
        assert not parsed  # refused on the count, before json.loads built 300,000 objects
        counted = client.post("/v1/messages/count_tokens", json=fits)
    assert answer.status_code == 413 and "max_body_elements" in answer.json()["error"]["message"]
    assert counted.status_code == 200 and parsed


class _Arrived:
    """A request whose body is all there (read without waiting, as a fast client's would be)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.headers: dict[str, str] = {}

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.body


def test_large_bodies_are_parsed_one_per_turn_of_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three large bodies that arrive together are not parsed back to back: the loop polls its sockets
    (answers /health) between any two. Small bodies do not wait for that turn."""
    turns = 0
    parsed_at: dict[int, list[int]] = {}
    real_parse = request_body.parse_object

    def recording_parse(body: bytes, max_elements: int) -> Any:
        parsed_at.setdefault(len(body) >= request_body.LARGE_BODY_BYTES, []).append(turns)
        return real_parse(body, max_elements)

    monkeypatch.setattr(request_body, "parse_object", recording_parse)
    large = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * request_body.LARGE_BODY_BYTES}]})
    small = json.dumps(CHAT)

    async def scenario() -> None:
        nonlocal turns
        reader = request_body.BodyReader(64 << 20)

        async def ticker() -> None:  # counts the loop's turns
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        bodies = [large, large, small, large]
        read = await asyncio.gather(*(reader.read(_Arrived(b.encode()), shapes.ChatCompletionRequest) for b in bodies))
        ticking.cancel()
        assert [len(body) for body, _ in read] == [len(b) for b in bodies]

    asyncio.run(scenario())
    assert len(parsed_at[True]) == 3 and len(set(parsed_at[True])) == 3, parsed_at
    assert parsed_at[False][0] <= min(parsed_at[True])  # the small body did not queue behind them


# -- 8, 12: JSON stays JSON ------------------------------------------------------------------------------------
@pytest.mark.parametrize("number", ["1e999", "-1e400"])
def test_a_number_that_overflows_to_infinity_is_400_not_forwarded(
    engine: FakeEngine, number: str, served_engine: tuple[FakeEngine, str]
) -> None:
    raw = json.dumps({**CHAT, "model": "alias"}).replace('"model"', f'"temperature": {number}, "model"', 1)
    with _gateway(make_runtime(served_engine[1])) as client:
        answer = client.post("/v1/chat/completions", content=raw.encode(), headers=JSON)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json", answer.text
    assert not engine.seen


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig", "utf-32"])
def test_a_body_that_is_not_plain_utf8_is_400(
    engine: FakeEngine, encoding: str, served_engine: tuple[FakeEngine, str]
) -> None:
    with _gateway(make_runtime(served_engine[1])) as client:
        answer = client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(encoding), headers=JSON)
    assert answer.status_code == 400 and "UTF" in answer.json()["error"]["message"], answer.text
    assert not engine.seen


# -- 5: browsers ------------------------------------------------------------------------------------------------
def test_a_page_cannot_post_text_plain(engine: FakeEngine, served_engine: tuple[FakeEngine, str]) -> None:
    with _gateway(make_runtime(served_engine[1])) as client:
        answer = client.post("/v1/chat/completions", content=json.dumps(CHAT), headers={"content-type": "text/plain"})
        anthropic = client.post("/v1/messages", content=json.dumps(MESSAGES), headers={"content-type": "text/plain"})
    assert answer.status_code == 415 and "application/json" in answer.json()["error"]["message"]
    assert anthropic.status_code == 415 and anthropic.json()["type"] == "error"
    assert not engine.seen


def test_a_cross_origin_request_is_refused_unless_its_origin_is_allowed(served_engine: tuple[FakeEngine, str]) -> None:
    evil = {"origin": "http://evil.example", **JSON}
    with _gateway(make_runtime(served_engine[1])) as client:
        refused = client.post("/v1/chat/completions", json=CHAT, headers=evil)
        status = client.get("/status", headers={"origin": "http://evil.example"})
        same_origin = client.get("/status", headers={"origin": "http://testserver"})
    assert refused.status_code == 403 and "cors_allow_origins" in refused.json()["error"]["message"]
    assert status.status_code == 403 and same_origin.status_code == 200
    runtime = make_runtime(served_engine[1])
    runtime.cors_allow_origins = ("http://evil.example",)
    with _gateway(runtime) as client:
        allowed = client.post("/v1/chat/completions", json=CHAT, headers=evil)
        preflight = client.options("/v1/chat/completions", headers={**evil, "access-control-request-method": "POST"})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://evil.example"
    assert preflight.status_code == 204


def test_without_keys_a_rebound_host_name_is_refused(served_engine: tuple[FakeEngine, str]) -> None:
    with _gateway(make_runtime(served_engine[1]), base_url="http://attacker.example:8000") as client:
        rebound = client.get("/status")
        health = client.get("/health")
    with _gateway(make_runtime(served_engine[1]), base_url="http://127.0.0.1:8000") as client:
        by_address = client.get("/status")
    with _gateway(make_runtime(served_engine[1], api_keys=("k",)), base_url="http://gw.example") as client:
        keyed = client.get("/status", headers={"authorization": "Bearer k"})
    assert rebound.status_code == 403 and "allowed_hosts" in rebound.json()["error"]["message"]
    assert health.status_code == 200 and by_address.status_code == 200 and keyed.status_code == 200


# -- 6, 7, 13: a broken upstream is never a success ------------------------------------------------------------
@pytest.mark.parametrize("cue", ["STREAMJSON200", "NOFINISH", "NULLCHOICE", "LONGLINE"])
def test_a_broken_stream_ends_with_the_dialects_error_event(served_engine: tuple[FakeEngine, str], cue: str) -> None:
    with _gateway(make_runtime(served_engine[1])) as client:
        messages = client.post("/v1/messages", json=_cued("/v1/messages", cue, stream=True))
        responses = client.post("/v1/responses", json=_cued("/v1/responses", cue, stream=True))
    if messages.status_code != 200:  # refused before the stream began: a 502 in the dialect
        assert messages.status_code == 502 and messages.json()["type"] == "error"
        assert responses.status_code == 502 and "error" in responses.json()
        return
    names = [name for name, _ in sse_events(messages.text)]
    assert names[-1] == "error" and "message_stop" not in names, names
    assert [name for name, _ in sse_events(responses.text)][-1] == "response.failed"
    assert "response.completed" not in responses.text


def test_a_stream_request_answered_without_a_stream_is_502_also_when_passed_through(
    served_engine: tuple[FakeEngine, str],
) -> None:
    with _gateway(make_runtime(served_engine[1])) as client:
        chat = client.post("/v1/chat/completions", json=_cued("/v1/chat/completions", "STREAMJSON200", stream=True))
    assert chat.status_code == 502 and "without a stream" in chat.json()["error"]["message"]


@pytest.mark.parametrize("cue", ["CHOICESNULL", "CHOICESABC"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_malformed_choices_are_502_not_500(served_engine: tuple[FakeEngine, str], cue: str, path: str) -> None:
    with _gateway(make_runtime(served_engine[1])) as client:
        answer = client.post(path, json=_cued(path, cue))
    assert answer.status_code == 502, answer.text
    assert "internal gateway error" not in answer.text


def test_an_upstream_error_page_and_a_redirect_are_not_relayed(served_engine: tuple[FakeEngine, str]) -> None:
    engine = served_engine[0]
    engine.seen.clear()
    with _gateway(make_runtime(served_engine[1])) as client:
        page = client.post("/v1/chat/completions", json=_cued("/v1/chat/completions", "HTML500"))
        moved = client.post("/v1/chat/completions", json=_cued("/v1/chat/completions", "REDIRECT"))
    assert page.status_code == 502 and "/srv/engine" not in page.text and "not JSON" in page.text
    assert moved.status_code == 502 and "redirect" in moved.json()["error"]["message"]
    assert len(engine.requests_to("/v1/chat/completions")) == 2  # the redirect was not followed
