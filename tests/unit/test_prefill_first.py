"""A long prefill run ahead of its request and paused while warm turns are in the engine
(gateway.serving.transport.prefill_first), with an injected engine client and clock; the usage its request
then reports (gateway.serving.wire.reused_cap); and what llama-server is asked (its prefill's fields, the
cached count read from its first progress event)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.backends.llamacpp.scheduling import PREFILL_FIRST, PRIME, progress_figures, slot_holding
from gateway.serving.scheduling.admission import Admission, Claim, ShortTurns
from gateway.serving.transport import prefill_first as module
from gateway.serving.transport.prefill_first import Prefilled, prefill_first
from gateway.serving.wire.error_shapes import ApiError
from gateway.serving.wire.reused_cap import ReusedCap, capped_body

PATH = "/v1/chat/completions"
LONG = {"model": "m", "messages": [{"role": "user", "content": "read " * 50}], "stream_options": {"a": 1}}


def _progress(cache: int) -> bytes:
    return (
        b"data: " + json.dumps({"prompt_progress": {"total": 9, "cache": cache, "processed": cache}}).encode() + b"\n\n"
    )


class Engine:
    """An engine client as prefill_first uses it: each sending sends its first event, then runs until the test
    finishes it (``finish``) or the gateway closes it (the pause)."""

    def __init__(self, cached: int = 4) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.outcomes: list[str] = []  # "finished" or "closed", per sending
        self.cached = cached
        self.finish = asyncio.Event()
        self.fail: ApiError | None = None

    async def prefill(
        self, _target: Any, path: str, body: bytes, *, until: asyncio.Future[None], on_event: Callable[[bytes], None]
    ) -> bool:
        assert path == PATH
        self.bodies.append(json.loads(body))
        if self.fail is not None:
            raise self.fail
        on_event(_progress(self.cached))
        self.cached += 3  # a resumed sending finds what the closed one prefilled
        done = asyncio.ensure_future(self.finish.wait())
        finished, _ = await asyncio.wait({done, until}, return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        self.outcomes.append("finished" if done in finished and not until.done() else "closed")
        return self.outcomes[-1] == "finished"


def _run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=5))


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)  # polled: the scenario's tasks run between two looks


def _start(
    engine: Engine, turns: ShortTurns, held: list[int], placed: list[int] | None = None, worth_pausing: int = 0
) -> asyncio.Task[Prefilled]:
    client: Any = engine

    async def place_again(done: int) -> dict[str, int]:  # the slot that holds what it did, as /slots would say
        assert placed is not None
        placed.append(done)
        return {"id_slot": 1}

    running = prefill_first(
        client, None, PATH, LONG, PREFILL_FIRST, turns, first_fields={"id_slot": 3},
        on_held=lambda: held.append(1), place_again=place_again if placed is not None else None,
        worth_pausing=worth_pausing,
    )  # fmt: skip
    return asyncio.create_task(running)


def test_a_long_prefill_pauses_while_a_warm_turn_is_in_the_engine_and_resumes_unpinned_after_it() -> None:
    async def scenario() -> None:
        engine, turns, held = Engine(cached=4), ShortTurns(), []
        task = _start(engine, turns, held)
        await _until(lambda: len(engine.bodies) == 1)
        first = engine.bodies[0]
        assert first["id_slot"] == 3 and first["stream"] is True and first["return_progress"] is True
        assert first["max_tokens"] == 1 and "stream_options" not in first and first["messages"] == LONG["messages"]
        assert held  # the first event: the engine holds it, the gate may open
        turns.enter()  # a warm turn comes in
        await _until(lambda: engine.outcomes == ["closed"])
        await asyncio.sleep(0.05)  # the window in which a wrong resend would show
        assert len(engine.bodies) == 1  # not sent again while the warm turn is in the engine
        turns.leave()
        await _until(lambda: len(engine.bodies) == 2)
        assert "id_slot" not in engine.bodies[1]  # resumed unpinned (a pinned empty slot skips the RAM cache)
        engine.finish.set()
        assert await task == Prefilled(reused=4, pauses=1)  # what the engine held before the first sending

    _run(scenario)


def test_a_pause_lasts_no_longer_than_the_prefill_has_run_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm turn that never leaves: the prefill resumes once it has been paused the grace, and is not paused
    again before it has run a while (a long prompt keeps half the engine under a steady stream of turns, and
    is not sent again every few hundred milliseconds)."""
    monkeypatch.setattr(module, "GRACE_S", 0.2)
    monkeypatch.setattr(module, "MIN_PAUSE_S", 0.05)
    monkeypatch.setattr(module, "MIN_RUN_S", 0.1)

    async def scenario() -> None:
        engine, turns, held = Engine(), ShortTurns(), []
        loop = asyncio.get_running_loop()
        task = _start(engine, turns, held)
        await _until(lambda: len(engine.bodies) == 1)
        turns.enter()
        paused_at = loop.time()
        await _until(lambda: len(engine.bodies) == 2)  # resumed with the turn still in
        resumed_at = loop.time()
        assert 0.15 <= resumed_at - paused_at < 1.0
        await _until(lambda: len(engine.outcomes) == 2)  # paused again, once it has run enough
        assert loop.time() - resumed_at >= 0.09  # a resumed prefill runs MIN_RUN_S before it may pause again
        engine.finish.set()
        turns.leave()
        await _until(lambda: len(engine.bodies) == 3)
        assert (await task).pauses == 2

    _run(scenario)


