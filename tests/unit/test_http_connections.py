"""Clients that hold the gateway without using it: a connection that sends nothing, headers or a body
sent a byte at a time, more connections than the cap, a stream its client stops reading, a head just
over the limit. Each is cut by a clock or a count, in the route's dialect where a request line came."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.serving.app import create_app
from gateway.serving.edge.http_limits import BoundedHttpToolsProtocol, bounded_protocol
from tests.trickle import trickle
from tests.unit.http_harness import FakeEngine, Served, make_runtime, wait_until

TIMEOUT_S = 0.5  # the cap tests' server: its silent connections must outlast each of those tests
CLOCK_S = 0.35  # the clock scenarios and the unread stream: a 2 KiB piece every 0.05 s stays 0.3 s inside it
CAP = 5


async def _echo(request: Request) -> Response:
    return JSONResponse({"bytes": len(await request.body())})


def _open(server: Served) -> list[BoundedHttpToolsProtocol]:
    """The server's side of each connection it has accepted and not yet seen close."""
    return [conn for conn in server.server.server_state.connections if isinstance(conn, BoundedHttpToolsProtocol)]


def _fill_to_the_cap(
    server: Served, send: bytes, *, when: Callable[[BoundedHttpToolsProtocol], bool], apart_s: float = 0.0
) -> list[socket.socket]:
    """``CAP`` connections, each sending ``send``, opened one after another (``apart_s`` between them)
    once the server holds none from an earlier test; returned once the server has accepted each and
    ``when`` holds for it."""
    wait_until(lambda: not _open(server), what="the earlier tests' connections to close")
    held = []
    for count in range(1, CAP + 1):
        if count > 1:
            time.sleep(apart_s)  # not a wait: how far apart the client opens them
        conn = socket.create_connection(server.address)
        held.append(conn)
        if send:
            conn.sendall(send)
        # one by one: the server's order of age is the order they were opened in
        wait_until(lambda count=count: len(_open(server)) == count, what=f"the server to accept connection {count}")
    wait_until(lambda: all(when(conn) for conn in _open(server)), what=f"the {CAP} connections' bytes to be read")
    return held


