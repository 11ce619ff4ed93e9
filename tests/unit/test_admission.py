"""Admission control on its own: capacity, the FIFO queue, its limits, and a slot freed exactly once
on every way out (block end, error, a stream that took the slot over, a client that left)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.serving.scheduling.admission import RETRY_AFTER_FULL_S, Admission, Ticket
from gateway.serving.wire.error_shapes import ApiError


def _run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=5))


def _gate(capacity: int = 2, *, queue_limit: int = 4, wait_s: float = 5.0) -> Admission:
    return Admission(lambda: capacity, queue_limit=queue_limit, wait_s=wait_s)


async def _queued(gate: Admission) -> asyncio.Task[Ticket]:
    """A request that has to wait, once it is in the queue."""
    task = asyncio.create_task(gate.enter())
    for _ in range(10):
        await asyncio.sleep(0)
        if gate.queued:
            break
    return task


def test_admits_up_to_capacity_then_queues_and_passes_the_slot_on() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=2)
        first, second = await gate.enter(), await gate.enter()
        assert (gate.active, gate.queued) == (2, 0)
        third = await _queued(gate)
        assert gate.queued == 1 and not third.done()
        first.release()
        admitted = await third
        assert (gate.active, gate.queued) == (2, 0)  # the freed slot went to the waiter
        second.release()
        admitted.release()
        assert gate.active == 0

    _run(scenario)


def test_capacity_follows_the_live_engine_and_is_at_least_one() -> None:
    async def scenario() -> None:
        capacity = [0]
        gate = Admission(lambda: capacity[0], queue_limit=4, wait_s=5)
        held = await gate.enter()  # capacity 0 (no engine yet) still lets one through
        waiting = await _queued(gate)
        capacity[0] = 3  # the engine restarted with more slots
        held.release()
        tickets = [await waiting, await gate.enter(), await gate.enter()]
        assert (gate.active, gate.queued) == (3, 0)
        fourth = await _queued(gate)
        assert gate.queued == 1 and not fourth.done()
        tickets[0].release()
        tickets[0] = await fourth
        for ticket in tickets:
            ticket.release()
        assert gate.active == 0

    _run(scenario)


def test_the_queue_is_first_in_first_out() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1)
        held = await gate.enter()
        early = await _queued(gate)
        late = await _queued(gate)
        assert gate.queued == 2
        held.release()
        first = await early
        await asyncio.sleep(0)
        assert not late.done() and gate.queued == 1
        first.release()
        (await late).release()
        assert (gate.active, gate.queued) == (0, 0)

    _run(scenario)


def test_a_full_queue_is_429_with_retry_after() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1, queue_limit=1)
        held = await gate.enter()
        waiting = await _queued(gate)
        with pytest.raises(ApiError) as refused:
            await gate.enter()
        error = refused.value
        assert error.status == 429 and error.code == "rate_limit_exceeded"
        assert error.retry_after_s == RETRY_AFTER_FULL_S
        assert error.headers() == {"Retry-After": "2", "retry-after-ms": "2000"}
        assert "1 requests are already waiting" in error.message
        assert (gate.rejected, gate.queued, gate.active) == (1, 1, 1)
        held.release()
        (await waiting).release()
        assert gate.active == 0

    _run(scenario)


def test_no_queue_at_all_refuses_at_once() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1, queue_limit=0)
        held = await gate.enter()
        with pytest.raises(ApiError, match="busy"):
            await gate.enter()
        held.release()
        (await gate.enter()).release()
        assert gate.active == 0

    _run(scenario)


def test_waiting_longer_than_the_limit_is_429_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1, wait_s=0.05)
        held = await gate.enter()
        with pytest.raises(ApiError, match="waited") as refused:
            await gate.enter()
        assert refused.value.status == 429
        assert (gate.queued, gate.rejected, gate.active) == (0, 1, 1)
        held.release()
        assert gate.active == 0

    _run(scenario)


def test_a_client_that_leaves_while_queued_gives_up_its_place() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1)
        held = await gate.enter()
        gone = await _queued(gate)
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        assert gate.queued == 0
        held.release()
        assert gate.active == 0  # the slot was not handed to the request that left
        (await gate.enter()).release()
        assert gate.active == 0

    _run(scenario)


def test_a_client_that_leaves_as_its_slot_comes_passes_the_slot_on() -> None:
    """A queued request is cancelled and, before it runs again, the slot is handed to it: the slot must
    not stay counted for a request that will never release it."""

    async def scenario() -> None:
        gate = _gate(capacity=1)
        held = await gate.enter()
        gone = await _queued(gate)
        gone.cancel()  # the client goes away...
        held.release()  # ...and in the same turn of the loop its slot comes
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert (gate.active, gate.queued) == (0, 0)
        (await asyncio.wait_for(gate.enter(), timeout=1)).release()
        assert gate.active == 0

    _run(scenario)


def test_release_is_idempotent() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=2)
        first, second = await gate.enter(), await gate.enter()
        first.release()
        first.release()
        assert gate.active == 1
        second.release()
        assert gate.active == 0

    _run(scenario)


def test_a_slot_is_held_for_the_block_and_freed_on_exit_or_error() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1)
        async with gate.slot():
            assert gate.active == 1
        assert gate.active == 0
        with pytest.raises(RuntimeError):
            async with gate.slot():
                raise RuntimeError("the upstream refused")
        assert gate.active == 0
        with pytest.raises(ApiError):
            async with gate.slot():
                raise ApiError(400, "bad request found after admission")
        assert gate.active == 0

    _run(scenario)


def test_a_handed_over_slot_is_freed_by_the_stream_once() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1)
        async with gate.slot() as ticket:
            close = ticket.hand_over()
        assert gate.active == 1  # the stream still runs
        close()
        close()
        assert gate.active == 0

    _run(scenario)


def test_a_handed_over_slot_is_freed_when_the_block_fails_before_the_stream_starts() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1)
        with pytest.raises(RuntimeError):
            async with gate.slot() as ticket:
                ticket.hand_over()
                raise RuntimeError("failed before the response was returned")
        assert gate.active == 0

    _run(scenario)


def test_a_slot_block_waits_in_the_queue_like_enter() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1, queue_limit=0)
        async with gate.slot():
            with pytest.raises(ApiError, match="busy"):
                async with gate.slot():
                    pass
        assert (gate.active, gate.rejected) == (0, 1)

    _run(scenario)


def test_closing_refuses_the_queue_and_newcomers_with_503_while_admitted_requests_keep_their_slots() -> None:
    async def scenario() -> None:
        gate = _gate(capacity=1)
        running = await gate.enter()
        waiting = await _queued(gate)
        gate.close("the gateway is shutting down; retry shortly")
        with pytest.raises(ApiError) as refused:
            await waiting
        assert refused.value.status == 503 and refused.value.retry_after_s and "shutting down" in refused.value.message
        with pytest.raises(ApiError) as late:
            await gate.enter()
        assert late.value.status == 503
        assert (gate.active, gate.queued) == (1, 0)
        running.release()
        assert (gate.active, gate.queued) == (0, 0)

    _run(scenario)
