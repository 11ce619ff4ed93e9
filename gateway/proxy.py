"""Forwarding requests to the live backend: one pooled client, bytes passed through untouched.

Streams are relayed chunk by chunk as they arrive (no buffering, no compression); the upstream
response is closed when the client goes away or the stream ends, and the admission ticket with it.
Transport failures become 503s before the response starts, or a final error event once it has.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from backends.base import Launch
from gateway.openai_errors import ApiError, unavailable
from gateway.sse import chat_chunks

log = logging.getLogger("gateway.proxy")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ChunkFilter(Protocol):
    def feed(self, chunk: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


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

    async def open(self, target: Launch, path: str, body: bytes) -> httpx.Response:
        """Send the request and return the response with its body still unread."""
        headers = {"Content-Type": "application/json"}
        if target.api_key:
            headers["Authorization"] = f"Bearer {target.api_key}"
        request = self.client.build_request("POST", target.base_url + path, content=body, headers=headers)
        try:
            return await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise unavailable(f"the backend did not answer ({type(exc).__name__}); retry shortly") from exc

    async def read(self, upstream: httpx.Response) -> bytes:
        try:
            return await upstream.aread()
        except httpx.TransportError as exc:
            raise unavailable(f"the backend failed while answering ({type(exc).__name__}); retry shortly") from exc
        finally:
            await upstream.aclose()

    async def post_json(self, target: Launch, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        upstream = await self.open(target, path, json.dumps(payload).encode())
        data = await self.read(upstream)
        try:
            return upstream.status_code, json.loads(data)
        except ValueError:
            return upstream.status_code, {"error": {"message": data.decode(errors="replace")[:500]}}

    async def count_tokens(self, target: Launch, text: str) -> int | None:
        """The engine's own token count for ``text`` (None when it has no tokenizer endpoint)."""
        if not target.tokenize_path:
            return None
        status, body = await self.post_json(
            target, target.tokenize_path, {target.tokenize_key: text, "model": target.served_name}
        )
        if status != 200 or not isinstance(body, dict):
            return None
        count = body.get("count")
        return int(count) if isinstance(count, int) else len(body.get("tokens") or [])

    async def relay(
        self,
        target: Launch,
        path: str,
        body: bytes,
        *,
        stream: bool,
        rewrite_body: Callable[[bytes], bytes],
        chunk_filter: ChunkFilter | None = None,
        on_close: Callable[[], None] = lambda: None,
    ) -> Response:
        """Pass the request through; the response comes back as it came (filtered only if asked)."""
        try:
            upstream = await self.open(target, path, body)
        except ApiError:
            on_close()
            raise
        content_type = upstream.headers.get("content-type", "application/json")
        if stream and upstream.status_code == 200 and content_type.startswith("text/event-stream"):
            return StreamingResponse(
                _relay(upstream, chunk_filter, on_close),
                status_code=200,
                media_type=content_type,
                headers=SSE_HEADERS,
                background=BackgroundTask(upstream.aclose),
            )
        try:
            data = await self.read(upstream)
        finally:
            on_close()
        return Response(rewrite_body(data), status_code=upstream.status_code, media_type=content_type)

    async def chat_stream(
        self, target: Launch, body: bytes, chunk_filter: ChunkFilter | None = None
    ) -> tuple[httpx.Response | None, AsyncIterator[Any]]:
        """Open a streamed chat completion for a translator: (error response, or None; parsed chunks)."""
        upstream = await self.open(target, "/v1/chat/completions", body)
        if upstream.status_code != 200:
            await upstream.aread()
            await upstream.aclose()
            return upstream, _empty()
        return None, chat_chunks(_guarded(upstream, chunk_filter))


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover


async def _guarded(upstream: httpx.Response, chunk_filter: ChunkFilter | None) -> AsyncIterator[bytes]:
    """Raw bytes of a stream; a broken connection becomes a final error payload for translators."""
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk_filter.feed(chunk) if chunk_filter else chunk
        if chunk_filter:
            yield chunk_filter.flush()
    except httpx.TransportError as exc:
        log.warning("backend stream broke: %s", type(exc).__name__)
        message = "the backend stopped in the middle of this stream; retry the request"
        yield b'data: {"error": {"message": "' + message.encode() + b'"}}\n\n'
    finally:
        await upstream.aclose()


async def _relay(
    upstream: httpx.Response, chunk_filter: ChunkFilter | None, on_close: Callable[[], None]
) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk_filter.feed(chunk) if chunk_filter else chunk
        if chunk_filter:
            yield chunk_filter.flush()
    except httpx.TransportError as exc:
        log.warning("backend stream broke: %s", type(exc).__name__)
        yield unavailable("the backend stopped in the middle of this stream; retry the request").sse_event()
    finally:
        on_close()
        await upstream.aclose()


def translated_stream(events: AsyncIterator[bytes], on_close: Callable[[], None]) -> StreamingResponse:
    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for block in events:
                yield block
        finally:
            on_close()

    return StreamingResponse(guarded(), status_code=200, media_type="text/event-stream", headers=SSE_HEADERS)
