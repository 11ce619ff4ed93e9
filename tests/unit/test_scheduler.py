"""Many agents on one engine: the admission queue's order (a warm turn before a cold prefill, keys and
sessions served fairly, a per-key cap, one lane for long prefills, aging), with an injected clock; how a
request's session, key and prefill are recognised; and, through the HTTP app, every finished request
giving its slot back and the long prefill carrying the engine's fields."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from gateway.backends.base import Scheduling
from gateway.backends.llamacpp.scheduling import PREFILL_FIRST, PRIME, slot_holding
from gateway.backends.llamacpp.scheduling import scheduling as llama_scheduling
from gateway.serving import handlers
from gateway.serving.scheduling.admission import Admission, Claim, ShortTurns, Ticket
from gateway.serving.scheduling.sessions import KnownPrefixes, identify, key_id, prompt_units
from gateway.serving.transport import long_pin
from gateway.serving.transport.dispatch_gate import DispatchGate
from gateway.serving.transport.long_pin import open_when_taken, place_long, place_once
from gateway.serving.transport.outgoing import Outgoing
from gateway.serving.transport.prefill_first import prefill_first
from gateway.serving.wire.error_shapes import ApiError
from tests.unit.http_harness import FRONTED, FakeEngine, make_runtime
from tests.unit.test_http_gateway import BODIES, _gateway, _with_cue
from tests.waiting import wait_until

WARM = Claim(key="key-a", session="s-warm", prefill_tokens=120, long=False)


def _cold(session: str, key: str = "key-a") -> Claim:
    return Claim(key=key, session=session, prefill_tokens=20_000, long=True)


def _run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=5))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _queue(gate: Admission, claim: Claim) -> asyncio.Task[Ticket]:
    """A request that has to wait, once it is in the queue."""
    before = gate.queued
    task = asyncio.create_task(gate.enter(claim))
    for _ in range(20):
        await asyncio.sleep(0)
        if gate.queued > before or task.done():
            break
    return task


async def _next_admitted(tasks: list[asyncio.Task[Ticket]]) -> asyncio.Task[Ticket]:
    for _ in range(20):
        await asyncio.sleep(0)
        done = [task for task in tasks if task.done()]
        if done:
            assert len(done) == 1, "one freed slot admitted more than one request"
            tasks.remove(done[0])
            return done[0]
    raise AssertionError("nobody was admitted")


def test_a_warm_turn_goes_before_cold_prefills_that_came_first() -> None:
    async def scenario() -> list[str]:
        gate = Admission(lambda: 1, queue_limit=8, wait_s=5)
        holder = await gate.enter(_cold("s-0"))
        waiting = [await _queue(gate, _cold("s-1")), await _queue(gate, _cold("s-2")), await _queue(gate, WARM)]
        order: list[str] = []
        current = holder
        while waiting:
            current.release()
            task = await _next_admitted(waiting)
            current = task.result()
            order.append(current.claim.session)
        current.release()
        assert gate.active == 0
        return order

    assert _run(scenario) == ["s-warm", "s-1", "s-2"]


def test_keys_share_the_engine_fairly_whatever_their_burst() -> None:
    async def scenario() -> list[str]:
        gate = Admission(lambda: 2, queue_limit=32, wait_s=5)
        burst = [await gate.enter(Claim(key="key-a", session=f"a{i}")) for i in range(2)]
        waiting = [await _queue(gate, Claim(key="key-a", session=f"a{i}")) for i in range(2, 6)]
        waiting.append(await _queue(gate, Claim(key="key-b", session="b0")))
        burst[0].release()  # key-a holds one slot, key-b none: key-b goes next though it came last
        first = await _next_admitted(waiting)
        burst[1].release()  # now each holds one: the oldest of key-a's
        second = await _next_admitted(waiting)
        return [first.result().claim.session, second.result().claim.session]

    assert _run(scenario) == ["b0", "a2"]


def test_a_cap_per_key_holds_a_key_back_while_others_go() -> None:
    async def scenario() -> None:
        gate = Admission(lambda: 4, queue_limit=8, wait_s=5, per_key_limit=1)
        mine = await gate.enter(Claim(key="key-a", session="a0"))
        second = await _queue(gate, Claim(key="key-a", session="a1"))
        assert not second.done() and gate.active == 1  # a free slot, but key-a is at its cap
        other = await gate.enter(Claim(key="key-b", session="b0"))  # another key goes at once
        assert gate.active == 2
        mine.release()
        (await asyncio.wait_for(second, 1)).release()
        other.release()
        assert gate.active == 0 and not gate.by_key

    _run(scenario)


def test_long_prefills_take_one_lane_and_leave_it_when_the_answer_starts() -> None:
    async def scenario() -> None:
        gate = Admission(lambda: 4, queue_limit=8, wait_s=5, long_lane=lambda: 1)
        first = await gate.enter(_cold("s-1"))
        second = await _queue(gate, _cold("s-2"))
        assert not second.done() and gate.long_active == 1
        warm = await gate.enter(WARM)  # the other slots stay free for warm turns
        assert gate.active == 2
        first.prefilled()  # its first token: the prefill is over, the lane frees (the slot does not)
        admitted = await asyncio.wait_for(second, 1)
        assert (gate.active, gate.long_active) == (3, 1)
        first.prefilled()  # idempotent
        for ticket in (first, warm, admitted):
            ticket.release()
        assert (gate.active, gate.long_active) == (0, 0)

    _run(scenario)


def test_a_long_prefill_that_waited_long_enough_is_not_passed_by_newer_warm_turns() -> None:
    async def scenario() -> str:
        clock = Clock()
        gate = Admission(lambda: 1, queue_limit=8, wait_s=600, clock=clock, aging_s=30)
        holder = await gate.enter(WARM)
        cold = await _queue(gate, _cold("s-old"))
        clock.now = 31.0
        warm = await _queue(gate, Claim(key="key-a", session="s-new", prefill_tokens=50))
        holder.release()
        chosen = await _next_admitted([cold, warm])
        return chosen.result().claim.session

    assert _run(scenario) == "s-old"


def test_a_long_prefill_that_has_not_waited_long_is_passed() -> None:
    async def scenario() -> str:
        clock = Clock()
        gate = Admission(lambda: 1, queue_limit=8, wait_s=600, clock=clock, aging_s=30)
        holder = await gate.enter(WARM)
        cold = await _queue(gate, _cold("s-old"))
        clock.now = 29.0
        warm = await _queue(gate, Claim(key="key-a", session="s-new", prefill_tokens=50))
        holder.release()
        chosen = await _next_admitted([cold, warm])
        return chosen.result().claim.session

    assert _run(scenario) == "s-new"


def test_a_queued_waiter_records_how_long_it_waited() -> None:
    async def scenario() -> float:
        clock = Clock()
        gate = Admission(lambda: 1, queue_limit=8, wait_s=600, clock=clock)
        holder = await gate.enter(WARM)
        waiting = await _queue(gate, _cold("s-1"))
        clock.now = 4.5
        holder.release()
        return (await asyncio.wait_for(waiting, 1)).queued_s

    assert _run(scenario) == 4.5


# -- who a request is, and what the engine holds of it ---------------------------------------------------------

SYSTEM = "You are Claude Code. " * 400
TOOLS = [{"name": "Write", "input_schema": {"type": "object"}}]


def _messages(first_task: str, *turns: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": first_task}]
    for turn in turns:
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": turn}]
    return {"system": SYSTEM, "tools": TOOLS, "messages": messages}


def test_a_session_is_named_by_what_the_agent_sends_else_by_its_stable_start() -> None:
    body = _messages("fix the bug")
    units = prompt_units(body)
    claude = identify({"x-claude-code-session-id": "8a33e757"}, body, units, "secret-key")
    codex_header = identify({"session-id": "01a20a2d"}, {}, units, None)
    codex_field = identify({}, {"prompt_cache_key": "01a20a2d"}, units, None)
    opencode = identify({"x-session-affinity": "ses_df5d"}, body, units, None)
    assert claude.session_from == "x-claude-code-session-id" and opencode.session_from == "x-session-affinity"
    assert codex_header.session == codex_field.session  # the same id, by header or by field
    assert len({claude.session, codex_header.session, opencode.session}) == 3
    # no id sent (Qwen Code, Cline, aider): the conversation's start names it, the same on every turn
    later = _messages("fix the bug", "the tool said 3 tests pass", "now the docs")
    assert identify({}, later, prompt_units(later), None).session == identify({}, body, units, None).session
    other = _messages("write a parser")
    assert identify({}, other, prompt_units(other), None).session != identify({}, body, units, None).session
    assert claude.key == key_id("secret-key") and "secret" not in claude.key and key_id(None) == "open"


def test_what_the_engine_must_prefill_is_what_no_earlier_prompt_began_with() -> None:
    known = KnownPrefixes()
    first = prompt_units(_messages("fix the bug"))
    assert known.new_tokens(first) == first.total_chars // 4  # cold: nothing known
    known.remember(first)
    turn_two = prompt_units(_messages("fix the bug", "the tool said 3 tests pass"))
    assert known.new_tokens(turn_two) < 50  # warm: the previous prompt is its prefix
    subagent = prompt_units(_messages("explore the repository layout"))
    assert known.new_tokens(subagent) < 50  # shares the parent's tools and system prompt
    own_notes = prompt_units({**_messages("fix the bug"), "system": "project notes " * 500 + SYSTEM})
    assert known.new_tokens(own_notes) == own_notes.total_chars // 4  # differs from its first bytes: cold


def test_a_start_still_being_prefilled_is_known_as_sent_not_as_held() -> None:
    """Before: a prompt counted as held from the moment it was sent, so a second session of the same agent,
    sent while the first's 20k-token start was still being prefilled, looked warm, skipped the long lane
    and prefilled the whole start again beside it (the engines share no prefill under way)."""
    known = KnownPrefixes()
    first = prompt_units(_messages("fix the bug"))
    sibling = prompt_units(_messages("explore the repository layout"))
    known.remember(first)
    assert known.new_tokens(sibling) < 50  # once the first is through: its own part only
    assert known.new_tokens(sibling, held_only=True) == sibling.total_chars // 4  # sent now: the whole start
    known.prefilled(first)
    assert known.new_tokens(sibling, held_only=True) < 50
    known.remember(first)  # sent again: what is held stays held
    assert known.new_tokens(sibling, held_only=True) < 50


def test_a_ticket_says_once_that_its_prompt_is_prefilled() -> None:
    heard: list[str] = []

    async def scenario() -> None:
        gate = Admission(lambda: 2, queue_limit=4, wait_s=5)
        answered = await gate.enter(replace(WARM, on_prefilled=lambda: heard.append("answered")))
        answered.prefilled()  # the engine's first output
        answered.release()
        failed = await gate.enter(replace(WARM, on_prefilled=lambda: heard.append("ended")))
        failed.release()  # over without an output: its end is the last word on it
        failed.release()

    _run(scenario)
    assert heard == ["answered", "ended"]


_START = [{"role": "system", "content": "You are a coding agent. " + "tool schema " * 3000}]


def _session(task: str) -> dict[str, Any]:
    return {"model": FRONTED, "messages": [*_START, {"role": "user", "content": task}]}


def _second_waits_for_the_firsts_start(client: Any, engine: FakeEngine, runtime: Any) -> None:
    """The first session's cold start is in the engine (its prefill under way) when a second session of the
    same agent is sent: the second waits in the long lane, nothing more reaches the engine until the first is
    answered, and both are answered."""
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.post, "/v1/chat/completions", json=_session("PREFILLING: fix the bug"))
        try:
            wait_until(lambda: len(engine.requests_to("/v1/chat/completions")) == 1, what="the first in the engine")
            second = pool.submit(client.post, "/v1/chat/completions", json=_session("write the tests"))
            wait_until(lambda: runtime.admission.queued == 1, what="the second waiting")
            assert len(engine.requests_to("/v1/chat/completions")) == 1  # held back while the start is prefilled
        finally:
            engine.prefill_over.set()
        assert first.result(timeout=10).status_code == 200 and second.result(timeout=10).status_code == 200


def test_a_session_sharing_a_start_still_being_prefilled_waits_in_the_long_lane(
    engine: FakeEngine, engine_url: str
) -> None:
    """Through the app: a second session of the same agent waits for the first's cold start in the long lane
    rather than prefill the same start beside it; once the first is answered, a third is a warm start (not
    long)."""
    runtime = make_runtime(engine_url, scheduling=Scheduling(long_lane=1, long_fields={"id_slot": 3}))
    with _gateway(runtime) as client:
        _second_waits_for_the_firsts_start(client, engine, runtime)
        assert client.post("/v1/chat/completions", json=_session("update the docs")).status_code == 200
    sent = [json.loads(seen["raw"]) for seen in engine.requests_to("/v1/chat/completions")]
    assert [body.get("id_slot") for body in sent] == [3, 3, None]  # both cold then; the third's start held


@pytest.mark.parametrize("pause", [False, True], ids=["default", "pause-long-prefills"])
def test_a_session_that_waited_for_its_start_to_be_prefilled_keeps_the_last_slot(
    engine: FakeEngine, engine_url: str, pause: bool
) -> None:
    """On llama-server: a second session of the same agent waits in the long lane while the first's cold start
    is prefilled, and goes to the last slot as it was going to (what the engine held when it came: nothing),
    not unpinned. Sent unpinned once the start was held (tried: 16 sessions, one engine, 6.67 output tokens/s
    against 7.8-11 and two whole re-prefills), siblings loaded the one copy of the start llama-server keeps
    from its RAM cache, which moves it out, so a third found it in a busy slot and prefilled all 20k
    tokens; in the last slot they follow one another, each finding the start where the last one left it.
    With --pause-long-prefills it is not prefilled ahead either (its start held, what is left is short): a
    prefill paused after a batch or two left an entry of those tokens that llama-server's lookup preferred
    to whole conversations sharing them, and its first event said nothing was held (the pinned slot empty)."""
    runtime = make_runtime(engine_url, scheduling=llama_scheduling(4), pause_long_prefills=pause)
    engine.slots = [IDLE]
    with _gateway(runtime) as client:
        _second_waits_for_the_firsts_start(client, engine, runtime)
    sent = [json.loads(seen["raw"]) for seen in engine.requests_to("/v1/chat/completions")]
    # with pausing, the first is prefilled ahead in the last slot, then sent itself unpinned
    assert [body.get("id_slot") for body in sent] == ([3, None, 3] if pause else [3, 3])
    assert [bool(body.get("return_progress")) for body in sent] == ([True, False, False] if pause else [False] * 2)


@pytest.mark.parametrize(
    ("last_slot_tokens", "refused", "pinned", "primed"),
    [(0, False, 3, True), (0, True, None, True), (12_000, False, 3, False)],
    ids=["emptied", "emptied, the primer refused", "holding"],
)
def test_a_long_turn_of_a_held_conversation_is_pinned_to_the_last_slot_primed_where_it_is_empty(
    engine: FakeEngine, engine_url: str, last_slot_tokens: int, refused: bool, pinned: int | None, primed: bool
) -> None:
    """A later turn that adds a large file to a conversation the engine holds is a long prefill (its new part);
    pinned to an empty last slot it would prefill the whole conversation again (b11434 skips its RAM cache
    for a request pinned to an empty slot), so that slot is primed first with a few tokens of the gateway's
    own (pinned to a slot holding tokens it does not share, the cache is consulted). Before, it went
    unpinned, into the least recently used slot. A primer that fails leaves it unpinned; a last slot that
    holds tokens is given as it is."""
    engine.refuse_completion = refused
    runtime = make_runtime(engine_url, scheduling=llama_scheduling(4))
    first = {"model": FRONTED, "messages": [{"role": "user", "content": "read this file: " + "x " * 6000}]}
    later = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": "read"},
            {"role": "user", "content": "and this one: " + "y " * 6000},
        ],
    }
    with _gateway(runtime) as client:
        engine.slots = [IDLE]
        assert client.post("/v1/chat/completions", json=first).status_code == 200  # cold: nothing held, pinned
        page = [{**slot, "n_prompt_tokens": last_slot_tokens if slot["id"] == 3 else 0} for slot in IDLE]
        engine.slots = [page]
        assert client.post("/v1/chat/completions", json=later).status_code == 200
    sent = [json.loads(seen["raw"]) for seen in engine.requests_to("/v1/chat/completions")]
    assert [body.get("id_slot") for body in sent] == [3, pinned]
    assert all(PRIME not in body for body in sent)  # the mark stays the gateway's
    primers = [seen["body"] for seen in engine.requests_to("/completion")]
    assert [body["id_slot"] for body in primers] == ([3] if primed else [])
    if primed:  # sent just before the long turn, nothing between them
        paths = [seen["path"] for seen in engine.seen if seen["path"] != "/slots"]
        assert paths[-2:] == ["/completion", "/v1/chat/completions"]


def test_known_prefixes_are_bounded() -> None:
    known = KnownPrefixes(limit=10)
    for task in range(20):
        known.remember(prompt_units(_messages(f"task {task}")))
    assert len(known._seen) == 10


# -- through the HTTP app -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(BODIES))
def test_every_finished_request_gives_its_slot_back(
    engine: FakeEngine, engine_url: str, path: str, stream: bool
) -> None:
    """One slot and no queue: a request that kept its slot after its answer would make the next one 429."""
    runtime = make_runtime(engine_url, max_concurrency=1, queue_limit=0, scheduling=Scheduling(long_lane=1))
    with _gateway(runtime) as client:
        for cue in ("hello", "REFUSE", "hello again"):
            answer = client.post(path, json=_with_cue(path, cue, stream=stream))
            assert answer.status_code in (200, 400), answer.text
            assert (runtime.admission.active, runtime.admission.long_active, runtime.admission.queued) == (0, 0, 0)
            assert not runtime.admission.by_key and not runtime.admission.by_session


def test_a_long_prefill_carries_the_engine_fields_and_a_warm_turn_does_not(engine: FakeEngine, engine_url: str) -> None:
    runtime = make_runtime(engine_url, scheduling=Scheduling(long_lane=1, long_fields={"id_slot": 3}))
    cold = {"model": FRONTED, "messages": [{"role": "user", "content": "read this file: " + "x " * 6000}]}
    warm = {
        **cold,
        "messages": [*cold["messages"], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}],
    }
    with _gateway(runtime) as client:
        assert client.post("/v1/chat/completions", json=cold).status_code == 200
        assert client.post("/v1/chat/completions", json=warm).status_code == 200
        assert client.post("/v1/messages", json={**cold, "max_tokens": 10}).status_code == 200  # translated
    sent = [json.loads(seen["raw"]) for seen in engine.requests_to("/v1/chat/completions")]
    assert [body.get("id_slot") for body in sent] == [3, None, None]  # the Messages request shares the prefix


def _slots(*processing: bool) -> list[dict[str, Any]]:
    return [{"id": i, "is_processing": busy, "id_task": i} for i, busy in enumerate(processing)]


IDLE, LAST_BUSY, ALL_BUSY = _slots(False, False, False, False), _slots(False, False, False, True), _slots(*[True] * 4)

LONG_KINDS = (  # chat, chat streamed, Messages translated to chat
    ("/v1/chat/completions", {}),
    ("/v1/chat/completions", {"stream": True}),
    ("/v1/messages", {"max_tokens": 10}),
)


@pytest.mark.parametrize(
    ("pages", "pinned", "reads"),
    [
        ([IDLE], 3, 2),  # placed at once; the next read shows it held: the gate opens
        ([LAST_BUSY, LAST_BUSY, LAST_BUSY, IDLE], 3, 5),  # the last slot answers another: waited for
        ([_slots(False, False, True, True), IDLE], 3, 3),  # another slot idle is not taken in its place
        ([None], None, 1),  # no page (llama-server --no-slots): sent unpinned
        ([ALL_BUSY], None, None),  # never free within the wait: sent unpinned
    ],
    ids=["idle", "last slot busy, then idle", "an earlier slot idle", "no page", "never idle"],
)
def test_a_long_prefill_waits_for_the_last_slot_to_be_idle_and_is_never_pinned_to_a_busy_one(
    engine: FakeEngine,
    engine_url: str,
    pages: list[Any],
    pinned: int | None,
    reads: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """llama-server b11434 loads a request pinned to a busy slot into that slot while it works, and the slot
    then spins for ever (gateway/backends/llamacpp/scheduling.py): the long prefill was pinned to the last
    slot whoever held it (16 sessions: twice in two runs)."""
    four = llama_scheduling(4)
    assert four.long_pin is not None
    monkeypatch.setattr(long_pin, "POLL_S", 0.01)  # the page read again every 10 ms
    # never idle waits it out, three times: short; the others end at an idle page: room for a loaded machine
    wait_s = 0.05 if reads is None else 1.0
    runtime = make_runtime(engine_url, scheduling=replace(four, long_pin=replace(four.long_pin, wait_s=wait_s)))
    with _gateway(runtime) as client:
        for kind, (path, extra) in enumerate(LONG_KINDS):
            engine.slots = list(pages)
            text = f"{kind} read this file: " + "x " * 6000  # a start of its own: long each time
            body = {"model": FRONTED, "messages": [{"role": "user", "content": text}], **extra}
            before = len(engine.requests_to("/slots"))
            assert client.post(path, json=body).status_code == 200
            sent = engine.requests_to("/v1/chat/completions")[-1]["body"]
            assert sent.get("id_slot") == pinned, (path, extra, sent.get("id_slot"))
            # placed after as many reads, then read until it is seen held (in the background: the answer can
            # come back before that read); never idle: until the wait is over
            if reads is not None and pinned is not None:
                wait_until(lambda at=before + reads: len(engine.requests_to("/slots")) >= at, what=f"{reads} reads")
            read = len(engine.requests_to("/slots")) - before
            assert reads is None or (read >= reads if pinned is not None else read == reads), read
            assert client.get("/v1/models").status_code == 200  # and the gate is open again


@pytest.mark.parametrize(("path", "extra"), LONG_KINDS)
def test_a_prefill_run_ahead_is_what_is_placed_and_the_request_itself_goes_unpinned_after_it(
    engine: FakeEngine, engine_url: str, path: str, extra: dict[str, Any]
) -> None:
    """With pausing on, the last slot is given to the gateway's own prefill (one token, streamed with its
    progress); the request goes after it, unpinned, to whichever slot holds its prompt then."""
    engine.slots = [IDLE]
    runtime = make_runtime(engine_url, scheduling=llama_scheduling(4), pause_long_prefills=True)
    body = {"model": FRONTED, "messages": [{"role": "user", "content": "read this file: " + "x " * 6000}], **extra}
    with _gateway(runtime) as client:
        assert client.post(path, json=body).status_code == 200
        assert client.get("/v1/models").status_code == 200  # and the gate is open again
    prefill, sent = (seen["body"] for seen in engine.requests_to("/v1/chat/completions")[-2:])
    assert prefill["return_progress"] is True and prefill["max_tokens"] == 1 and prefill["id_slot"] == 3
    assert prefill["messages"] == sent["messages"] and "id_slot" not in sent and "return_progress" not in sent


def test_a_prefill_run_ahead_the_engine_sends_no_event_for_opens_the_gate_after_a_while(
    engine: FakeEngine, engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that sends no first event (a llama-server built without return_progress, or one that defers
    the request): the gate closed for the placing opens after TAKEN_S, as for a pinned long prefill, and
    warm turns pass it."""
    monkeypatch.setattr(handlers, "TAKEN_S", 0.1)
    engine.slots = [IDLE]
    runtime = make_runtime(engine_url, scheduling=llama_scheduling(4), pause_long_prefills=True)
    long = {"model": FRONTED, "messages": [{"role": "user", "content": "PREFILLING " + "x " * 6000}]}
    hi = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
    with _gateway(runtime) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/chat/completions", json=long)
        try:
            wait_until(lambda: len(engine.requests_to("/v1/chat/completions")) == 1, what="the prefill sent")
            assert client.post("/v1/chat/completions", json=hi).status_code == 200  # through the gate meanwhile
            assert not first.done()
        finally:
            engine.prefill_over.set()
        assert first.result(timeout=10).status_code == 200


