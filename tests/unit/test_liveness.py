"""The progress watch (gateway.supervision.liveness) decides "hung" only on the evidence: while requests
are in flight, no chunk relayed and no change in the engine's own account of its work for the stall
limit; while idle, a canary that gets no answer. A prefill longer than the limit that reports its
progress is never a hang.

The engine here is a stand-in for what no real engine does on demand at a chosen pace (a prefill of a
given length, a freeze at a given second); its clock is the watch's injected clock, so an hour of
engine time takes milliseconds. The supervisor's side (a hang ends the requests in flight, then the
engine restarts by the crash path) runs with the stand-in runs of test_supervisor_transitions.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from time import monotonic
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.backends.base import Launch, Progress
from gateway.backends.llamacpp.progress import slots_progress
from gateway.backends.vllm.progress import metrics_progress
from gateway.serving.app import create_app
from gateway.serving.transport.dispatch_gate import DispatchGate
from gateway.serving.transport.proxy import EngineClient, Timeouts
from gateway.supervision.group import http_canary
from gateway.supervision.lifecycle import State
from gateway.supervision.liveness import (
    Activity,
    HttpProbe,
    Limits,
    Liveness,
    LongestPrefill,
    ProgressWatch,
    Unreadable,
)
from tests.unit.http_harness import FRONTED, Served, make_runtime, sse_events
from tests.unit.test_http_timeouts import LONG_S, _scripted
from tests.unit.test_supervisor_transitions import Clock, Engines, _llama, _run, _supervisor, _until, serves
from tests.waiting import wait_until

STALL_S = 300.0


class FakeTime:
    """The watch's clock and sleep: sleeping moves the clock, and lets the loop run once."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@dataclass
