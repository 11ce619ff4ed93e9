"""The hardening figures of issues 11, 23, 30, 41 and 47, measured on a real gateway process in front of a fake
upstream.

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
- flood: one valid chat request of 900,000 tiny messages (29 MB, under max_body_bytes): its status,
  the gateway's peak RSS, and the slowest /health answer (polled every 50 ms) while it is handled.
- large: four valid chat requests at once, each of 99,000 messages (30 MB: under both caps): their
  statuses, the slowest /health while they are parsed, checked and forwarded, and peak RSS.
- idle: 1,100 connections that send nothing, 200 sending a header line every 2 s and 20 sending a
  body a byte every 2 s (header/body timeouts 5 s): how many are still open after 10 s, the slowest
  /health meanwhile, peak RSS, and whether the gateway logged the connection cap.
- stalled: with one engine slot, a client opens an endless stream and reads nothing
  (stream_idle_timeout_s 5 s): how long until another request gets the slot (200), and peak RSS.
- endless: the upstream answers a streamed Messages request (translated) with 300 MB and no newline:
  what the client's stream ends with, how long it took, the slowest /health, peak RSS.
- hub: the hub families of issue 30 (benchmarks/hardening_hub.py): the hub code in its own process
  against a malicious local hub, and hostile GGUF headers, configs and names given to `gateway plan`.
- forged (issue 30): requests whose paths carry %0a, %0d%0a, an ANSI escape, NUL and U+202E, to an open
  gateway and (unauthenticated) to a keyed one: how many log lines begin with the forged text, and how
  many lines hold a raw control or bidi character.
- tools (issue 30): one Responses request (translated) with 99,000 tools of types no backend runs
  (21 MB): its status, the warning lines and bytes it added to the log, the slowest /health.
- readsize, responses, metadata, stop, replan (issue 41): see benchmarks/hardening_41.py.
- bearers, scrapes, keycap (issue 47: who a request is, bounded observability): see
  benchmarks/hardening_47_identity.py.
- engine500, nodone, counts, worker, records (issue 47, items 6 and 7): see benchmarks/hardening_47_edge.py.
- restarts, idlehang, noslots (issue 47: recovery): see benchmarks/hardening_47_recovery.py.
- starved, warmturns, lane, fingerprint (issue 47's waits): see benchmarks/hardening_47_waits.py.

RSS is the gateway process's (psutil, sampled every 20 ms while an attack runs). The issue-23 cases
run against their own gateway with short clocks (5 s) so that the run stays short; a tree without
those settings (``--source`` of an older checkout) is run with its defaults.
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
sys.path.insert(0, str(ROOT))
import benchmarks.hardening_47_edge as hardening_47_edge  # noqa: E402
import benchmarks.hardening_47_identity as hardening_47_identity  # noqa: E402
import benchmarks.hardening_47_recovery as hardening_47_recovery  # noqa: E402
from benchmarks import hardening_41, hardening_47_waits  # noqa: E402 (after the path it needs)
from benchmarks.peak_rss import PeakRss, rss_mb  # noqa: E402

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
    if case := hardening_41.upstream_cases(cue, request, web) or hardening_47_waits.upstream_cases(cue, request, web):
        return await case  # type: ignore[no-any-return]
    if "ENDLESS" in cue or "LONGLINE" in cue:  # a stream that never ends / 300 MB without a newline
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"y" * 65536 + b'"}}]}\n\n'
        block = b"x" * MB if "LONGLINE" in cue else chunk
        with contextlib.suppress(ConnectionError):
            for _ in range(300 if "LONGLINE" in cue else 1_000_000):
                await response.write(block)
        return response
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
def servers(source: Path, extra: list[str] | None = None) -> Iterator[tuple[str, psutil.Process]]:
    """The fake upstream and a gateway (from ``source``, with ``extra`` flags) fronting it: (gateway URL,
    gateway process)."""
    up_port, gw_port = _free_port(), _free_port()
    upstream = subprocess.Popen([sys.executable, __file__, "upstream", str(up_port)])
    work = tempfile.mkdtemp(prefix="hardening-")
    argv = [
        sys.executable, "-m", "gateway", "serve", "--backend-url", f"http://127.0.0.1:{up_port}", "--model", "fake",
        "--backend-native-apis", "include_usage", "--port", str(gw_port), "--state-dir", work, *(extra or []),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(source)}
    gateway = None
    try:
        _wait_port(up_port)
        log = open(Path(work) / "gateway.log", "wb")  # noqa: SIM115 - closed with the process
        gateway = subprocess.Popen(argv, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)
        _wait_port(gw_port)
        servers.log = Path(work) / "gateway.log"  # type: ignore[attr-defined]
        yield f"http://127.0.0.1:{gw_port}", psutil.Process(gateway.pid)
    finally:
        for process in (gateway, upstream):
            if process is not None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=20)
                process.kill()


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


# -- issue 23 ------------------------------------------------------------------------------------------
class HealthWatch:
    """Polls /health every 50 ms in a thread; the slowest answer (or the timeout) while the block runs."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self.failures, self._stop = url + "/health", 0.0, 0, threading.Event()

    def __enter__(self) -> HealthWatch:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        import urllib.request

        while not self._stop.wait(0.05):
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as answer:
                    answer.read()
            except OSError:
                self.failures += 1
            self.worst = max(self.worst, time.monotonic() - started)

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, Any]:
        return {"health_worst_s": round(self.worst, 3), "health_failures": self.failures}


