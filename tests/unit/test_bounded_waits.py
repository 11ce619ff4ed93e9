"""Every queued request has a bounded wait (issue 47): a request past the aging limit goes first whatever
its key's or session's counts; one request cannot flush the memory of prefixes that tells warm turns
from cold ones; the long-prefill lane opens on the engine's first output on every route, not on the
first event a translator writes; a large prompt is fingerprinted beside the event loop."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.backends.base import Scheduling
from gateway.serving.app import create_app
from gateway.serving.scheduling import sessions
from gateway.serving.scheduling.admission import AGING_S, Admission, Claim
from gateway.serving.scheduling.sessions import KnownPrefixes, PromptUnits, kept_units, prompt_units
from gateway.serving.transport.first_output import FirstOutput
from tests.unit.http_harness import FRONTED, FakeEngine, Served, make_runtime
from tests.unit.test_http_gateway import _gateway
from tests.unit.test_scheduler import Clock, _messages, _next_admitted, _queue, _run
from tests.waiting import async_wait_until

# -- a request past the aging limit goes first ---------------------------------------------------------------


def _short(session: str, key: str = "key-a") -> Claim:
    return Claim(key=key, session=session, prefill_tokens=100, long=False)


@pytest.mark.parametrize("busy", ["session", "key"])
def test_a_request_past_the_aging_limit_goes_before_fresh_sessions_whatever_its_counts(busy: str) -> None:
    """The adversarial case: a long turn whose session (or key) has one request in flight, under a stream
    of short ones from fresh sessions (or keys). Aging once made it short, which still ranked below the
    counts, so it never started; now it starts at the first slot that frees after the aging limit."""

    async def scenario() -> float:
        clock = Clock()
        gate = Admission(lambda: 2, queue_limit=8, wait_s=600, clock=clock, aging_s=AGING_S)
        own = Claim(key="key-a", session="s-agent", prefill_tokens=100)
        in_flight = await gate.enter(own)  # its session's (and key's) other request, running throughout
        fresh = await gate.enter(_short("fresh-0", "key-b" if busy == "key" else "key-a"))
        waiting = await _queue(gate, Claim(key="key-a", session="s-agent", prefill_tokens=20_000, long=True))
        for turn in range(1, 40):  # a short request every 5 s, each from a new session (and key)
            clock.now = turn * 5.0
            newcomer = await _queue(gate, _short(f"fresh-{turn}", f"key-{turn}" if busy == "key" else "key-a"))
            fresh.release()
            chosen = await _next_admitted([waiting, newcomer])
            if chosen is waiting:
                chosen.result().release()
                newcomer.cancel()
                in_flight.release()
                return clock.now
            fresh = chosen.result()
        raise AssertionError("the long request never started in 195 s")

    started = _run(scenario)
    assert AGING_S <= started <= AGING_S + 5.0  # the first slot freed after the aging limit


def test_aged_requests_go_oldest_first_and_still_wait_for_the_long_lane() -> None:
    async def scenario() -> list[str]:
        clock = Clock()
        gate = Admission(lambda: 3, queue_limit=8, wait_s=600, clock=clock, aging_s=30, long_lane=lambda: 1)
        lane = await gate.enter(Claim(key="key-a", session="s-lane", prefill_tokens=20_000, long=True))
        holder = await gate.enter(_short("s-hold"))
        filler = await gate.enter(_short("s-fill"))
        old_long = await _queue(gate, Claim(key="key-a", session="s-lane", prefill_tokens=20_000, long=True))
        clock.now = 10.0
        old_short = await _queue(gate, _short("s-hold"))
        clock.now = 45.0  # both aged; a fresh short one from a new session comes
        fresh = await _queue(gate, _short("s-new"))
        holder.release()  # the aged long one cannot start (the lane is busy): the aged short one goes
        first = await _next_admitted([old_long, old_short, fresh])
        lane.prefilled()  # the lane frees (no slot yet)
        filler.release()  # a slot frees: the aged long one, before the fresh short one
        second = await _next_admitted([old_long, fresh])
        return [first.result().claim.session, second.result().claim.session]

    assert _run(scenario) == ["s-hold", "s-lane"]


# -- one request cannot flush the memory of prefixes -----------------------------------------------------------


def _units(count: int, tag: str = "") -> PromptUnits:
    """A prompt of ``count`` units without the cost of encoding them (each fingerprint names its prefix)."""
    chained = tuple(f"{tag}{index}" for index in range(count))
    return PromptUnits(chained, tuple(100 * (index + 1) for index in range(count)), chained[0], 0)


def test_a_request_of_70000_messages_leaves_every_sessions_warm_turn_warm() -> None:
    known = KnownPrefixes()  # the gateway's own bound (65,536)
    sessions_seen = [_messages(f"task {number}") for number in range(3)]
    for body in sessions_seen:
        known.remember(prompt_units(body))
    known.remember(prompt_units({"messages": [{"role": "user", "content": f"m{n}"} for n in range(70_000)]}))
    for number, _ in enumerate(sessions_seen):
        turn_two = prompt_units(_messages(f"task {number}", "the tool said 3 tests pass"))
        assert known.new_tokens(turn_two) < 50  # still warm: its previous prompt is known


def test_a_request_adds_a_few_dozen_fingerprints_however_long_it_is() -> None:
    assert len(kept_units(_units(100_000))) <= 30
    assert kept_units(_units(5)) == [0, 1, 2, 3, 4]
    known = KnownPrefixes()
    known.remember(_units(100_000))
    assert len(known._seen) <= 30


def test_a_prefix_is_known_wherever_the_kept_fingerprint_ends() -> None:
    known = KnownPrefixes()
    known.remember(_units(1000))
    assert known.new_tokens(_units(1002)) == 200 // 4  # the next turn: only its two new units
    diverged = PromptUnits((*_units(600).chained, *(f"other{n}" for n in range(400))), _units(1000).chars, "0", 0)
    held = 100_000 - known.new_tokens(diverged) * 4
    assert 30_000 <= held <= 60_000  # the common 600 units: found from a kept point at most twice as far back


# -- the long lane opens on the engine's first output ----------------------------------------------------------


class PrefillingEngine:
    """An engine that sends its stream's headers (and, for Messages and Responses served natively, their
    opening events) at once, then nothing until ``prefilled`` is set, as a real one prefilling a long prompt."""

    def __init__(self) -> None:
        self.prefilled = threading.Event()
        self.seen: list[str] = []
        paths = ("chat/completions", "messages", "responses")
        self.app = Starlette(routes=[Route(f"/v1/{path}", self.answer, methods=["POST"]) for path in paths])

    async def answer(self, request: Request) -> Response:
        payload = await request.json()
        self.seen.append(request.url.path)
        return StreamingResponse(self._events(request.url.path, payload), media_type="text/event-stream")

    async def _events(self, path: str, payload: dict[str, Any]) -> AsyncIterator[bytes]:
        if path == "/v1/messages":
            yield _event("message_start", {"type": "message_start", "message": {"id": "m", "content": []}})
        if path == "/v1/responses":
            yield _event("response.created", {"type": "response.created", "response": {"id": "r"}})
            yield _event("response.in_progress", {"type": "response.in_progress", "response": {"id": "r"}})
        while not self.prefilled.is_set():  # prefilling until the test says (the fixture's end says it too)
            await asyncio.sleep(0.01)
        if path == "/v1/messages":
            yield _event("content_block_start", {"type": "content_block_start", "index": 0})
            yield _event("message_stop", {"type": "message_stop"})
        elif path == "/v1/responses":
            yield _event("response.completed", {"type": "response.completed", "response": {"id": "r"}})
        else:
            chunk = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]}
            yield b"data: " + json.dumps({"model": payload["model"], **chunk}).encode() + b"\n\n"
            done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield b"data: " + json.dumps(done).encode() + b"\n\ndata: [DONE]\n\n"


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _long_body(path: str, tag: str) -> dict[str, Any]:
    text = f"read this file ({tag}): " + f"{tag} " * 6000  # ~3,000 tokens to prefill: a long one
    if path == "/v1/responses":
        return {"model": FRONTED, "input": text, "stream": True}
    return {"model": FRONTED, "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": text}]}


ROUTES = [
    ("/v1/chat/completions", frozenset()),
    ("/v1/messages", frozenset()),  # translated to chat
    ("/v1/responses", frozenset()),
    ("/v1/messages", frozenset({"messages"})),  # the engine serves it itself
    ("/v1/responses", frozenset({"responses"})),
]


class Lane(NamedTuple):
    """What one route's two long prefills saw: (requests in the engine, long prefills admitted, queued)
    while the first one prefilled, both answers' statuses, the requests the engine saw in all, and the
    admission's (active, long active, queued) after both."""

    during: tuple[int, int, int]
    statuses: list[int]
    seen: int
    after: tuple[int, int, int]


