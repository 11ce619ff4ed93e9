"""Whether a serving engine still works: progress while requests are in flight, a canary while idle.

An engine can hang with its process alive and its health check at 200: vLLM's engine core stuck in a
collective after a pipeline stage's node died (its head's worker monitor watches only its own local
workers), or stuck on one node (vllm#39863); a stopped process (SIGSTOP) accepts connections in the
kernel's backlog and never answers. The exit watcher sees none of this; every request would wait out
its own timeout, for ever, until a person restarts the engine.

:class:`ProgressWatch` decides from two kinds of evidence:

- while the gateway has requests in flight to the engine: progress, that is chunks relayed to clients
  (the gateway's own count) or a change in the engine's own account of its work where it gives one
  (``Launch.progress_path``: llama-server's ``/slots``, vLLM's ``/metrics``, read by the engine's
  ``progress`` function), which also moves during a long prefill, batch by batch. No progress for
  ``stall_s`` is a hang, unless the engine says, first-hand, that it has nothing to work on while every
  request in flight has had its answer begin (what is in flight then waits on a slow client or the
  network). A request whose answer has not begun while the engine says it works on nothing was taken
  and never started: that is no excuse, and after ``stall_s`` of it the engine is hung (before, an
  engine that took a request and never answered while ``/slots`` said every slot was idle was never
  found hung: the client waited out the 600 s first-byte timeout). An engine whose progress cannot be
  read (it reports none, or its page answers with nothing the reader can use: llama-server started
  with ``--no-slots``) shows no progress during a prefill, so for it the limit is raised to cover the
  plan's longest prefill (:class:`LongestPrefill`), and the log says so once (before, a working 10 s
  prefill under a 4 s limit was killed without a word);
- while idle: a one-token canary completion every ``canary_s`` that must be answered within
  ``stall_s``. An error answer is an answer (the engine's loop runs); only silence is a hang.

It never decides on a single slow answer: a probe is waited for as long as the stall limit leaves,
and only the time since the last progress counts. The clock and the sleep are injected, so each
case has a fast test with a stand-in probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

import httpx

from gateway.backends.base import Launch, Progress
from gateway.core.auth import bearer_header
from gateway.core.tls import async_http_client

log = logging.getLogger("gateway.liveness")

T = TypeVar("T")


@dataclass(frozen=True)
class Activity:
    """The gateway's side of the engine's work: requests sent to it and not yet over, and the chunks
    of answers relayed so far (a count that only grows)."""

    in_flight: int
    chunks: int
    waiting: int = 0  # of those in flight, the ones whose answer has not begun (no status line yet)


class Probe(Protocol):
    """How the watch asks one engine start (:class:`HttpProbe` is the real one)."""

    @property
    def reports_progress(self) -> bool: ...  # the engine gives an account of its work
    # that account now; None: no answer (refused, or none in time); Unreadable: an answer with nothing usable
    async def progress(self) -> Progress | Unreadable | None: ...
    async def canary(self) -> bool: ...  # a one-token completion: True when any answer came
    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Unreadable:
    """The engine answered its progress page, with nothing the reader can use (llama-server started with
    ``--no-slots`` answers 501): its loop may well run, but a prefill's progress cannot be seen."""

    why: str


UNKNOWN_SPEED_TOKENS_PER_S = 10.0  # a prefill's pace where the plan has no speed estimate
PREFILL_MARGIN = 2.0  # the machine may be busier than planned, a long context's attention slower


@dataclass(frozen=True)
class LongestPrefill:
    """How long the plan's longest prompt (its whole context) may take to prefill, bounded from above:
    a prefilled token costs at most what a decoded one does (the same weights are read, once per batch
    rather than once per token), so the plan's decode estimate (gateway/backends/*/speed.py) at half speed
    (``PREFILL_MARGIN``) bounds the pace; without an estimate, ``UNKNOWN_SPEED_TOKENS_PER_S``."""

    tokens: int
    tokens_per_s: float

    @classmethod
    def of(cls, context_length: int, decode_tokens_per_s: float) -> LongestPrefill:
        pace = decode_tokens_per_s / PREFILL_MARGIN if decode_tokens_per_s > 0 else UNKNOWN_SPEED_TOKENS_PER_S
        return cls(context_length, pace)

    @property
    def seconds(self) -> float:
        return self.tokens / self.tokens_per_s if self.tokens_per_s > 0 else 0.0


@dataclass(frozen=True)
class Limits:
    """The watch's settings (``stall_timeout_s``, ``canary_interval_s``); ``canary_s`` 0: no canary."""

    stall_s: float = 300.0
    canary_s: float = 300.0

    @property
    def poll_s(self) -> float:
        """How often progress is looked at while requests are in flight."""
        return max(0.05, min(5.0, self.stall_s / 10))


