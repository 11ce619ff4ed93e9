"""Pure translation and stream-fixing functions: Responses/Messages ↔ chat, usage chunk, reasoning twin."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.serving.dialects import messages_api, responses_api
from gateway.serving.dialects.chat_fixups import (
    ChatStreamFixer,
    clamp_output,
    complete_chat_shape,
    map_max_completion_tokens,
)
from gateway.serving.wire.error_shapes import ApiError, anthropic_message
from gateway.serving.wire.sse import DONE, chat_chunks


def test_responses_input_becomes_chat_messages_with_tools_flattened() -> None:
    body = {
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "reasoning", "summary": []},
        ],
        "tools": [
            {"type": "namespace", "name": "fs", "tools": [{"type": "function", "name": "ls", "parameters": {}}]},
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "function", "name": "ls"},
        "max_output_tokens": 50,
        "stream": True,
    }
    chat = responses_api.to_chat(body, "served")
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "system", "user", "assistant", "tool"]
    assert chat["messages"][3]["tool_calls"][0]["function"]["name"] == "ls"
    assert chat["messages"][4] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
    assert [t["function"]["name"] for t in chat["tools"]] == ["ls"]  # namespace flattened, web_search dropped
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "ls"}}
    assert chat["max_tokens"] == 50 and chat["stream_options"] == {"include_usage": True}


def test_messages_become_chat_with_tool_results() -> None:
    body = {
        "system": [{"type": "text", "text": "sys"}],
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"p": 1}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}]}],
            },
        ],
        "tools": [
            {"name": "ls", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "tool_choice": {"type": "any"},
    }
    chat = messages_api.to_chat(body, "served")
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert json.loads(chat["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {"p": 1}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "ok"}
    assert [t["function"]["name"] for t in chat["tools"]] == ["ls"] and chat["tool_choice"] == "required"


def test_context_overflow_is_worded_for_claude_code() -> None:
    message = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9010 tokens."
    assert anthropic_message(message) == "prompt is too long: 9010 tokens > 8192 maximum"


def _sse(*payloads: Any) -> bytes:
    return b"".join(b"data: " + (b"[DONE]" if p is DONE else json.dumps(p).encode()) + b"\n\n" for p in payloads)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_usage_chunk_is_synthesized_once_before_done_across_split_reads() -> None:
    stream = _sse(_chunk({"content": "a"}), _chunk({"content": "b"}), _chunk({}, "stop"), DONE)
    fixer = ChatStreamFixer(mirror=None, usage_prompt_tokens=12)
    out = b"".join(fixer.feed(stream[i : i + 5]) for i in range(0, len(stream), 5)) + fixer.flush()
    events = [e for e in out.split(b"\n\n") if e]
    usage = json.loads(events[-2][6:])
    assert events[-1] == b"data: [DONE]"
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 2,
        "total_tokens": 14,
    }


def test_reasoning_gets_its_twin_and_untouched_events_keep_their_bytes() -> None:
    plain = _sse(_chunk({"content": "x"}))
    fixer = ChatStreamFixer(mirror="reasoning", usage_prompt_tokens=None)
    assert fixer.feed(plain) == plain
    out = fixer.feed(_sse(_chunk({"reasoning": "think"})))
    delta = json.loads(out[6:])["choices"][0]["delta"]
    assert delta == {"reasoning": "think", "reasoning_content": "think"}


def test_max_completion_tokens_and_clamping() -> None:
    payload: dict[str, Any] = {"max_completion_tokens": 100}
    assert map_max_completion_tokens(payload) and payload == {"max_tokens": 100}
    payload = {"max_tokens": 32000}
    assert clamp_output(payload, prompt_tokens=1000, context=8192) and payload["max_tokens"] == 7192
    with pytest.raises(ApiError) as raised:
        clamp_output({"max_tokens": 10}, prompt_tokens=9000, context=8192)
    assert raised.value.code == "context_length_exceeded" and "maximum context length is 8192" in raised.value.message


def test_chat_completion_shape_is_completed() -> None:
    body = json.dumps({"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "x"}}]})
    out = json.loads(complete_chat_shape(body.encode()))
    assert out["choices"][0]["logprobs"] is None
    assert out["choices"][0]["message"]["refusal"] is None and out["choices"][0]["message"]["annotations"] == []


async def _collect(events: AsyncIterator[bytes]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    async for block in events:
        name, data = block.decode().split("\n", 1)
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def _chunks(raw: bytes) -> AsyncIterator[Any]:
    async def reads() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 9):
            yield raw[i : i + 9]

    async for chunk in chat_chunks(reads()):
        yield chunk


def test_a_streamed_tool_call_becomes_responses_events() -> None:
    raw = _sse(
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_1", "type": "function", "function": {"name": "ls", "arguments": ""}}
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "tool_calls"),
        DONE,
    )
    events = asyncio.run(_collect(responses_api.stream_from_chat(_chunks(raw), {"input": "x"}, "m")))
    names = [name for name, _ in events]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert names.count("response.function_call_arguments.delta") == 2
    final = events[-1][1]["response"]["output"][0]
    assert final["type"] == "function_call" and final["call_id"] == "call_1" and final["arguments"] == '{"a":1}'
    assert [payload["sequence_number"] for _, payload in events] == list(range(len(events)))


def test_a_streamed_answer_becomes_messages_events() -> None:
    raw = _sse(_chunk({"reasoning_content": "hmm"}), _chunk({"content": "Hi"}), _chunk({}, "length"), DONE)
    events = asyncio.run(_collect(messages_api.stream_from_chat(_chunks(raw), "m", input_tokens=5)))
    names = [name for name, _ in events]
    assert names == [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert events[1][1]["content_block"]["type"] == "thinking" and events[4][1]["content_block"]["type"] == "text"
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_a_tool_call_that_ends_with_stop_is_still_tool_use_for_claude_code() -> None:
    """Some engines finish a tool call with "stop"; Claude Code runs tools only on stop_reason tool_use."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    raw = _sse(_chunk({"tool_calls": [call]}), _chunk({}, "stop"), DONE)
    events = asyncio.run(_collect(messages_api.stream_from_chat(_chunks(raw), "m", input_tokens=5)))
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    answer = {
        "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}, "finish_reason": "stop"}]
    }
    assert messages_api.from_chat(answer, "m")["stop_reason"] == "tool_use"
    plain = {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    assert messages_api.from_chat(plain, "m")["stop_reason"] == "end_turn"


def test_reasoning_resent_on_a_tool_turn_goes_back_to_the_engine_as_reasoning_content() -> None:
    """What the model reasoned before a call comes back in the next request as a thinking block (Claude
    Code) or a reasoning item (Codex); the engine gets it on that assistant turn, so a template that keeps
    reasoning on tool turns renders the prompt it generated (and holds in its cache)."""
    call = {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}
    claude = {
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "list it", "signature": ""}, call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]},
        ],
    }
    assistant = messages_api.to_chat(claude, "served")["messages"][1]
    assert assistant["reasoning_content"] == "list it" and assistant["tool_calls"][0]["id"] == "t1"
    codex = {
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "list it"}]},
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "say so"}], "encrypted_content": "x"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a.txt"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "only encrypted"},
        ]
    }
    messages = responses_api.to_chat(codex, "served")["messages"]
    assert [(m["role"], m.get("reasoning_content")) for m in messages] == [
        ("user", None), ("assistant", "list it"), ("tool", None), ("assistant", "say so"),
    ]  # fmt: skip


def test_a_system_message_after_the_first_answer_joins_the_next_user_turn_not_the_top() -> None:
    """Claude Code's opening system message (agent types) joins the leading system prompt; one that comes
    later joins the next user turn, so the prompt the engine has cached keeps its first tokens."""
    body = {
        "system": "sys",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "agents"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": [{"type": "text", "text": "new skill"}]},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "done"},
            {"role": "system", "content": "date changed"},
        ],
    }
    messages = messages_api.to_chat(body, "served")["messages"]
    assert messages == [
        {"role": "system", "content": "sys\n\nagents"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "new skill\n\ngo"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "date changed"},
    ]
