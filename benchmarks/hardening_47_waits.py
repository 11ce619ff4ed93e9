"""Issue 47's waits (every queued request has a bounded wait), run from ``benchmarks/hardening.py``.

- starved: a real gateway process (two engine slots) in front of the fake upstream; a session holds one
  slot with a long stream, then sends a long request (10,000 characters: above the long-prefill mark)
  while three clients keep sending short requests (0.5 s each), each from a fresh session: how long the
  long request waits for a slot (the aging limit is 30 s), how many short ones passed it meanwhile.
- warmturns: in-process (the tree's own HTTP app, ``tests/unit/http_harness``'s stand-in engine, a
  llama-server-like scheduling that pins a long prefill to slot 3): eight sessions send a cold first
  turn, then one request of 70,000 messages comes, then each session's warm second turn: how many
  second turns the gateway took for cold ones (pinned), and how many prefixes that one request added
  to the gateway's memory of 65,536.
- lane: in-process, an engine whose first token comes 1 s after a request (its prefill) with a lane of
  one long prefill: three long streamed requests at once on each route (chat; Messages and Responses
  translated to chat; and each served by the engine itself): the most prefills the engine ran at once.
- fingerprint: a real gateway process; one chat request of 99,000 messages (3.2 MB), three times: the
  slowest /health meanwhile (polled every 50 ms), the request's status and time. Then the same in-process
  (the app under uvicorn in this interpreter's loop, beside a task that wakes every 5 ms): the longest
  the event loop was held, a figure that the machine's other load and the client's own scheduling
  blur less than /health's.

    python benchmarks/hardening.py starved warmturns lane fingerprint [--source DIR]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

CASES = ("starved", "warmturns", "lane", "fingerprint")
STARVED_LIMIT_S = 90.0  # the adversarial round watched for 100 s


# -- the fake upstream's answers for these cases (hardening.py's upstream asks upstream_cases) ---------------
def upstream_cases(cue: str, request: Any, web: Any) -> Any:
    """``HOLD-<s>``: a stream that sends a chunk every 2 s for s seconds; ``PAUSE-<ms>``: a plain answer
    after ms milliseconds; None for any other cue."""

    def chunk(content: str, finish: str | None = None) -> bytes:
        body = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def hold(seconds: float) -> Any:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        ends = time.monotonic() + seconds
        with contextlib.suppress(ConnectionError):
            while time.monotonic() < ends:
                await response.write(chunk("."))
                await asyncio.sleep(2)
            await response.write(chunk("", "stop") + b"data: [DONE]\n\n")
        return response

    async def pause(ms: int) -> Any:
        await asyncio.sleep(ms / 1000)
        message = {"role": "assistant", "content": "ok"}
        return web.json_response({"object": "chat.completion", "model": "fake", "choices": [
            {"index": 0, "message": message, "finish_reason": "stop"}]})  # fmt: skip

    if match := re.search(r"HOLD-(\d+)", cue):
        return hold(float(match[1]))
    if match := re.search(r"PAUSE-(\d+)", cue):
        return pause(int(match[1]))
    return None


# -- starved: a real gateway process -------------------------------------------------------------------------
async def _starved(url: str) -> dict[str, Any]:
    chat = url + "/v1/chat/completions"
    own = {"x-claude-code-session-id": "agent-with-a-request-in-flight"}
    stop = asyncio.Event()
    passed = 0

    async def shorts(session: aiohttp.ClientSession) -> None:
        nonlocal passed
        while not stop.is_set():
            fresh = {"x-claude-code-session-id": uuid.uuid4().hex}
            body = {"model": "fake", "messages": [{"role": "user", "content": f"PAUSE-500 {uuid.uuid4().hex}"}]}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(chat, json=body, headers=fresh) as answer:
                    await answer.read()
                    passed += answer.status == 200

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        held = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "HOLD-150"}]}
        holder = await session.post(chat, json=held, headers=own)  # one slot: this session's other request
        workers = [asyncio.create_task(shorts(session)) for _ in range(3)]
        await asyncio.sleep(2)
        long_turn = "read this file: " + "long file " * 1000 + "PAUSE-10"
        body = {"model": "fake", "messages": [{"role": "user", "content": long_turn}]}
        started, passed = time.monotonic(), 0
        try:
            async with asyncio.timeout(STARVED_LIMIT_S):
                async with session.post(chat, json=body, headers=own) as answer:
                    await answer.read()
            waited: float | None = round(time.monotonic() - started, 1)
        except TimeoutError:
            waited = None
        served_meanwhile = passed
        stop.set()
        await asyncio.gather(*workers)
        holder.close()
    if waited is None:
        return {
            "long_request_started_after_s": f"not within {STARVED_LIMIT_S:g} s",
            "short_passed_it": served_meanwhile,
        }
    return {"long_request_started_after_s": waited, "short_passed_it": served_meanwhile}


def starved(url: str) -> dict[str, Any]:
    return asyncio.run(_starved(url))


# -- fingerprint: /health during a request of 99,000 messages -------------------------------------------------
def fingerprint(url: str, health: Any) -> dict[str, Any]:
    body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "x"}] * 99_000}).encode()

    async def send() -> list[tuple[int, float]]:
        out = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            for _ in range(3):
                started = time.monotonic()
                headers = {"Content-Type": "application/json"}
                async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as answer:
                    await answer.read()
                    out.append((answer.status, round(time.monotonic() - started, 2)))
                await asyncio.sleep(0.5)
        return out

    with health(url) as watch:
        runs = asyncio.run(send())
    return {"body_mb": round(len(body) / 1024 / 1024, 1), "statuses": [s for s, _ in runs],
            "seconds": [t for _, t in runs], **watch.figures()}  # fmt: skip


# -- in-process cases: the tree's own app and test harness, in a process of their own --------------------------
def _in_process(source: Path, case: str) -> dict[str, Any]:
    """Run ``case`` in a fresh interpreter that imports the gateway (and its test harness) from ``source``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, __file__, case, str(source)], env=env, cwd=source, capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _warm_turns() -> dict[str, Any]:
    from starlette.testclient import TestClient

    from gateway.backends.base import Scheduling
    from gateway.serving.app import create_app
    from tests.unit.http_harness import FRONTED, FakeEngine, Served, make_runtime

    engine = FakeEngine()
    served = Served(engine.app)
    pinned = Scheduling(long_lane=1, long_fields={"id_slot": 3})
    runtime = make_runtime(served.url, max_body_bytes=8 << 20, scheduling=pinned)

    def turn(session: int, second: bool) -> dict[str, Any]:
        messages = [{"role": "user", "content": f"session {session}: read this file " + "line of code " * 800}]
        if second:
            messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "the tests pass"}]
        return {"model": FRONTED, "messages": messages}

    def pins() -> list[bool]:
        return ["id_slot" in seen["body"] for seen in engine.requests_to("/v1/chat/completions")]

    try:
        with TestClient(create_app(runtime)) as client:
            for session in range(8):
                client.post("/v1/chat/completions", json=turn(session, second=False)).raise_for_status()
            before = len(runtime.prefixes._seen)
            flood = [{"role": "user", "content": f"m{n}"} for n in range(70_000)]
            client.post("/v1/chat/completions", json={"model": FRONTED, "messages": flood}).raise_for_status()
            added = len(runtime.prefixes._seen) - before
            first_pins = pins()
            for session in range(8):
                client.post("/v1/chat/completions", json=turn(session, second=True)).raise_for_status()
    finally:
        served.stop()
    later = pins()[len(first_pins) :]
    return {
        "first_turns_pinned_as_cold": f"{sum(first_pins[:8])}/8",
        "prefixes_the_70000_message_request_added": added,
        "memory_limit": runtime.prefixes.limit,
        "second_turns_taken_for_cold": f"{sum(later)}/8",
    }


