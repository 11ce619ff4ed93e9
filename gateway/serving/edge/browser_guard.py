"""What stops a web page from driving the gateway through the user's browser.

A gateway without keys on 127.0.0.1 is reachable from every page the user opens: a page can POST
``text/plain`` (a "simple" request, sent without a CORS preflight) and, by DNS rebinding (its own name
re-pointed at 127.0.0.1), read the answers as same-origin. Three checks, before the key check:

- ``Host`` must be a name this gateway answers to when no key is set: an IP address, ``localhost``,
  the ``--host`` name, or one of ``allowed_hosts`` (a reverse proxy's name; ``*`` turns it off). A
  rebinding page's Host is its own domain.
- POSTs to the API must say ``Content-Type: application/json``: a page cannot send that cross-origin
  without a preflight, which is refused.
- A request carrying an ``Origin`` other than the gateway's own is refused unless the origin is in
  ``cors_allow_origins``; allowed origins get the CORS headers and their preflights answered.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from gateway.serving.edge.middleware import ASGIApp, Message, Receive, Scope, Send
from gateway.serving.wire.error_shapes import ApiError, shape_for

JSON_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"}
)
_OPEN = frozenset({"/health"})
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "*"})


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8000`` → ``::1``)."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class BrowserGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keyed: bool,
        bind_host: str = "127.0.0.1",
        allowed_hosts: Sequence[str] = (),
        cors_allow_origins: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.check_host = not keyed and "*" not in allowed_hosts
        names = {name.strip().lower() for name in allowed_hosts if name.strip()}
        if bind_host.lower() not in _WILDCARD_BINDS:
            names.add(bind_host.lower().strip("[]"))
        self.hosts = frozenset(names)
        self.any_origin = "*" in cors_allow_origins
        self.origins = frozenset(origin.strip().rstrip("/").lower() for origin in cors_allow_origins)

    def host_allowed(self, host: str | None) -> bool:
        if host is None:  # HTTP/1.0 without a Host: no browser sends that
            return True
        name = host_name(host)
        return _is_ip(name) or name == "localhost" or name.endswith(".localhost") or name in self.hosts

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        normalized = origin.strip().rstrip("/").lower()
        if self.any_origin or normalized in self.origins:
            return True
        return host is not None and urlsplit(normalized).netloc == host.strip().lower()  # the gateway's own pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN:
            await self.app(scope, receive, send)
            return
        host = origin = content_type = None
        for key, value in scope.get("headers") or []:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
            elif key == b"content-type":
                content_type = value.decode("latin-1")
        path = scope["path"]
        if self.check_host and not self.host_allowed(host):
            why = (
                f"Host '{host}' is not a name this gateway answers to: add it to allowed_hosts "
                "(GATEWAY_ALLOWED_HOSTS), or set api_keys"
            )
            await _refuse(scope, receive, send, ApiError(403, why, code="host_not_allowed"))
            return
        if origin is not None and not self.origin_allowed(origin, host):
            why = f"cross-origin request from {origin} refused: add the origin to cors_allow_origins to allow it"
            await _refuse(scope, receive, send, ApiError(403, why, code="origin_not_allowed"))
            return
        if origin is not None and scope["method"] == "OPTIONS":
            await _preflight(origin, send)
            return
        if scope["method"] == "POST" and path in JSON_ROUTES and not _is_json(content_type):
            why = (
                f"Content-Type must be application/json, not {content_type or 'missing'} "
                "(curl: -H 'Content-Type: application/json')"
            )
            await _refuse(scope, receive, send, ApiError(415, why, code="unsupported_media_type"))
            return
        if origin is None:
            await self.app(scope, receive, send)
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*(message.get("headers") or []), *_cors_headers(origin)]
            await send(message)

        await self.app(scope, receive, with_cors)


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


async def _preflight(origin: str, send: Send) -> None:
    headers = [
        *_cors_headers(origin),
        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
        (b"access-control-allow-headers", b"authorization, x-api-key, content-type, anthropic-version, x-request-id"),
        (b"access-control-max-age", b"600"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(scope: Scope, receive: Receive, send: Send, error: ApiError) -> None:
    await shape_for(scope["path"]).response(error)(scope, receive, send)