def flood(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """One chat request of 900,000 one-letter messages (29 MB: under max_body_bytes)."""
    body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "a"}] * 900_000}).encode()

    async def send() -> int:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session,
            session.post(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}) as r,
        ):
            await r.read()
            return r.status

    before = rss_mb(gateway)
    started = time.monotonic()
    with PeakRss(gateway) as peak, HealthWatch(url) as health:
        status = asyncio.run(send())
    return {"body_mb": round(len(body) / MB, 1), "status": status, "seconds": round(time.monotonic() - started, 2),
            **health.figures(), **_rss(before, peak, gateway)}  # fmt: skip


def large_bodies(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """Four chat requests at once, each as large as both caps allow: /health must stay answered."""
    content = "x" * 280
    body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": content}] * 99_000}).encode()

    async def send(session: aiohttp.ClientSession) -> int:
        async with session.post(
            url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as answer:
            await answer.read()
            return answer.status

    async def send_all() -> list[int]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return list(await asyncio.gather(*(send(session) for _ in range(4))))

    before = rss_mb(gateway)
    started = time.monotonic()
    with PeakRss(gateway) as peak, HealthWatch(url) as health:
        statuses = asyncio.run(send_all())
    seconds = round(time.monotonic() - started, 2)
    return {"body_mb": round(len(body) / MB, 1), "statuses": statuses, "seconds": seconds,
            **health.figures(), **_rss(before, peak, gateway)}  # fmt: skip


def _raise_fd_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))


