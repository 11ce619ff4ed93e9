"""The inference routes: chat and text completions, Responses, Messages (and count_tokens).

Each request is parsed once, checked, mapped to the served model, admitted, then either passed
through (the engine speaks the API itself) or translated to chat completions and back.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backends.base import Launch
from gateway import messages_api, responses_api
from gateway.fidelity import (
    PER_MESSAGE_OVERHEAD,
    ChatStreamFixer,
    clamp_output,
    complete_chat_shape,
    flatten_prompt,
    map_max_completion_tokens,
)
from gateway.openai_errors import ApiError, unavailable
from gateway.proxy import ChunkFilter, translated_stream
from gateway.lifecycle import State

if TYPE_CHECKING:
    from gateway.app import Runtime

log = logging.getLogger("gateway.handlers")


class _Chain:
    def __init__(self, *filters: ChunkFilter) -> None:
        self.filters = filters

    def feed(self, chunk: bytes) -> bytes:
        for f in self.filters:
            chunk = f.feed(chunk)
        return chunk

    def flush(self) -> bytes:
        out = b""
        for index, f in enumerate(self.filters):
            tail = f.flush()
            for later in self.filters[index + 1 :]:
                tail = later.feed(tail)
            out += tail
        return out


async def read_json_object(request: Request, limit: int) -> tuple[bytes, dict[str, Any]]:
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


def require(payload: dict[str, Any], field: str, kinds: tuple[type, ...], what: str) -> None:
    if field not in payload:
        raise ApiError(400, f"missing required parameter: '{field}'", param=field, code="missing_required_parameter")
    if not isinstance(payload[field], kinds):
        raise ApiError(400, f"'{field}' must be {what}", param=field, code="invalid_type")


class Inference:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # -- shared steps ---------------------------------------------------------------------------
    def unknown_model(self, requested: str) -> ApiError:
        route = self.rt.route
        also = f" (aliases: {', '.join(route.aliases)})" if route.aliases else ""
        return ApiError(
            404,
            f"The model '{requested}' does not exist: this gateway serves '{route.fronted}'{also}",
            param="model",
            code="model_not_found",
        )

    def _route_model(self, payload: dict[str, Any]) -> bool:
        """Check the requested model and name the served one; True when the payload changed."""
        route = self.rt.route
        if "model" not in payload:
            raise ApiError(
                400, f"missing required parameter: 'model' (this gateway serves '{route.fronted}')", param="model",
                code="missing_required_parameter",
            )  # fmt: skip
        require(payload, "model", (str,), "a string")
        requested = payload["model"]
        if not route.accepts(requested):
            raise self.unknown_model(requested)
        if requested != route.served:
            payload["model"] = route.served
            return True
        return False

    def _target(self) -> Launch:
        backend = self.rt.supervisor
        target = backend.launch
        if not backend.ready or target is None:
            detail = {State.STARTING: "is still starting", State.RESTARTING: "is restarting"}.get(
                backend.state, "is not running"
            )
            raise unavailable(f"the backend for '{self.rt.route.fronted}' {detail}; retry shortly")
        return target

    async def _prompt_tokens(self, target: Launch, payload: dict[str, Any]) -> int | None:
        text, messages = flatten_prompt(payload)
        counted = await self.rt.upstream.count_tokens(target, text)
        return None if counted is None else counted + PER_MESSAGE_OVERHEAD * messages

    async def _fit_chat(self, target: Launch, payload: dict[str, Any]) -> tuple[bool, int | None]:
        """Engine-specific fixes to a chat request: (payload changed, prompt tokens if counted)."""
        changed = False
        if "max_completion_tokens" not in target.native:
            changed |= map_max_completion_tokens(payload)
        prompt: int | None = None
        requested = payload.get("max_tokens")
        if isinstance(requested, int) and requested > target.context_length // 4:
            prompt = await self._prompt_tokens(target, payload)
            if prompt is not None:
                changed |= clamp_output(payload, prompt, target.context_length)
        return changed, prompt

    # -- chat and text completions -----------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        body, payload = await read_json_object(request, self.rt.max_body_bytes)
        require(payload, "messages", (list,), "an array of messages")
        if not payload["messages"]:
            raise ApiError(400, "'messages' must contain at least one message", param="messages")
        return await self._completion(payload, body, "/v1/chat/completions")

    async def completions(self, request: Request) -> Response:
        body, payload = await read_json_object(request, self.rt.max_body_bytes)
        require(payload, "prompt", (str, list), "a string or an array")
        return await self._completion(payload, body, "/v1/completions")

    async def _completion(self, payload: dict[str, Any], body: bytes, path: str) -> Response:
        changed = self._route_model(payload)
        target = self._target()
        fixed, prompt = await self._fit_chat(target, payload)
        stream = payload.get("stream") is True
        filters: list[ChunkFilter] = []
        if stream:
            wants_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            synth = wants_usage and "include_usage" not in target.native
            if synth and prompt is None:
                prompt = await self._prompt_tokens(target, payload) or 0
            if synth or target.reasoning_field:
                filters.append(
                    ChatStreamFixer(mirror=target.reasoning_field, usage_prompt_tokens=prompt if synth else None)
                )
            if rewriter := self.rt.route.stream_rewriter():
                filters.append(rewriter)
        if changed or fixed:
            body = json.dumps(payload).encode()
        route_rewrite = self.rt.route.rewrite_body
        complete = "openai_shapes" not in target.native

        def rewrite(data: bytes) -> bytes:
            return complete_chat_shape(route_rewrite(data)) if complete else route_rewrite(data)

        ticket = await self.rt.admission.enter()
        return await self.rt.upstream.relay(
            target,
            path,
            body,
            stream=stream,
            rewrite_body=rewrite,
            chunk_filter=_Chain(*filters) if len(filters) > 1 else (filters[0] if filters else None),
            on_close=ticket.release,
        )

    async def _passthrough(self, target: Launch, path: str, payload: dict[str, Any], body: bytes | None) -> Response:
        """The engine speaks this API itself: forward the request (re-encoded only if it changed)."""
        ticket = await self.rt.admission.enter()
        return await self.rt.upstream.relay(
            target,
            path,
            body if body is not None else json.dumps(payload).encode(),
            stream=payload.get("stream") is True,
            rewrite_body=self.rt.route.rewrite_body,
            on_close=ticket.release,
        )

    # -- Responses (Codex) ------------------------------------------------------------------------
    async def responses(self, request: Request) -> Response:
        body, payload = await read_json_object(request, self.rt.max_body_bytes)
        require(payload, "input", (str, list), "a string or an array of items")
        changed = self._route_model(payload)
        target = self._target()
        if "responses" in target.native:
            return await self._passthrough(target, "/v1/responses", payload, body if not changed else None)
        chat = responses_api.to_chat(payload, self.rt.route.served)
        await self._fit_chat(target, chat)
        if not chat["stream"]:
            status, answer = await self._chat_once(target, chat)
            if status != 200:
                return JSONResponse(answer, status_code=status)
            return JSONResponse(responses_api.from_chat(answer, payload, self.rt.route.fronted))
        ticket = await self.rt.admission.enter()
        chunks = await self._chat_chunks(target, chat, ticket)
        if isinstance(chunks, Response):
            return chunks
        return translated_stream(responses_api.stream_from_chat(chunks, payload, self.rt.route.fronted), ticket.release)

    async def _chat_once(self, target: Launch, chat: dict[str, Any]) -> tuple[int, Any]:
        """A translator's non-streamed chat completion, holding an engine slot while it runs."""
        ticket = await self.rt.admission.enter()
        try:
            return await self.rt.upstream.post_json(target, "/v1/chat/completions", chat)
        finally:
            ticket.release()

    async def _chat_chunks(self, target: Launch, chat: dict[str, Any], ticket: Any) -> Any:
        """A translator's input: parsed chat chunks (usage synthesized if the engine ignores it)."""
        usage: ChunkFilter | None = None
        if "include_usage" not in target.native:
            usage = ChatStreamFixer(mirror=None, usage_prompt_tokens=await self._prompt_tokens(target, chat) or 0)
        try:
            failed, chunks = await self.rt.upstream.chat_stream(target, json.dumps(chat).encode(), usage)
        except ApiError:
            ticket.release()
            raise
        if failed is not None:
            ticket.release()
            status, content = failed
            return Response(content, status_code=status, media_type="application/json")
        return chunks

    # -- Messages (Claude Code) -------------------------------------------------------------------
    def _check_messages(self, payload: dict[str, Any]) -> None:
        require(payload, "messages", (list,), "an array of messages")
        if not payload["messages"]:
            raise ApiError(400, "'messages' must contain at least one message", param="messages")

    async def messages(self, request: Request) -> Response:
        body, payload = await read_json_object(request, self.rt.max_body_bytes)
        self._check_messages(payload)
        require(payload, "max_tokens", (int,), "an integer")
        changed = self._route_model(payload)
        target = self._target()
        if "messages" in target.native:
            return await self._passthrough(target, "/v1/messages", payload, body if not changed else None)
        chat = messages_api.to_chat(payload, self.rt.route.served)
        _, prompt = await self._fit_chat(target, chat)
        if not chat["stream"]:
            status, answer = await self._chat_once(target, chat)
            if status != 200:
                raise _anthropic_error(status, answer)
            return JSONResponse(messages_api.from_chat(answer, self.rt.route.fronted))
        ticket = await self.rt.admission.enter()
        chunks = await self._chat_chunks(target, chat, ticket)
        if isinstance(chunks, Response):
            raise _anthropic_error(chunks.status_code, json.loads(bytes(chunks.body) or b"{}"))
        events = messages_api.stream_from_chat(chunks, self.rt.route.fronted, prompt or 0)
        return translated_stream(events, ticket.release)

    async def count_tokens(self, request: Request) -> Response:
        body, payload = await read_json_object(request, self.rt.max_body_bytes)
        self._check_messages(payload)
        changed = self._route_model(payload)
        target = self._target()
        if "messages" in target.native:
            body = json.dumps(payload).encode() if changed else body
            return await self.rt.upstream.relay(
                target, "/v1/messages/count_tokens", body, stream=False, rewrite_body=lambda b: b
            )
        text = messages_api.prompt_text(payload)
        counted = await self.rt.upstream.count_tokens(target, text)
        tokens = counted + PER_MESSAGE_OVERHEAD * len(payload["messages"]) if counted is not None else len(text) // 4
        return JSONResponse({"input_tokens": tokens})


def _anthropic_error(status: int, answer: Any) -> ApiError:
    """An engine's OpenAI-shaped error, to be rendered in the Messages dialect by the error handler."""
    error = answer.get("error") if isinstance(answer, dict) else None
    message = str(error.get("message") if isinstance(error, dict) else error or answer)
    return ApiError(status, message)
