"""An engine's output is read whatever happens to its log file, and /ready tells the truth about an
engine that no longer answers, without naming its address."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.backends.base import Launch
from gateway.core.process import ChildProcess, free_port
from gateway.serving import app as app_module
from gateway.serving.app import create_app
from gateway.serving.edge.readiness import EngineProbe
from gateway.supervision.engine_run import EngineRun, RunState
from tests.unit.http_harness import make_runtime

# ~1.8 MB: more than the pipe (64 KiB) and the reader's buffer (1 MiB) hold, were it not read on
CHATTY = "import sys\nfor n in range(20000): print('line', n, 'x' * 80)\nprint('the end', flush=True)"


def test_a_full_disk_does_not_stop_the_engines_output_being_read(caplog: object) -> None:
    child = ChildProcess([sys.executable, "-c", CHATTY], Path("/dev/full"))  # every write: ENOSPC

    async def scenario() -> int:
        await child.start()
        try:
            return await asyncio.wait_for(child.wait(), 30)  # blocked on a full pipe, it would never exit
        finally:
            await child.stop(1)

    assert asyncio.run(scenario()) == 0
    assert child.tail[-1] == "the end" and child.dropped_lines > 19000


def test_an_unwritable_log_directory_is_named_as_such(tmp_path: Path) -> None:
    launch = Launch(
        engine="stand-in", argv=[sys.executable, "-c", "pass"], port=free_port(), api_key="k", served_name="m",
        context_length=2048, health_path="/health", summary="a stand-in engine",
    )  # fmt: skip
    run = EngineRun(
        launch, log_dir=Path("/dev/null/logs"), classify=lambda _l: None, startup_timeout_s=5, shutdown_grace_s=1
    )

    async def scenario() -> RunState:
        await run.start()
        try:
            return await asyncio.wait_for(run.wait_settled(), 5)
        finally:
            await run.stop()

    assert asyncio.run(scenario()) is RunState.FAILED
    assert run.reason is not None and "cannot write the log" in run.reason and "log_dir" in run.reason
    assert "cannot run" not in run.reason


def test_ready_is_503_when_the_ready_engine_stops_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    # the probe's timeout shortened (2 s in serving): a mute engine never answers, however long it is given
    monkeypatch.setattr(app_module, "EngineProbe", lambda: EngineProbe(timeout_s=0.1))
    mute = socket.socket()  # listens, never accepts: an engine blocked on a full pipe
    mute.bind(("127.0.0.1", 0))
    mute.listen(16)
    try:
        runtime = make_runtime(f"http://127.0.0.1:{mute.getsockname()[1]}")
        with TestClient(create_app(runtime)) as client:
            answer = client.get("/ready")
    finally:
        mute.close()
    assert answer.status_code == 503 and answer.json()["status"] == "not_answering", answer.text


def test_ready_and_503s_do_not_name_the_engines_address() -> None:
    runtime = make_runtime("http://127.0.0.1:9", ready=False)
    runtime.backend.reason = "the backend at http://127.0.0.1:8081 does not answer (ClientConnectorError)"  # type: ignore[misc]
    with TestClient(create_app(runtime)) as client:
        ready = client.get("/ready")
        refused = client.post(
            "/v1/chat/completions", json={"model": "front-model", "messages": [{"role": "user", "content": "hi"}]}
        )
    for answer in (ready, refused):
        assert answer.status_code == 503 and "8081" not in answer.text and "127.0.0.1" not in answer.text, answer.text
    assert "does not answer" in ready.json()["reason"]
