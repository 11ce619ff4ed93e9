"""The hardening figures of issue 11, measured on a real gateway process in front of a fake upstream.

    python benchmarks/hardening.py all                 # every figure below, this checkout
    python benchmarks/hardening.py headers huge        # some of them
    python benchmarks/hardening.py all --source DIR    # the gateway from another tree (e.g. `git archive`)
    python benchmarks/hardening.py all --requests 20000 --streams 256

- headers: 10 connections each send 64 MiB of a header that never ends (no key): the gateway's peak
  RSS, and what each connection was answered.
- huge: the upstream answers a non-streamed Messages request (translated) with a 300 MB body: the
  gateway's peak RSS and the status the client got.
- streams: 256 concurrent slow streams (20 chunks 100 ms apart): how many completed, RSS before/after.
- load: 64 concurrent non-streamed chat requests for a while: requests, errors, rate.
- leak: RSS sampled every 10,000 non-streamed requests (c=64) up to --requests.

RSS is the gateway process's (psutil, sampled every 20 ms while an attack runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
ANSWER = {
    "id": "chatcmpl-h",
    "object": "chat.completion",
    "created": 0,
    "model": "fake",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}


# -- the fake upstream (its own process) ---------------------------------------------------------------
async def _chat(request: web.Request) -> web.StreamResponse:
    payload = await request.json()
    cue = json.dumps(payload.get("messages"))
    if "HUGE" in cue:  # 300 MB of one JSON answer, written 1 MB at a time
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"choices": [{"message": {"role": "assistant", "content": "')
        block = b"x" * MB
        with contextlib.suppress(ConnectionError):  # a gateway that gives up early hangs up
            for _ in range(300):
                await response.write(block)
            await response.write(b'"}, "finish_reason": "stop"}]}')
        return response
    if not payload.get("stream"):
        return web.json_response(ANSWER)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n in range(20):
        chunk = {"choices": [{"index": 0, "delta": {"content": f"t{n} "}, "finish_reason": None}]}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await asyncio.sleep(0.1)
    await response.write(b"data: [DONE]\n\n")
    return response


async def _models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "max_model_len": 4096}]})


def run_upstream(port: int) -> None:
    app = web.Application(client_max_size=64 * MB)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- processes -----------------------------------------------------------------------------------------
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
def servers(source: Path) -> Iterator[tuple[str, psutil.Process]]:
    """The fake upstream and a gateway (from ``source``) fronting it: (gateway URL, gateway process)."""
    up_port, gw_port = _free_port(), _free_port()
    upstream = subprocess.Popen([sys.executable, __file__, "upstream", str(up_port)])
    work = tempfile.mkdtemp(prefix="hardening-")
    argv = [
        sys.executable, "-m", "gateway", "serve", "--backend-url", f"http://127.0.0.1:{up_port}", "--model", "fake",
        "--backend-native-apis", "include_usage", "--port", str(gw_port), "--state-dir", work,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(source)}
    gateway = None
    try:
        _wait_port(up_port)
        log = open(Path(work) / "gateway.log", "wb")  # noqa: SIM115 - closed with the process
        gateway = subprocess.Popen(argv, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)
        _wait_port(gw_port)
        yield f"http://127.0.0.1:{gw_port}", psutil.Process(gateway.pid)
    finally:
        for process in (gateway, upstream):
            if process is not None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=20)
                process.kill()


def rss_mb(process: psutil.Process) -> float:
    return float(process.memory_info().rss) / MB


class PeakRss:
    """The highest RSS of a process while the block runs."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self.peak, self._stop = process, rss_mb(process), threading.Event()

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, rss_mb(self.process))

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the measurements ----------------------------------------------------------------------------------
def headers_attack(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """10 connections x 64 MiB of an unfinished header, no key."""
    host, port = url.removeprefix("http://").split(":")
    answers: list[str] = []
    before = rss_mb(gateway)

    def attack() -> None:
        with socket.create_connection((host, int(port)), timeout=60) as conn:
            answer = "sent all 64 MiB"
            try:
                conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Pad: ")
                block = b"a" * MB
                for _ in range(64):
                    conn.sendall(block)
                conn.settimeout(2)
                answer = conn.recv(200).split(b"\r\n")[0].decode() or "closed"
            except OSError as exc:
                with contextlib.suppress(OSError):
                    answer = conn.recv(200).split(b"\r\n")[0].decode() or type(exc).__name__
                if answer == "sent all 64 MiB":
                    answer = type(exc).__name__
            answers.append(answer)

    with PeakRss(gateway) as peak:
        threads = [threading.Thread(target=attack) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return {"rss_before_mb": round(before, 1), "rss_peak_mb": round(peak.peak, 1), "answers": sorted(set(answers))}


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with session.post(url, json=body) as response:
        return response.status, await response.read()


def _rss(before: float, peak: PeakRss, gateway: psutil.Process) -> dict[str, float]:
    after = rss_mb(gateway)
    return {"rss_before_mb": round(before, 1), "rss_peak_mb": round(peak.peak, 1), "rss_after_mb": round(after, 1)}


def huge_answer(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """A non-streamed Messages request whose upstream answer is 300 MB."""
    body = {"model": "fake", "max_tokens": 16, "messages": [{"role": "user", "content": "HUGE"}]}

    async def ask() -> tuple[int, bytes]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return await _post(session, url + "/v1/messages", body)

    before = rss_mb(gateway)
    with PeakRss(gateway) as peak:
        status, answer = asyncio.run(ask())
    return {
        "status": status, "answer_bytes": len(answer), "answer_head": answer[:160].decode(errors="replace"),
        **_rss(before, peak, gateway),
    }  # fmt: skip


def slow_streams(url: str, gateway: psutil.Process, count: int) -> dict[str, Any]:
    """``count`` concurrent streams of 20 chunks 100 ms apart: how many end with [DONE]."""
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

    async def one(session: aiohttp.ClientSession) -> bool:
        status, data = await _post(session, url + "/v1/chat/completions", body)
        return status == 200 and data.rstrip().endswith(b"data: [DONE]") and data.count(b"data: ") == 21

    async def run() -> list[bool]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
            return await asyncio.gather(*(one(session) for _ in range(count)))

    before = rss_mb(gateway)
    started = time.monotonic()
    with PeakRss(gateway) as peak:
        done = asyncio.run(run())
    return {
        "streams": count, "completed": sum(done), "seconds": round(time.monotonic() - started, 1),
        **_rss(before, peak, gateway),
    }  # fmt: skip


async def _load(url: str, total: int, concurrency: int, every: int, on_mark: Callable[[int], None]) -> dict[str, Any]:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    sent = errors = 0
    statuses: dict[int, int] = {}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent, errors
        while sent < total:
            sent += 1
            if sent % every == 0:
                on_mark(sent)
            try:
                status, _ = await _post(session, url + "/v1/chat/completions", body)
            except aiohttp.ClientError:
                status = -1
            statuses[status] = statuses.get(status, 0) + 1
            errors += status != 200

    connector = aiohttp.TCPConnector(limit=0)
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    seconds = time.monotonic() - started
    return {"requests": sent, "errors": errors, "statuses": statuses, "seconds": round(seconds, 1),
            "per_second": round(sent / seconds)}  # fmt: skip


def load(url: str, gateway: psutil.Process, requests: int) -> dict[str, Any]:
    """``requests`` non-streamed chat requests at concurrency 64, RSS every 10,000."""
    marks: list[tuple[int, float]] = [(0, round(rss_mb(gateway), 1))]
    result = asyncio.run(_load(url, requests, 64, 10_000, lambda n: marks.append((n, round(rss_mb(gateway), 1)))))
    marks.append((result["requests"], round(rss_mb(gateway), 1)))
    return {**result, "rss_mb_by_requests": marks}


def main() -> int:
    if sys.argv[1:2] == ["upstream"]:  # the fake upstream's own process
        run_upstream(int(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="+", choices=["all", "headers", "huge", "streams", "load"])
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree whose gateway runs (default: this one)")
    parser.add_argument("--requests", type=int, default=100_000, help="load/leak: requests at c=64")
    parser.add_argument("--streams", type=int, default=256)
    args = parser.parse_args()
    wanted = {"headers", "huge", "streams", "load"} if "all" in args.what else set(args.what)
    results: dict[str, Any] = {"source": str(args.source)}
    with servers(args.source) as (url, gateway):
        time.sleep(2.5)  # the gateway polls the backend's readiness every 2 s
        results["rss_idle_mb"] = round(rss_mb(gateway), 1)
        if "streams" in wanted:
            results["streams"] = slow_streams(url, gateway, args.streams)
        if "load" in wanted:
            results["load"] = load(url, gateway, args.requests)
        if "huge" in wanted:
            results["huge"] = huge_answer(url, gateway)
        if "headers" in wanted:
            results["headers"] = headers_attack(url, gateway)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
