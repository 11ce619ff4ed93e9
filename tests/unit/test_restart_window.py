"""The restart budget (gateway.supervision.after_failure.RestartBudget): restarts counted within a window,
and after giving up, tries at a long backoff until the engine serves again; ``/ready`` says which.

Before it, the restart count was never reset: the sixth death in any uptime (days apart) gave up for
good, and the process lived on answering 503 "retry shortly" after the engine could serve again. The
engines here are the stand-in runs of test_supervisor_transitions.py; their uptime and every backoff
run on one injected timeline, so hours of supervision take milliseconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from gateway.backends.base import Failure, Launch
from gateway.serving.app import create_app
from gateway.supervision.after_failure import RestartBudget
from gateway.supervision.engine_run import RunState
from gateway.supervision.lifecycle import State
from gateway.supervision.supervisor import Supervisor
from tests.unit.http_harness import FRONTED, make_runtime
from tests.unit.test_supervisor_transitions import ReplayRun, Script, _llama, _run, _supervisor, _until
from tests.waiting import wait_until

KEY = "sk-window"
FAILS = "fails"  # a start that fails (the engine exits before it answers)


class Timeline:
    """The supervisor's clock and sleep: a wait moves the clock at once and is recorded with the state
    the supervisor was in; ``hold`` makes each wait last until :meth:`release` (one at a time)."""

    def __init__(self, hold: bool = False) -> None:
        self.now = 0.0
        self.hold = hold
        self.slept: list[float] = []
        self.states: list[State] = []
        self.supervisor: Supervisor | None = None
        self.held = threading.Event()  # a wait is being held
        self._gate: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.supervisor is not None:
            self.states.append(self.supervisor.state)
        if self.hold:
            self._gate, self._loop = asyncio.Event(), asyncio.get_running_loop()
            self.held.set()
            await self._gate.wait()
        self.now += seconds
        await asyncio.sleep(0)

    def release(self) -> None:
        """Ends the wait being held (from another thread)."""
        assert self._gate is not None and self._loop is not None
        self.held.clear()
        self._loop.call_soon_threadsafe(self._gate.set)


class Lifetimes:
    """The run factory: each start in turn serves for so many seconds of the timeline then dies, fails to
    start (``FAILS``), or serves until stopped (None); past the list, a start fails."""

    def __init__(self, timeline: Timeline, *lives: float | str | None) -> None:
        self.timeline = timeline
        self.lives = list(lives)
        self.runs: list[ReplayRun] = []

    def __call__(
        self,
        launch: Launch,
        *,
        log_dir: Path,
        classify: Callable[[str], Failure | None],
        startup_timeout_s: float,
        shutdown_grace_s: float,
        label: str = "",
    ) -> ReplayRun:
        life = self.lives.pop(0) if self.lives else FAILS
        if life == FAILS:
            run = ReplayRun(launch, classify, log_dir, Script())
        else:
            run = _Serving(
                launch, classify, log_dir, Script(ready=True), self.timeline, float(life) if life is not None else None
            )
        self.runs.append(run)
        return run


class _Serving(ReplayRun):
    """Serves for ``uptime`` seconds of the timeline, then exits with status 1 (None: until stopped)."""

    def __init__(
        self,
        launch: Launch,
        classify: Callable[[str], Failure | None],
        log_dir: Path,
        script: Script,
        timeline: Timeline,
        uptime: float | None,
    ) -> None:
        super().__init__(launch, classify, log_dir, script)
        self.timeline, self.uptime = timeline, uptime

    async def wait_exit(self) -> int:
        if self.uptime is None:
            return await super().wait_exit()
        self.timeline.now += self.uptime
        await asyncio.sleep(0)
        self.state = RunState.EXITED
        self.reason = "engine exited with status 1 while serving"
        return 1


def _supervised(lives: Lifetimes, tmp_path: Path, timeline: Timeline, **kwargs: Any) -> Supervisor:
    supervisor = _supervisor([_llama()], lives, tmp_path, sleep=timeline.sleep, clock=timeline.clock, **kwargs)  # type: ignore[arg-type]
    timeline.supervisor = supervisor
    return supervisor


def test_deaths_spread_over_more_than_the_window_never_give_up(tmp_path: Path) -> None:
    """Eight deaths, one every 150 s of serving: at most four restarts fall within any 600 s, so each is a
    restart at the short backoff and it never gives up (before: the sixth death gave up for good)."""
    timeline = Timeline()
    lives = Lifetimes(timeline, *[150.0] * 9, None)
    supervisor = _supervised(lives, tmp_path, timeline)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: supervisor.restarts == 9 and supervisor.ready)
        await supervisor.stop()

    _run(scenario)
    assert State.FAILED not in timeline.states and supervisor.retry_at is None
    assert timeline.slept == [1.0, 2.0, 5.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    assert len(supervisor.attempts) == 10 and all(a.outcome == "ready" for a in supervisor.attempts)


def test_deaths_within_the_window_give_up_then_a_later_try_that_serves_serves_again(tmp_path: Path) -> None:
    """Six deaths 10 s apart: five restarts at the short backoff, then it gives up restarting (state failed,
    the next try's time said) and tries at 30, 60, 120 s; the third try serves. Later, past the window, a
    death is a short restart again: nothing is given up for good."""
    timeline = Timeline()
    lives = Lifetimes(timeline, *[10.0] * 6, FAILS, FAILS, 700.0, None)
    supervisor = _supervised(lives, tmp_path, timeline)

    async def scenario() -> None:
        await supervisor.start()
        await _until(lambda: len(lives.runs) == 10 and supervisor.ready)
        await supervisor.stop()

    _run(scenario)
    assert timeline.slept == [1.0, 2.0, 5.0, 10.0, 30.0, 30.0, 60.0, 120.0, 1.0]
    assert timeline.states == [State.RESTARTING] * 5 + [State.FAILED] * 3 + [State.RESTARTING]
    assert supervisor.retry_at is None and supervisor.reason is None
    assert [a.outcome for a in supervisor.attempts] == ["ready"] * 6 + ["failed"] * 2 + ["ready"] * 2
    assert supervisor.restarts == 9


def test_ready_says_restarting_then_gave_up_with_the_next_try_then_serves(engine_url: str, tmp_path: Path) -> None:
    """Through HTTP, with every wait held: the restart's backoff reads "restarting"; past the budget (one
    restart within the window here) "failed" with ``next_try_at`` and a Retry-After until then, the reason
    (behind the key) saying it gave up and when it tries again; after the try, it serves."""
    timeline = Timeline(hold=True)
    lives = Lifetimes(timeline, 10.0, 10.0, None)
    runtime = make_runtime(engine_url, api_keys=(KEY,))
    budget = RestartBudget(limit=1, window_s=600.0, retry_s=120.0)
    runtime.backend = supervisor = _supervised(lives, tmp_path, timeline, restart_budget=budget)
    keyed = {"Authorization": f"Bearer {KEY}"}
    chat = {"model": FRONTED, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(runtime)) as client:
        assert timeline.held.wait(5)
        restarting = client.get("/ready"), client.get("/ready", headers=keyed)
        timeline.release()
        assert timeline.held.wait(5)
        gave_up = client.get("/ready"), client.get("/ready", headers=keyed)
        refused = client.post("/v1/chat/completions", json=chat, headers=keyed)
        timeline.release()
        wait_until(lambda: supervisor.ready, what="the engine to be ready again")
    assert [r.status_code for r in (*restarting, *gave_up)] == [503] * 4
    assert restarting[0].json() == {"status": "restarting"}
    assert restarting[1].json()["reason"] == (
        "engine exited with status 1; restarting in 1 s (restart 1 of at most 1 within 600 s)"
    )
    bare, detail = gave_up[0].json(), gave_up[1].json()
    assert set(bare) == {"status", "next_try_at"} and bare["status"] == "failed"
    assert (
        abs(time.mktime(time.strptime(bare["next_try_at"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone - time.time() - 120)
        < 5
    )
    assert 100 <= int(gave_up[0].headers["Retry-After"]) <= 121
    assert detail["reason"].startswith(
        "engine exited with status 1; gave up restarting (1 restarts within 600 s (restart_limit 1)); trying again at "
    ), detail["reason"]
    assert detail["reason"].endswith("UTC (in 120 s)")
    assert refused.status_code == 503 and "gave up restarting" in refused.json()["error"]["message"]
    assert timeline.slept == [1.0, 120.0] and supervisor.restarts == 2


def test_the_history_kept_in_memory_is_bounded_while_the_numbering_goes_on() -> None:
    """A gateway that restarts for weeks keeps only the latest attempts and hangs (issue 47: memory that
    never comes back), and numbers its attempts from the count in all."""
    from gateway.supervision import supervisor as module

    events: list[int] = []
    for number in range(module.EVENTS_KEPT * 3):
        module._keep_latest(events, number)
    assert events == list(range(module.EVENTS_KEPT * 2, module.EVENTS_KEPT * 3))
