"""The one reader of streamed chat completions: the engine's SSE bytes, split at odd places, become typed
events every translator shares (gateway/serving/dialects/chat_stream.py); and what the translators make of them
where the old walks differed from the reader's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from gateway.serving.dialects import messages_api, responses_api
from gateway.serving.dialects.chat_stream import (
    ChatEvent,
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
from gateway.serving.wire.sse import DONE, chat_chunks


def _sse(*payloads: Any) -> bytes:
    return b"".join(b"data: " + (b"[DONE]" if p is DONE else json.dumps(p).encode()) + b"\n\n" for p in payloads)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _call(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    """One tool-call entry of a delta: the first names the call, the rest carry argument pieces."""
    entry: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if name is not None:
        entry |= {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return entry


async def _parsed(raw: bytes) -> AsyncIterator[Any]:
    """The bytes as the proxy reads them: in 7-byte pieces that split lines and JSON anywhere."""

    async def reads() -> AsyncIterator[bytes]:
        for start in range(0, len(raw), 7):
            yield raw[start : start + 7]

    async for chunk in chat_chunks(reads()):
        yield chunk


def _read(*payloads: Any) -> list[ChatEvent]:
    async def collect() -> list[ChatEvent]:
        return [got async for got in read_chat_stream(_parsed(_sse(*payloads)))]

    return asyncio.run(collect())


def test_an_empty_stream_is_one_finish_without_a_reason_or_counts() -> None:
    assert _read() == [Finish(None, Usage())]
    assert _read(DONE) == [Finish(None, Usage())]


def test_text_and_reasoning_come_in_the_engines_order_under_either_reasoning_name() -> None:
    events = _read(
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "let me "}),
        _chunk({"reasoning": "think"}),
        _chunk({"content": "Hi"}),
        _chunk({}, "stop"),
        DONE,
    )
    assert events == [
        ReasoningDelta("let me "),
        ReasoningDelta("think"),
        TextDelta("Hi"),
        Finish("stop", Usage()),
    ]


def test_tool_call_arguments_fragmented_across_chunks_are_joined_when_the_stream_ends() -> None:
    pieces = ['{"pa', 'th": "a', "/b.txt", '"}']
    events = _read(
        _chunk({"tool_calls": [_call(0, "", call_id="call_1", name="read_file")]}),
        *(_chunk({"tool_calls": [_call(0, piece)]}) for piece in pieces),
        _chunk({}, "tool_calls"),
        DONE,
    )
    assert events[0] == ToolCallStarted(0, "call_1", "read_file")
    assert events[1:5] == [ToolArgumentsDelta(0, piece) for piece in pieces]
    assert events[5] == ToolCallFinished(0, "call_1", "read_file")
    assert events[6:] == [Finish("tool_calls", Usage())]


def test_several_tool_calls_interleaved_by_index_keep_their_own_arguments() -> None:
    events = _read(
        _chunk({"tool_calls": [_call(0, '{"a"', call_id="c0", name="ls"), _call(1, "", call_id="c1", name="cat")]}),
        _chunk({"tool_calls": [_call(1, '{"b"')]}),
        _chunk({"tool_calls": [_call(0, ": 1}"), _call(1, ": 2}")]}),
        _chunk({"tool_calls": [_call(2, "{}", name="rm")]}, "tool_calls"),  # no id: each dialect makes its own
    )
    started = [got for got in events if isinstance(got, ToolCallStarted)]
    assert started == [ToolCallStarted(0, "c0", "ls"), ToolCallStarted(1, "c1", "cat"), ToolCallStarted(2, None, "rm")]
    deltas = [(got.index, got.arguments) for got in events if isinstance(got, ToolArgumentsDelta)]
    assert deltas == [(0, '{"a"'), (1, '{"b"'), (0, ": 1}"), (1, ": 2}"), (2, "{}")]
    assert events[-4:] == [
        ToolCallFinished(0, "c0", "ls"),
        ToolCallFinished(1, "c1", "cat"),
        ToolCallFinished(2, None, "rm"),
        Finish("tool_calls", Usage()),
    ]


def test_a_usage_only_final_chunk_gives_the_finish_its_counts_with_the_cached_part() -> None:
    usage = {"prompt_tokens": 120, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 96}}
    events = _read(_chunk({"content": "ok"}), _chunk({}, "length"), {"choices": [], "usage": usage}, DONE)
    assert events == [TextDelta("ok"), Finish("length", Usage(prompt=120, completion=7, cached=96))]


def test_an_upstream_error_mid_stream_ends_it_with_the_error_and_nothing_after() -> None:
    events = _read(
        _chunk({"content": "partial"}),
        _chunk({"tool_calls": [_call(0, '{"x', call_id="c0", name="ls")]}),
        {"error": {"message": "the backend stopped in the middle of this stream"}},
        _chunk({"content": "never read"}, "stop"),
    )
    assert events == [
        TextDelta("partial"),
        ToolCallStarted(0, "c0", "ls"),
        ToolArgumentsDelta(0, '{"x'),
        StreamError("the backend stopped in the middle of this stream"),
    ]
    assert _read({"error": "overloaded"}) == [StreamError("overloaded")]  # an engine's bare-string error


def _events(stream: AsyncIterator[bytes]) -> list[tuple[str, dict[str, Any]]]:
    async def collect() -> list[tuple[str, dict[str, Any]]]:
        out = []
        async for block in stream:
            name, data = block.decode().split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
        return out

    return asyncio.run(collect())


def test_each_responses_message_item_holds_only_its_own_text() -> None:
    """Text before and after a tool call are two message items; the second once repeated the first's text
    in its done events and in the completed response."""
    raw = _sse(
        _chunk({"reasoning_content": "first thought"}),
        _chunk({"content": "Looking."}),
        _chunk({"tool_calls": [_call(0, "{}", call_id="c0", name="ls")]}),
        _chunk({"reasoning_content": "second thought"}),
        _chunk({"content": "Done."}, "stop"),
        DONE,
    )
    events = _events(responses_api.stream_from_chat(_parsed(raw), {"input": "x"}, "m"))
    assert [data["text"] for name, data in events if name == "response.output_text.done"] == ["Looking.", "Done."]
    assert [data["text"] for name, data in events if name == "response.reasoning_text.done"] == [
        "first thought",
        "second thought",
    ]
    output = events[-1][1]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "message", "function_call", "reasoning", "message"]
    assert output[4]["content"][0]["text"] == "Done." and output[3]["content"][0]["text"] == "second thought"


def test_a_bare_string_error_mid_stream_is_a_failed_response_with_its_words() -> None:
    """The Responses walk read ``error.get("message")`` and broke on an engine's ``{"error": "..."}``."""
    raw = _sse(_chunk({"content": "par"}), {"error": "overloaded"})
    events = _events(responses_api.stream_from_chat(_parsed(raw), {"input": "x"}, "m"))
    assert events[-1][0] == "response.failed"
    failed = events[-1][1]["response"]
    assert failed["error"] == {"code": "server_error", "message": "overloaded"}
    assert failed["output"][0]["type"] == "message" and failed["output"][0]["status"] == "in_progress"


