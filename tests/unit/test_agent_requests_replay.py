"""Every request recorded from a real agent CLI (tests/data/agent-requests, see its README) replayed
through its route, against an engine that speaks the route's API itself and against one that needs the
translation, streamed as recorded and not: none may be refused (Claude Code's first request was, with
a 400 on its mid-conversation system message)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from tests.unit.http_harness import FRONTED, make_runtime

RECORDED = Path(__file__).resolve().parents[1] / "data" / "agent-requests"
FIXTURES = sorted(RECORDED.glob("*/*.json"))
KEY = "sk-replay"
ENGINES = {
    "translated": frozenset({"include_usage"}),  # llama.cpp: chat completions only
    "engine-native": frozenset({"include_usage", "responses", "messages"}),  # vLLM speaks all three
}
LAST_EVENT = {
    "/v1/chat/completions": "data: [DONE]",
    "/v1/responses": "response.completed",
    "/v1/messages": "message_stop",
}


def _load(path: Path) -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads(path.read_text())
    if isinstance(recorded.get("body"), dict):
        recorded["body"]["model"] = FRONTED  # recorded against a gateway fronting "scripted"
    return recorded


def _headers(recorded: dict[str, Any]) -> dict[str, str]:
    headers = dict(recorded["headers"])
    if recorded["auth"] == "x-api-key":
        headers["x-api-key"] = KEY
    elif recorded["auth"] == "bearer":
        headers["authorization"] = f"Bearer {KEY}"
    return headers


def test_every_agent_was_recorded() -> None:
    agents = {path.parent.name.split("-")[0] for path in FIXTURES}  # claude-2.1.197: the release pinned before
    assert agents == {"aider", "claude", "cline", "codex", "opencode", "qwen"}
    routes = {_load(path)["path"] for path in FIXTURES}
    assert {"/v1/chat/completions", "/v1/responses", "/v1/messages", "/"} <= routes


def test_claude_code_names_its_session_its_subagents_and_their_parents() -> None:
    """Claude Code 2.1.328 sends x-claude-code-session-id on every request of a run, its subagents'
    included; a subagent's requests add x-claude-code-agent-id, and one started by another subagent
    x-claude-code-parent-agent-id (its starter's agent id). The gateway names the session by the first
    (gateway/serving/scheduling/sessions.py): a subagent is its parent's session."""
    from gateway.serving.scheduling.sessions import identify, prompt_units

    run = [_load(path) for path in FIXTURES if path.parent.name == "claude" and _load(path)["run"] == "subagent"]
    sessions = {r["headers"]["x-claude-code-session-id"] for r in run}
    agents = {r["headers"].get("x-claude-code-agent-id") for r in run}
    parents = {
        r["headers"]["x-claude-code-parent-agent-id"] for r in run if "x-claude-code-parent-agent-id" in r["headers"]
    }
    assert len(sessions) == 1 and len(agents - {None}) == 2 and None in agents  # the main loop, two subagents
    assert parents and parents < agents  # the inner subagent names the outer one
    named = {identify(r["headers"], r["body"], prompt_units(r["body"]), None).session for r in run}
    assert len(named) == 1


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("fixture", FIXTURES, ids=[f"{p.parent.name}/{p.stem}" for p in FIXTURES])
def test_a_recorded_agent_request_is_served_on_its_route(engine_url: str, fixture: Path, engine: str) -> None:
    recorded = _load(fixture)
    path = recorded["path"] + (f"?{recorded['query']}" if recorded["query"] else "")
    runtime = make_runtime(engine_url, native=ENGINES[engine], api_keys=(KEY,), max_body_bytes=8 * 1024 * 1024)
    with TestClient(create_app(runtime), raise_server_exceptions=False) as client:
        if recorded["body"] is None:
            answer = client.request(recorded["method"], path, headers=_headers(recorded))
            assert answer.status_code == 200, answer.text
            return
        body = recorded["body"]
        for stream in dict.fromkeys((bool(body.get("stream")), False)):
            payload = {**body, "stream": stream}
            answer = client.request(recorded["method"], path, headers=_headers(recorded), json=payload)
            assert answer.status_code == 200, (stream, answer.text[:2000])
            if recorded["path"] != "/v1/chat/completions" and engine == "engine-native":
                assert f'"engine_path": "{recorded["path"]}"' in answer.text  # passed through (the fake echoes)
            elif stream:
                assert LAST_EVENT[recorded["path"]] in answer.text, answer.text[-2000:]
        if recorded["path"] == "/v1/messages":
            counted = client.post(
                "/v1/messages/count_tokens" + path.removeprefix("/v1/messages"),
                headers=_headers(recorded),
                json={key: value for key, value in body.items() if key not in ("max_tokens", "stream")},
            )
            assert counted.status_code == 200 and counted.json()["input_tokens"] > 0, counted.text
