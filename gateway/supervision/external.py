"""A backend the user runs themselves (`serve --backend-url URL`): nothing to plan, start or stop.

It is a :class:`~gateway.supervision.lifecycle.ServedBackend`, like the supervisor, so the HTTP app does not care
which it fronts. Readiness is the backend's own answer to `GET /v1/models`, polled every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx

from gateway.backends.base import Capability, Launch
from gateway.core.auth import bearer_header
from gateway.core.errors import ConfigError
from gateway.core.tls import async_http_client, http_get
from gateway.supervision.lifecycle import State

log = logging.getLogger("gateway.external")

POLL_S = 2.0


class ExternalBackend:
    def __init__(self, launch: Launch) -> None:
        self.target: Launch | None = launch  # the server, described as an engine target
        self._target = launch
        self.state = State.STARTING
        self.reason: str | None = "waiting for the backend to answer"
        self.ever_ready = False
        self.restarts = 0  # the gateway never restarts a server it does not run
        self.retry_at: float | None = None
        self.attempts: list[Any] = []
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def context_length(self) -> int:
        """What the server's /v1/models (or --context-length) says."""
        return self._target.context_length

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
        headers = bearer_header(self._target.api_key)
        url = self._target.base_url + self._target.health_path
        async with async_http_client(timeout=httpx.Timeout(5.0)) as client:
            while True:
                try:
                    answered = (await client.get(url, headers=headers)).status_code == 200
                    why = "" if answered else "the backend answered /v1/models with an error"
                except httpx.TransportError as exc:
                    answered, why = (
                        False,
                        f"the backend at {self._target.base_url} does not answer ({type(exc).__name__})",
                    )
                except Exception as exc:  # a bug here must not end the watch: the state would never change again
                    log.exception("polling the backend failed")
                    answered, why = False, f"polling the backend failed ({type(exc).__name__}); see the gateway log"
                if answered and self.state is not State.READY:
                    log.info("backend at %s is ready", self._target.base_url)
                elif not answered and self.state is State.READY:
                    log.warning("%s", why)
                self.state = State.READY if answered else State.STARTING
                self.reason = None if answered else why
                self.ever_ready = self.ever_ready or answered
                self._settled.set()
                await asyncio.sleep(POLL_S)


UNLIMITED = 1 << 30  # admission never queues: the server's own 429/503 reach the client


def describe_server(settings: Any) -> tuple[Launch, str]:
    """(where and what the server at ``backend_url`` serves, the fronted name): its /v1/models names the
    model and its context; its capacity is what it says (llama-server's /props ``total_slots``) or what
    the user configured; otherwise requests are not queued at all (an external vLLM runs 256 at once)."""
    native = _capabilities(settings.backend_native_apis)  # refused before the server is asked
    url = settings.backend_url.rstrip("/").removesuffix("/v1")
    headers = bearer_header(settings.backend_api_key)
    served, context = settings.model, settings.context_length or 0
    try:
        cards = http_get(url + "/v1/models", headers=headers, timeout=10).json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        if not settings.model:
            raise ConfigError(
                f"cannot read {url}/v1/models ({type(exc).__name__}): start that server or pass --model"
            ) from exc
        cards = []
    if cards:
        served = cards[0].get("id", served)
        context = context or int(cards[0].get("max_model_len") or (cards[0].get("meta") or {}).get("n_ctx_train") or 0)
    if not served:
        raise ConfigError(f"{url}/v1/models lists no model: pass --model with the name it serves")
    capacity, why = _capacity(url, headers, settings.backend_max_concurrency)
    log.info("requests to %s: %s", url, why)
    launch = Launch(
        engine="external",
        argv=[],
        port=0,
        api_key=settings.backend_api_key or "",
        served_name=served,
        context_length=context,
        health_path="/v1/models",
        summary=f"the server at {url}",
        max_concurrency=capacity,
        native=native,
        base=url,
    )
    return launch, settings.model or served


def _capacity(url: str, headers: dict[str, str], configured: int | None) -> tuple[int, str]:
    if configured:
        return configured, f"at most {configured} at once (backend_max_concurrency), the rest queued"
    try:
        slots = int(http_get(url + "/props", headers=headers, timeout=5).json()["total_slots"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        slots = 0
    if slots > 0:
        return slots, f"at most {slots} at once, the server's own slots (/props total_slots), the rest queued"
    return UNLIMITED, "not queued: the server does not say how many it runs at once, its own 429/503 pass through"


def _capabilities(words: list[str]) -> frozenset[Capability]:
    """``backend_native_apis`` read into capabilities; a word that names none is refused with the known ones."""
    known = {c.value for c in Capability}
    unknown = [word for word in words if word not in known]
    if unknown:
        raise ConfigError(f"backend_native_apis: unknown {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return frozenset(Capability(word) for word in words)