def _protocol(timeout_s: float = TIMEOUT_S) -> type[BoundedHttpToolsProtocol]:
    return bounded_protocol(
        8192, 20, header_timeout_s=timeout_s, body_timeout_s=timeout_s, send_timeout_s=timeout_s, max_connections=CAP
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    served = Served(Starlette(routes=[Route("/v1/messages", _echo, methods=["GET", "POST"])]), http=_protocol())
    yield served
    served.stop()


def _closed_within(conn: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed ``conn`` within ``seconds``, and what it said first."""
    conn.settimeout(seconds)
    answer = b""
    try:
        while chunk := conn.recv(65536):
            answer += chunk
    except TimeoutError:
        return False, answer
    except ConnectionResetError:
        pass
    return True, answer


def _closed_each(conns: list[socket.socket], seconds: float) -> list[bool]:
    """Whether the server closed each of ``conns`` within ``seconds``, one window for all of them (one
    after another, each open one waited out its own window: 0.05 s each, 0.2 s in all for four)."""
    until = time.monotonic() + seconds
    return [_closed_within(conn, max(until - time.monotonic(), 0.001))[0] for conn in conns]


class Clocked(NamedTuple):
    """What one clock scenario saw: whether the server closed the connection, what it answered, how
    many pieces went before it answered or hung up, and the seconds from the first slow piece to the close."""

    closed: bool
    answer: bytes
    sent: int
    took: float


def _nothing_sent(conn: socket.socket) -> Clocked:
    started = time.monotonic()
    closed, answer = _closed_within(conn, 5)
    return Clocked(closed, answer, 0, time.monotonic() - started)


def _headers_slowly(conn: socket.socket) -> Clocked:
    conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    # a header line every 0.15 s: never silent, never done
    sent = trickle(conn, b"X-Slow: 1\r\n", times=8, every_s=0.15)
    closed, answer = _closed_within(conn, 5)
    return Clocked(closed, answer, sent, time.monotonic() - started)


def _body_stops(conn: socket.socket) -> Clocked:
    conn.sendall(b'POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"a": ')
    started = time.monotonic()
    closed, answer = _closed_within(conn, 5)
    return Clocked(closed, answer, 0, time.monotonic() - started)


def _body_keeps_coming(conn: socket.socket) -> Clocked:
    conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 28672\r\nConnection: close\r\n\r\n")
    started = time.monotonic()
    sent = trickle(conn, b"x" * 2048, times=14, every_s=0.05)  # 0.7 s in all, twice the timeout
    closed, answer = _closed_within(conn, 5)
    return Clocked(closed, answer, sent, time.monotonic() - started)


def _byte_at_a_time(conn: socket.socket) -> Clocked:
    conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    started = time.monotonic()
    sent = trickle(conn, b"x", times=80, every_s=0.05)  # never silent for long, never a KiB (4 s if never cut)
    closed, answer = _closed_within(conn, 5)
    return Clocked(closed, answer, sent, time.monotonic() - started)


SCENARIOS: dict[str, Callable[[socket.socket], Clocked]] = {
    "nothing sent": _nothing_sent,
    "headers slowly": _headers_slowly,
    "body stops": _body_stops,
    "body keeps coming": _body_keeps_coming,
    "a byte at a time": _byte_at_a_time,
}


@pytest.fixture(scope="module")
def clocked() -> Iterator[dict[str, Future[Clocked]]]:
    """Each clock scenario on a connection of its own, all at once (each waits on the server's clocks,
    independent of the others: one after another they took 2 s, together 0.7 s); each test reads its
    scenario's result. On a server of their own, so the cap tests' connections never share it; its
    cap is the module's, and the five scenarios are five connections: none is ever made to give way."""
    served = Served(Starlette(routes=[Route("/v1/messages", _echo, methods=["GET", "POST"])]), http=_protocol(CLOCK_S))

    def run(scenario: Callable[[socket.socket], Clocked]) -> Clocked:
        with socket.create_connection(served.address) as conn:
            return scenario(conn)

    try:
        with ThreadPoolExecutor(len(SCENARIOS)) as pool:
            yield {name: pool.submit(run, scenario) for name, scenario in SCENARIOS.items()}
    finally:
        served.stop()


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    clocked: dict[str, Future[Clocked]],
) -> None:
    seen = clocked["nothing sent"].result(timeout=30)
    assert seen.closed and seen.answer.startswith(b"HTTP/1.1 408"), seen.answer


def test_headers_sent_slowly_are_cut_by_the_header_timeout_in_the_routes_dialect(
    clocked: dict[str, Future[Clocked]],
) -> None:
    seen = clocked["headers slowly"].result(timeout=30)
    assert seen.closed and seen.answer.startswith(b"HTTP/1.1 408"), seen.answer
    assert json.loads(seen.answer.split(b"\r\n\r\n", 1)[1])["type"] == "error"  # Anthropic's shape on /v1/messages
    assert seen.took < 4


def test_a_body_that_stops_coming_is_cut_by_the_body_timeout(clocked: dict[str, Future[Clocked]]) -> None:
    seen = clocked["body stops"].result(timeout=30)
    assert seen.closed and seen.answer.startswith(b"HTTP/1.1 408"), seen.answer


def test_a_body_that_keeps_coming_is_not_cut(clocked: dict[str, Future[Clocked]]) -> None:
    seen = clocked["body keeps coming"].result(timeout=30)
    assert seen.sent == 14, f"the server hung up after {seen.sent} of 14 pieces"
    assert seen.answer.startswith(b"HTTP/1.1 200") and b'"bytes":28672' in seen.answer, seen.answer


def test_a_body_sent_a_byte_at_a_time_is_cut(clocked: dict[str, Future[Clocked]]) -> None:
    seen = clocked["a byte at a time"].result(timeout=30)
    assert seen.closed and seen.answer.startswith(b"HTTP/1.1 408"), seen.answer
    assert seen.took < 3.5  # cut by the 0.35 s body clock, with room for a loaded machine


def test_at_the_cap_the_idlest_connection_makes_room_and_a_line_is_logged(
    server: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.http")
    held = _fill_to_the_cap(server, b"", when=lambda conn: True)  # silent: they hold the cap
    try:
        with socket.create_connection(server.address) as newcomer:
            newcomer.sendall(b"GET /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            _, answer = _closed_within(newcomer, 0.4)  # answered well before the header timeout
        assert answer.startswith(b"HTTP/1.1 200"), answer
        gone = [conn for conn, closed in zip(held, _closed_each(held, 0.05), strict=True) if closed]
        assert len(gone) == 1  # one silent connection gave way, the rest are still open
        assert any("max_connections" in record.getMessage() for record in caplog.records)
    finally:
        for conn in held:
            conn.close()


def test_at_the_cap_half_sent_heads_give_way_oldest_first_to_a_new_connection(server: Served) -> None:
    """Issue 41: 1,000 connections that each sent part of a head (no key needed, a byte now and then)
    had every new connection reset for as long as they were held."""
    # each in the middle of sending its head: not idle, no request in progress; opened 10 ms apart, so
    # that the server's clock (uvloop's counts milliseconds) tells which is oldest
    head = b"GET /v1/messages HTTP/1.1\r\nHost: x\r\n"
    half = _fill_to_the_cap(server, head, when=lambda conn: conn._head_bytes > 0, apart_s=0.01)
    try:
        with socket.create_connection(server.address) as newcomer:
            newcomer.sendall(b"GET /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            _, answer = _closed_within(newcomer, 0.4)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert _closed_each(half, 0.05) == [True] + [False] * (CAP - 1)  # the oldest
    finally:
        for conn in half:
            conn.close()


def test_at_the_cap_with_every_connection_in_a_request_a_new_one_is_refused(server: Served) -> None:
    busy = _fill_to_the_cap(  # each sending its body: a request in progress is never displaced
        server,
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
        when=lambda conn: not conn._in_headers,
    )
    try:
        with socket.create_connection(server.address) as extra:
            closed, answer = _closed_within(extra, 0.3)
        assert closed and answer == b""
        assert not any(_closed_each(busy, 0.05))
    finally:
        for conn in busy:
            conn.close()


def test_a_head_is_counted_whole_even_when_it_arrives_in_one_read(server: Served) -> None:
    head = b"GET /v1/messages HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 15000 + b"\r\n\r\n"  # ~1.9x the 8 KiB cap
    with socket.create_connection(server.address) as conn:
        conn.sendall(head)
        _, answer = _closed_within(conn, 5)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]


def test_an_overlong_url_is_414_in_the_routes_dialect(server: Served) -> None:
    with socket.create_connection(server.address) as conn:
        conn.sendall(b"GET /v1/messages?q=" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        _, answer = _closed_within(conn, 5)
    assert answer.startswith(b"HTTP/1.1 414"), answer[:100]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["type"] == "error"


def test_a_malformed_request_is_a_json_400(server: Served) -> None:
    with socket.create_connection(server.address) as conn:
        conn.sendall(b"GET /v1/messages HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        _, answer = _closed_within(conn, 5)
    assert answer.startswith(b"HTTP/1.1 400") and b"application/json" in answer, answer


def test_a_stream_its_client_stops_reading_is_cut_and_its_slot_freed() -> None:
    engine = FakeEngine()
    upstream = Served(engine.app)
    runtime = make_runtime(upstream.url, max_concurrency=1, queue_limit=0)
    gateway = Served(create_app(runtime), http=bounded_protocol(send_timeout_s=CLOCK_S))
    body = json.dumps(
        {"model": "front-model", "stream": True, "messages": [{"role": "user", "content": "ENDLESS"}]}
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    try:
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(gateway.address)
        reader.sendall(request)  # and never reads a byte
        wait_until(lambda: runtime.admission.active == 1, what="the stream to take the slot")
        wait_until(engine.disconnected.is_set, what="the stalled stream to be cut", timeout_s=10)
        wait_until(lambda: runtime.admission.active == 0, what="the slot to be freed")
        reader.close()
    finally:
        gateway.stop()
        upstream.stop()


def test_the_connection_cap_fits_the_descriptor_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from gateway.serving.edge.http_limits import connection_cap

    limits = {"now": (1024, 1024)}  # systemd's default, and no room to raise it
    monkeypatch.setattr(resource, "getrlimit", lambda _which: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _which, value: limits.update(now=value))
    assert connection_cap(1000) == (1024 - 128) // 2  # each connection may need a second descriptor
    limits["now"] = (1024, 65536)  # a hard limit to raise the soft one to
    assert connection_cap(1000) == 1000 and limits["now"] == (65536, 65536)
