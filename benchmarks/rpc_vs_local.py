"""The same GGUF served by one node and pooled over RPC, through the gateway: start-up time and tokens/s.

    .venv/bin/python benchmarks/rpc_vs_local.py [--requests N] [--max-tokens N] [--json FILE]

"one node": ``gateway serve`` alone (every layer in the head's RAM, as on a machine without GPUs).
"rpc": two ``gateway worker`` processes on loopback (each one CPU ``ggml-rpc-server`` reporting
``--gpus 1x4GiB``) and ``gateway serve --workers …``, so every layer sits on the two RPC devices and each
token crosses TCP twice per device boundary. Start-up is from starting ``gateway serve`` until its
``/ready`` answers 200 (planning, the workers' survey and the engine's load); the engine's own figure
("ready after X s") is printed beside it. Each request is greedy (temperature 0, same prompt) with
``max_tokens`` generated tokens; tokens/s is the engine's own decode rate (``timings`` in the answer)
and, end to end, completion tokens ÷ the request's wall time through the gateway.

On a machine with two cores the RPC servers share the cores with the head, so this measures what the
RPC protocol and loopback TCP cost, not what a second machine's GPU would add.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

MODEL = "smollm2-135m-instruct"
KEY = "bench-worker-key"
PROMPT = "Write a short story about a lighthouse keeper and a storm."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A gateway process in its own group; SIGTERM (then SIGKILL) to the group at the end."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_ok(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name} exited:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def loopback_workers(stack: contextlib.ExitStack, workdir: Path, count: int = 2) -> list[str]:
    """``count`` ``gateway worker`` processes on loopback, each lending one simulated 4 GiB device over
    RPC (one thread each), answering /health; stopped when ``stack`` closes. Their host:port addresses."""
    workers = []
    for index in range(count):
        port, rpc_port = free_port(), free_port()
        log = workdir / f"worker{index}.log"
        argv = [
            sys.executable, "-m", "gateway", "worker", "--port", str(port), "--rpc-port", str(rpc_port),
            "--gpus", "1x4GiB", "--name", f"worker{index}", "--api-key", KEY, "--threads", "1",
            "--state-dir", str(workdir / f"state-worker{index}"),
        ]  # fmt: skip
        proc = stack.enter_context(process(argv, log))
        wait_ok(f"http://127.0.0.1:{port}/health", proc, log)
        workers.append(f"127.0.0.1:{port}")
    return workers


def measure(url: str, requests: int, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    httpx.post(url + "/v1/chat/completions", json=body, timeout=300)  # warm-up
    decode, prompt, end_to_end = [], [], []
    for _ in range(requests):
        started = time.monotonic()
        answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()
        wall = time.monotonic() - started
        timings = answer.get("timings", {})
        decode.append(float(timings.get("predicted_per_second", 0)))
        prompt.append(float(timings.get("prompt_per_second", 0)))
        end_to_end.append(answer["usage"]["completion_tokens"] / wall)
    return {
        "decode_tokens_per_s": round(statistics.median(decode), 1),
        "prompt_tokens_per_s": round(statistics.median(prompt), 1),
        "end_to_end_tokens_per_s": round(statistics.median(end_to_end), 1),
    }


def serve(workdir: Path, label: str, extra: list[str], requests: int, max_tokens: int, threads: int) -> dict[str, Any]:
    port = free_port()
    log = workdir / f"head-{label}.log"
    argv = [
        sys.executable, "-m", "gateway", "serve", "--port", str(port), "--context-length", "4096",
        "--threads", str(threads), "--state-dir", str(workdir / f"state-{label}"), "--replan", *extra,
    ]  # fmt: skip
    with process(argv, log) as proc:
        startup = wait_ok(f"http://127.0.0.1:{port}/ready", proc, log)
        engine = re.search(r"ready after ([0-9.]+) s", log.read_text(errors="replace"))
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json()
        argv_used = status["backend"]["argv"]
        result = {
            "case": label,
            "startup_s": round(startup, 2),
            "engine_ready_s": float(engine.group(1)) if engine else None,
            "ngl": argv_used[argv_used.index("-ngl") + 1],
            "rpc": argv_used[argv_used.index("--rpc") + 1] if "--rpc" in argv_used else "",
            **measure(f"http://127.0.0.1:{port}", requests, max_tokens),
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, default=2, help="the head's llama.cpp threads (each RPC server: 1)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rpc-bench-") as tmp:
        workdir = Path(tmp)
        rows.append(serve(workdir, "one node", [], args.requests, args.max_tokens, args.threads))
        with contextlib.ExitStack() as stack:
            workers = loopback_workers(stack, workdir)
            extra = ["--workers", ",".join(workers), "--worker-api-key", KEY]
            rows.append(serve(workdir, "rpc, 2 workers", extra, args.requests, args.max_tokens, args.threads))
    print("| case | start-up to /ready | engine ready | -ngl | decode tok/s | prompt tok/s | end-to-end tok/s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['case']} | {row['startup_s']} s | {row['engine_ready_s']} s | {row['ngl']} | "
            f"{row['decode_tokens_per_s']} | {row['prompt_tokens_per_s']} | {row['end_to_end_tokens_per_s']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