class ProgressWatch:
    """Watches one engine start until it hangs; :meth:`watch` returns why, in words."""

    def __init__(
        self,
        probe: Probe,
        activity: Callable[[], Activity],
        limits: Limits,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        prefill: LongestPrefill | None = None,
        passage: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    ) -> None:
        """``prefill``: the plan's longest prefill, the least a request in flight is given where the
        engine's progress cannot be read. ``passage``: what the canary is sent within, on the gateway's
        side (the engine's dispatch gate: not while a long prefill takes its place there, and counted)."""
        self.probe = probe
        self.activity = activity
        self.limits = limits
        self.clock = clock
        self.sleep = sleep
        self.prefill = prefill or LongestPrefill(0, 0.0)
        self.passage = passage or contextlib.nullcontext
        self.blind: str | None = None  # why the engine's progress cannot be read, once it is known

    @property
    def stall_limit_s(self) -> float:
        """How long a request in flight may go without progress now: the stall limit, or, where progress
        cannot be read, at least the plan's longest prefill."""
        return max(self.limits.stall_s, self.prefill.seconds) if self.blind else self.limits.stall_s

    def _cannot_read(self, why: str) -> None:
        """Progress cannot be read: from now on the limit covers the longest prefill; said once."""
        if self.blind is not None:
            return
        self.blind = why
        prefill = self.prefill
        log.warning(
            "the engine's progress cannot be read (%s): a prefill shows none, so a request in flight counts as "
            "hung only after %.0f s without a relayed chunk (stall_timeout_s %g; the plan's longest prefill: %d "
            "tokens at %.3g tokens/s or more, %.0f s)",
            why, self.stall_limit_s, self.limits.stall_s, prefill.tokens, prefill.tokens_per_s, prefill.seconds,
        )  # fmt: skip

    async def watch(self) -> str:
        """Until the engine is hung (then: why). Cancelled when the engine exits or is stopped."""
        limits = self.limits
        now = self.clock()
        last_progress = last_canary = now
        seen = self.activity().chunks
        mark: Hashable | None = None
        said_idle = False  # the engine's last account said it works on nothing
        parts: dict[Hashable, tuple[Hashable, float]] = {}  # each busy part's mark and when it last moved
        if not self.probe.reports_progress:
            self._cannot_read("it reports none")
        try:
            while True:
                await self.sleep(limits.poll_s)
                now = self.clock()
                activity = self.activity()
                if activity.chunks != seen or not activity.in_flight:
                    seen, last_progress = activity.chunks, now  # relayed chunks, or nothing asked of it
                if not activity.in_flight:
                    if limits.canary_s and now - last_canary >= limits.canary_s:
                        if not await self._within(self._canary(), limits.stall_s):
                            return f"a one-token canary got no answer in {limits.stall_s:g} s (stall_timeout_s)"
                        last_canary = last_progress = self.clock()
                    continue
                if self.probe.reports_progress:
                    left = self.stall_limit_s - (now - last_progress)
                    found = await self._within(self.probe.progress(), max(left, limits.poll_s))
                    if isinstance(found, Unreadable):
                        self._cannot_read(found.why)
                    elif found is not None:
                        # nothing to work on excuses only answers that began (they wait on a client);
                        # one that has not begun was taken and never started
                        said_idle = found.busy is False
                        if found.mark != mark or (said_idle and not self.activity().waiting):
                            mark, last_progress = found.mark, self.clock()  # it worked, or has nothing to do
                        if stuck := self._stuck_part(parts, found.parts):
                            return stuck
                now = self.clock()
                activity = self.activity()
                if activity.chunks != seen or not activity.in_flight:
                    seen, last_progress = activity.chunks, now
                    continue
                if now - last_progress >= self.stall_limit_s:
                    return (
                        f"no progress for {now - last_progress:.0f} s with {activity.in_flight} request(s) in flight"
                        f"{self._unstarted(activity) if said_idle else ''} ({self._limit_named()})"
                    )
        finally:
            await self.probe.aclose()

    @property
    def part_limit_s(self) -> float:
        """How long one busy part may stand still while others move: the stall limit, and at least the plan's
        longest prefill (a slot's prompt waits while another slot's prompt fills every batch)."""
        return max(self.stall_limit_s, self.prefill.seconds)

    def _stuck_part(
        self, parts: dict[Hashable, tuple[Hashable, float]], found: tuple[tuple[Hashable, Hashable], ...]
    ) -> str:
        """Each busy part's mark and since when, updated from ``found``; why one is stuck, or ""."""
        now = self.clock()
        busy = dict(found)
        for name in [name for name in parts if name not in busy]:
            del parts[name]  # it finished, or went idle
        for name, mark in busy.items():
            if name not in parts or parts[name][0] != mark:
                parts[name] = (mark, now)
        for name, (_mark, since) in parts.items():
            if now - since >= self.part_limit_s:
                return (
                    f"{name} made no progress for {now - since:.0f} s while busy, whatever the rest did (limit "
                    f"{self.part_limit_s:.0f} s: stall_timeout_s, or the plan's longest prefill where longer)"
                )
        return ""

    async def _canary(self) -> bool:
        async with self.passage():
            return await self.probe.canary()

    @staticmethod
    def _unstarted(activity: Activity) -> str:
        return f", {activity.waiting} not begun while the engine said it worked on nothing" if activity.waiting else ""

    def _limit_named(self) -> str:
        if self.stall_limit_s > self.limits.stall_s:
            return f"the plan's longest prefill, {self.stall_limit_s:.0f} s: its progress cannot be read"
        return f"stall_timeout_s {self.limits.stall_s:g}"

    @staticmethod
    async def _within(answer: Coroutine[object, object, T], seconds: float) -> T | None:
        """``answer`` if it comes within ``seconds``, else None. Not ``asyncio.wait_for``: on Python 3.11
        it loses a cancellation that arrives as the answer completes (the watch would then outlive the
        engine it watches); ``asyncio.wait`` never does."""
        task = asyncio.ensure_future(answer)
        try:
            await asyncio.wait({task}, timeout=seconds)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return task.result() if not task.cancelled() else None


