"""Makes the plan true: start the best option, read how it fails, step down, fall back, stay up.

The options come from the planner, best first (vLLM rungs, then the llama.cpp placement). For each
start the engine's failure line decides the next move:
- a memory failure with the engine's numbers → the same option adjusted to them (vLLM's estimated
  maximum length, the utilization that is actually free); without usable numbers → the next option
  (a weights OOM also skips every option that would load the same weights per GPU);
- a configuration failure (unknown parser, bad flag, broken file) → stop at once with the fix;
- any other failure → the next option; when one engine has no option left, the other engine's.
What started is remembered; a serving engine that dies is restarted with backoff (a bounded number
of times), and repeated memory failures at run time move down the options.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.base import Failure, Launch, Option
from gateway.engine_run import EngineRun, RunState
from gateway.errors import GatewayError
from gateway.known_good import KnownGood
from gateway.lifecycle import State
from gateway.process import free_port

log = logging.getLogger("gateway.supervisor")

MAX_ATTEMPTS = 8
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
MAX_RESTARTS = 5


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


@dataclass(frozen=True)
class Remember:
    """Where and under which key to remember what worked."""

    store: KnownGood
    model: str
    fingerprint: str
    versions: dict[str, str]  # engine → version string


class Supervisor:
    def __init__(
        self,
        options: Sequence[Option],
        *,
        log_dir: Path,
        startup_timeout_s: float,
        shutdown_grace_s: float,
        remember: Remember | None = None,
        plan_summary: dict[str, Any] | None = None,
        restart_backoff_s: Sequence[float] = RESTART_BACKOFF_S,
    ) -> None:
        self.options = list(options)
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        self.remember = remember
        self.plan_summary = plan_summary or {}
        self.restart_backoff_s = tuple(restart_backoff_s)
        self.state = State.STARTING
        self.reason: str | None = None
        self.live: EngineRun | None = None
        self.live_option: Option | None = None
        self.attempts: list[Attempt] = []
        self.restarts = 0
        self.ever_ready = False
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- public surface -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state is State.READY and self.live is not None and self.live.ready

    @property
    def launch(self) -> Launch | None:
        return self.live.launch if self.live else None

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
            await self.live.stop()
        if self.state is not State.FAILED:
            self.state = State.STOPPED
        self._settled.set()

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "reason": self.reason,
            "plan": self.plan_summary,
            "options": [option.label for option in self.options],
            "attempts": [attempt.__dict__ for attempt in self.attempts],
            "restarts": self.restarts,
            "backend": self.live.snapshot() if self.live else None,
        }

    def report(self) -> str:
        lines = [self.reason or self.state.value, "attempts:"]
        lines += [f"  {attempt.line()}" for attempt in self.attempts]
        if self.live and self.live.state is not RunState.READY:
            lines.append(self.live.report())
        return "\n".join(lines)

    # -- the owner task -------------------------------------------------------------------------
    async def _run(self) -> None:
        if not await self._climb(self.options):
            self._give_up()
            return
        self._settled.set()
        while not self._stopping:
            assert self.live is not None
            code = await self.live.wait_exit()
            if self._stopping:
                return
            await self._restart(code)
            if self.state is State.FAILED:
                return

    async def _climb(self, options: list[Option]) -> bool:
        """Try options in order until one serves; True when one does."""
        queue = list(options)
        budget = len(self.attempts) + MAX_ATTEMPTS
        unprepared: list[str] = []
        while queue:
            if len(self.attempts) >= budget:
                self.reason = f"gave up after {MAX_ATTEMPTS} attempts"
                return False
            option = queue.pop(0)
            try:
                option = await asyncio.to_thread(option.prepare)  # e.g. download the GGUF, off the loop
            except GatewayError as exc:
                log.warning("cannot prepare %s: %s", option.label, exc)
                unprepared.append(f"{option.label}: {exc}")
                continue
            run, attempt = await self._attempt(option, len(self.attempts) + 1, len(self.attempts) + 1 + len(queue))
            if run.state is RunState.READY:
                self.live, self.live_option = run, option
                self.state = State.READY
                self.ever_ready = True
                self._remember(option)
                return True
            failure = run.failure
            next_option = self._next(option, failure, queue)
            if next_option is _STOP:
                assert failure is not None
                attempt.action = f"stopped: a configuration error ({failure.fix})"
                self.reason = f"{option.label}: {failure.kind.value}; fix: {failure.fix}"
                log.error("%s", attempt.line())
                self.live = run
                return False
            if isinstance(next_option, _Retry):
                queue.insert(0, next_option.option)
                attempt.action = f"retrying on the engine's numbers: {next_option.option.label}"
            elif queue:
                switch = queue[0].engine != option.engine
                attempt.action = f"{'falling back to' if switch else 'next rung:'} {queue[0].label}"
            else:
                attempt.action = "no option left"
            log.warning("%s", attempt.line())
            self.live = run
        tried = [f"{a.outcome}: {a.label}" for a in self.attempts[-3:]]
        self.reason = "no option started: " + "; ".join(tried + unprepared)
        return False

    async def _attempt(self, option: Option, number: int, of: int) -> tuple[EngineRun, Attempt]:
        launch = option.launch(free_port(), "gw" + secrets.token_hex(20))  # never starts with "-" (argv)
        run = EngineRun(
            launch,
            log_dir=self.log_dir,
            classify=option.classify,
            startup_timeout_s=self.startup_timeout_s,
            shutdown_grace_s=self.shutdown_grace_s,
            label=f"attempt {number} of {of} ({option.engine})",
        )
        attempt = Attempt(
            number=number,
            engine=option.engine,
            label=option.label,
            argv=run.snapshot()["argv"],
            log_path=str(run.log_path),
            started=time.strftime("%H:%M:%S"),
        )
        self.attempts.append(attempt)
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

    def _next(self, option: Option, failure: Failure | None, queue: list[Option]) -> object:
        """The move after a failed start; edits ``queue`` for options the failure rules out."""
        if failure is None:
            return None
        if failure.kind.is_configuration:
            return _STOP
        if failure.kind.is_memory:
            if adjusted := option.after(failure):
                return _Retry(adjusted)
            if failure.kind.name == "WEIGHTS_OOM":
                queue[:] = [o for o in queue if o.weights_key != option.weights_key]
            return None
        if failure.kind.name == "PORT_IN_USE":
            return _Retry(option)
        if failure.kind.name == "ENGINE_FAILED":  # this engine cannot run it here: skip to the other
            queue[:] = [o for o in queue if o.engine != option.engine] or queue
        return None

    async def _restart(self, code: int) -> None:
        """The serving engine died: start the same option again, with backoff; memory failures at
        run time move down the options."""
        assert self.live is not None and self.live_option is not None
        failure = self.live.failure
        log.error("engine exited with status %s while serving; restarting", code)
        self.state = State.RESTARTING
        self.reason = f"engine exited with status {code}; restarting"
        options = [self.live_option, *self._after(self.live_option)]
        if failure and failure.kind.is_memory:
            options = options[1:] or options
        while self.restarts < MAX_RESTARTS and not self._stopping:
            delay = self.restart_backoff_s[min(self.restarts, len(self.restart_backoff_s) - 1)]
            self.restarts += 1
            await asyncio.sleep(delay)
            if await self._climb(options[:1]):
                self.reason = None
                return
        self._give_up(f"engine kept failing after {self.restarts} restarts")

    def _after(self, option: Option) -> list[Option]:
        index = next((i for i, o in enumerate(self.options) if o is option), None)
        return self.options[index + 1 :] if index is not None else []

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

    def _give_up(self, reason: str | None = None) -> None:
        self.state = State.FAILED
        self.reason = reason or self.reason or "no option started"
        self._settled.set()
        log.error("%s", self.report())


@dataclass(frozen=True)
class _Retry:
    option: Option


_STOP = object()


def remembered_first(
    options: list[Option], remember: Remember | None, rebuild: Callable[[dict[str, Any]], Option | None]
) -> list[Option]:
    """Put the remembered configuration first when the engine version still matches."""
    if remember is None:
        return options
    entry = remember.store.get(remember.model, remember.fingerprint)
    if not entry or remember.versions.get(entry.get("engine", "")) != entry.get("version"):
        return options
    option = rebuild(entry)
    if option is None:
        return options
    log.info("using the configuration remembered on %s: %s", entry.get("when"), option.label)
    return [option, *options]
