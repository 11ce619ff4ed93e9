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
  ``stall_s`` is a hang, unless the engine says, first-hand, that it has nothing to work on (what is
  in flight then waits on a slow client or the network). An engine that reports nothing shows no
  progress during a prefill, so for it the limit must cover the plan's longest prefill on this hardware;
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
from dataclasses import dataclass
from typing import Protocol, TypeVar

import httpx

from backends.base import Launch, Progress
from gateway.core.auth import bearer_header
from gateway.core.tls import client_tls

log = logging.getLogger("gateway.liveness")

T = TypeVar("T")


@dataclass(frozen=True)
class Activity:
    """The gateway's side of the engine's work: requests sent to it and not yet over, and the chunks
    of answers relayed so far (a count that only grows)."""

    in_flight: int
    chunks: int


class Probe(Protocol):
    """How the watch asks one engine start (:class:`HttpProbe` is the real one)."""

    @property
    def reports_progress(self) -> bool: ...  # the engine gives an account of its work
    async def progress(self) -> Progress | None: ...  # that account now (None: no usable answer)
    async def canary(self) -> bool: ...  # a one-token completion: True when any answer came
    async def aclose(self) -> None: ...


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
    ) -> None:
        self.probe = probe
        self.activity = activity
        self.limits = limits
        self.clock = clock
        self.sleep = sleep

    async def watch(self) -> str:
        """Until the engine is hung (then: why). Cancelled when the engine exits or is stopped."""
        limits = self.limits
        now = self.clock()
        last_progress = last_canary = now
        seen = self.activity().chunks
        mark: Hashable | None = None
        try:
            while True:
                await self.sleep(limits.poll_s)
                now = self.clock()
                activity = self.activity()
                if activity.chunks != seen or not activity.in_flight:
                    seen, last_progress = activity.chunks, now  # relayed chunks, or nothing asked of it
                if not activity.in_flight:
                    if limits.canary_s and now - last_canary >= limits.canary_s:
                        if not await self._within(self.probe.canary(), limits.stall_s):
                            return f"a one-token canary got no answer in {limits.stall_s:g} s (stall_timeout_s)"
                        last_canary = last_progress = self.clock()
                    continue
                if self.probe.reports_progress:
                    left = limits.stall_s - (now - last_progress)
                    found = await self._within(self.probe.progress(), max(left, limits.poll_s))
                    if found is not None and (found.mark != mark or found.busy is False):
                        mark, last_progress = found.mark, self.clock()  # it worked, or has nothing to work on
                now = self.clock()
                activity = self.activity()
                if activity.chunks != seen or not activity.in_flight:
                    seen, last_progress = activity.chunks, now
                    continue
                if now - last_progress >= limits.stall_s:
                    return (
                        f"no progress for {now - last_progress:.0f} s with {activity.in_flight} request(s) in flight "
                        f"(stall_timeout_s {limits.stall_s:g})"
                    )
        finally:
            await self.probe.aclose()

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


class HttpProbe:
    """An engine start's progress page and canary over HTTP, with its key."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self._client = httpx.AsyncClient(
            base_url=launch.base_url,
            headers=bearer_header(launch.api_key),
            timeout=httpx.Timeout(None, connect=5.0),  # the watch bounds each call by what the limit leaves
            trust_env=False,
            verify=client_tls(),
        )

    @property
    def reports_progress(self) -> bool:
        return self.launch.progress_path is not None and self.launch.progress is not None

    async def progress(self) -> Progress | None:
        if self.launch.progress_path is None or self.launch.progress is None:
            return None
        try:
            answer = await self._client.get(self.launch.progress_path)
        except httpx.HTTPError:
            return None
        return self.launch.progress(answer.text) if answer.status_code == 200 else None

    async def canary(self) -> bool:
        body = {"model": self.launch.served_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
        try:
            answer = await self._client.post(CANARY_PATH, json=body)
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

    def watch(self, launch: Launch) -> ProgressWatch:
        return ProgressWatch(self.probe(launch), self.activity, self.limits, clock=self.clock, sleep=self.sleep)
