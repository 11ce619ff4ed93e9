"""Noticing the engine's first output in a stream: the moment its prefill is over.

The scheduler's long-prefill lane (gateway.serving.scheduling.admission) frees when a long prompt's
prefill ends, and that is the engine's first output, not the client's first bytes: a translated
Messages or Responses stream opens with ``message_start`` / ``response.created`` as soon as the
engine's headers come, before any token, and on those routes two long prefills were admitted at once
where chat admitted one. So the watch sits on the engine's side of a stream (its bytes as they are
read), and skips the events an API opens every stream with before any token (an engine that serves
Messages or Responses itself sends them too); a stream that ends first frees the lane with its slot.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_BLOCK_END = re.compile(rb"\r?\n\r?\n")
_EVENT_NAME = re.compile(rb"^event:[ \t]*(\S*)", re.MULTILINE)
_DATA = re.compile(rb"^data:", re.MULTILINE)


class FirstOutput:
    """A chunk filter that changes nothing and calls ``on_output`` once, at the first event with data
    that is not one of ``opening`` (event names); without ``opening``, at the first bytes. It expects
    whole events (after ``EventAligned``) where ``opening`` is given."""

    def __init__(self, on_output: Callable[[], None], opening: frozenset[str] = frozenset()) -> None:
        self._on_output: Callable[[], None] | None = on_output
        self.opening = opening

    def feed(self, chunk: bytes) -> bytes:
        if self._on_output is not None and chunk and self._holds_output(chunk):
            on_output, self._on_output = self._on_output, None
            on_output()
        return chunk

    def flush(self) -> bytes:
        return b""

    def _holds_output(self, chunk: bytes) -> bool:
        if not self.opening:
            return True
        for block in _BLOCK_END.split(chunk):
            if not _DATA.search(block):
                continue  # a comment, a keep-alive, or the tail of a split event
            name = _EVENT_NAME.search(block)
            if name is None or name[1].decode("utf-8", "replace") not in self.opening:
                return True
        return False
