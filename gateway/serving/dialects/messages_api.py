"""Anthropic Messages API (what Claude Code speaks) translated to and from chat completions.

Used when the live backend has no `/v1/messages` of its own (llama-cpp-python). Errors on these
routes are Anthropic-shaped (written by ``gateway.serving.wire.error_shapes.ANTHROPIC``).

A stream is translated in three parts: ``chat_stream`` reads the chat chunks as typed events;
``_Message`` holds the only stream state and the dialect's rules (which block is open, its number,
how the message ends); the builders after it (``_message_start``, ``_block_delta``, …) only say what
each event is called and carries.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.serving.dialects.chat_stream import (
    ChatEvent,
    Finish,
    ReasoningDelta,
    StreamError,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallStarted,
    read_chat_stream,
)
from gateway.serving.wire.error_shapes import ApiError, anthropic_message
from gateway.serving.wire.sse import event
from gateway.serving.wire.usage import cached_tokens, completion_tokens, prompt_tokens

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    raise ApiError(400, "message content must be a string or an array of content blocks", param="messages")


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return json.dumps(content)


def to_chat(body: dict[str, Any], served: str) -> dict[str, Any]:
    """A chat-completions request carrying the same conversation, tools and limits."""
    chat: dict[str, Any] = {"model": served, "messages": _chat_messages(body), "stream": bool(body.get("stream"))}
    chat["max_tokens"] = body.get("max_tokens")
    for key, target in (("temperature", "temperature"), ("top_p", "top_p"), ("stop_sequences", "stop")):
        if body.get(key) is not None:
            chat[target] = body[key]
    if tools := _chat_tools(body.get("tools")):
        chat["tools"] = tools
        if choice := _chat_tool_choice(body.get("tool_choice")):
            chat["tool_choice"] = choice
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    return chat


def _chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation in chat's roles: the system prompt first, then each turn (a user turn's tool
    results as tool messages before its text)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    instructions = [system if isinstance(system, str) else "".join(b.get("text", "") for b in _blocks(system or []))]
    later: list[str] = []  # system messages after the model's first answer, for the next user turn
    for message in body["messages"]:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise ApiError(400, "each message needs role 'user', 'assistant' or 'system'", param="messages")
        blocks = _blocks(message.get("content"))
        if message["role"] == "system":
            # Claude Code's mid-conversation system message (its agent types and skills, after the prompt)
            # joins the leading one, as vLLM does for templates that want system first: most open models'
            # templates (Qwen3, Gemma, Llama 3) refuse a system turn after the first, and a chat that ends on
            # one leaves a small model continuing it instead of answering (measured: 9 of 10 answers ran to
            # the output limit with it last; folded in, two tries stopped after 12 and 16 tokens). One that
            # comes after the model has answered joins the next user turn instead: moved to the top it would
            # change the prompt's first tokens, and the engine would prefill the whole conversation again.
            text = "".join(str(b.get("text", "")) for b in blocks)
            (later if any(m["role"] == "assistant" for m in messages) else instructions).append(text)
        elif message["role"] == "assistant":
            messages.append(_assistant_message(blocks))
        else:
            messages += _tool_messages(blocks)
            text_parts = [str(block.get("text", "")) for block in blocks if block.get("type") == "text"]
            if text_parts or later:
                parts = [*later, "".join(text_parts)] if text_parts else later
                messages.append({"role": "user", "content": "\n\n".join(parts)})
                later = []
    if later:
        messages.append({"role": "user", "content": "\n\n".join(later)})
    if leading := "\n\n".join(text for text in instructions if text):
        messages.insert(0, {"role": "system", "content": leading})
    return messages


def _assistant_message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's turn: its text, its reasoning and its tool calls."""
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})},
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    # the model's reasoning, resent as a thinking block, goes back as the engine gave it: templates
    # that render it on tool turns then rebuild the prompt the engine already holds in its cache
    thought = "".join(str(b.get("thinking", "")) for b in blocks if b.get("type") == "thinking")
    if thought:
        entry["reasoning_content"] = thought
    if calls:
        entry["tool_calls"] = calls
    return entry


def _tool_messages(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn's tool results, one tool message each, in order."""
    return [
        {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": _result_text(block.get("content"))}
        for block in blocks
        if block.get("type") == "tool_result"
    ]


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    """The client's own tools as chat functions; server tools (web_search…) are dropped."""
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]},
        }
        for t in tools or []
        if isinstance(t, dict) and "name" in t and "input_schema" in t
    ]


