"""OpenAI Responses API (what Codex speaks) translated to and from chat completions.

Used when the live backend has no `/v1/responses` of its own (llama-cpp-python). Stateless, as the
agents use it (`store: false`): every request carries its whole conversation in `input`.
Codex's `namespace` tools are flattened into function tools, its custom (freeform) tools become
function tools with one string parameter (`custom_tools`); tool types no backend runs (`web_search`,
`local_shell`, `file_search`, …) are dropped, with one warning per request that counts them.

A stream is translated in three parts: ``chat_stream`` reads the chat chunks as typed events;
``_Response`` here holds the only stream state and the dialect's rules (which item is open, when it
closes, in what order the response ends or fails); ``responses_events`` (the items and their events)
and ``_Shell`` (the response object and its own events) are pure builders of what each step carries.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.serving.dialects import custom_tools
from gateway.serving.dialects import responses_events as shapes
from gateway.serving.dialects.chat_stream import (
    ChatEvent,
    ReasoningDelta,
    StreamError,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    Usage,
    read_chat_stream,
)
from gateway.serving.dialects.responses_events import Event
from gateway.serving.wire.error_shapes import ApiError

log = logging.getLogger("gateway.responses")

_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user", "seed", "stop")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict) and "text" in part)
    return ""


def _tools(tools: list[Any], dropped: Counter[str] | None = None) -> list[dict[str, Any]]:
    """The function tools (namespaces flattened); the types no backend runs are counted in ``dropped``."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind == "function":
            function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": function})
        elif kind == "namespace":
            inner_tools = [{**inner, "type": inner.get("type", "function")} for inner in tool.get("tools", [])]
            out += _tools(inner_tools, dropped)
        elif kind == "custom":
            out.append(custom_tools.as_function(tool))
        elif dropped is not None:
            dropped[repr(kind)[:_KIND_SHOWN]] += 1
    return out


def _one_tool_per_name(tools: list[dict[str, Any]]) -> None:
    """A 400 for two tools of one name (a function and a custom tool, or a namespace's tool and another):
    the engine's call names only the tool, so it could not say which was meant."""
    seen: set[str] = set()
    for tool in tools:
        name = tool["function"].get("name")
        if not isinstance(name, str):
            continue
        if name in seen:
            raise ApiError(400, f"two tools are named {name[:64]!r}: give each tool its own name", param="tools")
        seen.add(name)


_KIND_SHOWN = 40  # characters of a dropped tool's type in the warning (the client chose it)
_KINDS_SHOWN = 5  # distinct types named in the warning


def _warn_dropped(dropped: Counter[str]) -> None:
    """One line per request however many tools it drops (99,000 of them wrote 198,001 lines and held
    the event loop for seconds): how many, and the commonest types."""
    if not dropped:
        return
    kinds = ", ".join(f"{kind} x{count}" for kind, count in dropped.most_common(_KINDS_SHOWN))
    if len(dropped) > _KINDS_SHOWN:
        kinds += f" and {len(dropped) - _KINDS_SHOWN} other types"
    log.warning("dropping %d tool(s) no backend runs: %s", dropped.total(), kinds)


