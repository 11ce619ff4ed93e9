"""`gateway serve --replicas 2` on this machine's CPU: two real llama-server replicas of the embedded default
(one thread each), each supervised on its own, one router in front (issue 50).

Two sessions' turns each stay on one replica and both replicas serve; one replica's engine is killed and
the next turns of both sessions are answered (by the other, while its supervisor restarts it); the
replica that returns takes a new session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.integration.gatewayproc import GatewayProcess, pid_alive
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

MODEL = "smollm2-135m-instruct"


def _turn(gateway: GatewayProcess, session: str, text: str) -> httpx.Response:
    """One turn of ``session``: its prompt starts with words of its own (at equal load, a new session goes to a
    replica that holds 30 % of its prompt, which a short prompt, mostly the chat template, would be)."""
    own = " ".join(f"{session}{i}" for i in range(60))
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{own}: {text}"}], "max_tokens": 4}
    return httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"X-Claude-Code-Session-Id": session}, timeout=120
    )


def _engines(gateway: GatewayProcess) -> dict[str, dict[str, Any]]:
    return {row["replica"]: row for row in gateway.status()["engines"]}


def test_two_replicas_keep_each_session_and_serve_on_when_one_engine_is_killed(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    gateway = GatewayProcess(tmp_path, "--replicas", "2", "--threads", "1", "--context-length", "2048")
    with gateway.serving():
        engines = _engines(gateway)
        assert set(engines) == {"1", "2"}
        pids = {name: int(row["backend"]["pid"]) for name, row in engines.items()}
        assert len(set(pids.values())) == 2 and all(pid_alive(pid) for pid in pids.values())
        served: dict[str, set[str]] = {"alpha": set(), "beta": set()}
        for number in range(3):
            for session in served:
                answer = _turn(gateway, session, f"turn {number}")
                assert answer.status_code == 200, answer.text
                served[session].add(answer.headers["x-gateway-replica"])
        assert all(len(replicas) == 1 for replicas in served.values()), served  # each session on one replica
        (alpha_on,), (beta_on,) = served["alpha"], served["beta"]
        assert alpha_on != beta_on  # both replicas served

        os.kill(pids[alpha_on], signal.SIGKILL)
        started = time.monotonic()
        for session in ("alpha", "beta", "alpha"):  # answered at once by the replica that lives
            answer = _turn(gateway, session, "after the kill")
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-gateway-replica"] == beta_on
        assert time.monotonic() - started < 60
        assert httpx.get(gateway.url + "/ready", timeout=5).status_code == 200

        def restarted() -> bool:
            row = _engines(gateway)[alpha_on]
            return bool(row["state"] == "ready" and row["restarts"] == 1)

        wait_until(restarted, what="the killed replica's restart", timeout_s=120, interval_s=0.5)
        assert int(_engines(gateway)[alpha_on]["backend"]["pid"]) != pids[alpha_on]
        assert _engines(gateway)[beta_on]["restarts"] == 0  # one fate per replica
        fresh = _turn(gateway, "gamma", "a new session")
        assert fresh.status_code == 200 and fresh.headers["x-gateway-replica"] == alpha_on  # it takes new sessions
        assert _turn(gateway, "alpha", "later").headers["x-gateway-replica"] == beta_on  # moved sessions stay
    assert not any(pid_alive(pid) for pid in pids.values())
    log = gateway.log()
    assert "2 replicas planned: serve starts each" in log


def test_a_hung_replica_is_cut_its_waiting_turn_is_answered_by_the_other_and_it_is_restarted(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    """llama-server stopped (SIGSTOP): its port still accepts, nothing moves. A turn sent to it is cut at the
    stall limit before its first byte and answered by the other replica; the other replica's sessions are
    answered meanwhile; the hung one is restarted by its own supervisor."""
    stall_s = 10  # a prefill of one batch shows no progress until it ends: room for one under load
    args = ("--replicas", "2", "--threads", "1", "--context-length", "2048", "--stall-timeout", str(stall_s))
    gateway = GatewayProcess(tmp_path, *args)
    with gateway.serving():
        firsts = {session: _turn(gateway, session, "first") for session in ("alpha", "beta")}
        assert all(a.status_code == 200 for a in firsts.values()), [a.text for a in firsts.values()]
        on = {session: answer.headers["x-gateway-replica"] for session, answer in firsts.items()}
        assert on["alpha"] != on["beta"]
        leader = int(_engines(gateway)[on["alpha"]]["backend"]["pid"])
        engine = next(p for p in psutil.Process(leader).children() if "llama-server" in " ".join(p.cmdline()))
        os.kill(engine.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            answer = _turn(gateway, "alpha", "while its replica hangs")
            took = time.monotonic() - started
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-gateway-replica"] == on["beta"]
            assert stall_s <= took <= stall_s + 30, took  # cut at the stall limit, then answered elsewhere
            assert _turn(gateway, "beta", "meanwhile").headers["x-gateway-replica"] == on["beta"]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGCONT)

        def restarted() -> bool:
            row = _engines(gateway)[on["alpha"]]
            return bool(row["state"] == "ready" and row["restarts"] == 1 and row["hangs"])

        wait_until(restarted, what="the hung replica's restart", timeout_s=120, interval_s=0.5)
        assert _engines(gateway)[on["beta"]]["restarts"] == 0
