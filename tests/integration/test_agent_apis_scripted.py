"""Agent-style traffic through the gateway against the scripted upstream (a named stand-in for what a
270M model cannot do on cue): tool loops through each API, a crash mid-stream, a slow stream, a
client that leaves, a full queue. The gateway fronts it with `--backend-url`, as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.integration.agent_clis import ToolProcess
from tests.integration.gatewayproc import GatewayProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

TOOLS_DIR = Path(__file__).resolve().parent / "tools"
READ_FILE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


class Upstream(ToolProcess):
    """The scripted upstream, with the file where it writes what it saw (requests, a client gone)."""

    def __init__(self, workdir: Path) -> None:
        handle, events = tempfile.mkstemp(dir=workdir, prefix="upstream-", suffix=".events")
        os.close(handle)
        self.events = Path(events)
        super().__init__("scripted_upstream.py", str(self.events))

    def seen(self, needle: str) -> bool:
        return needle in self.events.read_text()


def _front(workdir: Path, upstream: Upstream, *extra: str) -> GatewayProcess:
    gateway = GatewayProcess(
        workdir, "--backend-url", upstream.url, "--model", "scripted", "--backend-native-apis", "include_usage", *extra
    ).start()
    gateway.wait_ready(timeout_s=60)
    return gateway


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    server = Upstream(tmp_path_factory.mktemp("scripted"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[GatewayProcess]:
    process = _front(tmp_path_factory.mktemp("front"), upstream)
    yield process
    process.stop()
    process.kill()


def _openai(gateway: GatewayProcess, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", timeout=30, **{"max_retries": 0, **kwargs})


def _anthropic(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=30)


CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "read_file", "description": "Read a file", "parameters": READ_FILE_SCHEMA},
    }
]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_tool_loop(gateway: GatewayProcess, stream: bool) -> None:
    client = _openai(gateway)
    messages: list[Any] = [{"role": "user", "content": "CALL_TOOL please"}]
    if stream:
        chunks = list(
            client.chat.completions.create(model="scripted", messages=messages, tools=CHAT_TOOLS, stream=True)
        )  # type: ignore[arg-type]
        deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        assert deltas[0][0].id and deltas[0][0].function.name == "read_file"  # id and name in the first delta only
        arguments = "".join(d[0].function.arguments or "" for d in deltas)
        call_id = deltas[0][0].id
    else:
        reply = client.chat.completions.create(model="scripted", messages=messages, tools=CHAT_TOOLS)  # type: ignore[arg-type]
        call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "read_file"  # type: ignore[union-attr]
        arguments, call_id = call.function.arguments, call.id  # type: ignore[union-attr]
    assert json.loads(arguments) == {"path": "README.md"}
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "# gateway"},
    ]
    final = client.chat.completions.create(model="scripted", messages=messages, tools=CHAT_TOOLS)  # type: ignore[arg-type]
    assert final.choices[0].message.content == "The tool said: # gateway"


RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "read_file", "description": "Read a file", "parameters": READ_FILE_SCHEMA},
    {"type": "web_search"},  # Codex sends it; no backend runs it: dropped with a warning
]


def test_responses_tool_loop_non_streaming(gateway: GatewayProcess) -> None:
    client = _openai(gateway)
    first = client.responses.create(model="scripted", input="CALL_TOOL please", tools=RESPONSES_TOOLS, store=False)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1 and calls[0].name == "read_file"
    assert json.loads(calls[0].arguments) == {"path": "README.md"}
    history: list[Any] = [
        {"role": "user", "content": "CALL_TOOL please"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "read_file", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "# gateway"},
    ]
    second = client.responses.create(model="scripted", input=history, tools=RESPONSES_TOOLS, store=False)
    assert second.output_text == "The tool said: # gateway"
    assert second.usage is not None and second.usage.input_tokens > 0


def test_responses_streaming_has_the_full_event_sequence(gateway: GatewayProcess) -> None:
    client = _openai(gateway)
    namespaced = [
        {
            "type": "namespace",
            "name": "fs",
            "tools": [{"type": "function", "name": "read_file", "parameters": READ_FILE_SCHEMA}],
        }
    ]
    events = list(
        client.responses.create(model="scripted", input="CALL_TOOL", tools=namespaced, stream=True, store=False)
    )  # type: ignore[arg-type]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output[0].type == "function_call" and completed.output[0].name == "read_file"
    text_events = [e.type for e in client.responses.create(model="scripted", input="hi", stream=True, store=False)]
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.content_part.done", "response.output_item.done"):  # fmt: skip
        assert kind in text_events, kind
    assert [e["sequence_number"] if isinstance(e, dict) else e.sequence_number for e in events] == list(
        range(len(events))
    )


ANTHROPIC_TOOLS: list[Any] = [{"name": "read_file", "description": "Read a file", "input_schema": READ_FILE_SCHEMA}]


def test_messages_tool_loop(gateway: GatewayProcess) -> None:
    client = _anthropic(gateway)
    first = client.messages.create(
        model="scripted",
        max_tokens=256,
        tools=ANTHROPIC_TOOLS,
        messages=[{"role": "user", "content": "CALL_TOOL please"}],
    )
    uses = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and uses and uses[0].name == "read_file"
    assert uses[0].input == {"path": "README.md"}
    history: list[Any] = [
        {"role": "user", "content": "CALL_TOOL please"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": uses[0].id, "name": "read_file", "input": uses[0].input}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "# gateway"}]},
    ]
    final = client.messages.create(model="scripted", max_tokens=256, tools=ANTHROPIC_TOOLS, messages=history)
    assert final.stop_reason == "end_turn"
    assert [b.text for b in final.content if b.type == "text"] == ["The tool said: # gateway"]


def test_messages_streaming_tool_use(gateway: GatewayProcess) -> None:
    client = _anthropic(gateway)
    with client.messages.stream(
        model="scripted", max_tokens=256, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "CALL_TOOL"}]
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert message.stop_reason == "tool_use" and message.content[0].input == {"path": "README.md"}  # type: ignore[union-attr]


def test_anthropic_headers_and_beta_query_are_accepted(gateway: GatewayProcess) -> None:
    headers = {"x-api-key": "sk-ant-anything", "anthropic-version": "2023-06-01", "anthropic-beta": "x"}
    body = {"model": "scripted", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(gateway.url + "/v1/messages?beta=true", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200 and answer.json()["type"] == "message"
    missing = httpx.post(gateway.url + "/v1/messages", json={"model": "scripted", "messages": []}, headers=headers)
    assert missing.status_code == 400 and missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "invalid_request_error"


def test_a_slow_stream_reaches_the_client_chunk_by_chunk(gateway: GatewayProcess) -> None:
    body = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "SLOW"}]}
    delays: list[float] = []
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                parts = (json.loads(line[6:])["choices"][0]["delta"].get("content") or "").split()
                if len(parts) == 2:  # "<index> <time the upstream sent it>"
                    delays.append(time.time() - float(parts[1]))
    assert len(delays) == 10
    delays.sort()
    assert delays[len(delays) // 2] < 0.05, f"median per-chunk delay {delays[len(delays) // 2] * 1000:.1f} ms"
    assert delays[-1] < 0.2, "a chunk was held back"


def test_a_client_that_leaves_cancels_the_upstream_request(gateway: GatewayProcess, upstream: Upstream) -> None:
    body = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "HANG"}]}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if "waiting" in line:
                break
    wait_until(lambda: upstream.seen("disconnect"), what="the upstream to see the client leave", timeout_s=5)


def test_usage_chunk_and_reasoning_pass_through(gateway: GatewayProcess) -> None:
    chunks = list(
        _openai(gateway).chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 18


@pytest.fixture
def crashing(tmp_path: Path) -> Iterator[GatewayProcess]:
    server = Upstream(tmp_path)
    process = _front(tmp_path, server)
    yield process
    process.stop()
    process.kill()
    server.stop()


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_backend_crash_mid_stream_ends_the_stream_with_an_error_event(crashing: GatewayProcess, api: str) -> None:
    started = time.monotonic()
    if api == "chat":
        with pytest.raises(openai.APIError, match="stopped in the middle"):
            list(
                _openai(crashing).chat.completions.create(
                    model="scripted", messages=[{"role": "user", "content": "CRASH"}], stream=True
                )
            )
    elif api == "responses":
        events = list(_openai(crashing).responses.create(model="scripted", input="CRASH", stream=True, store=False))
        assert events[-1].type == "response.failed"
        assert "stopped in the middle" in events[-1].response.error.message  # type: ignore[union-attr]
    else:
        with (
            pytest.raises(anthropic.APIStatusError),
            _anthropic(crashing).messages.stream(
                model="scripted", max_tokens=64, messages=[{"role": "user", "content": "CRASH"}]
            ) as stream,
        ):
            list(stream)
    assert time.monotonic() - started < 10, "a broken stream must end, not hang"


def test_a_full_queue_answers_429_with_retry_after_and_the_sdk_retry_gets_through(tmp_path: Path) -> None:
    server = Upstream(tmp_path)
    front = _front(tmp_path, server, "--backend-max-concurrency", "1", "--queue-limit", "0")
    holder = httpx.Client(timeout=30)  # closing it closes the held stream too
    try:
        body = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "HANG"}]}
        hold = holder.stream("POST", front.url + "/v1/chat/completions", json=body)
        response = hold.__enter__()
        lines = response.iter_lines()  # keep a reference: a collected iterator would close the stream
        next(lines)  # the only slot is taken
        busy = httpx.post(
            front.url + "/v1/chat/completions",
            json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "rate_limit_error"
        assert int(busy.headers["retry-after"]) > 0 and int(busy.headers["retry-after-ms"]) > 0
        threading.Timer(0.5, lambda: hold.__exit__(None, None, None)).start()  # the slot frees in 0.5 s
        started = time.monotonic()
        reply = _openai(front, max_retries=3).chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content and time.monotonic() - started >= 0.5
    finally:
        holder.close()
        front.stop()
        front.kill()
        server.stop()


@pytest.mark.parametrize("api_format", ["openai-chat", "open-responses", "anthropic"])
def test_llm_comply_conformance(gateway: GatewayProcess, api_format: str) -> None:
    """llm-comply validates each API against its published spec (shapes, SSE lifecycle, usage, errors).
    Against the scripted upstream every answer is instant, so only the gateway's own conformance is
    judged: the Responses and Messages runs go entirely through the gateway's translation."""
    command = [sys.executable, "-m", "llm_comply.cli", "--format", api_format, "-u", gateway.url + "/v1"]
    command += ["-m", "scripted", "-k", "unused", "--timeout", "30", "--json"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    report = json.loads(run.stdout)
    failed = [r for r in report["results"] if r["status"] == "failed"]
    assert failed == [], failed
    assert report["summary"]["passed"] >= 8


ROOT = Path(__file__).resolve().parents[2]


def test_codex_cli_completes_a_tool_round_trip_through_the_gateway(gateway: GatewayProcess, tmp_path: Path) -> None:
    """The real Codex CLI (npm @openai/codex, headless `codex exec`) configured by `gateway agent codex`
    alone, against the gateway's Responses API, translated to chat for the scripted upstream: it gets
    a shell call, runs `ls`, sends the output back, and prints the final answer built from it."""
    codex = ROOT / ".agents" / "node_modules" / ".bin" / "codex"
    if not codex.exists():
        pytest.fail(f"{codex} is missing: the README's test command installs it with npm")
    work = tmp_path / "project"
    work.mkdir()
    (work / "marker-file.txt").write_text("x")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CODEX_HOME": str(tmp_path / "codex-home"),
        "GATEWAY_API_KEY": "x",
    }
    (tmp_path / "codex-home").mkdir()
    printed = subprocess.run(
        [sys.executable, "-m", "gateway", "agent", "codex", "--url", gateway.url],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (tmp_path / "codex-home" / "config.toml").write_text(printed.stdout)
    run = subprocess.run(
        [
            str(codex),
            "exec",
            "--skip-git-repo-check",
            "-C",
            str(work),
            "List the files here",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "The tool said:" in run.stdout and "marker-file.txt" in run.stdout, run.stdout[-2000:]
