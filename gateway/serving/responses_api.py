"""OpenAI Responses API (what Codex speaks) translated to and from chat completions.

Used when the live backend has no `/v1/responses` of its own (llama-cpp-python). Stateless, as the
agents use it (`store: false`): every request carries its whole conversation in `input`.
Codex's `namespace` tools are flattened into function tools, its custom (freeform) tools become
function tools with one string parameter (`custom_tools`); tool types no backend runs (`web_search`,
`local_shell`, `file_search`, …) are dropped, with one warning per request that counts them.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.serving import custom_tools
from gateway.serving.chat_stream import (
    Finish,
    ReasoningDelta,
    StreamError,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    Usage,
    read_chat_stream,
)
from gateway.serving.error_shapes import ApiError
from gateway.serving.sse import event

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
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
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


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    )
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _tool_call_item(
    call_id: str, name: str, arguments: str, custom: set[str], status: str = "completed"
) -> dict[str, Any]:
    """The output item of one call the engine made: a function_call, or for one of the request's custom
    (freeform) tools a custom_tool_call carrying its text."""
    if name in custom:
        return custom_tools.call_item(
            f"ctc_{uuid.uuid4().hex}", call_id, name, custom_tools.input_of(arguments), status
        )
    return _call_item(f"fc_{uuid.uuid4().hex}", call_id, name, arguments, status=status)


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def from_chat(chat: dict[str, Any], request: dict[str, Any], model: str) -> dict[str, Any]:
    """A complete Responses object from a complete chat completion."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        output.append(_reasoning_item(f"rs_{uuid.uuid4().hex}", reasoning))
    if message.get("content"):
        output.append(_message_item(f"msg_{uuid.uuid4().hex}", message["content"]))
    custom = custom_tools.names(request.get("tools"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        call_id = call.get("id") or f"call_{uuid.uuid4().hex}"
        output.append(_tool_call_item(call_id, function.get("name", ""), function.get("arguments") or "", custom))
    truncated = choice.get("finish_reason") == "length"
    shell = _Shell(request, model)
    return shell.build(
        "incomplete" if truncated else "completed",
        output,
        _usage(Usage.read(chat.get("usage"))),
        "max_output_tokens" if truncated else None,
    )


class _Writer:
    """Numbers the events of one Responses stream."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, name: str, **payload: Any) -> bytes:
        self.sequence += 1
        return event(name, {"type": name, "sequence_number": self.sequence - 1, **payload})


# an item kind that streams text → the prefix of its events' names, and the fields they add
_TEXTS: dict[str, tuple[str, dict[str, Any]]] = {
    "reasoning": ("response.reasoning_text", {}),
    "message": ("response.output_text", {"logprobs": []}),
}


class _Output:
    """The response's output as it streams: at most one reasoning and one message item open, each closed
    (its done events) when the answer moves on; function calls close when the stream ends."""

    def __init__(self, emit: _Writer, custom: set[str]) -> None:
        self.emit = emit
        self.custom = custom  # custom (freeform) tools: their calls' text is held to the end
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, tuple[int, list[str]]] = {}  # "reasoning" | "message" → (output index, its text)
        self.calls: dict[int, tuple[int, list[str]]] = {}  # chat tool-call index → (output index, arguments)

    def text(self, kind: str, piece: str) -> list[bytes]:
        out = self.close("reasoning") if kind == "message" else []
        out += [] if kind in self.open else self._start(kind)
        index, pieces = self.open[kind]
        pieces.append(piece)
        (name, extra), where = _TEXTS[kind], {"item_id": self.items[index]["id"], "output_index": index}
        return [*out, self.emit(f"{name}.delta", **where, content_index=0, delta=piece, **extra)]

    def call(self, got: ToolCallStarted | ToolArgumentsDelta | ToolCallFinished) -> list[bytes]:
        out = self.close("reasoning", "message")
        if isinstance(got, ToolCallStarted):
            self.calls[got.index] = (len(self.items), [])
            call_id = got.call_id or f"call_{uuid.uuid4().hex}"
            return [*out, self._add(_tool_call_item(call_id, got.name, "", self.custom, status="in_progress"))]
        index, pieces = self.calls[got.index]
        custom = self.items[index]["type"] == "custom_tool_call"
        if isinstance(got, ToolArgumentsDelta):
            pieces.append(got.arguments)
            delta = {"item_id": self.items[index]["id"], "output_index": index, "delta": got.arguments}
            return out if custom else [*out, self.emit("response.function_call_arguments.delta", **delta)]
        if custom:
            text, item = custom_tools.input_of(got.arguments), self.items[index]
            done = custom_tools.call_item(item["id"], item["call_id"], item["name"], text)
            where = {"item_id": done["id"], "output_index": index}
            return [
                *out,
                self.emit("response.custom_tool_call_input.delta", **where, delta=text),
                self.emit("response.custom_tool_call_input.done", **where, input=text),
                self._done(index, done),
            ]
        done = self.items[index] | {"arguments": got.arguments, "status": "completed"}
        whole = {"item_id": done["id"], "output_index": index, "arguments": got.arguments}
        return [*out, self.emit("response.function_call_arguments.done", **whole), self._done(index, done)]

    def close(self, *kinds: str) -> list[bytes]:
        out: list[bytes] = []
        for kind, (index, pieces) in [(kind, self.open.pop(kind)) for kind in kinds if kind in self.open]:
            text, item_id = "".join(pieces), self.items[index]["id"]
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            done = _reasoning_item(item_id, text) if kind == "reasoning" else _message_item(item_id, text)
            out.append(self.emit(f"{_TEXTS[kind][0]}.done", **where, text=text, **_TEXTS[kind][1]))
            if kind == "message":
                out.append(self.emit("response.content_part.done", **where, part=done["content"][0]))
            out.append(self._done(index, done))
        return out

    def _start(self, kind: str) -> list[bytes]:
        self.open[kind] = (len(self.items), [])
        if kind == "reasoning":
            return [self._add({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [], "content": []})]
        item = _message_item(f"msg_{uuid.uuid4().hex}", "", status="in_progress")
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": item["id"], "output_index": len(self.items), "content_index": 0}
        return [self._add(item), self.emit("response.content_part.added", **where, part=part)]

    def _add(self, item: dict[str, Any]) -> bytes:
        self.items.append(item)
        return self.emit("response.output_item.added", output_index=len(self.items) - 1, item=item)

    def _done(self, index: int, item: dict[str, Any]) -> bytes:
        self.items[index] = item
        return self.emit("response.output_item.done", output_index=index, item=item)

    def so_far(self) -> list[dict[str, Any]]:
        """The items as they stand (a failed response's output): calls with the arguments that came."""
        calls = {index: "".join(pieces) for index, pieces in self.calls.values()}
        with_arguments = [i for i in calls if self.items[i]["type"] == "function_call"]
        return [item | {"arguments": calls[i]} if i in with_arguments else item for i, item in enumerate(self.items)]


async def stream_from_chat(
    chunks: AsyncIterator[dict[str, Any] | object], request: dict[str, Any], model: str
) -> AsyncIterator[bytes]:
    """The Responses event sequence for a streamed chat completion, ending with response.completed."""
    shell, emit = _Shell(request, model), _Writer()
    yield emit("response.created", response=shell.build("in_progress", [], None, None))
    yield emit("response.in_progress", response=shell.build("in_progress", [], None, None))
    output = _Output(emit, custom_tools.names(request.get("tools")))
    async for got in read_chat_stream(chunks):
        if isinstance(got, StreamError):
            failed = shell.build("failed", output.so_far(), None, None)
            yield emit("response.failed", response=failed | {"error": {"code": "server_error", "message": got.message}})
            return
        if isinstance(got, ReasoningDelta | TextDelta):
            blocks = output.text("reasoning" if isinstance(got, ReasoningDelta) else "message", got.text)
        elif isinstance(got, Finish):
            blocks = output.close("reasoning", "message")
            status, reason = ("incomplete", "max_output_tokens") if got.reason == "length" else ("completed", None)
            final = shell.build(status, output.items, _usage(got.usage), reason)
            blocks.append(emit(f"response.{status}", response=final))
        else:
            blocks = output.call(got)
        for block in blocks:
            yield block
