"""Bounds on what a client may send before the gateway has read its key: the request line and headers.

uvicorn's httptools protocol buffers a request's headers without limit (10 connections sending
64 MiB of unfinished header each took the gateway from 65 to 735 MB, without any key). This protocol
counts the bytes received while a request's headers are incomplete, and the headers themselves, and
answers 431 and hangs up beyond ``max_header_bytes`` / ``max_headers``: memory is bounded before any
route, key check or middleware runs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.serving.error_shapes import ApiError, shape_for


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a cap on header bytes and count (431 beyond either)."""

    max_header_bytes = 64 * 1024
    max_headers = 100

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_headers = True  # a connection starts with a request's head
        self._head_bytes = 0
        self._head_count = 0
        self._heads = 0  # heads begun and ended on this connection: progress within one chunk

    def data_received(self, data: bytes) -> None:
        """While a request's head is incomplete, the parser gets at most what is left of the limit; if
        a head ended (or a pipelined request began) within it, the rest is fed the same way, counted
        afresh (so a head may reach twice the limit at worst: memory stays bounded)."""
        if not self._in_headers:
            super().data_received(data)
            return
        room = self.max_header_bytes - self._head_bytes
        head, rest = data[:room], data[room:]
        self._head_bytes += len(head)
        seen = self._heads
        super().data_received(head)
        if not rest or self.transport.is_closing():
            return
        if self._heads == seen:  # the same head, still unfinished, and more is coming
            self._refuse(f"request headers exceed {self.max_header_bytes} bytes")
        else:
            self.data_received(rest)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers, self._head_bytes, self._head_count = True, 0, 0
        self._heads += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.max_headers:
            raise _TooManyHeaders  # stops the parser; answered 431 in send_400_response
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._heads += 1
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._head_count > self.max_headers:
            self._refuse(f"more than {self.max_headers} request headers")
        else:
            super().send_400_response(msg)

    def _refuse(self, why: str) -> None:
        """431 in the route's dialect (as far as the request line came) and hang up."""
        if self.transport.is_closing():
            return
        path = getattr(self, "url", b"").split(b"?")[0].decode("latin-1")
        error = ApiError(431, why, code="request_header_fields_too_large")
        body = json.dumps(shape_for(path).body(error)).encode()
        head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        head += b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
        self.transport.write(head + body)
        self.transport.close()


class _TooManyHeaders(Exception):
    """Raised from a parser callback: httptools turns it into an HttpParserCallbackError (a 400 path)."""


def bounded_protocol(max_header_bytes: int, max_headers: int) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=…)`` with these limits."""
    return type(
        "BoundedHttp", (BoundedHttpToolsProtocol,), {"max_header_bytes": max_header_bytes, "max_headers": max_headers}
    )
