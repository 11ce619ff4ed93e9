"""What differs between the agent APIs the gateway serves by translation (Responses, Messages): one
:class:`Dialect` value each, so that the routes ask the dialect rather than test which one it is."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gateway.backends.base import Capability
from gateway.serving.dialects import custom_tools, messages_api, responses_api
from gateway.serving.dialects import request_shapes as shapes
from gateway.serving.dialects.responses_events import response_failed_event
from gateway.serving.wire.error_shapes import ANTHROPIC, OPENAI, ApiError, ErrorShape

log = logging.getLogger("gateway.handlers")


@dataclass(frozen=True)
class Dialect:
    """An agent API served by translation to chat completions when the engine does not speak it."""

    native: Capability  # the engine's capability (EngineTarget.native) and its route, /v1/<native>
    shape: type[BaseModel]  # the request fields the gateway reads (gateway.serving.dialects.request_shapes)
    to_chat: Callable[[dict[str, Any], str], dict[str, Any]]  # (request, served name) → chat request
    reply: Callable[[dict[str, Any], dict[str, Any], str], dict[str, Any]]  # (chat answer, request, fronted name)
    events: Callable[[AsyncIterator[Any], dict[str, Any], str, int], AsyncIterator[bytes]]  # + prompt tokens
    errors: ErrorShape
    # a stream that cannot go on ends with this event (None: the error shape's own)
    failed_event: Callable[[ApiError], bytes] | None = None
    # its stream opens by saying the prompt's size (Messages' message_start): counted beside the request
    prompt_at_start: bool = False
    # what a request passed through to an engine that speaks the dialect still needs; True when it changed
    for_native: Callable[[dict[str, Any]], bool] = lambda _payload: False
    # the events its streams open with before the engine's first token (the long-prefill lane waits past them)
    opening_events: frozenset[str] = frozenset()

    @property
    def path(self) -> str:
        return f"/v1/{self.native}"


def _grammars_described(payload: dict[str, Any]) -> bool:
    """Custom tools' grammars put in their descriptions, for an engine that serves Responses itself
    (gateway.serving.dialects.custom_tools); True when any was."""
    described = custom_tools.grammars_described(payload.get("tools"))
    if described:
        shown = ", ".join(repr(name)[:40] for name in described[:5])  # the client's names, bounded
        log.info("custom tool(s) %s: grammar put in the description (free-form input)", shown)
    return bool(described)


RESPONSES = Dialect(
    Capability.RESPONSES,
    shapes.ResponsesRequest,
    responses_api.to_chat,
    responses_api.from_chat,
    lambda chunks, request, model, _prompt: responses_api.stream_from_chat(chunks, request, model),
    OPENAI,
    failed_event=response_failed_event,
    for_native=_grammars_described,
    opening_events=frozenset({"response.created", "response.in_progress"}),
)
MESSAGES = Dialect(
    Capability.MESSAGES,
    shapes.MessagesRequest,
    messages_api.to_chat,
    lambda answer, _request, model: messages_api.from_chat(answer, model),
    lambda chunks, _request, model, prompt: messages_api.stream_from_chat(chunks, model, prompt),
    ANTHROPIC,
    prompt_at_start=True,
    opening_events=frozenset({"message_start", "ping"}),
)
