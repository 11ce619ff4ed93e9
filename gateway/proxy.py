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

import aiohttp
from starlette.responses import Response, StreamingResponse

from backends.base import Launch
from gateway.edge import request_id
from gateway.openai_errors import ApiError, unavailable
from gateway.sse import chat_chunks

log = logging.getLogger("gateway.proxy")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ChunkFilter(Protocol):
    def feed(self, chunk: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


class _Chain:
    """Filters applied in order; a filter's flushed tail still passes through the ones after it."""

    def __init__(self, filters: list[ChunkFilter]) -> None:
        self.filters = filters

    def feed(self, chunk: bytes) -> bytes:
        for f in self.filters:
            chunk = f.feed(chunk)
        return chunk

    def flush(self) -> bytes:
        out = b""
        for index, f in enumerate(self.filters):
            tail = f.flush()
            for later in self.filters[index + 1 :]:
                tail = later.feed(tail)
            out += tail
        return out


def chained(filters: list[ChunkFilter]) -> ChunkFilter | None:
    """One filter for a stream: none, the only one, or all of them in order."""
    return None if not filters else filters[0] if len(filters) == 1 else _Chain(filters)


class Upstream:
    """One pooled HTTP client for whichever backend is live (its URL and key change on restarts).

    aiohttp's client rather than httpx on this path: measured in benchmarks/proxy_overhead.py, the
    same passthrough costs 3-10x less CPU per request with it (httpx's pool dominates the profile)."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # created inside the running loop, on first use
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=self.timeout,
                auto_decompress=False,
                trust_env=False,  # the backend is on loopback: never route it through an HTTP proxy
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def open(self, target: Launch, path: str, body: bytes, *, stream: bool = False) -> aiohttp.ClientResponse:
        """Send the request and return the response with its body still unread.

        A streamed request asks for its own connection (``Connection: close``): llama-server closes the
        socket after the last chunk of a stream without saying so, and a pooled connection reused after
        that fails the next request (measured: 30 of 30 non-streamed requests after a stream)."""
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if stream:
            headers["Connection"] = "close"
        if rid := request_id.get():
            headers["X-Request-Id"] = rid
        if target.api_key:
            headers["Authorization"] = f"Bearer {target.api_key}"
        try:
            return await self._client().post(target.base_url + path, data=body, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unavailable(f"the backend did not answer ({type(exc).__name__}); retry shortly") from exc

    async def read(self, upstream: aiohttp.ClientResponse) -> bytes:
        try:
            return await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unavailable(f"the backend failed while answering ({type(exc).__name__}); retry shortly") from exc
        finally:
            upstream.release()

    async def post_json(self, target: Launch, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        upstream = await self.open(target, path, json.dumps(payload).encode())
        return upstream.status, _json_or_error(await self.read(upstream))

    async def count_tokens(self, target: Launch, text: str) -> int | None:
        """The engine's own token count for ``text`` (None when it has no tokenizer endpoint)."""
        if not target.tokenize_path:
            return None
        payload = {target.tokenize_key: text, "model": target.served_name}
        status, body = await self.post_json(target, target.tokenize_path, payload)
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
            upstream = await self.open(target, path, body, stream=stream)
        except ApiError:
            on_close()
            raise
        content_type = upstream.headers.get("Content-Type", "application/json")
        if stream and upstream.status == 200 and content_type.startswith("text/event-stream"):
            return StreamingResponse(
                _relay(upstream, chunk_filter, on_close), status_code=200, media_type=content_type, headers=SSE_HEADERS
            )
        try:
            data = await self.read(upstream)
        finally:
            on_close()
        kept = {name: upstream.headers[name] for name in ("Retry-After", "retry-after-ms") if name in upstream.headers}
        return Response(rewrite_body(data), status_code=upstream.status, media_type=content_type, headers=kept)

    async def chat_stream(
        self, target: Launch, body: bytes, chunk_filter: ChunkFilter | None = None
    ) -> tuple[tuple[int, Any] | None, AsyncIterator[Any]]:
        """Open a streamed chat completion for a translator: ((status, parsed error) or None, parsed chunks)."""
        upstream = await self.open(target, "/v1/chat/completions", body, stream=True)
        if upstream.status != 200:
            return (upstream.status, _json_or_error(await self.read(upstream))), _empty()
        return None, chat_chunks(_guarded(upstream, chunk_filter))


def _json_or_error(data: bytes) -> Any:
    """An engine's JSON answer; anything else (a proxy's HTML page) as an OpenAI-shaped error."""
    try:
        return json.loads(data)
    except ValueError:
        return {"error": {"message": data.decode(errors="replace")[:500]}}


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover


_BROKEN = "the backend stopped in the middle of this stream; retry the request"
_BROKEN_FOR_TRANSLATORS = b'data: {"error": {"message": "' + _BROKEN.encode() + b'"}}\n\n'


async def _guarded(upstream: aiohttp.ClientResponse, chunk_filter: ChunkFilter | None) -> AsyncIterator[bytes]:
    """Raw bytes for a translator; a broken connection becomes an error payload it turns into its own
    dialect's failure event."""
    async for chunk in _relay(upstream, chunk_filter, lambda: None, broken=_BROKEN_FOR_TRANSLATORS):
        yield chunk


async def _relay(
    upstream: aiohttp.ClientResponse,
    chunk_filter: ChunkFilter | None,
    on_close: Callable[[], None],
    broken: bytes | None = None,
) -> AsyncIterator[bytes]:
    """The upstream's bytes as they arrive; a broken connection ends the stream with an error event."""
    finished = False
    try:
        async for chunk in upstream.content.iter_any():
            yield chunk_filter.feed(chunk) if chunk_filter else chunk
        if chunk_filter:
            yield chunk_filter.flush()
        finished = True
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("backend stream broke: %s", type(exc).__name__)
        yield broken if broken is not None else unavailable(_BROKEN).sse_event()
    finally:
        on_close()
        _finish(upstream, finished)


def _finish(upstream: aiohttp.ClientResponse, finished: bool) -> None:
    """A stream read to its end returns its connection to the pool; one cut short (the client left)
    closes it, which is how the engine learns to stop generating."""
    if finished:
        upstream.release()
    else:
        upstream.close()


def translated_stream(events: AsyncIterator[bytes], on_close: Callable[[], None]) -> StreamingResponse:
    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for block in events:
                yield block
        finally:
            on_close()

    return StreamingResponse(guarded(), status_code=200, media_type="text/event-stream", headers=SSE_HEADERS)
