"""The Responses dialect's words: its output items, and the events that open, grow and close each one.

Pure builders, no stream state: the translator in ``responses_api`` decides which item is open and when
one closes; here is only what each step is called and carries. An item's kind (its ``type``) picks its
events: a reasoning item streams ``reasoning_text``, a message streams ``output_text`` inside one content
part, a function call streams its arguments, and a custom (freeform) tool's call says its text only when
it is whole (its arguments are JSON around that text, unreadable before the end). An event is its name
and payload; the stream adds ``type`` and ``sequence_number`` when it writes it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from gateway.serving.dialects import custom_tools
from gateway.serving.wire.error_shapes import ApiError
from gateway.serving.wire.sse import event

Event = tuple[str, dict[str, Any]]


def written(step: Event, number: int) -> bytes:
    """An event as sent: every Responses event names its type and its place in the stream."""
    name, payload = step
    return event(name, {"type": name, "sequence_number": number, **payload})


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [_text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def tool_call_item(
    call_id: str | None, name: str, arguments: str, custom: set[str], status: str = "completed"
) -> dict[str, Any]:
    """The output item of one call the engine made (with an id of ours if it gave none): a function_call,
    or for one of the request's custom (freeform) tools a custom_tool_call carrying its text."""
    call_id = call_id or f"call_{uuid.uuid4().hex}"
    if name in custom:
        return custom_tools.call_item(
            f"ctc_{uuid.uuid4().hex}", call_id, name, custom_tools.input_of(arguments), status
        )
    item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call_id, "name": name}
    return item | {"arguments": arguments, "status": status}


def started(kind: str) -> dict[str, Any]:
    """A new, empty reasoning or message item, as it is announced before its first piece."""
    if kind == "reasoning":
        return {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [], "content": []}
    return message_item(f"msg_{uuid.uuid4().hex}", "", status="in_progress")


def opened(index: int, item: dict[str, Any]) -> list[Event]:
    """The item announced at its place in the output (a message with its one, empty, text part)."""
    out: list[Event] = [("response.output_item.added", {"output_index": index, "item": item})]
    if item["type"] == "message":
        out.append(("response.content_part.added", _where(index, item, content_index=0, part=_text_part(""))))
    return out


def grown(index: int, item: dict[str, Any], piece: str) -> list[Event]:
    """A piece of the item's text or arguments (none for a custom call until it is whole)."""
    if item["type"] == "reasoning":
        return [("response.reasoning_text.delta", _where(index, item, content_index=0, delta=piece))]
    if item["type"] == "message":
        return [("response.output_text.delta", _where(index, item, content_index=0, delta=piece, logprobs=[]))]
    if item["type"] == "function_call":
        return [("response.function_call_arguments.delta", _where(index, item, delta=piece))]
    return []


def closed(index: int, item: dict[str, Any], whole: str) -> tuple[dict[str, Any], list[Event]]:
    """The item as it ends, and its events: its whole text or arguments, then ``output_item.done``."""
    if item["type"] == "reasoning":
        words = [("response.reasoning_text.done", _where(index, item, content_index=0, text=whole))]
        item = reasoning_item(item["id"], whole)
    elif item["type"] == "message":
        item = message_item(item["id"], whole)
        words = [
            ("response.output_text.done", _where(index, item, content_index=0, text=whole, logprobs=[])),
            ("response.content_part.done", _where(index, item, content_index=0, part=item["content"][0])),
        ]
    elif item["type"] == "function_call":
        words = [("response.function_call_arguments.done", _where(index, item, arguments=whole))]
        item = item | {"arguments": whole, "status": "completed"}
    else:
        text = custom_tools.input_of(whole)
        item = custom_tools.call_item(item["id"], item["call_id"], item["name"], text)
        words = [
            ("response.custom_tool_call_input.delta", _where(index, item, delta=text)),
            ("response.custom_tool_call_input.done", _where(index, item, input=text)),
        ]
    return item, [*words, ("response.output_item.done", {"output_index": index, "item": item})]


def _where(index: int, item: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"item_id": item["id"], "output_index": index, **fields}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_failed_event(error: ApiError) -> bytes:
    """A Responses stream's own failure event (``response.failed``), for a stream that cannot go on:
    Codex reads an unnamed ``data: {"error": …}`` as a broken stream, not as the request's failure."""
    response = {
        "object": "response",
        "status": "failed",
        "output": [],
        "error": {"code": "server_error", "message": error.message},
    }
    data = {"type": "response.failed", "response": response}
    return b"event: response.failed\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
