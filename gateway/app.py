"""The HTTP surface agents talk to: OpenAI routes, health, readiness, status.

Request bodies are parsed once, only to validate them and to map the model name; when no rename is
needed the original bytes are forwarded as they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.openai_errors import RETRY_AFTER_S, ApiError, unavailable
from gateway.proxy import Upstream
from gateway.routing import ModelRoute
from gateway.supervisor import State, Supervisor

log = logging.getLogger("gateway.app")


@dataclass
class Runtime:
    """What the app serves: one model route, its backend's supervisor and the client to it."""

    route: ModelRoute
    supervisor: Supervisor
    upstream: Upstream
    max_body_bytes: int
    on_startup_failure: Callable[[], None] = lambda: None
    created: int = 0

    def __post_init__(self) -> None:
        self.created = int(time.time())


async def _read_json_object(request: Request, limit: int) -> tuple[bytes, dict[str, Any]]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes (max_body_bytes)")
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes (max_body_bytes)")
        parts.append(part)
    body = b"".join(parts)
    if not body.strip():
        raise ApiError(400, "request body is empty: send a JSON object")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(payload, dict):
        raise ApiError(400, f"request body must be a JSON object, not a JSON {type(payload).__name__}")
    return body, payload


def _require(payload: dict[str, Any], field: str, kinds: tuple[type, ...], what: str) -> None:
    if field not in payload:
        raise ApiError(400, f"missing required parameter: '{field}'", param=field, code="missing_required_parameter")
    if not isinstance(payload[field], kinds):
        raise ApiError(400, f"'{field}' must be {what}", param=field, code="invalid_type")


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

    async def status(self, _request: Request) -> Response:
        route = self.rt.route
        return JSONResponse(
            {
                "model": route.fronted,
                "aliases": list(route.aliases),
                "context_length": self._context_length(),
                **self.rt.supervisor.snapshot(),
            }
        )

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
            raise self._unknown_model(requested)
        return JSONResponse(self._model_card(requested))

    def _unknown_model(self, requested: str) -> ApiError:
        route = self.rt.route
        also = f" (aliases: {', '.join(route.aliases)})" if route.aliases else ""
        return ApiError(
            404,
            f"The model '{requested}' does not exist: this gateway serves '{route.fronted}'{also}",
            param="model",
            code="model_not_found",
        )

    async def _forward(self, request: Request, path: str, body: bytes, payload: dict[str, Any]) -> Response:
        route = self.rt.route
        requested = payload.get("model")
        if requested is not None and not isinstance(requested, str):
            raise ApiError(400, "'model' must be a string", param="model", code="invalid_type")
        if requested is not None and not route.accepts(requested):
            raise self._unknown_model(requested)
        if requested != route.served:  # an alias, another spelling, or no model at all
            payload["model"] = route.served
            body = json.dumps(payload).encode()
        supervisor = self.rt.supervisor
        target = supervisor.launch
        if not supervisor.ready or target is None:
            detail = {State.STARTING: "is still starting", State.RESTARTING: "is restarting"}.get(
                supervisor.state, "is not running"
            )
            raise unavailable(f"the backend for '{route.fronted}' {detail}; retry shortly")
        return await self.rt.upstream.post(target, path, body, stream=payload.get("stream") is True, route=route)

    async def chat_completions(self, request: Request) -> Response:
        body, payload = await _read_json_object(request, self.rt.max_body_bytes)
        _require(payload, "messages", (list,), "an array of messages")
        if not payload["messages"]:
            raise ApiError(400, "'messages' must contain at least one message", param="messages")
        return await self._forward(request, "/v1/chat/completions", body, payload)

    async def completions(self, request: Request) -> Response:
        body, payload = await _read_json_object(request, self.rt.max_body_bytes)
        _require(payload, "prompt", (str, list), "a string or an array")
        return await self._forward(request, "/v1/completions", body, payload)


async def _api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}: see /v1/models, /v1/chat/completions, /v1/completions"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return ApiError(exc.status_code, message).response()


async def _unexpected(_request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return ApiError(500, f"internal gateway error ({type(exc).__name__}); see the gateway log").response()


def create_app(runtime: Runtime) -> Starlette:
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

    routes = [
        Route("/health", gateway.health, methods=["GET"]),
        Route("/ready", gateway.ready, methods=["GET"]),
        Route("/status", gateway.status, methods=["GET"]),
        Route("/v1/models", gateway.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", gateway.get_model, methods=["GET"]),
        Route("/v1/chat/completions", gateway.chat_completions, methods=["POST"]),
        Route("/v1/completions", gateway.completions, methods=["POST"]),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
