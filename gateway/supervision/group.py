"""One engine over several nodes, supervised as one group: one fate for every rank.

An engine start whose launch has followers (vLLM across nodes: rank 0 here, the others on the workers)
runs as a :class:`GroupRun` around the local rank's run. The ranks on other nodes are started through
a :class:`GroupControl` (gateway/nodes/group.py asks each node's worker) right after rank 0, which
holds the group's rendezvous; each is kept on a lease the group renews every ``renew_s``, which is
also how it learns that a rank exited or that its worker stopped answering (``misses`` renewals in a
row). The group is ready only when rank 0's health answers *and* a one-token completion comes back
(vLLM's health stays 200 while a pipeline stage is missing: tests/data/vllm_cpu_multinode.txt).

One fate: rank 0's exit, another rank's exit, or its worker gone stops every rank on every node (the
supervisor's liveness watch stops a hung group the same way, through :meth:`GroupRun.stop`), and
:meth:`GroupRun.wait_exit` returns :data:`RANK_LOST` with the reason in words, so that the supervisor
re-plans over the nodes that answer. A worker that cannot be asked to stop is left to its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import httpx

from gateway.backends.base import Failure, FailureKind, Follower, Launch
from gateway.core.errors import GatewayError
from gateway.core.tls import async_http_client
from gateway.supervision.engine_run import Run, RunState
from gateway.supervision.liveness import send_canary

log = logging.getLogger("gateway.group")

LEASE_S = 20.0  # a worker stops its rank after this long without a renewal (the head is gone)
RENEW_S = 3.0
MISSES = 3  # renewals in a row a worker did not answer before its node counts as gone
CANARY_TIMEOUT_S = 180.0
RANK_LOST = -3  # the "exit status" of a group stopped because a rank on another node is gone


class RankState(enum.StrEnum):
    """One rank's state, as /status shows it (``group.ranks``)."""

    STARTING = "starting"
    NOT_STARTED = "not started"  # its worker refused it or could not be reached
    SERVING = "serving"
    STOPPED = "stopped"
    EXITED = "exited"
    NODE_GONE = "node gone"  # its worker missed its renewals


ALIVE = (RankState.STARTING, RankState.SERVING)  # a rank still to stop


class RankRefused(GatewayError):
    """A worker answered and will not run a rank (another engine version, none installed)."""


class GroupControl(Protocol):
    """The ranks on other nodes (``gateway.nodes.group.WorkerGroup``); coroutines, awaited on the loop."""

    async def start(self, follower: Follower, lease_s: float) -> None:
        """Start the rank on its node; raises GatewayError (a refusal names both versions)."""
        ...

    async def renew(self, node: str) -> str | None:
        """Renew the rank's lease: None while it runs, else why it is gone; raises GatewayError when
        the node's worker does not answer."""
        ...

    async def stop(self, node: str) -> None:
        """Stop the rank on its node (a worker that does not answer is left to its lease)."""
        ...


