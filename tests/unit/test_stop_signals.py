"""SIGHUP (a closed terminal, a service manager's reload) stops the gateway the way SIGTERM does: a
drain and exit 0, not death by the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.core.process import free_port
from tests.unit.http_harness import FakeEngine, Served
from tests.waiting import answers, exited, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("stop", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_stop_signal_drains_and_exits_0(tmp_path: Path, stop: signal.Signals) -> None:
    engine = Served(FakeEngine().app)
    port = free_port()
    argv = [sys.executable, "-m", "gateway", "serve", "--backend-url", engine.url, "--port", str(port),
            "--state-dir", str(tmp_path), "--shutdown-grace", "1"]  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out, stderr=out)
    try:
        wait_until(
            lambda: answers(f"http://127.0.0.1:{port}/health"),
            what="the gateway's /health",
            timeout_s=30,
            interval_s=0.1,
            abort=exited(gateway, log.read_text),
        )
        gateway.send_signal(stop)
        assert gateway.wait(timeout=30) == 0, log.read_text()
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()
        engine.stop()
