"""Reasoning an agent resends reaches an engine that speaks its API (vLLM) untouched: a chat
assistant turn's ``reasoning_content``, Claude Code's thinking blocks (with their signatures) and
Codex's reasoning items, also when the gateway rewrote the request (the model renamed, the billing
line stripped), so vLLM's template can rebuild the prompt its prefix cache holds."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from tests.unit.http_harness import SERVED, FakeEngine, make_runtime

BILLING = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.d42; cc_entrypoint=sdk-cli;"}
THINKING = {"type": "thinking", "thinking": "The file is missing; create it.", "signature": "sig-1"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "Write", "input": {"file_path": "a.txt"}}
REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "ls first"}],
}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "ALIAS",
        "messages": [
            {"role": "user", "content": "write a.txt"},
            {"role": "assistant", "content": None, "reasoning_content": "create it", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "write", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    },
    "/v1/messages": {
        "model": "ALIAS",
        "max_tokens": 64,
        "system": [BILLING, {"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": "write a.txt"},
            {"role": "assistant", "content": [THINKING, CALL]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
        ],
    },
    "/v1/responses": {
        "model": "ALIAS",
        "input": [
            {"role": "user", "content": "list files"},
            REASONING,
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        ],
    },
}  # fmt: skip


@pytest.mark.parametrize("path", list(BODIES))
def test_reasoning_an_agent_resends_reaches_vllm_untouched(engine: FakeEngine, engine_url: str, path: str) -> None:
    runtime = make_runtime(engine_url, native=frozenset({"responses", "messages", "include_usage"}))
    with TestClient(create_app(runtime), raise_server_exceptions=False) as client:
        assert client.post(path, json=BODIES[path]).status_code == 200
    sent = engine.requests_to(path)[0]["body"]
    assert sent["model"] == SERVED
    expected = {key: value for key, value in BODIES[path].items() if key != "model"}
    if path == "/v1/messages":  # the billing line is the one thing taken out
        expected["system"] = expected["system"][1:]
    assert {key: value for key, value in sent.items() if key != "model"} == expected
