"""Stopping drains: queued requests get 503 + Retry-After at once, requests in flight get the grace
period, then a stream ends with an error event and a waiting request gets a 503, each in its dialect.

The gateway runs under uvicorn (its shutdown is what is tested) in front of the stand-in engine: a
"HANG" stream sends one chunk then nothing, a "SLOW" answer takes 30 s; neither finishes in time.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gateway.serving.app import create_app
from gateway.serving.dialects.model_names import ModelRoute
from gateway.serving.drain import DrainingServer
from tests.unit.http_harness import FRONTED, FakeEngine, Served, make_runtime, sse_events, wait_until

GRACE_S = 0.5  # "at once" (a few ms after the stop) and "after the grace" stay apart on a loaded machine


def _in_thread(call: Callable[[], httpx.Response], into: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        try:
            into[name] = call()
        except httpx.HTTPError as exc:
            into[name] = exc
        into[name + "_s"] = time.monotonic() - started
        into[name + "_at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_stopping_answers_the_queue_at_once_and_cuts_what_outlives_the_grace() -> None:
    engine = FakeEngine()
    upstream_server = Served(engine.app, lifespan="off")
    runtime = make_runtime(upstream_server.url, max_concurrency=2)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(create_app(runtime), log_level="warning", lifespan="on", ws="none")
    server = DrainingServer(config, runtime, GRACE_S)
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    serving.start()
    wait_until(lambda: server.started, what="the gateway to start")
    results: dict[str, Any] = {}
    stream = {"model": FRONTED, "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "HANG"}]}
    slow = {"model": FRONTED, "messages": [{"role": "user", "content": "SLOW"}]}
    queued = {"model": FRONTED, "input": "hi"}
    try:
        threads = [
            _in_thread(lambda: httpx.post(url + "/v1/messages", json=stream, timeout=20), results, "stream"),
            _in_thread(lambda: httpx.post(url + "/v1/chat/completions", json=slow, timeout=20), results, "slow"),
        ]
        wait_until(lambda: runtime.admission.active == 2, what="two requests in flight")
        threads.append(
            _in_thread(lambda: httpx.post(url + "/v1/responses", json=queued, timeout=20), results, "queued")
        )
        wait_until(lambda: runtime.admission.queued == 1, what="a queued request")
        stopped_at = time.monotonic()
        server.should_exit = True
        for thread in threads:
            thread.join(timeout=15)
        serving.join(timeout=15)
    finally:
        server.should_exit = True
        sock.close()
        upstream_server.stop()

    waited = results["queued"]
    assert waited.status_code == 503 and waited.headers["retry-after"] == "5", waited.text
    # at once: well inside the grace after the stop (how long it waited in the queue before is the machine's)
    assert "shutting down" in waited.json()["error"]["message"] and results["queued_at"] - stopped_at < GRACE_S

    slow_answer = results["slow"]
    assert slow_answer.status_code == 503 and "shutting down" in slow_answer.json()["error"]["message"]
    assert results["slow_s"] >= GRACE_S

    assert isinstance(results["stream"], httpx.Response), repr(results["stream"])
    name, last = sse_events(results["stream"].text)[-1]
    assert name == "error" and last["type"] == "error" and "shutting down" in last["error"]["message"]
    assert not serving.is_alive(), "the gateway did not finish stopping"
    assert engine.disconnected.is_set(), "the engine was not told to stop generating"


def _misaligned_engine() -> Starlette:
    """An engine whose endless stream is written in pieces that end mid-event, as reads can."""
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"y" * 3000 + b'"}}]}\n\n'

    async def chat(_request: Request) -> StreamingResponse:
        async def endless() -> AsyncIterator[bytes]:
            stream = event * 4096  # written in 4 KiB pieces: a read ends in an event nearly always
            while True:
                for start in range(0, len(stream), 4096):
                    yield stream[start : start + 4096]
                    await asyncio.sleep(0)

        return StreamingResponse(endless(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _stopped_while_streaming(engine_url: str) -> str:
    """A gateway (grace 0.1 s) stopped once a stream of ``engine_url`` has begun: the whole stream as read."""
    runtime = make_runtime(engine_url)
    runtime.route = ModelRoute(fronted=FRONTED, served=FRONTED)  # no renaming: the bytes pass as they are read
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(create_app(runtime), log_level="warning", lifespan="on", ws="none")
    server = DrainingServer(config, runtime, 0.1)
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    serving.start()
    wait_until(lambda: server.started, what="the gateway to start")
    body = {"model": FRONTED, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=20) as answer:
            read = []
            for chunk in answer.iter_raw():
                read.append(chunk)
                server.should_exit = True  # streaming: stop the gateway (the grace lets it stream on a while)
            return b"".join(read).decode()
    finally:
        serving.join(timeout=15)
        sock.close()


def test_a_stream_cut_by_a_stop_ends_with_a_readable_error_event_every_time() -> None:
    """Issue 41: the error event written after half an event ran into it; the client read content, then the end."""
    upstream_server = Served(_misaligned_engine(), lifespan="off")
    try:
        for _ in range(3):
            text = _stopped_while_streaming(upstream_server.url)
            events = [block for block in text.split("\n\n") if block.strip()]
            assert all(block.startswith("data: {") and block.endswith("}") for block in events), events[-1][-200:]
            last = json.loads(events[-1][6:])
            assert "shutting down" in last["error"]["message"]
    finally:
        upstream_server.stop()
