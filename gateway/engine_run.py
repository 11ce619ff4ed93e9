"""Starts one backend, proves it answers, watches it, stops it. One task owns the state.

States: STARTING → READY → FAILED (the backend exited or never became ready) | STOPPED (we stopped
it). A failure while starting is reported with the engine's own failure line and the fix; a death
after READY is logged with the backend's last lines and turns readiness off at once (restarting is
not this module's job yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from backends.base import Failure, Launch
from gateway.process import ChildProcess

log = logging.getLogger("gateway.supervisor")

POLL_INTERVAL_S = 0.5
PROGRESS_EVERY_S = 10.0
TAIL_IN_REPORTS = 15


class BackendState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class Supervisor:
    """Lifecycle of the backend described by ``launch``."""

    def __init__(
        self,
        launch: Launch,
        *,
        log_dir: Path,
        classify: Callable[[str], Failure | None],
        startup_timeout_s: float,
        shutdown_grace_s: float,
    ) -> None:
        self.launch = launch
        self.classify = classify
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.log_path = log_dir / f"{launch.engine}-{stamp}-{launch.port}.log"
        self.child = ChildProcess(launch.argv, self.log_path, env=launch.env, on_line=self._on_line)
        self.state = BackendState.STARTING
        self.failure: Failure | None = None  # first failure line the engine printed
        self.reason: str | None = None  # why the state is FAILED, for humans
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self._settled = asyncio.Event()  # set once READY or FAILED is reached the first time
        self._failure_seen = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- public surface -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state is BackendState.READY

    @property
    def ever_ready(self) -> bool:
        return self.ready_at is not None

    async def start(self) -> None:
        log.info("starting %s", self.launch.summary)
        log.info("backend log: %s", self.log_path)
        self.started_at = time.monotonic()
        await self.child.start()
        self._task = asyncio.create_task(self._run(), name="supervisor")

    async def wait_settled(self) -> BackendState:
        """Wait until the first start either became READY or FAILED."""
        await self._settled.wait()
        return self.state

    async def stop(self) -> None:
        if self._task and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.state in (BackendState.STARTING, BackendState.READY):
            self.state = BackendState.STOPPED
        code = await self.child.stop(self.shutdown_grace_s)
        if code is not None:
            log.info("backend stopped (exit status %s)", code)
        self._settled.set()

    def snapshot(self) -> dict[str, Any]:
        """What /status shows about the backend."""
        now = time.monotonic()
        return {
            "engine": self.launch.engine,
            "state": self.state.value,
            "summary": self.launch.summary,
            "pid": self.child.pid,
            "url": self.launch.base_url,
            "argv": _redacted(self.launch.argv, self.launch.api_key),
            "served_name": self.launch.served_name,
            "context_length": self.launch.context_length,
            "log_path": str(self.log_path),
            "uptime_s": round(now - self.ready_at, 1) if self.ready_at and self.ready else None,
            "reason": self.reason,
            "failure": (
                {"kind": self.failure.kind.name.lower(), "line": self.failure.line, "fix": self.failure.fix}
                if self.failure
                else None
            ),
            "last_lines": list(self.child.tail)[-TAIL_IN_REPORTS:],
        }

    def report(self) -> str:
        """A multi-line account of a failure: reason, fix, the backend's last lines."""
        lines = [self.reason or f"backend {self.state.value}"]
        if self.failure:
            lines.append(f"engine failure: {self.failure.kind.value}: {self.failure.line}")
            lines.append(f"fix: {self.failure.fix}")
        lines.append(f"last lines of {self.log_path}:")
        lines += [f"  | {line}" for line in list(self.child.tail)[-TAIL_IN_REPORTS:]]
        return "\n".join(lines)

    # -- the owner task -------------------------------------------------------------------------
    def _on_line(self, line: str) -> None:
        if self.failure is None and (failure := self.classify(line)):
            self.failure = failure
            self._failure_seen.set()

    async def _run(self) -> None:
        exited = asyncio.create_task(self.child.wait(), name="backend exit")
        try:
            if await self._wait_ready(exited):
                self.state = BackendState.READY
                self.ready_at = time.monotonic()
                log.info(
                    "backend ready after %.1f s at %s", self.ready_at - (self.started_at or 0), self.launch.base_url
                )
                self._settled.set()
                code = await exited
                self._fail(f"backend exited with status {code} while serving")
                log.error("%s", self.report())
            else:  # the caller reports the failure in full; the log gets one line
                await self.child.stop(self.shutdown_grace_s)
                log.error("%s (see %s)", self.reason, self.log_path)
        finally:
            self._settled.set()
            if not exited.done():
                exited.cancel()

    async def _wait_ready(self, exited: asyncio.Task[int]) -> bool:
        """Poll the health path until it answers 200, racing the exit, a failure line and the deadline."""
        deadline = time.monotonic() + self.startup_timeout_s
        next_progress = time.monotonic() + PROGRESS_EVERY_S
        url = self.launch.base_url + self.launch.health_path
        headers = {"Authorization": f"Bearer {self.launch.api_key}"}
        failure_seen = asyncio.create_task(self._failure_seen.wait())
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False) as client:
                while True:
                    if exited.done():
                        self._fail(f"backend exited with status {exited.result()} while starting")
                        return False
                    if failure_seen.done():
                        self._fail("backend failed while starting")
                        return False
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get(url, headers=headers)).status_code == 200:
                            return True
                    now = time.monotonic()
                    if now >= deadline:
                        self._fail(f"backend not ready after {self.startup_timeout_s:.0f} s (startup_timeout_s)")
                        return False
                    if now >= next_progress:
                        next_progress = now + PROGRESS_EVERY_S
                        last = self.child.tail[-1] if self.child.tail else "(no output yet)"
                        log.info(
                            "loading %s: %.0f s so far; %s", self.launch.engine, now - (self.started_at or now), last
                        )
                    await asyncio.wait({exited, failure_seen}, timeout=POLL_INTERVAL_S)
        finally:
            failure_seen.cancel()

    def _fail(self, reason: str) -> None:
        self.state = BackendState.FAILED
        self.reason = reason
        self._settled.set()


def _redacted(argv: list[str], secret: str) -> list[str]:
    return ["***" if part == secret else part for part in argv]
