"""A backend the user runs themselves (`serve --backend-url URL`): nothing to plan, start or stop.

It is a :class:`~gateway.lifecycle.ServedBackend`, like the supervisor, so the HTTP app does not care
which it fronts. Readiness is the backend's own answer to `GET /v1/models`, polled every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx

from backends.base import Launch
from gateway.lifecycle import State

log = logging.getLogger("gateway.external")

POLL_S = 2.0


class ExternalBackend:
    def __init__(self, launch: Launch) -> None:
        self.launch: Launch | None = launch
        self._target = launch
        self.state = State.STARTING
        self.reason: str | None = "waiting for the backend to answer"
        self.ever_ready = False
        self.restarts = 0  # the gateway never restarts a server it does not run
        self.attempts: list[Any] = []
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="external backend")

    async def wait_settled(self) -> State:
        await self._settled.wait()
        return self.state

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.state = State.STOPPED

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "reason": self.reason,
            "plan": {"decision": f"fronting the backend at {self._target.base_url} (--backend-url)"},
            "attempts": [],
            "restarts": self.restarts,
            "backend": {"engine": "external", "url": self._target.base_url, "served_name": self._target.served_name},
        }

    def report(self) -> str:
        return self.reason or self.state.value

    async def _watch(self) -> None:
        headers = {"Authorization": f"Bearer {self._target.api_key}"} if self._target.api_key else {}
        url = self._target.base_url + self._target.health_path
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False) as client:
            while True:
                try:
                    answered = (await client.get(url, headers=headers)).status_code == 200
                    why = "" if answered else "the backend answered /v1/models with an error"
                except httpx.TransportError as exc:
                    answered, why = (
                        False,
                        f"the backend at {self._target.base_url} does not answer ({type(exc).__name__})",
                    )
                if answered and self.state is not State.READY:
                    log.info("backend at %s is ready", self._target.base_url)
                elif not answered and self.state is State.READY:
                    log.warning("%s", why)
                self.state = State.READY if answered else State.STARTING
                self.reason = None if answered else why
                self.ever_ready = self.ever_ready or answered
                self._settled.set()
                await asyncio.sleep(POLL_S)
