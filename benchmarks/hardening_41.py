"""Issue 41's figures, on a real gateway process in front of the fake upstream of ``benchmarks/hardening.py``.

- readsize: a streamed Messages request (translated) whose upstream sends 15 MB of empty deltas written
  in 4 KB and in 256 KB blocks: the gateway's CPU seconds per MB for each (psutil, the whole process),
  the slowest /health meanwhile.
- responses: a streamed Responses request (translated) whose upstream sends 64 KB deltas, 30 MB and
  300 MB of them: the gateway's peak RSS for each, the last event, the slowest /health.
- metadata: translated Responses requests (whole and streamed) whose ``metadata`` forges usage figures
  (0, 10^15, 10^309, 10^400): the statuses, the access lines' figures and ``gateway_tokens_total``.
- stop: a fast endless passthrough stream (64 KB events, as fast as the upstream writes them), the
  gateway sent SIGHUP 1 s in (shutdown_grace_s 1), three times: how many streams end with a readable
  error event (a whole ``data: {"error": …}`` event) rather than in content.
- replan: in this process, a supervisor (a stand-in engine) whose plan pools a real HTTP worker that
  answers ``/inventory`` with ``[1,2,3]`` while the engine dies, then recovers: what /ready would say
  meanwhile and how long until it serves again.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil

MB = 1024 * 1024


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def _stream(url: str, path: str, body: dict[str, Any]) -> tuple[int, int, str]:
    """(status, bytes read, the name of the last event) of a streamed answer."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session,
        session.post(url + path, json=body) as response,
    ):
        size, tail, last = 0, b"", ""
        async for block in response.content.iter_any():
            size += len(block)
            seen = tail + block
            if names := re.findall(rb"event: ([\w.]+)\n", seen):
                last = names[-1].decode()
            tail = seen[-64:]
        return response.status, size, last


