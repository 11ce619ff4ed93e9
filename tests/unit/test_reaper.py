"""An engine cannot outlive the gateway: killed with the gateway, busy or not, helpers included.

A stand-in "gateway" process starts a stubborn stand-in engine through the real ChildProcess (so
through gateway.core.reaper); the engine ignores SIGTERM (as llama-cpp-python does while it generates)
and starts a helper that ignores it too (as vLLM's EngineCore would). The test then kills the
"gateway" with SIGKILL and watches both disappear.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gateway.core.process import child_environment
from tests.waiting import holds_within

# the stand-in engine: ignores SIGTERM, starts a helper that ignores it too, prints both pids, sleeps
ENGINE = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# a helper that outlives SIGTERM
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
helper = subprocess.Popen([sys.executable, "-c", code])
print("pids", __import__("os").getpid(), helper.pid, flush=True)
time.sleep(60)  # an engine that never exits by itself
"""

# the stand-in gateway: starts the engine as the gateway does, relays its first line, then waits
GATEWAY = """
import asyncio, sys
from pathlib import Path
from gateway.core.process import ChildProcess

async def main():
    child = ChildProcess([sys.executable, "-c", sys.argv[1]], Path(sys.argv[2]), on_line=lambda l: print(l, flush=True))
    await child.start()
    print("reaper", child.pid, flush=True)
    await asyncio.sleep(60)  # the stand-in gateway lives until the test kills it

asyncio.run(main())
"""


def _gone(pids: list[int], within_s: float) -> bool:
    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != "zombie"
        except psutil.NoSuchProcess:
            return False

    return holds_within(lambda: not any(alive(pid) for pid in pids), within_s, interval_s=0.05)


def test_a_gateway_killed_with_sigkill_takes_a_busy_engine_and_its_helpers_with_it(tmp_path: Path) -> None:
    gateway = subprocess.Popen(
        [sys.executable, "-c", GATEWAY, ENGINE, str(tmp_path / "engine.log")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert gateway.stdout is not None
    pids: list[int] = []
    try:
        for line in gateway.stdout:
            words = line.split()
            if words[0] in ("reaper", "pids"):
                pids += [int(word) for word in words[1:]]
            if len(pids) == 3:
                break
        assert len(pids) == 3, "the stand-in engine did not start"
        assert all(psutil.pid_exists(pid) for pid in pids)
        os.kill(gateway.pid, signal.SIGKILL)
        gateway.wait()
        assert _gone(pids, within_s=5.0), "the engine or its helper outlived the gateway"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gateway.kill()
        gateway.wait()
        gateway.stdout.close()


def test_the_engine_exit_status_comes_through_the_reaper(tmp_path: Path) -> None:
    assert (
        subprocess.run(
            [sys.executable, "-m", "gateway.core.reaper", sys.executable, "-c", "raise SystemExit(3)"]
        ).returncode
        == 3
    )
    killed = subprocess.run(
        [sys.executable, "-m", "gateway.core.reaper", sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]
    )
    assert killed.returncode == -signal.SIGKILL


def test_an_engine_whose_reaper_is_killed_dies_too_even_while_it_ignores_sigterm() -> None:
    """The engine's own parent-death signal is SIGKILL: a busy engine ignores SIGTERM, so anything
    weaker would leave it running once its reaper is gone."""
    engine = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True)"
    reaper = subprocess.Popen(
        # outlives SIGTERM
        [sys.executable, "-m", "gateway.core.reaper", sys.executable, "-c", engine + "; time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert reaper.stdout is not None
    engine_pid = 0
    try:
        engine_pid = int(reaper.stdout.readline())
        os.kill(reaper.pid, signal.SIGKILL)
        reaper.wait()
        assert _gone([engine_pid], within_s=5.0), "the engine outlived its reaper"
    finally:
        if engine_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine_pid, signal.SIGKILL)
        reaper.kill()
        reaper.wait()
        reaper.stdout.close()


def test_a_child_gets_an_explicit_environment_not_the_gateways_whole_one() -> None:
    parent = {
        "PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": "t",
        "VLLM_CPU_KVCACHE_SPACE": "4", "PYTHONPATH": "/src", "GATEWAY_API_KEYS": "secret", "LLAMA_ARG_CTX_SIZE": "9",
        "SOMETHING_ELSE": "x",
    }  # fmt: skip
    env = child_environment({"LLAMA_API_KEY": "k", "PATH": "/engine/bin"}, parent, inherit=("VLLM_",))
    assert env == {
        "PATH": "/engine/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": "t",
        "VLLM_CPU_KVCACHE_SPACE": "4", "PYTHONPATH": "/src", "LLAMA_API_KEY": "k",
    }  # fmt: skip
    assert "VLLM_CPU_KVCACHE_SPACE" not in child_environment({}, parent)  # only where the engine asks


def test_a_gateway_that_is_pid_1_is_not_taken_for_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container the gateway is PID 1: its reaper's parent is 1 while the gateway lives (the reaper
    used to exit 1 at once there, and no engine ever started in the image)."""
    from gateway.core import reaper

    monkeypatch.setattr(reaper.os, "getppid", lambda: 1)
    monkeypatch.setenv(reaper.PARENT_PID_VARIABLE, "1")
    assert not reaper.parent_died()
    assert reaper.PARENT_PID_VARIABLE not in os.environ  # not passed on to the engine
    monkeypatch.setenv(reaper.PARENT_PID_VARIABLE, "4242")  # the gateway was 4242: re-parented, so it died
    assert reaper.parent_died()


# the reaper with a stop arriving in its worst moment: its handlers set, the engine not yet started
STOPPED_WHILE_STARTING = """
import os, signal, subprocess, sys
from gateway.core import reaper

started = subprocess.Popen

def stopped_first(*args, **kwargs):
    os.killpg(os.getpgrp(), signal.SIGTERM)  # the gateway's orderly stop, to the whole group, as it sends it
    return started(*args, **kwargs)

reaper.subprocess.Popen = stopped_first
sys.exit(reaper.main(sys.argv[1:]))
"""


def test_a_stop_sent_before_the_engine_is_started_still_stops_it() -> None:
    """A stop that reached the reaper after its handlers were set and before the engine existed was lost:
    the engine ran on until the stop grace (10 s for a group's rank) ended in SIGKILL."""
    run = subprocess.run(
        # the engine: a process that lives 30 s unless stopped
        [sys.executable, "-c", STOPPED_WHILE_STARTING, sys.executable, "-c", "import time; time.sleep(30)"],
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=20,
    )
    assert run.returncode == -signal.SIGTERM
