"""An agent's ``tool_choice: "auto"`` call comes back structured from the native llama-server, for real.

The model is SmolLM2-135M-Instruct with a Qwen2.5-style ``<tool_call>`` template written into its GGUF
(tests/integration/tools/tool_model.py). llama-server picks its tool-call parser from that template and
turns the model's ``<tool_call>{...}</tool_call>`` into ``tool_calls`` (chat), a ``function_call`` item
(Responses) and a ``tool_use`` block (Messages); the gateway passes the last two straight through.
Nothing forces the call: every request says "auto". The 135M model needs one earlier exchange in the
conversation (a call, its result, an answer) to pick the format up; greedy decoding makes it repeatable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psutil
import pytest

from tests.integration.gatewayproc import GatewayProcess
from tests.integration.tools.tool_model import build_tool_model

pytestmark = pytest.mark.engine

MODEL = "smollm2-135m-tools"  # the GGUF's file name
SYSTEM = "You are a helpful assistant. Call a tool whenever one fits."
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
DESCRIPTION = "Get the current weather in a city"
QUESTION = "What is the weather in Paris?"
REPEATS = 2


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gguf = build_tool_model()
    process = GatewayProcess(
        tmp_path_factory.mktemp("native-tools"),
        "--model", str(gguf), "--llama-launcher", "native", "--context-length", "4096",
    )  # fmt: skip
    with process.serving():
        yield process


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)


# --- the same conversation in each API's shape: one earlier call, its result, an answer; then Paris ---


def chat_messages(paris_result: str | None = None) -> list[Any]:
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the weather in Berlin?"},
        {"role": "assistant", "content": None, "tool_calls": [_chat_call("call_0", "Berlin")]},
        {"role": "tool", "tool_call_id": "call_0", "content": "12 C, cloudy"},
        {"role": "assistant", "content": "It is 12 C and cloudy in Berlin."},
        {"role": "user", "content": QUESTION},
    ]
    if paris_result is not None:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [_chat_call("call_1", "Paris")]},
            {"role": "tool", "tool_call_id": "call_1", "content": paris_result},
        ]
    return messages


def _chat_call(call_id: str, city: str) -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": DESCRIPTION, "parameters": PARAMETERS}}
]


def responses_input(paris_result: str | None = None) -> list[Any]:
    items: list[Any] = [
        {"role": "user", "content": "What is the weather in Berlin?"},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": '{"city": "Berlin"}'},
        {"type": "function_call_output", "call_id": "call_0", "output": "12 C, cloudy"},
        # llama-server needs "type": "message" on an assistant item (400 "Cannot determine type of 'item'"
        # without it, though the Responses API makes it optional)
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 12 C and cloudy in Berlin."}],
        },
        {"role": "user", "content": QUESTION},
    ]
    if paris_result is not None:
        items += [
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": paris_result},
        ]
    return items


RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": DESCRIPTION, "parameters": PARAMETERS}
]


def anthropic_messages(paris_result: str | None = None) -> list[Any]:
    messages: list[Any] = [
        {"role": "user", "content": "What is the weather in Berlin?"},
        {"role": "assistant", "content": [_tool_use("toolu_0", "Berlin")]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "12 C, cloudy"}]},
        {"role": "assistant", "content": "It is 12 C and cloudy in Berlin."},
        {"role": "user", "content": QUESTION},
    ]
    if paris_result is not None:
        messages += [
            {"role": "assistant", "content": [_tool_use("toolu_1", "Paris")]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": paris_result}]},
        ]
    return messages


def _tool_use(tool_id: str, city: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "get_weather", "input": {"city": city}}


ANTHROPIC_TOOLS: list[Any] = [{"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMETERS}]


def _is_paris(arguments: str) -> bool:
    return bool(json.loads(arguments) == {"city": "Paris"})


# The same greedy "auto" request in each API, so every call below differs only in what it is about.
CHAT_REQUEST: dict[str, Any] = {
    "model": MODEL,
    "tools": CHAT_TOOLS,
    "tool_choice": "auto",
    "temperature": 0,
    "seed": 1,
    "max_tokens": 64,
}
RESPONSES_REQUEST: dict[str, Any] = {
    "model": MODEL,
    "instructions": SYSTEM,
    "tools": RESPONSES_TOOLS,
    "tool_choice": "auto",
    "temperature": 0,
    "max_output_tokens": 64,
}
MESSAGES_REQUEST: dict[str, Any] = {
    "model": MODEL,
    "system": SYSTEM,
    "tools": ANTHROPIC_TOOLS,
    "tool_choice": {"type": "auto"},
    "max_tokens": 64,
    "extra_body": {"temperature": 0},  # this SDK has no temperature argument
}


# --- chat completions ---


def test_the_engine_reads_tool_support_from_the_gguf_template(gateway: GatewayProcess) -> None:
    backend = gateway.status()["backend"]
    argv = backend["argv"]
    assert Path(argv[0]).name == "llama-server"
    assert "--jinja" in argv and "--chat-template" not in argv  # the GGUF's own (tool) template
    # the engine's own view of that template, asked around the gateway with the engine's key
    engine = next(p for p in psutil.Process(int(backend["pid"])).children(recursive=True) if "llama-server" in p.name())
    key = engine.environ()["LLAMA_API_KEY"]
    props = httpx.get(backend["url"] + "/props", headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
    caps = props["chat_template_caps"]
    assert caps["supports_tools"] and caps["supports_tool_calls"], caps


@pytest.mark.parametrize("attempt", range(REPEATS))
def test_an_auto_tool_call_is_structured_chat(client: openai.OpenAI, attempt: int) -> None:
    reply = client.chat.completions.create(
        messages=chat_messages(),
        **CHAT_REQUEST,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content  # no "<tool_call>" text left behind
    calls = choice.message.tool_calls
    assert calls and len(calls) == 1
    assert calls[0].type == "function" and calls[0].id
    assert calls[0].function.name == "get_weather" and _is_paris(calls[0].function.arguments)


def test_an_auto_tool_call_is_structured_in_a_chat_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        messages=chat_messages(),
        **CHAT_REQUEST,
        stream=True,
    )
    ids, name, arguments, text, finish = [], "", "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or []:
            assert call.index == 0
            ids += [call.id] if call.id else []
            name += (call.function.name or "") if call.function else ""
            arguments += (call.function.arguments or "") if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and not text.strip()
    assert len(ids) == 1 and name == "get_weather" and _is_paris(arguments)


def test_the_result_sent_back_gets_a_final_answer_chat(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        messages=chat_messages(paris_result="18 C, rainy"),
        **CHAT_REQUEST,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content and "18" in choice.message.content, choice.message.content


# --- Responses (llama-server's own, passed through) ---


def test_an_auto_tool_call_is_a_function_call_item(client: openai.OpenAI) -> None:
    response = client.responses.create(
        input=responses_input(),
        **RESPONSES_REQUEST,
    )
    assert response.status == "completed"
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and not response.output_text, response.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    assert _is_paris(call.arguments)


def test_an_auto_tool_call_in_a_responses_stream(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            input=responses_input(),
            **RESPONSES_REQUEST,
            stream=True,
        )
    )
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert len(done) == 1 and done[0].name == "get_weather" and _is_paris(done[0].arguments)
    final = events[-1].response
    assert [item.type for item in final.output] == ["function_call"]


def test_the_result_sent_back_gets_a_final_answer_responses(client: openai.OpenAI) -> None:
    response = client.responses.create(
        input=responses_input(paris_result="18 C, rainy"),
        **RESPONSES_REQUEST,
    )
    assert not [item for item in response.output if item.type == "function_call"]
    assert "18" in response.output_text, response.output


# --- Messages (llama-server's own, passed through) ---


def test_an_auto_tool_call_is_a_tool_use_block(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        messages=anthropic_messages(),
        **MESSAGES_REQUEST,
    )
    assert message.stop_reason == "tool_use", message
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1 and not [b for b in message.content if b.type == "text" and b.text.strip()]
    assert uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"} and uses[0].id


def test_an_auto_tool_call_in_a_messages_stream(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        messages=anthropic_messages(),
        **MESSAGES_REQUEST,
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert message.stop_reason == "tool_use", message
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"}


def test_the_result_sent_back_gets_a_final_answer_messages(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        messages=anthropic_messages(paris_result="18 C, rainy"),
        **MESSAGES_REQUEST,
    )
    assert message.stop_reason == "end_turn", message
    assert [block.type for block in message.content] == ["text"]
    assert "18" in message.content[0].text  # type: ignore[union-attr]
