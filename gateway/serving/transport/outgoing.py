"""A request's body as the engine gets it: the client's own bytes, unless the gateway changed a field.

A field may change after the body was first read and checked: a long prefill's slot is chosen only once
it holds an engine slot (:class:`gateway.backends.base.LongPin`), and a request sent again to another
replica gets that replica's choice, not the first one's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class Outgoing:
    """``payload`` (the parsed body, changed in place) and the client's ``raw`` bytes; :meth:`body` re-encodes
    only where something changed."""

    def __init__(self, payload: dict[str, Any], raw: bytes = b"", *, changed: bool = True, path: str = "") -> None:
        self.payload = payload
        self.raw = raw
        self.path = path  # the engine's route it goes to
        # the prompt tokens the engine held before the gateway prefilled this prompt ahead of the request
        # (transport.prefill_first): what the answer's usage says was cached; None: not prefilled ahead
        self.reused: int | None = None
        self.changed = changed or not raw
        self._pinned: tuple[str, ...] = ()

    def pin(self, fields: Mapping[str, Any]) -> None:
        """Fields for this sending alone: the last sending's are taken out first (another replica, another slot)."""
        for name in self._pinned:
            self.payload.pop(name, None)
            self.changed = True
        self.payload.update(fields)
        self._pinned = tuple(fields)
        self.changed |= bool(fields)

    def body(self) -> bytes:
        return json.dumps(self.payload).encode() if self.changed else self.raw
