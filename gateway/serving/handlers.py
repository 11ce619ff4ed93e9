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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.backends.base import Capability, PrefillFirst
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
from gateway.serving.edge.middleware import authenticated_key, record_of
from gateway.serving.edge.readiness import public
from gateway.serving.edge.request_body import BodyReader
from gateway.serving.routing.pool import Placement
from gateway.serving.routing.retry import Attempt, replica_failed, retry_before_first_byte
from gateway.serving.runtime import Runtime, Upstream
from gateway.serving.scheduling.admission import Admission, Claim, Ticket
from gateway.serving.scheduling.sessions import LONG_PREFILL_TOKENS, estimate_beside, identify
from gateway.serving.transport.first_output import FirstOutput
from gateway.serving.transport.long_pin import TAKEN_S, open_when_taken, place_long, place_once
from gateway.serving.transport.outgoing import Outgoing
from gateway.serving.transport.prefill_first import prefill_first
from gateway.serving.transport.prompt_count import PromptCount
from gateway.serving.transport.proxy import ChunkFilter, chained, translated_stream
from gateway.serving.wire import usage_tally
from gateway.serving.wire.error_shapes import ApiError, unavailable
from gateway.serving.wire.reused_cap import ReusedCap, cap_answer, capped_body
from gateway.supervision.lifecycle import EngineTarget, ServedBackend, State

log = logging.getLogger("gateway.handlers")

REPLICA_HEADER = "x-gateway-replica"  # on each answer when several replicas serve: the one that answered
_PLACING: set[asyncio.Task[None]] = set()  # the tasks that open an engine's gate once it holds a long prefill


def _worth_pausing(claim: Claim) -> bool:
    """Whether a long prefill is still long as it is sent (a start it waited for in the lane is held by now:
    then it goes as long prefills do without pausing, into the last slot where that start was left). Decided
    here, not from the prefill's first event: pinned to a slot emptied by llama-server, that event says
    nothing is held (the RAM cache is not consulted), and a prefill paused after a batch or two leaves an
    entry of those tokens in the RAM cache that llama-server's lookup can prefer to a whole conversation
    sharing them (its whole length matches: f_keep 1)."""
    return claim.prefill_now is None or claim.prefill_now() > LONG_PREFILL_TOKENS


def _others(upstream: Upstream) -> Callable[[], int]:
    """The requests that could take a long prefill's place first: the admission's others in the engine, and
    a canary the liveness watch has there."""
    return lambda: upstream.admission.active - 1 + upstream.client.gate.outside


def _placed(task: asyncio.Task[None]) -> None:
    """A long prefill's placing is over: an error in it is logged (its gate opened regardless)."""
    _PLACING.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("watching a long prefill's placement failed (the engine's gate is open again)", exc_info=error)