CANARY_PATH = "/v1/completions"  # both engines serve it; one token of a two-token prompt


async def send_canary(client: httpx.AsyncClient, launch: Launch) -> httpx.Response:
    """The one-token canary completion, with the launch's key: the idle watch's (:class:`HttpProbe`) and a
    group's readiness check (gateway.supervision.group) both send this one; each judges its answer."""
    body = {"model": launch.served_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    return await client.post(launch.base_url + CANARY_PATH, json=body, headers=bearer_header(launch.api_key))


class HttpProbe:
    """An engine start's progress page and canary over HTTP, with its key."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self._client = async_http_client(
            base_url=launch.base_url,
            headers=bearer_header(launch.api_key),
            timeout=httpx.Timeout(None, connect=5.0),  # the watch bounds each call by what the limit leaves
        )

    @property
    def reports_progress(self) -> bool:
        return self.launch.progress_path is not None and self.launch.progress is not None

    async def progress(self) -> Progress | Unreadable | None:
        if self.launch.progress_path is None or self.launch.progress is None:
            return None
        try:
            answer = await self._client.get(self.launch.progress_path)
        except httpx.HTTPError:
            return None  # no answer: the watch counts the time, as for any silence
        path = self.launch.progress_path
        if answer.status_code != 200:
            return Unreadable(f"GET {path} answered {answer.status_code}: {answer.text[:120]}")
        found = self.launch.progress(answer.text)
        return found if found is not None else Unreadable(f"GET {path} answered what the reader cannot use")

    async def canary(self) -> bool:
        try:
            answer = await send_canary(self._client, self.launch)
        except httpx.TransportError as exc:  # refused or reset: the exit watcher's business, not a hang
            log.warning("the idle engine's canary failed (%s)", type(exc).__name__)
            return True
        if answer.status_code != 200:
            log.warning("the idle engine answered its canary with %d: %s", answer.status_code, answer.text[:200])
        return True

    async def aclose(self) -> None:
        with contextlib.suppress(httpx.HTTPError, RuntimeError):
            await self._client.aclose()


@dataclass(frozen=True)
class Liveness:
    """What the supervisor needs to watch its serving engines: the limits, the gateway's activity
    towards the engine, what to do with the requests in flight once it hangs (end them, each with an
    error in its own API's shape), and how to probe an engine start."""

    limits: Limits
    activity: Callable[[], Activity]
    end_requests: Callable[[str], Awaitable[None]]
    probe: Callable[[Launch], Probe] = HttpProbe
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    passage: Callable[[], AbstractAsyncContextManager[None]] | None = None  # the canary's (ProgressWatch)

    def watch(self, launch: Launch, prefill: LongestPrefill | None = None) -> ProgressWatch:
        """A watch over one engine start; ``prefill``: its plan's longest prefill (see :class:`ProgressWatch`)."""
        return ProgressWatch(
            self.probe(launch),
            self.activity,
            self.limits,
            clock=self.clock,
            sleep=self.sleep,
            prefill=prefill,
            passage=self.passage,
        )