def idle_connections(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """1,100 silent connections, 200 slowloris header senders, 20 slow bodies; what is open 10 s later."""
    _raise_fd_limit()
    host, port = url.removeprefix("http://").split(":")
    address = (host, int(port))
    before = rss_mb(gateway)
    conns: list[tuple[str, socket.socket]] = []
    with PeakRss(gateway) as peak, HealthWatch(url) as health:
        for kind, count in (("silent", 1100), ("slow header", 200), ("slow body", 20)):
            for _ in range(count):
                try:
                    conn = socket.create_connection(address, timeout=5)
                except OSError:
                    continue
                conn.setblocking(False)
                if kind == "slow header":
                    conn.send(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                elif kind == "slow body":
                    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                              b"application/json\r\nContent-Length: 1000\r\n\r\n{")  # fmt: skip
                conns.append((kind, conn))
        opened = {kind: sum(k == kind for k, _ in conns) for kind in ("silent", "slow header", "slow body")}
        for _ in range(5):  # 10 s: a header line or a body byte every 2 s from the slow ones
            time.sleep(2)
            for kind, conn in conns:
                with contextlib.suppress(OSError):
                    if kind == "slow header":
                        conn.send(b"X-Slow: 1\r\n")
                    elif kind == "slow body":
                        conn.send(b" ")
    still_open: dict[str, int] = {}
    for kind, conn in conns:
        try:
            answer = conn.recv(65536)  # non-blocking: nothing yet means still open
            alive = answer != b"" and not answer.startswith(b"HTTP/1.1 408")
        except BlockingIOError:
            alive = True
        except OSError:
            alive = False
        still_open[kind] = still_open.get(kind, 0) + alive
        conn.close()
    log_path: Path = servers.log  # type: ignore[attr-defined]
    capped = "max_connections" in log_path.read_text(errors="replace")
    return {"opened": opened, "open_after_10_s": still_open, "cap_logged": capped, **health.figures(),
            **_rss(before, peak, gateway)}  # fmt: skip


def stalled_reader(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """One slot; a client opens an endless stream and never reads; when does the next request get in?"""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "fake", "stream": True, "messages": [{"role": "user", "content": "ENDLESS"}]})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}").encode()  # fmt: skip
    before = rss_mb(gateway)
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect((host, int(port)))
    reader.sendall(head)
    started = time.monotonic()
    statuses: list[int] = []
    import urllib.error
    import urllib.request

    ask = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}).encode()
    with PeakRss(gateway) as peak:
        while time.monotonic() - started < 60:  # still refused after a minute: held for good
            request = urllib.request.Request(url + "/v1/chat/completions", ask, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    statuses.append(answer.status)
                    break
            except urllib.error.HTTPError as refused:
                statuses.append(refused.code)
            time.sleep(0.5)
    freed_after = time.monotonic() - started
    reader.close()
    return {"slot_free_after_s": round(freed_after, 1), "refused_meanwhile": len(statuses) - 1,
            "last_status": statuses[-1] if statuses else None, **_rss(before, peak, gateway)}  # fmt: skip


def endless_line(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """A streamed Messages request whose upstream sends 300 MB without a newline."""
    body = {"model": "fake", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "LONGLINE"}]}

    async def ask() -> tuple[int, bytes]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            return await _post(session, url + "/v1/messages", body)

    before = rss_mb(gateway)
    started = time.monotonic()
    with PeakRss(gateway) as peak, HealthWatch(url) as health:
        status, answer = asyncio.run(ask())
    events = [line for line in answer.decode(errors="replace").splitlines() if line.startswith("event:")]
    return {
        "status": status, "seconds": round(time.monotonic() - started, 1), "last_event": events[-1] if events else None,
        "tail": answer[-200:].decode(errors="replace"), **health.figures(), **_rss(before, peak, gateway),
    }  # fmt: skip


FORGED = "gateway.access INFO GET /v1/models 200 1 ms in=? out=? client=10.0.0.1:1 FORGED"
HOSTILE_PATHS = ("%0a", "%0d%0a", "%1b[2K%1b[1G", "%00", "%e2%80%ae")


