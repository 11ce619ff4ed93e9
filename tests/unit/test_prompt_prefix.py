"""The engine sees one prompt prefix for a conversation, whatever Claude Code's billing line says, and
consecutive turns of every recorded agent (tests/data/agent-requests) reach it as extensions of each
other: the prefix cache can only hold what the gateway leaves byte-stable."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.serving.app import create_app
from gateway.serving.dialects.prompt_prefix import strip_billing_header
from tests.unit.http_harness import FRONTED, FakeEngine, make_runtime

RECORDED = Path(__file__).resolve().parents[1] / "data" / "agent-requests"
ENGINES = {
    "translated": frozenset({"include_usage"}),  # llama-server: the gateway translates Messages and Responses
    "engine-native": frozenset({"include_usage", "responses", "messages"}),  # vLLM: passed through
}
# what Claude Code 2.1.197 sent, and the kinds that differ: a side request's suffix, and cch (2.1.36-2.1.177)
BILLING = (
    "x-anthropic-billing-header: cc_version=2.1.197.d42; cc_entrypoint=sdk-cli;",
    "x-anthropic-billing-header: cc_version=2.1.197.7d4; cc_entrypoint=sdk-cli;",
    "x-anthropic-billing-header: cc_version=2.1.170.ce1; cc_entrypoint=cli; cch=5e1a9;",
)
# consecutive requests of one conversation (the second carries the first's tool call and its result)
TURNS = {
    "claude": ("01-v1-messages", "02-v1-messages"),  # 2.1.328
    "claude-2.1.197": ("02-v1-messages", "03-v1-messages"),
    "cline": ("01-v1-chat-completions", "02-v1-chat-completions"),
    "codex": ("01-v1-responses", "02-v1-responses"),
    "opencode": ("02-v1-chat-completions", "03-v1-chat-completions"),
    "qwen": ("01-v1-chat-completions", "02-v1-chat-completions"),
}
ROUTE = {"messages": "/v1/messages", "responses": "/v1/responses", "chat": "/v1/chat/completions"}


def _recorded(agent: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((RECORDED / agent / f"{name}.json").read_text())["body"]
    return {**body, "model": FRONTED, "stream": False}


def _claude(billing: str | None) -> dict[str, Any]:
    """Claude Code 2.1.197's first request (the release that sent BILLING), with ``billing`` as its first
    system block (None: without one)."""
    body = _recorded("claude-2.1.197", "02-v1-messages")
    rest = [block for block in body["system"] if not block["text"].startswith("x-anthropic-billing-header")]
    body["system"] = ([{"type": "text", "text": billing}] if billing else []) + rest
    return body


def _system_text(billing: str | None) -> str:
    """Claude Code's system prompt as one string, the billing line first (what a chat client forwards)."""
    return "\n".join(([billing] if billing else []) + [block["text"] for block in _claude(None)["system"]])


def _request(route: str, billing: str | None) -> dict[str, Any]:
    claude = _claude(billing)
    if route == "messages":
        return claude
    prompt = _system_text(billing)
    if route == "chat":
        return {
            "model": FRONTED,
            "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "hi"}],
        }
    return {"model": FRONTED, "instructions": prompt, "input": "hi", "max_output_tokens": 64}


def _engine_request(engine: FakeEngine) -> tuple[str, dict[str, Any]]:
    """The one inference request the engine got (token counting aside): (path, body)."""
    seen = [s for s in engine.seen if s["path"] in ("/v1/chat/completions", "/v1/messages", "/v1/responses")]
    assert len(seen) == 1, [s["path"] for s in engine.seen]
    return seen[0]["path"], seen[0]["body"]


def _send(engine: FakeEngine, engine_url: str, native: frozenset[str], path: str, body: dict[str, Any]) -> Any:
    engine.reset()
    runtime = make_runtime(engine_url, native=native, max_body_bytes=8 * 1024 * 1024)
    with TestClient(create_app(runtime), raise_server_exceptions=False) as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.text[:2000]
    return _engine_request(engine)


# -- the billing line ---------------------------------------------------------------------------------
def test_the_line_goes_and_nothing_else_changes() -> None:
    blocks = _claude(BILLING[2])
    strip_billing_header(blocks)
    assert blocks == _claude(None)  # the block went; the cache_control on the next one stayed
    for form in ("system", "instructions"):
        text = {form: _system_text(BILLING[0])}
        assert strip_billing_header(text) and text == {form: _system_text(None)}
    chat = {"messages": [{"role": "developer", "content": [{"type": "text", "text": BILLING[1] + "\nBe brief."}]}]}
    assert strip_billing_header(chat) and chat == {"messages": [{"role": "developer", "content": [
        {"type": "text", "text": "Be brief."}]}]}  # fmt: skip
    alone = {"messages": [{"role": "system", "content": BILLING[1]}, {"role": "user", "content": BILLING[1]}]}
    assert strip_billing_header(alone)  # a system message that held only the line goes; a user's text is theirs
    assert alone == {"messages": [{"role": "user", "content": BILLING[1]}]}
    quoted = {"system": "Never print lines like x-anthropic-billing-header: ...", "messages": []}
    assert not strip_billing_header(quoted)  # only a line that starts with it


@pytest.mark.parametrize("engine_kind", list(ENGINES))
@pytest.mark.parametrize("route", list(ROUTE))
def test_billing_lines_that_differ_reach_the_engine_as_one_prompt(
    engine: FakeEngine, engine_url: str, route: str, engine_kind: str
) -> None:
    """Every variant of the line, on every route, passed through or translated: the engine gets the very
    request it gets when the client sends no billing line at all."""
    without = _send(engine, engine_url, ENGINES[engine_kind], ROUTE[route], _request(route, None))
    assert "x-anthropic-billing-header" not in json.dumps(without)
    for billing in BILLING:
        assert _send(engine, engine_url, ENGINES[engine_kind], ROUTE[route], _request(route, billing)) == without


