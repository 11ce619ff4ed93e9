"""One start of one engine: launch it, prove it answers, watch it, stop it. One task owns the state.

States: STARTING → READY → EXITED (it died after serving) | FAILED (it never became ready) | STOPPED
(we stopped it). Failure is detected from a classified log line or the process exit, whichever
comes first — never by waiting out the readiness timeout. A specific failure line (with the
engine's numbers) ends the start at once; a generic one ("EngineCore failed to start") waits a few
seconds for the specific line that usually follows it.

:class:`Run` is the surface the supervisor uses and :class:`RunFactory` how it gets one, so that the
supervisor's moves can be tested with a stand-in that replays recorded logs instead of an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from gateway.backends.base import Failure, FailureKind, Launch, most_telling
from gateway.core.auth import bearer_header
from gateway.core.process import ChildProcess, LogNotWritable
from gateway.core.tls import async_http_client

log = logging.getLogger("gateway.engine")

POLL_INTERVAL_S = 0.5
PROGRESS_EVERY_S = 10.0
GENERIC_FAILURE_GRACE_S = 5.0
TAIL_IN_REPORTS = 15
SPEED_POLL_S = 15.0  # how often an engine's metrics page is read for its timings (vLLM)


class RunState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    EXITED = "exited"
    FAILED = "failed"
    STOPPED = "stopped"


class Run(Protocol):
    """One start of one engine as the supervisor sees it (what :class:`EngineRun` offers)."""

    @property
    def launch(self) -> Launch: ...
    @property
    def state(self) -> RunState: ...
    @property
    def ready(self) -> bool: ...
    @property
    def failure(self) -> Failure | None: ...  # the most telling classified line
    @property
    def reason(self) -> str | None: ...  # why it failed or exited, in words
    @property
    def elapsed_s(self) -> float: ...
    @property
    def log_path(self) -> Path: ...
    async def start(self) -> None: ...
    async def wait_settled(self) -> RunState: ...  # until READY or FAILED
    async def wait_exit(self) -> int: ...  # until the process is gone; its exit status
    async def stop(self) -> None: ...
    def snapshot(self) -> dict[str, Any]: ...  # for /status; "argv" redacted
    def report(self) -> str: ...  # a multi-line account of a failure


class RunFactory(Protocol):
    """Makes the :class:`Run` for one attempt; :class:`EngineRun` itself is the real one."""

    def __call__(
        self,
        launch: Launch,
        *,
        log_dir: Path,
        classify: Callable[[str], Failure | None],
        startup_timeout_s: float,
        shutdown_grace_s: float,
        label: str = "",
    ) -> Run: ...


class RunFigures:
    """What every kind of :class:`Run` (an engine here, a replica's server on a node:
    gateway.supervision.remote_run) works out alike from its state, its failure lines and its times."""

    state: RunState
    failures: list[Failure]
    started_at: float | None
    ended_at: float | None

    @property
    def ready(self) -> bool:
        return self.state is RunState.READY

    @property
    def failure(self) -> Failure | None:
        """The most telling failure line: a specific one if any, else the first generic one."""
        return most_telling(self.failures)

    @property
    def elapsed_s(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.ended_at or time.monotonic()) - self.started_at


class EngineRun(RunFigures):
    """The engine process described by ``launch``, from start to exit."""

    def __init__(
        self,
        launch: Launch,
        *,
        log_dir: Path,
        classify: Callable[[str], Failure | None],
        startup_timeout_s: float,
        shutdown_grace_s: float,
        label: str = "",
    ) -> None:
        self.launch = launch
        self.classify = classify
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        self.label = label or launch.engine
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.log_path = log_dir / f"{launch.engine}-{stamp}-{launch.port}.log"
        # the engine's own temp directory (vLLM leaves sockets and vllm_dist_* files), removed after
        # it; short, because unix socket paths inside it must stay under 108 characters
        self.temp_dir = Path(tempfile.mkdtemp(prefix=f"gw-{launch.engine}-"))
        env = {**launch.env, "TMPDIR": str(self.temp_dir)}
        self.child = ChildProcess(launch.argv, self.log_path, env=env, inherit=launch.inherit, on_line=self._on_line)
        self.state = RunState.STARTING
        self.failures: list[Failure] = []
        self.memory: dict[str, dict[str, int]] = {}  # device → term → bytes, as the engine logged it
        self.timings: dict[str, list[float]] = {}  # "prompt" | "decode" → [tokens, seconds], the engine's own
        self.reason: str | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.ended_at: float | None = None
        self._settled = asyncio.Event()  # READY, or the start failed
        self._specific_failure = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._exited: asyncio.Task[int] | None = None

    # -- public surface -------------------------------------------------------------------------
    async def start(self) -> None:
        log.info("starting %s: %s", self.label, self.launch.summary)
        log.info("engine log: %s", self.log_path)
        self.started_at = time.monotonic()
        try:
            await self.child.start()
        except LogNotWritable as exc:
            self._fail(str(exc.strerror))
            self.ended_at = time.monotonic()
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self._settled.set()
            return
        except OSError as exc:  # the command itself cannot run (missing, not executable)
            self._fail(f"cannot run {self.launch.argv[0]}: {exc.strerror or exc}; check the engine command setting")
            self.ended_at = time.monotonic()
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self._settled.set()
            return
        self._exited = asyncio.create_task(self.child.wait(), name="engine exit")
        self._task = asyncio.create_task(self._run(), name="engine run")

    async def wait_settled(self) -> RunState:
        """Until the start either became READY or failed."""
        await self._settled.wait()
        return self.state

    async def wait_exit(self) -> int:
        """Until the process is gone (after READY: it died)."""
        assert self._exited is not None
        return await asyncio.shield(self._exited)

    async def stop(self) -> None:
        if self._task and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.state is RunState.READY:
            await self._read_speed()  # the last requests' timings, before the engine goes
        if self.state in (RunState.STARTING, RunState.READY):
            self.state = RunState.STOPPED
        code = await self.child.stop(self.shutdown_grace_s)
        self.ended_at = self.ended_at or time.monotonic()
        if code is not None:
            log.info("engine stopped (exit status %s)", code)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self._settled.set()

    @property
    def measured(self) -> dict[str, float]:
        """Tokens per second the engine itself timed, over every request so far; with speculative
        decoding, the share of drafted tokens it accepted."""
        timed = sorted((kind, total) for kind, total in self.timings.items() if kind != "draft")
        speeds = {f"{kind}_tokens_per_s": round(tokens / seconds, 2) for kind, (tokens, seconds) in timed if seconds}
        counts = {f"{kind}_tokens": int(tokens) for kind, (tokens, _) in timed}
        accepted, drafted = self.timings.get("draft", (0.0, 0.0))
        draft = {"draft_acceptance": round(accepted / drafted, 3), "drafted_tokens": int(drafted)} if drafted else {}
        return speeds | counts | draft

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "engine": self.launch.engine,
            "state": self.state.value,
            "summary": self.launch.summary,
            "pid": self.child.pid,
            "url": self.launch.base_url,
            "argv": redacted(self.launch.argv, self.launch.api_key),
            "served_name": self.launch.served_name,
            "context_length": self.launch.context_length,
            "log_path": str(self.log_path),
            "measured": self.measured,
            "temp_dir": str(self.temp_dir),
            "uptime_s": round(now - self.ready_at, 1) if self.ready_at and self.ready else None,
            "reason": self.reason,
            "failure": failure_fields(self.failure),
            "last_lines": list(self.child.tail)[-TAIL_IN_REPORTS:],
            "memory_mib": {
                device: {term: round(size / 2**20, 2) for term, size in terms.items()}
                for device, terms in self.memory.items()
            },
        }

    def report(self) -> str:
        """A multi-line account of a failure: reason, the engine's line, the fix, its last lines."""
        return failure_report(self, f"last lines of {self.log_path}:", self.child.tail)

    # -- the owner task -------------------------------------------------------------------------
    def _on_line(self, line: str) -> None:
        if self.launch.memory_line and (reported := self.launch.memory_line(line)):
            device, term, size = reported
            terms = self.memory.setdefault(device, {})
            terms[term] = terms.get(term, 0) + size
        if self.launch.speed_line and (timed := self.launch.speed_line(line)):
            kind, tokens, seconds = timed
            total = self.timings.setdefault(kind, [0.0, 0.0])
            total[0] += tokens
            total[1] += seconds
        if failure := self.classify(line):
            self.failures.append(failure)
            if failure.kind is not FailureKind.ENGINE_FAILED:
                self._specific_failure.set()

    async def _run(self) -> None:
        assert self._exited is not None
        try:
            ready = await self._wait_ready(self._exited)
        except Exception as exc:  # unguarded, the start never settled and the supervisor waited on it for ever
            log.exception("%s: waiting for the engine failed", self.label)
            ready = self._fail(f"waiting for the engine failed ({type(exc).__name__}); see the gateway log")
        if ready:
            self.state = RunState.READY
            self.ready_at = time.monotonic()
            log.info(
                "%s ready after %.1f s at %s", self.label, self.ready_at - (self.started_at or 0), self.launch.base_url
            )
            self._settled.set()
            following = asyncio.create_task(self._follow_speed()) if self.launch.speed_metrics else None
            try:
                code = await self._exited
            finally:
                if following:
                    following.cancel()
            self.ended_at = time.monotonic()
            self.state = RunState.EXITED
            self.reason = f"engine exited with status {code} while serving"
            await self.child.stop(self.shutdown_grace_s)  # helpers it left in its group, then reap
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            log.error("%s", self.report())
        else:
            await self.child.stop(self.shutdown_grace_s)
            self.ended_at = time.monotonic()
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self._settled.set()

    async def _follow_speed(self) -> None:
        """Keep ``timings`` at the engine's own totals where it gives them on a metrics page (vLLM's
        /metrics) rather than in its log. A read that raises is logged (its traceback once in a row)
        and the poll goes on."""
        failing = False
        while True:
            await asyncio.sleep(SPEED_POLL_S)
            try:
                await self._read_speed()
                failing = False
            except Exception as exc:  # the figures are a nicety: never a reason to stop following
                log.warning("reading the engine's speed failed (%s: %s)", type(exc).__name__, exc, exc_info=not failing)
                failing = True

    async def _read_speed(self) -> None:
        reader = self.launch.speed_metrics
        if reader is None:
            return
        url = self.launch.base_url + self.launch.metrics_path
        with contextlib.suppress(httpx.HTTPError):
            async with async_http_client(timeout=httpx.Timeout(2.0)) as client:
                answer = await client.get(url, headers=bearer_header(self.launch.api_key))
            if answer.status_code == 200:
                totals = reader(answer.text)
                self.timings = {kind: [tokens, seconds] for kind, (tokens, seconds) in totals.items()}

    async def _wait_ready(self, exited: asyncio.Task[int]) -> bool:
        """Poll health until 200, racing the exit, failure lines and the deadline."""
        deadline = time.monotonic() + self.startup_timeout_s
        next_progress = time.monotonic() + PROGRESS_EVERY_S
        generic_deadline: float | None = None
        url = self.launch.base_url + self.launch.health_path
        headers = bearer_header(self.launch.api_key)
        specific = asyncio.create_task(self._specific_failure.wait())
        try:
            async with async_http_client(timeout=httpx.Timeout(5.0)) as client:
                while True:
                    if specific.done():
                        return self._fail("engine failed while starting")
                    if exited.done():
                        await asyncio.sleep(0)  # let the last output lines be classified
                        return self._fail(f"engine exited with status {exited.result()} while starting")
                    now = time.monotonic()
                    if self.failures and generic_deadline is None:
                        generic_deadline = now + GENERIC_FAILURE_GRACE_S
                    if generic_deadline is not None and now >= generic_deadline:
                        return self._fail("engine failed while starting")
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get(url, headers=headers)).status_code == 200:
                            return True
                    now = time.monotonic()
                    if now >= deadline:
                        return self._fail(f"engine not ready after {self.startup_timeout_s:.0f} s (startup_timeout_s)")
                    if now >= next_progress:
                        next_progress = now + PROGRESS_EVERY_S
                        last = self.child.tail[-1] if self.child.tail else "(no output yet)"
                        log.info(
                            "loading %s: %.0f s so far; %s", self.label, now - (self.started_at or now), last[:200]
                        )
                    await asyncio.wait({exited, specific}, timeout=POLL_INTERVAL_S)
        finally:
            specific.cancel()

    def _fail(self, reason: str) -> bool:
        self.state = RunState.FAILED
        self.reason = reason
        return False


def redacted(argv: list[str], secret: str) -> list[str]:
    """An engine's argv as /status shows it: its API key never."""
    return ["***" if part == secret else part for part in argv]


def failure_fields(failure: Failure | None) -> dict[str, Any] | None:
    """A run's most telling failure as /status shows it."""
    if failure is None:
        return None
    return {"kind": failure.kind.name.lower(), "line": failure.line, "fix": failure.fix, "numbers": failure.numbers}


def failure_report(run: Run, heading: str, tail: Iterable[str]) -> str:
    """A multi-line account of a run's failure: its reason, the engine's line, the fix, then ``heading`` over
    the engine's last lines."""
    lines = [run.reason or f"engine {run.state.value}"]
    if failure := run.failure:
        lines.append(f"engine failure: {failure.kind.value}: {failure.line}")
        lines.append(f"fix: {failure.fix}")
    lines.append(heading)
    lines += [f"  | {line}" for line in list(tail)[-TAIL_IN_REPORTS:]]
    return "\n".join(lines)
