"""Pure ASGI layers at the edge of the app: API keys, request ids, Prometheus request metrics and the
access log (one line per request: route, status, time, tokens in and out and how many of those in came
from the engine's prefix cache, client, request id).

Pure ASGI (not BaseHTTPMiddleware) so streamed responses pass through unbuffered. The token figures
are the engine's usage as the routes parsed it (``usage_tally``), never read from the response bytes:
those carry what the client sent too (a Responses answer echoes its ``metadata``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.core import auth
from gateway.serving.scheduling.usage_board import RequestRecord, UsageBoard
from gateway.serving.wire import usage_tally
from gateway.serving.wire.error_shapes import shape_for
from gateway.serving.wire.request_id import request_id, usable_request_id

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

access_log = logging.getLogger("gateway.access")
# open to anyone: liveness, bare readiness (its detail needs the key), and the root that clients probe
# (Claude Code sends an unkeyed HEAD / before it starts)
OPEN_PATHS = frozenset({"/health", "/ready", "/"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class ApiKeys:
    """Closes every route but /health unless the request carries one of the keys (Bearer or x-api-key);
    the 401 is written in the route's dialect. The key that matched is who the request is
    (:func:`authenticated_key`)."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self.keys = [key.strip() for key in keys if key.strip()]  # a blank key is no key: the gateway stays open

    def matched(self, scope: Scope) -> str | None:
        return auth.matching_key(_header(scope, b"authorization"), _header(scope, b"x-api-key"), self.keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys:
            await self.app(scope, receive, send)
            return
        matched = self.matched(scope)
        if matched is not None or scope["path"] in OPEN_PATHS:
            state = scope.setdefault("state", {})
            state[KEY_STATE] = matched is not None  # open routes show detail only with the key
            state[AUTHENTICATED_STATE] = matched
            await self.app(scope, receive, send)
            return
        await shape_for(scope["path"]).unauthorized()(scope, receive, send)


KEY_STATE = "key_accepted"
AUTHENTICATED_STATE = "authenticated_key"  # the configured key that matched (ApiKeys); absent on an open gateway
RECORD_STATE = "record"  # the request's RequestRecord (gateway.serving.scheduling.usage_board), for the handlers


def record_of(scope: Scope) -> RequestRecord:
    """The request's account, which the handler fills in (a request that came in around the edge: a new one)."""
    state = scope.setdefault("state", {})
    record = state.get(RECORD_STATE)
    if not isinstance(record, RequestRecord):
        record = state[RECORD_STATE] = RequestRecord()
    return record


def authenticated_key(scope: Scope) -> str | None:
    """The configured API key the request authenticated with, to name its key id (never logged); None on
    a gateway without keys (key id ``open``). Only :class:`ApiKeys` sets it, from the key that matched: no
    header a client adds beside a valid key changes who the request is counted, capped or scheduled as."""
    key = scope.get("state", {}).get(AUTHENTICATED_STATE)
    return key if isinstance(key, str) else None


def may_see_detail(scope: Scope) -> bool:
    """Whether this request may see detail: it carried a valid key, or the gateway has no keys."""
    return bool(scope.get("state", {}).get(KEY_STATE, True))


class RequestMetrics:
    """Counts requests by route and status, times them (and the first streamed byte), sums tokens
    from the engine's usage figures (reported by the routes into the request's tally), and tags each
    response with an X-Request-Id."""

    def __init__(
        self, app: ASGIApp, registry: CollectorRegistry, routes: Iterable[str] = (), board: UsageBoard | None = None
    ) -> None:
        self.app = app
        self.board = board if board is not None else UsageBoard()
        self.routes = frozenset(routes)  # the app's own paths; anything else is counted as "other"
        self.requests = Counter(
            "gateway_requests", "Requests by route and status", ["route", "status"], registry=registry
        )
        self.latency = Histogram(
            "gateway_request_seconds", "Time to the response's first byte", ["route"], registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )  # fmt: skip
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds", "Streams: time to the first event after the headers", ["route"],
            registry=registry, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )  # fmt: skip
        self.tokens = Counter("gateway_tokens", "Tokens from response usage", ["direction"], registry=registry)
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens the engine evaluated, or reused from its prefix cache",
            ["kind"], registry=registry,
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"
        rid = usable_request_id(_header(scope, b"x-request-id")) or uuid.uuid4().hex
        token = request_id.set(rid)
        record = scope.setdefault("state", {})[RECORD_STATE] = RequestRecord()
        started = record.started
        status: dict[str, Any] = {"code": 500, "streaming": False, "first": True, "first_byte_s": None}
        tokens = {"in": 0, "out": 0, "cached": 0, "usage": 0}  # usage: whether the answer carried any figures
        tally = usage_tally.current.set(tokens)  # filled by the routes from the engine's parsed usage

        async def tapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers") or [])
                headers.append((b"x-request-id", rid.encode()))
                message["headers"] = headers
                status["streaming"] = any(
                    k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers
                )
                status["first_byte_s"] = time.perf_counter() - started
                self.latency.labels(route).observe(status["first_byte_s"])
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if status["first"] and body:
                    status["first"] = False
                    record.first_output()
                    if status["streaming"]:
                        self.ttft.labels(route).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, tapped)
        finally:
            self.requests.labels(route, str(status["code"])).inc()
            if tokens["usage"]:
                self._count_usage(tokens)
            record.first_output()  # the time to the first body bytes, if none went out before the end
            self.board.add(record, status=status["code"], tokens=tokens, agent=_header(scope, b"user-agent"))
            if scope["path"] not in QUIET_PATHS:
                _log_access(scope, rid, status, tokens, time.perf_counter() - started)
            usage_tally.current.reset(tally)
            request_id.reset(token)

    def _count_usage(self, seen: dict[str, int]) -> None:
        """Add one request's figures (each checked by ``usage_tally``: an integer up to its bound, so a
        counter stays finite) to the metrics: ``in`` is the whole prompt in every dialect, ``cached``
        the part of it reused from the engine's prefix cache."""
        self.tokens.labels("in").inc(seen["in"])
        self.tokens.labels("out").inc(seen["out"])
        self.prompt_tokens.labels("reused").inc(seen["cached"])
        self.prompt_tokens.labels("evaluated").inc(max(seen["in"] - seen["cached"], 0))