class _PrefillingEngine:
    """Answers a stream's headers (and a natively served API's opening events) at once and its first token
    after ``prefill_s``; counts the prefills running at once."""

    def __init__(self, prefill_s: float) -> None:
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.prefill_s, self.prefilling, self.most = prefill_s, 0, 0
        paths = ("chat/completions", "messages", "responses")
        self.app = Starlette(routes=[Route(f"/v1/{path}", self.answer, methods=["POST"]) for path in paths])

    async def answer(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        await request.json()
        return StreamingResponse(self._events(request.url.path), media_type="text/event-stream")

    async def _events(self, path: str) -> Any:
        def event(name: str) -> bytes:
            return f"event: {name}\ndata: {json.dumps({'type': name})}\n\n".encode()

        self.prefilling += 1
        self.most = max(self.most, self.prefilling)
        if path == "/v1/messages":
            yield event("message_start")
        elif path == "/v1/responses":
            yield event("response.created")
        await asyncio.sleep(self.prefill_s)
        self.prefilling -= 1
        if path == "/v1/messages":
            yield event("content_block_start") + event("message_stop")
        elif path == "/v1/responses":
            yield event("response.completed")
        else:
            for finish in (None, "stop"):
                delta = {} if finish else {"role": "assistant", "content": "ok"}
                chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"


def _loop_stall() -> dict[str, Any]:
    import urllib.request

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from gateway.serving.app import create_app
    from tests.unit.http_harness import FRONTED, Served, make_runtime

    async def answer(request: Request) -> JSONResponse:
        await request.body()  # not parsed: this interpreter's GIL is the gateway's to measure
        message = {"role": "assistant", "content": "ok"}
        return JSONResponse({"object": "chat.completion", "choices": [{"index": 0, "message": message,
                                                                       "finish_reason": "stop"}]})  # fmt: skip

    engine = Served(Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])]))
    app = create_app(make_runtime(engine.url, max_body_bytes=32 << 20))
    body = json.dumps({"model": FRONTED, "messages": [{"role": "user", "content": "x"}] * 99_000}).encode()
    gaps: list[float] = []
    seconds: list[float] = []

    def send(url: str) -> None:
        for _ in range(3):
            started = time.monotonic()
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                answer.read()
            seconds.append(round(time.monotonic() - started, 2))

    async def run() -> None:
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]

        async def tick() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(tick())
        await asyncio.to_thread(send, f"http://127.0.0.1:{port}/v1/chat/completions")
        ticking.cancel()
        server.should_exit = True
        await serving

    try:
        asyncio.run(run())
    finally:
        engine.stop()
    return {"loop_held_longest_s": round(max(gaps), 3), "seconds": seconds}


