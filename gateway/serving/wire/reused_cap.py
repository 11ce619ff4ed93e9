"""The usage of a request whose prompt the gateway prefilled just before it (transport.prefill_first).

That request reaches the engine with its whole prompt cached, so the engine's usage says it reused the
tokens the gateway had it prefill a moment before for this very request, and a cold 20k-token turn would
read as warm to the client, the per-key figures and the benchmarks. The client gets what the engine
held before that prefill began (the engine's own figure, read at the prefill's first event): the cached
count is capped there, and llama-server's ``timings`` move the difference from cached to prompt.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.serving.wire.sse import EventBuffer, EventTooLarge


def cap_answer(answer: Any, reused: int) -> None:
    """Cap, in place, the cached figures of one chat answer or chunk at ``reused``."""
    if not isinstance(answer, dict):
        return
    usage = answer.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and _count(details.get("cached_tokens")):
        details["cached_tokens"] = min(details["cached_tokens"], reused)
    timings = answer.get("timings")
    if isinstance(timings, dict) and _count(timings.get("cache_n")) and _count(timings.get("prompt_n")):
        moved = max(timings["cache_n"] - reused, 0)
        timings["cache_n"] -= moved
        timings["prompt_n"] += moved


def capped_body(data: bytes, reused: int) -> bytes:
    """A whole JSON answer with its cached figures capped; anything else as it came."""
    if b'"usage"' not in data and b'"timings"' not in data:
        return data
    try:
        answer = json.loads(data)
    except ValueError:
        return data
    cap_answer(answer, reused)
    return json.dumps(answer).encode()


class ReusedCap:
    """A chunk filter that caps the cached figures of a stream's events (only events that carry usage or
    timings are parsed; the others pass as they came, once whole)."""

    def __init__(self, reused: int) -> None:
        self.reused = reused
        self._events = EventBuffer()

    def feed(self, chunk: bytes) -> bytes:
        try:
            events = self._events.feed(chunk)
        except EventTooLarge:  # passed on as it is: the stream's own checks refuse it
            return self._events.rest()
        return b"".join(self._capped(event) for event in events)

    def flush(self) -> bytes:
        rest = self._events.rest()
        return self._capped(rest) if rest else b""

    def _capped(self, event: bytes) -> bytes:
        if b'"usage"' not in event and b'"timings"' not in event:
            return event
        lines = event.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                lines[i] = b"data: " + capped_body(line[5:].strip(), self.reused)
        return b"\n".join(lines)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
