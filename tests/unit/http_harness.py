"""A stand-in engine and a gateway in front of it, in this process, for the fast HTTP tests.

The engine is a real HTTP server (uvicorn in a thread): the gateway's client (aiohttp) speaks TCP.
The gateway runs under starlette's TestClient (whole responses), or under uvicorn too when a test
must watch a stream while it is still open.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.backends.base import Launch, Scheduling
from gateway.serving.dialects.model_names import ModelRoute
from gateway.serving.edge.middleware import ASGIApp
from gateway.serving.runtime import Runtime
from gateway.serving.transport.proxy import EngineClient, Timeouts
from gateway.supervision.lifecycle import State
from tests.served_thread import WakeableServer
from tests.waiting import wait_until

FRONTED = "front-model"
SERVED = "engine-model"  # the engine answers to another name, so responses are renamed
ENGINE_CONTEXT = 4096
PLANNED_CONTEXT = 8192  # what /v1/models says while no engine is ready: the plan's
ENGINE_REFUSAL = {
    "error": {
        "message": "This model's maximum context length is 100 tokens. However, you requested 150 tokens "
        "(140 in the messages, 10 in the completion).",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


# each engine's own refusal of a prompt longer than its context, as its server answers it (the cue
# "OVERFLOW-<name>" makes the fake engine answer with it)
ENGINE_OVERFLOWS: dict[str, tuple[dict[str, Any], int, int | None]] = {
    # llama-server b11434 (tools/server/server-common.cpp): (answer, context, prompt tokens it names)
    "llama-server": (
        {
            "error": {
                "code": 400,
                "message": "request (8766 tokens) exceeds the available context size (4096 tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 8766,
                "n_ctx": 4096,
            }
        },
        4096,
        8766,
    ),
    "llama-server-older": (
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
            }
        },
        ENGINE_CONTEXT,
        None,
    ),
    # vLLM 0.32 (vllm/renderers/params.py, vllm/v1/engine/input_processor.py)
    "vllm": (
        {
            "error": {
                "message": "This model's maximum context length is 4096 tokens. However, your prompt contains "
                "5000 input tokens, which exceeds this limit even without any output tokens. Please reduce the "
                "length of the input prompt.",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        },
        4096,
        5000,
    ),
    "vllm-decoder": (
        {
            "error": {
                "message": "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
                "Make sure that `max_model_len` is no smaller than the number of text tokens.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
        4096,
        5000,
    ),
    # llama-cpp-python 0.3.36's server (llama_cpp/server/errors.py rewords the engine's ValueError)
    "llama-cpp-python": (
        {
            "error": {
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5010 tokens "
                "(5000 in the messages, 10 in the completion). Please reduce the length of the messages or "
                "completion.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        4096,
        5010,
    ),
}


class FakeEngine:
    """An OpenAI-compatible engine that does on cue (the last user text) what a test needs:
    "REFUSE" → 400 with an OpenAI-shaped context-overflow error; "NOTJSON" → 502 with an HTML page;
    "GARBAGE200" → 200 with an HTML page; "BUSY" → 429 with Retry-After 7;
    "HANG" → a stream that sends a chunk and then nothing until the client leaves (``disconnected``);
    "SLOW" → a plain answer after 30 s, unless the gateway hangs up first (``disconnected`` either way);
    "OVERFLOW-<engine>" → 400 with that engine's own context-overflow answer (``ENGINE_OVERFLOWS``);
    "HTML500" / "REDIRECT" / "CHOICESNULL" / "CHOICESABC" / "STREAMJSON200" / "NOFINISH" / "NODONE" /
    "NULLCHOICE" / "LONGLINE" → the upstream faults their names say;
    "ENDLESS" → a stream of 64 KiB chunks that never ends (``disconnected`` once the gateway hangs up);
    "PREFILLING" → nothing at all until the test sets ``prefill_over`` (a prompt still being prefilled);
    anything else → "Hello world". It also speaks /v1/responses and /v1/messages natively (for
    passthrough tests, when the launch says so) and records every request it gets. Like llama-server it
    renders a chat to its prompt at /apply-template (one line per message; tool schemas only when
    ``template_renders_tools``; with ``template_waits_for_chat``, only once a chat request came) and
    counts words at /tokenize."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.disconnected = threading.Event()
        self.prefill_over = threading.Event()  # "PREFILLING": nothing is answered until a test sets it
        self.reset()
        self.app = Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.echo, methods=["POST"]),
                Route("/v1/responses", self.echo, methods=["POST"]),
                Route("/v1/messages", self.echo, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_messages, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/apply-template", self.apply_template, methods=["POST"]),
                Route("/slots", self.slots_page, methods=["GET"]),
                Route("/completion", self.completion, methods=["POST"]),  # llama-server's own (the primer's)
            ]
        )

    def reset(self) -> None:
        """As new, for the next test (one engine serves a whole module)."""
        self.seen.clear()
        self.disconnected.clear()
        self.prefill_over.clear()
        self.sends_usage = True  # honours stream_options.include_usage
        self.template_renders_tools = False  # many chat templates never show the model the tool schemas
        self.cached_tokens: int | None = None  # set: usage says that many prompt tokens came from its cache
        # set: /apply-template answers only once a chat request came (or after 2 s), and says which
        self.template_waits_for_chat = False
        self.chat_came_before_template: bool | None = None
        # what GET /slots answers (llama-server's page), read by read (the last one stays); None: 404. A slot a
        # request was pinned to shows processing at the next read, as the engine holds it
        self.slots: list[list[dict[str, Any]] | None] = [None]
        self.held: set[int] = set()
        self.refuse_completion = False  # /completion answers 500 (a primer that fails)
        self.progress_cache = 0  # a stream asked for return_progress opens with this cached count, as llama-server

    def _usage(self, prompt: int, completion: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
        usage["total_tokens"] = prompt + completion
        if self.cached_tokens is not None:  # as llama-server and vLLM report a prefix-cache hit
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    def requests_to(self, path: str) -> list[dict[str, Any]]:
        return [seen for seen in self.seen if seen["path"] == path]

    async def _record(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        payload = json.loads(raw)
        self.seen.append({"path": request.url.path, "raw": raw, "body": payload, "headers": dict(request.headers)})
        return dict(payload)

    async def slots_page(self, request: Request) -> Response:
        self.seen.append({"path": request.url.path, "raw": b"", "body": None, "headers": dict(request.headers)})
        slots = self.slots.pop(0) if len(self.slots) > 1 else self.slots[0]
        if slots is None:
            return JSONResponse({"error": "no"}, status_code=404)
        shown = [{**slot, "is_processing": slot["is_processing"] or slot["id"] in self.held} for slot in slots]
        self.held.clear()
        return JSONResponse(shown)

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": SERVED, "object": "model"}]})

    async def tokenize(self, request: Request) -> Response:
        payload = await self._record(request)
        return JSONResponse({"count": len(str(payload.get("input", "")).split())})

    async def count_messages(self, request: Request) -> Response:
        payload = await self._record(request)
        return JSONResponse({"input_tokens": len(json.dumps(payload.get("messages")).split())})

    async def apply_template(self, request: Request) -> Response:
        payload = await self._record(request)
        if self.template_waits_for_chat:
            deadline = time.monotonic() + 2  # a chat sent only after the count would come after this
            while not self.requests_to("/v1/chat/completions") and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # polled until the deadline above
            self.chat_came_before_template = bool(self.requests_to("/v1/chat/completions"))
        lines = [f"{m.get('role')} {m.get('content')}" for m in payload.get("messages") or []]
        if self.template_renders_tools:
            lines += [json.dumps(tool) for tool in payload.get("tools") or []]
        return JSONResponse({"prompt": "\n".join(lines)})

    @staticmethod
    def _overflow(cue: str) -> Response | None:
        for name, (answer, _context, _prompt) in ENGINE_OVERFLOWS.items():
            if re.search(rf"OVERFLOW-{re.escape(name)}(?![\w-])", cue):
                return JSONResponse(answer, status_code=400)
        return None

    async def completion(self, request: Request) -> Response:
        """llama-server's native completion, as the gateway's primer asks it: a few tokens, one out."""
        payload = await self._record(request)
        if "FAILPRIME" in str(payload.get("prompt")) or self.refuse_completion:
            return JSONResponse({"error": {"code": 500, "message": "no"}}, status_code=500)
        return JSONResponse({"content": "x", "tokens_predicted": 1, "timings": {"prompt_n": 12, "cache_n": 0}})

    async def echo(self, request: Request) -> Response:
        payload = await self._record(request)
        if refusal := self._overflow(json.dumps(payload)):
            return refusal
        echoed = json.dumps({"engine_path": request.url.path, "model": payload.get("model")})
        if payload.get("stream"):  # one event, as the engine's own stream would carry it
            return StreamingResponse(iter([f"event: echo\ndata: {echoed}\n\n"]), media_type="text/event-stream")
        return Response(echoed, media_type="application/json")

    async def chat(self, request: Request) -> Response:
        payload = await self._record(request)
        if isinstance(payload.get("id_slot"), int):
            self.held.add(payload["id_slot"])
        cue = next((str(m.get("content")) for m in reversed(payload["messages"]) if m.get("role") == "user"), "")
        if "REFUSE" in cue:
            return JSONResponse(ENGINE_REFUSAL, status_code=400)
        if refusal := self._overflow(cue):
            return refusal
        if "GARBAGE200" in cue:
            return Response("<html>it worked?</html>", status_code=200, media_type="text/html")
        if "BUSY" in cue:
            return JSONResponse({"error": {"message": "busy"}}, status_code=429, headers={"Retry-After": "7"})
        if "NOTJSON" in cue:
            return Response("<html>bad gateway</html>", status_code=502, media_type="text/html")
        if "HTML500" in cue:  # a crashed server's debug page
            return Response("<html>Traceback: /srv/engine/internal.py</html>", status_code=500, media_type="text/html")
        if "REDIRECT" in cue:  # points the gateway at another origin
            return Response(status_code=307, headers={"Location": "http://127.0.0.1:9/v1/chat/completions"})
        if "CHOICESNULL" in cue or "CHOICESABC" in cue:
            choices: Any = [None] if "CHOICESNULL" in cue else "abc"
            return JSONResponse({"object": "chat.completion", "model": payload["model"], "choices": choices})
        if "STREAMJSON200" in cue:  # a stream request answered as if it were not one
            return JSONResponse({"object": "chat.completion", "choices": []})
        while "PREFILLING" in cue and not self.prefill_over.is_set():  # the prompt's prefill is under way
            await asyncio.sleep(0.01)
        if payload.get("stream"):
            return StreamingResponse(self._stream(payload, cue), media_type="text/event-stream")
        if "SLOW" in cue:  # a long generation: answers after 30 s, unless the gateway hangs up first
            for _ in range(600):  # as llama-server does, it notices a closed connection between tokens
                if await request.is_disconnected():
                    self.disconnected.set()
                    return Response(status_code=499)
                await asyncio.sleep(0.05)  # a token's time
        message = {"role": "assistant", "content": "Hello world"}
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": payload["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": self._usage(11, 7),
            }
        )

    async def _stream(self, payload: dict[str, Any], cue: str) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": payload["model"]}
            body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta or finish else []
            return b"data: " + json.dumps({**body, **extra}).encode() + b"\n\n"

        if payload.get("return_progress"):  # llama-server's first event: what the slot held, then each batch
            progress = {"total": 100, "cache": self.progress_cache, "processed": self.progress_cache}
            yield chunk({}, prompt_progress=progress)
        yield chunk({"role": "assistant", "content": ""})
        if "NOFINISH" in cue:  # cut short: content, then the end of the stream without a finish reason
            yield chunk({"content": "Hel"})
            return
        if "NULLCHOICE" in cue:
            yield chunk({"content": "Hel"})
            yield b'data: {"choices": [null]}\n\n'
            return
        if "LONGLINE" in cue:  # a line that never ends: 1 MiB blocks without a newline
            for _ in range(24):
                yield b"x" * (1 << 20)
            return
        if "ENDLESS" in cue:  # 64 KiB chunks for as long as someone takes them
            try:
                while True:
                    yield chunk({"content": "x" * 65536})
                    await asyncio.sleep(0.001)  # a point where the cancel of a gone client lands
            finally:
                self.disconnected.set()
        if "HANG" in cue:
            yield chunk({"content": "waiting"})
            try:
                await asyncio.sleep(30)  # until the gateway hangs up, which cancels this
            finally:
                self.disconnected.set()
            return
        for word in ("Hello ", "world"):
            yield chunk({"content": word})
        yield chunk({}, "stop")
        if "NODONE" in cue:  # finished, then the end of the stream without its usage chunk or [DONE]
            return
        if self.sends_usage and (payload.get("stream_options") or {}).get("include_usage"):
            yield chunk({}, usage=self._usage(11, 2))
        yield b"data: [DONE]\n\n"