def _lane() -> dict[str, Any]:
    from gateway.backends.base import Scheduling
    from gateway.serving.app import create_app
    from tests.unit.http_harness import FRONTED, Served, make_runtime

    routes = [("chat", "/v1/chat/completions", frozenset[str]()), ("messages", "/v1/messages", frozenset[str]()),
              ("responses", "/v1/responses", frozenset[str]()),
              ("messages served natively", "/v1/messages", frozenset({"messages"})),
              ("responses served natively", "/v1/responses", frozenset({"responses"}))]  # fmt: skip
    out: dict[str, Any] = {}
    for label, path, native in routes:
        engine = _PrefillingEngine(prefill_s=1.0)
        served = Served(engine.app)
        runtime = make_runtime(served.url, native=frozenset({"include_usage"}) | native, max_body_bytes=1 << 20,
                               scheduling=Scheduling(long_lane=1))  # fmt: skip
        gateway = Served(create_app(runtime))

        def body(tag: int, path: str = path) -> dict[str, Any]:
            text = f"read this file ({tag}): " + f"{tag} line " * 2000
            if path == "/v1/responses":
                return {"model": FRONTED, "input": text, "stream": True}
            return {"model": FRONTED, "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": text}]}

        async def three(url: str) -> list[int]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

                async def one(tag: int) -> int:
                    async with session.post(url, json=body(tag)) as answer:
                        await answer.read()
                        return answer.status

                return list(await asyncio.gather(*(one(tag) for tag in range(3))))

        started = time.monotonic()
        try:
            statuses = asyncio.run(three(gateway.url + path))
        finally:
            gateway.stop()
            served.stop()
        out[label] = {"long_prefills_at_once": engine.most, "statuses": statuses,
                      "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    return out


def issue_47_waits(source: Path, wanted: set[str], servers: Any, health: Any) -> dict[str, Any]:
    """The cases of ``CASES`` that ``wanted`` names (``servers``, ``health``: hardening.py's)."""
    results: dict[str, Any] = {}
    if "starved" in wanted:
        with servers(source, ["--backend-max-concurrency", "2"]) as (url, _gateway):
            time.sleep(2.5)
            results["starved"] = starved(url)
    if "warmturns" in wanted:
        results["warmturns"] = _in_process(source, "warmturns")
    if "lane" in wanted:
        results["lane"] = _in_process(source, "lane")
    if "fingerprint" in wanted:
        with servers(source) as (url, _gateway):
            time.sleep(2.5)
            results["fingerprint"] = fingerprint(url, health)
        results["fingerprint"]["in_process"] = _in_process(source, "stall")
    return results


if __name__ == "__main__":  # an in-process case, in the interpreter _in_process started (PYTHONPATH: the tree)
    sys.path.insert(0, sys.argv[2])
    print(json.dumps({"warmturns": _warm_turns, "lane": _lane, "stall": _loop_stall}[sys.argv[1]]()))
