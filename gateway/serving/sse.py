"""Server-sent events: reading a chat-completions stream into JSON chunks, and writing events.

Only the translation paths parse streams; passthrough streams are forwarded as raw bytes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

DONE = object()  # the `data: [DONE]` sentinel


async def chat_chunks(raw: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any] | object]:
    """Yield each `data:` payload of an SSE stream as a dict (or DONE), across arbitrary read splits."""
    pending = b""
    async for block in raw:
        pending += block
        while True:
            cut = _event_end(pending)
            if cut < 0:
                break
            event, pending = pending[:cut], pending[cut:].lstrip(b"\r\n")
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    yield DONE
                elif data:
                    try:
                        yield json.loads(data)
                    except ValueError:
                        continue
    for line in pending.splitlines():  # a last event without its blank line
        data = line[5:].strip()
        if line.startswith(b"data:") and data not in (b"", b"[DONE]"):
            try:
                parsed = json.loads(data)
            except ValueError:
                continue
            yield parsed


def _event_end(buffer: bytes) -> int:
    positions = [p for p in (buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")) if p >= 0]
    return min(positions) + 2 if positions else -1


def event(name: str, payload: dict[str, Any]) -> bytes:
    """One named event (Responses and Messages streams name every event)."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def data(payload: dict[str, Any]) -> bytes:
    """One unnamed event (chat-completions streams)."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
