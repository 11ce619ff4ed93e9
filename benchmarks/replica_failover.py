"""Two llama-server replicas behind one gateway (`serve --replicas 2 --threads 1`, the embedded default on
this machine's CPU): where sessions' turns go, and what losing one replica costs (issue 50, items 2-4).

Per run: SESSIONS sessions (Claude Code's session header) send TURNS turns each, one after another; then
one replica's engine is SIGKILLed and every session sends one more turn. Reported: the turns each replica
answered, the later turns answered by the replica of the session's previous turn, the turns after the
kill (answered, their latency, by which replica), the killed replica's time back to ready (its own
supervisor's restart), and whether a new session then goes to it.

    PYTHONPATH=. .venv/bin/python benchmarks/replica_failover.py [--sessions 8] [--turns 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.integration.gatewayproc import GatewayProcess
from tests.waiting import wait_until

MODEL = "smollm2-135m-instruct"


def turn(gateway: GatewayProcess, session: str, text: str) -> tuple[int, str, float]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{session}: {text}"}], "max_tokens": 8}
    started = time.monotonic()
    answer = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"X-Claude-Code-Session-Id": session}, timeout=300
    )
    return answer.status_code, answer.headers.get("x-gateway-replica", "?"), time.monotonic() - started


def engines(gateway: GatewayProcess) -> dict[str, dict[str, Any]]:
    return {row["replica"]: row for row in gateway.status()["engines"]}


def run(sessions: int, turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        gateway = GatewayProcess(Path(work), "--replicas", "2", "--threads", "1", "--context-length", "2048")
        started = time.monotonic()
        with gateway.serving():
            ready_s = time.monotonic() - started
            names = [f"s{i}" for i in range(sessions)]
            last: dict[str, str] = {}
            answered: collections.Counter[str] = collections.Counter()
            stayed = later = 0
            for number in range(turns):
                for session in names:
                    status, replica, _ = turn(gateway, session, f"turn {number} of a long conversation")
                    assert status == 200, status
                    answered[replica] += 1
                    if session in last:
                        later += 1
                        stayed += last[session] == replica
                    last[session] = replica
            victim = collections.Counter(last.values()).most_common(1)[0][0]
            pid = int(engines(gateway)[victim]["backend"]["pid"])
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            after = [turn(gateway, session, "after the kill") for session in names]
            wait_until(
                lambda: engines(gateway)[victim]["state"] == "ready" and engines(gateway)[victim]["restarts"] == 1,
                what="the restart",
                timeout_s=300,
                interval_s=0.2,
            )
            back_s = time.monotonic() - killed
            _, fresh_on, _ = turn(gateway, "new", " ".join(f"new{i}" for i in range(300)))
        return {
            "ready_s": round(ready_s, 1),
            "answered": dict(answered),
            "later_turns_on_their_replica": f"{stayed}/{later}",
            "after_kill_ok": f"{sum(s == 200 for s, _, _ in after)}/{len(after)}",
            "after_kill_by": dict(collections.Counter(r for _, r, _ in after)),
            "after_kill_latency_s": {
                "median": round(statistics.median(t for _, _, t in after), 2),
                "max": round(max(t for _, _, t in after), 2),
            },
            "killed": victim,
            "back_to_ready_s": round(back_s, 1),
            "new_session_on": fresh_on,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    for key, value in run(args.sessions, args.turns).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