def _two_long_prefills(path: str, native: frozenset[str]) -> Lane:
    engine = PrefillingEngine()
    server = Served(engine.app)
    try:
        runtime = make_runtime(
            server.url, native=frozenset({"include_usage"}) | native, max_body_bytes=1 << 20,
            scheduling=Scheduling(long_lane=1),
        )  # fmt: skip
        gateway = Served(create_app(runtime))
        admission = runtime.admission

        async def scenario() -> tuple[tuple[int, int, int], list[int]]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as client:
                first = await client.post(gateway.url + path, json=_long_body(path, "a"))  # its headers came
                second = asyncio.ensure_future(client.post(gateway.url + path, json=_long_body(path, "b")))
                await async_wait_until(lambda: admission.queued or len(engine.seen) > 1, what="the second request")
                await asyncio.sleep(0.2)  # time for a wrongly freed lane to admit it (in-process: milliseconds)
                during = (len(engine.seen), admission.long_active, admission.queued)
                engine.prefilled.set()  # the first token: the lane passes to the second
                answers = [first, await second]
                for answer in answers:
                    await answer.read()
                return during, [answer.status for answer in answers]

        try:
            during, statuses = asyncio.run(scenario())
        finally:
            gateway.stop()
        return Lane(during, statuses, len(engine.seen), (admission.active, admission.long_active, admission.queued))
    finally:
        engine.prefilled.set()
        server.stop()


