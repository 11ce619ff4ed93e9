"""The gateway in front of the real llama-cpp-python server and Gemma 270M, through the openai SDK.

The model is a tiny base model: its words are noise, so the tests assert structure (names, chunks,
finish reasons, usage, headers), never text.
"""

from __future__ import annotations

import json
import os
import re

import anthropic
import httpx
import openai
import pytest

from tests.integration.conftest import SERVED_CONTEXT
from tests.integration.gatewayproc import GatewayProcess

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_readiness_went_from_503_to_200(gateway: GatewayProcess) -> None:
    assert gateway.ready_statuses[0] == 503, gateway.ready_statuses
    assert gateway.ready_statuses[-1] == 200
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}


def test_models_lists_fronted_name_aliases_and_the_context_in_effect(gateway: GatewayProcess) -> None:
    body = httpx.get(gateway.url + "/v1/models").json()
    ids = [card["id"] for card in body["data"]]
    assert ids[0] == "gemma-3-270m" and "gemma3-270m" in ids
    assert {card["context_length"] for card in body["data"]} == {SERVED_CONTEXT}
    # ...and it is the context the engine was really started with
    argv = gateway.status()["backend"]["argv"]
    assert argv[argv.index("--n_ctx") + 1] == str(SERVED_CONTEXT)


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gemma-3-270m", messages=MESSAGES, max_tokens=12)  # type: ignore[arg-type]
    assert reply.model == "gemma-3-270m"
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert 0 < reply.usage.completion_tokens <= 12


def test_an_alias_is_served_and_answered_under_the_fronted_name(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="GEMMA3-270M", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert reply.model == "gemma-3-270m"


def test_streaming_chat_arrives_in_several_chunks_and_ends_properly(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gemma-3-270m",
        messages=MESSAGES,
        max_tokens=16,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 3, f"expected a token-by-token stream, got {len(content_chunks)} content chunks"
    assert all(chunk.model == "gemma-3-270m" for chunk in chunks)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals and finals[-1] in ("stop", "length")


def test_raw_stream_is_sse_uncompressed_and_ends_with_done(gateway: GatewayProcess) -> None:
    request = {"model": "gemma-3-270m", "messages": MESSAGES, "max_tokens": 8, "stream": True}
    headers = {"Accept-Encoding": "gzip, br"}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=request, headers=headers, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in r.headers
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["cache-control"] == "no-cache"
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 3


def test_completions_non_streaming_and_streaming(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="gemma-3-270m", prompt="The sea is", max_tokens=6)
    assert reply.model == "gemma-3-270m" and isinstance(reply.choices[0].text, str)
    chunks = list(client.completions.create(model="gemma-3-270m", prompt="The sea is", max_tokens=6, stream=True))
    assert len(chunks) >= 3


def test_status_names_the_backend_and_its_key_is_on_no_command_line(gateway: GatewayProcess) -> None:
    import psutil

    backend = gateway.status()["backend"]
    assert backend["engine"] == "llamacpp" and backend["state"] == "ready"
    argv = backend["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    group = [p for p in psutil.process_iter(["pid", "cmdline"]) if os.getpgid(p.info["pid"]) == backend["pid"]]
    assert len(group) >= 2  # the reaper and the engine
    engine_env = [p.environ() for p in group if "API_KEY" in p.environ() or "LLAMA_API_KEY" in p.environ()]
    key = (engine_env[0].get("LLAMA_API_KEY") or engine_env[0]["API_KEY"]) if engine_env else None
    assert key and key.startswith("gw"), "the engine's key travels in its environment"
    assert not any(key in " ".join(p.info["cmdline"] or []) for p in group), "the key is on a command line"


def test_the_backend_refuses_requests_that_skip_the_gateway(gateway: GatewayProcess) -> None:
    backend_url = gateway.status()["backend"]["url"]
    answer = httpx.post(backend_url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})
    assert answer.status_code == 401


# -- what agents need that llama-cpp-python does not do itself: the gateway does it ------------------

TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def test_streaming_with_include_usage_ends_with_a_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="gemma-3-270m",
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens > 0 and 0 < last.usage.completion_tokens <= 6


def test_max_completion_tokens_is_honoured(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gemma-3-270m", messages=MESSAGES, max_completion_tokens=3)  # type: ignore[arg-type]
    assert reply.usage is not None and reply.usage.completion_tokens <= 3


def test_a_forced_tool_call_comes_back_as_tool_calls(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="gemma-3-270m",
        messages=[{"role": "user", "content": "Read README.md"}],
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "read_file"}},
        max_tokens=64,
    )
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "read_file"  # type: ignore[union-attr]
    assert isinstance(json.loads(calls[0].function.arguments), dict)  # type: ignore[union-attr]


def test_responses_api_through_translation(client: openai.OpenAI) -> None:
    reply = client.responses.create(model="gemma-3-270m", input="Say hello.", max_output_tokens=8, store=False)
    assert reply.model == "gemma-3-270m" and reply.status in ("completed", "incomplete")
    assert isinstance(reply.output_text, str) and reply.usage is not None and reply.usage.input_tokens > 0
    events = list(
        client.responses.create(model="gemma-3-270m", input="Say hello.", max_output_tokens=8, stream=True, store=False)
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert kinds.count("response.output_text.delta") >= 2


def test_messages_api_through_translation(gateway: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
    message = client.messages.create(
        model="gemma-3-270m", max_tokens=8, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert message.model == "gemma-3-270m" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens > 0
    with client.messages.stream(
        model="gemma-3-270m", max_tokens=8, messages=[{"role": "user", "content": "Say hello."}]
    ) as stream:
        kinds = [event.type for event in stream]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    counted = client.messages.count_tokens(model="gemma-3-270m", messages=[{"role": "user", "content": "Say hello."}])
    assert counted.input_tokens > 0


def test_a_forced_tool_use_through_the_messages_translation(gateway: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
    function = TOOL["function"]
    message = client.messages.create(
        model="gemma-3-270m",
        max_tokens=64,
        tools=[
            {"name": function["name"], "description": function["description"], "input_schema": function["parameters"]}
        ],  # type: ignore[index, list-item]
        tool_choice={"type": "tool", "name": "read_file"},
        messages=[{"role": "user", "content": "Read README.md"}],
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses and uses[0].name == "read_file" and isinstance(uses[0].input, dict)
    assert message.stop_reason == "tool_use"


def test_a_prompt_longer_than_the_context_gets_each_dialects_error(gateway: GatewayProcess) -> None:
    long_text = "word " * 9000  # more tokens than the 8192 served
    chat = {"model": "gemma-3-270m", "max_tokens": 4000, "messages": [{"role": "user", "content": long_text}]}
    answer = httpx.post(gateway.url + "/v1/chat/completions", json=chat, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and "maximum context length" in error["message"]
    messages = {"model": "gemma-3-270m", "max_tokens": 4000, "messages": [{"role": "user", "content": long_text}]}
    answer = httpx.post(gateway.url + "/v1/messages", json=messages, timeout=60)
    assert answer.status_code == 400 and answer.json()["type"] == "error"
    assert re.search(r"prompt is too long: \d+ tokens > 8192 maximum", answer.json()["error"]["message"])


def test_an_output_length_that_cannot_fit_is_clamped_not_failed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gemma-3-270m", messages=MESSAGES, max_tokens=100000, stop=["."])
    assert reply.choices[0].finish_reason in ("stop", "length")