def _echo_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the response object lists it (every field the schema requires)."""
    return {
        "type": "function",
        "name": function.get("name", ""),
        "description": function.get("description"),
        "parameters": function.get("parameters"),
        "strict": bool(function.get("strict", False)),
    }


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice if choice in ("auto", "none", "required") else None


def to_chat(body: dict[str, Any], served: str) -> dict[str, Any]:
    """A chat-completions request carrying the same conversation, tools and limits."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):  # a string, or input-text parts (never a Python repr of them)
        messages.append({"role": "system", "content": _text_of(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ApiError(400, "'input' must be a string or an array of items", param="input")
    reasoning = ""  # a reasoning item's text, for the assistant message that follows it
    for item in items:
        if not isinstance(item, dict):
            raise ApiError(400, "every 'input' item must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(str(item.get("role")), str(item.get("role", "user")))
            messages.append({"role": role, "content": _text_of(item.get("content"))})
            if role == "assistant" and reasoning:
                messages[-1]["reasoning_content"], reasoning = reasoning, ""
        elif kind in ("function_call", "custom_tool_call"):
            call = {"id": item.get("call_id"), "type": "function"}
            arguments = item.get("arguments", "")
            if kind == "custom_tool_call":
                arguments = custom_tools.arguments_of(item.get("input"))
            call["function"] = {"name": item.get("name"), "arguments": arguments}
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if reasoning:
                    messages[-1]["reasoning_content"], reasoning = reasoning, ""
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output) or json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            # what the model reasoned before its answer or call (its text, else its summary), returned on
            # that assistant turn as the engine gave it: templates that keep reasoning on tool turns
            # then rebuild the prompt its cache holds (encrypted_content alone carries nothing usable)
            reasoning += _text_of(item.get("content")) or _text_of(item.get("summary"))
        # other history types (web_search_call, ...) carry nothing a chat backend can use
    chat: dict[str, Any] = {"model": served, "messages": messages, "stream": bool(body.get("stream"))}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    dropped: Counter[str] = Counter()
    tools = _tools(body.get("tools") or [], dropped)
    _warn_dropped(dropped)
    _one_tool_per_name(tools)
    if tools:
        chat["tools"] = tools
        if (choice := _tool_choice(body.get("tool_choice"))) is not None:
            chat["tool_choice"] = choice
    chat |= {key: body[key] for key in _PASSED if body.get(key) is not None}
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    return chat


def _usage(usage: Usage) -> dict[str, Any]:
    """Responses' usage: the whole prompt in input_tokens, the part the engine reused from its cache in
    input_tokens_details.cached_tokens (as OpenAI counts it)."""
    return {
        "input_tokens": usage.prompt,
        "input_tokens_details": {"cached_tokens": usage.cached},
        "output_tokens": usage.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt + usage.completion,
    }


_STARTED = ("response.created", "response.in_progress")  # the events that announce the response


@dataclass
class _Shell:
    """The response object's fields that echo the request."""

    request: dict[str, Any]
    model: str
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def build(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, reason: str | None
    ) -> dict[str, Any]:
        r = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status != "in_progress" else None,
            "error": None,
            "incomplete_details": {"reason": reason} if reason else None,
            "instructions": r.get("instructions"),
            "max_output_tokens": r.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": bool(r.get("parallel_tool_calls", True)),
            "previous_response_id": None,
            "reasoning": r.get("reasoning"),
            "store": False,
            "temperature": r.get("temperature") if r.get("temperature") is not None else 1.0,
            "text": r.get("text") or {"format": {"type": "text"}},
            "tool_choice": r.get("tool_choice") or "auto",
            "tools": [_echo_tool(t["function"]) for t in _tools(r.get("tools") or [])],
            "top_p": r.get("top_p") if r.get("top_p") is not None else 1.0,
            "presence_penalty": r.get("presence_penalty") or 0.0,
            "frequency_penalty": r.get("frequency_penalty") or 0.0,
            "top_logprobs": r.get("top_logprobs") or 0,
            "max_tool_calls": r.get("max_tool_calls"),
            "background": False,
            "service_tier": "default",
            "safety_identifier": r.get("safety_identifier"),
            "prompt_cache_key": r.get("prompt_cache_key"),
            "truncation": "disabled",
            "usage": usage,
            "metadata": r.get("metadata") or {},
        }

    def ended(self, output: list[dict[str, Any]], usage: Usage, finish_reason: str | None) -> dict[str, Any]:
        """The response as the engine ended it: incomplete when it ran out of output tokens."""
        status, reason = ("incomplete", "max_output_tokens") if finish_reason == "length" else ("completed", None)
        return self.build(status, output, _usage(usage), reason)

    # the stream's events about the whole response

    def started(self) -> list[Event]:
        return [(name, {"response": self.build("in_progress", [], None, None)}) for name in _STARTED]

    def finished(self, output: list[dict[str, Any]], usage: Usage, finish_reason: str | None) -> Event:
        response = self.ended(output, usage, finish_reason)
        return f"response.{response['status']}", {"response": response}

    def failed(self, output: list[dict[str, Any]], message: str) -> Event:
        response = self.build("failed", output, None, None)
        return "response.failed", {"response": response | {"error": {"code": "server_error", "message": message}}}


def from_chat(chat: dict[str, Any], request: dict[str, Any], model: str) -> dict[str, Any]:
    """A complete Responses object from a complete chat completion."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        output.append(shapes.reasoning_item(f"rs_{uuid.uuid4().hex}", reasoning))
    if message.get("content"):
        output.append(shapes.message_item(f"msg_{uuid.uuid4().hex}", message["content"]))
    custom = custom_tools.names(request.get("tools"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        output.append(shapes.tool_call_item(call.get("id"), function.get("name", ""), arguments, custom))
    return _Shell(request, model).ended(output, Usage.read(chat.get("usage")), choice.get("finish_reason"))


MAX_HELD_CHARS = 32 * 1024 * 1024  # a stream's text and arguments held for its done events (non-streamed: 32 MB)


class _Pieces:
    """An item's text or arguments so far, held compactly: a 1-character delta costs a character, not a
    string object (~50 bytes) for as long as the stream lasts."""

    GROUP = 4096  # pieces joined into one string at a time: each character is copied about twice

    def __init__(self) -> None:
        self.joined: list[str] = []
        self.recent: list[str] = []

    def add(self, piece: str) -> None:
        self.recent.append(piece)
        if len(self.recent) >= self.GROUP:
            self.joined.append("".join(self.recent))
            self.recent.clear()

    def text(self) -> str:
        return "".join(self.joined) + "".join(self.recent)


class _Response:
    """A response as it streams, and the rules of which item is open: text opens a reasoning or message
    item (message text closes the reasoning first); a tool call closes both, and each call closes when
    the stream ends (a chat stream never says sooner); then the response ends, or fails as it stands.

    The dialect repeats each item's whole text in its done events, so the text is held until the item
    closes, up to ``max_held`` characters in all: past that the response fails (``over``) rather than
    growing without bound (300 MB of deltas held 1.27 GB)."""

    def __init__(self, request: dict[str, Any], model: str, max_held: int = MAX_HELD_CHARS) -> None:
        self.shell = _Shell(request, model)
        self.custom = custom_tools.names(request.get("tools"))  # their calls become custom_tool_call items
        self.items: dict[int, dict[str, Any]] = {}  # output index → the item as its last event showed it
        self.pieces: dict[int, _Pieces] = {}  # output index → its text or arguments so far (open items only)
        self.open: dict[str | int, int] = {}  # "reasoning" | "message" | chat tool-call index → output index
        self.max_held, self.held, self.over = max_held, 0, False

    def take(self, got: ChatEvent) -> list[Event]:
        if isinstance(got, StreamError):
            return [self.shell.failed(self.so_far(), got.message)]
        if isinstance(got, ReasoningDelta | TextDelta):
            kind = "message" if isinstance(got, TextDelta) else "reasoning"
            out = self.close("reasoning") if kind == "message" else []
            out += [] if kind in self.open else self._open(kind, shapes.started(kind))
            return out + self._grow(kind, got.text)
        out = self.close("reasoning", "message")
        if isinstance(got, ToolCallStarted):
            call = shapes.tool_call_item(got.call_id, got.name, "", self.custom, "in_progress")
            return out + self._open(got.index, call)
        if isinstance(got, ToolArgumentsDelta):
            return out + self._grow(got.index, got.arguments)
        if isinstance(got, ToolCallFinished):
            return out + self.close(got.index)
        return [*out, self.shell.finished(list(self.items.values()), got.usage, got.reason)]  # the Finish

    def close(self, *keys: str | int) -> list[Event]:
        """The open items named, closed in that order."""
        out: list[Event] = []
        for index in [self.open.pop(key) for key in keys if key in self.open]:
            self.items[index], events = shapes.closed(index, self.items[index], self.pieces.pop(index).text())
            out += events
        return out

    def _open(self, key: str | int, item: dict[str, Any]) -> list[Event]:
        index = self.open[key] = len(self.items)
        self.items[index], self.pieces[index] = item, _Pieces()
        return shapes.opened(index, item)

    def _grow(self, key: str | int, piece: str) -> list[Event]:
        index = self.open[key]
        self.held += len(piece)
        if self.held > self.max_held:
            self.over = True
            self.pieces.clear()  # the failed response shows the items as announced, without their text
            why = f"the answer is longer than the {self.max_held} characters a streamed translation holds"
            return [self.shell.failed(list(self.items.values()), why + "; ask for a shorter answer")]
        self.pieces[index].add(piece)
        return shapes.grown(index, self.items[index], piece)

    def so_far(self) -> list[dict[str, Any]]:
        """The items as they stand (a failed response's output): calls with the arguments that came."""
        held = {i: item for i, item in self.items.items() if "arguments" in item and i in self.pieces}
        calls = {i: {"arguments": self.pieces[i].text()} for i in held}
        return [item | calls.get(i, {}) for i, item in self.items.items()]


async def stream_from_chat(
    chunks: AsyncIterator[dict[str, Any] | object], request: dict[str, Any], model: str, max_held: int = 0
) -> AsyncIterator[bytes]:
    """The Responses events for a streamed chat completion, numbered as sent (two before the engine answers);
    at most ``max_held`` characters of text held for the done events (default :data:`MAX_HELD_CHARS`)."""
    response, number = _Response(request, model, max_held or MAX_HELD_CHARS), itertools.count()
    for step in response.shell.started():
        yield shapes.written(step, next(number))
    async for got in read_chat_stream(chunks):
        for step in response.take(got):
            yield shapes.written(step, next(number))
        if response.over:  # the rest is not read: the upstream closes with this generator
            return
