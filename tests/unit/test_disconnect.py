"""A client that leaves frees its engine slot and stops the engine's work, in every state: waiting in
the queue, waiting for a plain (non-streamed) answer, or reading a stream."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.serving.app import create_app
from gateway.serving.edge.disconnect import CancelOnDisconnect
from gateway.serving.runtime import Runtime
from tests.unit.http_harness import FRONTED, FakeEngine, Served, make_runtime
from tests.waiting import wait_until


def _raw_request(url: str, text: str) -> socket.socket:
    """Send a chat request and return the open socket without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": FRONTED, "messages": [{"role": "user", "content": text}]}).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


@pytest.fixture
def served() -> Iterator[tuple[FakeEngine, Runtime, Served]]:
    engine = FakeEngine()
    engine_server = Served(engine.app)
    runtime = make_runtime(engine_server.url, max_concurrency=1)
    gateway = Served(create_app(runtime))
    try:
        yield engine, runtime, gateway
    finally:
        gateway.stop()
        engine_server.stop()


def test_a_client_that_leaves_a_plain_request_stops_the_engine_and_frees_the_slot(
    served: tuple[FakeEngine, Runtime, Served],
) -> None:
    engine, runtime, gateway = served
    sock = _raw_request(gateway.url, "SLOW")
    wait_until(lambda: runtime.admission.active == 1, what="the request to be admitted")
    wait_until(lambda: bool(engine.requests_to("/v1/chat/completions")), what="the engine to get it")
    started = time.monotonic()
    sock.close()
    wait_until(engine.disconnected.is_set, what="the engine to see the gateway hang up", timeout_s=3)
    wait_until(lambda: runtime.admission.active == 0, what="the slot to be freed", timeout_s=3)
    assert time.monotonic() - started < 3


def test_a_client_that_leaves_the_queue_gives_up_its_place(served: tuple[FakeEngine, Runtime, Served]) -> None:
    engine, runtime, gateway = served
    first = _raw_request(gateway.url, "SLOW")
    wait_until(lambda: runtime.admission.active == 1, what="the first request to hold the only slot")
    # admitted is not yet sent: the count below is of the engine's requests, so the first must be there
    wait_until(lambda: len(engine.requests_to("/v1/chat/completions")) == 1, what="the first to reach the engine")
    queued = _raw_request(gateway.url, "hi")
    wait_until(lambda: runtime.admission.queued == 1, what="the second request to queue")
    queued.close()
    wait_until(lambda: runtime.admission.queued == 0, what="the queue to drop it", timeout_s=3)
    first.close()
    wait_until(lambda: runtime.admission.active == 0, what="the slot to be freed", timeout_s=3)
    assert len(engine.requests_to("/v1/chat/completions")) == 1, "the abandoned request reached the engine"


def test_a_request_that_completes_is_not_cancelled_by_the_disconnect_that_follows() -> None:
    """The receive channel reports a disconnect after every response (that is how ASGI ends a request)."""
    finished: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await asyncio.sleep(0.05)  # the app's own work before it answers, not a wait
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        finished.append("done")

    async def scenario() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": b"{}", "more_body": False}]
        answered = asyncio.Event()

        async def receive() -> dict[str, Any]:  # as a server does: disconnect once the response is out
            if messages:
                return messages.pop()
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body":
                answered.set()

        await CancelOnDisconnect(app)({"type": "http"}, receive, send)
        return sent

    sent = asyncio.run(scenario())
    assert finished == ["done"]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


def test_a_streamed_request_gets_its_own_upstream_connection(served: tuple[FakeEngine, Runtime, Served]) -> None:
    """llama-server closes a keep-alive socket after a stream without saying so; reusing it failed the
    next request, so streams never return their connection to the pool."""
    import httpx

    engine, _, gateway = served
    for stream in (True, False):
        body = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        assert httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200
    streamed, plain = engine.requests_to("/v1/chat/completions")[-2:]
    assert streamed["headers"].get("connection") == "close"
    assert plain["headers"].get("connection") != "close"


def test_a_stream_whose_client_left_before_its_first_chunk_still_frees_its_slot() -> None:
    """The response start fails (the client is gone): the body generator never starts, so only the
    response's own cleanup can free the slot and close the upstream."""
    from starlette.requests import ClientDisconnect

    from gateway.serving.transport.proxy import ClosingStream

    cleaned: list[str] = []
    started: list[bool] = []

    async def body() -> Any:
        started.append(True)
        yield b"data: {}\n\n"

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(_message: dict[str, Any]) -> None:
        raise OSError("the client hung up")

    response = ClosingStream(body(), lambda: cleaned.append("slot freed"), media_type="text/event-stream")
    with pytest.raises(ClientDisconnect):
        asyncio.run(response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send))
    assert cleaned == ["slot freed"] and not started
