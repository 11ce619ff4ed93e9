"""The worker's side of a replica on its node: a whole engine server that a head runs here and supervises.

The head (``gateway serve`` with a replica planned on this node, gateway/nodes/replica_client.py) asks,
with the worker's key:
- ``POST /replica/start`` ``{replica, engine, version, args, env, lease_s}``
  (:class:`gateway.nodes.start_request.ServerStart`): run that engine's server with this node's own
  installation of it, the head's arguments, bound to the worker's ``--host`` on a port free here (the
  answer says which), the head's variables that the engine reads (its API key among them). Refused (409)
  naming both versions when this node's differs, or when this node does not run the engine. A start of a
  replica that runs replaces it (the head restarted it); whatever refuses a start does so first.
- ``POST /replica/lease`` ``{replica, since}``: the head is still there; the answer is the server's state
  and its log lines from line ``since`` on (the head reads them as it reads a local engine's: its
  failure lines step the replica down). Without a renewal for ``lease_s`` the server is stopped.
- ``POST /replica/stop`` ``{replica}``; ``GET /replica``: every replica's state.

Each server runs under the reaper, as the device servers do, so it dies with the worker. The clock is
injected for the lease's fast tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.backends.base import Installation
from gateway.backends.server_host import ServerHost
from gateway.core.process import ChildProcess
from gateway.nodes.lease_time import AwakeClock
from gateway.nodes.start_request import MAX_REPLICAS_HERE, FollowerState, Refused, ServerStart

log = logging.getLogger("gateway.worker")

SERVER_STOP_S = 10.0  # an engine frees its memory and ends its requests
LEASE_CHECK_S = 1.0
LINES_KEPT = 400  # log lines a head that fell behind can still read
LINES_PER_ANSWER = 200  # lines one lease answer carries (the head asks again from where it stopped)
LINE_CHARS = 2000


@dataclass(frozen=True)
class Served:
    """An engine whose whole server this worker runs: how (the engine's side) and its installation here."""

    host: ServerHost
    installation: Installation


@dataclass
class _Lines:
    """A server's latest log lines, numbered from its start (what the head has read is its own count)."""

    kept: deque[str] = field(default_factory=lambda: deque(maxlen=LINES_KEPT))
    seen: int = 0  # lines written so far (the number of the next one)

    def add(self, line: str) -> None:
        self.kept.append(line[:LINE_CHARS])
        self.seen += 1

    def since(self, first: int) -> tuple[list[str], int, int]:
        """The lines from number ``first`` on (at most :data:`LINES_PER_ANSWER`), the number after the last
        one given, and how many of those asked for are no longer kept."""
        oldest = self.seen - len(self.kept)
        start = max(first, oldest)
        given = list(self.kept)[start - oldest :][:LINES_PER_ANSWER]
        return given, start + len(given), start - first


@dataclass
class _Running:
    request: ServerStart
    child: ChildProcess
    port: int
    temp_dir: Path
    deadline: float
    lines: _Lines
    exited: asyncio.Task[int] | None = None
    ended: str | None = None  # why it was stopped

    @property
    def running(self) -> bool:
        return self.exited is not None and not self.exited.done()


def free_port_on(host: str) -> int:
    """A port nothing listens on at ``host`` right now (the engine binds it a moment later)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class ReplicaServers:
    """The whole servers this node runs for a head, by the head's replica name, each on its lease."""

    def __init__(
        self,
        served: Mapping[str, Served],
        log_dir: Path,
        host: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        port: Callable[[str], int] = free_port_on,
    ) -> None:
        self.served = dict(served)
        self.log_dir = log_dir
        self.host = host
        self.clock = clock
        self.port = port
        self.replicas: dict[str, _Running] = {}
        self.starts = 0
        self._lock = asyncio.Lock()

    def engines(self) -> dict[str, dict[str, str]]:
        """For /inventory: each engine whose whole server runs here, with its version."""
        return {
            name: {"version": served.installation.version}
            for name, served in self.served.items()
            if served.installation.command is not None
        }

    async def start(self, request: ServerStart) -> dict[str, Any]:
        async with self._lock:
            served = self.served.get(request.engine)
            if served is None or served.installation.command is None:
                why = served.installation.missing if served else f"no engine named {request.engine!r} serves here"
                raise Refused(409, f"this node cannot run a {request.engine} server: {why}")
            ours = served.installation.version
            if ours != request.version:
                raise Refused(
                    409,
                    f"this node has {served.host.title} {ours}, the head {request.version}: install the same "
                    "version on both (a replica must answer as the head planned it)",
                )
            if request.replica not in self.replicas and len(self.live()) >= MAX_REPLICAS_HERE:
                raise Refused(409, f"this node runs {MAX_REPLICAS_HERE} replicas already")
            await self._stop(request.replica, "replaced by a new start from the head")
            for name in [n for n in self.replicas if n != request.replica and n not in self.live()]:
                if len(self.replicas) < MAX_REPLICAS_HERE:
                    break
                await self._stop(name, "")  # the oldest ended ones make room: their names are not kept for ever
                del self.replicas[name]
            port = self.port(self.host)
            argv = served.host.argv(served.installation.command, request.args, self.host, port)
            self.starts += 1
            path = self.log_dir / f"{request.engine}-replica{request.replica}-{self.starts}.log"
            temp_dir = Path(tempfile.mkdtemp(prefix=f"gw-{request.engine}-"))
            env = served.host.env(request.env) | {"TMPDIR": str(temp_dir)}
            lines = _Lines()
            child = ChildProcess(argv, path, env=env, inherit=served.host.inherit, on_line=lines.add)
            running = _Running(request, child, port, temp_dir, self.clock() + request.lease_s, lines)
            try:
                await child.start()
            except OSError as exc:  # the command, its log or its arguments refused by the system
                shutil.rmtree(temp_dir, ignore_errors=True)
                raise Refused(500, f"this node could not start {served.host.title}: {exc}") from exc
            running.exited = asyncio.create_task(running.child.wait(), name=f"replica {request.replica}")
            self.replicas[request.replica] = running
            log.info(
                "replica %s: %s started for the head on %s:%d (pid %s, lease %.0f s); log %s",
                request.replica, served.host.title, self.host, port, running.child.pid, request.lease_s, path,
            )  # fmt: skip
            return self.state(request.replica)

    def live(self) -> list[str]:
        return [name for name, running in self.replicas.items() if running.running]

    def renew(self, replica: str, since: int = 0) -> dict[str, Any]:
        """The head is still there: the lease runs on from now; its state and lines from ``since`` on."""
        running = self.replicas.get(replica)
        if running is not None and running.running:
            running.deadline = self.clock() + running.request.lease_s
        return self.state(replica, since)

    async def stop(self, replica: str, why: str = "stopped by the head") -> dict[str, Any]:
        async with self._lock:
            await self._stop(replica, why)
            return self.state(replica)

    def state(self, replica: str, since: int | None = None) -> dict[str, Any]:
        """What the head reads: running (its port), exited (its status, why), or none; with ``since``, the
        log lines from that one on (at most :data:`LINES_PER_ANSWER`; ``next`` is where to ask again)."""
        running = self.replicas.get(replica)
        if running is None:
            return {"replica": replica, "state": FollowerState.NONE, "reason": None}
        base: dict[str, Any] = {
            "replica": replica,
            "engine": running.request.engine,
            "pid": running.child.pid,
            "port": running.port,
            "address": self.host,
        }
        if since is not None:
            given, after, skipped = running.lines.since(since)
            base |= {"lines": given, "next": after, "skipped": skipped}
        if running.running:
            left = round(max(0.0, running.deadline - self.clock()), 1)
            return base | {"state": FollowerState.RUNNING, "lease_left_s": left}
        code = running.exited.result() if running.exited is not None and not running.exited.cancelled() else None
        why = running.ended or f"exited with status {code}"
        tail = list(running.lines.kept)[-8:]
        return base | {"state": FollowerState.EXITED, "code": code, "reason": why, "last_lines": tail}

    def all_states(self) -> dict[str, Any]:
        return {"replicas": [self.state(name) for name in self.replicas]}

    async def _stop(self, replica: str, why: str) -> None:
        running = self.replicas.get(replica)
        if running is None:
            return
        if running.running:
            log.info("stopping replica %s: %s", replica, why)
            running.ended = why
        await running.child.stop(SERVER_STOP_S)
        if running.exited is not None:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await running.exited
        shutil.rmtree(running.temp_dir, ignore_errors=True)

    async def keep_lease(self, every_s: float = LEASE_CHECK_S, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        """Stops each server whose lease ran out (its head is gone; the time this worker did not run does not
        count: gateway.nodes.lease_time); logs one that exited by itself."""
        reported: set[int] = set()
        awake = AwakeClock(self.clock)
        while True:
            await sleep(every_s)
            if away := awake.away(every_s):  # no renewal could be heard meanwhile
                for running in self.replicas.values():
                    running.deadline += away
            for name, running in list(self.replicas.items()):
                if running.running and self.clock() > running.deadline:
                    await self.stop(name, "the head renewed no lease: it is gone")
                elif not running.running and running.ended is None and id(running) not in reported:
                    reported.add(id(running))
                    shutil.rmtree(running.temp_dir, ignore_errors=True)
                    log.error("replica %s exited: %s", name, " | ".join(list(running.lines.kept)[-3:]))

    async def close(self) -> None:
        for name in list(self.replicas):
            await self.stop(name, "the worker stops")


def served_engines(installations: Mapping[str, Installation], hosts: Mapping[str, ServerHost]) -> dict[str, Served]:
    """Each engine whose whole server runs here, with its installation (pure)."""
    return {name: Served(host, installations[name]) for name, host in hosts.items() if name in installations}
