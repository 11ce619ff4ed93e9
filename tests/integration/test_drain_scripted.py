"""SIGTERM (or SIGHUP) to a real gateway process in front of the scripted upstream: it stops accepting, answers the
queued request 503 + Retry-After in its dialect at once, ends the stream still open after the grace
with an error event in its dialect, tells the upstream (the stream's connection closes), and exits 0.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gatewayproc import port_closed
from tests.integration.test_agent_apis_scripted import Upstream, _front
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

GRACE_S = 1.0


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_drains_queued_and_open_requests_in_their_dialects(tmp_path: Path, stop: signal.Signals) -> None:
    server = Upstream(tmp_path)
    front = _front(tmp_path, server, "--backend-max-concurrency", "1", "--shutdown-grace", str(GRACE_S))
    answers: dict[str, Any] = {}
    client = httpx.Client(timeout=30)
    try:
        hang = [{"role": "user", "content": "HANG"}]
        body = {"model": "scripted", "max_tokens": 64, "stream": True, "messages": hang}
        with client.stream("POST", front.url + "/v1/messages", json=body) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("event: message_start")  # the only slot is taken
            queued = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}

            def ask() -> None:
                answers["queued"] = httpx.post(front.url + "/v1/chat/completions", json=queued, timeout=30)

            waiting = threading.Thread(target=ask, daemon=True)
            waiting.start()
            wait_until(lambda: front.status()["scheduling"]["queued"] == 1, what="the request queued behind the stream")
            assert front.proc is not None
            front.proc.send_signal(stop)
            signalled = time.monotonic()
            rest = list(lines)
            ended_after = time.monotonic() - signalled
            waiting.join(timeout=10)
        assert front.proc.wait(timeout=30) == 0, front.log()
    finally:
        client.close()
        front.kill()
        server.stop()

    answer = answers["queued"]
    assert answer.status_code == 503 and int(answer.headers["retry-after"]) > 0, answer.text
    assert "shutting down" in answer.json()["error"]["message"]
    assert "event: error" in rest and "shutting down" in rest[rest.index("event: error") + 1], rest
    assert GRACE_S - 0.2 <= ended_after < GRACE_S + 5
    assert port_closed(front.port)
    wait_until(lambda: server.seen("disconnect"), what="the upstream stream to be closed", timeout_s=5)
