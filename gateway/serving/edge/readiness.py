"""What ``/ready`` and the 503s tell a client about the engine: whether it answers now, in words that
do not name its address.

The backend's state says READY from the moment the engine first answered until its process exits;
an engine that is alive but no longer answers (it blocked writing its log to a full disk, or hangs)
stayed "ready" while every request got 504. ``/ready`` therefore asks the engine's health route
itself (at most once a second, answered from the last probe in between), so that a load balancer
stops sending it traffic. Reasons shown to clients have the engine's URL and port taken out: the
backend listens on loopback and its address is the operator's business (/status, behind the keys).

A backend that is not ready says which state it is in: starting, restarting, or failed; a supervisor
that gave up restarting its engine for now (its restart budget spent) also says when it tries again
(``next_try_at``, and ``Retry-After`` until then), so a failed gateway that still retries is told apart
from one that will not.
"""

from __future__ import annotations

import asyncio
import math
import re
import time

import aiohttp

from gateway.serving.wire.error_shapes import RETRY_AFTER_S
from gateway.supervision.lifecycle import EngineTarget, ServedBackend

PROBE_TIMEOUT_S = 2.0
PROBE_EVERY_S = 1.0
_ADDRESS = re.compile(r"\s*(?:at\s+)?(?:https?://[^\s,;)]+|\b(?:\d{1,3}\.){3}\d{1,3}:\d+\b|\blocalhost:\d+\b)")


def public(reason: str | None) -> str | None:
    """``reason`` without URLs or host:port pairs ("the backend at http://127.0.0.1:8081 does not
    answer" → "the backend does not answer")."""
    return _ADDRESS.sub("", reason) if reason else reason


def not_ready(backend: ServedBackend, detail: bool) -> tuple[dict[str, str | None], int]:
    """``/ready``'s body for a backend that is not ready, and the seconds its ``Retry-After`` says: the
    state; given up restarting for now, when the next try is (UTC); the reason for a request that may
    see it."""
    body: dict[str, str | None] = {"status": backend.state.value}
    retry_after = RETRY_AFTER_S
    if backend.retry_at is not None:
        body["next_try_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(backend.retry_at))
        retry_after = max(RETRY_AFTER_S, math.ceil(backend.retry_at - time.time()))
    if detail:
        body["reason"] = public(backend.reason)
    return body, retry_after


class EngineProbe:
    """Whether the live engine answers its health route, probed at most every ``every_s``."""

    def __init__(self, timeout_s: float = PROBE_TIMEOUT_S, every_s: float = PROBE_EVERY_S) -> None:
        self.timeout_s, self.every_s = timeout_s, every_s
        self._last: tuple[float, str, bool] | None = None  # (when, url, answered)
        self._lock = asyncio.Lock()

    async def answers(self, target: EngineTarget) -> bool:
        url = target.base_url + target.health_path
        async with self._lock:  # a burst of /ready calls makes one probe
            if self._last and self._last[1] == url and time.monotonic() - self._last[0] < self.every_s:
                return self._last[2]
            answered = await self._probe(url, target.api_key)
            self._last = (time.monotonic(), url, answered)
            return answered

    async def _probe(self, url: str, key: str) -> bool:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout, trust_env=False) as session,
                session.get(url, headers=headers, allow_redirects=False) as answer,
            ):
                return answer.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
