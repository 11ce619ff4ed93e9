"""Bounds on what a client may hold before and while the gateway serves it: the request line and
headers, the time it takes to send them and the body, idle kept-alive connections, the number of
connections, and the time a client may leave a response unread.

uvicorn's httptools protocol buffers a request's headers without limit (10 connections sending
64 MiB of unfinished header each took the gateway from 65 to 735 MB, without any key), keeps a
connection that sends nothing (or a byte a minute) forever, and waits forever on a client that stops
reading a stream (its engine slot with it). This protocol counts the bytes of a request's head (431
beyond ``max_header_bytes`` / ``max_headers``, 414 for a request line alone beyond it), gives the head
``header_timeout_s`` and the body ``body_timeout_s`` for each KiB (408 beyond: nginx's
``client_header_timeout`` / ``client_body_timeout``, a trickle not counted as progress), keeps at most
``max_connections`` (the idlest, or else the oldest unfinished head of the busiest address, gives way
to a new one; a log line), and hangs up on a client that has
accepted no byte of its response for ``send_timeout_s`` (the request is cancelled and its slot freed).
All of it is timers armed per phase, not per chunk: the streamed path pays nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.serving.wire.error_shapes import ApiError, shape_for

log = logging.getLogger("gateway.http")

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}
_CAP_LOG_EVERY_S = 10.0
_BODY_PROGRESS_BYTES = 1024  # body_timeout_s runs until this much more of the body came


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client connection may hold (settings of the same names)."""

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 60.0
    body_timeout_s: float = 60.0
    send_timeout_s: float = 120.0
    max_connections: int = 1000


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of :class:`ConnectionLimits`."""

    limits = ConnectionLimits()
    _last_cap_log = 0.0  # shared by the class: one log line per interval, whatever the flood

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
        self._heads_ended = 0  # heads completed on this connection: progress within one chunk
        self._line_ended = False  # the request line of the current head is complete
        self._last_read = 0.0  # when the client last made progress: any byte of a head, a KiB of a body
        self._opened = 0.0  # when the connection was accepted
        self._body_trickle = 0  # body bytes since the last KiB counted as progress
        self._client_timer: asyncio.TimerHandle | None = None  # the head's or the body's clock
        self._send_timer: asyncio.TimerHandle | None = None  # a response the client does not read

    # -- connections ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        cap = self.limits.max_connections
        if len(self.connections) >= cap:
            idle = self._idlest()
            now = time.monotonic()
            if now - BoundedHttpToolsProtocol._last_cap_log >= _CAP_LOG_EVERY_S:
                BoundedHttpToolsProtocol._last_cap_log = now
                log.warning(
                    "%d client connections open (max_connections): %s", cap,
                    "closing the longest idle ones for new ones" if idle else "refusing new ones until some close",
                )  # fmt: skip
            if idle is None:
                transport.abort()  # the descriptor is freed now, before any byte is read
                return
            idle.transport.abort()  # a connection doing nothing makes room (nginx does the same)
            self.connections.discard(idle)
        super().connection_made(transport)
        self._last_read = self._opened = self.loop.time()
        self._arm_client_timer(self.limits.header_timeout_s, self._head_too_slow)

    def _idlest(self) -> BoundedHttpToolsProtocol | None:
        """The connection that gives way to a new one at the cap: the one that has waited longest
        without a request in progress (silent since it opened, or kept alive between requests); else
        the oldest one still sending a request's head, from the address that holds the most
        of those. Without the second rule, 1,000 connections sending a header byte now and then (no key
        needed) had every new connection reset for as long as they were held; now each new connection
        displaces one of them, and a client that sends its head at once is never displaced."""
        ours = [other for other in self.connections if isinstance(other, BoundedHttpToolsProtocol)]
        between = [o for o in ours if o._in_headers and (o.cycle is None or o.cycle.response_complete)]
        idle = [o for o in between if o._head_bytes == 0]
        if idle:
            return min(idle, key=lambda other: other._last_read)
        heads = [o for o in between if o._head_bytes]  # a head begun, unfinished (no request in progress)
        if not heads:
            return None
        per_host = Counter(o.client[0] if o.client else "" for o in heads)
        crowd = max(per_host, key=lambda host: per_host[host])
        return min((o for o in heads if (o.client[0] if o.client else "") == crowd), key=lambda o: o._opened)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if getattr(self, "transport", None) is None:  # refused in connection_made
            return
        super().connection_lost(exc)

    def _cancel_timers(self) -> None:
        for timer in (self._client_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._client_timer = self._send_timer = None

    def _arm_client_timer(self, seconds: float, callback: Any) -> None:
        if self._client_timer is not None:
            self._client_timer.cancel()
        self._client_timer = self.loop.call_later(seconds, callback)

    def _head_too_slow(self) -> None:
        self._client_timer = None
        if self._in_headers and not self.transport.is_closing():
            self._refuse(
                408, f"request headers not received within {self.limits.header_timeout_s:g} s", "request_timeout"
            )

    def _body_too_slow(self) -> None:
        """Fires ``body_timeout_s`` after the body last made progress (a KiB: a byte every few seconds
        would hold a connection for hours); re-armed when it did meanwhile, or when the app is not
        reading the body (paused reads are the gateway's doing, not the client's)."""
        self._client_timer = None
        if self._in_headers or self.transport.is_closing() or self.cycle is None or not self.cycle.more_body:
            return
        silent = self.loop.time() - self._last_read
        if silent < self.limits.body_timeout_s or self.flow.read_paused:
            self._arm_client_timer(max(self.limits.body_timeout_s - silent, 0.01), self._body_too_slow)
            return
        self._refuse(408, f"request body stalled for {self.limits.body_timeout_s:g} s", "request_timeout")

    # -- a response the client does not read --------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._reader_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _reader_stalled(self) -> None:
        self._send_timer = None
        if self.transport.is_closing():
            return
        path = self.scope.get("path", "?") if self.scope else "?"
        log.warning(
            "client %s accepted nothing of its %s response for %g s (stream_idle_timeout_s): hung up",
            "{}:{}".format(*self.client) if self.client else "?", path, self.limits.send_timeout_s,
        )  # fmt: skip
        self.transport.abort()  # connection_lost: the request sees a disconnect and is cancelled

    # -- the head -------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        """While a request's head is incomplete, the parser gets at most what is left of the limit; if
        the head ended within it, the rest is fed the same way (the next head counted afresh)."""
        if not self._in_headers:
            self._body_trickle += len(data)
            if self._body_trickle >= _BODY_PROGRESS_BYTES:  # a byte now and then does not hold the clock
                self._body_trickle = 0
                self._last_read = self.loop.time()
            super().data_received(data)
            return
        self._last_read = self.loop.time()
        room = self.max_head_bytes - self._head_bytes
        head, rest = data[:room], data[room:]
        self._head_bytes += len(head)
        self._line_ended = self._line_ended or b"\n" in head
        ended = self._heads_ended
        super().data_received(head)
        if not rest or self.transport.is_closing():
            return
        if self._heads_ended == ended:  # the same head, still unfinished, and more is coming
            if not self._line_ended:
                self._refuse(414, f"request line exceeds {self.max_head_bytes} bytes", "uri_too_long")
            else:
                self._refuse(431, f"request headers exceed {self.max_head_bytes} bytes")
        else:
            self.data_received(rest)

    @property
    def max_head_bytes(self) -> int:
        return self.limits.max_header_bytes

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_count = 0
        if self._client_timer is None:  # a request after the first on a kept-alive connection
            self._arm_client_timer(self.limits.header_timeout_s, self._head_too_slow)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.limits.max_headers:
            raise _TooManyHeaders  # stops the parser; answered 431 in send_400_response
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._body_trickle = 0
        self._last_read = self.loop.time()
        self._heads_ended += 1
        self._arm_client_timer(self.limits.body_timeout_s, self._body_too_slow)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._client_timer is not None:
            self._client_timer.cancel()
            self._client_timer = None
        self._in_headers, self._head_bytes, self._line_ended = (
            True,
            0,
            False,
        )  # what comes next is the next request's head

    def send_400_response(self, msg: str) -> None:
        if self._head_count > self.limits.max_headers:
            self._refuse(431, f"more than {self.limits.max_headers} request headers")
        else:
            self._refuse(400, f"malformed HTTP request: {msg}", "invalid_request")

    def _refuse(self, status: int, why: str, code: str = "request_header_fields_too_large") -> None:
        """An error in the route's dialect (as far as the request line came), then hang up."""
        if self.transport.is_closing():
            return
        path = (getattr(self, "url", None) or b"").split(b"?")[0].decode("latin-1")
        body = json.dumps(shape_for(path).body(ApiError(status, why, code=code))).encode()
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, _REASONS[status])
        head += b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
        self.transport.write(head + body)
        self.transport.close()


class _TooManyHeaders(Exception):
    """Raised from a parser callback: httptools turns it into an HttpParserCallbackError (a 400 path)."""


def bounded_protocol(
    max_header_bytes: int = 64 * 1024, max_headers: int = 100, **bounds: Any
) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=…)`` with these limits (see :class:`ConnectionLimits`)."""
    limits = ConnectionLimits(max_header_bytes=max_header_bytes, max_headers=max_headers, **bounds)
    return type("BoundedHttp", (BoundedHttpToolsProtocol,), {"limits": limits})


def connection_cap(wanted: int) -> int:
    """``max_connections`` as the descriptor limit allows: the soft limit is raised to the hard one
    (systemd's default soft limit is 1,024), and each connection may need a second descriptor (its
    stream to the engine), so the cap stays under half of what is left after the gateway's own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    room = max((soft - 128) // 2, 16)
    if wanted > room:
        log.warning("max_connections %d lowered to %d: the descriptor limit is %d (ulimit -n)", wanted, room, soft)
    return min(wanted, room)
