"""One start of one replica on another node: its whole engine server, run by that node's worker.

The supervisor sees a :class:`Run` like a local engine's (one fate per replica: its own restarts, step-down
and liveness). What differs is where the process is: :class:`RemoteRun` asks the node's worker
(:class:`ReplicaControl`, gateway/nodes/replica_client.py) to start the engine with the launch's arguments
and environment (its API key among them), then renews the worker's lease every ``renew_s``. Each renewal
answers the server's state and the log lines written since the last one: they go to a log file here and
through the option's ``classify``, so that a failure line steps the replica down as a local engine's does.
Ready once the engine's health answers at the node's address; gone when the worker says it exited, or
after ``misses`` renewals in a row that got no answer (the node is lost: :data:`NODE_LOST`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from gateway.backends import registry
from gateway.backends.base import Failure, FailureKind, Installation, Launch
from gateway.core.auth import bearer_header
from gateway.core.errors import GatewayError
from gateway.core.tls import async_http_client
from gateway.supervision.engine_run import (
    GENERIC_FAILURE_GRACE_S,
    TAIL_IN_REPORTS,
    RunFigures,
    RunState,
    failure_fields,
    failure_report,
    redacted,
)

log = logging.getLogger("gateway.engine")

LEASE_S = 20.0  # the worker stops the server after this long without a renewal (the head is gone)
RENEW_S = 1.0  # also how soon its log lines reach the head
MISSES = 3  # renewals in a row without an answer before the node counts as lost
HEALTH_POLL_S = 0.5
NODE_LOST = -3  # the "exit status" of a replica whose node stopped answering
NODE_POLL_S = 2.0  # a start whose node does not answer asks it again this often (until node_wait_s)


class ServerState(enum.Enum):
    RUNNING = "running"
    EXITED = "exited"
    NONE = "none"  # the worker runs none of that name (it restarted)


@dataclass(frozen=True)
class Lease:
    """A worker's answer to a renewal: the server's state and its log lines since the last one."""

    state: ServerState
    lines: tuple[str, ...] = ()
    next: int = 0  # the number of the line to ask from next time
    code: int | None = None  # its exit status, once exited
    reason: str = ""


@dataclass(frozen=True)
class Started:
    """Where the worker's server listens."""

    address: str
    port: int
    pid: int | None = None


class ReplicaRefused(GatewayError):
    """The worker answered and will not run the server (another engine version, none installed, bad request)."""


class ReplicaControl(Protocol):
    """The servers on one node (``gateway.nodes.replica_client.WorkerReplicas``)."""

    async def start(
        self, replica: str, engine: str, version: str, args: tuple[str, ...], env: Mapping[str, str], lease_s: float
    ) -> Started:
        """Start the server; raises ReplicaRefused with the worker's words, GatewayError when unreachable."""
        ...

    async def renew(self, replica: str, since: int) -> Lease:
        """Renew its lease; raises GatewayError when the worker does not answer."""
        ...

    async def stop(self, replica: str) -> None:
        """Stop it (a worker that does not answer is left to its lease)."""
        ...


