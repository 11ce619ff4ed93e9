"""Each request's token figures, taken from the engine's parsed usage and nowhere else.

Why not the response bytes: the access log and ``gateway_tokens_total`` were read with a regex over
every body, and a translated Responses answer echoes the client's ``metadata`` after ``usage``, so a
client wrote its own figures (``{"input_tokens": 0}`` logged in=0; a 309-digit number made the counter
``+Inf`` until restart, a 400-digit one aborted the response). Here a figure is read only at the places
an engine puts usage (a body's or event's ``usage``, a Responses event's ``response.usage``, Anthropic's
``message_start.message.usage``), only as a non-negative integer up to ``usage.MAX_TOKENS``.

The edge layer (``edge.RequestMetrics``) opens a tally per request (:data:`current`); the routes report
into it: a translator with the engine's chat usage, a passthrough with :func:`report_body` or a
:class:`UsageTap` on its stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

from gateway.serving.wire.sse import EventBuffer, EventTooLarge
from gateway.serving.wire.usage import count

# the request's figures: {"in", "out", "cached", "usage"} (usage: 1 once any figure came); None outside a request
current: ContextVar[dict[str, int] | None] = ContextVar("request_tokens", default=None)


def figures(usage: Any) -> dict[str, int] | None:
    """``in`` (the whole prompt), ``out`` and ``cached`` (of ``in``) from one usage object in any dialect
    (OpenAI chat, Responses, Anthropic, which counts a cache read apart from ``input_tokens``); None when
    it holds no usable figure."""
    if not isinstance(usage, dict):
        return None
    read = {name: count(usage.get(name)) for name in _NAMES}
    for details in ("prompt_tokens_details", "input_tokens_details"):
        if isinstance(usage.get(details), dict):
            read[details] = count(usage[details].get("cached_tokens"))
    if all(value is None for value in read.values()):
        return None
    got = {name: value or 0 for name, value in read.items()}
    cache_read = got["cache_read_input_tokens"]
    prompt = max(got["prompt_tokens"], got["input_tokens"] + cache_read)
    cached = max(got.get("prompt_tokens_details", 0), got.get("input_tokens_details", 0), cache_read)
    return {
        "in": prompt,
        "out": max(got["completion_tokens"], got["output_tokens"]),
        "cached": min(cached, prompt),
    }


_NAMES = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens", "cache_read_input_tokens")


def report(usage: Any) -> None:
    """Add one usage object's figures to the current request: the largest per direction (a stream
    repeats its input count, and Anthropic's message_delta restates the final output count)."""
    tally = current.get()
    found = figures(usage)
    if tally is None or found is None:
        return
    tally["usage"] = 1
    for direction, value in found.items():
        tally[direction] = max(tally[direction], value)


def report_payload(payload: Any) -> None:
    """The usage of one parsed answer or stream event, read only where engines put it."""
    if not isinstance(payload, dict):
        return
    report(payload.get("usage"))
    for holder in ("response", "message"):  # Responses events; Anthropic's message_start
        if isinstance(payload.get(holder), dict):
            report(payload[holder].get("usage"))


def report_body(body: bytes) -> None:
    """A non-streamed answer passed through: its usage, when it is JSON and names one."""
    if current.get() is None or b'"usage"' not in body:
        return
    try:
        report_payload(json.loads(body))
    except (ValueError, RecursionError):
        return


async def reported_chunks(chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A translated stream's parsed chat chunks, passed on; each one's usage reported on the way."""
    async for chunk in chunks:
        if isinstance(chunk, dict) and "usage" in chunk:
            report(chunk["usage"])
        yield chunk


class UsageTap:
    """Watches a passed-through stream for its usage events (a chunk filter that changes nothing).

    Only events that hold ``"usage"`` are parsed; the bytes of an event split across reads are held
    until it ends (at most :data:`sse.MAX_EVENT_BYTES`; a longer one is not watched)."""

    def __init__(self) -> None:
        self._events = EventBuffer()
        self._holding = False  # an event began in an earlier read and has not ended

    def feed(self, chunk: bytes) -> bytes:
        if current.get() is None:
            return chunk
        if not self._holding and b'"usage"' not in chunk:
            self._hold_tail(chunk)
            return chunk
        try:
            events = self._events.feed(chunk)
        except EventTooLarge:
            events = []
        self._holding = self._events.holding > 0
        for event in events:
            if b'"usage"' in event:
                _report_event(event)
        return chunk

    def flush(self) -> bytes:
        _report_event(self._events.rest())
        self._holding = False
        return b""

    def _hold_tail(self, chunk: bytes) -> None:
        """Keep what follows the chunk's last event end: the start of an event the next read ends."""
        lf, crlf = chunk.rfind(b"\n\n"), chunk.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        tail = chunk[end:]
        if tail:
            try:
                self._events.feed(tail)
            except EventTooLarge:
                return
            self._holding = True


def _report_event(event: bytes) -> None:
    for line in event.splitlines():
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                report_payload(json.loads(line[5:]))
            except (ValueError, RecursionError):
                continue
