"""Forwarding requests to the live backend: one pooled client, bytes passed through untouched.

Streams are relayed chunk by chunk as they arrive (no buffering, no compression); the upstream
response is closed when the client goes away or the stream ends. Transport failures become 503s
before the response starts, or a final SSE error event once it has.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from backends.base import Launch
from gateway.openai_errors import unavailable
from gateway.routing import ModelRoute

log = logging.getLogger("gateway.proxy")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Upstream:
    """One pooled HTTP client for whichever backend is live (its URL and key change on restarts)."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.client = httpx.AsyncClient(
            headers={"Accept-Encoding": "identity"},
            timeout=httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=60.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            trust_env=False,  # the backend is on loopback: never route it through an HTTP proxy
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def post(self, target: Launch, path: str, body: bytes, *, stream: bool, route: ModelRoute) -> Response:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {target.api_key}"}
        request = self.client.build_request("POST", target.base_url + path, content=body, headers=headers)
        try:
            upstream = await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise unavailable(f"the backend did not answer ({type(exc).__name__}); retry shortly") from exc
        content_type = upstream.headers.get("content-type", "application/json")
        if stream and upstream.status_code == 200 and content_type.startswith("text/event-stream"):
            return StreamingResponse(
                _relay(upstream, route),
                status_code=200,
                media_type=content_type,
                headers=SSE_HEADERS,
                background=BackgroundTask(upstream.aclose),
            )
        try:
            data = await upstream.aread()
        except httpx.TransportError as exc:
            raise unavailable(f"the backend failed while answering ({type(exc).__name__}); retry shortly") from exc
        finally:
            await upstream.aclose()
        return Response(route.rewrite_body(data), status_code=upstream.status_code, media_type=content_type)


async def _relay(upstream: httpx.Response, route: ModelRoute) -> AsyncIterator[bytes]:
    rewriter = route.stream_rewriter()
    try:
        async for chunk in upstream.aiter_raw():
            yield rewriter.feed(chunk) if rewriter else chunk
        if rewriter:
            yield rewriter.flush()
    except httpx.TransportError as exc:
        log.warning("backend stream broke: %s", type(exc).__name__)
        yield unavailable("the backend stopped in the middle of this stream; retry the request").sse_event()
    finally:
        await upstream.aclose()
