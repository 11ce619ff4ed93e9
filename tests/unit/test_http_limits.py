"""Memory before the key: a request's line and headers are capped in bytes and in number (431, then
the connection is closed), whether or not they are ever finished, before any key is checked."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.serving.edge.http_limits import bounded_protocol
from gateway.serving.edge.middleware import ApiKeys
from tests.served_thread import WakeableServer
from tests.waiting import wait_until

MAX_BYTES = 8192
MAX_HEADERS = 20


async def _ok(_request: Request) -> Response:
    return JSONResponse({"ok": True})


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    app = ApiKeys(Starlette(routes=[Route("/v1/models", _ok), Route("/v1/messages", _ok)]), ["sk-key"])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", ws="none", http=bounded_protocol(MAX_BYTES, MAX_HEADERS)
    )
    server = WakeableServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn to start")
    yield sock.getsockname()
    server.stop()
    thread.join(timeout=10)
    sock.close()


def _exchange(address: tuple[str, int], *parts: bytes) -> bytes:
    """Send the parts (stopping if the server hangs up) and read the answer until the server closes."""
    with socket.create_connection(address, timeout=5) as conn:
        try:
            for part in parts:
                conn.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


def test_headers_within_the_limits_reach_the_app(address: tuple[str, int]) -> None:
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-key\r\nConnection: close\r\n\r\n"
    assert _exchange(address, head).startswith(b"HTTP/1.1 200")


def test_an_unfinished_header_beyond_the_byte_limit_is_431_before_the_key(address: tuple[str, int]) -> None:
    endless = [b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: "] + [b"a" * 4096] * 64  # 256 KiB, never ended
    answer = _exchange(address, *endless)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    assert b"request_header_fields_too_large" in answer


def test_the_431_is_in_the_routes_dialect_when_the_path_came(address: tuple[str, int]) -> None:
    endless = [b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Pad: "] + [b"a" * 4096] * 8
    answer = _exchange(address, *endless)
    assert answer.startswith(b"HTTP/1.1 431") and b'"type": "error"' in answer, answer


def test_too_many_headers_is_431(address: tuple[str, int]) -> None:
    many = b"".join(b"X-H%d: v\r\n" % n for n in range(MAX_HEADERS + 5))
    answer = _exchange(address, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]


def test_the_limit_counts_each_request_of_a_kept_alive_connection_afresh(address: tuple[str, int]) -> None:
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-key\r\nX-Pad: " + b"a" * 5000 + b"\r\n\r\n"
    last = head.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    answer = _exchange(address, head, head, last)  # 3 x 5 KB: each under the limit, together over it
    assert answer.count(b"HTTP/1.1 200") == 3, answer[:300]