@pytest.mark.parametrize(("path", "extra"), LONG_KINDS)
def test_a_prompt_prefilled_ahead_is_answered_with_what_was_cached_before_that_prefill(
    engine: FakeEngine, engine_url: str, path: str, extra: dict[str, Any]
) -> None:
    """The request itself finds its whole prompt cached (the gateway had it prefilled a moment before): the
    client, the per-key figures and the benchmarks get what the engine held before, from the prefill's first
    event, not a cold turn that reads as warm."""
    engine.slots = [IDLE]
    engine.cached_tokens, engine.progress_cache = 9, 2  # all but 2 came from the prefill run ahead
    runtime = make_runtime(engine_url, scheduling=llama_scheduling(4), pause_long_prefills=True)
    body = {"model": FRONTED, "messages": [{"role": "user", "content": "read this file: " + "x " * 6000}], **extra}
    if extra.get("stream") and path.endswith("completions"):
        body["stream_options"] = {"include_usage": True}
    with _gateway(runtime) as client:
        answer = client.post(path, json=body)
        metrics = client.get("/metrics").text
    assert answer.status_code == 200
    if "max_tokens" in extra:  # Messages: Anthropic's cache read
        assert answer.json()["usage"]["cache_read_input_tokens"] == 2
    elif extra.get("stream"):
        usage = [json.loads(line[6:])["usage"] for line in answer.text.split("\n") if '"usage"' in line][-1]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 2}
    else:
        assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert 'gateway_prompt_tokens_total{kind="reused"} 2.0' in metrics  # the operator's figure too
    assert "gateway_prefilled_ahead_total 1.0" in metrics and "gateway_prefill_pauses_total 0.0" in metrics