async def http_canary(launch: Launch, timeout_s: float = CANARY_TIMEOUT_S) -> str | None:
    """One token through the whole group: None when a completion came back, else why not."""
    try:
        async with async_http_client(timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
            answer = await send_canary(client, launch)
    except httpx.HTTPError as exc:
        return f"the one-token canary got no answer ({type(exc).__name__}) in {timeout_s:.0f} s"
    if answer.status_code != 200:
        return f"the one-token canary was answered {answer.status_code}: {answer.text[:200]}"
    return None


class GroupRun:
    """Rank 0's run (``inner``) and the ranks on other nodes, as one :class:`Run` for the supervisor."""

    def __init__(
        self,
        inner: Run,
        control: GroupControl,
        *,
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
        misses: int = MISSES,
        canary: Callable[[Launch], Awaitable[str | None]] = http_canary,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.inner = inner
        self.control = control
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.misses = misses
        self.canary = canary
        self.sleep = sleep
        self.followers = inner.launch.followers
        self.started: list[Follower] = []
        self.ranks: dict[int, RankState] = {0: RankState.STARTING}  # rank → its state, for /status
        self.exit_code: int | None = None  # rank 0's, once it exited
        self.events: list[dict[str, Any]] = []
        self._state: RunState | None = None  # None: rank 0's own state
        self._failure: Failure | None = None
        self._reason: str | None = None
        self._watch: asyncio.Task[str] | None = None

    # -- what the supervisor reads --------------------------------------------------------------
    @property
    def launch(self) -> Launch:
        return self.inner.launch

    @property
    def state(self) -> RunState:
        return self._state or self.inner.state

    @property
    def ready(self) -> bool:
        return self.state is RunState.READY

    @property
    def failure(self) -> Failure | None:
        return self._failure or self.inner.failure

    @property
    def reason(self) -> str | None:
        return self._reason or self.inner.reason

    @property
    def elapsed_s(self) -> float:
        return self.inner.elapsed_s

    @property
    def log_path(self) -> Path:
        return self.inner.log_path

    def snapshot(self) -> dict[str, Any]:
        data = self.inner.snapshot()
        data["state"] = self.state.value
        data["reason"] = self.reason
        data["group"] = {
            "ranks": [{"rank": 0, "node": "head (this machine)", "state": self._shown(0)}]
            + [{"rank": f.rank, "node": f.node, "state": self._shown(f.rank)} for f in self.followers],
            "events": self.events[-10:],
        }
        return data

    def report(self) -> str:
        lines = [self.inner.report()]
        if self._reason:
            lines.insert(0, self._reason)
        return "\n".join(lines)

    # -- the group's life -----------------------------------------------------------------------
    async def start(self) -> None:
        await self.inner.start()
        if self.inner.state is RunState.FAILED:  # rank 0 could not even run
            return
        self.ranks[0] = RankState.STARTING
        for follower in self.followers:
            try:
                await self.control.start(follower, self.lease_s)
            except GatewayError as exc:
                kind = FailureKind.ENGINE_FAILED if isinstance(exc, RankRefused) else FailureKind.DEVICE_UNREACHABLE
                fix = (
                    "install the head's engine version on every node"
                    if kind is FailureKind.ENGINE_FAILED
                    else ("check that the node's worker runs and answers")
                )
                self.ranks[follower.rank] = RankState.NOT_STARTED
                await self._end(RunState.FAILED, str(exc), Failure(kind, str(exc), fix))
                return
            self.started.append(follower)
            self.ranks[follower.rank] = RankState.STARTING
            log.info("rank %d started on %s", follower.rank, follower.node)
        self._event(f"started {len(self.followers) + 1} ranks")
        self._watch = asyncio.create_task(self._watch_ranks(), name="group ranks")

    async def wait_settled(self) -> RunState:
        """Until every rank serves (rank 0's health, then a one-token completion) or the group failed."""
        if self._state is not None:
            return self._state
        if self._watch is None:  # rank 0 failed before the followers were asked
            return await self.inner.wait_settled()
        settled = asyncio.ensure_future(self.inner.wait_settled())
        await asyncio.wait({settled, self._watch}, return_when=asyncio.FIRST_COMPLETED)
        if self._watch.done() and not settled.done():
            settled.cancel()
            why = self._watch.result()
            await self._end(RunState.FAILED, f"group failed while starting: {why}", self._lost(why))
            return RunState.FAILED
        if settled.result() is not RunState.READY:
            await self._end(RunState.FAILED, None, None)
            return RunState.FAILED
        canary = asyncio.ensure_future(self.canary(self.launch))
        await asyncio.wait({canary, self._watch}, return_when=asyncio.FIRST_COMPLETED)
        if not canary.done():
            canary.cancel()
            why = self._watch.result()
            await self._end(RunState.FAILED, f"group failed while starting: {why}", self._lost(why))
            return RunState.FAILED
        if (refused := canary.result()) is not None:
            failure = Failure(FailureKind.ENGINE_FAILED, refused, "the group's health answers but it serves nothing")
            await self._end(RunState.FAILED, f"group not serving: {refused}", failure)
            return RunState.FAILED
        for rank in self.ranks:
            self.ranks[rank] = RankState.SERVING
        self._event("ready: health answered and a one-token completion came back")
        return RunState.READY

    async def wait_exit(self) -> int:
        """Until one rank is gone: rank 0's exit status, or :data:`RANK_LOST` (every rank is stopped)."""
        exited = asyncio.ensure_future(self.inner.wait_exit())
        waits: set[asyncio.Future[Any]] = {exited}
        if self._watch is not None:
            waits.add(self._watch)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            code = exited.result()
            self.ranks[0], self.exit_code = RankState.EXITED, code
            await self._end(RunState.EXITED, f"rank 0 exited with status {code}: every rank stopped", None)
            return code
        exited.cancel()
        assert self._watch is not None
        why = self._watch.result()
        await self._end(RunState.EXITED, f"{why}: every rank stopped", self._lost(why))
        return RANK_LOST

    async def stop(self) -> None:
        if self._state is None or self._state is RunState.READY:
            self._state = RunState.STOPPED
        await self._stop_all()

    # -- inside ---------------------------------------------------------------------------------
    def _shown(self, rank: int) -> str:
        """The rank's state in /status's words: rank 0's exit with its status ("exited (1)"); "" before any."""
        state = self.ranks.get(rank)
        if state is RankState.EXITED and rank == 0 and self.exit_code is not None:
            return f"{state} ({self.exit_code})"
        return "" if state is None else state.value

    def _lost(self, why: str) -> Failure:
        return Failure(FailureKind.DEVICE_UNREACHABLE, why, "the group is planned again over the nodes that answer")

    def _event(self, what: str) -> None:
        self.events.append({"at": time.strftime("%H:%M:%S"), "what": what})

    async def _end(self, state: RunState, reason: str | None, failure: Failure | None) -> None:
        self._state = state
        self._reason = reason or self._reason
        self._failure = failure or self._failure
        if reason:
            self._event(reason)
            log.error("%s", reason)
        await self._stop_all()

    async def _stop_all(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        started, self.started = self.started, []
        if started:
            await asyncio.gather(*(self.control.stop(f.node) for f in started))
        for follower in started:
            if self.ranks.get(follower.rank) in ALIVE:
                self.ranks[follower.rank] = RankState.STOPPED
        await self.inner.stop()
        if self.ranks.get(0) in ALIVE:
            self.ranks[0] = RankState.STOPPED

    async def _watch_ranks(self) -> str:
        """Until a rank on another node is gone: it exited, or its worker missed ``misses`` renewals."""
        missed = {f.node: 0 for f in self.followers}
        while True:
            await self.sleep(self.renew_s)
            for follower in self.followers:
                try:
                    gone = await self.control.renew(follower.node)
                except GatewayError as exc:
                    missed[follower.node] += 1
                    log.warning(
                        "rank %d on %s: %s (%d in a row)", follower.rank, follower.node, exc, missed[follower.node]
                    )
                    if missed[follower.node] >= self.misses:
                        self.ranks[follower.rank] = RankState.NODE_GONE
                        return f"node {follower.node} (rank {follower.rank}) stopped answering"
                    continue
                missed[follower.node] = 0
                if gone is not None:
                    self.ranks[follower.rank] = RankState.EXITED
                    return gone