# What a route sends on the replica a request was placed on: the replica's client, its engine, the slot's
# ticket and what frees the slot and the placement together when the response ends (a stream's close).
Send = Callable[[Upstream, EngineTarget, Ticket, Callable[[], None]], Awaitable[Response]]


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
    if backend.state is State.FAILED and backend.retry_at is not None:  # gave up restarting for now: says when
        return f"is not running ({why})"
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

    def _target(self, backend: ServedBackend | None = None) -> EngineTarget:
        """The engine requests go to while ``backend`` (the runtime's: any replica) serves, else a 503."""
        backend = backend or self.rt.backend
        target = backend.target
        if not backend.ready or target is None:
            raise unavailable(f"the backend for '{self.rt.route.fronted}' {_not_ready(backend)}; retry shortly")
        return target

    async def _claim(
        self, request: Request, payload: Mapping[str, Any], body_bytes: int, *, generates: bool = True
    ) -> tuple[Claim, Placement[Upstream]]:
        """Name the request's session and key, place it on a replica (its session's, its parent's, or the
        least loaded: gateway.serving.routing), and estimate what that engine must prefill of it (what the
        scheduler orders by: gateway.serving.scheduling.sessions); the estimate counts this prompt as sent
        there from now on. A large prompt is fingerprinted beside the event loop. A request that
        ``generates`` nothing (a token count) prefills nothing and is not remembered as sent."""
        units, new_tokens = await estimate_beside(self.rt.prefixes, payload, body_bytes)
        identity = identify(request.headers, payload, units, authenticated_key(request.scope))
        placement = self.rt.pool.route(request.headers, identity.session, units if generates else None)
        known = self.rt.prefixes
        if placement.new_tokens is not None:  # several replicas: the chosen one's estimate (remembered there)
            new_tokens, known = placement.new_tokens, placement.replica.prefixes
        # what it would prefill if it went in now: a start another request is still prefilling is not shared
        now_tokens = known.new_tokens(units, held_only=True) if generates else 0
        if placement.new_tokens is None and generates:
            known.remember(units)
        if not generates:
            new_tokens = 0
        record = record_of(request.scope)
        record.identity, record.prefill_estimate = identity, new_tokens
        # long: it takes the lane, so one that shares a start still being prefilled waits for it to be held
        record.long = now_tokens > LONG_PREFILL_TOKENS
        prefilled = (lambda: known.prefilled(units)) if generates else None
        held_tokens = units.tokens - now_tokens if generates else 0  # the engine holds the rest
        now = (lambda: known.new_tokens(units, held_only=True)) if generates else None
        claim = Claim(identity.key, identity.session, new_tokens, record.long, prefilled, generates, held_tokens, now)
        return claim, placement

    async def _on_replica(
        self, request: Request, claim: Claim, placement: Placement[Upstream], send: Send, outgoing: Outgoing | None
    ) -> Response:
        """``send`` on the request's replica, in one of its slots; a replica that fails before the client
        got a byte (refused, cut, not serving) gets the request sent to another (the session moves with
        it: gateway.serving.routing.retry). With one engine it is sent once, as before. A long prefill's
        ``outgoing`` body gets the fields its engine decides as it is sent (:meth:`_dispatch`)."""
        record = record_of(request.scope)
        answered: list[str] = []

        async def attempt(tried: Attempt[Upstream]) -> Response:
            upstream, placed = tried.replica.upstream, tried.placement
            target = self._target(upstream.backend)
            async with self._admitted(request, claim, upstream.admission) as ticket:
                placed.admitted()
                placing = await self._dispatch(upstream, target, claim, outgoing)

                def close(free: Callable[[], None] = ticket.release) -> None:
                    free()
                    if record.ttft_s is not None:
                        placed.first_output(record.ttft_s)
                    placed.release()

                try:
                    response = await send(upstream, target, ticket, close)
                except BaseException:
                    if placing is not None:  # it never reached the engine, or failed there: the gate opens
                        placing.cancel()
                    raise
                if self.rt.pool.single is None:
                    answered.append(tried.replica.name)
                if not ticket.handed_over:  # answered whole: the slot frees as the block ends
                    placed.release()
                return response

        response = await retry_before_first_byte(self.rt.pool, placement, attempt)
        if answered:  # several replicas: which one answered, for the operator (and the tests)
            response.headers[REPLICA_HEADER] = answered[-1]
        return response

    async def _dispatch(
        self, upstream: Upstream, target: EngineTarget, claim: Claim, outgoing: Outgoing | None
    ) -> asyncio.Task[None] | None:
        """Through the engine's gate; a long prefill is first placed where its engine says (llama-server: its
        last slot, once idle: gateway.serving.transport.long_pin), and the gate stays closed until the engine
        holds it: the task that opens it then. With ``pause_long_prefills`` and an engine that can resume a
        cancelled prefill (``Scheduling.prefill_first``), the prompt is prefilled ahead instead, paused while
        warm turns run (:meth:`_prefill_ahead`)."""
        pin, first = target.scheduling.long_pin, target.scheduling.prefill_first
        if not claim.long or outgoing is None:
            await upstream.client.gate.passed()
            return None
        if first is not None and self.rt.pause_long_prefills and outgoing.path in first.paths and _worth_pausing(claim):
            await self._prefill_ahead(upstream, target, outgoing, first, claim.held_tokens)
            return None
        if pin is None:
            await upstream.client.gate.passed()
            return None
        fields = await place_long(upstream.client, target, pin, others=_others(upstream), held=claim.held_tokens)
        outgoing.pin(fields)
        if not fields:
            return None
        placing = asyncio.create_task(open_when_taken(upstream.client, target, pin, fields))
        _PLACING.add(placing)
        placing.add_done_callback(_placed)
        return placing

    @staticmethod
    async def _prefill_ahead(
        upstream: Upstream, target: EngineTarget, outgoing: Outgoing, first: PrefillFirst, holds: int
    ) -> None:
        """The long prompt prefilled as the gateway's own request, paused while warm turns run
        (gateway.serving.transport.prefill_first), its first sending placed as a long prefill is (the gate
        closed until its first event; ``holds``: the tokens of it the engine likely holds); the request itself
        then goes unpinned, finds its prompt cached where that prefill left it, and its usage says what was
        cached before."""
        pin, gate = target.scheduling.long_pin, upstream.client.gate
        loop = asyncio.get_running_loop()
        late: list[asyncio.TimerHandle] = []  # an engine that sends no first event: the gate opens anyway

        def held() -> None:
            for timer in late:
                timer.cancel()
            gate.open()

        def placed(fields: Mapping[str, Any] | None) -> Mapping[str, Any]:
            if fields:  # the gate is held for it until its first event, TAKEN_S at most (as open_when_taken)
                late.append(loop.call_later(TAKEN_S, gate.open))
            return fields or {}

        others = _others(upstream)
        fields = placed(await place_long(upstream.client, target, pin, others=others, held=holds) if pin else {})
        if not fields:  # placed nowhere: the gate is not held for it
            await gate.passed()

        primer = pin.primer if pin is not None else None

        async def place_again(done: int) -> Mapping[str, Any]:  # a paused prefill: where it resumes
            return placed(
                await place_once(upstream.client, target, first.path, lambda page: first.resume(page, done), primer)
            )

        try:
            prefilled = await prefill_first(
                upstream.client, target, outgoing.path, outgoing.payload, first, upstream.admission.turns,
                first_fields=fields, on_held=held, place_again=place_again, worth_pausing=LONG_PREFILL_TOKENS,
            )  # fmt: skip
        finally:
            held()
        outgoing.pin({})
        outgoing.reused = prefilled.reused
        upstream.admission.prefilled_ahead += 1
        upstream.admission.prefill_pauses += prefilled.pauses

    @staticmethod
    def _mark_long(target: EngineTarget, claim: Claim, payload: dict[str, Any]) -> bool:
        """A long prefill carries what the engine needs to serve it after short turns (vLLM's priority:
        backends.base.Scheduling; llama-server's slot is decided as it is sent), and every request the
        sampling fields it leaves out that the engine takes no defaults for (Launch.request_defaults); True
        when it changed."""
        fields = target.scheduling.long_fields if claim.long else {}
        payload.update(fields)
        # the model's recommended sampling where the engine has no defaults of its own; a request's own win
        unset = {name: value for name, value in target.request_defaults.items() if payload.get(name) is None}
        payload.update(unset)
        return bool(fields or unset)

    @contextlib.asynccontextmanager
    async def _admitted(self, request: Request, claim: Claim, admission: Admission) -> AsyncIterator[Ticket]:
        """An engine slot for the block (gateway.serving.scheduling.admission: the replica's), with the wait
        noted on the request's record. The long-prefill lane frees at the engine's first output (each route
        watches its stream with ``FirstOutput(ticket.prefilled)``), or with the slot."""
        async with admission.slot(claim) as ticket:
            record_of(request.scope).queued_s = ticket.queued_s
            yield ticket

    def _prompt(self, target: EngineTarget, request: dict[str, Any], placement: Placement[Upstream]) -> PromptCount:
        """The request's prompt tokens, asked of the engine once however many steps need them (the replica
        it was placed on; its replicas share the model, so a count there holds wherever it is sent)."""
        upstream = placement.replica.upstream
        return PromptCount(upstream.client, self._placed_target(target, upstream), request)

    def _placed_target(self, target: EngineTarget, upstream: Upstream) -> EngineTarget:
        """The placed replica's engine while it serves, else ``target`` (any that does)."""
        return upstream.backend.target if upstream.backend.ready and upstream.backend.target else target

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
        if Capability.MAX_COMPLETION_TOKENS not in target.native:
            changed |= map_max_completion_tokens(payload)
        requested = payload.get("max_tokens")
        if not (isinstance(requested, int) and requested > target.context_length // 4):
            return changed
        try:
            counted = await prompt.counted()
        except ApiError as exc:  # its replica failed: sent elsewhere (routing.retry), the engine's verdict decides
            if not replica_failed(exc):
                raise
            counted = None
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
        claim, placement = await self._claim(request, payload, len(body))
        changed |= self._mark_long(target, claim, payload)
        prompt = self._prompt(target, payload, placement)
        fixed = await self._fit_chat(target, payload, prompt)
        stream = payload.get("stream") is True
        wants_usage = stream and bool((payload.get("stream_options") or {}).get("include_usage"))
        outgoing = Outgoing(payload, body, changed=changed or fixed, path=path)
        route_rewrite = self.rt.route.rewrite_body
        complete = Capability.OPENAI_SHAPES not in target.native

        def rewrite(data: bytes) -> bytes:
            if outgoing.reused is not None:  # prefilled ahead: the usage says what was cached before that
                data = capped_body(data, outgoing.reused)
            return complete_chat_shape(route_rewrite(data)) if complete else route_rewrite(data)

        async def send(upstream: Upstream, target: EngineTarget, ticket: Ticket, close: Callable[[], None]) -> Response:
            filters: list[ChunkFilter] = [ReusedCap(outgoing.reused)] if outgoing.reused is not None else []
            if stream:
                synth = wants_usage and Capability.INCLUDE_USAGE not in target.native
                prompt.follow(upstream.client, target)  # counted where it is sent
                usage_prompt = (await prompt.tokens() or 0) if synth else None
                if synth or target.reasoning_field:
                    filters.append(ChatStreamFixer(mirror=target.reasoning_field, usage_prompt_tokens=usage_prompt))
                if rewriter := self.rt.route.stream_rewriter():
                    filters.append(rewriter)
            ticket.hand_over()
            return await upstream.client.relay(
                target,
                path,
                outgoing.body(),
                stream=stream,
                rewrite_body=rewrite,
                chunk_filter=chained(filters),
                on_close=close,
                last_event=b"[DONE]",  # both APIs end a stream with it: one without it was cut short
                watch=FirstOutput(ticket.prefilled),
            )

        return await self._on_replica(request, claim, placement, send, outgoing)

    async def _passthrough(
        self,
        request: Request,
        dialect: Dialect,
        target: EngineTarget,
        payload: dict[str, Any],
        body: bytes,
        changed: bool,
    ) -> Response:
        """The engine speaks this API itself: forward the request (re-encoded only if it changed)."""
        claim, placement = await self._claim(request, payload, len(body))
        changed = self._mark_long(target, claim, payload) or changed
        outgoing = Outgoing(payload, body, changed=changed, path=dialect.path)

        async def send(upstream: Upstream, target: EngineTarget, ticket: Ticket, close: Callable[[], None]) -> Response:
            ticket.hand_over()
            return await upstream.client.relay(
                target,
                dialect.path,
                outgoing.body(),
                stream=payload.get("stream") is True,
                rewrite_body=self.rt.route.rewrite_body,
                on_close=close,
                errors=dialect.errors,
                error_event=dialect.failed_event,
                watch=FirstOutput(ticket.prefilled, dialect.opening_events),
            )

        return await self._on_replica(request, claim, placement, send, outgoing)

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
            return await self._passthrough(request, dialect, target, payload, body, changed)
        return await self._translate(request, dialect, target, payload, len(body))

    async def _translate(
        self, request: Request, dialect: Dialect, target: EngineTarget, payload: dict[str, Any], body_bytes: int
    ) -> Response:
        """Ask the engine in chat completions and answer in the dialect: one reply, or a stream of its
        events (usage synthesized when the engine ignores include_usage). An engine's refusal comes
        back in the dialect's error shape."""
        fronted = self.rt.route.fronted
        chat = dialect.to_chat(payload, self.rt.route.served)
        claim, placement = await self._claim(request, payload, body_bytes)  # the client's own request, as it sent it
        self._mark_long(target, claim, chat)
        prompt = self._prompt(target, chat, placement)
        await self._fit_chat(target, chat, prompt)

        outgoing = Outgoing(chat, path="/v1/chat/completions")

        async def send(upstream: Upstream, target: EngineTarget, ticket: Ticket, close: Callable[[], None]) -> Response:
            client = upstream.client
            prompt.follow(client, target)
            reused = outgoing.reused
            if not chat["stream"]:
                status, answer = await client.post_json(target, "/v1/chat/completions", chat)
                if reused is not None:  # prefilled ahead: the usage says what was cached before that
                    cap_answer(answer, reused)
                if status == 200 and not _is_chat_completion(answer):
                    status, answer = 502, {"error": {"message": "the backend answered 200 without a chat completion"}}
                if status != 200:
                    return dialect.errors.engine_error(status, answer, target.context_length)
                usage_tally.report(answer.get("usage"))
                return _translated_reply(dialect, answer, payload, fronted)
            filters: list[ChunkFilter] = [ReusedCap(reused)] if reused is not None else []
            filters.append(FirstOutput(ticket.prefilled))  # not the dialect's opening event
            if Capability.INCLUDE_USAGE not in target.native:  # the usage chunk the engine will not send: written here
                filters.append(ChatStreamFixer(mirror=None, usage_prompt_tokens=await prompt.tokens() or 0))
            # the stream's start says the prompt's size: counted while the engine already works on the request
            counting = self._count_beside(prompt) if dialect.prompt_at_start else None
            tokens = None
            try:
                failed, chunks = await client.chat_stream(target, json.dumps(chat).encode(), chained(filters))
                if counting is not None:
                    tokens = await counting
            finally:
                if counting is not None:
                    counting.cancel()
            if failed is not None:
                return dialect.errors.engine_error(*failed, target.context_length)
            events = dialect.events(chunks, payload, fronted, tokens or 0)
            ticket.hand_over()
            return translated_stream(events, close, dialect.errors, dialect.failed_event)

        return await self._on_replica(request, claim, placement, send, outgoing)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's tokens, asked of the engine in a slot like any request (a count renders and
        tokenizes the whole prompt: two engine calls on llama-server, /apply-template then /tokenize), so
        that counts cannot reach the engine past a full queue; under its session and key, prefilling nothing."""
        body, payload = await self.bodies.read(request, shapes.CountTokensRequest)
        changed = self._route_model(payload)
        changed |= strip_billing_header(payload)  # counted as the engine will see the prompt
        self._target()
        claim, placement = await self._claim(request, payload, len(body), generates=False)

        async def send(
            upstream: Upstream, target: EngineTarget, _ticket: Ticket, _close: Callable[[], None]
        ) -> Response:
            if Capability.MESSAGES in target.native:
                sent = json.dumps(payload).encode() if changed else body
                return await upstream.client.relay(
                    target, "/v1/messages/count_tokens", sent, stream=False, rewrite_body=lambda b: b
                )
            chat = messages_api.to_chat({**payload, "stream": False}, self.rt.route.served)
            counted = await PromptCount(upstream.client, target, chat).tokens()
            tokens = counted if counted is not None else len(messages_api.prompt_text(payload)) // 4
            return JSONResponse({"input_tokens": tokens})

        return await self._on_replica(request, claim, placement, send, None)
