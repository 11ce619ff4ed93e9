"""Does the fresh default answer and stop? 50 chat requests of "Say hi" with no max_tokens and no sampling
field (what a chat UI or a curl line sends) to a fresh `gateway serve` with no model flag (issue 49).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/say_hi.py [--requests 50] [--threads 1] [--cut 600] [--json FILE]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/say_hi.py --url http://127.0.0.1:8000 --key KEY   # one running
    PYTHONPATH=$PWD .venv/bin/python benchmarks/say_hi.py --requests 300 --direct "--repeat-penalty 1"

``--direct FLAGS``: llama-server alone with the default plan's argv and FLAGS after it (a later flag wins:
``--repeat-penalty 1`` takes the catalog's loop guard off), each request with its own ``seed`` (0, 1, …),
so a sampling's rate of loops is measured over the same seeds another's is.

Each answer is streamed with usage; one that passes ``--cut`` tokens is dropped there (the gateway then
stops the engine's request) and counted as running past the limit rather than followed to the context's
end (8,141 tokens of emoji took ~100 s each before the fix). Printed: how many ended ``stop``, how many
passed 200 tokens, the longest, and the sampling the engine was started with (its argv, from /status).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.rpc_vs_local import free_port, process, wait_ok
from gateway.backends.llamacpp.install import packaged_binary

PROMPT = "Say hi"
LIMIT = 200  # the answer a greeting needs is a line; past this it is a loop


def ask(client: httpx.Client, url: str, model: str, cut: int, seed: int | None) -> dict[str, Any]:
    """One streamed answer: its finish reason, completion tokens (the usage chunk's, else the chunks
    counted), seconds, and its text's first 80 characters; ``finish`` "cut" when it passed ``cut``."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    body["stream_options"] = {"include_usage": True}
    if seed is not None:
        body["seed"] = seed
    started, chunks, finish, usage, text = time.monotonic(), 0, None, None, ""
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    chunks += 1
                    text += content
                finish = choice.get("finish_reason") or finish
            if chunks > cut:
                finish = "cut"
                break
    tokens = int(usage["completion_tokens"]) if usage and finish != "cut" else chunks
    return {"finish": finish, "tokens": tokens, "seconds": round(time.monotonic() - started, 2), "text": text[:80]}


def run(url: str, key: str | None, requests: int, cut: int, argv: list[str] | None = None) -> dict[str, Any]:
    """The answers of a gateway (its engine's argv read from /status), or of a llama-server started
    with ``argv`` (seeded requests)."""
    # a fresh connection per answer: llama-server closes one after a stream, which a pooled client would reuse
    headers = {"connection": "close"} | ({"authorization": f"Bearer {key}"} if key else {})
    with httpx.Client(headers=headers) as client:
        model = client.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        if argv is None:
            argv = (client.get(url + "/status", timeout=30).json().get("backend") or {}).get("argv") or []
            answers = [ask(client, url, model, cut, None) for _ in range(requests)]
        else:
            answers = [ask(client, url, model, cut, seed) for seed in range(requests)]
    flags = ("--temp", "--top-p", "--top-k", "--min-p", "--repeat-penalty", "--presence-penalty", "--dry-multiplier")
    sampling = {word: argv[i + 1] for i, word in enumerate(argv[:-1]) if word in flags}  # the last one wins
    tokens = [a["tokens"] for a in answers]
    return {
        "model": model,
        "engine_sampling_flags": sampling,
        "requests": requests,
        "stop": sum(a["finish"] == "stop" for a in answers),
        "stop_under_limit": sum(a["finish"] == "stop" and a["tokens"] < LIMIT for a in answers),
        "over_limit": sum(a["tokens"] >= LIMIT for a in answers),
        "cut": sum(a["finish"] == "cut" for a in answers),
        "median_tokens": statistics.median(tokens),
        "max_tokens": max(tokens),
        "seconds": round(sum(a["seconds"] for a in answers), 1),
        "answers": answers,
    }


def direct(workdir: Path, flags: str, threads: int, requests: int, cut: int) -> dict[str, Any]:
    """llama-server alone: the default plan's argv (`gateway plan --json`), ``flags`` after it."""
    plan = subprocess.run(
        [sys.executable, "-m", "gateway", "plan", "--json", "--llama-launcher", "native"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    data = json.loads(plan.stdout)
    chosen = data["candidates"][data["decision"]["candidate"]]
    port, key = free_port(), "say-hi-bench"
    argv = [str(port) if word == "PORT" else word for word in chosen["argv"]]
    argv[0] = shutil.which(argv[0]) or str(packaged_binary("llama-server"))  # `plan` shows the name alone
    argv = [*argv, "-t", str(threads), *shlex.split(flags)]
    env = {**os.environ, **{name: key for name in chosen["env"]}}
    log = workdir / "llama-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_ok(f"http://127.0.0.1:{port}/health", proc, log, timeout_s=600)
        return run(f"http://127.0.0.1:{port}", key, requests, cut, argv)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="the engine's threads (serve --threads)")
    parser.add_argument("--cut", type=int, default=600, help="stop reading an answer past this many tokens")
    parser.add_argument("--url", help="a gateway already running (else a fresh `gateway serve` is started)")
    parser.add_argument("--key", help="its API key, if it has one")
    parser.add_argument("--serve-args", default="", help="more `gateway serve` flags")
    parser.add_argument("--direct", metavar="FLAGS", help="llama-server alone, the plan's argv and these flags")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.url:
        result = run(args.url.rstrip("/"), args.key, args.requests, args.cut)
    elif args.direct is not None:
        with tempfile.TemporaryDirectory() as tmp:
            result = direct(Path(tmp), args.direct, args.threads, args.requests, args.cut)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            port, log = free_port(), Path(tmp) / "serve.log"
            argv = [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--state-dir", f"{tmp}/state"]
            argv += ["--threads", str(args.threads), *args.serve_args.split()]
            with process(argv, log) as proc:
                wait_ok(f"http://127.0.0.1:{port}/ready", proc, log, timeout_s=600)
                result = run(f"http://127.0.0.1:{port}", None, args.requests, args.cut)
    print(f"model {result['model']}, engine sampling flags {result['engine_sampling_flags'] or 'none (its defaults)'}")
    print(
        f"{result['stop']}/{result['requests']} ended stop ({result['stop_under_limit']} under {LIMIT} tokens); "
        f"{result['over_limit']} reached {LIMIT} tokens ({result['cut']} cut at {args.cut}); "
        f"median {result['median_tokens']} tokens, longest {result['max_tokens']}; {result['seconds']} s in all"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
