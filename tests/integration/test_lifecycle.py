"""Process lifecycle with the real engine: no orphans, deaths noticed, failures reported, never a hang."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.integration.gatewayproc import GatewayProcess, free_port, pid_alive, port_closed
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _wait_for(condition: Callable[[], object], timeout_s: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    wait_until(condition, what="the condition", timeout_s=timeout_s, interval_s=0.1)
    return time.monotonic() - start


@pytest.fixture
def fresh_gateway(tmp_path: Path, gemma_gguf: Path) -> object:
    process = GatewayProcess(tmp_path, "--model", "gemma-3-270m", "--context-length", "2048").start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_gateway_stops_the_backend_and_frees_both_ports(
    fresh_gateway: GatewayProcess, sig: signal.Signals
) -> None:
    backend = fresh_gateway.status()["backend"]
    backend_pid, backend_port = int(backend["pid"]), int(backend["url"].rsplit(":", 1)[1])
    temp_dir = Path(backend["temp_dir"])
    assert temp_dir.is_dir()
    assert pid_alive(backend_pid)
    assert fresh_gateway.stop(sig) == 0, fresh_gateway.log()
    assert not pid_alive(backend_pid), "the backend outlived the gateway"
    assert port_closed(backend_port) and port_closed(fresh_gateway.port)
    assert not temp_dir.exists(), "the engine's temp directory was left behind"
    assert "engine stopped" in fresh_gateway.log()


def test_a_killed_backend_turns_readiness_off_gets_503s_and_is_restarted(fresh_gateway: GatewayProcess) -> None:
    old_pid = fresh_gateway.backend_pid()
    os.kill(old_pid, signal.SIGKILL)
    noticed_after = _wait_for(lambda: httpx.get(fresh_gateway.url + "/ready").status_code == 503, timeout_s=5)
    assert noticed_after < 5
    started = time.monotonic()
    for stream in (False, True):  # while it restarts (the first restart waits 1 s before starting)
        answer = httpx.post(fresh_gateway.url + "/v1/chat/completions", json={**CHAT, "stream": stream}, timeout=10)
        assert answer.status_code == 503
        assert int(answer.headers["retry-after"]) > 0
        assert answer.json()["error"]["code"] == "backend_unavailable"
    assert time.monotonic() - started < 5, "requests to a dead backend must not hang"
    assert httpx.get(fresh_gateway.url + "/health").status_code == 200
    _wait_for(lambda: httpx.get(fresh_gateway.url + "/ready").status_code == 200, timeout_s=60)
    status = fresh_gateway.status()
    assert status["restarts"] == 1 and status["state"] == "ready"
    assert status["backend"]["pid"] != old_pid
    answer = httpx.post(fresh_gateway.url + "/v1/chat/completions", json=CHAT, timeout=60)
    assert answer.status_code == 200 and answer.json()["model"] == "gemma-3-270m"
    log = fresh_gateway.log()
    assert "engine exited with status -9 while serving" in log
    assert "  | " in log, "the engine's last lines should be in the gateway log"


def test_a_corrupt_model_file_fails_fast_with_the_engine_reason_and_no_leftovers(
    tmp_path: Path, gemma_gguf: Path
) -> None:
    truncated = tmp_path / "truncated.gguf"
    with gemma_gguf.open("rb") as source:
        truncated.write_bytes(source.read(8 * 1024 * 1024))  # header intact, tensor data cut off
    process = GatewayProcess(tmp_path, "--model", str(truncated), "--context-length", "2048").start()
    try:
        assert process.proc is not None
        code = process.proc.wait(timeout=120)
        log = process.log()
        assert code == 1, log
        assert "model file missing or corrupt" in log
        assert "re-download" in log
        assert _processes_mentioning(str(truncated)) == [], "an engine process was left behind"
    finally:
        process.kill()


def _processes_mentioning(text: str) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(text in part for part in proc.info["cmdline"] or []):
            found.append(proc.info["pid"])
    return found


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_a_busy_gateway_port_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = _run_cli("serve", "--port", str(port), "--state-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use: pass --port" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs").exists(), "no backend may start when the gateway cannot listen"


def test_a_file_that_is_not_a_model_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("these are not weights")
    result = _run_cli("serve", "--model", str(bad), "--state-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("gateway: error:")]
    assert len(errors) == 1 and "is not a GGUF file" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_gguf_that_cannot_be_downloaded_exits_1_naming_the_fix(tmp_path: Path) -> None:
    config = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}  # fmt: skip
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "tiny-hub.toml").write_text(
        f'name = "tiny-hub"\nhf_config = "{tmp_path / "tiny.json"}"\n'
        '[llamacpp]\ngguf_repo = "example/tiny-GGUF"\ngguf_file = "tiny-Q4_K_M.gguf"\n'
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # as on a machine without hub access
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--catalog-dir", str(catalog), "--model", "tiny-hub",
         "--port", str(free_port()), "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert "could not start tiny-hub" in result.stderr
    assert "download it yourself and pass --model /path/to/file.gguf" in result.stderr


def _engine_group(pid: int) -> list[int]:
    """Every live process in the engine's process group (the reaper leads it)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.info["pid"]) == pid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.info["pid"])
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def _busy(gateway: GatewayProcess) -> threading.Thread:
    """A request without max_tokens: the engine generates until its context is full (a minute here)."""
    first_chunk = threading.Event()

    def generate() -> None:
        body = {
            "model": "gemma-3-270m",
            "messages": [{"role": "user", "content": "Tell a long story."}],
            "stream": True,
        }
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=120) as answer,
        ):
            for _ in answer.iter_bytes():
                first_chunk.set()

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    assert first_chunk.wait(60), "the engine never started generating"
    return thread


@pytest.fixture(params=["python", "native"])
def busy_gateway(tmp_path: Path, gemma_gguf: Path, request: pytest.FixtureRequest) -> object:
    """Both launchers: llama-cpp-python's uvicorn waits out a generation on SIGTERM (issue 16)."""
    args = ("--model", "gemma-3-270m", "--context-length", "2048", "--shutdown-grace", "2")
    args += ("--llama-launcher", request.param)
    process = GatewayProcess(tmp_path, *args).start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.kill()


def test_a_gateway_killed_with_sigkill_leaves_no_busy_engine_behind(busy_gateway: GatewayProcess) -> None:
    leader = busy_gateway.backend_pid()
    _busy(busy_gateway)
    assert len(_engine_group(leader)) >= 2  # the reaper and the engine
    assert busy_gateway.proc is not None
    busy_gateway.proc.kill()
    busy_gateway.proc.wait()
    gone_after = _wait_for(lambda: not _engine_group(leader), timeout_s=5)
    assert gone_after < 5


def test_sigterm_stops_a_gateway_with_a_busy_engine_within_the_grace_plus_ten_seconds(
    busy_gateway: GatewayProcess,
) -> None:
    leader = busy_gateway.backend_pid()
    _busy(busy_gateway)
    started = time.monotonic()
    assert busy_gateway.stop(signal.SIGTERM, timeout_s=2 + 10) == 0, busy_gateway.log()
    assert time.monotonic() - started < 2 + 10
    assert not _engine_group(leader), "an engine process outlived the gateway's stop"