class Pages:
    """An engine client as place_long and prefill_first see it: its gate, /slots pages read in turn, and a
    prefill that sends its first event once the test lets it (``event``), or fails (``fail``)."""

    def __init__(self, *pages: list[dict[str, Any]] | None) -> None:
        self.gate = DispatchGate()
        self.pages = list(pages)
        self.gate_at_reads: list[bool] = []
        self.event = asyncio.Event()
        self.fail = False
        self.gate_when_sent: list[bool] = []

    async def prefill(self, _target: Any, _path: str, _body: bytes, *, until: Any, on_event: Any) -> bool:
        self.gate_when_sent.append(self.gate.is_open)
        if self.fail:
            raise ApiError(503, "the backend did not answer")
        await self.event.wait()
        on_event(b'data: {"prompt_progress": {"cache": 0}}\n\n')
        return True

    async def page(self, _target: Any, _path: str) -> str | None:
        self.gate_at_reads.append(self.gate.is_open)
        page = self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]
        return json.dumps(page) if page is not None else None


async def _prefill(client: Any, fields: Any) -> None:
    long = {"messages": [{"role": "user", "content": "read"}]}
    await prefill_first(
        client, None, "/v1/chat/completions", long, PREFILL_FIRST, ShortTurns(), first_fields=fields,
        on_held=client.gate.open,
    )  # fmt: skip


