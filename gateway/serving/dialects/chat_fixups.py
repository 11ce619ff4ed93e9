"""What agents expect of chat completions that some engines do not do, done by the gateway only then.

- `max_completion_tokens` becomes `max_tokens` for engines that ignore it (llama-cpp-python).
- A requested output length that cannot fit beside the prompt is clamped to what fits, when the engine
  counted the prompt exactly; a prompt that alone overflows the context is refused with OpenAI's
  `context_length_exceeded` error (every other overflow is the engine's verdict, reworded the same way).
- `stream_options.include_usage` gets its final usage chunk (`"choices": []`) when the engine ignores
  the option; token counts then come from the engine's tokenizer (prompt) and the chunks (output).
- Engines emit one of `reasoning` / `reasoning_content`; agents read one or the other: add the twin.
Streams that need none of this are forwarded byte for byte.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.serving.wire.error_shapes import ApiError, overflow_error
from gateway.serving.wire.sse import EventBuffer, EventTooLarge


def clamp_output(payload: dict[str, Any], prompt_tokens: int, context: int) -> bool:
    """Fit `max_tokens` beside the prompt, counted exactly by the engine; True when the payload changed.
    Only for exact counts: an estimate may refuse or shorten an answer that fits (Claude Code's tool
    schemas counted as JSON came to 21,006 tokens where the engine's template made 3,055)."""
    if prompt_tokens >= context:
        raise overflow_error(prompt_tokens, context)
    requested = payload.get("max_tokens")
    room = context - prompt_tokens
    if isinstance(requested, int) and requested > room:
        payload["max_tokens"] = room
        return True
    return False


def map_max_completion_tokens(payload: dict[str, Any]) -> bool:
    if "max_completion_tokens" not in payload:
        return False
    value = payload.pop("max_completion_tokens")
    payload.setdefault("max_tokens", value)
    return True


class ChatStreamFixer:
    """Rewrites a chat-completions SSE stream event by event (only built when something is needed)."""

    def __init__(self, *, mirror: str | None, usage_prompt_tokens: int | None) -> None:
        self.mirror = mirror  # the reasoning field the engine emits, whose twin to add
        self.twin = {"reasoning": "reasoning_content", "reasoning_content": "reasoning"}.get(mirror or "")
        self.usage_prompt_tokens = usage_prompt_tokens  # not None: synthesize the usage chunk
        self.completion_tokens = 0
        self.last: dict[str, Any] = {}
        self.saw_usage = False
        self._events = EventBuffer()

    def feed(self, chunk: bytes) -> bytes:
        """Complete events, rewritten; an event past the size cap ends the stream (an ApiError)."""
        try:
            events = self._events.feed(chunk)
        except EventTooLarge as exc:
            raise ApiError(502, str(exc), code="backend_event_too_large") from None
        return b"".join(self._event(event) for event in events)

    def flush(self) -> bytes:
        rest = self._events.rest()
        return self._event(rest) if rest else b""

    def _event(self, event: bytes) -> bytes:
        body = event.strip()
        if body == b"data: [DONE]":
            return self._usage_chunk() + event
        if not body.startswith(b"data: {"):
            return event
        needs_twin = self.mirror is not None and self.mirror.encode() in body
        if not needs_twin and self.usage_prompt_tokens is None:
            return event
        try:
            payload = json.loads(body[6:])
        except ValueError:
            return event
        choices = payload.get("choices") or [] if isinstance(payload, dict) else None
        if not isinstance(choices, list) or not all(
            isinstance(choice, dict) and isinstance(choice.get("delta") or {}, dict) for choice in choices
        ):  # relayed as it came, this cut the connection mid-stream ("Exception in ASGI application")
            raise ApiError(502, "the backend sent a malformed chat chunk ('choices' or a delta is not an object)")
        self.last = payload
        if payload.get("usage"):
            self.saw_usage = True
        changed = False
        for choice in choices:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls") or delta.get(self.mirror or "", None):
                self.completion_tokens += 1
            if needs_twin and self.twin and self.mirror in delta and self.twin not in delta:
                delta[self.twin] = delta[self.mirror]
                changed = True
        return b"data: " + _encoded(payload, event[6:].strip()) + b"\n\n" if changed else event

    def _usage_chunk(self) -> bytes:
        if self.usage_prompt_tokens is None or self.saw_usage:
            return b""
        prompt, completion = self.usage_prompt_tokens, self.completion_tokens
        chunk = {
            "id": self.last.get("id", "chatcmpl-usage"),
            "object": "chat.completion.chunk",
            "created": self.last.get("created", int(time.time())),
            "model": self.last.get("model", ""),
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def complete_chat_shape(body: bytes) -> bytes:
    """Fill the fields OpenAI's schema requires that some engines leave out of a chat completion
    (`message.refusal`, `message.annotations`, `choice.logprobs`); other bodies pass unchanged."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if not isinstance(payload, dict) or payload.get("object") != "chat.completion":
        return body
    choices = payload.get("choices") or []
    if not (isinstance(choices, list) and all(isinstance(choice, dict) for choice in choices)):
        raise ApiError(502, "the backend's chat completion is malformed ('choices' is not a list of objects)")
    for choice in choices:
        choice.setdefault("logprobs", None)
        message = choice.get("message")
        if isinstance(message, dict):
            message.setdefault("refusal", None)
            message.setdefault("annotations", [])
    return _encoded(payload, body, compact=False)


def _encoded(payload: Any, original: bytes, compact: bool = True) -> bytes:
    """``payload`` as JSON, or the engine's own bytes when it holds a number JSON cannot write back
    (``1e400`` parses to infinity, which ``json.dumps`` writes as ``Infinity``: not JSON)."""
    try:
        return json.dumps(payload, separators=(",", ":") if compact else None, allow_nan=False).encode()
    except ValueError:
        return original
