"""The worker's side of an engine group: one rank that a head leads, started and stopped on its word.

The head (``gateway serve`` with a plan over nodes, gateway/nodes/group.py) asks, with the worker's key:
- ``POST /group/start`` ``{engine, version, rank, args, host_ip, lease_s}``
  (:class:`gateway.nodes.start_request.StartRequest`): run that engine's follower with this node's own
  installation of it (``FollowerHost.argv``: the worker's command, the head's arguments) and the
  environment the ranks need (``host_ip``: this node's address as the head reaches it; the interface
  that has it). Refused (409) naming both versions when this node's differs, or when this node does not
  run the engine; a start while a follower runs replaces it (the head restarted its group). Whatever
  refuses a start does so before the running follower is stopped: a refused start leaves it running.
- ``POST /group/lease``: the head is still there; without a renewal for ``lease_s`` the follower is
  stopped (a dead head leaves vLLM's followers retrying for ever, vllm#32136).
- ``POST /group/stop``: stop it now. ``GET /group``: its state (running, exited with its status, none).

One follower at a time: a node runs one rank of one group. It runs under the reaper, as the device
servers do, so it dies with the worker. The clock is injected for the lease's fast tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.backends.base import FollowerHost, Installation
from gateway.core.netif import interface_of
from gateway.core.process import ChildProcess
from gateway.nodes.lease_time import AwakeClock
from gateway.nodes.start_request import FollowerState, Refused, StartRequest

log = logging.getLogger("gateway.worker")

RANK_STOP_S = 10.0  # a rank of an engine group frees its GPU memory and its peers' connections
LEASE_CHECK_S = 1.0
TAIL_LINES = 8


@dataclass(frozen=True)
class Hosted:
    """An engine this worker runs ranks of: how (the engine's side) and its installation here."""

    host: FollowerHost
    installation: Installation


class Followers:
    """This node's follower (at most one) and its lease."""

    def __init__(
        self,
        hosted: Mapping[str, Hosted],
        log_dir: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        interface: Callable[[str], str | None] = interface_of,
    ) -> None:
        self.hosted = dict(hosted)
        self.log_dir = log_dir
        self.clock = clock
        self.interface = interface
        self.child: ChildProcess | None = None
        self.request: StartRequest | None = None
        self.exited: asyncio.Task[int] | None = None
        self.deadline = 0.0
        self.ended: str | None = None  # why the last follower is gone, for GET /group
        self.starts = 0
        self._lock = asyncio.Lock()

    def engines(self) -> dict[str, dict[str, str]]:
        """For /inventory: each engine this node runs ranks of, with its version."""
        return {
            name: {"version": hosted.installation.version}
            for name, hosted in self.hosted.items()
            if hosted.installation.command is not None
        }

    async def start(self, request: StartRequest) -> dict[str, Any]:
        async with self._lock:
            hosted = self.hosted.get(request.engine)
            if hosted is None or hosted.installation.command is None:
                why = hosted.installation.missing if hosted else f"no engine named {request.engine!r} runs ranks here"
                raise Refused(409, f"this node cannot run a {request.engine} rank: {why}")
            ours = hosted.installation.version
            if ours != request.version:
                title = hosted.host.title
                raise Refused(
                    409,
                    f"this node has {title} {ours}, the head {request.version}: install the same version on both "
                    f"(a group's ranks must run one release)",
                )
            interface = self.interface(request.host_ip)
            if interface is None:
                raise Refused(409, f"{request.host_ip} is not an address of this node: the head reached another")
            argv = hosted.host.argv(hosted.installation.command, request.args)
            env = hosted.host.env(request.host_ip, interface)
            path = self.log_dir / f"{request.engine}-rank{request.rank}-{self.starts + 1}.log"
            await self._stop("replaced by a new start from the head")
            self.starts += 1
            child = ChildProcess(argv, path, env=env, inherit=hosted.host.inherit)
            try:
                await child.start()
            except OSError as exc:  # the command, its log or its arguments refused by the system
                self.ended = f"the new start failed: {exc}"
                raise Refused(500, f"this node could not start the {hosted.host.title} rank: {exc}") from exc
            self.child, self.request, self.ended = child, request, None
            self.exited = asyncio.create_task(child.wait(), name=f"{request.engine} rank {request.rank}")
            self.deadline = self.clock() + request.lease_s
            log.info(
                "%s rank %d started for the head (pid %s, lease %.0f s, interface %s); log %s",
                hosted.host.title, request.rank, child.pid, request.lease_s, interface, path,
            )  # fmt: skip
            return self.state()

    def renew(self) -> dict[str, Any]:
        """The head is still there: the lease runs on from now (whatever the follower's state)."""
        if self.request is not None and self.running:
            self.deadline = self.clock() + self.request.lease_s
        return self.state()

    async def stop(self, why: str = "stopped by the head") -> dict[str, Any]:
        async with self._lock:
            await self._stop(why)
            return self.state()

    @property
    def running(self) -> bool:
        return self.exited is not None and not self.exited.done()

    def state(self) -> dict[str, Any]:
        """What the head reads: running, exited (with its status and last lines), or none."""
        if self.request is None or self.child is None:
            return {"state": FollowerState.NONE, "reason": self.ended}
        base = {"engine": self.request.engine, "rank": self.request.rank, "pid": self.child.pid}
        if self.running:
            left = round(max(0.0, self.deadline - self.clock()), 1)
            return base | {"state": FollowerState.RUNNING, "lease_left_s": left}
        code = self.exited.result() if self.exited is not None and not self.exited.cancelled() else None
        why = self.ended or f"exited with status {code}"
        return base | {"state": FollowerState.EXITED, "code": code, "reason": why, "last_lines": self._tail()}

    def _tail(self) -> list[str]:
        return list(self.child.tail)[-TAIL_LINES:] if self.child is not None else []

    async def _stop(self, why: str) -> None:
        if self.child is None or not self.running:
            return
        log.info("stopping %s rank %s: %s", self.request.engine if self.request else "?", self._rank(), why)
        self.ended = why
        await self.child.stop(RANK_STOP_S)
        if self.exited is not None:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await self.exited

    def _rank(self) -> str:
        return str(self.request.rank) if self.request else "?"

    async def keep_lease(self, every_s: float = LEASE_CHECK_S, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        """Stops the follower when its lease ran out (the head is gone; the time this worker did not run does
        not count: gateway.nodes.lease_time); logs when it exited by itself."""
        reported: asyncio.Task[int] | None = None
        awake = AwakeClock(self.clock)
        while True:
            await sleep(every_s)
            self.deadline += awake.away(every_s)  # no renewal could be heard meanwhile
            if self.running and self.clock() > self.deadline:
                await self.stop("the head renewed no lease: it is gone")
            elif self.exited is not None and self.exited.done() and reported is not self.exited:
                reported = self.exited
                if self.ended is None:
                    log.error(
                        "rank %s exited (%s): %s", self._rank(), self.state().get("code"), " | ".join(self._tail())
                    )

    async def close(self) -> None:
        await self.stop("the worker stops")


def hosted_engines(installations: Mapping[str, Installation], hosts: Mapping[str, FollowerHost]) -> dict[str, Hosted]:
    """Each engine that runs ranks, with its installation here (pure)."""
    return {name: Hosted(host, installations[name]) for name, host in hosts.items() if name in installations}


def describe(hosted: Mapping[str, Hosted]) -> Sequence[str]:
    """One line per engine for the worker's log: which version runs ranks here, or why none."""
    return [
        f"{h.host.title} ranks: {h.installation.version} ({' '.join(h.installation.command)})"
        if h.installation.command
        else f"{h.host.title} ranks: none ({h.installation.missing})"
        for h in hosted.values()
    ]