class FakeBackend:
    """A served backend that is simply ready (or not): the gateway's side of the lifecycle only."""

    def __init__(self, launch: Launch, *, ready: bool = True, restarts: int = 0, planned_context: int = 0) -> None:
        self._launch = launch
        self._planned_context = planned_context  # the plan's figure, said while the engine is not ready
        self.state = State.READY if ready else State.STARTING
        self.reason: str | None = None if ready else "loading the model"
        self.ever_ready = ready
        self.restarts = restarts
        self.retry_at: float | None = None  # gave up restarting: when it tries again

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def target(self) -> Launch | None:
        return self._launch

    @property
    def context_length(self) -> int:
        return self._launch.context_length if self.ready else self._planned_context

    async def start(self) -> None:
        return None

    async def wait_settled(self) -> State:
        return self.state

    async def stop(self) -> None:
        return None

    def snapshot(self) -> dict[str, Any]:
        return {"state": self.state.value, "reason": self.reason, "restarts": self.restarts}

    def report(self) -> str:
        return self.reason or self.state.value


def make_runtime(
    engine_url: str,
    *,
    native: frozenset[str] = frozenset({"include_usage"}),
    max_concurrency: int = 4,
    queue_limit: int = 64,
    queue_wait_s: float = 600.0,
    api_keys: tuple[str, ...] = (),
    ready: bool = True,
    restarts: int = 0,
    max_body_bytes: int = 64 * 1024,
    template_path: str | None = None,
    scheduling: Scheduling | None = None,
    per_key_limit: int = 0,
    request_defaults: dict[str, Any] | None = None,
    pause_long_prefills: bool = False,
) -> Runtime:
    launch = Launch(
        engine="fake",
        argv=[],
        port=0,
        api_key="engine-key",
        served_name=SERVED,
        context_length=ENGINE_CONTEXT,
        health_path="/v1/models",
        summary="the fake engine",
        max_concurrency=max_concurrency,
        native=native,
        tokenize_path="/tokenize",
        template_path=template_path,
        base=engine_url,
        scheduling=scheduling or Scheduling(),
        request_defaults=request_defaults or {},
    )
    return Runtime(
        route=ModelRoute(fronted=FRONTED, served=SERVED, aliases=("alias",)),
        backend=FakeBackend(launch, ready=ready, restarts=restarts, planned_context=PLANNED_CONTEXT),
        engine_client=EngineClient(Timeouts(connect_s=5, answer_s=30)),
        max_body_bytes=max_body_bytes,
        queue_limit=queue_limit,
        queue_wait_s=queue_wait_s,
        api_keys=api_keys,
        per_key_limit=per_key_limit,
        pause_long_prefills=pause_long_prefills,
        allowed_hosts=("testserver",),  # starlette's TestClient's Host
        plan_memory=[("0", "weights", 1000)],
        plan_kv_tokens=12345,
    )


class Served:
    """An ASGI app on a real loopback port, served by uvicorn in a daemon thread."""

    def __init__(self, app: ASGIApp | Starlette, *, lifespan: str = "on", http: Any = "auto") -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.address = self._socket.getsockname()
        self.url = f"http://127.0.0.1:{self.address[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, ws="none", http=http)
        self.server = WakeableServer(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True)
        self._thread.start()
        wait_until(lambda: self.server.started, what="uvicorn to start")

    def stop(self) -> None:
        self.server.stop()
        self._thread.join(timeout=10)
        self._socket.close()


def sse_events(body: str) -> list[tuple[str | None, Any]]:
    """(event name or None, parsed data) per event of a server-sent event stream."""
    events: list[tuple[str | None, Any]] = []
    for block in body.split("\n\n"):
        name = None
        data = None
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                text = line[5:].strip()
                data = text if text == "[DONE]" else json.loads(text)
        if data is not None:
            events.append((name, data))
    return events