def _chat_tool_choice(choice: Any) -> dict[str, Any] | str | None:
    """Anthropic's tool_choice in chat's words (None: left to the engine's default)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")


def usage_block(prompt: int, output_tokens: int, cached: int = 0) -> dict[str, Any]:
    """Anthropic's usage object for a prompt of ``prompt`` tokens, ``cached`` of them reused by the engine.

    Anthropic counts a cache read apart from the input: ``input_tokens`` is the uncached rest, and an
    agent's context meter adds ``cache_read_input_tokens`` back (Claude Code's does), so the meter stays
    right and the cache shows. Cache writes are not counted apart (the engine caches every prompt)."""
    cached = min(cached, prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "output_tokens_details": {"thinking_tokens": 0},
        "server_tool_use": {"web_fetch_requests": 0, "web_search_requests": 0},
        "inference_geo": None,
        "service_tier": "standard",
    }


def stop_reason(finish_reason: str | None, *, has_tool_use: bool) -> str:
    """Anthropic's stop reason. Tool calls decide it whatever the engine's finish reason says: some
    engines end a tool call with "stop", and Claude Code runs tools only on "tool_use"."""
    if has_tool_use and finish_reason != "length":
        return "tool_use"
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


def from_chat(chat: dict[str, Any], model: str) -> dict[str, Any]:
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if thought := message.get("reasoning_content") or message.get("reasoning"):
        content.append({"type": "thinking", "thinking": thought, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"], "citations": None})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "caller": {"type": "direct"},
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{uuid.uuid4().hex}",
                "name": function.get("name"),
                "input": _parse_arguments(function.get("arguments")),
            }
        )
    usage = chat.get("usage") or {}
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason"), has_tool_use=bool(message.get("tool_calls"))),
        "stop_sequence": None,
        "stop_details": None,
        "container": None,
        "usage": usage_block(prompt_tokens(usage), completion_tokens(usage), cached_tokens(usage)),
    }


def _parse_arguments(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {"_raw": arguments}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


# A tool call's arguments after its block stopped (text came between): a Messages stream cannot carry them
INTERLEAVED = "the backend sent a tool call's arguments after other content began, which a Messages stream cannot carry"


class _Message:
    """A message as it streams, and the rules of its blocks, numbered in order: thinking and text
    continue the open block of their kind or open the next (stopping every open block); a tool call opens
    its own, and its argument pieces go to it.

    A tool block stops when the next call begins if its arguments are whole JSON by then (the usual case:
    an engine streams one call after the other); else it stays open beside the next, because the engine
    interleaves the calls' pieces, and stops when it is whole or at the end. Before, such a block got
    deltas after its ``content_block_stop``, which agents drop (they act on a block once it stops)."""

    def __init__(self, input_tokens: int) -> None:
        self.input_tokens = input_tokens  # the gateway's count of the prompt, for an engine that gives none
        self.index = -1  # the last block opened
        self.text: str | None = None  # the open thinking or text block's kind (it is the last opened)
        self.calls: dict[int, list[str]] = {}  # open tool blocks' index → their argument pieces so far
        self.tools: dict[int, int] = {}  # chat tool-call index → its block's index
        self.failed = False  # an error event was sent: nothing may follow it

    def take(self, got: ChatEvent) -> list[bytes]:
        if isinstance(got, StreamError):
            self.failed = True
            return [_error(got.message)]
        if isinstance(got, ReasoningDelta | TextDelta):
            kind = "text" if isinstance(got, TextDelta) else "thinking"
            out = [] if self.text == kind else self._start(_EMPTY_BLOCKS[kind], close_calls=True)
            self.text = kind
            return [*out, _block_delta(self.index, kind, got.text)]
        if isinstance(got, ToolCallStarted):
            out = self._start(_tool_use(got), close_calls=False)
            self.tools[got.index], self.calls[self.index] = self.index, []
            return out
        if isinstance(got, ToolArgumentsDelta):
            block = self.tools[got.index]
            if block not in self.calls:  # its block has stopped
                self.failed = True
                return [*self._stop_all(), _error(INTERLEAVED)]
            self.calls[block].append(got.arguments)
            return [_block_delta(block, "tool_use", got.arguments)]
        if isinstance(got, Finish):
            return [*self._stop_all(), _message_delta(got, self.input_tokens, has_tool_use=bool(self.tools)), _STOP]
        return []  # a tool call's end (the stream's): its block stops with the others at the finish

    def _start(self, block: dict[str, Any], *, close_calls: bool) -> list[bytes]:
        """Open the next block: the open text block stops, and the open tool blocks (all of them before
        text; before another call, those whose arguments are whole)."""
        out = self._stop_text()
        for index in list(self.calls):
            if close_calls or _whole_json(self.calls[index]):
                out.append(self._stop(index))
        self.index = self.index + 1
        return [*out, _sent("content_block_start", index=self.index, content_block=block)]

    def _stop_text(self) -> list[bytes]:
        if self.text is None:
            return []
        self.text = None
        return [_sent("content_block_stop", index=self.index)]

    def _stop(self, index: int) -> bytes:
        del self.calls[index]
        return _sent("content_block_stop", index=index)

    def _stop_all(self) -> list[bytes]:
        return [*self._stop_text(), *(self._stop(index) for index in list(self.calls))]


def _whole_json(pieces: list[str]) -> bool:
    """Whether a call's argument pieces so far are a whole JSON value (nothing more can follow)."""
    try:
        json.loads("".join(pieces))  # none yet: not whole (its pieces may still come)
    except (ValueError, RecursionError):
        return False
    return True


