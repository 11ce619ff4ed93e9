"""Issue 47's edge cases (items 6 and 7): wrong engine output, counts past the queue, the worker's start
request, the shared remembered store; each case runs with the gateway code of ``--source``.

- engine500: an engine that answers every chat request 500 with an HTML page, behind a real gateway
  process (``serve --backend-url``): each dialect's status, streamed and not, and whether its error
  body has every field of its shape (OpenAI: message, type, param, code; Anthropic: type, error.type).
- nodone: the engine ends a chat stream after its finish reason without ``data: [DONE]``: what each
  dialect's stream ends with (its last event's name, or ``data`` for an unnamed one, and whether it is
  an error).
- counts: one engine slot held by a stream (queue limit 0), then 40 ``/v1/messages/count_tokens`` of
  1 MB at once, the Messages API translated for a llama-server-like engine (/apply-template, /tokenize;
  in a process of its own, tests/unit/http_harness.py's stand-in engine): their statuses, the engine
  calls they made, and a chat request's status meanwhile; then one count with the slot free and its calls.
- worker: a worker (``gateway.nodes.worker.create_app`` served by uvicorn in a process of its own) whose
  rank runs (a stand-in: a sleeping Python); then starts with a rank of 300 digits, a 10 MB argument,
  arguments nested 2000 deep, and a 300 MB body (an argument of 300 MB, its length declared): each
  answer, whether the running rank survived (same pid, running), and the worker's peak RSS.
- records: two real processes record 30 configurations each into one state directory at once
  (gateway.remembered.known_good): how many of the 60 the file keeps.

    python benchmarks/hardening.py engine500 nodone counts worker records [--source DIR]
    python benchmarks/hardening_47_edge.py all [--source DIR]      # the same, alone
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
CASES = ("engine500", "nodone", "counts", "worker", "records")
CHAT = {"model": "fake", "max_tokens": 8, "messages": [{"role": "user", "content": "CUE"}]}
DIALECTS = {
    "chat": ("/v1/chat/completions", CHAT),
    "messages": ("/v1/messages", CHAT),
    "responses": ("/v1/responses", {"model": "fake", "input": "CUE"}),
}


# -- the fake engine (a thread of the benchmark's process) -----------------------------------------------
def _engine(port: int) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        cue = json.dumps(payload.get("messages"))
        if "HTML500" in cue:  # a crashed server's debug page
            return web.Response(status=500, text="<html>Traceback: /srv/engine/x.py</html>", content_type="text/html")
        if not payload.get("stream"):
            message = {"role": "assistant", "content": "ok"}
            return web.json_response({"object": "chat.completion", "model": "fake", "choices": [
                {"index": 0, "message": message, "finish_reason": "stop"}]})  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for delta, finish in (({"role": "assistant", "content": "Hello"}, None), ({}, "stop")):
            chunk = {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if "NODONE" not in cue:
            await response.write(b"data: [DONE]\n\n")
        return response

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "max_model_len": 4096}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    loop.run_forever()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


@contextlib.contextmanager
def _gateway(source: Path) -> Iterator[str]:
    """A real gateway process (``source``'s code) in front of the fake engine: its URL."""
    engine_port, port = _free_port(), _free_port()
    threading.Thread(target=_engine, args=(engine_port,), daemon=True).start()
    _wait_port(engine_port)
    work = tempfile.mkdtemp(prefix="hardening47-")
    argv = [
        sys.executable, "-m", "gateway", "serve", "--backend-url", f"http://127.0.0.1:{engine_port}", "--model", "fake",
        "--backend-native-apis", "include_usage", "--port", str(port), "--state-dir", work,
    ]  # fmt: skip
    with open(Path(work) / "gateway.log", "wb") as log:
        process = subprocess.Popen(argv, cwd=source, env={**os.environ, "PYTHONPATH": str(source)}, stdout=log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait_port(port)
        time.sleep(2.5)  # the gateway polls the backend's readiness every 2 s
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    import httpx

    answer = httpx.post(url, json=body, timeout=60)
    return answer.status_code, answer.content


def _shape(dialect: str, body: bytes) -> str:
    """Whether an error body has every field of its dialect's shape."""
    try:
        data = json.loads(body)
    except ValueError:
        return "not JSON"
    if dialect == "messages":
        whole = data.get("type") == "error" and {"type", "message"} <= set(data.get("error") or {})
    else:
        whole = {"message", "type", "param", "code"} <= set(data.get("error") or {})
    return "full" if whole else f"missing fields: {json.dumps(data)[:160]}"


def engine_500(source: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _gateway(source) as url:
        for dialect, (path, body) in DIALECTS.items():
            for stream in (False, True):
                cued = json.loads(json.dumps(body).replace("CUE", "HTML500")) | {"stream": stream}
                status, answer = _post(url + path, cued)
                out[f"{dialect}{' stream' if stream else ''}"] = {"status": status, "shape": _shape(dialect, answer)}
    return out


def _last_event(text: str) -> str:
    events = [block for block in text.split("\n\n") if block.strip()]
    if not events:
        return "nothing"
    last = events[-1]
    name = re.search(r"^event: (\S+)", last, re.M)
    data = last.split("data:", 1)[-1].strip()
    said = "an error" if '"error"' in data and ('"error": {' in data or '"error":{' in data) else data[:40]
    return f"{name[1] if name else 'data'}: {said}"


def no_done(source: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _gateway(source) as url:
        for dialect, (path, body) in DIALECTS.items():
            cued = json.loads(json.dumps(body).replace("CUE", "NODONE")) | {"stream": True}
            status, answer = _post(url + path, cued)
            out[dialect] = {"status": status, "last_event": _last_event(answer.decode(errors="replace"))}
    return out


# -- cases run in a process of their own, with the source tree's code --------------------------------------
def _counts() -> dict[str, Any]:
    import httpx

    from gateway.serving.app import create_app
    from tests.unit.http_harness import FakeEngine, Served, make_runtime

    engine = FakeEngine()
    upstream = Served(engine.app)
    runtime = make_runtime(upstream.url, template_path="/apply-template", max_concurrency=1, queue_limit=0,
                           max_body_bytes=4 * MB)  # fmt: skip
    gateway = Served(create_app(runtime))
    count = {"model": "front-model", "messages": [{"role": "user", "content": "x " * (MB // 2)}]}
    hang = {"model": "front-model", "stream": True, "messages": [{"role": "user", "content": "HANG"}]}
    chat = {"model": "front-model", "messages": [{"role": "user", "content": "hi"}]}

    async def counts_at_once(client: httpx.AsyncClient) -> list[int]:
        answers = await asyncio.gather(*(client.post("/v1/messages/count_tokens", json=count) for _ in range(40)))
        return [answer.status_code for answer in answers]

    try:
        with httpx.Client(base_url=gateway.url, timeout=120) as client:
            with client.stream("POST", "/v1/chat/completions", json=hang) as hanging:
                chunks = hanging.iter_raw()
                next(chunks)
                before = len(engine.seen)
                chat_status = client.post("/v1/chat/completions", json=chat).status_code

                async def run() -> list[int]:
                    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as aclient:
                        return await counts_at_once(aclient)

                statuses = asyncio.run(run())
                calls = len(engine.seen) - before
            time.sleep(0.5)
            before = len(engine.seen)
            free = client.post("/v1/messages/count_tokens", json=count).status_code
            free_calls = [seen["path"] for seen in engine.seen[before:]]
    finally:
        gateway.stop()
        upstream.stop()
    return {
        "queue_full": {"chat_status": chat_status, "counts": 40, "count_statuses": _tally(statuses),
                       "engine_calls": calls},
        "slot_free": {"count_status": free, "engine_calls": free_calls},
    }  # fmt: skip


def _tally(statuses: list[int]) -> dict[str, int]:
    return {str(status): statuses.count(status) for status in sorted(set(statuses))}


class _SleepingRank:
    """A follower that is a sleeping Python: what the worker runs as a rank here (no vLLM needed)."""

    engine = "vllm"
    title = "vLLM"
    inherit: tuple[str, ...] = ()

    def argv(self, command: Any, args: Any) -> list[str]:
        return [*command, *args]

    def env(self, host_ip: str, interface: str) -> dict[str, str]:
        return {}


def _worker_serve(port: int) -> None:
    """A worker whose vLLM ranks are sleeping Pythons, on ``port`` until killed."""
    import uvicorn

    from gateway.backends.base import Installation
    from gateway.core.devices import GIB, Inventory
    from gateway.nodes.followers import Hosted
    from gateway.nodes.worker import Worker, WorkerConfig, create_app

    sleeper = (sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))")
    hosted = {"vllm": Hosted(_SleepingRank(), Installation(sleeper, "1.0", "installed", "cpu"))}  # type: ignore[arg-type]
    work = Path(tempfile.mkdtemp(prefix="hardening47-worker-"))
    machine = Inventory((), 8 * GIB, 8 * GIB, source="none")
    worker = Worker(WorkerConfig(log_dir=work, cpu_memory="1GiB"), machine, ["rpc"], hosted)
    uvicorn.run(create_app(worker, ("k",)), host="127.0.0.1", port=port, log_level="error")


def _send_declared(port: int, body_head: bytes, filler: int, body_tail: bytes) -> str:
    """POST /group/start with a body of ``len(head) + filler + len(tail)`` bytes (its length declared),
    sent 1 MB at a time until the worker answers or hangs up: the status line, or how it ended."""
    size = len(body_head) + filler + len(body_tail)
    head = (f"POST /group/start HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\nContent-Type: "
            f"application/json\r\nContent-Length: {size}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
        try:
            conn.sendall(head + body_head)
            block = b"x" * MB
            for _ in range(filler // MB):
                conn.sendall(block)
            conn.sendall(body_tail)
        except OSError:
            pass
        try:
            return conn.recv(200).split(b"\r\n")[0].decode() or "closed"
        except OSError as exc:
            return type(exc).__name__


def worker_start(source: Path, peak_rss: Any) -> dict[str, Any]:
    import httpx

    port = _free_port()
    log = Path(tempfile.mkdtemp(prefix="hardening47-worker-log-")) / "worker.log"
    with log.open("wb") as sink:
        child = subprocess.Popen([sys.executable, __file__, "_worker", str(port)], stdout=sink,
                                 stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(source)})  # fmt: skip
    fresh = httpx.Limits(max_keepalive_connections=0)  # a worker that failed may close the connection
    try:
        _wait_port(port)
        served = psutil.Process(child.pid)
        good = {"engine": "vllm", "version": "1.0", "rank": 1, "args": ["600"], "host_ip": "127.0.0.1", "lease_s": 600}
        out: dict[str, Any] = {}
        url, key = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"}
        with httpx.Client(base_url=url, headers=key, timeout=120, limits=fresh) as client:
            running = client.post("/group/start", json=good).json()
            out["rank_started"] = {"state": running.get("state"), "pid": running.get("pid")}
            bodies = {
                "rank of 300 digits": json.dumps(good | {"rank": 10**300}),
                "argument of 10 MB": json.dumps(good | {"args": ["x" * 10_000_000]}),
                "nested 2000 deep": json.dumps(good).replace('["600"]', "[" * 2000 + "]" * 2000),
            }
            for name, body in bodies.items():
                try:
                    answer = client.post("/group/start", content=body, headers={"Content-Type": "application/json"})
                    said: dict[str, Any] = {"status": answer.status_code, "said": _said(answer)}
                except httpx.HTTPError as exc:
                    said = {"status": None, "said": type(exc).__name__}
                out[name] = {**said, **_survived(running, client.get("/group").json())}
                if not out[name]["rank_kept"]:  # the next case needs a running rank again
                    running = client.post("/group/start", json=good).json()
            before = served.memory_info().rss / MB
            with peak_rss(served) as peak:
                head, tail = json.dumps(good | {"args": ["ARG"]}).encode().split(b"ARG")
                line = _send_declared(port, head, 300 * MB, tail)  # a 300 MB argument
            out["body of 300 MB"] = {"answer": line, **_survived(running, client.get("/group").json()),
                                     "rss_before_mb": round(before, 1), "rss_peak_mb": round(peak.peak, 1)}  # fmt: skip
            client.post("/group/stop")
        out["tracebacks_in_its_log"] = log.read_text(errors="replace").count("Traceback")
        return out
    finally:
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=20)
        child.kill()


def _said(answer: Any) -> str:
    try:
        return str(answer.json()["error"]["message"])[:120]
    except (ValueError, KeyError, TypeError):
        return answer.text[:120]


def _survived(running: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    return {"rank_kept": state.get("state") == "running" and state.get("pid") == running.get("pid"),
            "rank_state": state.get("state"), "rank_reason": state.get("reason")}  # fmt: skip


def records(source: Path, runs: int = 3, each: int = 30) -> dict[str, Any]:
    """Two real processes record ``each`` configurations at once, ``runs`` times, as they come and with
    each write taking 20 ms (a busy disk): how many of the ``2 * each`` the file keeps."""
    sys.path.insert(0, str(ROOT))  # the recorder and its driver are this tree's test's; the store is source's
    from tests.unit.test_known_good import record_at_once

    kept: dict[str, list[int]] = {"as_they_come": [], "writes_of_20_ms": []}
    for _ in range(runs):
        for label, write_s in (("as_they_come", 0.0), ("writes_of_20_ms", 0.02)):
            state = Path(tempfile.mkdtemp(prefix="hardening47-store-"))
            kept[label].append(record_at_once(state, processes=2, each=each, write_s=write_s, root=source))
    return {"processes": 2, "records_each": each, f"kept_of_{2 * each}": kept}


def _in_own_process(source: Path, case: str) -> dict[str, Any]:
    """A case run by this file in a process whose ``gateway`` (and tests) are ``source``'s."""
    done = subprocess.run([sys.executable, __file__, "_case", case], env={**os.environ, "PYTHONPATH": str(source)},
                          capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["exit " + str(done.returncode)]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def issue_47_edge(source: Path, wanted: set[str], peak_rss: Any) -> dict[str, Any]:
    """The cases of this file that ``wanted`` names (``peak_rss``: benchmarks/peak_rss.py's PeakRss)."""
    results: dict[str, Any] = {}
    if "engine500" in wanted:
        results["engine500"] = engine_500(source)
    if "nodone" in wanted:
        results["nodone"] = no_done(source)
    if "counts" in wanted:
        results["counts"] = _in_own_process(source, "counts")
    if "worker" in wanted:
        results["worker"] = worker_start(source, peak_rss)
    if "records" in wanted:
        results["records"] = records(source)
    return results


def main() -> int:
    if sys.argv[1:2] == ["_case"]:
        print(json.dumps({"counts": _counts}[sys.argv[2]]()))
        return 0
    if sys.argv[1:2] == ["_worker"]:
        _worker_serve(int(sys.argv[2]))
        return 0
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="+", choices=["all", *CASES])
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree whose gateway runs (default: this one)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.peak_rss import PeakRss

    wanted = set(CASES) if "all" in args.what else set(args.what)
    print(json.dumps({"source": str(args.source), **issue_47_edge(args.source.resolve(), wanted, PeakRss)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
