"""What the gateway adds to every request, side by side with the thin-proxy floor, in one run.

    .venv/bin/python benchmarks/proxy_overhead.py [--json out.json] [--quick]

Starts a fast fake upstream (answers at once; streams 64 chunks 5 ms apart), the gateway in front of
it (`gateway serve --backend-url`), and two ~40-line reference passthroughs (starlette + httpx,
starlette + aiohttp's client). For concurrency 1, 16 and 64 it alternates batches against the
upstream directly and through each proxy, twice, and reports: added latency p50/p99 (non-streaming),
requests/s as a ratio to direct, proxy CPU per request, TTFT p50/p99 and its addition, inter-chunk gap
p99 above direct, chunks/s as a ratio to direct, CPU per chunk, and peak RSS. The load generator
(aiohttp, this process) reports its own CPU use so a saturated generator is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHUNKS, DELAY_MS = 64, 5.0
# the fake upstream declared as what it is, a vLLM-like server: it speaks every API the gateway would
# otherwise translate, and its connections stay usable after a stream (pooled, as for vLLM)
NATIVE_APIS = "responses,messages,include_usage,max_completion_tokens,openai_shapes,stream_keepalive"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def wait_ready(url: str, timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} never became ready")


@dataclass
class Target:
    name: str
    url: str
    proc: subprocess.Popen[bytes] | None = None
    peak_rss: int = 0

    @property
    def ps(self) -> psutil.Process | None:
        return psutil.Process(self.proc.pid) if self.proc else None

    def cpu(self) -> float:
        ps = self.ps
        if ps is None:
            return 0.0
        times = ps.cpu_times()
        return float(times.user + times.system)

    def sample_rss(self) -> None:
        if ps := self.ps:
            self.peak_rss = max(self.peak_rss, ps.memory_info().rss)


@dataclass
class Batch:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    generator_cpu: float = 0.0


REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def run_batch(
    session: aiohttp.ClientSession, target: Target, concurrency: int, count: int, stream: bool
) -> Batch:
    batch = Batch()
    body = json.dumps({**REQUEST, "stream": stream}).encode()
    url = target.url + "/v1/chat/completions"
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            queue.pop()
            started = time.perf_counter()
            try:
                await one(url, body, stream, started)
            except aiohttp.ClientError:
                batch.errors += 1
            target.sample_rss()

    async def one(url: str, body: bytes, stream: bool, started: float) -> None:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
            if response.status != 200:
                batch.errors += 1
                await response.read()
                return
            if not stream:
                await response.read()
                batch.latencies.append(time.perf_counter() - started)
                return
            last = None
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                now = time.perf_counter()
                if last is None:
                    batch.ttfts.append(now - started)
                else:
                    batch.gaps.append(now - last)
                last = now
                batch.chunks += 1

    cpu_before, own_before, started = target.cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    batch.seconds = time.perf_counter() - started
    batch.cpu = target.cpu() - cpu_before
    batch.generator_cpu = time.process_time() - own_before
    return batch


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    targets: list[Target], levels: list[int], rounds: int, quick: bool
) -> dict[str, dict[int, dict[str, Batch]]]:
    results: dict[str, dict[int, dict[str, Batch]]] = {t.name: {c: {} for c in levels} for t in targets}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        for target in targets:  # warm every pool
            await run_batch(session, target, 4, 20, False)
        for _ in range(rounds):
            for concurrency in levels:
                plain = (60 if quick else 200) if concurrency == 1 else (400 if quick else 1500)
                streams = (6 if quick else 20) if concurrency == 1 else concurrency * (2 if quick else 4)
                for target in targets:  # alternate direct / gateway / references within the round
                    for kind, count, stream in (("plain", plain, False), ("stream", streams, True)):
                        batch = await run_batch(session, target, concurrency, count, stream)
                        merged = results[target.name][concurrency].setdefault(kind, Batch())
                        merged.latencies += batch.latencies
                        merged.ttfts += batch.ttfts
                        merged.gaps += batch.gaps
                        merged.chunks += batch.chunks
                        merged.errors += batch.errors
                        merged.seconds += batch.seconds
                        merged.cpu += batch.cpu
                        merged.generator_cpu += batch.generator_cpu
    return results


def start(name: str, argv: list[str], port: int) -> Target:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    wait_port(port)
    return Target(name, f"http://127.0.0.1:{port}", proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="smaller batches (about a minute)")
    args = parser.parse_args()
    python = sys.executable
    up_port, gw_port, hx_port, ah_port = free_port(), free_port(), free_port(), free_port()
    upstream = start(
        "upstream", [python, str(HERE / "servers.py"), "upstream", str(up_port), str(CHUNKS), str(DELAY_MS)], up_port
    )
    up_url = upstream.url
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-gateway-{gw_port}"
    gateway = start(
        "gateway",
        [python, "-m", "gateway", "serve", "--backend-url", up_url, "--port", str(gw_port), "--state-dir", str(state),
         "--backend-native-apis", NATIVE_APIS,
         "--backend-max-concurrency", "1024", "--queue-limit", "4096"],
        gw_port,
    )  # fmt: skip
    wait_ready(gateway.url)
    references = [
        start("httpx passthrough", [python, str(HERE / "servers.py"), "httpx-proxy", str(hx_port), up_url], hx_port),
        start(
            "aiohttp passthrough", [python, str(HERE / "servers.py"), "aiohttp-proxy", str(ah_port), up_url], ah_port
        ),
    ]
    direct = Target("direct", up_url)
    targets = [direct, gateway, *references]
    levels = [1, 16, 64]
    try:
        time.sleep(1.0)
        started = time.perf_counter()
        results = asyncio.run(measure(targets, levels, rounds=2, quick=args.quick))
        elapsed = time.perf_counter() - started
    finally:
        for target in (upstream, gateway, *references):
            if target.proc:
                target.proc.terminate()
                target.proc.wait(timeout=10)
    report = summarize(results, targets, levels)
    report["seconds"] = round(elapsed, 1)
    print_table(report, levels)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _rate(batch: Batch) -> float:
    return batch.chunks / batch.seconds if batch.seconds else 0.0


def summarize(
    results: dict[str, dict[int, dict[str, Batch]]], targets: list[Target], levels: list[int]
) -> dict[str, object]:
    out: dict[str, object] = {"machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"), "rows": []}
    rows: list[dict[str, object]] = []
    for concurrency in levels:
        base = results["direct"][concurrency]
        base_plain, base_stream = base["plain"], base["stream"]
        for target in targets:
            plain, stream = results[target.name][concurrency]["plain"], results[target.name][concurrency]["stream"]
            requests = len(plain.latencies)
            rows.append({
                "proxy": target.name,
                "concurrency": concurrency,
                "added_p50_ms": round((pct(plain.latencies, 0.5) - pct(base_plain.latencies, 0.5)) * 1000, 2),
                "added_p99_ms": round((pct(plain.latencies, 0.99) - pct(base_plain.latencies, 0.99)) * 1000, 2),
                "rps": round(requests / plain.seconds, 1),
                "rps_ratio": round((requests / plain.seconds) / (len(base_plain.latencies) / base_plain.seconds), 3),
                "cpu_ms_per_request": round(plain.cpu / requests * 1000, 3) if target.proc else None,
                "ttft_p50_ms": round(pct(stream.ttfts, 0.5) * 1000, 2),
                "ttft_p99_ms": round(pct(stream.ttfts, 0.99) * 1000, 2),
                "added_ttft_p50_ms": round((pct(stream.ttfts, 0.5) - pct(base_stream.ttfts, 0.5)) * 1000, 2),
                "gap_p99_above_direct_ms": round((pct(stream.gaps, 0.99) - pct(base_stream.gaps, 0.99)) * 1000, 2),
                "chunks_per_s_ratio": round(_rate(stream) / _rate(base_stream), 3),
                "cpu_ms_per_chunk": round(stream.cpu / max(stream.chunks, 1) * 1000, 4) if target.proc else None,
                "peak_rss_mb": round(target.peak_rss / 1e6, 1) if target.proc else None,
                "errors": plain.errors + stream.errors,
                "generator_cpu_share": round(
                    (plain.generator_cpu + stream.generator_cpu) / (plain.seconds + stream.seconds), 2
                ),
            })  # fmt: skip
    out["rows"] = rows
    return out


def print_table(report: dict[str, object], levels: list[int]) -> None:
    columns = [
        ("proxy", "{:<20}"), ("concurrency", "{:>3}"), ("added_p50_ms", "{:>8}"), ("added_p99_ms", "{:>8}"),
        ("rps", "{:>8}"), ("rps_ratio", "{:>6}"), ("cpu_ms_per_request", "{:>7}"), ("added_ttft_p50_ms", "{:>8}"),
        ("gap_p99_above_direct_ms", "{:>7}"), ("chunks_per_s_ratio", "{:>6}"), ("cpu_ms_per_chunk", "{:>7}"),
        ("peak_rss_mb", "{:>6}"), ("generator_cpu_share", "{:>5}"), ("errors", "{:>4}"),
    ]  # fmt: skip
    header = [
        "proxy",
        "c",
        "+p50ms",
        "+p99ms",
        "req/s",
        "ratio",
        "cpu/req",
        "+ttft50",
        "+gap99",
        "chunk×",
        "cpu/chk",
        "RSS MB",
        "gen",
        "err",
    ]
    print(f"{report['machine']}, {report['date']}; {CHUNKS} chunks {DELAY_MS:g} ms apart; two alternating rounds")
    print(" ".join(f"{h:>{8 if i else 20}}" for i, h in enumerate(header)))
    for row in report["rows"]:  # type: ignore[attr-defined]
        cells = []
        for key, fmt in columns:
            value = row[key]
            cells.append(fmt.format("-" if value is None else value))
        print(" ".join(cells))
    print("gen = load generator CPU share (1.0 = one core saturated: figures then understate the proxies' costs)")


if __name__ == "__main__":
    sys.exit(main())