def _raw_get(url: str, path: str) -> int:
    """GET a path exactly as written (percent escapes unchanged); the status."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def _log_text() -> str:
    return Path(servers.log).read_bytes().decode("utf-8", "replace")  # type: ignore[attr-defined]


def forged_lines(url: str, _gateway: psutil.Process) -> dict[str, Any]:
    """Each hostile path 20 times: the log lines (split at LF or CR, as a terminal shows them) that begin
    with the forged text, and the lines holding a raw control or bidi character."""
    before = len(_log_text())
    statuses = [
        _raw_get(url, f"/v1/x{escape}{FORGED.replace(' ', '%20')}") for escape in HOSTILE_PATHS for _ in range(20)
    ]
    time.sleep(0.5)
    added = _log_text()[before:]
    shown = added.replace("\r", "\n").split("\n")
    forged = sum(line.lstrip("\x00").startswith(FORGED[:30]) for line in shown)
    raw = sum(any(char in line for char in "\x00\x1b\r\u202e") for line in added.split("\n"))
    return {"requests": len(statuses), "statuses": sorted(set(statuses)), "forged_lines": forged,
            "lines_with_raw_controls": raw}  # fmt: skip


def many_tools(url: str, gateway: psutil.Process) -> dict[str, Any]:
    """One Responses request with 99,000 tools of a type no backend runs (21 MB)."""
    tool = {"type": "web_search", "description": "x" * 190}
    body = json.dumps({"model": "fake", "input": "hi", "tools": [tool] * 99_000}).encode()
    before = len(_log_text())

    async def send() -> int:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session,
            session.post(url + "/v1/responses", data=body, headers={"Content-Type": "application/json"}) as r,
        ):
            await r.read()
            return r.status

    started = time.monotonic()
    with HealthWatch(url) as health:
        status = asyncio.run(send())
    seconds = round(time.monotonic() - started, 2)
    time.sleep(0.5)
    added = _log_text()[before:]
    warnings = sum("WARNING" in line for line in added.splitlines())
    return {"body_mb": round(len(body) / MB, 1), "status": status, "seconds": seconds, "warning_lines": warnings,
            "log_bytes_added": len(added.encode()), **health.figures()}  # fmt: skip


def issue_30(source: Path, wanted: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if "forged" in wanted:
        with servers(source) as (url, gateway):
            time.sleep(2.5)
            results["forged_open"] = forged_lines(url, gateway)
        with servers(source, ["--api-key", "sk-bench"]) as (url, gateway):
            time.sleep(2.5)
            results["forged_keyed_unauthenticated"] = forged_lines(url, gateway)
    if "tools" in wanted:
        with servers(source) as (url, gateway):
            time.sleep(2.5)
            results["tools"] = many_tools(url, gateway)
    return results


def _supported(source: Path, flag: str) -> bool:
    env = {**os.environ, "PYTHONPATH": str(source)}
    shown = subprocess.run([sys.executable, "-m", "gateway", "serve", "--help"], cwd=source, env=env,
                           capture_output=True, text=True, check=False).stdout  # fmt: skip
    return flag in shown


def issue_23(source: Path, wanted: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    short = ["--client-header-timeout", "5", "--client-body-timeout", "5", "--stream-idle-timeout", "5"]
    clocks = short if _supported(source, "--client-header-timeout") else ["--stream-idle-timeout", "5"]
    if wanted & {"flood", "large", "idle", "endless"}:
        with servers(source, clocks) as (url, gateway):
            time.sleep(2.5)
            cases = (("flood", flood), ("large", large_bodies), ("idle", idle_connections), ("endless", endless_line))
            for name, case in cases:
                if name in wanted:
                    results[name] = case(url, gateway)
    if "stalled" in wanted:
        with servers(source, [*clocks, "--backend-max-concurrency", "1", "--queue-limit", "0"]) as (url, gateway):
            time.sleep(2.5)
            results["stalled"] = stalled_reader(url, gateway)
    return results


def main() -> int:
    if sys.argv[1:2] == ["upstream"]:  # the fake upstream's own process
        run_upstream(int(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "what", nargs="+",
        choices=["all", "headers", "huge", "streams", "load", "flood", "large", "idle", "stalled", "endless",
                 "forged", "tools", "hub", "readsize", "responses", "metadata", "replan", "stop",
                 *hardening_47_identity.CASES, *hardening_47_edge.CASES,
                 *hardening_47_recovery.CASES, *hardening_47_waits.CASES],
    )  # fmt: skip
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree whose gateway runs (default: this one)")
    parser.add_argument("--requests", type=int, default=100_000, help="load/leak: requests at c=64")
    parser.add_argument("--streams", type=int, default=256)
    args = parser.parse_args()
    everything = {
        "headers",
        "huge",
        "streams",
        "load",
        "flood",
        "large",
        "idle",
        "stalled",
        "endless",
        "forged",
        "tools",
        "readsize",
        "responses",
        "metadata",
        "replan",
        "stop",
        *hardening_47_identity.CASES,
        *hardening_47_edge.CASES,
        *hardening_47_recovery.CASES,
        *hardening_47_waits.CASES,
    }
    wanted = everything if "all" in args.what else set(args.what)
    results: dict[str, Any] = {"source": str(args.source)}
    results.update(issue_23(args.source, wanted))
    results.update(issue_30(args.source, wanted))
    results.update(hardening_41.issue_41(args.source.resolve(), wanted, servers, HealthWatch, PeakRss))
    results.update(hardening_47_identity.issue_47_identity(args.source.resolve(), wanted, servers, HealthWatch))
    results.update(hardening_47_edge.issue_47_edge(args.source.resolve(), wanted, PeakRss))
    results.update(hardening_47_recovery.issue_47(args.source.resolve(), wanted))
    results.update(hardening_47_waits.issue_47_waits(args.source.resolve(), wanted, servers, HealthWatch))
    if "hub" in args.what:  # not part of "all": it runs the hub code, not a gateway in front of an upstream
        sys.path.insert(0, str(ROOT))
        from benchmarks.hardening_hub import hub_families

        results["hub"] = hub_families(args.source.resolve())
    if not wanted & {"headers", "huge", "streams", "load"}:
        print(json.dumps(results, indent=2))
        return 0
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
