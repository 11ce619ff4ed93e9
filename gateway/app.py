"""The HTTP surface agents talk to: OpenAI routes, health, readiness, status.

Request bodies are parsed once, only to validate them and to map the model name; when no rename is
needed the original bytes are forwarded as they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gateway import messages_api, status_page
from gateway.admission import Admission
from gateway.edge import ApiKeys, ASGIApp, RequestMetrics
from gateway.external import ExternalBackend
from gateway.handlers import Inference
from gateway.metrics import StateCollector
from gateway.metrics import endpoint as metrics_endpoint
from gateway.openai_errors import RETRY_AFTER_S, ApiError
from gateway.proxy import Upstream
from gateway.routing import ModelRoute
from gateway.lifecycle import State
from gateway.supervisor import Supervisor

log = logging.getLogger("gateway.app")


@dataclass
class Runtime:
    """What the app serves: one model route, its backend (supervised or external), the client to it
    and the admission queue in front of it."""

    route: ModelRoute
    supervisor: Supervisor | ExternalBackend
    upstream: Upstream
    max_body_bytes: int
    queue_limit: int = 64
    queue_wait_s: float = 600.0
    api_keys: tuple[str, ...] = ()
    plan_memory: list[tuple[int, str, int]] = field(default_factory=list)  # (gpu, term, bytes) for /metrics
    plan_kv_tokens: int = 0
    plan_details: dict[str, Any] = field(default_factory=dict)  # candidates for the status page
    gpu_memory: Callable[[], list[tuple[int, int, int]]] = lambda: []
    on_startup_failure: Callable[[], None] = lambda: None
    created: int = 0
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.created = int(time.time())

        def capacity() -> int:
            launch = self.supervisor.launch
            return launch.max_concurrency if launch else 1

        self.admission = Admission(capacity, queue_limit=self.queue_limit, wait_s=self.queue_wait_s)


class Gateway:
    """Route handlers bound to one :class:`Runtime`."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    async def health(self, _request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, _request: Request) -> Response:
        supervisor = self.rt.supervisor
        if supervisor.ready:
            return JSONResponse({"status": "ready", "model": self.rt.route.fronted})
        body = {"status": supervisor.state.value, "reason": supervisor.reason}
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    def _context_length(self) -> int:
        """What the live engine was started with (it changes when the supervisor steps down)."""
        launch = self.rt.supervisor.launch
        return launch.context_length if launch and self.rt.supervisor.ready else self.rt.route.context_length

    def status_data(self) -> dict[str, Any]:
        route = self.rt.route
        data: dict[str, Any] = {
            "model": route.fronted,
            "aliases": list(route.aliases),
            "context_length": self._context_length(),
            **self.rt.supervisor.snapshot(),
        }
        data["plan"] = {**(data.get("plan") or {}), **self.rt.plan_details}
        data["gpus"] = [
            {"index": index, "used_gib": round(used / 1024**3, 2), "total_gib": round(total / 1024**3, 2)}
            for index, used, total in self.rt.gpu_memory()
        ]
        return data

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
        context = self._context_length()
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


def _anthropic_route(request: Request) -> bool:
    return request.url.path.startswith("/v1/messages")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return messages_api.error_response(exc) if _anthropic_route(request) else exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}: see /v1/models, /v1/chat/completions, /v1/completions"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    error = ApiError(exc.status_code, message)
    return messages_api.error_response(error) if _anthropic_route(request) else error.response()


async def _unexpected(_request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return ApiError(500, f"internal gateway error ({type(exc).__name__}); see the gateway log").response()


def create_app(runtime: Runtime) -> ASGIApp:
    gateway = Gateway(runtime)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await runtime.supervisor.start()

        async def stop_if_start_fails() -> None:
            state = await runtime.supervisor.wait_settled()
            if state is State.FAILED and not runtime.supervisor.ever_ready:
                runtime.on_startup_failure()

        watcher = asyncio.create_task(stop_if_start_fails())
        try:
            yield
        finally:
            watcher.cancel()
            await runtime.supervisor.stop()
            await runtime.upstream.aclose()

    inference = Inference(runtime)
    routes = [
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
    registry.register(StateCollector(runtime, runtime.gpu_memory))
    routes.append(Route("/metrics", metrics_endpoint(registry), methods=["GET"]))
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    return RequestMetrics(ApiKeys(app, runtime.api_keys), registry)
