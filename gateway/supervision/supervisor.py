"""Makes the plan true: start the best option, read how it fails, step down, fall back, stay up.

The options come from the planner, best first (vLLM rungs, then the llama.cpp placement). For each
start the engine's failure line decides the next move:
- a memory failure with the engine's numbers → the same option adjusted to them (vLLM's estimated
  maximum length, the utilization that is actually free); without usable numbers → the next option
  (a weights OOM also skips every option that would load the same weights per GPU);
- a configuration failure (unknown parser, bad flag, broken file) → stop at once with the fix;
- any other failure → the next option; when one engine has no option left, the other engine's.
What started is remembered; a serving engine that dies is restarted with backoff (at most so many
times within so long: :class:`~gateway.supervision.after_failure.RestartBudget`; past that it is tried
at a long, growing backoff until it serves again), and repeated memory failures at run time move down
the options. When the plan pools
other nodes' devices (``serve --workers``), a device that cannot be reached, or any death while
serving, makes the plan again over the nodes that answer now (``replan``) and starts its options.

The moves are decided by two pure functions, :func:`next_move` (after a failed start) and
:func:`restart_move` (after a death while serving); the :class:`Supervisor` only carries them out,
with an injected run factory and clock, so each transition has a fast test without an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gateway.backends.base import FailureKind, Launch, Option
from gateway.core.errors import GatewayError
from gateway.core.process import free_port
from gateway.remembered.known_good import KnownGoodSlot
from gateway.supervision.after_failure import GiveUp, Replan, RestartBudget, Stop, next_move, restart_move
from gateway.supervision.engine_run import EngineRun, Run, RunFactory, RunState
from gateway.supervision.group import RANK_LOST, GroupControl, GroupRun
from gateway.supervision.lifecycle import State
from gateway.supervision.liveness import Liveness, LongestPrefill, ProgressWatch

log = logging.getLogger("gateway.supervisor")

MAX_ATTEMPTS = 8
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


class NodeWatch(Protocol):
    """The other nodes a plan runs on (``gateway.nodes.survey.Nodes``, given by the caller)."""

    async def check(self) -> list[str]:
        """The nodes in use that are gone now (asked on the loop, each within its own deadline)."""
        ...

    def snapshot(self, memory_mib: Mapping[str, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
        """The nodes as /status shows them."""
        ...


NODE_CHECK_S = 5.0  # how often the nodes in use are asked whether they are still there
MAX_REPLANS_SHOWN = 50  # re-plans /status lists
Event = TypeVar("Event")
EVENTS_KEPT = 100  # the latest attempts, hangs and group stops kept: one that retries for weeks stays small
STOPPED_FOR_NODES = -1  # the "exit status" of an engine stopped because a node it used is gone
STOPPED_HUNG = -2  # ... and of one stopped because it made no progress (gateway.supervision.liveness)
UNEXPECTED = -3  # ... and the cause of a restart after an unexpected error in the supervisor itself
# Makes the plan again over the nodes that answer now (a coroutine: the nodes are asked on the loop):
# the options and the plan's summary for /status.
Replanner = Callable[[], Awaitable[tuple[list[Option], dict[str, Any]]]]


@dataclass
class Attempt:
    number: int
    engine: str
    label: str
    argv: list[str]
    log_path: str
    started: str
    elapsed_s: float = 0.0
    outcome: str = "running"
    failure: dict[str, Any] | None = None
    action: str = ""

    def line(self) -> str:
        what = f"attempt {self.number}: {self.label} → {self.outcome} after {self.elapsed_s:.1f} s"
        if self.failure:
            what += f"; {self.failure['kind']}: {self.failure['line'][:300]}"
        return what + (f"; {self.action}" if self.action else "")


class Supervisor:
    def __init__(
        self,
        options: Sequence[Option],
        *,
        log_dir: Path,
        startup_timeout_s: float,
        shutdown_grace_s: float,
        remember: KnownGoodSlot | None = None,
        plan_summary: dict[str, Any] | None = None,
        restart_backoff_s: Sequence[float] = RESTART_BACKOFF_S,
        restart_budget: RestartBudget | None = None,
        run_factory: RunFactory = EngineRun,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        replan: Replanner | None = None,
        nodes: NodeWatch | None = None,
        node_check_s: float = NODE_CHECK_S,
        liveness: Liveness | None = None,
        group: GroupControl | None = None,
        group_run: Callable[[Run, GroupControl], Run] = GroupRun,
        wait_for_node: bool = False,
    ) -> None:
        """``run_factory`` makes each attempt's run, ``sleep`` waits out the restart backoff and ``clock``
        places each restart in the budget's window: the real engine and clock by default, stand-ins in
        tests. ``restart_budget``: how many restarts within how long, then how often it is tried.
        ``replan`` makes the plan again when a device on another node is gone; ``nodes`` are those nodes,
        shown in /status. ``liveness`` watches a serving engine's progress: one that hangs is stopped and
        restarted as if it died.
        ``group`` starts an engine's ranks on other nodes (through their workers): an option whose launch
        has followers runs as one group (``group_run``, gateway/supervision/group.py), one fate for all.
        ``wait_for_node``: a replica on another node whose first start found its node unreachable is tried
        again at the budget's long backoff (the other replicas serve meanwhile), not given up for good."""
        self.options = list(options)
        self.wait_for_node = wait_for_node
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        self.remember = remember
        self.plan_summary = plan_summary or {}
        self.restart_backoff_s = tuple(restart_backoff_s)
        self.restart_budget = restart_budget or RestartBudget()
        self.run_factory = run_factory
        self.sleep = sleep
        self.clock = clock
        self.replan = replan
        self.nodes = nodes
        self.node_check_s = node_check_s
        self.liveness = liveness
        self.group = group
        self.group_run = group_run
        self._nothing_run_yet()

    def _nothing_run_yet(self) -> None:
        """What it has started, seen and decided so far: nothing, for a new supervisor."""
        self.group_stops: list[dict[str, Any]] = []  # each group stopped because one of its ranks was gone
        self.hangs: list[dict[str, Any]] = []  # each hang detected: when, why, which engine
        self.progress_watch: ProgressWatch | None = None  # the live engine's, while it serves
        self.replans: list[dict[str, Any]] = []
        self.state = State.STARTING
        self.reason: str | None = None
        self.live: Run | None = None
        self.live_option: Option | None = None
        self.attempts: list[Attempt] = []  # the latest EVENTS_KEPT
        self.attempts_made = 0  # in all: the numbering and the budget of one climb
        self.restarts = 0  # in all (/metrics); the budget counts those within its window
        self.retry_at: float | None = None  # gave up restarting: when it tries again (seconds since the epoch)
        self.ever_ready = False
        self._restart_times: deque[float] = deque()  # when each restart began (``clock``), within the window
        self._tries: int | None = None  # tries since giving up restarting; None: not given up
        self._gave_up_why = ""  # why it gave up restarting, the last time it did
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._unexpected = 0  # unexpected errors in a row (the owner task's backoff)

    # -- public surface -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state is State.READY and self.live is not None and self.live.ready

    @property
    def target(self) -> Launch | None:
        """Where requests go: the engine that runs or is starting (a Launch is an EngineTarget)."""
        return self.live.launch if self.live else None

    @property
    def context_length(self) -> int:
        """The context requests get: the engine's that runs or is starting, else the first option's
        (the plan's), so /v1/models says one figure from the plan on and never one nothing serves."""
        if self.live is not None:
            return self.live.launch.context_length
        return self.options[0].context_length if self.options else 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="supervisor")

    async def wait_settled(self) -> State:
        """Until the first start succeeded or every option failed."""
        await self._settled.wait()
        return self.state

    async def stop(self) -> None:
        self._stopping = True
        if self._task and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.live:
            await self.live.stop()  # an engine that gives its timings over HTTP is read a last time
            self._remember_measured(self.live.snapshot().get("measured"))
        if self.state is not State.FAILED:
            self.state = State.STOPPED
        self._settled.set()

    def snapshot(self) -> dict[str, Any]:
        backend = self.live.snapshot() if self.live else None
        data = {
            "state": self.state.value,
            "reason": self.reason,
            "plan": self.plan_summary,
            "options": [option.label for option in self.options],
            "attempts": [attempt.__dict__ for attempt in self.attempts],
            "restarts": self.restarts,
            "restart_budget": {
                "limit": self.restart_budget.limit,
                "window_s": self.restart_budget.window_s,
                "retry_s": self.restart_budget.retry_s,
                "within_window": self._recent_restarts(),
            },
            "retry_at": _utc(self.retry_at) if self.retry_at is not None else None,
            "backend": backend,
        }
        if self.liveness is not None:
            limits = self.liveness.limits
            liveness: dict[str, Any] = {"stall_timeout_s": limits.stall_s, "canary_interval_s": limits.canary_s}
            if (watch := self.progress_watch) is not None and watch.blind is not None:
                liveness |= {"progress_unreadable": watch.blind, "stall_limit_s": round(watch.stall_limit_s)}
            data["liveness"] = liveness
            data["hangs"] = self.hangs
        if backend and backend.get("measured"):
            data["speed"] = self._remember_measured(backend["measured"])
        if self.nodes is not None:
            live = backend if backend and self.live is not None and self.live.ready else {}
            data["nodes"] = self.nodes.snapshot(live.get("memory_mib"))
        if self.replan is not None:
            data["replans"] = self.replans
        if self.group is not None:
            data["group_stops"] = self.group_stops
        return data

    def report(self) -> str:
        lines = [self.reason or self.state.value, "attempts:"]
        lines += [f"  {attempt.line()}" for attempt in self.attempts]
        if self.live and self.live.state is not RunState.READY:
            lines.append(self.live.report())
        return "\n".join(lines)

    # -- the owner task -------------------------------------------------------------------------
    async def _run(self) -> None:
        """The owner task, guarded: an exception nobody foresaw (a bug, a worker's answer no parser
        expected) is logged with its traceback and becomes a state /ready explains, then the start is
        tried again (re-planned where the plan pools nodes) with backoff. Unguarded, a survey that raised
        ``AttributeError`` during a re-plan ended this task silently: "starting" with no reason, for ever."""
        resume = False
        while not self._stopping:
            try:
                await self._own(resume)
                return
            except Exception as exc:  # whatever broke, the gateway says so and tries again
                delay = self.restart_backoff_s[min(self._unexpected, len(self.restart_backoff_s) - 1)]
                self._unexpected += 1
                log.exception("supervisor: unexpected %s; trying again in %g s", type(exc).__name__, delay)
                if self.live is not None and not self.live.ready:
                    await self.live.stop()  # a start it was in the middle of
                self.state = State.RESTARTING if self.ever_ready else State.STARTING
                self.reason = (
                    f"unexpected error in the supervisor ({type(exc).__name__}: {str(exc)[:200]}); "
                    f"trying again in {delay:g} s (traceback in the gateway log)"
                )
                await self.sleep(delay)
                resume = True

    async def _own(self, resume: bool) -> None:
        """Start (or, after an unexpected error, start again or go on serving), then serve and restart."""
        if not (resume and self.live is not None and self.live.ready):
            options = (
                await self._replanned("trying again after an unexpected error")
                if resume and self.replan
                else self.options
            )
            if not await self._climb(options):
                if not (resume and self.ever_ready and self.live is not None and self.live_option is not None):
                    if not await self._node_back():
                        self._give_up()  # the first start: nothing ever served, `serve` exits with the attempts
                        return
                    self.state, self.reason, self._unexpected = State.READY, None, 0
                    self._settled.set()
                    return await self._serve_on()
                await self._restart(UNEXPECTED)  # it served once: restarts within the budget, then long retries
                if self._stopping or self.state is not State.READY:
                    return
        self.state, self.reason, self._unexpected = State.READY, None, 0
        self._settled.set()
        await self._serve_on()

    async def _serve_on(self) -> None:
        """Serve, and restart the engine each time it dies, until stopped or given up."""
        while not self._stopping:
            assert self.live is not None
            code = await self._serving()
            if self._stopping:
                return
            await self._restart(code)
            if self.state is State.FAILED:
                return

    async def _serving(self) -> int:
        """Until the live engine exits; with other nodes in the plan, also until one of them is gone
        (then the engine is stopped, so that the restart re-plans without it); with a liveness watch,
        also until the engine hangs (then the requests in flight are ended and the engine stopped)."""
        assert self.live is not None
        exited = asyncio.ensure_future(self.live.wait_exit())
        watches: dict[asyncio.Task[str], int] = {}
        if self.nodes is not None and self.replan is not None:
            watches[asyncio.create_task(self._watch_nodes(self.nodes), name="node watch")] = STOPPED_FOR_NODES
        if self.liveness is not None:
            option = self.live_option
            prefill = LongestPrefill.of(option.context_length, option.estimated_tokens_per_s) if option else None
            progress = self.progress_watch = self.liveness.watch(self.live.launch, prefill)
            watches[asyncio.create_task(progress.watch(), name="progress watch")] = STOPPED_HUNG
        if not watches:
            return await exited
        try:
            await asyncio.wait({exited, *watches}, return_when=asyncio.FIRST_COMPLETED)
            fired = next((watch for watch in watches if watch.done() and not exited.done()), None)
            if fired is None:
                return await exited
            code, why = watches[fired], fired.result()
            if code == STOPPED_HUNG:
                await self._hung(why)
            else:
                log.error("node(s) %s stopped answering while serving: stopping the engine to re-plan", why)
            await self.live.stop()  # its exit watcher is cancelled with it: do not wait on that
            exited.cancel()
            return code
        finally:
            for watch in watches:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    async def _hung(self, why: str) -> None:
        """The live engine is hung: no new request reaches it, those in flight end with an error."""
        assert self.live is not None and self.liveness is not None
        log.error("engine hung: %s; ending the requests in flight and restarting it", why)
        self.state = State.RESTARTING
        self.reason = f"engine hung ({why}); restarting"
        _keep_latest(self.hangs, {"at": time.strftime("%H:%M:%S"), "engine": self.live.launch.engine, "why": why})
        await self.liveness.end_requests(f"the engine stopped making progress ({why}); it is being restarted: retry")

    async def _watch_nodes(self, nodes: NodeWatch) -> str:
        """Until a node in use is gone. A check that raises is logged (its traceback once in a row) and
        changes nothing: the engine serves on, and the next check asks again."""
        failing = False
        while True:
            await self.sleep(self.node_check_s)
            try:
                lost = await nodes.check()
            except Exception as exc:  # a bug in the check must not end serving, nor pass silently
                log.error("checking the nodes failed (%s: %s)", type(exc).__name__, exc, exc_info=not failing)
                failing = True
                continue
            failing = False
            if lost:
                return ", ".join(lost)

    async def _climb(self, options: list[Option]) -> bool:
        """Try options in order until one serves; True when one does."""
        queue = list(options)
        budget = self.attempts_made + MAX_ATTEMPTS
        unprepared: list[str] = []
        while queue:
            if self.attempts_made >= budget:
                self.reason = f"gave up after {MAX_ATTEMPTS} attempts"
                return False
            option = queue.pop(0)
            try:
                option = await asyncio.to_thread(option.prepare)  # e.g. download the GGUF, off the loop
            except GatewayError as exc:
                log.warning("cannot prepare %s: %s", option.label, exc)
                unprepared.append(f"{option.label}: {exc}")
                continue
            run, attempt = await self._attempt(option, self.attempts_made + 1, self.attempts_made + 1 + len(queue))
            if run.state is RunState.READY:
                self.live, self.live_option = run, option
                self.state = State.READY
                self.ever_ready = True
                self._remember(option)
                return True
            move = next_move(option, run.failure, queue, can_replan=self.replan is not None)
            attempt.action = move.describe(option)
            if isinstance(move, Stop):
                self.reason = move.reason
                log.error("%s", attempt.line())
                return False
            log.warning("%s", attempt.line())
            queue = await self._replanned(move.reason) if isinstance(move, Replan) else list(move.queue)
        tried = [f"{a.outcome}: {a.label}" for a in self.attempts[-3:]]
        self.reason = "no option started: " + "; ".join(tried + unprepared)
        return False

    async def _attempt(self, option: Option, number: int, of: int) -> tuple[Run, Attempt]:
        launch = option.launch(free_port(), "gw" + secrets.token_hex(20))  # never starts with "-" (argv)
        run = self.run_factory(
            launch,
            log_dir=self.log_dir,
            classify=option.classify,
            startup_timeout_s=self.startup_timeout_s,
            shutdown_grace_s=self.shutdown_grace_s,
            label=f"attempt {number} of {of} ({option.engine})",
        )
        if launch.followers:
            if self.group is None:  # a plan over nodes always comes with its workers (gateway.cli.startup)
                raise GatewayError(f"{option.label} runs ranks on other nodes, and no workers were given")
            run = self.group_run(run, self.group)
        attempt = Attempt(
            number=number,
            engine=option.engine,
            label=option.label,
            argv=run.snapshot()["argv"],
            log_path=str(run.log_path),
            started=time.strftime("%H:%M:%S"),
        )
        self.attempts_made += 1
        _keep_latest(self.attempts, attempt)
        self.live = run
        await run.start()
        await run.wait_settled()
        attempt.elapsed_s = round(run.elapsed_s, 1)
        attempt.outcome = "ready" if run.state is RunState.READY else "failed"
        if failure := run.failure:
            attempt.failure = {"kind": failure.kind.name.lower(), "line": failure.line, "numbers": failure.numbers}
        elif run.state is not RunState.READY:
            attempt.failure = {"kind": "exit", "line": run.reason or "", "numbers": {}}
        return run, attempt

    async def _restart(self, code: int) -> None:
        """The serving engine died: start the same option again, with backoff; memory failures at
        run time move down the options. Past the restart budget it gives up restarting at the short
        backoff, says when it tries next (state failed, ``retry_at``), and tries at the budget's long,
        growing backoff until an engine serves again."""
        assert self.live is not None and self.live_option is not None
        failure = self.live.failure
        hung = f"engine hung ({self.hangs[-1]['why']})" if self.hangs else "engine hung"
        what = {
            STOPPED_FOR_NODES: "a node it used is gone",
            STOPPED_HUNG: hung,
            UNEXPECTED: "its start after an unexpected error in the supervisor failed",
        }.get(code, f"engine exited with status {code}")
        if code == RANK_LOST:
            what = self.live.reason or "a rank of the engine's group is gone"
        if self.live.launch.followers:  # one fate: every rank was stopped, on every node
            _keep_latest(self.group_stops, {"at": time.strftime("%H:%M:%S"), "why": what})
        log.error("%s; restarting", what if what.endswith(" while serving") else f"{what} while serving")
        self.state = State.RESTARTING
        self.reason = f"{what}; restarting"
        while not self._stopping:
            move = restart_move(
                self.live_option,
                failure,
                self.options,
                self._recent_restarts(),
                self.restart_backoff_s,
                can_replan=self.replan is not None,
                budget=self.restart_budget,
                tries=self._tries,
            )
            if isinstance(move, GiveUp):
                if move.retry is None:
                    self._give_up(move.reason)
                    return
                step = move.retry
                if self._tries is None:
                    self._gave_up_why = move.reason
                self._wait_to_retry(what, move.reason, step.delay_s)
                await self.sleep(step.delay_s)
                self._tries = (self._tries or 0) + 1
                self.state, self.retry_at = State.RESTARTING, None
                self.reason = f"{what}; gave up restarting, trying again now (try {self._tries} since giving up)"
            else:
                step = move
                budget = self.restart_budget
                self.state = State.RESTARTING
                self.reason = (
                    f"{what}; restarting in {step.delay_s:g} s "
                    f"(restart {step.number} of at most {budget.limit} within {budget.window_s:g} s)"
                )
                await self.sleep(step.delay_s)
            self._restart_times.append(self.clock())
            self.restarts += 1
            options = await self._replanned(step.reason) if isinstance(step, Replan) else [step.option]
            if await self._climb(options):
                if self._tries is not None:
                    log.warning("serving again, try %d since giving up restarting", self._tries)
                self.reason, self._tries = None, None
                return

    def _recent_restarts(self) -> int:
        """The restarts that began within the budget's window (older ones are forgotten)."""
        horizon = self.clock() - self.restart_budget.window_s
        while self._restart_times and self._restart_times[0] <= horizon:
            self._restart_times.popleft()
        return len(self._restart_times)

    def _wait_to_retry(self, what: str, why: str, delay_s: float) -> None:
        """Given up restarting for now: /ready and the 503s say so, and when the next try is."""
        self.state = State.FAILED
        self.retry_at = time.time() + delay_s
        since = f"; {why}" if self._tries is not None else ""
        self.reason = (
            f"{what}; gave up restarting ({self._gave_up_why}){since}; "
            f"trying again at {_clock_utc(self.retry_at)} UTC (in {delay_s:g} s)"
        )
        log.error("%s", self.reason)

    async def _replanned(self, why: str) -> list[Option]:
        """The plan made again over the nodes that answer now; its options replace the old ones."""
        assert self.replan is not None
        log.warning("re-planning: %s", why)
        del self.replans[: -MAX_REPLANS_SHOWN + 1]  # retried with backoff while a cause lasts: the last few
        try:
            options, summary = await self.replan()
        except GatewayError as exc:
            log.error("re-planning failed: %s", exc)
            self.replans.append({"at": time.strftime("%H:%M:%S"), "why": why, "error": str(exc)})
            return []
        except Exception as exc:  # not a verdict on the plan: the owner task logs it and tries again
            self.replans.append({"at": time.strftime("%H:%M:%S"), "why": why, "error": f"{type(exc).__name__}: {exc}"})
            raise
        self.options, self.plan_summary = list(options), summary
        self.remember = None  # what starts now is not what the remembered key (the node set) describes
        self.replans.append(
            {"at": time.strftime("%H:%M:%S"), "why": why, "decision": summary.get("decision"),
             "options": [o.label for o in options]}
        )  # fmt: skip
        for number, option in enumerate(options, 1):
            log.info("re-planned option %d of %d: %s", number, len(options), option.label)
        return list(options)

    def _remember(self, option: Option) -> None:
        if self.remember is None:
            return
        version = self.remember.versions.get(option.engine, "unknown")
        try:
            self.remember.store.put(
                self.remember.model, self.remember.fingerprint, option.engine, version, option.memo()
            )
        except OSError as exc:
            log.warning("could not remember the working configuration: %s", exc)

    def _remember_measured(self, measured: dict[str, float] | None) -> dict[str, Any]:
        """The engine's own decode and prompt speed beside the plan's estimate, stored with the
        remembered configuration so that `plan` can show it and the CPU term can learn from it."""
        option = self.live_option
        if not measured or option is None:
            return {}
        speed: dict[str, Any] = {"measured": measured, "estimated": option.estimated_tokens_per_s or None}
        if self.remember is not None and measured.get("decode_tokens_per_s"):
            try:
                self.remember.store.record_measured(
                    self.remember.model,
                    self.remember.fingerprint,
                    option.engine,
                    option.memo(),
                    {**measured, "estimated_decode_tokens_per_s": speed["estimated"] or 0.0},
                )
            except OSError as exc:
                log.warning("could not store the measured speed: %s", exc)
        return speed

    async def _node_back(self) -> bool:
        """With ``wait_for_node``, after a first start that failed because its node did not answer: settled
        as failed (serve goes on with the other replicas), then tried at the budget's long backoff until an
        engine serves (True); False at once for any other failure."""
        tries = 0
        while self.wait_for_node and not self._stopping:
            failure = self.live.failure if self.live is not None else None
            if failure is None or failure.kind is not FailureKind.DEVICE_UNREACHABLE:
                return False
            delay = self.restart_budget.retry_delay(tries)
            self.state, self.retry_at = State.FAILED, time.time() + delay
            self.reason = (
                f"not started: its node did not answer ({failure.line}); "
                f"trying again at {_clock_utc(self.retry_at)} UTC (in {delay:g} s)"
            )
            log.error("%s", self.reason)
            self._settled.set()
            await self.sleep(delay)
            tries += 1
            self.state, self.retry_at = State.STARTING, None
            if await self._climb(self.options):
                return True
        return False

    def _give_up(self, reason: str | None = None) -> None:
        self.state = State.FAILED
        self.reason = reason or self.reason or "no option started"
        self._settled.set()
        log.error("%s", self.report())


def _utc(at: float) -> str:
    """``at`` (seconds since the epoch) as an ISO 8601 UTC time, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _clock_utc(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at))


def _keep_latest(events: list[Event], event: Event) -> None:
    """Append, keeping the latest EVENTS_KEPT: a long-running gateway's history in memory is bounded."""
    events.append(event)
    del events[:-EVENTS_KEPT]
