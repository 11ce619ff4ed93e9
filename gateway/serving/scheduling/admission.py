"""Admission: forward at most as many requests as the engine runs at once, and choose who goes next.

Capacity follows the live engine (vLLM's max_num_seqs, llama.cpp's slots). Beyond it a bounded queue;
a request that would overflow the queue, or waits longer than the limit, gets 429 with Retry-After so
agents and SDKs back off instead of piling onto a saturated engine.

The queue is not first-in first-out. Many agents share one engine, and a warm turn (a session's next
tool result: a few hundred tokens to prefill) must not wait a minute behind other sessions' cold 20k-token
prefills. When a slot frees, the next request is, in order:

1. a request that has waited ``aging_s`` or longer, the oldest first, whatever its key's or session's
   counts: every wait is bounded (a long turn of a session with a request in flight, under a stream
   of short ones from fresh sessions, waited for good while aging only made it short: the counts
   below ranked first);
2. from the key with the fewest requests in flight (one key's burst of 20 subagents cannot hold every
   slot while another key waits), then the session with the fewest;
3. a short prefill before a long one (:class:`Claim`: the gateway's estimate of what the engine must
   prefill, :mod:`gateway.serving.scheduling.sessions`);
4. the oldest.

Two limits hold a request back even with a slot free: a cap on each key's requests in flight (a
setting; 0: none), and the **long-prefill lane**: at most ``long_lane()`` long prefills in the engine at
once (the engine says how many it can run without starving short ones: :class:`gateway.backends.base.Scheduling`),
so the other slots stay free for warm turns. A long request leaves the lane when the engine's first output
comes (its prefill is over: :meth:`Ticket.prefilled`, called by the route), not when its answer ends.
An aged request still waits for these limits (its key's own requests, a long prefill's first token).

A slot is held for the length of an ``async with admission.slot(claim) as ticket:`` block, so every way
out of a handler frees it. A streamed response outlives its handler: ``ticket.hand_over()`` gives the
slot to the stream, whose close frees it through the same ``release``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from gateway.serving.wire.error_shapes import ApiError, unavailable

RETRY_AFTER_FULL_S = 2
AGING_S = 30.0  # a request waiting this long goes before every request that has not


@dataclass(frozen=True)
class Claim:
    """What a request asks of the engine, as the scheduler orders it."""

    key: str = "open"  # the API key's id (gateway.serving.scheduling.sessions.key_id)
    session: str = ""
    prefill_tokens: int = 0  # the gateway's estimate of what the engine must prefill
    # a long prefill were it sent now (what the engine has already prefilled counts, a prompt it is still
    # prefilling does not): it takes the long-prefill lane, so one that shares that prompt's start waits for it
    long: bool = False
    # called once the engine has prefilled the prompt (the prompt's prefix counts as held from then on)
    on_prefilled: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    generates: bool = True  # False: it asks the engine for no answer (a token count)
    # the tokens of its prompt the engine held when it came (the gateway's estimate: its prefilled prefixes)
    held_tokens: int = 0
    # what the engine would prefill of it were it sent now (the same estimate, read again): a long prefill
    # that waited in the lane for a start another request was prefilling may find that start held by then
    prefill_now: Callable[[], int] | None = field(default=None, compare=False, repr=False)


class Ticket:
    """One admitted request's slot; released once (idempotent) when its response is over."""

    def __init__(self, admission: Admission, claim: Claim, queued_s: float) -> None:
        self._admission = admission
        self.claim = claim
        self.queued_s = queued_s  # time spent waiting for the slot
        self._released = False
        self._in_lane = claim.long
        self._prefilled = False
        self.handed_over = False
        # a short turn is counted among the engine's while it is there (a long prefill pauses for it)
        self._short = claim.generates and not claim.long
        if self._short:
            admission.turns.enter()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.prefilled()
            if self._short:
                self._admission.turns.leave()
            self._admission._leave(self.claim)

    def prefilled(self) -> None:
        """The engine has begun to answer, or the answer is over (the prompt is prefilled): the claim
        hears it once, and the long-prefill lane frees."""
        if not self._prefilled:
            self._prefilled = True
            if self.claim.on_prefilled is not None:
                self.claim.on_prefilled()
        if self._in_lane:
            self._in_lane = False
            self._admission._leave_lane()

    def hand_over(self) -> Callable[[], None]:
        """The response outlives the ``slot()`` block (a stream): leaving the block without an error
        keeps the slot, and the returned callable, run when the stream closes, frees it."""
        self.handed_over = True
        return self.release


class ShortTurns:
    """How many short requests are in one engine, and a wait for that number to change: a long prefill the
    gateway runs itself pauses while there are any (gateway.serving.transport.prefill_first)."""

    def __init__(self) -> None:
        self.inside = 0
        self._listeners: list[asyncio.Future[None]] = []

    def enter(self) -> None:
        self.inside += 1
        self._changed()

    def leave(self) -> None:
        self.inside -= 1
        self._changed()

    async def changed(self, within_s: float) -> None:
        """Return when one enters or leaves, or after ``within_s``."""
        future = asyncio.get_running_loop().create_future()
        self._listeners.append(future)
        try:
            await asyncio.wait_for(future, timeout=max(within_s, 0.0))
        except TimeoutError:
            pass
        finally:
            if future in self._listeners:
                self._listeners.remove(future)

    def _changed(self) -> None:
        listeners, self._listeners = self._listeners, []
        for future in listeners:
            if not future.done():
                future.set_result(None)