async def stream_from_chat(
    chunks: AsyncIterator[dict[str, Any] | object], model: str, input_tokens: int = 0
) -> AsyncIterator[bytes]:
    """message_start, content_block_* per block, message_delta with the stop reason, message_stop."""
    yield _message_start(model, input_tokens)
    message = _Message(input_tokens)
    async for got in read_chat_stream(chunks):
        for step in message.take(got):
            yield step
        if message.failed:
            return


# The Messages stream's words: what each event is called and carries (the rules above decide when).

_EMPTY_BLOCKS: dict[str, dict[str, Any]] = {
    "thinking": {"type": "thinking", "thinking": "", "signature": ""},
    "text": {"type": "text", "text": "", "citations": None},
}
_DELTAS = {  # a block's kind → its delta's type, and the field that carries the piece
    "thinking": ("thinking_delta", "thinking"),
    "text": ("text_delta", "text"),
    "tool_use": ("input_json_delta", "partial_json"),
}


def _sent(name: str, **payload: Any) -> bytes:
    return event(name, {"type": name, **payload})


_STOP = _sent("message_stop")


def _message_start(model: str, input_tokens: int) -> bytes:
    """The message before its content: the gateway's count of the prompt (the engine's comes at the end)."""
    start: dict[str, Any] = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model}
    start |= {"content": [], "stop_reason": None, "stop_sequence": None, "stop_details": None, "container": None}
    return _sent("message_start", message=start | {"usage": usage_block(input_tokens, 0)})


def _tool_use(call: ToolCallStarted) -> dict[str, Any]:
    tool = {"caller": {"type": "direct"}, "type": "tool_use", "id": call.call_id or f"toolu_{uuid.uuid4().hex}"}
    return tool | {"name": call.name, "input": {}}


def _block_delta(index: int, kind: str, piece: str) -> bytes:
    name, field = _DELTAS[kind]
    return _sent("content_block_delta", index=index, delta={"type": name, field: piece})


def _error(message: str) -> bytes:
    return _sent("error", error={"type": "api_error", "message": anthropic_message(message)})


def _message_delta(finish: Finish, input_tokens: int, *, has_tool_use: bool) -> bytes:
    """The stop reason, and the engine's own count of the prompt: Claude Code tracks how full its window is
    from this figure (message_start could only say the gateway's count, and nothing of the cache yet)."""
    usage = finish.usage
    final = usage_block(usage.prompt or input_tokens, usage.completion, usage.cached)
    keys = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    counts = {key: final[key] for key in keys} | {
        "output_tokens_details": {"thinking_tokens": 0},
        "server_tool_use": {"web_fetch_requests": 0, "web_search_requests": 0},
    }
    delta = {"stop_reason": stop_reason(finish.reason, has_tool_use=has_tool_use), "stop_sequence": None}
    return _sent("message_delta", delta=delta, usage=counts)


def prompt_text(body: dict[str, Any]) -> str:
    """Everything count_tokens should count, flattened (tool schemas included)."""
    chat = to_chat({**body, "stream": False}, "")
    parts = [str(m.get("content") or "") for m in chat["messages"]]
    parts += [json.dumps(call) for m in chat["messages"] for call in m.get("tool_calls", [])]
    parts += [json.dumps(tool) for tool in chat.get("tools", [])]
    return "\n".join(parts)