def test_a_prefill_run_ahead_that_fails_before_the_engine_holds_it_opens_the_gate_again() -> None:
    pin = llama_scheduling(4).long_pin
    assert pin is not None

    async def scenario() -> None:
        client: Any = Pages(IDLE)
        fields = await place_long(client, None, pin, others=lambda: 0)
        assert not client.gate.is_open
        client.fail = True  # its request never reached the engine
        await _prefill(client, fields)
        assert client.gate.is_open

    asyncio.run(scenario())


@pytest.mark.parametrize("held_by", ["its slot on the page", "its prefill's first event"])
def test_other_requests_wait_at_the_gate_from_the_read_that_places_a_long_prefill_until_it_is_held(
    held_by: str,
) -> None:
    """Between the read that finds the last slot free and the engine taking the long request, a request sent
    meanwhile could take that slot first (a warm turn whose prefix it holds): nothing is sent then. Held is
    what /slots shows, or, for a prefill run ahead (--pause-long-prefills), its first progress event."""
    pin = llama_scheduling(4).long_pin
    assert pin is not None

    async def scenario() -> None:
        client: Any = Pages(LAST_BUSY, _slots(True, False, False, False), IDLE, _slots(False, False, False, True))
        waited: list[float] = []

        async def warm_turn() -> None:
            await client.gate.passed()
            waited.append(asyncio.get_running_loop().time())

        # the last slot busy; then free, but two other requests in flight and one slot busy (one on its way
        # could take the last slot first); then all idle and none in flight: placed
        others = iter([1, 2, 0])
        fields = await place_long(client, None, pin, others=lambda: next(others), sleep=lambda _s: asyncio.sleep(0))
        assert fields == {"id_slot": 3} and not client.gate.is_open  # placed, the gate held closed
        assert client.gate_at_reads == [False, False, False]  # closed for each read, opened when it did not place
        queued = asyncio.create_task(warm_turn())
        if held_by == "its slot on the page":
            await asyncio.sleep(0)
            assert waited == []  # held at the gate
            await open_when_taken(client, None, pin, fields, sleep=lambda _s: asyncio.sleep(0))
        else:
            prefilling = asyncio.create_task(_prefill(client, fields))
            await asyncio.sleep(0.01)  # the window in which a turn let through too early would show
            assert waited == [] and client.gate_when_sent == [False]  # sent with the gate closed; the turn held
            client.event.set()  # the engine's first event: it holds the long prefill
            await prefilling
        await queued
        assert client.gate.is_open and len(waited) == 1

    asyncio.run(scenario())


