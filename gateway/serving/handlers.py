"""The inference routes: chat and text completions, Responses, Messages (and count_tokens).

Each request is parsed once, checked, mapped to the served model, admitted, then either passed
through (the engine speaks the API itself) or translated to chat completions and back. Responses
and Messages share one translate path; a :class:`Dialect` says what differs between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.serving.dialects import messages_api
from gateway.serving.dialects import request_shapes as shapes
from gateway.serving.dialects.chat_fixups import (
    ChatStreamFixer,
    clamp_output,
    complete_chat_shape,
    map_max_completion_tokens,
)
from gateway.serving.dialects.dialect import MESSAGES, RESPONSES, Dialect
from gateway.serving.dialects.prompt_prefix import strip_billing_header
from gateway.serving.edge.middleware import presented_key, record_of
from gateway.serving.edge.readiness import public
from gateway.serving.edge.request_body import BodyReader
from gateway.serving.runtime import Runtime
from gateway.serving.scheduling.admission import Claim, Ticket
from gateway.serving.scheduling.sessions import LONG_PREFILL_TOKENS, identify, prompt_units
from gateway.serving.transport.prompt_count import PromptCount
from gateway.serving.transport.proxy import ChunkFilter, chained, translated_stream
from gateway.serving.wire import usage_tally
from gateway.serving.wire.error_shapes import ApiError, unavailable
from gateway.supervision.lifecycle import EngineTarget, ServedBackend, State

log = logging.getLogger("gateway.handlers")


def _is_chat_completion(answer: Any) -> bool:
    """Enough of a chat completion to translate: ``choices`` a list of objects whose message, text,
    tool calls, names and arguments have the schema's types (``[null]``, ``"abc"`` or arguments that are
    a list would break the translator or pass through untyped: a 502, not a 500)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    return isinstance(choices, list) and all(isinstance(choice, dict) and _typed(choice) for choice in choices)


def _typed(choice: dict[str, Any]) -> bool:
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        return False
    texts = (message.get(key) for key in ("content", "reasoning_content", "reasoning"))
    calls = message.get("tool_calls") or []
    if not all(text is None or isinstance(text, str) for text in texts) or not isinstance(calls, list):
        return False
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return False
        fields = (call.get("id"), function.get("name"), function.get("arguments"))
        if not all(value is None or isinstance(value, str) for value in fields):
            return False
    return True


def _not_ready(backend: ServedBackend) -> str:
    """Why requests cannot go through, as the 503 says it: a server the user runs (``--backend-url``)
    is never "starting" here, and one that served and went quiet has stopped answering."""
    why = public(backend.reason) or "no reason given"
    if backend.state is State.STARTING and backend.ever_ready:
        return f"stopped answering ({why})"
    if backend.state is State.STARTING and backend.target is not None and backend.target.engine == "external":
        return f"is unreachable ({why})"
    return {State.STARTING: "is still starting", State.RESTARTING: "is restarting"}.get(backend.state, "is not running")


def _translated_reply(dialect: Dialect, answer: dict[str, Any], request: dict[str, Any], fronted: str) -> Response:
    """The dialect's reply to a chat completion. An engine answer of the wrong types (a message, tool
    call or arguments that is not what the schema says, arguments nested past Python's recursion limit,
    text that is not UTF-8) is the backend's fault: a 502 in the dialect's shape, not a 500."""
    try:
        body = json.dumps(dialect.reply(answer, request, fronted), ensure_ascii=False, allow_nan=False)
        return Response(body.encode("utf-8"), media_type="application/json")
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError) as exc:
        log.warning("cannot translate the backend's answer to %s: %s: %s", dialect.native, type(exc).__name__, exc)
        raise ApiError(
            502,
            f"the backend's chat completion could not be translated ({type(exc).__name__}); see the gateway log",
            code="backend_malformed_answer",
        ) from None


