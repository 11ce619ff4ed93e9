"""Which replica each conversation was last served on, in bounded memory.

Sessions are not few (every subagent is one, and clients choose the ids), so the table keeps at most
``limit`` names, the least recently served going first, and forgets a name not served for ``ttl_s``
(its replica has most likely evicted that cache by then, and a name forgotten only costs the placement
of a new conversation). Each binding carries the replica's generation when it was made: a replica that
restarted lost its cache, and the binding then no longer says where the cache is.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

BINDINGS_KEPT = 16_384  # names kept (LRU); ~150 bytes each
BINDING_TTL_S = 3600.0  # a name not served for an hour is forgotten


@dataclass
class Binding:
    replica: str
    generation: int
    seen: float
    conversation: bool  # named a request's own conversation at least once (not only a parent)


class Bindings:
    """Name → the replica that served it last; bounded by count and by idle time."""

    def __init__(
        self, *, limit: int = BINDINGS_KEPT, ttl_s: float = BINDING_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.ttl_s = ttl_s
        self.clock = clock
        self._table: collections.OrderedDict[str, Binding] = collections.OrderedDict()  # oldest seen first
        self.conversations: collections.Counter[str] = collections.Counter()  # replica → conversations bound

    def __len__(self) -> int:
        return len(self._table)

    def get(self, name: str) -> Binding | None:
        self.expire()
        return self._table.get(name)

    def bind(self, name: str, replica: str, generation: int, *, conversation: bool) -> None:
        """``name`` was served on ``replica`` now (a conversation, or a parent one that a request named)."""
        old = self._table.pop(name, None)
        is_conversation = conversation or (old is not None and old.conversation)
        if old is not None and old.conversation:
            self._uncount(old.replica)
        self._table[name] = Binding(replica, generation, self.clock(), is_conversation)
        if is_conversation:
            self.conversations[replica] += 1
        while len(self._table) > self.limit:
            self._drop_oldest()

    def expire(self) -> None:
        """Forget the names not served for ``ttl_s`` (the table is in the order they were last served)."""
        horizon = self.clock() - self.ttl_s
        while self._table and next(iter(self._table.values())).seen < horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, binding = self._table.popitem(last=False)
        if binding.conversation:
            self._uncount(binding.replica)

    def _uncount(self, replica: str) -> None:
        self.conversations[replica] -= 1
        if self.conversations[replica] <= 0:
            del self.conversations[replica]
