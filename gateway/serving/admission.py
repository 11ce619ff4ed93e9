"""Admission control: forward at most as many requests as the engine runs at once, queue the rest.

Capacity follows the live engine (vLLM's max_num_seqs, llama.cpp's slots). Beyond it a bounded FIFO
queue; a request that would overflow the queue, or waits longer than the limit, gets 429 with
Retry-After so agents and SDKs back off instead of piling onto a saturated engine.

A slot is held for the length of an ``async with admission.slot() as ticket:`` block, so every way
out of a handler frees it. A streamed response outlives its handler: ``ticket.hand_over()`` gives the
slot to the stream, whose close frees it through the same ``release``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable

from gateway.serving.error_shapes import ApiError, unavailable

RETRY_AFTER_FULL_S = 2


class Ticket:
    """One admitted request's slot; released once (idempotent) when its response is over."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False
        self.handed_over = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._leave()

    def hand_over(self) -> Callable[[], None]:
        """The response outlives the ``slot()`` block (a stream): leaving the block without an error
        keeps the slot, and the returned callable, run when the stream closes, frees it."""
        self.handed_over = True
        return self.release


class Admission:
    def __init__(self, capacity: Callable[[], int], *, queue_limit: int, wait_s: float) -> None:
        self.capacity = capacity
        self.queue_limit = queue_limit
        self.wait_s = wait_s
        self.active = 0
        self.rejected = 0
        self.closed: str | None = None  # why nothing more is admitted (the gateway is stopping)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Ticket]:
        """Wait for a slot (or raise 429) and hold it for the block; an error anywhere in it frees the
        slot even if it was handed over, since no stream will ever run to free it."""
        ticket = await self.enter()
        try:
            yield ticket
        except BaseException:
            ticket.release()
            raise
        if not ticket.handed_over:
            ticket.release()

    def close(self, why: str) -> None:
        """Admit nothing more: every queued request, and every later one, gets 503 + Retry-After."""
        self.closed = why
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(unavailable(why))

    async def enter(self) -> Ticket:
        """A slot now, or a place in the queue until one frees; the caller must release the ticket."""
        if self.closed:
            raise unavailable(self.closed)
        if self.active < max(1, self.capacity()) and not self._waiters:
            self.active += 1
            return Ticket(self)
        if len(self._waiters) >= self.queue_limit:
            self.rejected += 1
            raise _full(f"the engine is busy and {len(self._waiters)} requests are already waiting")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=self.wait_s)
        except TimeoutError:
            if _admitted(waiter):  # admitted at the last moment: give it back
                self._leave()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            self.rejected += 1
            raise _full(f"the request waited {self.wait_s:.0f} s for the engine") from None
        except asyncio.CancelledError:  # the client went away while queued
            if _admitted(waiter):
                self._leave()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        return Ticket(self)

    def _leave(self) -> None:
        """A slot frees: hand it to the oldest waiter, or count it free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on; active stays the same
                return
        self.active -= 1


def _admitted(waiter: asyncio.Future[None]) -> bool:
    """The waiter was given a slot (not cancelled, not refused because the gateway is stopping)."""
    return waiter.done() and not waiter.cancelled() and waiter.exception() is None


def _full(message: str) -> ApiError:
    return ApiError(429, f"{message}; retry shortly", code="rate_limit_exceeded", retry_after_s=RETRY_AFTER_FULL_S)