class Inference:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.bodies = BodyReader(runtime.max_body_bytes, runtime.max_body_elements)

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
        if payload.get("model") is None:
            raise ApiError(
                400, f"missing required parameter: 'model' (this gateway serves '{route.fronted}')", param="model",
                code="missing_required_parameter",
            )  # fmt: skip
        requested = payload["model"]
        if not route.accepts(requested):
            raise self.unknown_model(requested)
        if requested != route.served:
            payload["model"] = route.served
            return True
        return False

    def _target(self) -> EngineTarget:
        backend = self.rt.backend
        target = backend.target
        if not backend.ready or target is None:
            raise unavailable(f"the backend for '{self.rt.route.fronted}' {_not_ready(backend)}; retry shortly")
        return target

    def _claim(self, request: Request, payload: Mapping[str, Any]) -> Claim:
        """Name the request's session and key, and estimate what the engine must prefill of it (what the
        scheduler orders by: gateway.serving.scheduling.sessions); the estimate counts this prompt as sent
        from now on."""
        units = prompt_units(payload)
        identity = identify(request.headers, payload, units, presented_key(request.scope))
        new_tokens = self.rt.prefixes.new_tokens(units)
        self.rt.prefixes.remember(units)
        record = record_of(request.scope)
        record.identity, record.prefill_estimate = identity, new_tokens
        record.long = new_tokens > LONG_PREFILL_TOKENS
        return Claim(identity.key, identity.session, new_tokens, record.long)

    @staticmethod
    def _mark_long(target: EngineTarget, claim: Claim, payload: dict[str, Any]) -> bool:
        """A long prefill carries what the engine needs to serve it after short turns (vLLM's priority,
        llama-server's last slot: backends.base.Scheduling), and every request the sampling fields it
        leaves out that the engine takes no defaults for (Launch.request_defaults); True when it changed."""
        fields = target.scheduling.long_fields if claim.long else {}
        payload.update(fields)
        # the model's recommended sampling where the engine has no defaults of its own; a request's own win
        unset = {name: value for name, value in target.request_defaults.items() if payload.get(name) is None}
        payload.update(unset)
        return bool(fields or unset)

    @contextlib.asynccontextmanager
    async def _admitted(self, request: Request, claim: Claim) -> AsyncIterator[Ticket]:
        """An engine slot for the block (gateway.serving.scheduling.admission), with the wait and the first output
        noted on the request's record: the long-prefill lane frees when the answer starts."""
        async with self.rt.admission.slot(claim) as ticket:
            record = record_of(request.scope)
            record.queued_s = ticket.queued_s
            record.on_first_output.append(ticket.prefilled)
            yield ticket

    def _prompt(self, target: EngineTarget, request: dict[str, Any]) -> PromptCount:
        """The request's prompt tokens, asked of the engine once however many steps need them."""
        return PromptCount(self.rt.engine_client, target, request)

    @staticmethod
    def _count_beside(prompt: PromptCount) -> asyncio.Task[int | None]:
        """The prompt's tokens, counted beside the request rather than before it: the count renders and
        tokenizes the whole prompt again (two engine round trips, ~110 ms of llama-server's CPU for a
        20k-token Claude Code turn: benchmarks/messages_overhead.py), and only message_start's figure
        needs it. A count that fails leaves that figure 0; message_delta carries the engine's own count."""

        async def count() -> int | None:
            try:
                return await prompt.tokens()
            except ApiError as exc:
                log.debug("prompt not counted for message_start: %s", exc.message)
                return None

        return asyncio.create_task(count())

    async def _fit_chat(self, target: EngineTarget, payload: dict[str, Any], prompt: PromptCount) -> bool:
        """Engine-specific fixes to a chat request; True when the payload changed.

        A requested output longer than a quarter of the window (Claude Code asks for 32,000) is fitted
        beside the prompt when the engine counts it exactly; an estimate changes nothing, and whether the
        prompt fits is then the engine's verdict (its refusal is reworded on the way back)."""
        changed = False
        if "max_completion_tokens" not in target.native:
            changed |= map_max_completion_tokens(payload)
        requested = payload.get("max_tokens")
        if not (isinstance(requested, int) and requested > target.context_length // 4):
            return changed
        counted = await prompt.counted()
        if counted is not None and counted[1]:  # exact
            changed |= clamp_output(payload, counted[0], target.context_length)
        return changed

    # -- chat and text completions -----------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        body, payload = await self.bodies.read(request, shapes.ChatCompletionRequest)
        return await self._completion(request, payload, body, "/v1/chat/completions")

    async def completions(self, request: Request) -> Response:
        body, payload = await self.bodies.read(request, shapes.CompletionRequest)
        return await self._completion(request, payload, body, "/v1/completions")

    async def _completion(self, request: Request, payload: dict[str, Any], body: bytes, path: str) -> Response:
        changed = self._route_model(payload)
        changed |= strip_billing_header(payload)
        target = self._target()
        claim = self._claim(request, payload)
        changed |= self._mark_long(target, claim, payload)
        prompt = self._prompt(target, payload)
        fixed = await self._fit_chat(target, payload, prompt)
        stream = payload.get("stream") is True
        filters: list[ChunkFilter] = []
        if stream:
            wants_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            synth = wants_usage and "include_usage" not in target.native
            usage_prompt = (await prompt.tokens() or 0) if synth else None
            if synth or target.reasoning_field:
                filters.append(ChatStreamFixer(mirror=target.reasoning_field, usage_prompt_tokens=usage_prompt))
            if rewriter := self.rt.route.stream_rewriter():
                filters.append(rewriter)
        if changed or fixed:
            body = json.dumps(payload).encode()
        route_rewrite = self.rt.route.rewrite_body
        complete = "openai_shapes" not in target.native

        def rewrite(data: bytes) -> bytes:
            return complete_chat_shape(route_rewrite(data)) if complete else route_rewrite(data)

        async with self._admitted(request, claim) as ticket:
            return await self.rt.engine_client.relay(
                target,
                path,
                body,
                stream=stream,
                rewrite_body=rewrite,
                chunk_filter=chained(filters),
                on_close=ticket.hand_over(),
            )

    async def _passthrough(
        self, request: Request, dialect: Dialect, target: EngineTarget, payload: dict[str, Any], body: bytes | None
    ) -> Response:
        """The engine speaks this API itself: forward the request (re-encoded only if it changed)."""
        claim = self._claim(request, payload)
        if self._mark_long(target, claim, payload):
            body = None
        async with self._admitted(request, claim) as ticket:
            return await self.rt.engine_client.relay(
                target,
                dialect.path,
                body if body is not None else json.dumps(payload).encode(),
                stream=payload.get("stream") is True,
                rewrite_body=self.rt.route.rewrite_body,
                on_close=ticket.hand_over(),
                errors=dialect.errors,
                error_event=dialect.failed_event,
            )

    # -- Responses (Codex) and Messages (Claude Code) ---------------------------------------------
    async def responses(self, request: Request) -> Response:
        return await self._agent_api(RESPONSES, request)

    async def messages(self, request: Request) -> Response:
        return await self._agent_api(MESSAGES, request)

    async def _agent_api(self, dialect: Dialect, request: Request) -> Response:
        body, payload = await self.bodies.read(request, dialect.shape)
        changed = self._route_model(payload)
        changed |= strip_billing_header(payload)  # before passing through or translating: one prefix for both
        target = self._target()
        if dialect.native in target.native:
            changed |= dialect.for_native(payload)
            return await self._passthrough(request, dialect, target, payload, body if not changed else None)
        return await self._translate(request, dialect, target, payload)

    async def _translate(
        self, request: Request, dialect: Dialect, target: EngineTarget, payload: dict[str, Any]
    ) -> Response:
        """Ask the engine in chat completions and answer in the dialect: one reply, or a stream of its
        events (usage synthesized when the engine ignores include_usage). An engine's refusal comes
        back in the dialect's error shape."""
        fronted = self.rt.route.fronted
        chat = dialect.to_chat(payload, self.rt.route.served)
        claim = self._claim(request, payload)  # the client's own request: its session fields, as it sent them
        self._mark_long(target, claim, chat)
        prompt = self._prompt(target, chat)
        await self._fit_chat(target, chat, prompt)
        async with self._admitted(request, claim) as ticket:
            if not chat["stream"]:
                status, answer = await self.rt.engine_client.post_json(target, "/v1/chat/completions", chat)
                if status == 200 and not _is_chat_completion(answer):
                    status, answer = 502, {"error": {"message": "the backend answered 200 without a chat completion"}}
                if status != 200:
                    return dialect.errors.engine_error(status, answer, target.context_length)
                usage_tally.report(answer.get("usage"))
                return _translated_reply(dialect, answer, payload, fronted)
            usage: ChunkFilter | None = None
            if "include_usage" not in target.native:  # the usage chunk the engine will not send is written from it
                usage = ChatStreamFixer(mirror=None, usage_prompt_tokens=await prompt.tokens() or 0)
            # the stream's start says the prompt's size: counted while the engine already works on the request
            counting = self._count_beside(prompt) if dialect.prompt_at_start else None
            tokens = None
            try:
                failed, chunks = await self.rt.engine_client.chat_stream(target, json.dumps(chat).encode(), usage)
                if counting is not None:
                    tokens = await counting
            finally:
                if counting is not None:
                    counting.cancel()
            if failed is not None:
                return dialect.errors.engine_error(*failed, target.context_length)
            events = dialect.events(chunks, payload, fronted, tokens or 0)
            return translated_stream(events, ticket.hand_over(), dialect.errors, dialect.failed_event)

    async def count_tokens(self, request: Request) -> Response:
        body, payload = await self.bodies.read(request, shapes.CountTokensRequest)
        changed = self._route_model(payload)
        changed |= strip_billing_header(payload)  # counted as the engine will see the prompt
        target = self._target()
        if "messages" in target.native:
            body = json.dumps(payload).encode() if changed else body
            return await self.rt.engine_client.relay(
                target, "/v1/messages/count_tokens", body, stream=False, rewrite_body=lambda b: b
            )
        chat = messages_api.to_chat({**payload, "stream": False}, self.rt.route.served)
        counted = await self._prompt(target, chat).tokens()
        tokens = counted if counted is not None else len(messages_api.prompt_text(payload)) // 4
        return JSONResponse({"input_tokens": tokens})