class RemoteRun(RunFigures):
    """The replica's server on ``node``, as one :class:`~gateway.supervision.engine_run.Run`."""

    def __init__(
        self,
        launch: Launch,
        *,
        control: ReplicaControl,
        node: str,
        replica: str,
        installations: Mapping[str, Installation],
        log_dir: Path,
        classify: Callable[[str], Failure | None],
        startup_timeout_s: float,
        shutdown_grace_s: float = 0.0,
        label: str = "",
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
        misses: int = MISSES,
        health: Callable[[Launch], Any] | None = None,
        node_wait_s: float | None = None,
    ) -> None:
        """``node_wait_s``: how long a start waits for a node whose worker does not answer (its start is part of
        the replica's start; default ``startup_timeout_s``), so that a node that comes back is served again
        within :data:`NODE_POLL_S`, not at the restart budget's growing backoff."""
        self._launch = launch
        self.control = control
        self.node = node
        self.replica = replica
        self.installations = installations
        self.classify = classify
        self.startup_timeout_s = startup_timeout_s
        self.label = label or launch.engine
        self.lease_s, self.renew_s, self.misses = lease_s, renew_s, misses
        self.health = health or _health
        self.node_wait_s = startup_timeout_s if node_wait_s is None else node_wait_s
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.log_path = log_dir / f"{launch.engine}-{stamp}-{node}.log"
        self.state = RunState.STARTING
        self.failures: list[Failure] = []
        self.reason: str | None = None
        self.tail: deque[str] = deque(maxlen=200)
        self.started: Started | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.exit_code: int | None = None
        self._next_line = 0
        self._specific = asyncio.Event()
        self._watch: asyncio.Task[int] | None = None

    # -- what the supervisor reads --------------------------------------------------------------
    @property
    def launch(self) -> Launch:
        return self._launch

    def snapshot(self) -> dict[str, Any]:
        return {
            "engine": self.launch.engine,
            "state": self.state.value,
            "summary": self.launch.summary,
            "node": self.node,
            "pid": self.started.pid if self.started else None,
            "url": self.launch.base_url if self.started else None,
            "argv": redacted(self.launch.argv, self.launch.api_key),
            "served_name": self.launch.served_name,
            "context_length": self.launch.context_length,
            "log_path": str(self.log_path),
            "measured": {},
            "reason": self.reason,
            "failure": failure_fields(self.failure),
            "last_lines": list(self.tail)[-TAIL_IN_REPORTS:],
        }

    def report(self) -> str:
        return failure_report(self, f"last lines from {self.node} (also in {self.log_path}):", self.tail)

    # -- its life --------------------------------------------------------------------------------
    async def start(self) -> None:
        launch = self._launch
        installation = self.installations.get(launch.engine)
        host = registry.SERVER_HOSTS.get(launch.engine)
        self.started_at = time.monotonic()
        with contextlib.suppress(OSError):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s on node %s: %s", self.label, self.node, launch.summary)
        if installation is None or installation.command is None or host is None:
            self._fail(f"{launch.engine} cannot run as a replica on another node", FailureKind.ENGINE_FAILED)
            return
        args = host.args(launch.argv, installation.command)
        waited_until = time.monotonic() + self.node_wait_s
        while self.started is None:
            try:
                self.started = await self.control.start(
                    self.replica, launch.engine, installation.version, args, launch.env, self.lease_s
                )
            except ReplicaRefused as exc:
                self._fail(str(exc), FailureKind.ENGINE_FAILED, "install the head's engine version on the node")
                return
            except GatewayError as exc:  # the node is down: its start waits for it (the others serve meanwhile)
                if time.monotonic() + NODE_POLL_S > waited_until:
                    self._fail(str(exc), FailureKind.DEVICE_UNREACHABLE, "check that the node's worker runs")
                    return
                if self.reason is None:
                    self.reason = f"waiting for node {self.node}: {exc}"
                    log.warning("%s; asking again every %g s", self.reason, NODE_POLL_S)
                await asyncio.sleep(NODE_POLL_S)
        self.reason = None
        base = f"http://{_for_url(self.started.address)}:{self.started.port}"
        self._launch = replace(launch, port=self.started.port, base=base)
        self._watch = asyncio.create_task(self._follow(), name=f"replica {self.replica} on {self.node}")

    async def wait_settled(self) -> RunState:
        """Until its health answers at the node's address, or it failed (a failure line, its exit, the
        node lost, the startup timeout)."""
        if self.state is not RunState.STARTING or self._watch is None:
            return self.state
        deadline = time.monotonic() + self.startup_timeout_s
        generic_deadline: float | None = None
        while True:
            if self._specific.is_set():
                return await self._failed_start("engine failed while starting")
            if self._watch.done():
                return await self._failed_start(self._gone_why(self._watch.result()) + " while starting")
            now = time.monotonic()
            if self.failures and generic_deadline is None:
                generic_deadline = now + GENERIC_FAILURE_GRACE_S
            if generic_deadline is not None and now >= generic_deadline:
                return await self._failed_start("engine failed while starting")
            if await self.health(self._launch):
                self.state = RunState.READY
                log.info(
                    "%s ready on %s after %.1f s at %s", self.label, self.node, self.elapsed_s, self.launch.base_url
                )
                return self.state
            if now >= deadline:
                return await self._failed_start(f"engine not ready after {self.startup_timeout_s:.0f} s")
            await asyncio.wait({self._watch}, timeout=HEALTH_POLL_S)

    async def wait_exit(self) -> int:
        """Until the server is gone: its exit status, or :data:`NODE_LOST`."""
        assert self._watch is not None
        code = await asyncio.shield(self._watch)
        if self.state is RunState.READY:
            self.state = RunState.EXITED
            self.reason = self._gone_why(code) + " while serving"
            self.ended_at = time.monotonic()
            if code == NODE_LOST:
                self.failures.append(
                    Failure(FailureKind.DEVICE_UNREACHABLE, self.reason, "the replica is started again once it answers")
                )
            log.error("%s", self.report())
        return code

    async def stop(self) -> None:
        if self.state in (RunState.STARTING, RunState.READY):
            self.state = RunState.STOPPED
        watch, self._watch = self._watch, None
        if watch is not None and not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        if self.started is not None:
            with contextlib.suppress(GatewayError, httpx.HTTPError):
                await self.control.stop(self.replica)
        self.ended_at = self.ended_at or time.monotonic()

    # -- inside ---------------------------------------------------------------------------------
    async def _follow(self) -> int:
        """Renew the lease and read the lines until the server exited (its status) or the node is lost."""
        missed = 0
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                lease = await self.control.renew(self.replica, self._next_line)
            except GatewayError as exc:
                missed += 1
                log.warning("replica %s on %s: %s (%d in a row)", self.replica, self.node, exc, missed)
                if missed >= self.misses:
                    return NODE_LOST
                continue
            missed = 0
            self._take(lease)
            if lease.state is not ServerState.RUNNING:
                self.exit_code = lease.code
                self.reason = lease.reason or None
                return lease.code if lease.code is not None else -1

    def _take(self, lease: Lease) -> None:
        self._next_line = lease.next
        if not lease.lines:
            return
        with contextlib.suppress(OSError), self.log_path.open("a", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lease.lines)
        for line in lease.lines:
            self.tail.append(line)
            if failure := self.classify(line):
                self.failures.append(failure)
                if failure.kind is not FailureKind.ENGINE_FAILED:
                    self._specific.set()

    def _gone_why(self, code: int) -> str:
        if code == NODE_LOST:
            return f"node {self.node} stopped answering ({self.misses} lease renewals in a row)"
        return f"engine on {self.node} {self.reason or f'exited with status {code}'}"

    async def _failed_start(self, why: str) -> RunState:
        await self.stop()
        self.state = RunState.FAILED
        self.reason = why
        return self.state

    def _fail(self, reason: str, kind: FailureKind, fix: str = "") -> None:
        self.state = RunState.FAILED
        self.reason = reason
        self.failures.append(Failure(kind, reason, fix or "see the node's worker log"))
        self.ended_at = time.monotonic()
        log.error("%s on node %s: %s", self.label, self.node, reason)


def _for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


async def _health(launch: Launch) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        async with async_http_client(timeout=httpx.Timeout(5.0)) as client:
            answer = await client.get(launch.base_url + launch.health_path, headers=bearer_header(launch.api_key))
            return answer.status_code == 200
    return False


def remote_runs(
    control: ReplicaControl,
    node: str,
    replica: str,
    installations: Mapping[str, Installation],
    node_wait_s: float | None = None,
) -> Callable[..., RemoteRun]:
    """The supervisor's ``run_factory`` for a replica on ``node``: each attempt a :class:`RemoteRun`."""

    def factory(  # the shape of RunFactory
        launch: Launch,
        *,
        log_dir: Path,
        classify: Callable[[str], Failure | None],
        startup_timeout_s: float,
        shutdown_grace_s: float,
        label: str = "",
    ) -> RemoteRun:
        return RemoteRun(
            launch,
            control=control,
            node=node,
            replica=replica,
            installations=installations,
            log_dir=log_dir,
            classify=classify,
            startup_timeout_s=startup_timeout_s,
            shutdown_grace_s=shutdown_grace_s,
            label=label,
            node_wait_s=node_wait_s,
        )

    return factory
