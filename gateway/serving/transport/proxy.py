"""Forwarding requests to the live backend: one pooled client, bytes passed through untouched.

Streams are relayed chunk by chunk as they arrive (no buffering, no compression); the upstream
response is closed when the client goes away or the stream ends, and the admission ticket with it.
Transport failures become 503s before the response starts, or a final error event once it has.

Three clocks, so that a silent engine is noticed without cutting a long prompt short (:class:`Timeouts`):
connecting, the first byte of a stream (prefill of a long prompt takes minutes), and the silence
between two chunks of a stream; a non-streamed answer arrives whole at the end, so it has one bound
for all of it. Answers the gateway holds in memory (non-streamed ones) are capped in size.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from starlette.responses import Response, StreamingResponse

from gateway.backends.base import Capability
from gateway.core.auth import bearer_header
from gateway.serving.transport.dispatch_gate import DispatchGate
from gateway.serving.transport.stream_guard import checked_chunks
from gateway.serving.wire.error_shapes import OPENAI, ApiError, ErrorShape, engine_overflow, unavailable
from gateway.serving.wire.request_id import request_id
from gateway.serving.wire.sse import chat_chunks
from gateway.serving.wire.usage_tally import UsageTap, report_body, reported_chunks
from gateway.supervision.lifecycle import EngineTarget
from gateway.supervision.liveness import Activity

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


@dataclass(frozen=True)
class Timeouts:
    """How long the gateway waits on the backend, by phase (settings: *_timeout_s)."""

    connect_s: float = 10.0
    first_byte_s: float = 600.0  # a stream's headers and first chunk: the prompt's prefill
    stream_idle_s: float = 120.0  # between two chunks of a stream
    answer_s: float = 1800.0  # a non-streamed answer, whole (it comes at the end of the generation)


MAX_ANSWER_BYTES = 32 * 1024 * 1024
PAGE_S = 2.0  # an engine page read before a request is sent (llama-server's /slots): at most this long
MAX_PAGE_BYTES = 1 << 20


class EngineClient:
    """One pooled HTTP client for whichever backend is live (its URL and key change on restarts): it
    relays requests and streams, and posts what the gateway asks the engine itself (:meth:`post_json`).

    aiohttp's client rather than httpx on this path: measured in benchmarks/proxy_overhead.py, the
    same passthrough costs 3-10x less CPU per request with it (httpx's pool dominates the profile)."""

    def __init__(
        self,
        timeouts: Timeouts | None = None,
        *,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.timeouts = timeouts or Timeouts()
        self.headers = dict(headers or {})  # sent with every request (a rank of an engine's group: its name)
        self.max_answer_bytes = max_answer_bytes
        self.stopping: str | None = None  # why every request is being cut (the gateway shuts down)
        self._session: aiohttp.ClientSession | None = None
        # answers whose bodies are being read (weak: a stream whose client left before it began is dropped)
        self._reading: weakref.WeakSet[aiohttp.ClientResponse] = weakref.WeakSet()
        self._waiting = 0  # requests sent whose answer's headers have not come yet
        self._chunks_read = 0  # chunks of answers read so far (the progress watch's evidence of tokens)
        self._cuts = 0  # how many times the requests in flight were ended (:meth:`cut`)
        self.gate = DispatchGate()  # closed while a long prefill is being placed in the engine
        self._cut_why = ""

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # created inside the running loop, on first use
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect_s, sock_read=None),
                auto_decompress=False,
                trust_env=False,  # the backend is on loopback: never route it through an HTTP proxy
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def cut_all(self, why: str) -> None:
        """End every request to the backend now (the shutdown grace is over): each answers or ends its
        stream with ``why`` in its dialect, and new ones are refused with it."""
        self.stopping = why
        for upstream in list(self._reading):  # closing a connection does not wake a pending body read
            upstream.content.set_exception(aiohttp.ClientConnectionError(why))
        await self.aclose()  # requests still waiting for their headers

    def activity(self) -> Activity:
        """Requests to the backend not over yet (of them, those whose answer has not begun), and the chunks
        of answers read so far."""
        return Activity(self._waiting + len(self._reading), self._chunks_read, self._waiting)

    async def cut(self, why: str) -> None:
        """End every request to the backend now (it hung and is being restarted): each answers 503 or
        ends its stream with ``why`` in its dialect. Unlike :meth:`cut_all`, later requests go through,
        on fresh connections."""
        self._cuts += 1
        self._cut_why = why
        for upstream in list(self._reading):
            upstream.content.set_exception(_Cut(why))
        session, self._session = self._session, None
        if session is not None:  # closing it fails the requests still waiting for their headers
            await session.close()

    def _failure(self, what: str, exc: BaseException, cuts: int | None = None) -> ApiError:
        """A transport failure as a 503; one caused by :meth:`cut` (the exception, or ``cuts`` counted
        before the request was sent) says why the requests were ended."""
        if isinstance(exc, _Cut):
            return unavailable(str(exc))
        if cuts is not None and cuts != self._cuts:
            return unavailable(self._cut_why)
        return unavailable(self.stopping or f"the backend {what} ({type(exc).__name__}); retry shortly")

    async def open(
        self, target: EngineTarget, path: str, body: bytes, *, stream: bool = False, deadline: float | None = None
    ) -> aiohttp.ClientResponse:
        """Send the request and return the response with its body still unread (its headers came by
        ``deadline``, a loop time; default: the first-byte or the whole-answer bound).

        A streamed request asks for its own connection (``Connection: close``) unless the engine keeps
        connections usable after a stream (``stream_keepalive`` in its native set: vLLM's uvicorn does):
        llama-server closes the socket after the last chunk of a stream without saying so, and a pooled
        connection reused after that fails the next request (measured: 30 of 30 non-streamed requests
        after a stream). A fresh connection per stream costs the gateway ~125 µs of CPU
        (benchmarks/proxy_overhead.py), so it is paid only where it is needed."""
        if self.stopping:
            raise unavailable(self.stopping)
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if stream and Capability.STREAM_KEEPALIVE not in target.native:
            headers["Connection"] = "close"
        if rid := request_id.get():
            headers["X-Request-Id"] = rid
        headers |= self.headers
        headers |= bearer_header(target.api_key)
        if deadline is None:
            deadline = _after(self.timeouts.first_byte_s if stream else self.timeouts.answer_s)
        cuts = self._cuts
        self._waiting += 1
        try:
            async with asyncio.timeout_at(deadline):
                upstream = await self._client().post(
                    target.base_url + path, data=body, headers=headers, allow_redirects=False
                )  # a redirect is the backend's mistake: following it would re-send the prompt elsewhere
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):  # connecting took longer than connect_timeout_s
                raise self._failure("did not accept the connection in time", exc, cuts) from exc
            raise self._silent(stream) from None
        except aiohttp.ClientError as exc:
            raise self._failure("did not answer", exc, cuts) from exc
        finally:
            self._waiting -= 1
        if cuts != self._cuts:  # its headers came as the requests in flight were being ended: so is this one
            upstream.close()
            raise unavailable(self._cut_why)
        self._reading.add(upstream)
        return upstream

    def _silent(self, stream: bool) -> ApiError:
        """The backend said nothing in time: 504, naming the limit that ran out."""
        limit = self.timeouts.first_byte_s if stream else self.timeouts.answer_s
        setting = "first_byte_timeout_s" if stream else "request_timeout_s"
        return ApiError(
            504,
            f"the backend sent nothing for {limit:g} s ({setting}); retry, or raise the limit for long prompts",
            code="backend_timeout",
        )

    async def read(self, upstream: aiohttp.ClientResponse, deadline: float | None = None) -> bytes:
        """The whole answer by ``deadline`` (default: the whole-answer bound from now), at most
        ``max_answer_bytes`` (a bigger one is a 502: the gateway would have to hold it in memory)."""
        limit = self.max_answer_bytes
        parts: list[bytes] = []
        size = 0
        finished = False
        try:
            async with asyncio.timeout_at(deadline or _after(self.timeouts.answer_s)):
                if (upstream.content_length or 0) > limit:
                    raise _too_big(limit)
                async for part in upstream.content.iter_any():
                    self._chunks_read += 1
                    size += len(part)
                    if size > limit:
                        raise _too_big(limit)
                    parts.append(part)
            finished = True
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):
                raise self._failure("failed while answering", exc) from exc
            raise self._silent(False) from None
        except aiohttp.ClientError as exc:
            raise self._failure("failed while answering", exc) from exc
        finally:
            self._finish(upstream, finished)
        return b"".join(parts)

    async def page(self, target: EngineTarget, path: str, within_s: float = PAGE_S) -> str | None:
        """The text of an engine page read just before a request is sent (llama-server's ``/slots``), or None
        where it is not a 200 of at most 1 MiB within ``within_s``: the request then goes without what the
        page would have decided. Not counted as the engine's output (the progress watch's evidence)."""
        headers = {"Accept-Encoding": "identity"} | self.headers | bearer_header(target.api_key)
        try:
            async with asyncio.timeout(within_s):
                async with self._client().get(target.base_url + path, headers=headers) as answer:
                    if answer.status != 200:
                        return None
                    data = await answer.content.read(MAX_PAGE_BYTES + 1)
        except (TimeoutError, aiohttp.ClientError):
            return None
        return data.decode("utf-8", "replace") if len(data) <= MAX_PAGE_BYTES else None

    async def post_json(self, target: EngineTarget, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        """(status, parsed answer) of what the gateway asks the engine itself. An answer that is not JSON
        or a redirect is the backend's fault whatever its status: (502, the full OpenAI-shaped error),
        which each dialect words as its own 502 (an engine's 500 HTML page was a 500 on Messages)."""
        deadline = _after(self.timeouts.answer_s)
        upstream = await self.open(target, path, json.dumps(payload).encode(), deadline=deadline)
        data = await self.read(upstream, deadline)
        broken: ApiError | None
        try:
            answer = json.loads(data)
        except ValueError:
            broken = _not_json(upstream.status, upstream.headers.get("Content-Type", ""), data)
        else:
            broken = _redirected(upstream.status)
        if broken is not None:
            return broken.status, broken.body()
        return upstream.status, answer

    async def relay(
        self,
        target: EngineTarget,
        path: str,
        body: bytes,
        *,
        stream: bool,
        rewrite_body: Callable[[bytes], bytes],
        chunk_filter: ChunkFilter | None = None,
        on_close: Callable[[], None] = lambda: None,
        errors: ErrorShape = OPENAI,
        error_event: Callable[[ApiError], bytes] | None = None,
        last_event: bytes | None = None,
        watch: ChunkFilter | None = None,
    ) -> Response:
        """Pass the request through; the response comes back as it came (filtered only if asked). A
        stream that breaks or goes silent ends with an error event in ``errors``' dialect, and so does
        one whose backend ended it without ``last_event`` (chat's ``[DONE]``): it was cut short. The
        engine's usage is reported to the request's tally (read from the answer's own ``usage``); ``watch``
        sees the stream's whole events (the engine's first output: ``first_output.FirstOutput``)."""
        deadline = _after(self.timeouts.first_byte_s if stream else self.timeouts.answer_s)
        try:
            upstream = await self.open(target, path, body, stream=stream, deadline=deadline)
        except ApiError:
            on_close()
            raise
        content_type = upstream.headers.get("Content-Type", "application/json")
        if stream and upstream.status == 200 and content_type.startswith("text/event-stream"):
            # whole events first: the usage tap then parses no event twice nor holds one across reads
            filters: list[ChunkFilter] = [EventAligned(), UsageTap(), *([watch] if watch else [])]
            aligned = chained([*([chunk_filter] if chunk_filter else []), *filters])
            chunks = self._chunks(upstream, deadline, aligned, error_event or errors.sse_event, on_close, last_event)

            def cleanup() -> None:  # a client gone before the body began: the body's finally never ran
                on_close()
                if upstream in self._reading:
                    self._finish(upstream, False)

            return ClosingStream(chunks, cleanup, status_code=200, media_type=content_type, headers=SSE_HEADERS)
        try:
            data = await self.read(upstream, None if stream else deadline)
        finally:
            on_close()
        if upstream.status >= 400 and (overflow := engine_overflow(_json_or_error(data), target.context_length)):
            return errors.response(overflow)  # every engine's "too long" in the one wording agents act on
        if broken := _broken_answer(upstream.status, content_type, data, stream):
            raise broken
        data = rewrite_body(data)
        if upstream.status == 200:  # as the client gets it (a prefilled-ahead prompt's cached count capped)
            report_body(data)
        kept = {name: upstream.headers[name] for name in ("Retry-After", "retry-after-ms") if name in upstream.headers}
        return Response(data, status_code=upstream.status, media_type=content_type, headers=kept)

    async def chat_stream(
        self, target: EngineTarget, body: bytes, chunk_filter: ChunkFilter | None = None
    ) -> tuple[tuple[int, Any] | None, AsyncIterator[Any]]:
        """Open a streamed chat completion for a translator: ((status, parsed error) or None, parsed chunks).
        A broken or silent stream ends with an ``{"error": …}`` chunk the translator words in its dialect."""
        deadline = _after(self.timeouts.first_byte_s)
        upstream = await self.open(target, "/v1/chat/completions", body, stream=True, deadline=deadline)
        content_type = upstream.headers.get("Content-Type", "")
        if upstream.status != 200 or not content_type.startswith("text/event-stream"):
            data = await self.read(upstream)
            broken = _broken_answer(upstream.status, content_type, data, True)
            if broken is not None:
                return (broken.status, broken.body()), _empty()
            return (upstream.status, _json_or_error(data)), _empty()
        chunks = self._chunks(upstream, deadline, chunk_filter, _error_chunk)
        return None, reported_chunks(checked_chunks(chat_chunks(chunks)))

    async def _chunks(
        self,
        upstream: aiohttp.ClientResponse,
        first_deadline: float,
        chunk_filter: ChunkFilter | None,
        error_event: Callable[[ApiError], bytes],
        on_close: Callable[[], None] = lambda: None,
        last_event: bytes | None = None,
    ) -> AsyncGenerator[bytes]:
        """The upstream's bytes as they arrive, the first by ``first_deadline``, each next within the idle
        bound; a broken or silent stream, or one whose last event is not ``last_event`` (when given), ends
        with ``error_event``; ``on_close`` (the slot) runs as soon as the stream is over, before the
        response's last message is sent. The bounds are one timer for the whole stream
        (:class:`_Watchdog`), not one per chunk: a chunk costs a clock read."""
        loop = asyncio.get_running_loop()
        watchdog = _Watchdog(loop, upstream.content, first_deadline, self.timeouts.stream_idle_s)
        finished = False
        whole = True  # what was sent ends at an event's end: a last error event is read as one
        tail = b""  # the upstream's last bytes, where its last event is
        try:
            while True:
                try:
                    chunk = await upstream.content.readany()
                except _Silence:
                    yield _after_whole(whole, error_event(self._stalled(watchdog.first)))
                    break
                except aiohttp.ClientError as exc:
                    log.warning("backend stream broke: %s", type(exc).__name__)
                    yield _after_whole(whole, error_event(self._failure("stopped in the middle of this stream", exc)))
                    break
                if not chunk:
                    if chunk_filter and (rest := chunk_filter.flush()):
                        whole = rest.endswith((b"\n\n", b"\r\n\r\n"))
                        yield rest
                    finished = True
                    if last_event is not None and not tail.rstrip().endswith(last_event):
                        yield _after_whole(whole, error_event(_cut_short(last_event)))
                    break
                tail = chunk[-64:] if len(chunk) >= 64 else (tail + chunk)[-64:]
                watchdog.last = loop.time()
                self._chunks_read += 1
                if watchdog.first:
                    watchdog.started()
                if out := chunk_filter.feed(chunk) if chunk_filter else chunk:
                    whole = out.endswith((b"\n\n", b"\r\n\r\n"))
                    yield out
        except ApiError as error:  # a filter refused what the backend sent (an event over the size cap)
            yield _after_whole(whole, error_event(error))
        finally:
            watchdog.cancel()
            self._finish(upstream, finished)
            on_close()

    async def prefill(
        self,
        target: EngineTarget,
        path: str,
        body: bytes,
        *,
        until: asyncio.Future[None],
        on_event: Callable[[bytes], None],
    ) -> bool:
        """Send a prefill of the gateway's own (gateway.serving.transport.prefill_first) and read its stream
        to the end: True; or until ``until`` is done: False, its connection closed, which the engine hears at
        its next event and cancels. ``on_event`` sees each read (the first says the engine holds it). An
        answer other than a 200 stream, a broken one or one silent for the idle bound raises ApiError."""
        upstream = await self.open(target, path, body, stream=True)
        finished = False
        read: asyncio.Future[bytes] | None = None
        try:
            if upstream.status != 200 or not upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                raise ApiError(502, f"the backend answered a prefill with {upstream.status}", code="backend_error")
            while True:
                read = asyncio.ensure_future(upstream.content.readany())
                either: set[asyncio.Future[Any]] = {read, until}
                done, _ = await asyncio.wait(
                    either, timeout=self.timeouts.stream_idle_s, return_when=asyncio.FIRST_COMPLETED
                )
                if read not in done:
                    if until in done:
                        return False
                    raise self._stalled(False)
                chunk = read.result()
                if not chunk:
                    finished = True
                    return True
                self._chunks_read += 1
                on_event(chunk)
        except aiohttp.ClientError as exc:
            raise self._failure("failed while prefilling", exc) from exc
        finally:
            if read is not None and not read.done():
                read.cancel()
            self._finish(upstream, finished)

    def _finish(self, upstream: aiohttp.ClientResponse, finished: bool) -> None:
        """A body read to its end returns its connection to the pool; one cut short (the client left)
        closes it, which is how the engine learns to stop generating."""
        self._reading.discard(upstream)
        if finished:
            upstream.release()
        else:
            upstream.close()

    def _stalled(self, first: bool) -> ApiError:
        if first:
            limit, setting = self.timeouts.first_byte_s, "first_byte_timeout_s"
        else:
            limit, setting = self.timeouts.stream_idle_s, "stream_idle_timeout_s"
        log.warning("backend stream silent for %g s (%s): ended", limit, setting)
        return ApiError(
            504, f"the backend sent nothing for {limit:g} s in this stream ({setting}); retry the request",
            code="backend_timeout",
        )  # fmt: skip


def _after_whole(whole: bool, event: bytes) -> bytes:
    """A last event after what was sent; after half an event, a blank line ends that one first (else
    the two run together and the client reads neither)."""
    return event if whole else b"\n\n" + event


class EventAligned:
    """Passes a stream on in whole events: the bytes after a read's last event end wait for the next
    read (up to ``max_held``; a longer event passes on as it comes). Why: a passed-through stream cut by
    a stop or a failure ends with an error event, and written after half an event (a read ends anywhere)
    it ran into that event's line: a fast stream stopped with SIGHUP ended, 4 times of 4, in content with
    no readable error. A read that ends an event, as engines write them, is passed on without a copy."""

    def __init__(self, max_held: int = 1 << 20) -> None:
        self.max_held = max_held
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        if self._held:
            chunk, self._held = self._held + chunk, b""
        if chunk.endswith((b"\n\n", b"\r\n\r\n")):
            return chunk
        lf, crlf = chunk.rfind(b"\n\n"), chunk.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if len(chunk) - end > self.max_held:
            return chunk  # an event too long to hold: on as it comes
        self._held = chunk[end:]
        return chunk[:end]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _after(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


def _cut_short(last_event: bytes) -> ApiError:
    """A stream the backend ended without its last event: the client must not read it as complete."""
    return ApiError(
        502, f"the backend ended this stream without {last_event.decode(errors='replace')}: it stopped or was cut "
        "short, and the answer may be incomplete; retry the request", code="backend_stream_incomplete",
    )  # fmt: skip


def _too_big(limit: int) -> ApiError:
    return ApiError(
        502, f"the backend's answer exceeds {limit} bytes (max_answer_bytes)", code="backend_answer_too_large"
    )


def _error_chunk(error: ApiError) -> bytes:
    """An error as a chat-completions chunk, for the translators (they word it in their dialect)."""
    return b"data: " + json.dumps({"error": {"message": error.message}}).encode() + b"\n\n"


class _Cut(aiohttp.ClientConnectionError):
    """Set on a backend answer's reader by :meth:`EngineClient.cut`; its message says why."""


class _Silence(Exception):
    """Set on a stream's reader by its :class:`_Watchdog`: the backend said nothing in time."""


class _Watchdog:
    """One timer per stream instead of one per chunk: it fires at the first-byte deadline, then
    ``idle_s`` after the last chunk (re-arming itself while chunks keep coming), and wakes the pending
    read with :class:`_Silence` when the backend has been quiet too long."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, reader: aiohttp.StreamReader, first_deadline: float, idle_s: float
    ) -> None:
        self.loop, self.reader, self.idle_s = loop, reader, idle_s
        self.first = True
        self.last = loop.time()
        self._timer = loop.call_at(first_deadline, self._check)

    def _check(self) -> None:
        due = self.last + self.idle_s
        if not self.first and due > self.loop.time():
            self._timer = self.loop.call_at(due, self._check)
            return
        self.reader.set_exception(_Silence())

    def started(self) -> None:
        """The first chunk came: from now on the idle bound applies."""
        self.first = False
        self._timer.cancel()
        self._timer = self.loop.call_at(self.last + self.idle_s, self._check)

    def cancel(self) -> None:
        self._timer.cancel()


def _looks_like_json(content_type: str, data: bytes) -> bool:
    return "json" in content_type.lower() and data.lstrip()[:1] in (b"{", b"[")


def _broken_answer(status: int, content_type: str, data: bytes, stream: bool) -> ApiError | None:
    """A 502 for an answer the client must not get as it came: a redirect (not followed), a body that
    is not JSON (a proxy's HTML error page names internal paths), or a stream request answered 200
    without a stream (the client would read an empty success)."""
    if redirected := _redirected(status):
        return redirected
    if stream and status == 200:
        what = f"{content_type or 'no content type'}, {len(data)} bytes"
        return ApiError(502, f"the backend answered a stream request without a stream ({what})", code=MALFORMED)
    if not _looks_like_json(content_type, data):
        return _not_json(status, content_type, data)
    return None


MALFORMED = "backend_malformed_answer"  # the code of every 502 for what the backend sent


def _redirected(status: int) -> ApiError | None:
    if 300 <= status < 400:
        why = f"the backend answered with a redirect ({status}), which the gateway does not follow"
        return ApiError(502, why, code=MALFORMED)
    return None


def _not_json(status: int, content_type: str, data: bytes) -> ApiError:
    what = f"{content_type or 'no content type'}, {len(data)} bytes"
    why = f"the backend answered {status} with a body that is not JSON ({what}); see its log"
    return ApiError(502, why, code=MALFORMED)


def _json_or_error(data: bytes) -> Any:
    """An engine's JSON answer; anything else (a proxy's HTML page) as an OpenAI-shaped error that does
    not repeat the page (it can name the server's internal paths)."""
    try:
        return json.loads(data)
    except ValueError:
        return {"error": {"message": f"the backend answered with a body that is not JSON ({len(data)} bytes)"}}


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover


def translated_stream(
    events: AsyncIterator[bytes],
    on_close: Callable[[], None],
    errors: ErrorShape = OPENAI,
    error_event: Callable[[ApiError], bytes] | None = None,
) -> StreamingResponse:
    """A translator's events as a stream; a bug in it ends the stream with an error event in the
    dialect (``error_event``, default the shape's) rather than a cut connection."""
    final_event = error_event or errors.sse_event

    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for block in events:
                yield block
        except Exception as exc:  # whatever broke, the client reads an error event
            log.exception("translating a stream failed", exc_info=exc)
            yield final_event(ApiError(500, f"internal gateway error ({type(exc).__name__}); see the gateway log"))
        finally:
            on_close()

    return ClosingStream(guarded(), on_close, status_code=200, media_type="text/event-stream", headers=SSE_HEADERS)


class ClosingStream(StreamingResponse):
    """A stream whose ``cleanup`` (freeing the engine slot, closing the upstream) runs however the
    response ends. A body generator's own ``finally`` is not enough: when the client leaves before the
    first chunk is asked for (the response start fails, or the request is cancelled), the generator
    never starts, so its ``finally`` never runs and the slot would be held for good."""

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._cleanup = cleanup

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            body = self.body_iterator
            if isinstance(body, AsyncGenerator):
                await body.aclose()  # a started body runs its own finally now, not when collected
            self._cleanup()