class StandInEngine:
    """An engine as the watch sees it, driven by the fake clock: a request in flight from ``start_at``
    to ``end_at`` whose prefill processes ``batch`` prompt tokens every ``batch_s``; frozen from
    ``frozen_at`` (its progress figures stop; ``silent``: it stops answering at all)."""

    time: FakeTime
    start_at: float = 0.0
    end_at: float = float("inf")
    batch: int = 512
    batch_s: float = 100.0
    frozen_at: float = float("inf")
    silent: bool = False
    reports: bool = True
    chunks_every_s: float | None = None  # a stream relaying chunks (an engine without a progress page)
    done_at: float = float("inf")  # its work is over (the answer waits on a client that reads slowly)
    unanswered: bool = False  # the request's answer never began (no status line came back)
    unreadable: bool = False  # its progress page answers with nothing usable (llama-server --no-slots: 501)
    canaries: list[float] = field(default_factory=list)

    def _engine_time(self) -> float:
        return min(self.time.now, self.frozen_at)

    def activity(self) -> Activity:
        busy = int(self.start_at <= self.time.now < self.end_at)
        chunks = int(max(0.0, self._engine_time() - self.start_at) // self.chunks_every_s) if self.chunks_every_s else 0
        return Activity(busy, chunks, busy if self.unanswered else 0)

    # -- the Probe surface
    @property
    def reports_progress(self) -> bool:
        return self.reports

    async def progress(self) -> Progress | Unreadable | None:
        if self.silent and self.time.now >= self.frozen_at:
            await asyncio.Event().wait()  # never answers: the watch's own bound ends the wait
        if self.unreadable:
            return Unreadable('GET /slots answered 501: {"error": {"code": 501}}')
        worked = min(self._engine_time(), self.done_at) - self.start_at
        done = int(max(0.0, worked) // self.batch_s) * self.batch
        return Progress(("slot 0", done), busy=self.time.now < self.done_at)

    async def canary(self) -> bool:
        self.canaries.append(self.time.now)
        if self.time.now >= self.frozen_at:
            await asyncio.Event().wait()
        return True

    async def aclose(self) -> None:
        return None


WATCHED = Limits(stall_s=STALL_S, canary_s=0)


def _watch(engine: StandInEngine, limits: Limits = WATCHED, prefill: LongestPrefill | None = None) -> ProgressWatch:
    return ProgressWatch(
        engine, engine.activity, limits, clock=engine.time.clock, sleep=engine.time.sleep, prefill=prefill
    )


async def _watch_until(watch: ProgressWatch, time: FakeTime, until_s: float) -> str | None:
    """The watch's verdict if it came before the fake clock reached ``until_s``, else None; a watch that
    neither decides nor moves the fake clock fails after 10 real seconds instead of spinning on."""
    task = asyncio.create_task(watch.watch())
    deadline = monotonic() + 10
    while not task.done() and time.now < until_s:
        if monotonic() > deadline:
            task.cancel()
            raise AssertionError(f"the watch neither decided nor moved the fake clock past {time.now:g} s")
        await asyncio.sleep(0)
    if task.done():
        return task.result()
    task.cancel()
    return None


def test_a_prefill_longer_than_the_stall_limit_that_progresses_is_never_a_hang() -> None:
    """A 30-minute prefill (one 512-token batch per 100 s), six times the 300 s limit: no hang."""
    time = FakeTime()
    engine = StandInEngine(time, start_at=10.0, end_at=1810.0, batch_s=100.0)

    async def scenario() -> None:
        assert await _watch_until(_watch(engine), time, 2400.0) is None

    _run(scenario)


def test_an_engine_whose_figures_stop_moving_with_a_request_in_flight_is_hung_after_the_limit() -> None:
    """It answers its progress page (vLLM's /metrics while the core is stuck) but nothing moves."""
    time = FakeTime()
    engine = StandInEngine(time, start_at=10.0, batch_s=100.0, frozen_at=500.0)

    async def scenario() -> None:
        verdict = await _watch_until(_watch(engine), time, 5000.0)
        assert verdict is not None and "no progress for" in verdict and "1 request(s) in flight" in verdict
        # the last batch landed at 410 s: hung at 710 s, within one poll after
        assert 410.0 + STALL_S <= time.now <= 410.0 + STALL_S + Limits(STALL_S).poll_s + 1e-6, time.now

    _run(scenario)


@dataclass
class OneSlotSpins(StandInEngine):
    """Two slots busy from ``start_at``: slot 0 serves a stream of short turns (its mark and the relayed chunks
    move every 10 s), slot 1 stops moving at ``frozen_at`` (llama-server b11434's slot that re-processes a
    prompt loaded into it while busy); ``legit_wait`` slot 1 waits instead, with no mark at all yet."""

    chunks_every_s: float | None = 10.0

    def activity(self) -> Activity:
        return Activity(2, int(self.time.now // 10), 0)

    async def progress(self) -> Progress | Unreadable | None:
        turns = int(self.time.now // 10)
        slot_1 = int(min(self.time.now, self.frozen_at) // 100)
        parts = (("slot 0", (turns, 0, 1)), ("slot 1", (7, slot_1 * 64, 0)))
        return Progress((turns, slot_1), busy=True, parts=parts)


def test_one_slot_that_stands_still_while_the_others_serve_is_hung_after_the_limit() -> None:
    """The whole mark and the relayed chunks kept moving (the other slots' turns), so the engine counted as
    working while one request waited for ever: 45 of 48 turns, then 600-s 429s (issue 50's 16-session run)."""
    time = FakeTime()
    engine = OneSlotSpins(time, frozen_at=450.0)

    async def scenario() -> None:
        verdict = await _watch_until(_watch(engine), time, 5000.0)
        assert verdict is not None and verdict.startswith("slot 1 made no progress for 300 s"), verdict
        assert 400.0 + STALL_S <= time.now <= 400.0 + STALL_S + Limits(STALL_S).poll_s + 1e-6, time.now

    _run(scenario)


def test_one_slot_waiting_for_the_plans_longest_prefill_beside_it_is_not_hung() -> None:
    """A slot's prompt waits while another slot's long prompt fills every batch: it may stand still as long
    as the plan's longest prefill (here 20 minutes), not just the stall limit."""
    time = FakeTime()
    engine = OneSlotSpins(time, frozen_at=0.0)
    prefill = LongestPrefill(120_000, 100.0)  # 1,200 s

    async def scenario() -> None:
        assert await _watch_until(_watch(engine, prefill=prefill), time, 1100.0) is None
        later = await _watch_until(_watch(engine, prefill=prefill), time, 5000.0)
        assert later is not None and "limit 1200 s" in later, later

    _run(scenario)


def test_requests_in_flight_that_wait_on_a_slow_client_while_the_engine_says_it_is_idle_are_no_hang() -> None:
    """llama-server's main loop answers /slots itself: no slot processing is first-hand. The answer it
    finished at 100 s waits on a client that reads slowly; the request stays in flight for an hour."""
    time = FakeTime()
    engine = StandInEngine(time, start_at=0.0, end_at=3600.0, done_at=100.0)

    async def scenario() -> None:
        assert await _watch_until(_watch(engine), time, 3600.0) is None

    _run(scenario)


def test_a_request_the_engine_took_and_never_began_while_it_says_it_is_idle_is_a_hang() -> None:
    """A stand-in llama-server whose ``/slots`` says every slot is idle while the request it took has no
    answer begun (no status line: llama-server sends one when a slot starts it). Idle excuses only answers
    that began; this one counts, and with a 4 s limit the engine is hung 4 s on (before: never, the
    client waited out the 600 s first-byte timeout)."""
    time = FakeTime()
    engine = StandInEngine(time, start_at=1.0, done_at=0.0, unanswered=True)
    limits = Limits(stall_s=4.0, canary_s=0)

    async def scenario() -> None:
        verdict = await _watch_until(_watch(engine, limits), time, 40.0)
        assert verdict is not None, "still not found hung at 40 s"
        assert "1 not begun while the engine said it worked on nothing" in verdict and "stall_timeout_s 4" in verdict
        assert 1.0 + 4.0 <= time.now <= 1.0 + 4.0 + 2 * limits.poll_s + 1e-6, time.now

    _run(scenario)


def test_where_progress_cannot_be_read_a_prefill_the_plan_allows_runs_and_the_log_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """llama-server with ``--no-slots`` (its page answers 501) under a 4 s limit: a working 10 s prefill
    (no chunk until it ends, then a chunk every second) is no hang, because where progress cannot be read
    the limit covers the plan's longest prefill (4,096 tokens at half the 50 tokens/s decode estimate:
    164 s); the log says so once. A request that truly gets nothing is hung at that bound (before: the
    prefill was killed at 4 s, without a word)."""
    time = FakeTime()
    limits = Limits(stall_s=4.0, canary_s=0)
    prefill = LongestPrefill.of(4096, 50.0)
    assert prefill.seconds == 4096 / 25

    class Prefilling(StandInEngine):
        def activity(self) -> Activity:  # silent while it prefills, then a chunk a second from 10 s
            busy = int(self.start_at <= self.time.now < self.end_at)
            return Activity(busy, int(max(0.0, self.time.now - 10.0)))

    prefilling = Prefilling(time, start_at=0.0, end_at=20.0, unreadable=True)
    stuck = StandInEngine(time, start_at=0.0, unreadable=True)

    async def scenario() -> None:
        with caplog.at_level("WARNING", logger="gateway.liveness"):
            assert await _watch_until(_watch(prefilling, limits, prefill), time, 60.0) is None
        warnings = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "GET /slots answered 501" in warnings[0] and "164 s without a relayed chunk" in warnings[0]
        time.now = 0.0
        verdict = await _watch_until(_watch(stuck, limits, prefill), time, 1000.0)
        assert verdict is not None and "the plan's longest prefill, 164 s: its progress cannot be read" in verdict
        assert 163.8 <= time.now <= 164.0 + 2 * limits.poll_s + 1e-6, time.now

    _run(scenario)


def test_an_engine_that_reports_no_progress_gets_the_longest_prefill_from_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """llama-cpp-python has no progress page: the limit covers the longest prefill before any request."""
    time = FakeTime()
    engine = StandInEngine(time, start_at=0.0, end_at=30.0, reports=False)
    watch = _watch(engine, Limits(stall_s=4.0, canary_s=0), LongestPrefill.of(2048, 0.0))

    async def scenario() -> None:
        with caplog.at_level("WARNING", logger="gateway.liveness"):
            assert await _watch_until(watch, time, 60.0) is None
        assert watch.blind == "it reports none" and watch.stall_limit_s == 2048 / 10.0
        assert sum("cannot be read (it reports none)" in r.getMessage() for r in caplog.records) == 1

    _run(scenario)


def test_the_http_probe_tells_an_unusable_answer_from_no_answer() -> None:
    """llama-server's answer to ``/slots`` under ``--no-slots`` (501, its error object) is Unreadable: the
    server answers, its progress cannot be seen; a refused connection is no answer at all (None)."""
    no_slots = json.dumps(
        {
            "error": {
                "code": 501,
                "message": "This server does not support slots endpoint.",
                "type": "not_supported_error",
            }
        }
    )
    slots = json.dumps([{"id": 0, "is_processing": False, "id_task": 3}])
    routes = [
        Route("/slots", lambda _request: Response(slots)),
        Route("/no-slots", lambda _request: Response(no_slots, status_code=501)),
    ]
    engine = Served(Starlette(routes=routes), lifespan="off")

    def launch(path: str, base: str) -> Launch:
        return Launch(
            "llamacpp", [], 0, "k", "m", 4096, "/health", "", base=base, progress_path=path, progress=slots_progress
        )

    async def scenario() -> list[Any]:
        found = []
        for path, base in (("/no-slots", engine.url), ("/slots", engine.url), ("/slots", "http://127.0.0.1:9")):
            probe = HttpProbe(launch(path, base))
            found.append(await probe.progress())
            await probe.aclose()
        return found

    try:
        off, on, gone = asyncio.run(scenario())
    finally:
        engine.stop()
    assert isinstance(off, Unreadable) and off.why.startswith('GET /no-slots answered 501: {"error"')
    assert on == Progress(((0, 3, None, None, False),), busy=False)
    assert gone is None


def test_the_supervisor_gives_the_watch_the_plans_longest_prefill(tmp_path: Path) -> None:
    time = FakeTime()
    option = replace(_llama(), estimated_tokens_per_s=40.0)  # context 8192: 8192 / 20 tokens/s = 410 s

    def unreadable(_launch: Launch) -> Any:
        return StandInEngine(time, start_at=float("inf"), unreadable=True)

    liveness = Liveness(
        Limits(stall_s=30.0, canary_s=0),
        activity=lambda: Activity(1, 0),
        end_requests=lambda _why: asyncio.sleep(0),
        probe=unreadable,
        clock=time.clock,
        sleep=time.sleep,
    )
    supervisor = _supervisor([option], Engines(serves()), tmp_path, liveness=liveness)

    async def scenario() -> dict[str, Any]:
        await supervisor.start()
        await _until(lambda: supervisor.progress_watch is not None and supervisor.progress_watch.blind is not None)
        snapshot = supervisor.snapshot()
        await supervisor.stop()
        return snapshot

    snapshot: dict[str, Any] = {}

    async def run() -> None:
        snapshot.update(await scenario())

    _run(run)
    assert snapshot["liveness"]["stall_limit_s"] == 410 and "501" in snapshot["liveness"]["progress_unreadable"]


def test_an_engine_that_stops_answering_its_progress_page_is_hung() -> None:
    """A stopped process (SIGSTOP): the page never answers. Real time, a 0.1 s limit."""
    time = FakeTime()
    engine = StandInEngine(time, start_at=0.0, frozen_at=0.0, silent=True)
    watch = ProgressWatch(engine, engine.activity, Limits(stall_s=0.1, canary_s=0))

    async def scenario() -> None:
        verdict = await asyncio.wait_for(watch.watch(), 3)
        assert "no progress for" in verdict

    _run(scenario)


def test_relayed_chunks_are_progress_for_an_engine_without_a_progress_page() -> None:
    time = FakeTime()
    streaming = StandInEngine(time, start_at=0.0, end_at=3000.0, reports=False, chunks_every_s=20.0)
    stopping = StandInEngine(time, start_at=0.0, reports=False, chunks_every_s=20.0, frozen_at=1000.0)

    async def scenario() -> None:
        assert await _watch_until(_watch(streaming), time, 3600.0) is None
        time.now = 0.0
        verdict = await _watch_until(_watch(stopping), time, 5000.0)
        assert verdict is not None and 1000.0 + STALL_S <= time.now <= 1000.0 + STALL_S + 31, time.now

    _run(scenario)


def test_an_idle_engine_is_never_hung_without_a_canary_and_gets_one_every_interval() -> None:
    time = FakeTime()
    idle = StandInEngine(time, start_at=float("inf"), frozen_at=100.0)  # frozen, but nothing is asked of it

    async def scenario() -> None:
        assert await _watch_until(_watch(idle), time, 10_000.0) is None
        time.now = 0.0
        answering = StandInEngine(time, start_at=float("inf"))
        limits = Limits(stall_s=STALL_S, canary_s=600.0)
        assert await _watch_until(_watch(answering, limits), time, 3100.0) is None
        assert len(answering.canaries) == 5 and all(
            b - a >= 600.0 for a, b in zip(answering.canaries, answering.canaries[1:], strict=False)
        )

    _run(scenario)


def test_the_canary_passes_the_engines_dispatch_gate_and_is_counted_while_in_the_engine() -> None:
    """A canary sent while a long prefill is being placed could take the slot it is placed in (llama-server
    picks an idle slot for it): it waits while the gate is closed, and the placing counts it as in the engine
    (gateway.serving.transport.long_pin)."""
    time = FakeTime()
    gate = DispatchGate()
    seen: list[int] = []

    class Counted(StandInEngine):
        async def canary(self) -> bool:
            seen.append(gate.outside)
            return await super().canary()

    engine = Counted(time, start_at=float("inf"))
    limits = Limits(stall_s=STALL_S, canary_s=600.0)
    watch = ProgressWatch(engine, engine.activity, limits, clock=time.clock, sleep=time.sleep, passage=gate.passage)

    async def scenario() -> None:
        gate.close()  # a long prefill being placed when the first canary is due
        task = asyncio.create_task(watch.watch())
        while time.now < limits.canary_s:  # the fake clock moves while the watch sleeps between looks
            await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)
        assert engine.canaries == [] and gate.outside == 0  # due, and held at the gate
        gate.open()
        while not engine.canaries:
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert seen == [1] and gate.outside == 0  # counted while in the engine, then not

    _run(scenario)


def test_an_idle_engine_whose_canary_gets_no_answer_is_hung() -> None:
    time = FakeTime()
    engine = StandInEngine(time, start_at=float("inf"), frozen_at=0.0)
    watch = ProgressWatch(
        engine, engine.activity, Limits(stall_s=0.1, canary_s=0.1), clock=time.clock, sleep=time.sleep
    )

    async def scenario() -> None:
        verdict = await asyncio.wait_for(watch.watch(), 3)
        assert "canary got no answer in 0.1 s" in verdict

    _run(scenario)


# -- the engines' own accounts ----------------------------------------------------------------------


def test_llama_servers_slots_mark_moves_with_prefill_and_decode() -> None:
    """Fields as b11434's server_slot::to_json writes them (tools/server/server-context.cpp)."""

    def slots(processed: int, decoded: int, task: int = 7) -> str:
        token = {"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": decoded}
        slot = {"id": 0, "n_ctx": 4096, "speculative": False, "is_processing": True, "id_task": task,
                "n_prompt_tokens": 3000, "n_prompt_tokens_processed": processed, "n_prompt_tokens_cache": 0,
                "next_token": [token]}  # fmt: skip
        return json.dumps([slot, {"id": 1, "n_ctx": 4096, "speculative": False, "is_processing": False}])

    def mark(text: str) -> Hashable:
        found = slots_progress(text)
        assert found is not None and found.busy is True
        return found.mark

    assert mark(slots(512, 0)) != mark(slots(1024, 0)) != mark(slots(1024, 1))
    assert mark(slots(512, 0)) == mark(slots(512, 0))
    assert mark(slots(0, 0, task=8)) != mark(slots(0, 0, task=7))  # a new request began
    idle = json.dumps([{"id": 0, "n_ctx": 4096, "speculative": False, "is_processing": False, "id_task": 7}])
    assert slots_progress(idle) == Progress(((0, 7, None, None, False),), busy=False)
    busy = slots_progress(slots(512, 3))  # each processing slot is a part of its own
    assert busy is not None and busy.parts == (("slot 0", (7, 512, 3)),)
    assert slots_progress('{"error": {"code": 501, "message": "This server does not support slots endpoint."}}') is None
    assert slots_progress("not json") is None


def test_vllms_metrics_mark_moves_with_a_prefill_chunk_and_with_tokens() -> None:
    def page(prompt: float, generated: float, steps: float, kv: float) -> str:
        labels = '{engine="0",model_name="m"}'
        return (
            f"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{labels} {prompt}\n"
            f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{labels} {generated}\n"
            f"# TYPE vllm:iteration_tokens_total histogram\nvllm:iteration_tokens_total_count{labels} {steps}\n"
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{labels} {kv}\n"
        )

    before = metrics_progress(page(100, 50, 60, 0.01))
    assert before is not None and before.busy is None  # its gauges are stale once the core hangs
    assert metrics_progress(page(100, 50, 60, 0.03)) != before  # a chunk of a long prefill took KV blocks
    assert metrics_progress(page(100, 51, 61, 0.01)) != before  # a token
    assert metrics_progress(page(100, 50, 60, 0.01)) == before
    assert metrics_progress("# TYPE other counter\nother_total 3\n") is None
    assert metrics_progress("{not prometheus") is None


# -- the supervisor: a hang ends the requests in flight, then restarts like a crash --------------------


class HungOnce:
    """A probe factory: the first engine start never shows progress, later ones do."""

    def __init__(self) -> None:
        self.starts = 0

    def __call__(self, _launch: Launch) -> Any:
        self.starts += 1
        return _Probe(hung=self.starts == 1)


@dataclass
class _Probe:
    hung: bool
    n: int = 0

    @property
    def reports_progress(self) -> bool:
        return True

    async def progress(self) -> Progress | None:
        self.n += 0 if self.hung else 1
        return Progress(self.n)

    async def canary(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def test_a_hung_engine_ends_its_requests_then_restarts_by_the_crash_path(tmp_path: Path) -> None:
    time = FakeTime()
    events: list[str] = []
    engines = Engines(serves(), serves())

    async def end_requests(why: str) -> None:
        events.append(f"ended: {why}")
        assert not engines.runs[0].stopped, "requests are ended before the engine is stopped"

    liveness = Liveness(
        Limits(stall_s=30.0, canary_s=0),
        activity=lambda: Activity(1, 0),  # one request in flight all along
        end_requests=end_requests,
        probe=HungOnce(),
        clock=time.clock,
        sleep=time.sleep,
    )
    backoff = Clock()
    supervisor = _supervisor([_llama()], engines, tmp_path, liveness=liveness, sleep=backoff.sleep)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: supervisor.restarts == 1 and supervisor.state is State.READY)
        snapshot = supervisor.snapshot()
        await supervisor.stop()
        assert engines.runs[0].stopped and len(engines.runs) == 2
        assert backoff.slept == [1.0]  # the first restart's backoff, as after a crash
        [hang] = snapshot["hangs"]
        assert hang["engine"] == "llamacpp" and "no progress for 30 s" in hang["why"]
        assert snapshot["liveness"] == {"stall_timeout_s": 30.0, "canary_interval_s": 0}
        [ended] = events
        assert "stopped making progress" in ended and "retry" in ended

    _run(scenario)


def test_no_liveness_means_no_watch(tmp_path: Path) -> None:
    engines = Engines(serves())
    supervisor = _supervisor([_llama()], engines, tmp_path)

    async def scenario() -> None:
        await supervisor.start()
        await supervisor.wait_settled()
        assert "hangs" not in supervisor.snapshot()
        await supervisor.stop()

    _run(scenario)


# -- the requests in flight end in their own API's shape (the gateway's client to the engine) ----------


def test_cutting_ends_each_request_in_flight_in_its_dialect_and_later_requests_go_through() -> None:
    """What the supervisor's ``end_requests`` does (EngineClient.cut), against a stand-in engine that
    holds a non-streamed answer and stops a stream after its first chunk, as a hung engine does."""
    routes = [Route(path, _scripted, methods=["POST"]) for path in ("/v1/chat/completions", "/v1/messages")]
    engine = Served(Starlette(routes=routes), lifespan="off")
    runtime = make_runtime(engine.url, native=frozenset())
    runtime.engine_client = client = EngineClient(
        Timeouts(connect_s=LONG_S, first_byte_s=LONG_S, stream_idle_s=LONG_S, answer_s=LONG_S)
    )
    why = "the engine stopped making progress (test); it is being restarted: retry"

    def said(cue: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": cue}]

    asks = {
        "chat, held": ("/v1/chat/completions", {"messages": said("HEADLESS")}),
        "chat stream, stalled": ("/v1/chat/completions", {"messages": said("STALL"), "stream": True}),
        "messages stream, stalled": ("/v1/messages", {"max_tokens": 9, "messages": said("STALL"), "stream": True}),
    }
    answers: dict[str, Any] = {}
    try:
        with TestClient(create_app(runtime), raise_server_exceptions=False) as http:

            def ask(name: str) -> None:
                path, body = asks[name]
                answers[name] = http.post(path, json={"model": FRONTED, **body})

            threads = [threading.Thread(target=ask, args=(name,)) for name in asks]
            for thread in threads:
                thread.start()
            wait_until(
                lambda: client.activity().in_flight >= 3 and client.activity().chunks >= 2,
                what="three requests in flight, the two streams each with a chunk",
            )
            assert http.portal is not None
            http.portal.call(client.cut, why)
            for thread in threads:
                thread.join(5)
            # the app's cleanup may run just after the client read the end
            wait_until(lambda: not client.activity().in_flight, what="no request in flight")
            hi = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            again = http.post("/v1/chat/completions", json=hi)
    finally:
        engine.stop()
    held = answers["chat, held"]
    assert held.status_code == 503 and held.json()["error"]["message"] == why
    _, last = sse_events(answers["chat stream, stalled"].text)[-1]
    assert "Hello" in answers["chat stream, stalled"].text and last["error"]["message"] == why
    messages = answers["messages stream, stalled"]
    if messages.status_code == 503:  # cut before its stream began: a whole Anthropic error
        assert messages.json() == {"type": "error", "error": {"type": "overloaded_error", "message": why}}
    else:
        name, last = sse_events(messages.text)[-1]
        assert name == "error" and last["type"] == "error" and last["error"]["message"] == why
    assert again.status_code == 200 and "Hello" in again.text and why not in again.text  # on a fresh connection


def test_the_idle_canary_and_the_groups_canary_send_one_request() -> None:
    """One canary (liveness.send_canary): the idle watch's and an engine group's readiness check send the same
    one-token completion with the launch's key; each keeps its own verdict (the group's reason names the
    status, the idle watch only logs it)."""
    seen: list[tuple[str, str | None, Any]] = []

    async def completions(request: Any) -> Response:
        seen.append((request.url.path, request.headers.get("authorization"), json.loads(await request.body())))
        return Response('{"error": "busy"}', status_code=503)

    engine = Served(Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])]), lifespan="off")
    target = Launch("vllm", [], 0, "k", "m", 4096, "/health", "", base=engine.url)

    async def scenario() -> tuple[bool, str | None]:
        probe = HttpProbe(target)
        try:
            idle = await probe.canary()
        finally:
            await probe.aclose()
        return idle, await http_canary(target, timeout_s=5.0)

    try:
        idle, group = asyncio.run(scenario())
    finally:
        engine.stop()
    assert idle is True and group == 'the one-token canary was answered 503: {"error": "busy"}'
    request = ("/v1/completions", "Bearer k", {"model": "m", "prompt": "Hi", "max_tokens": 1, "temperature": 0})
    assert seen == [request, request]