def test_count_tokens_counts_the_prompt_without_the_line(engine: FakeEngine, engine_url: str) -> None:
    counts = []
    for billing in (None, BILLING[2]):
        body = {key: value for key, value in _claude(billing).items() if key not in ("max_tokens", "stream")}
        engine.reset()
        with TestClient(create_app(make_runtime(engine_url, max_body_bytes=8 << 20))) as client:
            counts.append(client.post("/v1/messages/count_tokens", json=body).json()["input_tokens"])
    assert counts[0] == counts[1] > 0


# -- consecutive turns ---------------------------------------------------------------------------------
def _without_cache_marks(value: Any) -> Any:
    """Anthropic's cache_control marks move to the newest block every turn; no template renders them. A
    content list of one text block renders as its text (Claude Code 2.1.328 sends its mid-conversation
    system message as one marked block, then as a string the next turn; vLLM's Messages route and the
    gateway's translation both make the same text of either)."""
    if isinstance(value, dict):
        content = value.get("content")
        one_block = isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)
        if one_block and set(content[0]) <= {"type", "text", "cache_control"} and content[0].get("type") == "text":
            value = {**value, "content": content[0].get("text")}
        return {key: _without_cache_marks(inner) for key, inner in value.items() if key != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_marks(inner) for inner in value]
    return value


def prompt_sequence(request: dict[str, Any]) -> list[Any]:
    """What a chat template renders, in its order, as comparable parts: the tools, the system fields,
    then each message or input item. One turn's prompt is a prefix of the next's exactly when its
    sequence is a prefix of the next one's."""
    request = _without_cache_marks(request)
    parts: list[Any] = [("tools", request.get("tools")), ("system", request.get("system"))]
    parts.append(("instructions", request.get("instructions")))
    items = request.get("messages") or request.get("input") or []
    return parts + [("item", item) for item in ([items] if isinstance(items, str) else items)]


def diverges_at(first: dict[str, Any], second: dict[str, Any]) -> int | None:
    """Where the second turn's prompt stops extending the first's (None: it extends it whole)."""
    earlier, later = prompt_sequence(first), prompt_sequence(second)
    for index, part in enumerate(earlier):
        if index >= len(later) or later[index] != part:
            return index
    return None


@pytest.mark.parametrize("engine_kind", list(ENGINES))
@pytest.mark.parametrize("agent", list(TURNS))
def test_each_turn_reaches_the_engine_as_an_extension_of_the_one_before(
    engine: FakeEngine, engine_url: str, agent: str, engine_kind: str
) -> None:
    """Nothing the gateway does (translation, renaming, clamping, the billing line) may reorder tools or
    put anything variable into the prompt: turn 2 as the engine gets it starts with turn 1 as it got it."""
    turns = [_recorded(agent, name) for name in TURNS[agent]]
    route = {"claude": "/v1/messages", "codex": "/v1/responses"}.get(agent.split("-")[0], "/v1/chat/completions")
    sent = [_send(engine, engine_url, ENGINES[engine_kind], route, turn) for turn in turns]
    assert sent[0][0] == sent[1][0]
    assert len(prompt_sequence(sent[1][1])) > len(prompt_sequence(sent[0][1]))  # the tool call and its result
    assert diverges_at(sent[0][1], sent[1][1]) is None, agent
    if agent == "claude-2.1.197":  # a turn whose billing line differs is the same prompt
        third = copy.deepcopy(turns[1])
        third["system"][0]["text"] = BILLING[2]
        assert _send(engine, engine_url, ENGINES[engine_kind], route, third) == sent[1]


def test_the_turn_check_sees_a_reordered_tool_list_and_a_timestamp() -> None:
    """The check above can fail: a gateway that reordered tools or stamped the system prompt would
    make consecutive turns diverge at the tools or the system part."""
    first, second = _recorded("qwen", "01-v1-chat-completions"), _recorded("qwen", "02-v1-chat-completions")
    assert diverges_at(first, second) is None
    reordered = {**second, "tools": list(reversed(second["tools"]))}
    assert diverges_at(first, reordered) == 0
    stamped = copy.deepcopy(second)
    stamped["messages"][0]["content"] += "\nCurrent time: 23:01:07"
    assert diverges_at(first, stamped) == 3


@pytest.mark.parametrize("brk", ["\r", "\u2028", "\r\n", "\x85"], ids=["cr", "u2028", "crlf", "nel"])
def test_only_the_billing_line_goes_whatever_line_break_ends_it(brk: str) -> None:
    """Issue 41: a line ended by a CR alone or U+2028 took the rest of the system prompt with it."""
    payload = {"system": f"{BILLING[0]}{brk}You are Claude Code.{brk}Be brief."}
    assert strip_billing_header(payload) and payload["system"] == f"You are Claude Code.{brk}Be brief."


def test_a_billing_line_that_is_the_only_message_leaves_it_empty_not_the_list() -> None:
    payload: dict[str, Any] = {"messages": [{"role": "system", "content": BILLING[0]}]}
    assert strip_billing_header(payload) and payload["messages"] == [{"role": "system", "content": ""}]


def test_list_valued_instructions_reach_the_engine_as_their_text_not_a_python_repr() -> None:
    from gateway.serving.dialects.responses_api import to_chat

    request = {"model": FRONTED, "input": "hi", "instructions": [{"type": "input_text", "text": "Be brief."}]}
    chat = to_chat(request, "served")
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
