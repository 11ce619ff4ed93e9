"""The HTTP surface agents talk to: the API routes, health, readiness, status, metrics; every error
written in the route's dialect (:mod:`gateway.serving.wire.error_shapes`).

Request bodies are parsed once, only to validate them and to map the model name; when no rename is
needed the original bytes are forwarded as they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gateway.serving.edge import status_page
from gateway.serving.edge.browser_guard import BrowserGuard
from gateway.serving.edge.disconnect import CancelOnDisconnect
from gateway.serving.edge.middleware import ApiKeys, ASGIApp, RequestMetrics, may_see_detail
from gateway.serving.edge.readiness import EngineProbe, not_ready
from gateway.serving.handlers import Inference
from gateway.serving.metrics import StateCollector
from gateway.serving.metrics import endpoint as metrics_endpoint
from gateway.serving.runtime import Runtime
from gateway.serving.scheduling.usage_board import BoardCollector
from gateway.serving.wire.error_shapes import RETRY_AFTER_S, ApiError, as_api_error, shape_for
from gateway.supervision.lifecycle import State

log = logging.getLogger("gateway.app")


class Gateway:
    """Route handlers bound to one :class:`Runtime`."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.probe = EngineProbe()

    async def health(self, _request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def root(self, _request: Request) -> Response:
        """What a client's connectivity probe (Claude Code's ``HEAD /``) gets: 200, nothing more."""
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        """200 or 503 for anyone (load balancers and orchestrators' probes carry no key); the model and
        the reason only for a request that may see them."""
        backend = self.rt.backend
        detail = may_see_detail(request.scope)
        if backend.ready and backend.target is not None and not await self.probe.answers(backend.target):
            why = f"the engine does not answer its health check within {self.probe.timeout_s:g} s"
            silent = {"status": "not_answering", **({"reason": why} if detail else {})}
            return JSONResponse(silent, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        if backend.ready:
            return JSONResponse({"status": "ready", **({"model": self.rt.route.fronted} if detail else {})})
        body, retry_after = not_ready(backend, detail)
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(retry_after)})

    def status_data(self) -> dict[str, Any]:
        route = self.rt.route
        data: dict[str, Any] = {
            "model": route.fronted,
            "aliases": list(route.aliases),
            "context_length": self.rt.context_length(),
            **self.rt.backend.snapshot(),
        }
        data["plan"] = {**(data.get("plan") or {}), **self.rt.plan_details}
        _latest_only(data)
        data["gpus"] = self._gpus()
        data["usage"] = self.rt.usage.snapshot()
        data["scheduling"] = self.rt.scheduling_status()
        if len(self.rt.pool.replicas) > 1:  # one engine: the backend above is the whole story
            data["pool"] = self.rt.pool.snapshot()
        return data

    def _gpus(self) -> list[dict[str, Any]]:
        """The devices the plan uses (simulated ones too), each with what the plan puts on it and, for
        this machine's real GPUs, what is in use now (NVML). ``gpu`` is the device's label: its index on
        its own node as NVML numbers it (gateway.core.devices.Device.label)."""
        now = {gpu: used for gpu, used, _total in self.rt.gpu_memory()}
        return [
            {
                "gpu": device.gpu,
                "name": device.name,
                "planned_gib": _gib(device.planned_bytes),
                "used_gib": _gib(now[device.gpu]) if device.gpu in now else None,
                "total_gib": _gib(device.total_bytes),
            }
            for device in self.rt.plan_devices
        ]

    async def status(self, request: Request) -> Response:
        wants = request.query_params.get("format") or (
            "html" if "text/html" in request.headers.get("accept", "") else "json"
        )
        data = self.status_data()
        if wants == "html":
            return HTMLResponse(status_page.render(data))
        return JSONResponse(data)

    def _model_card(self, name: str) -> dict[str, Any]:
        route = self.rt.route
        context = self.rt.context_length()
        return {
            "id": name,
            "object": "model",
            "created": self.rt.created,
            "owned_by": "gateway",
            "root": route.fronted,
            "context_length": context,
            "max_model_len": context,  # vLLM's name for the same figure
        }

    async def list_models(self, _request: Request) -> Response:
        route = self.rt.route
        return JSONResponse({"object": "list", "data": [self._model_card(n) for n in (route.fronted, *route.aliases)]})

    async def get_model(self, request: Request) -> Response:
        requested = request.path_params["model"]
        if not self.rt.route.accepts(requested):
            raise Inference(self.rt).unknown_model(requested)
        return JSONResponse(self._model_card(requested))


STATUS_EVENTS_SHOWN = 50  # the latest engine attempts, hangs and group stops /status lists


def _latest_only(data: dict[str, Any]) -> None:
    """Keep /status bounded over any uptime: of each list of engine events, the latest, and how many
    earlier ones are left out (``<name>_not_shown``); each attempt carries its own number."""
    for name in ("attempts", "hangs", "group_stops"):
        events = data.get(name)
        if isinstance(events, list) and len(events) > STATUS_EVENTS_SHOWN:
            data[f"{name}_not_shown"] = len(events) - STATUS_EVENTS_SHOWN
            data[name] = events[-STATUS_EVENTS_SHOWN:]


def _gib(value: int) -> float:
    return round(value / 1024**3, 2)


async def _error(request: Request, exc: Exception) -> Response:
    """Every exception a route raises, as an error in the route's dialect."""
    if not isinstance(exc, ApiError | HTTPException):
        log.exception("unhandled error", exc_info=exc)
    path = request.url.path
    return shape_for(path).response(as_api_error(exc, request.method, path))


def create_app(runtime: Runtime) -> ASGIApp:
    gateway = Gateway(runtime)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await runtime.backend.start()

        async def stop_if_start_fails() -> None:
            state = await runtime.backend.wait_settled()
            if state is State.FAILED and not runtime.backend.ever_ready:
                runtime.on_startup_failure()

        watcher = asyncio.create_task(stop_if_start_fails())
        try:
            yield
        finally:
            watcher.cancel()
            await runtime.backend.stop()
            for upstream in runtime.upstreams:
                await upstream.client.aclose()

    inference = Inference(runtime)
    routes = [
        Route("/", gateway.root, methods=["GET", "HEAD"]),
        Route("/health", gateway.health, methods=["GET"]),
        Route("/ready", gateway.ready, methods=["GET"]),
        Route("/status", gateway.status, methods=["GET"]),
        Route("/v1/models", gateway.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", gateway.get_model, methods=["GET"]),
        Route("/v1/chat/completions", inference.chat_completions, methods=["POST"]),
        Route("/v1/completions", inference.completions, methods=["POST"]),
        Route("/v1/responses", inference.responses, methods=["POST"]),
        Route("/v1/messages", inference.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", inference.count_tokens, methods=["POST"]),
    ]
    registry = CollectorRegistry()
    registry.register(StateCollector(runtime))
    registry.register(BoardCollector(runtime.usage))
    routes.append(Route("/metrics", metrics_endpoint(registry), methods=["GET"]))
    handlers = {ApiError: _error, HTTPException: _error, Exception: _error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    keyed = ApiKeys(app, runtime.api_keys)
    guarded = BrowserGuard(  # the Host check is off only where a key is really asked for
        keyed, keyed=bool(keyed.keys), bind_host=runtime.bind_host,
        allowed_hosts=runtime.allowed_hosts, cors_allow_origins=runtime.cors_allow_origins,
    )  # fmt: skip
    paths = [route.path for route in routes if "{" not in route.path]  # one label per route, not per model id
    return CancelOnDisconnect(RequestMetrics(guarded, registry, paths, board=runtime.usage))