QUIET_PATHS = frozenset({"/health", "/metrics"})  # polled every few seconds: a line each would bury the rest


def _log_access(scope: Scope, rid: str, status: dict[str, Any], tokens: dict[str, int], seconds: float) -> None:
    """One line per request; with ``--log-format json`` its fields become the JSON object's keys. Token
    counts the answer did not carry (a stream without ``include_usage``) are unknown: ``?`` / null."""
    client = scope.get("client")
    known = bool(tokens["usage"])
    record = scope.get("state", {}).get(RECORD_STATE)
    identity = record.identity if isinstance(record, RequestRecord) else None
    queued_s = record.queued_s if isinstance(record, RequestRecord) else None
    fields = {
        "method": scope.get("method", ""),
        "path": scope["path"],
        "status": status["code"],
        "ms": round(seconds * 1000, 1),
        "first_byte_ms": None if status["first_byte_s"] is None else round(status["first_byte_s"] * 1000, 1),
        "tokens_in": tokens["in"] if known else None,
        "tokens_out": tokens["out"] if known else None,
        "tokens_cached": tokens["cached"] if known else None,  # of tokens_in, reused from the engine's cache
        "client": f"{client[0]}:{client[1]}" if client else None,
        "user_agent": _header(scope, b"user-agent"),
        "request_id": rid,
        "session": identity.session if identity else None,  # gateway.serving.scheduling.sessions: never the key itself
        "key": identity.key if identity else None,
        "queued_ms": None if queued_s is None else round(queued_s * 1000, 1),
    }
    counted = f"in={tokens['in']} out={tokens['out']} cached={tokens['cached']}" if known else "in=? out=?"
    waited = "-" if queued_s is None else f"{queued_s * 1000:.0f}ms"
    who = f" session={identity.session} key={identity.key} queued={waited}" if identity else ""
    access_log.info(
        "%s %s %s %.0f ms %s%s client=%s agent=%s id=%s",
        fields["method"], fields["path"], fields["status"], fields["ms"], counted, who, fields["client"],
        json.dumps(fields["user_agent"] or "-", ensure_ascii=False), rid, extra={"access": fields},  # quotes escaped
    )  # fmt: skip