@dataclass(eq=False)
class _Waiter:
    claim: Claim
    since: float
    order: int
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Admission:
    def __init__(
        self,
        capacity: Callable[[], int],
        *,
        queue_limit: int,
        wait_s: float,
        per_key_limit: int = 0,
        long_lane: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
        aging_s: float = AGING_S,
        by_key: collections.Counter[str] | None = None,
        pool: list[Admission] | None = None,
    ) -> None:
        self.capacity = capacity
        self.queue_limit = queue_limit
        self.wait_s = wait_s
        self.per_key_limit = per_key_limit  # requests in flight per key; 0: no cap
        self.long_lane = long_lane  # long prefills in the engine at once; 0: no lane (every slot may take one)
        self.clock = clock
        self.aging_s = aging_s
        self.active = 0
        self.long_active = 0
        self.rejected = 0
        self.turns = ShortTurns()  # the short requests in the engine (a long prefill run ahead pauses for them)
        self.prefilled_ahead = 0  # long prompts prefilled ahead of their requests (transport.prefill_first)
        self.prefill_pauses = 0  # times those were paused for short turns
        self.closed: str | None = None  # why nothing more is admitted (the gateway is stopping)
        # requests in flight per key: shared by the admissions of a pool's replicas (one count over the pool)
        self.by_key: collections.Counter[str] = by_key if by_key is not None else collections.Counter()
        # the admissions that share ``by_key`` (a pool's replicas): a slot freed on one may let a request of
        # the same key start on another, so each is asked again then
        self.pool = pool if pool is not None else []
        self.pool.append(self)
        self.by_session: collections.Counter[str] = collections.Counter()
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def slot(self, claim: Claim | None = None) -> AsyncIterator[Ticket]:
        """Wait for a slot (or raise 429) and hold it for the block; an error anywhere in it frees the
        slot even if it was handed over, since no stream will ever run to free it."""
        ticket = await self.enter(claim)
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
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(unavailable(why))

    async def enter(self, claim: Claim | None = None) -> Ticket:
        """A slot now, or a place in the queue until the scheduler picks this request; the caller must
        release the ticket."""
        if self.closed:
            raise unavailable(self.closed)
        claim = claim or Claim()
        started = self.clock()
        waiter = _Waiter(claim, started, next(self._order))
        self._waiters.append(waiter)
        self._dispatch()
        if waiter.future.done():
            return Ticket(self, claim, 0.0)
        if len(self._waiters) > self.queue_limit:  # the others waiting, this one aside
            self._waiters.remove(waiter)
            self.rejected += 1
            raise _full(f"the engine is busy and {len(self._waiters)} requests are already waiting")
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout=self.wait_s)
        except TimeoutError:
            self._withdraw(waiter)
            self.rejected += 1
            raise _full(f"the request waited {self.wait_s:.0f} s for the engine") from None
        except asyncio.CancelledError:  # the client went away while queued
            self._withdraw(waiter)
            raise
        return Ticket(self, claim, max(self.clock() - started, 0.0))

    def _withdraw(self, waiter: _Waiter) -> None:
        """A waiter leaves (timed out, or its client went away): a slot given at the last moment goes back."""
        if _admitted(waiter.future):
            self._leave(waiter.claim)
            if waiter.claim.long:
                self._leave_lane()
        elif waiter in self._waiters:
            self._waiters.remove(waiter)

    def _eligible(self, waiter: _Waiter) -> bool:
        claim = waiter.claim
        if self.per_key_limit and self.by_key[claim.key] >= self.per_key_limit:
            return False
        lane = self.long_lane()
        return not (claim.long and lane and self.long_active >= lane)

    def _rank(self, waiter: _Waiter, now: float) -> tuple[int, int, int, int, int]:
        """Lowest goes first: aged requests by arrival, then the rest by key, session, length, arrival."""
        if now - waiter.since >= self.aging_s:
            return (0, 0, 0, 0, waiter.order)
        claim = waiter.claim
        return (1, self.by_key[claim.key], self.by_session[claim.session], int(claim.long), waiter.order)

    def _dispatch(self) -> None:
        """Give free slots to the best eligible waiters, one at a time (each start changes the ranks)."""
        while self._waiters and self.active < max(1, self.capacity()):
            now = self.clock()
            eligible = [waiter for waiter in self._waiters if self._eligible(waiter)]
            if not eligible:
                return
            chosen = min(eligible, key=lambda waiter: self._rank(waiter, now))
            self._waiters.remove(chosen)
            if chosen.future.done():  # cancelled while it waited
                continue
            self.active += 1
            self.by_key[chosen.claim.key] += 1
            self.by_session[chosen.claim.session] += 1
            if chosen.claim.long:
                self.long_active += 1
            chosen.future.set_result(None)

    def _leave(self, claim: Claim) -> None:
        """A slot frees: it goes to whoever the scheduler picks next."""
        self.active -= 1
        for counter, name in ((self.by_key, claim.key), (self.by_session, claim.session)):
            counter[name] -= 1
            if counter[name] <= 0:
                del counter[name]
        self._dispatch()
        if self.per_key_limit:
            for peer in self.pool:
                if peer is not self:
                    peer._dispatch()

    def _leave_lane(self) -> None:
        self.long_active -= 1
        self._dispatch()


def _admitted(future: asyncio.Future[None]) -> bool:
    """The waiter was given a slot (not cancelled, not refused because the gateway is stopping)."""
    return future.done() and not future.cancelled() and future.exception() is None


def _full(message: str) -> ApiError:
    return ApiError(429, f"{message}; retry shortly", code="rate_limit_exceeded", retry_after_s=RETRY_AFTER_FULL_S)
