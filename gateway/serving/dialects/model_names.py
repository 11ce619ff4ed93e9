"""Model names at the edge: the fronted name and aliases in, the backend's served name out.

Launched backends are told to serve under the fronted name, so responses need no rewriting and
the hot path stays byte-for-byte. A backend we did not name (an external server) may answer with
its own name; then responses are rewritten so clients only ever see the fronted name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.serving.wire.error_shapes import ApiError
from gateway.serving.wire.sse import MAX_EVENT_BYTES, EventTooLarge


@dataclass(frozen=True)
class ModelRoute:
    """The names a model is asked for by (fronted, aliases) and the one the backend answers to; its
    context is the backend's (``ServedBackend.context_length``), the one figure from plan to model card."""

    fronted: str
    served: str
    aliases: tuple[str, ...] = ()
    _lookup: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = {name.lower(): name for name in (self.fronted, *self.aliases, self.served)}
        object.__setattr__(self, "_lookup", names)

    @property
    def rewrites_responses(self) -> bool:
        return self.served != self.fronted

    def accepts(self, requested: str) -> bool:
        """Exact or case-insensitive match of the fronted name, an alias or the served name."""
        return requested.lower() in self._lookup

    def rewrite_json(self, payload: dict[str, Any]) -> None:
        """Name the fronted model in a decoded response body (in place)."""
        if payload.get("model") == self.served:
            payload["model"] = self.fronted

    def rewrite_body(self, body: bytes) -> bytes:
        """Name the fronted model in a complete JSON response body."""
        if not self.rewrites_responses:
            return body
        try:
            payload = json.loads(body)
        except ValueError:
            return body
        if not isinstance(payload, dict):
            return body
        self.rewrite_json(payload)
        try:
            return json.dumps(payload, allow_nan=False).encode()
        except ValueError:  # a number JSON cannot write back (1e400 parses to infinity): the body as it came
            return body

    def stream_rewriter(self) -> StreamRewriter | None:
        """A rewriter for one SSE stream, or None when the stream passes through untouched."""
        return StreamRewriter(self.served, self.fronted) if self.rewrites_responses else None


class StreamRewriter:
    """Renames the model in raw SSE bytes without parsing JSON (both common spacings).

    Network reads can split a ``"model": "x"`` pair, so bytes after the last newline are held back
    until the next chunk (or :meth:`flush`) completes the line.
    """

    def __init__(self, served: str, fronted: str) -> None:
        served_json, fronted_json = json.dumps(served).encode(), json.dumps(fronted).encode()
        self._pairs = [
            (b'"model":' + served_json, b'"model":' + fronted_json),
            (b'"model": ' + served_json, b'"model": ' + fronted_json),
        ]
        self._pending = bytearray()

    def _rename(self, data: bytes) -> bytes:
        for old, new in self._pairs:
            data = data.replace(old, new)
        return data

    def feed(self, chunk: bytes) -> bytes:
        """Only the new chunk is searched for the last newline; a line longer than an SSE event may be
        ends the stream (an ApiError) rather than being held without bound."""
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            self._pending += chunk
            if len(self._pending) > MAX_EVENT_BYTES:
                self._pending.clear()
                raise ApiError(502, str(EventTooLarge(MAX_EVENT_BYTES)), code="backend_event_too_large")
            return b""
        data = bytes(self._pending) + chunk[:cut]
        self._pending = bytearray(chunk[cut:])
        return self._rename(data)

    def flush(self) -> bytes:
        data = bytes(self._pending)
        self._pending.clear()
        return self._rename(data)
