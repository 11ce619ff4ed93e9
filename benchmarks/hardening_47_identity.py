"""Issue 47's identity and observability figures, on a real gateway process in front of the fake upstream of
``benchmarks/hardening.py``.

    python benchmarks/hardening.py bearers keycap scrapes                 # this tree, about 2 minutes
    python benchmarks/hardening.py bearers keycap scrapes --source DIR    # another checkout

- bearers: 30,000 non-streamed chat requests (64 at once) to an open gateway, each with its own random
  ``Authorization: Bearer``: the ``key`` label values and ``gateway_key_requests_total`` series in
  ``/metrics``, its size, the size of ``/status``, the gateway's RSS before and after.
- scrapes: on that gateway, right after ``bearers``, three ``/metrics`` scrapes at once: the slowest
  ``/health`` (polled every 50 ms) meanwhile, and how long each scrape took.
- keycap: a keyed gateway with ``--max-inflight-per-key 1``; four streamed requests at once (20 chunks
  100 ms apart each), every one with the valid ``x-api-key`` and its own bogus ``Authorization: Bearer``:
  the most of them in the engine at once (each one's time from its first chunk to its end, as the client
  saw it; overlapping spans are requests the engine ran together), and the total time.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import psutil

CASES = ("bearers", "scrapes", "keycap")
MB = 1024 * 1024
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}


def _rss_mb(process: psutil.Process) -> float:
    return round(float(process.memory_info().rss) / MB, 1)


async def _random_bearers(url: str, total: int, concurrency: int) -> dict[str, Any]:
    sent = 0
    statuses: dict[int, int] = {}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < total:
            sent += 1
            headers = {"Authorization": f"Bearer {uuid.uuid4().hex}"}
            try:
                async with session.post(url + "/v1/chat/completions", json=CHAT, headers=headers) as answer:
                    await answer.read()
                    status = answer.status
            except aiohttp.ClientError:
                status = -1
            statuses[status] = statuses.get(status, 0) + 1

    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return {"requests": sent, "statuses": statuses, "seconds": round(time.monotonic() - started, 1)}


async def _get(url: str, path: str) -> tuple[float, bytes]:
    started = time.monotonic()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session,
        session.get(url + path) as answer,
    ):
        body = await answer.read()
    return time.monotonic() - started, body


def _key_figures(metrics: str) -> dict[str, int]:
    values = set(re.findall(r'\bkey="([^"]*)"', metrics))
    series = sum(line.startswith("gateway_key_requests_total{") for line in metrics.splitlines())
    return {"key_label_values": len(values - {""}), "gateway_key_requests_total_series": series}


def bearers(url: str, gateway: psutil.Process, requests: int) -> dict[str, Any]:
    before = _rss_mb(gateway)
    load = asyncio.run(_random_bearers(url, requests, 64))
    _, metrics = asyncio.run(_get(url, "/metrics"))
    _, status = asyncio.run(_get(url, "/status?format=json"))
    return {
        **load, **_key_figures(metrics.decode()), "metrics_bytes": len(metrics), "status_bytes": len(status),
        "rss_before_mb": before, "rss_after_mb": _rss_mb(gateway),
    }  # fmt: skip


def scrapes(url: str, health: Any) -> dict[str, Any]:
    async def three() -> list[tuple[float, bytes]]:
        return list(await asyncio.gather(*(_get(url, "/metrics") for _ in range(3))))

    with health(url) as watch:
        time.sleep(0.2)
        answers = asyncio.run(three())
        time.sleep(0.2)
    return {
        "scrape_seconds": [round(seconds, 2) for seconds, _ in answers],
        "metrics_bytes": [len(body) for _, body in answers], **watch.figures(),
    }  # fmt: skip


async def _capped_streams(url: str, key: str) -> list[tuple[float, float]]:
    """Four streams with the valid key and each its own bogus Bearer: (first chunk, end) of each."""
    body = {**CHAT, "stream": True}
    started = time.monotonic()

    async def one(session: aiohttp.ClientSession, n: int) -> tuple[float, float]:
        headers = {"x-api-key": key, "Authorization": f"Bearer rotated-{n}-{uuid.uuid4().hex}"}
        first = None
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as answer:
            async for _block in answer.content.iter_any():
                first = first if first is not None else time.monotonic() - started
        return (first if first is not None else -1.0), time.monotonic() - started

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        return list(await asyncio.gather(*(one(session, n) for n in range(4))))


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def keycap(url: str) -> dict[str, Any]:
    started = time.monotonic()
    spans = asyncio.run(_capped_streams(url, "sk-bench-a"))
    return {
        "streams": len(spans), "most_in_engine_at_once": _most_at_once(spans),
        "spans_s": [[round(a, 2), round(b, 2)] for a, b in sorted(spans)],
        "seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip


def issue_47_identity(
    source: Path, wanted: set[str], servers: Any, health: Any, requests: int = 30_000
) -> dict[str, Any]:
    """This module's cases that ``wanted`` names (``servers``, ``health``: hardening.py's)."""
    results: dict[str, Any] = {}
    if wanted & {"bearers", "scrapes"}:
        with servers(source) as (url, gateway):
            time.sleep(2.5)
            figures = bearers(url, gateway, requests)
            if "bearers" in wanted:
                results["bearers"] = figures
            if "scrapes" in wanted:
                results["scrapes"] = scrapes(url, health)
    if "keycap" in wanted:
        with servers(source, ["--api-key", "sk-bench-a", "--max-inflight-per-key", "1"]) as (url, _gateway):
            time.sleep(2.5)
            results["keycap"] = keycap(url)
    return results