def test_a_paused_prefill_resumes_in_the_slot_that_holds_what_it_did() -> None:
    """Sent again wherever llama-server's similarity puts it, a paused prefill can take another session's
    slot that shares its start (that session's own tail lost, unsaved); so the resend carries what the engine's
    page says: the slot still holding the tokens the last progress event counted."""

    async def scenario() -> None:
        engine, turns, held, placed = Engine(cached=7), ShortTurns(), [], []
        turns.enter()  # decoding when the long prompt is admitted: it pauses after its first event
        task = _start(engine, turns, held, placed)
        await _until(lambda: engine.outcomes == ["closed"])
        assert engine.bodies[0]["id_slot"] == 3 and held
        turns.leave()
        await _until(lambda: len(engine.bodies) == 2)
        assert placed == [7] and engine.bodies[1]["id_slot"] == 1  # placed by the 7 tokens it had done
        engine.finish.set()
        assert await task == Prefilled(reused=7, pauses=1)

    _run(scenario)


def test_a_prompt_the_engine_mostly_holds_is_not_paused() -> None:
    """Taken for long by the gateway's estimate, a subagent's first turn the engine holds all but a few tokens
    of runs to its end: paused, it would hold the slot of the conversation whose start it shares."""

    async def scenario() -> None:
        engine, turns, held = Engine(cached=4), ShortTurns(), []  # 5 of its 9 tokens left
        turns.enter()
        task = _start(engine, turns, held, worth_pausing=5)
        await asyncio.sleep(0.05)  # the window in which a wrong pause would show
        assert engine.outcomes == [] and len(engine.bodies) == 1
        engine.finish.set()
        assert await task == Prefilled(reused=4, pauses=0)

    _run(scenario)


def test_a_prefill_that_fails_is_left_to_the_request_and_opens_the_gate() -> None:
    async def scenario() -> None:
        engine, turns, held = Engine(), ShortTurns(), []
        engine.fail = ApiError(503, "the backend did not answer")
        assert await _start(engine, turns, held) == Prefilled(reused=None, pauses=0) and held

    _run(scenario)


def test_the_engine_counts_short_generating_turns_in_it_not_long_ones_nor_token_counts() -> None:
    async def scenario() -> None:
        admission = Admission(lambda: 4, queue_limit=8, wait_s=5)
        long = await admission.enter(Claim(session="a", long=True))
        count = await admission.enter(Claim(session="b", generates=False))
        warm = await admission.enter(Claim(session="c"))
        assert admission.turns.inside == 1
        waiting = asyncio.create_task(admission.turns.changed(5.0))
        await asyncio.sleep(0)
        warm.release()
        warm.release()  # once only
        await waiting  # woken by the change, not the timeout
        assert admission.turns.inside == 0
        long.release()
        count.release()

    _run(scenario)


def test_the_answer_to_a_prefilled_ahead_prompt_says_what_was_cached_before_the_prefill() -> None:
    usage = {"prompt_tokens": 9000, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 8999}}
    timings = {"cache_n": 8999, "prompt_n": 1}
    whole = json.dumps({"choices": [], "usage": usage, "timings": timings}).encode()
    capped = json.loads(capped_body(whole, 2000))
    assert capped["usage"]["prompt_tokens_details"] == {"cached_tokens": 2000}
    assert capped["timings"] == {"cache_n": 2000, "prompt_n": 7000}
    assert capped_body(b"not json", 5) == b"not json"
    event = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    stream = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n' + event + b"data: [DONE]\n\n"
    cap = ReusedCap(100)
    out = b"".join(cap.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + cap.flush()
    events = [json.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    assert events[0]["choices"][0]["delta"] == {"content": "hi"}
    assert events[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 100 and out.endswith(b"data: [DONE]\n\n")


def test_llama_servers_progress_events_say_what_its_slot_held_and_has_done() -> None:
    two = _progress(2560) + b'data: {"prompt_progress": {"total": 9, "cache": 2560, "processed": 3200}}\n\n'
    assert progress_figures(_progress(2560)) == (9, 2560, 2560)
    assert progress_figures(two) == (9, 2560, 3200)  # the last event in the read
    assert progress_figures(b'data: {"choices": []}\n\n') is None
    assert progress_figures(b"data: [DONE]\n\n") is None
    assert progress_figures(b'data: {"prompt_progress": {"cache": -1, "processed": 3}}\n\n') is None


def test_a_paused_prefill_is_placed_in_the_idle_slot_that_holds_its_tokens_or_loads_them_in_the_last() -> None:
    def page(*slots: tuple[bool, int]) -> str:  # as b11434's server_slot::to_json writes each slot
        return json.dumps([{"id": i, "is_processing": b, "n_prompt_tokens": n} for i, (b, n) in enumerate(slots)])

    assert slot_holding(page((False, 20_300), (False, 2_560), (True, 2_500)), 2_496) == {"id_slot": 1}
    assert slot_holding(page((False, 2_600), (False, 2_520)), 2_496) == {"id_slot": 1}  # the closest
    # cleared to the cache: the empty last slot primed, where it loads them (before: unpinned, into the least
    # recently used slot, where a warm turn in a later slot waited for the whole of its run)
    assert slot_holding(page((True, 2_560), (False, 0)), 2_496) == {"id_slot": 1, PRIME: True}
    assert slot_holding(page((False, 0), (True, 300)), 2_496) == {}  # the last slot busy: unpinned
    assert slot_holding(page((False, 20_300)), 2_496) == {}  # another session's: not that one, nor pinned there
    assert slot_holding(page((False, 0)), 0) == {}  # nothing done: nothing to find
    assert slot_holding("<html>", 5) == {}