def read_sizes(url: str, gateway: psutil.Process, health: Callable[[str], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, cue in (("4KB", "DELTAS-4096"), ("256KB", "DELTAS-262144")):
        body = {"model": "fake", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": cue}]}
        _ready(url)
        before = _cpu_s(gateway)
        started = time.monotonic()
        with health(url) as watch:
            status, _size, last = asyncio.run(_stream(url, "/v1/messages", body))
        cpu = _cpu_s(gateway) - before
        out[label] = {
            "status": status, "upstream_mb": 15, "gateway_cpu_s": round(cpu, 2),
            "cpu_ms_per_mb": round(cpu * 1000 / 15, 1), "seconds": round(time.monotonic() - started, 1),
            "last_event": last,
            **watch.figures(),
        }  # fmt: skip
    return out


def responses_memory(url: str, gateway: psutil.Process, health: Callable[[str], Any], peak_rss: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mb in (30, 300):
        body = {"model": "fake", "stream": True, "input": [{"role": "user", "content": f"RESPONSES-{mb}"}]}
        started = time.monotonic()
        with health(url) as watch, peak_rss(gateway) as peak:
            status, size, last = asyncio.run(_stream(url, "/v1/responses", body))
        out[f"{mb}MB"] = {
            "status": status, "streamed_mb": round(size / MB, 1), "last_event": last,
            "seconds": round(time.monotonic() - started, 1), "rss_peak_mb": round(peak.peak, 1), **watch.figures(),
        }  # fmt: skip
    return out


FORGED = [
    {"input_tokens": 0, "output_tokens": 0},
    {"prompt_tokens": 10**15},
    {"prompt_tokens": int("9" * 309)},
    {"prompt_tokens": int("9" * 309)},
    {"input_tokens": 10**400},
]


def metadata_counters(url: str, log: Path) -> dict[str, Any]:
    async def run() -> tuple[list[int], str]:  # a status of -1: the answer was cut short
        statuses = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            for stream in (False, True):
                for metadata in FORGED:
                    body = {"model": "fake", "input": "hi", "stream": stream, "metadata": metadata}
                    try:
                        async with session.post(url + "/v1/responses", json=body) as response:
                            await response.read()
                            statuses.append(response.status)
                    except aiohttp.ClientError:  # the answer cut short
                        statuses.append(-1)
            async with session.get(url + "/metrics") as response:
                return statuses, await response.text()

    statuses, metrics = asyncio.run(run())
    time.sleep(0.5)
    lines = [line for line in log.read_text(errors="replace").splitlines() if "POST /v1/responses" in line]
    figures = sorted({m.group(0) for line in lines if (m := re.search(r"in=\S+ out=\S+", line))})
    tokens = {m[1]: m[2] for m in re.finditer(r'gateway_tokens_total\{direction="(\w+)"\} (\S+)', metrics)}
    return {"requests": len(statuses), "statuses": sorted(set(statuses)), "access_figures": figures,
            "gateway_tokens_total": tokens}  # fmt: skip


def replan_recovery(source: Path, raising: bool) -> dict[str, Any]:
    """The stuck re-plan of issue 41, in this process (the gateway code of ``source``): a real worker over
    HTTP that answers ``/inventory`` with ``[1,2,3]`` for 3 s, a stand-in engine that dies while it does
    (so the supervisor re-plans), then the worker answers well again. ``raising``: the re-plan itself
    raises while the worker is bad (an error no check foresaw), which only the supervisor's guard catches."""
    sys.path.insert(0, str(source))
    from aiohttp import web

    from gateway.backends.llamacpp.launcher import NATIVE
    from gateway.core.devices import GIB, Inventory
    from gateway.nodes import survey
    from gateway.supervision.lifecycle import State
    from gateway.supervision.supervisor import Supervisor
    from tests.unit.test_multinode import _inventory_answer, serves_then_dies_lost
    from tests.unit.test_supervisor_transitions import Engines, _llama, serves

    broken = {"on": False}

    async def inventory(_request: web.Request) -> web.Response:
        answer: Any = [1, 2, 3] if broken["on"] else _inventory_answer("node2", "127.0.0.1", [2000])
        return web.json_response(answer)

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def scenario() -> dict[str, Any]:
        app = web.Application()
        app.router.add_get("/inventory", inventory)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        nodes = survey.Nodes([f"127.0.0.1:{port}"], "key")
        head = Inventory((), 16 * GIB, 16 * GIB, source="none")
        pooled, alone = _llama(rpc=(f"127.0.0.1:{port}",), launcher=NATIVE), _llama(launcher=NATIVE)

        def replan() -> tuple[list[Any], dict[str, Any]]:
            remote = nodes.survey(head).remote
            if raising and broken["on"]:  # past the survey: only the supervisor's guard stands
                raise AttributeError("'list' object has no attribute 'get'")
            return [pooled if remote else alone], {"decision": f"{len(remote)} remote device(s)"}

        async def short(seconds: float) -> None:
            await asyncio.sleep(min(seconds, 0.5))

        engines = Engines(serves_then_dies_lost(), serves(), serves())
        supervisor = Supervisor([pooled], log_dir=Path("/tmp"), startup_timeout_s=1, shutdown_grace_s=1,
                                run_factory=engines, sleep=short, replan=replan)  # fmt: skip
        broken["on"] = True
        await supervisor.start()
        seen: list[tuple[str, str | None]] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            now = (supervisor.state.value, supervisor.reason)
            if not seen or seen[-1] != now:
                seen.append(now)
            await asyncio.sleep(0.01)
        broken["on"] = False
        recovered = time.monotonic()
        while not (supervisor.state is State.READY and len(engines.runs) >= 2) and time.monotonic() - recovered < 30:
            await asyncio.sleep(0.01)
        result = {
            "states_while_the_worker_is_bad": [{"state": s, "reason": (r or "")[:160]} for s, r in seen],
            "serving_after_the_worker_recovers_s": round(time.monotonic() - recovered, 2),
            "state_then": supervisor.state.value,
            "replans": len(supervisor.replans),
        }
        await supervisor.stop()
        await runner.cleanup()
        return result

    return asyncio.run(scenario())


def upstream_cases(cue: str, request: Any, web: Any) -> Any:
    """The fake upstream's answers for this issue's cues (a coroutine for ``_chat``), or None."""

    async def deltas(block_bytes: int) -> Any:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}\n\n'
        per_block = max(1, block_bytes // len(event))
        block = event * per_block
        for _ in range(15 * MB // len(block)):  # paced, so that each write arrives as one read of that size
            await response.write(block)
            await asyncio.sleep(0.002)
        await response.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        return response

    async def text(mb: int) -> Any:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"y" * 65536 + b'"},"finish_reason":null}]}\n\n'
        try:
            for _ in range(mb * 16):
                await response.write(chunk)
            await response.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:
            pass
        return response

    if match := re.search(r"DELTAS-(\d+)", cue):
        return deltas(int(match[1]))
    if match := re.search(r"RESPONSES-(\d+)", cue):
        return text(int(match[1]))
    return None


async def _stopped_stream(url: str, gateway: psutil.Process) -> tuple[int, str]:
    """(MB read, how it ended) of a fast endless stream whose gateway gets SIGHUP 1 s in."""
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "ENDLESS"}]}
    size, tail = 0, b""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(url + "/v1/chat/completions", json=body) as response,
    ):
        asyncio.get_running_loop().call_later(1.0, lambda: gateway.send_signal(signal.SIGHUP))
        try:
            async for block in response.content.iter_any():
                size += len(block)
                tail = (tail + block)[-2000:]
        except aiohttp.ClientError as exc:
            return size // MB, f"cut: {type(exc).__name__}"
    last = tail.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    if last.startswith(b'data: {"error"') and tail.endswith(b"\n\n"):
        return size // MB, "error event"
    return size // MB, "content, then the end" if b'"error"' not in last else "error run into content"


def stops(source: Path, servers: Any) -> dict[str, Any]:
    ends = []
    for _ in range(3):
        with servers(source, ["--shutdown-grace", "1"]) as (url, gateway):
            time.sleep(2.5)
            ends.append(asyncio.run(_stopped_stream(url, gateway)))
            gateway.wait(30)
    return {"runs": len(ends), "error_event": sum(end == "error event" for _, end in ends),
            "ends": [f"{mb} MB read, {end}" for mb, end in ends]}  # fmt: skip


def _ready(url: str, timeout_s: float = 60) -> None:
    """Until the gateway serves again (a case that pegged its CPU can leave it marking the backend down)."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)


def issue_41(source: Path, wanted: set[str], servers: Any, health: Any, peak_rss: Any) -> dict[str, Any]:
    """This issue's cases that ``wanted`` names (``servers``, ``health``, ``peak_rss``: hardening.py's)."""
    results: dict[str, Any] = {}
    if wanted & {"readsize", "responses", "metadata"}:
        with servers(source) as (url, gateway):
            time.sleep(2.5)
            if "readsize" in wanted:
                results["readsize"] = read_sizes(url, gateway, health)
            if "responses" in wanted:
                _ready(url)
                results["responses"] = responses_memory(url, gateway, health, peak_rss)
            if "metadata" in wanted:
                _ready(url)
                results["metadata"] = metadata_counters(url, servers.log)
    if "stop" in wanted:
        results["stop"] = stops(source, servers)
    if "replan" in wanted:
        results["replan_malformed_worker"] = replan_recovery(source, raising=False)
        results["replan_survey_raises"] = replan_recovery(source, raising=True)
    return results