def test_a_failed_responses_stream_keeps_the_arguments_that_came() -> None:
    raw = _sse(
        _chunk({"tool_calls": [_call(0, '{"pa', call_id="c0", name="ls")]}),
        _chunk({"tool_calls": [_call(0, 'th": "')]}),
        {"error": {"message": "cut"}},
    )
    events = _events(responses_api.stream_from_chat(_parsed(raw), {"input": "x"}, "m"))
    call = events[-1][1]["response"]["output"][0]
    assert call["type"] == "function_call" and call["status"] == "in_progress" and call["arguments"] == '{"path": "'


USAGE = {"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 40}}


def test_interleaved_tool_calls_become_anthropic_blocks_with_their_own_input_pieces() -> None:
    raw = _sse(
        _chunk({"reasoning_content": "two files"}),
        _chunk({"tool_calls": [_call(0, '{"a"', call_id="c0", name="ls"), _call(1, '{"b"', name="cat")]}),
        _chunk({"tool_calls": [_call(0, ": 1}"), _call(1, ": 2}")]}, "tool_calls"),
        {"choices": [], "usage": USAGE},
    )
    events = _events(messages_api.stream_from_chat(_parsed(raw), "m", input_tokens=5))
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [block["type"] for block in starts] == ["thinking", "tool_use", "tool_use"]
    assert starts[1]["id"] == "c0" and starts[2]["id"].startswith("toolu_") and starts[2]["name"] == "cat"
    pieces: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            pieces[data["index"]] = pieces.get(data["index"], "") + data["delta"]["partial_json"]
    assert pieces == {1: '{"a": 1}', 2: '{"b": 2}'}
    final = next(data for name, data in events if name == "message_delta")
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["input_tokens"] == 10 and final["usage"]["cache_read_input_tokens"] == 40


def _stops_after_deltas(events: list[tuple[str, Any]]) -> list[int]:
    """The blocks that got a delta after their content_block_stop (none may)."""
    stopped: set[int] = set()
    late = []
    for name, data in events:
        if name == "content_block_stop":
            stopped.add(data["index"])
        elif name == "content_block_delta" and data["index"] in stopped:
            late.append(data["index"])
    return late


def test_interleaved_tool_calls_get_no_delta_after_their_blocks_stop() -> None:
    """Issue 41: the first call's block stopped when the second began, and its last piece came after."""
    raw = _sse(
        _chunk({"tool_calls": [_call(0, '{"a"', call_id="c0", name="ls"), _call(1, '{"b"', name="cat")]}),
        _chunk({"tool_calls": [_call(0, ": 1}"), _call(1, ": 2}")]}, "tool_calls"),
    )
    events = _events(messages_api.stream_from_chat(_parsed(raw), "m"))
    assert _stops_after_deltas(events) == []
    assert [data["index"] for name, data in events if name == "content_block_stop"] == [0, 1]


def test_sequential_tool_calls_still_stop_as_the_next_begins() -> None:
    raw = _sse(
        _chunk({"tool_calls": [_call(0, '{"a": 1}', call_id="c0", name="ls")]}),
        _chunk({"tool_calls": [_call(1, '{"b": 2}', call_id="c1", name="cat")]}, "tool_calls"),
    )
    names = [(name, data.get("index")) for name, data in _events(messages_api.stream_from_chat(_parsed(raw), "m"))]
    assert names.index(("content_block_stop", 0)) < names.index(("content_block_start", 1))


def test_a_tool_calls_piece_after_text_began_ends_the_stream_with_an_error() -> None:
    raw = _sse(
        _chunk({"tool_calls": [_call(0, '{"a"', call_id="c0", name="ls")]}),
        _chunk({"content": "meanwhile"}),
        _chunk({"tool_calls": [_call(0, ": 1}")]}, "tool_calls"),
    )
    events = _events(messages_api.stream_from_chat(_parsed(raw), "m"))
    assert _stops_after_deltas(events) == [] and events[-1][0] == "error"