@pytest.fixture(scope="module")
def lanes() -> Iterator[dict[tuple[str, frozenset[str]], Future[Lane]]]:
    """Each route's scenario with an engine and a gateway of its own, all at once: each waits out its
    own 0.2 s (one after another they took 1.9 s); each test reads its route's."""
    with ThreadPoolExecutor(len(ROUTES)) as pool:
        yield {route: pool.submit(_two_long_prefills, *route) for route in ROUTES}


@pytest.mark.parametrize(("path", "native"), ROUTES)
def test_the_long_lane_holds_a_second_long_prefill_until_the_first_ones_engine_output(
    lanes: dict[tuple[str, frozenset[str]], Future[Lane]], path: str, native: frozenset[str]
) -> None:
    lane = lanes[path, native].result(timeout=60)
    assert lane.during == (1, 1, 1)  # one long prefill in the engine, the other queued
    assert lane.statuses == [200, 200] and lane.seen == 2
    assert lane.after == (0, 0, 0)


def test_the_watch_skips_a_streams_opening_events_and_fires_once() -> None:
    fired: list[int] = []
    watch = FirstOutput(lambda: fired.append(1), frozenset({"message_start", "ping"}))
    opening = _event("message_start", {}) + b": keep-alive\n\n" + _event("ping", {})
    assert watch.feed(opening) == opening  # it changes nothing
    assert not fired
    watch.feed(_event("content_block_start", {}))
    watch.feed(_event("content_block_delta", {}))
    assert fired == [1]
    plain = FirstOutput(lambda: fired.append(2))  # chat: the first bytes are the engine's first output
    plain.feed(b"")
    plain.feed(b"data: {}\n\n")
    assert fired == [1, 2] and plain.flush() == b""


# -- a large prompt is fingerprinted beside the event loop -----------------------------------------------------


def test_a_large_prompt_is_fingerprinted_in_a_worker_thread_and_a_small_one_on_the_loop(
    engine: FakeEngine, engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real = sessions.prompt_units

    def watched(payload: Any) -> PromptUnits:
        threads.append(threading.current_thread().name)
        return real(payload)

    monkeypatch.setattr(sessions, "prompt_units", watched)
    runtime = make_runtime(engine_url, max_body_bytes=4 << 20)
    loop_threads: list[str] = []

    large = {"model": FRONTED, "messages": [{"role": "user", "content": "x"}] * 3000}  # ~90 KB
    with _gateway(runtime) as client:
        client.portal.call(lambda: loop_threads.append(threading.current_thread().name))  # type: ignore[union-attr]
        for body in ({"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}, large):
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert len(json.dumps(large)) > sessions.OFF_LOOP_BYTES
    assert threads[0] == loop_threads[0] and threads[1] != loop_threads[0]