class Primed(Pages):
    """Pages whose engine also answers the primer (``status``), noting whether the gate was open then."""

    def __init__(self, *pages: list[dict[str, Any]] | None, status: int = 200) -> None:
        super().__init__(*pages)
        self.status = status
        self.primed: list[tuple[str, int, bool]] = []

    async def post_json(self, _target: Any, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        self.primed.append((path, payload["id_slot"], self.gate.is_open))
        return self.status, {}


EMPTY = [{"id": i, "is_processing": False, "n_prompt_tokens": 0} for i in range(4)]


def test_a_placing_that_asks_for_the_primer_runs_it_first_the_gate_closed_and_sends_no_mark() -> None:
    """The primer runs in the place given, before the long prefill and with the gate closed (a warm turn let
    through could take the primed slot); its mark is the gateway's, never sent; one that fails leaves the
    prefill unpinned and the gate open, and a prompt the engine holds little of is not primed."""
    pin = llama_scheduling(4).long_pin
    assert pin is not None

    async def scenario() -> None:
        client: Any = Primed(EMPTY)
        assert await place_long(client, None, pin, others=lambda: 0, held=20_000) == {"id_slot": 3}
        assert client.primed == [("/completion", 3, False)] and not client.gate.is_open
        refused: Any = Primed(EMPTY, status=500)
        assert await place_long(refused, None, pin, others=lambda: 0, held=20_000) == {}
        assert refused.primed == [("/completion", 3, False)] and refused.gate.is_open
        cold: Any = Primed(EMPTY)
        assert await place_long(cold, None, pin, others=lambda: 0, held=100) == {"id_slot": 3}
        assert cold.primed == []
        resumed: Any = Primed(EMPTY)  # a paused prefill whose slot a new task cleared: the last, primed
        fields = await place_once(resumed, None, "/slots", lambda page: slot_holding(page, 2_496), pin.primer)
        assert fields == {"id_slot": 3} and resumed.primed == [("/completion", 3, False)]

    asyncio.run(scenario())


def test_a_long_prefill_that_fails_before_the_engine_holds_it_opens_the_gate_again() -> None:
    pin = llama_scheduling(4).long_pin
    assert pin is not None

    async def scenario() -> None:
        client: Any = Pages(IDLE)  # the pinned slot never shows held: its request never came
        fields = await place_long(client, None, pin, others=lambda: 0)
        assert not client.gate.is_open
        watching = asyncio.create_task(open_when_taken(client, None, pin, fields, sleep=lambda _s: asyncio.sleep(0)))
        await asyncio.sleep(0)
        watching.cancel()  # the send failed: the handler cancels the watch
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        assert client.gate.is_open

    asyncio.run(scenario())


def test_a_placing_that_breaks_is_logged_and_opens_the_gate(
    engine: FakeEngine, engine_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The task that watches for the engine to hold a placed long prefill runs beside the request: an error in
    it is logged, not lost, and later requests still pass the gate."""
    four = llama_scheduling(4)
    assert four.long_pin is not None

    def broken(_page: str, _fields: Any) -> bool:
        raise ValueError("a page the reader did not foresee")

    runtime = make_runtime(engine_url, scheduling=replace(four, long_pin=replace(four.long_pin, taken=broken)))
    engine.slots = [IDLE]
    long = {"model": FRONTED, "messages": [{"role": "user", "content": "read this file: " + "x " * 6000}]}
    hi = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
    with _gateway(runtime) as client, caplog.at_level("ERROR", logger="gateway.handlers"):
        assert client.post("/v1/chat/completions", json=long).status_code == 200
        assert client.post("/v1/chat/completions", json=hi).status_code == 200  # the gate is open again
    assert "watching a long prefill's placement failed" in caplog.text and "did not foresee" in caplog.text


def test_a_canary_in_the_engine_counts_as_a_request_that_could_take_the_last_slot_first(
    engine: FakeEngine, engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The liveness watch's canary holds no admission slot: while it is in the engine (counted by the gate it
    passed) and no slot shows it yet, the last slot is not given to a long prefill."""
    monkeypatch.setattr(long_pin, "POLL_S", 0.01)
    four = llama_scheduling(4)
    assert four.long_pin is not None
    runtime = make_runtime(engine_url, scheduling=replace(four, long_pin=replace(four.long_pin, wait_s=0.1)))
    engine.slots = [IDLE]
    runtime.pool.replicas[0].upstream.client.gate.outside = 1  # a canary on its way, in no slot yet
    with _gateway(runtime) as client:
        body = {"model": FRONTED, "messages": [{"role": "user", "content": "read this file: " + "x " * 6000}]}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert "id_slot" not in engine.requests_to("/v1/chat/completions")[-1]["body"]  # waited, then unpinned


def test_a_warm_turn_reads_no_slots_page_and_is_never_pinned(engine: FakeEngine, engine_url: str) -> None:
    runtime = make_runtime(engine_url, scheduling=llama_scheduling(4))
    engine.slots = [IDLE]
    hi = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
    with _gateway(runtime) as client:
        assert client.post("/v1/chat/completions", json=hi).status_code == 200
    assert engine.requests_to("/slots") == [] and "id_slot" not in engine.requests_to("/v1/chat/completions")[0]["body"]


def test_a_body_sent_again_carries_the_new_sendings_fields_not_the_last_ones() -> None:
    raw = b'{"model": "m", "id_slot": 1}'
    untouched = Outgoing(json.loads(raw), raw, changed=False)
    untouched.pin({})
    assert untouched.body() == raw  # nothing changed: the client's own bytes
    outgoing = Outgoing({"model": "m"}, b'{"model":"m"}', changed=False)
    outgoing.pin({"id_slot": 3})  # one replica's last slot
    assert json.loads(outgoing.body()) == {"model": "m", "id_slot": 3}
    outgoing.pin({})  # sent again to a replica that gave none
    assert json.loads(outgoing.body()) == {"model": "m"}


def test_metrics_status_and_the_access_log_show_who_uses_the_node(
    engine: FakeEngine, engine_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = make_runtime(engine_url, api_keys=("alpha-key", "beta-key"))
    engine.cached_tokens = 2
    sessions = [("alpha-key", "sess-1"), ("alpha-key", "sess-2"), ("beta-key", "sess-3"), ("alpha-key", "sess-1")]
    with _gateway(runtime) as client, caplog.at_level("INFO", logger="gateway.access"):
        for key, session in sessions:
            headers = {"authorization": f"Bearer {key}", "x-claude-code-session-id": session}
            body = {"model": FRONTED, "messages": [{"role": "user", "content": f"task of {session}"}]}
            assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
        metrics = client.get("/metrics", headers={"authorization": "Bearer alpha-key"}).text
        status = client.get("/status", headers={"authorization": "Bearer alpha-key"}).json()
        page = client.get("/status?format=html", headers={"authorization": "Bearer alpha-key"}).text
    alpha, beta = key_id("alpha-key"), key_id("beta-key")
    assert f'gateway_key_requests_total{{key="{alpha}"}} 3.0' in metrics
    assert f'gateway_key_requests_total{{key="{beta}"}} 1.0' in metrics
    assert metrics.count("gateway_session_requests_total{") == 3
    assert f'gateway_key_prompt_tokens_total{{key="{alpha}",kind="reused"}} 6.0' in metrics
    assert "alpha-key" not in metrics and "beta-key" not in json.dumps(status)
    rows = {(row["key"], row["requests"]) for row in status["usage"]["sessions"]}
    assert rows == {(alpha, 2), (alpha, 1), (beta, 1)}
    assert [row["key"] for row in status["usage"]["keys"]] == sorted([alpha, beta])
    assert "Who uses the node" in page and page.count(f"<td>{alpha}</td>") == 3 and page.count(f"<td>{beta}</td>") == 2
    lines = [record.getMessage() for record in caplog.records if "/v1/chat/completions" in record.getMessage()]
    assert len(lines) == 4 and all(f"key={alpha}" in line or f"key={beta}" in line for line in lines)
    assert all(" session=" in line and "queued=" in line and "alpha-key" not in line for line in lines)


def test_sessions_past_the_board_fold_into_one_row(engine: FakeEngine, engine_url: str) -> None:
    runtime = make_runtime(engine_url)
    runtime.usage.shown = 2
    with _gateway(runtime) as client:
        for session in range(5):
            body = {"model": FRONTED, "messages": [{"role": "user", "content": f"task {session}"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        metrics = client.get("/metrics").text
    assert metrics.count("gateway_session_requests_total{") == 3  # two shown, the rest as one
    assert 'gateway_session_requests_total{key="",session="other"} 3.0' in metrics


def test_a_user_agent_with_quotes_cannot_forge_the_access_line(
    engine: FakeEngine, engine_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    forged = 'x" id=forged session=000000000000 "'
    with _gateway(make_runtime(engine_url)) as client, caplog.at_level("INFO", logger="gateway.access"):
        body = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=body, headers={"user-agent": forged}).status_code == 200
    line = next(record.getMessage() for record in caplog.records if "/v1/chat/completions" in record.getMessage())
    assert 'agent="x\\" id=forged session=000000000000 \\""' in line and line.count(" id=") == 2
