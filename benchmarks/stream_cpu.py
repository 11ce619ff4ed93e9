"""The gateway's CPU time per streamed chunk, the steadiest figure for the per-chunk path on a busy machine.

    .venv/bin/python benchmarks/stream_cpu.py                      # this tree, 3 rounds
    .venv/bin/python benchmarks/stream_cpu.py --source DIR --source .   # alternate two trees

A fast upstream (benchmarks/servers.py: 1,000 chunks per stream, 2 ms apart: one read each) and the gateway in front of
it (`--backend-url`, admission lifted); 16 concurrent streams, twice, after a warm-up round. Throughput
ratios swing by ±0.04 from run to run on a shared 2-core machine; the gateway process's own CPU time
(user + system, psutil) divided by the chunks the upstream sent does not depend on who else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.proxy_overhead import NATIVE_APIS, free_port, wait_port  # noqa: E402

CHUNKS, DELAY_MS, STREAMS, ROUNDS = 1000, 2, 16, 2
BODY = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _streams(url: str) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with session.post(url + "/v1/chat/completions", json=BODY) as answer:
                assert answer.status == 200, answer.status
                async for _ in answer.content.iter_any():
                    pass

        await asyncio.gather(*(one() for _ in range(STREAMS)))


def cpu_per_chunk_us(source: Path) -> float:
    up, gw = free_port(), free_port()
    argv = [sys.executable, str(HERE / "servers.py"), "upstream", str(up), str(CHUNKS), str(DELAY_MS)]
    upstream = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gateway = None
    try:
        wait_port(up)
        argv = [
            sys.executable, "-m", "gateway", "serve", "--backend-url", f"http://127.0.0.1:{up}", "--port", str(gw),
            "--state-dir", tempfile.mkdtemp(prefix="stream-cpu-"), "--backend-max-concurrency", "1024",
            "--backend-native-apis", NATIVE_APIS,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(source)}
        gateway = subprocess.Popen(argv, cwd=source, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(gw)
        time.sleep(3)  # the first readiness poll
        url, process = f"http://127.0.0.1:{gw}", psutil.Process(gateway.pid)
        asyncio.run(_streams(url))  # warm-up
        before = sum(process.cpu_times()[:2])
        for _ in range(ROUNDS):
            asyncio.run(_streams(url))
        return (sum(process.cpu_times()[:2]) - before) / (ROUNDS * STREAMS * CHUNKS) * 1e6
    finally:
        for child in (gateway, upstream):
            if child is not None:
                child.terminate()
                child.wait(timeout=20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, action="append", help="a tree to measure (repeat to alternate)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sources = [path.resolve() for path in args.source or [HERE.parent]]
    for number in range(args.rounds):
        for source in sources:
            figure = cpu_per_chunk_us(source)
            print(f"round {number + 1}  {source}: {figure:.2f} µs of gateway CPU per chunk", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
