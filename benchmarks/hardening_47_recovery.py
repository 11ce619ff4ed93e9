"""Issue 47's recovery figures (items 3 and 5): a supervisor in this process (the gateway code of
``--source``) with its real engine runs, progress watch and client to the engine, starting a **named
stand-in engine**: this file run as ``stand-in-engine``, a llama-server look-alike (its argv, ``/health``,
``/slots``, streams that begin when a slot starts), because no real engine dies, hangs or ignores a
request on cue. Cues are files in a directory the benchmark writes.

- restarts: the engine serves, then dies on cue, and every start dies while the cue lasts; 10 s after
  the supervisor gave up, the cue is lifted (the engine answers again): how long until the gateway
  serves again, and what ``/ready`` says meanwhile (state, reason). Clocks at a tenth of the defaults:
  restart backoff 0.1, 0.2, 0.5, 1, 3 s; budget 5 restarts within 60 s; tries after giving up at 3 s,
  doubling (by default 30 s, up to 600 s).
- idlehang: the engine takes a chat request and never answers while ``/slots`` says every slot is idle;
  stall limit 4 s: seconds from the request to its end (the hang found, the request ended with 503),
  given up at 40 s.
- noslots: ``/slots`` answers 501 (llama-server's ``--no-slots``) and a streamed request's prefill takes
  10 s before its first token; stall limit 4 s, the plan's context 4,096 tokens at an estimated 50
  tokens/s: whether the stream completes or is cut (and when), and what the log said.

    python benchmarks/hardening.py restarts idlehang noslots [--source DIR]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = ("restarts", "idlehang", "noslots")
STALL_S = 4.0
PREFILL_S = 10.0
CONTEXT = 4096
DECODE_TOKENS_PER_S = 50.0
SCALE = 0.1  # the restart case's clocks, against the defaults


# -- the stand-in engine (its own process) ----------------------------------------------------------------
def stand_in_engine(argv: list[str]) -> None:
    """A llama-server look-alike for the cues in ``--cue DIR``: ``die`` (a start exits before it answers; a
    serving one exits 1), ``never`` (a chat request is taken and never answered), ``no-slots`` (``/slots``
    answers 501), ``prefill`` (a stream's first token comes after ``PREFILL_S``)."""
    from aiohttp import web

    cue = Path(argv[argv.index("--cue") + 1])
    port = int(argv[argv.index("--port") + 1])
    if (cue / "die").exists():
        time.sleep(0.2)
        print("stand-in engine: exiting with status 1 before answering (cue 'die')", flush=True)
        sys.exit(1)

    async def die_on_cue(_app: web.Application) -> Any:
        async def watch() -> None:
            while not (cue / "die").exists():
                await asyncio.sleep(0.05)
            print("stand-in engine: exiting with status 1 while serving (cue 'die')", flush=True)
            os._exit(1)

        task = asyncio.create_task(watch())
        yield
        task.cancel()

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def slots(_request: web.Request) -> web.Response:
        if (cue / "no-slots").exists():
            error = {
                "code": 501,
                "message": "This server does not support slots endpoint.",
                "type": "not_supported_error",
            }
            return web.json_response({"error": error}, status=501)
        idle = [{"id": i, "id_task": -1, "n_ctx": CONTEXT, "is_processing": False} for i in range(4)]
        return web.json_response(idle)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if (cue / "never").exists():
            await asyncio.Event().wait()
        words = ["The", " answer", " is", " four", "."]
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(words)}
            return web.json_response({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)  # llama-server sends its status line when a slot starts the request
        if (cue / "prefill").exists():
            await asyncio.sleep(PREFILL_S)
        for word in words:
            delta = {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(delta)}\n\n".encode())
            await asyncio.sleep(0.05)
        await response.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        return response

    app = web.Application()
    app.cleanup_ctx.append(die_on_cue)
    app.router.add_get("/health", health)
    app.router.add_get("/slots", slots)
    app.router.add_post("/v1/chat/completions", chat)
    print(f"stand-in engine: listening on 127.0.0.1:{port}", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


# -- the supervisor with the code of --source ---------------------------------------------------------------
class _Said(logging.Handler):
    """What the gateway's loggers said (the progress watch's warnings)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _option(cue: Path) -> Any:
    from gateway.backends import llamacpp
    from gateway.backends.llamacpp.launcher import NATIVE

    config = llamacpp.LlamaCppConfig(
        gguf=Path("/stand-in.gguf"), served_name="m", context_length=CONTEXT, launcher=NATIVE
    )
    command = (sys.executable, str(Path(__file__).resolve()), "stand-in-engine", "--cue", str(cue))
    return llamacpp.LlamaCppOption(config=config, command=command, estimated_tokens_per_s=DECODE_TOKENS_PER_S)


def _supervisor(cue: Path, logs: Path, **kwargs: Any) -> Any:
    from gateway.supervision.supervisor import Supervisor

    return Supervisor([_option(cue)], log_dir=logs, startup_timeout_s=30, shutdown_grace_s=1, **kwargs)


def _client() -> Any:
    from gateway.serving.transport.proxy import EngineClient, Timeouts

    return EngineClient(Timeouts(connect_s=5, first_byte_s=600, stream_idle_s=120, answer_s=600))


def _liveness(client: Any) -> Any:
    from gateway.supervision.liveness import Limits, Liveness

    return Liveness(Limits(stall_s=STALL_S, canary_s=0), activity=client.activity, end_requests=client.cut)


async def _until(condition: Any, timeout_s: float, step_s: float = 0.02) -> float | None:
    """Seconds until ``condition()`` held, or None after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            return None
        await asyncio.sleep(step_s)
    return round(time.monotonic() - started, 2)


async def restarts(cue: Path, logs: Path) -> dict[str, Any]:
    from gateway.supervision import after_failure
    from gateway.supervision.lifecycle import State

    backoff = tuple(round(s * SCALE, 2) for s in (1.0, 2.0, 5.0, 10.0, 30.0))
    budget = {}
    if hasattr(after_failure, "RestartBudget"):  # the tree has a restart budget: at the same scale
        budget["restart_budget"] = after_failure.RestartBudget(limit=5, window_s=600 * SCALE, retry_s=30 * SCALE)
    supervisor = _supervisor(cue, logs, restart_backoff_s=backoff, **budget)
    await supervisor.start()
    assert await supervisor.wait_settled() is State.READY, supervisor.report()
    seen: list[dict[str, str]] = []

    def watch() -> bool:
        now = {"state": supervisor.state.value, "reason": (supervisor.reason or "")[:220]}
        if not seen or seen[-1] != now:
            seen.append(now)
        return False

    (cue / "die").touch()
    gave_up = await _until(lambda: watch() or supervisor.state is State.FAILED, 120)
    deaths = len(supervisor.attempts)
    await _until(watch, 10)  # given up: 10 s before the engine answers again
    (cue / "die").unlink()
    back = await _until(lambda: watch() or supervisor.ready, 60)
    result = {
        "failed_starts_and_deaths_before_giving_up": deaths,
        "gave_up_after_s": gave_up,
        "engine_answers_again_s_after_giving_up": 10,
        "serving_again_s_after_the_engine_answers": back if back is not None else "not serving after 60 s",
        "ready_said": seen,
        "state_then": supervisor.state.value,
        "restarts": supervisor.restarts,
    }
    await supervisor.stop()
    return result


async def idle_hang(cue: Path, logs: Path) -> dict[str, Any]:
    from gateway.supervision.lifecycle import State

    client = _client()
    supervisor = _supervisor(cue, logs, liveness=_liveness(client))
    await supervisor.start()
    assert await supervisor.wait_settled() is State.READY, supervisor.report()
    (cue / "never").touch()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    started = time.monotonic()
    ask = asyncio.ensure_future(client.open(supervisor.target, "/v1/chat/completions", body))
    done, _ = await asyncio.wait({ask}, timeout=40)
    took = round(time.monotonic() - started, 2)
    if done:
        error = ask.exception()
        answer = f"{getattr(error, 'status', type(error).__name__)}: {str(error)[:200]}"
    else:
        ask.cancel()
        with contextlib.suppress(BaseException):
            await ask
        answer = "still waiting after 40 s (the first-byte timeout is 600 s)"
    (cue / "never").unlink()
    result = {
        "stall_timeout_s": STALL_S,
        "request_ended_after_s": took if done else None,
        "answer": answer,
        "hangs": [hang["why"] for hang in supervisor.hangs],
    }
    await supervisor.stop()
    await client.aclose()
    return result


async def no_slots(cue: Path, logs: Path) -> dict[str, Any]:
    from gateway.supervision.lifecycle import State

    said = _Said()
    logging.getLogger("gateway").addHandler(said)
    logging.getLogger("gateway.liveness").setLevel(logging.WARNING)
    client = _client()
    supervisor = _supervisor(cue, logs, liveness=_liveness(client))
    (cue / "no-slots").touch()
    (cue / "prefill").touch()
    await supervisor.start()
    assert await supervisor.wait_settled() is State.READY, supervisor.report()
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    started = time.monotonic()
    failed, chunks = await client.chat_stream(supervisor.target, body)
    contents: list[str] = []
    error: str | None = None
    async for chunk in chunks:
        if not isinstance(chunk, dict):  # [DONE]
            continue
        if "error" in chunk:
            error = chunk["error"].get("message", "")[:200]
            break
        contents.extend(choice.get("delta", {}).get("content") or "" for choice in chunk.get("choices", []))
    took = round(time.monotonic() - started, 2)
    result = {
        "stall_timeout_s": STALL_S,
        "prefill_s": PREFILL_S,
        "stream": f"cut after {took} s: {error}" if error else f"completed after {took} s: {''.join(contents)!r}",
        "opened": failed or "200",
        "hangs": [hang["why"] for hang in supervisor.hangs],
        "warnings": [line for line in said.lines if "progress" in line][:3],
    }
    logging.getLogger("gateway").removeHandler(said)
    await supervisor.stop()
    await client.aclose()
    return result


def issue_47(source: Path, wanted: set[str]) -> dict[str, Any]:
    """The cases of :data:`CASES` that ``wanted`` names, with the gateway code of ``source``."""
    cases = wanted & set(CASES)
    if not cases:
        return {}
    sys.path.insert(0, str(source))
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s %(message)s")
    runs = {"restarts": restarts, "idlehang": idle_hang, "noslots": no_slots}
    results: dict[str, Any] = {}
    for name in CASES:
        if name in cases:
            with tempfile.TemporaryDirectory(prefix=f"h47-{name}-") as scratch:
                cue, logs = Path(scratch) / "cue", Path(scratch) / "logs"
                cue.mkdir()
                logs.mkdir()
                results[name] = asyncio.run(runs[name](cue, logs))
    return results


if __name__ == "__main__" and sys.argv[1:2] == ["stand-in-engine"]:
    stand_in_engine(sys.argv[2:])
